"""apply_partial_rope_triton: the Triton kernel (interpreted on CPU, compiled on CUDA) against
the FP64 model in reference/rope.py. Error model: see that module's docstring; every element
must lie in the model's interval, and in bf16 at least 99% must equal the correctly rounded
reference bit for bit."""

from __future__ import annotations

import pytest
import torch
from dsrope_reference.rope import partial_rope

import dsrope.rope
from dsrope import apply_partial_rope_triton
from dsrope.rope import partial_rope as partial_rope_op
from dsrope.rope import partial_rope_backward as partial_rope_backward_op
from dsrope_gate.inputs import DEVICE, DTYPES, laid_out, tables, values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, layout_of, materialize

LAYOUTS = {
    "token_major": TOKEN_MAJOR,
    "contiguous": Layout(),
    "padded": Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3)),
    "stepped": Layout(step=(2, 1, 3, 1)),
    "offset": Layout(order=(0, 2, 1, 3), offset=7),
    "channel_outer": Layout(order=(3, 0, 1, 2)),  # channel dim not innermost
    "stepped_channels_offset": Layout(order=(2, 0, 1, 3), step=(1, 2, 1, 2), pad=(0, 1, 0, 0), offset=5),
}


def forward(x, cos, sin, rotary):
    out = apply_partial_rope_triton(x, cos, sin, rotary)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.transpose(1, 2).is_contiguous(), f"output not token-major: {layout_of(out)}"
    return out


@pytest.fixture(autouse=True, params=["split", "whole_row"])
def form(request, monkeypatch):
    """Every test on both out-of-place kernels (dsrope.rope.rotate_config): the split one, which the
    launcher takes for launches of few rows (all of this module's), and the whole-row one."""
    if request.param == "whole_row":
        monkeypatch.setattr(dsrope.rope, "SPLIT_ROWS", -1)
    return request.param


def assert_within(check, what):
    assert check.violations == 0, f"{what}: {check}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_forward_layouts(dtype, name):
    shape, rotary = (2, 3, 5, 24), 8
    x = laid_out(shape, dtype, LAYOUTS[name], seed=1)
    cos, sin = tables(2, 5, rotary, seed=2)
    check = partial_rope(x, cos, sin, rotary).judge(forward(x, cos, sin, rotary))
    assert_within(check, f"{name} {layout_of(x)}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["token_major", "padded", "channel_outer", "stepped_channels_offset"])
def test_backward_layouts(dtype, name):
    shape, rotary = (2, 3, 5, 24), 8
    x = laid_out(shape, dtype, TOKEN_MAJOR, seed=3).requires_grad_()
    cos, sin = tables(2, 5, rotary, seed=4)
    g = laid_out(shape, dtype, LAYOUTS[name], seed=5)
    (dx,) = torch.autograd.grad(forward(x, cos, sin, rotary), x, g)
    assert dx.transpose(1, 2).is_contiguous(), f"gradient not token-major: {layout_of(dx)}"
    assert_within(partial_rope(g, cos, sin, rotary, inverse=True).judge(dx), f"grad {layout_of(g)}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_stride0_gradient_of_sum(dtype):
    x = laid_out((2, 2, 4, 16), dtype, TOKEN_MAJOR, seed=6).requires_grad_()
    cos, sin = tables(2, 4, 6, seed=7)
    out = forward(x, cos, sin, 6)
    out.sum().backward()  # upstream gradient: ones with every stride 0
    ones = torch.ones(x.shape, dtype=dtype)
    assert_within(partial_rope(ones, cos, sin, 6, inverse=True).judge(x.grad), "grad of sum")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dim,rotary",
    [(8, 2), (16, 16), (24, 12), (40, 6), (20, 20), (512, 64), (14, 10), (96, 64)],
    ids=lambda v: str(v),
)
def test_geometry(dtype, dim, rotary):
    """R=2, R=D, R/2 and D not powers of two, DSV4's D=512/R=64."""
    x = laid_out((1, 3, 4, dim), dtype, TOKEN_MAJOR, seed=dim + rotary)
    cos, sin = tables(1, 4, rotary, seed=rotary)
    assert_within(partial_rope(x, cos, sin, rotary).judge(forward(x, cos, sin, rotary)), f"D={dim} R={rotary}")


def test_batch_table_not_broadcast():
    """A table that differs per batch (no stride 0) is read with its batch stride."""
    x = laid_out((3, 2, 4, 16), torch.float32, TOKEN_MAJOR, seed=8)
    cos, sin = tables(3, 4, 8, seed=9, per_batch=True)
    assert_within(partial_rope(x, cos, sin, 8).judge(forward(x, cos, sin, 8)), "per-batch table")


def test_strided_tables():
    """cos/sin with padded, non-contiguous strides and an offset."""
    x = laid_out((2, 2, 5, 16), torch.bfloat16, TOKEN_MAJOR, seed=10)
    c0, s0 = tables(2, 5, 8, seed=11, per_batch=True)
    lay = Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11)
    cos, sin = materialize(c0, lay), materialize(s0, lay)
    assert_within(partial_rope(x, cos, sin, 8).judge(forward(x, cos, sin, 8)), layout_of(cos))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bf16_exact_rate_and_model(dtype):
    """Large enough to measure: zero violations, and in bf16 >= 99% bit-identical to correct rounding."""
    x = laid_out((2, 8, 16, 64), dtype, TOKEN_MAJOR, seed=12)
    cos, sin = tables(2, 16, 64, seed=13)
    check = partial_rope(x, cos, sin, 64).judge(forward(x, cos, sin, 64))
    assert_within(check, "dense")
    if dtype == torch.bfloat16:
        assert check.exact_fraction >= 0.99, str(check)


