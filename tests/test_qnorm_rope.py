"""qnorm_rope_triton: the Triton kernels (interpreted on CPU, compiled on CUDA) against the FP64
model of reference/qnorm_rope.py. Error model: that module's docstring. Every element must lie in
the model's interval, forward and backward; in bf16 at least 99% bit-identical to the correctly
rounded reference; the three alternatives (no boundary 1, no boundary 2, rotate-then-normalize)
must each fall outside the model. The eager chain of stock torch ops (F.rms_norm, then the FP32
rotation) against the same model, and bit for bit with the kernels: tests/test_vs_eager.py."""

from __future__ import annotations

import pytest
import torch
from dsrope_reference import qnorm_rope as model

from dsrope import qnorm_rope_triton
from dsrope_gate.inputs import DEVICE, DTYPES, laid_out, tables, values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, layout_of, materialize

LAYOUTS = {
    "token_major": TOKEN_MAJOR,
    "contiguous": Layout(),
    "padded": Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3)),
    "stepped": Layout(step=(2, 1, 3, 1)),
    "offset": Layout(order=(0, 2, 1, 3), offset=9),
    "permuted": Layout(order=(1, 3, 0, 2)),  # channels not innermost
}


def run(x, cos, sin, rotary, eps, grad=None):
    x = x.detach().requires_grad_(grad is not None)
    out = qnorm_rope_triton(x, cos, sin, rotary, eps)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert out.transpose(1, 2).is_contiguous(), f"output not token-major: {layout_of(out)}"
    if grad is None:
        return out, None
    (dx,) = torch.autograd.grad(out, x, grad)
    assert dx.transpose(1, 2).is_contiguous(), f"gradient not token-major: {layout_of(dx)}"
    return out, dx


def check_both(x, cos, sin, rotary, eps, grad, what, exact_floor=None):
    out, dx = run(x, cos, sin, rotary, eps, grad)
    fwd = model.forward(x, cos, sin, rotary, eps).out.judge(out)
    assert fwd.violations == 0, f"forward {what}: {fwd}"
    bwd = model.backward(x, grad, cos, sin, rotary, eps).dx.judge(dx)
    assert bwd.violations == 0, f"backward {what}: {bwd}"
    if exact_floor is not None and x.dtype == torch.bfloat16:
        assert fwd.exact_fraction >= exact_floor, f"forward {what}: {fwd}"
        assert bwd.exact_fraction >= exact_floor, f"backward {what}: {bwd}"
    return fwd, bwd


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layouts(dtype, name):
    shape, rotary = (2, 3, 5, 24), 8
    x = laid_out(shape, dtype, LAYOUTS[name], seed=1)
    g = laid_out(shape, dtype, LAYOUTS[name], seed=2)
    cos, sin = tables(2, 5, rotary, seed=3)
    check_both(x, cos, sin, rotary, 1e-6, g, f"{name} {layout_of(x)}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_dsv4_geometry(dtype):
    """DeepSeek-V4 heads: D=512, R=64, 128 heads, small S. bf16: >= 99% bit-exact."""
    x = laid_out((1, 128, 2, 512), dtype, TOKEN_MAJOR, seed=4)
    g = laid_out((1, 128, 2, 512), dtype, TOKEN_MAJOR, seed=5)
    cos, sin = tables(1, 2, 64, seed=6)
    check_both(x, cos, sin, 64, 1e-6, g, "D=512 R=64 H=128", exact_floor=0.99)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim,rotary", [(25, 8), (24, 2), (16, 16), (40, 12), (13, 6), (96, 64)], ids=str)
def test_odd_geometry(dtype, dim, rotary):
    """D not a power of two, odd D with even R, R=2, R=D, R/2 not a power of two."""
    x = laid_out((1, 2, 3, dim), dtype, TOKEN_MAJOR, seed=dim)
    g = laid_out((1, 2, 3, dim), dtype, LAYOUTS["padded"], seed=dim + 1)
    cos, sin = tables(1, 3, rotary, seed=rotary)
    check_both(x, cos, sin, rotary, 1e-6, g, f"D={dim} R={rotary}")


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-3, 1e-1])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_eps(eps, dtype):
    x = laid_out((1, 2, 4, 32), dtype, TOKEN_MAJOR, seed=7, scale=0.01)  # eps matters at this scale
    g = laid_out((1, 2, 4, 32), dtype, TOKEN_MAJOR, seed=8)
    cos, sin = tables(1, 4, 16, seed=9)
    check_both(x, cos, sin, 16, eps, g, f"eps={eps}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_magnitudes(dtype):
    """Zero rows, tiny and huge rows, and rows mixing magnitudes."""
    big = {torch.bfloat16: 1e15, torch.float16: 3e4, torch.float32: 1e15}[dtype]
    tiny = {torch.bfloat16: 1e-30, torch.float16: 1e-4, torch.float32: 1e-30}[dtype]
    v = values((1, 5, 2, 32), torch.float64, seed=10)
    v[0, 0] = 0
    v[0, 1] *= tiny
    v[0, 2] *= big
    v[0, 3, :, ::3] *= 1e3 if dtype == torch.float16 else 1e6
    x = materialize(v.to(dtype).to(DEVICE), TOKEN_MAJOR)
    g = laid_out((1, 5, 2, 32), dtype, TOKEN_MAJOR, seed=11)
    cos, sin = tables(1, 2, 8, seed=12)
    check_both(x, cos, sin, 8, 1e-6, g, "magnitudes")


def test_fp32_sum_of_squares_overflow():
    """bf16 rows of 1e30: the FP32 sum of squares overflows, so rstd is 0 and the row is 0, as in
    the FP32 eager chain."""
    x = torch.full((1, 1, 2, 16), 1e30, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = tables(1, 2, 4, seed=13)
    out, _ = run(x, cos, sin, 4, 1e-6)
    assert model.forward(x, cos, sin, 4, 1e-6).out.judge(out).violations == 0
    assert (out.float() == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rstd_values_and_token_major_order(dtype):
    x = laid_out((2, 3, 4, 24), dtype, LAYOUTS["stepped"], seed=14)
    cos, sin = tables(2, 4, 8, seed=15)
    x.requires_grad_()
    out = qnorm_rope_triton(x, cos, sin, 8, 1e-6)
    rstd = out.grad_fn.saved_tensors[3]
    assert rstd.dtype == torch.float32 and rstd.shape == (2 * 4 * 3,)
    check = model.forward(x, cos, sin, 8, 1e-6).rstd.judge(rstd)
    assert check.violations == 0, str(check)
    # the order is token-major: row (b*S + s)*H + h
    r = rstd.view(2, 4, 3).cpu()
    exact = (1 / torch.sqrt(x.detach().double().pow(2).mean(-1) + 1e-6)).cpu()
    assert torch.allclose(r.double(), exact.transpose(1, 2), rtol=1e-5)
    assert not torch.allclose(r.double().transpose(1, 2).reshape(-1), exact.transpose(1, 2).reshape(-1), rtol=1e-2)


def test_stride0_gradient_of_sum():
    x = laid_out((2, 2, 3, 24), torch.bfloat16, TOKEN_MAJOR, seed=19).requires_grad_()
    cos, sin = tables(2, 3, 8, seed=20)
    qnorm_rope_triton(x, cos, sin, 8, 1e-6).sum().backward()
    ones = torch.ones(x.shape, dtype=x.dtype)
    check = model.backward(x, ones, cos, sin, 8, 1e-6).dx.judge(x.grad)
    assert check.violations == 0, str(check)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_alternatives_are_rejected(dtype, record_property):
    """Each alternative (a) no boundary 1, (b) no boundary 2, (c) rotate then normalize computes
    a different function: on these inputs it falls outside our model on some elements, while the
    kernel has none outside. In FP32 boundary 1 and 2 are no-ops, so only bf16/fp16 are tested."""
    x = laid_out((2, 8, 4, 64), dtype, TOKEN_MAJOR, seed=21)
    g = laid_out((2, 8, 4, 64), dtype, TOKEN_MAJOR, seed=22)
    cos, sin = tables(2, 4, 32, seed=23)
    fwd, bwd = check_both(x, cos, sin, 32, 1e-6, g, "kernel")
    f = model.forward(x, cos, sin, 32, 1e-6)
    b = model.backward(x, g, cos, sin, 32, 1e-6)
    as_dtype = lambda t: t.to(torch.float32).to(dtype)  # values are representable: exact cast
    fractions = {
        "a_no_boundary1": f.out.judge(as_dtype(model.forward_no_boundary1(x, cos, sin, 32, 1e-6))),
        "b_no_boundary2": b.dx.judge(as_dtype(model.backward_no_boundary2(x, g, cos, sin, 32, 1e-6))),
        "c_rotate_then_normalize": f.out.judge(as_dtype(model.forward_rotate_then_normalize(x, cos, sin, 32, 1e-6))),
    }
    for name, check in fractions.items():
        fraction = check.violations / check.checked
        record_property(f"{name}_{dtype}", fraction)
        print(f"{name} {dtype}: {fraction:.2%} of elements outside the model")
        assert check.violations > 0, f"alternative {name} not told apart: {check}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp64_model_certified_by_mpmath(dtype):
    """The FP64 model's correctly rounded values equal an exact (200-bit) recomputation."""
    x = values((1, 2, 3, 12), dtype, seed=24)
    g = values((1, 2, 3, 12), dtype, seed=25)
    cos, sin = (t.cpu() for t in tables(1, 3, 6, seed=26))
    f = model.forward(x, cos, sin, 6, 1e-5)
    y, out, r = model.certify_forward(x, cos, sin, 6, 1e-5)
    assert torch.equal(f.normalized.ref, y)
    assert torch.equal(f.out.ref, out)
    assert torch.allclose(f.rstd.ref, model.token_major_rows(r), rtol=2**-50, atol=0)
    b = model.backward(x, g, cos, sin, 6, 1e-5)
    gd, dx = model.certify_backward(x, g, cos, sin, 6, 1e-5)
    assert torch.equal(b.derotated.ref, gd)
    assert torch.equal(b.dx.ref, dx)


def test_mpmath_certifies_ties():
    """De-rotation outputs exactly on bf16 midpoints: with c = 1, s = 2**-8 and gb = 1, the first
    output ga + 2**-8 sits halfway between ga (odd last bit) and its even neighbour. The FP64
    model and mpmath both round these ties to even."""
    ga = torch.tensor([1 + 2**-7, 1 + 3 * 2**-7, -(1 + 5 * 2**-7)], dtype=torch.float64)
    g = torch.zeros(1, 1, 3, 2, dtype=torch.bfloat16)
    g[0, 0, :, 0], g[0, 0, :, 1] = ga.to(torch.bfloat16), torch.sign(ga).to(torch.bfloat16)
    x = values((1, 1, 3, 2), torch.bfloat16, seed=33)
    cos = torch.ones(1, 3, 2)
    sin = torch.full((1, 3, 2), 2**-8)
    b = model.backward(x, g, cos, sin, 2, 1e-6)
    gd, dx = model.certify_backward(x, g, cos, sin, 2, 1e-6)
    expect_even = torch.tensor([1 + 2**-6, 1 + 2**-5, -(1 + 6 * 2**-7)], dtype=torch.float64)
    assert torch.equal(gd[0, 0, :, 0], expect_even)
    assert torch.equal(b.derotated.ref, gd)
    assert torch.equal(b.dx.ref, dx)


def test_gradcheck_proves_the_backward_formula():
    """The backward formula (de-rotate, then r*(g' - xhat*mean(g'*xhat))) against finite
    differences in FP64, and against autograd through the exact function."""
    x = torch.randn(1, 2, 3, 10, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.cpu().double() for t in tables(1, 3, 6, seed=27))
    fn = lambda x: model.QNormRoPEFormula.apply(x, cos, sin, 6, 1e-3)
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-7)
    g = torch.randn(1, 2, 3, 10, dtype=torch.float64)
    (ours,) = torch.autograd.grad(fn(x), x, g)
    (autograd,) = torch.autograd.grad(model.qnorm_rope_fp64(x, cos, sin, 6, 1e-3), x, g)
    assert torch.allclose(ours, autograd, rtol=1e-12, atol=1e-14)


def test_nan_stays_in_its_row():
    x = laid_out((1, 2, 3, 16), torch.bfloat16, TOKEN_MAJOR, seed=28)
    x[0, 1, 2, 5] = float("nan")
    cos, sin = tables(1, 3, 8, seed=29)
    g = laid_out((1, 2, 3, 16), torch.bfloat16, TOKEN_MAJOR, seed=30)
    out, dx = run(x, cos, sin, 8, 1e-6, g)
    expect = torch.zeros(x.shape, dtype=torch.bool)
    expect[0, 1, 2, :] = True
    assert torch.equal(torch.isnan(out.cpu()), expect)
    assert torch.equal(torch.isnan(dx.cpu()), expect)


@pytest.mark.parametrize("shape", [(0, 2, 3, 8), (1, 0, 3, 8), (1, 2, 0, 8)])
def test_empty(shape):
    x = torch.empty(shape, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = tables(shape[0], shape[2], 4)
    out = qnorm_rope_triton(x, cos, sin, 4, 1e-6)
    assert out.shape == x.shape
    out.sum().backward()
    assert x.grad.shape == x.shape


def test_in_place_change_of_saved_input_is_detected():
    x = laid_out((1, 2, 3, 8), torch.float32, TOKEN_MAJOR, seed=31).requires_grad_()
    cos, sin = tables(1, 3, 4, seed=32)
    y = x * 1
    out = qnorm_rope_triton(y, cos, sin, 4, 1e-6)
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def refused_cases():
    x = torch.zeros(1, 2, 3, 8, device=DEVICE)
    c, s = tables(1, 3, 4)
    return [
        ("x", dict(x=torch.zeros(2, 3, 8, device=DEVICE)), ValueError, "rank"),
        ("x", dict(x=x.double()), TypeError, "dtype"),
        ("rotary", dict(rotary=5), ValueError, "even"),
        ("rotary", dict(rotary=0), ValueError, "positive"),
        ("rotary", dict(rotary=12), ValueError, "<= channels"),
        ("eps", dict(eps=0.0), ValueError, "> 0"),
        ("eps", dict(eps=-1e-6), ValueError, "> 0"),
        ("eps", dict(eps=float("nan")), ValueError, "finite"),
        ("eps", dict(eps=float("inf")), ValueError, "finite"),
        ("eps", dict(eps="1e-6"), TypeError, "float"),
        ("cos", dict(cos=c[:, :2]), ValueError, "shape"),
        ("cos", dict(cos=c.half()), TypeError, "float32"),
        ("sin", dict(sin=s.clone().requires_grad_()), ValueError, "requires_grad"),
    ]


@pytest.mark.parametrize("arg,change,error,words", refused_cases(), ids=lambda v: str(v)[:30])
def test_refused_inputs(arg, change, error, words):
    c, s = tables(1, 3, 4)
    kwargs = dict(x=torch.zeros(1, 2, 3, 8, device=DEVICE), cos=c, sin=s, rotary=4, eps=1e-6) | change
    with pytest.raises(error) as info:
        qnorm_rope_triton(**kwargs)
    assert arg in str(info.value) and words in str(info.value), str(info.value)


def test_refuses_non_cuda_outside_interpreter():
    x = torch.zeros(1, 2, 3, 8, device="meta")
    c, s = tables(1, 3, 4)
    with pytest.raises(ValueError, match="x: expected a CUDA tensor"):
        qnorm_rope_triton(x, c, s, 4, 1e-6)


def test_rows_on_warps_only_where_a_thread_keeps_its_lanes(monkeypatch):
    """The launcher's choice of whole rows on several warps (dsrope.qnorm_rope.forward_config): taken from
    ROWS_ON_WARPS by the launch's row count, and only for an x whose rows keep their one-warp sum there
    (rows_fit_warps: channels contiguous, D a power of two >= 256, address and strides multiples of 16);
    any other x, and every launch in the interpreter, stays on one warp. The bits at those tiles are held on
    the GPU (tests/test_gpu.py::test_qnorm_rows_on_warps_keep_the_bits)."""
    import dsrope.qnorm_rope as module

    monkeypatch.setattr(module, "INTERPRET", False)  # the compiled launcher's decision, taken on the CPU
    shipped = module.forward_config(torch.empty(64, 64, 1, 512, dtype=torch.bfloat16))  # cached before the patch
    # the shipped table's prefill tier: 65536 rows and up (x's rows all on one 512-channel vector: only the
    # launcher's inputs, shape, strides and address, are read)
    rows = lambda n: torch.empty(512, dtype=torch.bfloat16).as_strided((1, 64, n // 64, 512), (0, 0, 0, 1))  # noqa: E731
    prefill = [(c["M"], c["num_warps"]) for c in map(module.forward_config, map(rows, (65536 - 64, 65536)))]
    assert prefill == [(2, 2), (8, 8)]
    shipped_tile = [tile for least, *tile in module.ROWS_ON_WARPS if 64 * 64 >= least][-1]
    monkeypatch.setattr(module, "ROWS_ON_WARPS", ((512, 4, 2), (4096, 8, 4)))
    decode = lambda b: torch.empty(b, 1, 64, 512, dtype=torch.bfloat16).transpose(1, 2)  # noqa: E731
    assert module.rows_fit_warps(decode(1))
    warps = lambda x: module.forward_config(x).get("num_warps", 1)  # noqa: E731  (none in the interpreter's tile)
    tiles = [(c["M"], c["num_warps"], c["CHUNK"]) for c in map(module.forward_config, map(decode, (8, 64, 256)))]
    assert tiles == [(4, 2, 256), (8, 4, 256), (8, 4, 256)]  # fails if the cache is keyed by a tile's place
    assert warps(decode(4)) == 1 and module.forward_config(decode(4))["CHUNK"] == 512  # 256 rows: one warp
    assert module.forward_config(torch.empty(64, 64, 1, 512))["CHUNK"] == 128  # fp32: 4 channels a vector
    storage = torch.empty(64 * 64 * 512 + 16, dtype=torch.bfloat16)
    refused = {
        "channel-strided": torch.empty(64, 64, 1, 1024, dtype=torch.bfloat16)[..., ::2],
        "D not a power of two": torch.empty(64, 64, 1, 320, dtype=torch.bfloat16),
        "D below 256": torch.empty(64, 512, 1, 128, dtype=torch.bfloat16),
        "address off 16 bytes": storage[1 : 1 + 64 * 64 * 512].view(64, 64, 1, 512),
        "a stride off 16": torch.empty(64, 64, 1, 520, dtype=torch.bfloat16)[..., :512],
    }
    for why, x in refused.items():
        assert not module.rows_fit_warps(x), why
        assert warps(x) == 1, why
    assert [shipped["M"], shipped["num_warps"]] == shipped_tile
    monkeypatch.setattr(module, "INTERPRET", True)
    assert not module.rows_fit_warps(decode(64)) and warps(decode(64)) == 1