def test_rounding_is_to_nearest_even_not_truncation():
    """Stores that land exactly on bf16 rounding midpoints. With c = 1, s = 2**-8 and b = -1 (or
    +1 for negative a), the first output a + s (resp. a - s) lies halfway between a,
    and its neighbour: round-to-nearest-even goes to the neighbour,
    truncation stays at a, and ties-away-from-zero agrees with RNE only on some of them, so the
    mixed cases below tell all three apart.
    """
    a = torch.tensor([1 + 2**-7, 1 + 3 * 2**-7, -(1 + 5 * 2**-7), 1 + 2**-6, 2 + 2**-6])
    half_ulp = torch.tensor([2**-8, 2**-8, 2**-8, 2**-8, 2**-7])  # a's half spacing
    x = torch.zeros(1, 1, a.numel(), 2, dtype=torch.bfloat16)
    x[0, 0, :, 0] = a.to(torch.bfloat16)
    x[0, 0, :, 1] = -torch.sign(a).to(torch.bfloat16)
    x = x.to(DEVICE)
    cos = torch.ones((1, a.numel(), 2), device=DEVICE)
    sin = half_ulp[None, :, None].expand(1, a.numel(), 2).contiguous().to(DEVICE)
    out = forward(x, cos, sin, 2).cpu()
    model = partial_rope(x, cos, sin, 2)
    first = out[0, 0, :, 0].double()
    # the fourth has an even last bit: RNE keeps it, ties-away would not
    even = torch.tensor([1 + 2**-6, 1 + 2**-5, -(1 + 6 * 2**-7), 1 + 2**-6, 2 + 2**-5], dtype=torch.float64)
    assert torch.equal(model.ref[0, 0, :, 0], even), "the reference rounds ties to even"
    assert torch.equal(model.lo[0, 0, :, 0], model.hi[0, 0, :, 0]), "exactly one result is allowed"
    assert torch.equal(first, even), f"kernel {first.tolist()} vs round-to-nearest-even {even.tolist()}"
    assert model.judge(out).violations == 0


def test_nan_stays_in_its_pair():
    x = values((1, 2, 3, 12), torch.float32, seed=14).to(DEVICE)
    x = materialize(x, TOKEN_MAJOR)
    x[0, 1, 2, 3] = float("nan")  # pass-through channel: only itself
    x[0, 0, 1, 8] = float("nan")  # rotary pair (8, 9): both outputs of the pair
    cos, sin = tables(1, 3, 6, seed=15)
    out = forward(x, cos, sin, 6).cpu()
    expect = torch.zeros(out.shape, dtype=torch.bool)
    expect[0, 1, 2, 3] = True
    expect[0, 0, 1, 8:10] = True
    assert torch.equal(torch.isnan(out), expect)


@pytest.mark.parametrize("dtype", DTYPES)
def test_infinity_stays_in_its_pair_and_the_model_holds(dtype):
    """An infinite input channel gives an infinite output in both lanes of its pair (inf times a nonzero
    entry), NaN nowhere, and the reference's model (IEEE values where an input is infinite) accepts it."""
    x = materialize(values((1, 2, 3, 12), dtype, seed=16).to(DEVICE), TOKEN_MAJOR)
    x[0, 1, 2, 9] = float("inf")  # rotary pair (8, 9)
    x[0, 0, 0, 2] = float("-inf")  # pass-through channel
    cos, sin = (t.clone() for t in tables(1, 3, 6, seed=17, per_batch=True))
    cos[0, 2, 1], sin[0, 2, 1] = -0.127, -0.992  # pair 1 at (0, 2): a*c - inf*s = +inf, a*s + inf*c = -inf
    out = forward(x, cos, sin, 6)
    expect = torch.zeros(out.shape, dtype=torch.bool)
    expect[0, 1, 2, 8:10] = True
    expect[0, 0, 0, 2] = True
    assert torch.equal(torch.isinf(out.cpu()), expect) and not out.isnan().any()
    check = partial_rope(x, cos, sin, 6).judge(out)
    assert check.violations == 0, check


@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (1, 0, 3, 8), (1, 2, 0, 8)])
def test_empty(shape):
    x = torch.empty(shape, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = tables(shape[0], shape[2], 4)
    out = forward(x, cos, sin, 4)
    assert out.numel() == 0
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_input_not_modified_and_output_independent():
    x = laid_out((1, 2, 3, 8), torch.bfloat16, TOKEN_MAJOR, seed=16)
    before = x.clone()
    cos, sin = tables(1, 3, 4, seed=17)
    out = forward(x, cos, sin, 4)
    assert torch.equal(x, before)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_launch_inverse_undoes_forward():
    """The backward op (inverse rotation) after the forward op returns x: in FP32 each rotation adds at
    most 2u(|a|+|b|) per element (u = 2**-24) and cos^2 + sin^2 = 1 within 2u, so the round trip
    is within 8u times the pair's magnitude."""
    x = laid_out((1, 2, 6, 16), torch.float32, TOKEN_MAJOR, seed=18)
    cos, sin = tables(1, 6, 16, seed=19)
    back = partial_rope_backward_op(partial_rope_op(x, cos, sin, 16), cos, sin, 16)
    pair = x.abs().view(*x.shape[:-1], 8, 2).sum(-1, keepdim=True).expand(*x.shape[:-1], 8, 2).reshape(x.shape)
    assert ((back - x).abs() <= 8 * 2**-24 * pair).all()


def refused_cases():
    x = torch.zeros(1, 2, 3, 8, device=DEVICE)
    c, s = tables(1, 3, 4)
    return [
        ("x", dict(x=torch.zeros(2, 3, 8, device=DEVICE)), ValueError, "rank"),
        ("x", dict(x=x.to(torch.float64)), TypeError, "dtype"),
        ("x", dict(x=x.to(torch.int32)), TypeError, "dtype"),
        ("x", dict(x="not a tensor"), TypeError, "torch.Tensor"),
        ("x", dict(x=torch.zeros(1, 2, 3, 7, device=DEVICE)), ValueError, "even"),
        ("rotary", dict(rotary=3), ValueError, "even"),
        ("rotary", dict(rotary=0), ValueError, "positive"),
        ("rotary", dict(rotary=-2), ValueError, "positive"),
        ("rotary", dict(rotary=10), ValueError, "<= channels"),
        ("rotary", dict(rotary=4.0), TypeError, "int"),
        ("cos", dict(cos=c[..., :2]), ValueError, "shape"),
        ("cos", dict(cos=c.double()), TypeError, "float32"),
        ("sin", dict(sin=s.to(torch.bfloat16)), TypeError, "float32"),
        ("sin", dict(sin=s[:, :2]), ValueError, "shape"),
        ("cos", dict(cos=c.clone().requires_grad_()), ValueError, "requires_grad"),
    ]


@pytest.mark.parametrize("arg,change,error,words", refused_cases(), ids=lambda v: str(v)[:30])
def test_refused_inputs(arg, change, error, words):
    x = torch.zeros(1, 2, 3, 8, device=DEVICE)
    c, s = tables(1, 3, 4)
    kwargs = dict(x=x, cos=c, sin=s, rotary=4) | change
    with pytest.raises(error) as info:
        apply_partial_rope_triton(**kwargs)
    assert arg in str(info.value) and words in str(info.value), str(info.value)


def test_refuses_tables_on_another_device():
    x = torch.zeros(1, 2, 3, 8, device="meta")
    c, s = tables(1, 3, 4)
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        apply_partial_rope_triton(x, c, s, 4)
    if DEVICE.type == "cuda":
        with pytest.raises(ValueError, match="cos: expected a tensor on x's device"):
            apply_partial_rope_triton(torch.zeros(1, 2, 3, 8, device=DEVICE), c.cpu(), s, 4)
