"""Differential checks of the DSV4 kernels against the eager chains docs/contract.md says they equal, written
with stock torch ops only (tests/differential.py):
  qnorm_rope_triton          F.rms_norm(x, (D,), eps=eps), then an FP32 interleaved rotation of the
                             trailing R channels cast back to x.dtype; backward: autograd through it
  apply_partial_rope_triton  the FP32 interleaved rotation alone; backward: autograd through it

Error model: reference/qnorm_rope.py's (boundary 1, the rotation interval, the backward's per-element
bound B) and reference/rope.py's (partial RoPE; its backward is the conjugate rotation of the
gradient). The eager chain computes the same function with the same two rounding boundaries, so
both sides must lie inside the model: zero elements outside, forward and backward. Bits:
- where the model allows one value (Model.lo == Model.hi), ours and the chain are equal bit for
  bit, on CPU and GPU (that value is the correctly rounded one);
- partial RoPE: the same FP32 operations in the same order on both sides (the kernel computes a*c + (-b)*s
  and b*c + a*s, each product and sum rounded: Triton's interpreter does, and compiled kernels are launched
  with enable_fp_fusion=False; torch's eager ops do the same; its backward with the negated sine gives
  g1*c + g2*s and g2*c - g1*s, which is what autograd sums), so bit for bit on every element, forward and
  backward, on CPU and GPU;
- QNorm: not everywhere, on either device: the kernel's sum of squares (and on GPU its approximate
  rsqrt) is not torch's, so r may differ in its last FP32 bits and y = rnd(x * r) with it. Its rotation is
  held bit for bit to the eager rotation of its own normalized row (the bit-for-bit section below).
tests/test_qnorm_rope.py holds the kernels to the model on many more shapes and layouts, and
rejects the alternative functions (dropped, moved or doubled boundaries); this file adds the
independent chain and the bits.

Mutants (tools/mutants.py) each test fails under, shown with
`python -m tools.mutants --only NAME --tests test_vs_eager` (docs/development.md):
  test_qnorm_rope_matches_eager_chain     qnorm.boundary1_dropped (forward), qnorm.boundary2_dropped (backward)
  test_partial_rope_matches_eager_rotation  rope.forward_sine_sign (forward), rope.backward_sine_sign (backward)
  test_dsv4_shapes_match_eager_on_gpu     GPU only: the same mutants with `tools/mutants.py --gpu --all`
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from dsrope_reference import qnorm_rope as qnorm_model
from dsrope_reference.floats import bits
from dsrope_reference.rope import Model, partial_rope

from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, qnorm_rope_triton
from dsrope.checks import check_writable
from dsrope_gate.case_sets import GOLDEN_CASES, canonical, sweep
from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope, forward_backward
from dsrope_gate.inputs import DEVICE, DTYPES, laid_out, tables
from dsrope_gate.layouts import TOKEN_MAJOR, Layout
from dsrope_gate.ops import JUDGED
from dsrope_gate.semantics import ROTATIONS, agreement, classify, rope_backward, rope_forward

PADDED = Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3))
CASES = {
    # name: (shape [B, H, S, D], rotary, eps, gradient layout)
    "dsv4": ((1, 4, 3, 512), 64, 1e-6, PADDED),
    "odd_d_minus_r": ((2, 3, 5, 25), 8, 1e-6, Layout(step=(2, 1, 3, 1))),
    "rotary_is_d": ((2, 2, 3, 16), 16, 1e-3, Layout()),
    "grad_of_sum": ((2, 2, 3, 40), 12, 1e-6, None),  # None: the stride-0 gradient of .sum()
}
EVEN_D = [name for name, case in CASES.items() if case[0][-1] % 2 == 0]  # partial RoPE refuses odd D


def assert_agree(ours, eager, model: Model, what: str, everywhere: bool) -> float:
    """Both inside the model; equal bits everywhere, or where the model allows one value. Returns the
    share of elements with one allowed value."""
    for who, out in (("ours", ours), ("eager chain", eager)):
        check = model.judge(out)
        assert check.violations == 0, f"{what}: {who} outside the model: {check}"
    single = model.lo == model.hi
    where = torch.ones_like(single) if everywhere else single
    differ = (bits(ours) != bits(eager)) & where
    assert not differ.any(), (
        f"{what}: ours and the eager chain differ on {int(differ.sum())} of {int(where.sum())} elements "
        f"{'(expected the same bits everywhere)' if everywhere else 'where the model allows one value'}; "
        f"first at {differ.nonzero()[0].tolist()}"
    )
    return single.double().mean().item()


def case_inputs(name: str, dtype, seed: int):
    shape, rotary, eps, grad_layout = CASES[name]
    x = laid_out(shape, dtype, TOKEN_MAJOR, seed=seed)
    grad = None if grad_layout is None else laid_out(shape, dtype, grad_layout, seed=seed + 1)
    cos, sin = tables(shape[0], shape[2], rotary, seed=seed + 2)
    return x, grad, cos, sin, rotary, eps


def ones_if_none(grad, x):
    return torch.ones(x.shape, dtype=x.dtype) if grad is None else grad


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_qnorm_rope_matches_eager_chain(dtype, name, record_property):
    x, grad, cos, sin, rotary, eps = case_inputs(name, dtype, seed=1)
    out, dx = forward_backward(qnorm_rope_triton, x, grad, cos, sin, rotary, eps)
    eager_out, eager_dx = forward_backward(eager_qnorm_rope, x, grad, cos, sin, rotary, eps)
    forward = qnorm_model.forward(x, cos, sin, rotary, eps).out
    backward = qnorm_model.backward(x, ones_if_none(grad, x), cos, sin, rotary, eps).dx
    single_fwd = assert_agree(out, eager_out, forward, "forward", everywhere=False)
    single_bwd = assert_agree(dx, eager_dx, backward, "backward", everywhere=False)
    record_property("single_valued", f"forward {single_fwd:.2%}, backward {single_bwd:.2%}")


@pytest.mark.parametrize("name", EVEN_D)
@pytest.mark.parametrize("dtype", DTYPES)
def test_partial_rope_matches_eager_rotation(dtype, name):
    x, grad, cos, sin, rotary, _ = case_inputs(name, dtype, seed=11)
    out, dx = forward_backward(apply_partial_rope_triton, x, grad, cos, sin, rotary)
    eager_out, eager_dx = forward_backward(eager_partial_rope, x, grad, cos, sin, rotary)
    assert_agree(out, eager_out, partial_rope(x, cos, sin, rotary), "forward", everywhere=True)
    backward = partial_rope(ones_if_none(grad, x), cos, sin, rotary, inverse=True)
    assert_agree(dx, eager_dx, backward, "backward", everywhere=True)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["qnorm_rope", "partial_rope"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dsv4_shapes_match_eager_on_gpu(dtype, kernel, record_property):
    """DSV4 [B, H, S, D] = [2, 16, 64, 512], R = 64, token-major x, dense gradient: both sides inside
    the model, equal bits where it allows one value, and everywhere for partial RoPE (the CPU tests above at
    smaller sizes)."""
    shape, rotary, eps = (2, 16, 64, 512), 64, 1e-6
    x = laid_out(shape, dtype, TOKEN_MAJOR, seed=21)
    grad = laid_out(shape, dtype, Layout(), seed=22)
    cos, sin = tables(2, 64, rotary, seed=23)
    if kernel == "qnorm_rope":
        ours = forward_backward(qnorm_rope_triton, x, grad, cos, sin, rotary, eps)
        eager = forward_backward(eager_qnorm_rope, x, grad, cos, sin, rotary, eps)
        models = (
            qnorm_model.forward(x, cos, sin, rotary, eps).out,
            qnorm_model.backward(x, grad, cos, sin, rotary, eps).dx,
        )
    else:
        ours = forward_backward(apply_partial_rope_triton, x, grad, cos, sin, rotary)
        eager = forward_backward(eager_partial_rope, x, grad, cos, sin, rotary)
        models = partial_rope(x, cos, sin, rotary), partial_rope(grad, cos, sin, rotary, inverse=True)
    shares = [
        assert_agree(o, e, m, what, everywhere=kernel == "partial_rope")
        for o, e, m, what in zip(ours, eager, models, ("forward", "backward"), strict=True)
    ]
    record_property("single_valued", f"forward {shares[0]:.2%}, backward {shares[1]:.2%}")
    print(f"{kernel} {dtype}: single-valued forward {shares[0]:.2%}, backward {shares[1]:.2%}")


# --- bit for bit with the eager chain: the rotation's roundings (docs/contract.md) ------------------------
# The rotation rounds each product and each sum to FP32 (no fused multiply-add, on the GPU by the launch
# option enable_fp_fusion=False), as the eager chain does: partial RoPE, out of place and in place, equals it
# bit for bit everywhere, forward and backward. The QNorm's row sum (and on the GPU its rsqrt) is not torch's,
# so its rotation is held to the eager rotation of its own normalized row: rnd(x * rstd) with the rstd it saved
# (forward), and, on an x whose rotary channels are zero (xhat = 0 there), dx = rnd(rstd * g') on the rotary
# channels, g' the eager de-rotation of the gradient rounded to x.dtype (backward, boundary 2).
# Cases: the gate's own (dsrope_gate.case_sets), bf16 and fp16: canonical, golden and drawn.

HALF = ("bfloat16", "float16")
DRAWN_ON_CPU, DRAWN_ON_GPU = 12, 64  # drawn per op before the bf16/fp16 filter


@functools.cache
def bitwise_cases(op: str, drawn: int) -> tuple:
    """canonical() and the golden cases of `op`, then `drawn` cases of sweep(op), bf16 and fp16 ones only."""
    cases = canonical() + [c for c in GOLDEN_CASES if op in c.ops] + sweep(JUDGED[op], drawn, seed=54)
    return tuple(c for c in cases if c.dtype in HALF)


def case_ids(op: str, drawn: int) -> list[str]:
    return [c.name for c in bitwise_cases(op, drawn)]


# A gradient's zeros are compared by value: autograd adds the zero-filled gradients of x's other slices into
# each element's (the backward of the eager rotation's slicing), which turns a -0 into +0 where the kernel
# stores the -0 its rotation gives.
SIGNED_ZEROS = {"forward": True, "backward": False}


def same_bits(got: torch.Tensor, want: torch.Tensor, signed_zeros: bool = True) -> torch.Tensor:
    """Where the bits are equal (NaN meets NaN whatever its payload; without signed_zeros, +0 meets -0), on the
    CPU (where `bits` puts them)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    same = (bits(got) == bits(want)) | (got.isnan() & want.isnan())
    return same if signed_zeros else same | ((got == 0) & (want == 0))


def assert_bit_for_bit(got, want, what: str, direction: str, where=None):
    got, want = got.detach().cpu(), want.detach().cpu()
    differ = ~same_bits(got, want, SIGNED_ZEROS[direction])
    differ = differ if where is None else differ & where.cpu()
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {differ.numel()} elements differ from the eager chain's bits; first at "
        f"{differ.nonzero()[0].tolist()}: {got[differ][0].item()!r} against {want[differ][0].item()!r}"
    )


def in_place(x, cos, sin, rotary, grad):
    """apply_partial_rope_triton_ on a copy of x in x's layout (gaps too), and the input gradient through it."""
    leaf = x.detach().clone().requires_grad_()
    storage = torch.full((x.untyped_storage().nbytes() // x.element_size(),), float("nan"), dtype=x.dtype)
    y = storage.to(x.device).as_strided(x.shape, x.stride(), x.storage_offset())
    y.copy_(leaf)  # autograd flows from y back to leaf
    out = apply_partial_rope_triton_(y, cos, sin, rotary)
    (dx,) = torch.autograd.grad(out, leaf, grad)
    return out.detach(), dx


def writable(x) -> bool:
    try:
        check_writable(x)
    except ValueError:
        return False
    return True


def check_partial_rope_bit_for_bit(case):
    x, cos, sin, grad = case.build(DEVICE)
    want = forward_backward(eager_partial_rope, x, grad, cos, sin, case.rotary)
    got = forward_backward(apply_partial_rope_triton, x, grad, cos, sin, case.rotary)
    for g, w, direction in zip(got, want, SIGNED_ZEROS, strict=True):
        assert_bit_for_bit(g, w, f"{case.name} out of place {direction}", direction)
    if writable(x):  # a stride-0 or overlapping x is refused in place
        for g, w, direction in zip(in_place(x, cos, sin, case.rotary, grad), want, SIGNED_ZEROS, strict=True):
            assert_bit_for_bit(g, w, f"{case.name} in place {direction}", direction)


def check_qnorm_rotation_bit_for_bit(case):
    d, rotary, eps = case.shape[-1], case.rotary, case.eps
    x, cos, sin, _ = case.build(DEVICE)
    out, rstd = torch.ops.dsrope.qnorm_rope(x, cos, sin, rotary, eps)
    r = rstd.view(case.shape[0], case.shape[2], case.shape[1]).transpose(1, 2)[..., None]
    want = eager_partial_rope((x.float() * r).to(x.dtype), cos, sin, rotary)
    assert_bit_for_bit(out, want, f"{case.name} forward", "forward")

    logical = case.logical()
    logical["x"][..., d - rotary :] = 0.0
    x, cos, sin, grad = case.lay_out(logical, DEVICE)
    _, rstd = torch.ops.dsrope.qnorm_rope(x, cos, sin, rotary, eps)
    r = rstd.view(case.shape[0], case.shape[2], case.shape[1]).transpose(1, 2)[..., None]
    _, dx = forward_backward(qnorm_rope_triton, x, grad, cos, sin, rotary, eps)
    g = eager_partial_rope(grad, cos, -sin, rotary).float()  # g', boundary 2
    xhat = x.float() * r
    # xhat is 0 on the rotary channels: dx = rnd(r * (g' - 0 * mean)) there, the mean bringing only its NaN or
    # infinity (and the sign of a zero product, which backward comparisons leave aside)
    zero_mean = xhat * ((g * xhat).sum(-1, keepdim=True) / d)
    want = (r * (g - zero_mean)).to(x.dtype)
    rotary_channels = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    rotary_channels[..., d - rotary :] = True
    assert_bit_for_bit(dx, want, f"{case.name} backward (rotary channels)", "backward", rotary_channels)


@pytest.mark.parametrize(
    "index", range(len(case_ids("partial_rope", DRAWN_ON_CPU))), ids=case_ids("partial_rope", DRAWN_ON_CPU)
)
def test_partial_rope_is_the_eager_chain_bit_for_bit(index):
    check_partial_rope_bit_for_bit(bitwise_cases("partial_rope", DRAWN_ON_CPU)[index])


@pytest.mark.parametrize(
    "index", range(len(case_ids("qnorm_rope", DRAWN_ON_CPU))), ids=case_ids("qnorm_rope", DRAWN_ON_CPU)
)
def test_qnorm_rope_rotation_is_the_eager_rotation_bit_for_bit(index):
    check_qnorm_rotation_bit_for_bit(bitwise_cases("qnorm_rope", DRAWN_ON_CPU)[index])


@pytest.mark.gpu
def test_partial_rope_is_the_eager_chain_bit_for_bit_on_more_drawn_cases():
    """The compiled kernels on DRAWN_ON_GPU drawn cases more (the canonical and golden ones run above)."""
    for case in bitwise_cases("partial_rope", DRAWN_ON_GPU)[len(bitwise_cases("partial_rope", 0)) :]:
        check_partial_rope_bit_for_bit(case)


@pytest.mark.gpu
def test_qnorm_rope_rotation_is_the_eager_rotation_bit_for_bit_on_more_drawn_cases():
    for case in bitwise_cases("qnorm_rope", DRAWN_ON_GPU)[len(bitwise_cases("qnorm_rope", 0)) :]:
        check_qnorm_rotation_bit_for_bit(case)


def test_qnorm_rope_whole_chain_parts_from_eager_only_where_its_rstd_does():
    """The whole chain, F.rms_norm included, on every case (canonical, golden, drawn): what a trainer that swaps
    the kernel in asks for. The rotation is the eager one (held above); the kernel's rstd is its own (its row sum's
    order, its rsqrt), so where rnd(x * rstd) differs from F.rms_norm's row the outputs may part, and nowhere
    else: every forward element that differs lies in such a row. Prints each case's count of differing elements,
    forward and backward (an H200's: docs/records/2026-12-07-gpu-runs.md). On the CPU, the canonical and golden
    cases (Triton's interpreter against torch's CPU rms_norm); on CUDA, the drawn ones too."""
    differ = {}
    for case in bitwise_cases("qnorm_rope", DRAWN_ON_GPU if torch.device(DEVICE).type == "cuda" else 0):
        x, cos, sin, grad = case.build(DEVICE)
        want = forward_backward(eager_qnorm_rope, x, grad, cos, sin, case.rotary, case.eps)
        got = forward_backward(qnorm_rope_triton, x, grad, cos, sin, case.rotary, case.eps)
        _, rstd = torch.ops.dsrope.qnorm_rope(x, cos, sin, case.rotary, case.eps)
        r = rstd.view(case.shape[0], case.shape[2], case.shape[1]).transpose(1, 2)[..., None]
        ours = (x.float() * r).to(x.dtype)
        eager = F.rms_norm(x, (x.shape[-1],), eps=case.eps)
        rows_apart = (~same_bits(ours, eager)).any(-1, keepdim=True)
        out_apart = ~same_bits(got[0], want[0])
        elsewhere = out_apart & ~rows_apart.expand_as(out_apart)
        assert not elsewhere.any(), (
            f"{case.name}: {int(elsewhere.sum())} output elements differ from the eager chain in rows whose "
            f"normalized row is F.rms_norm's; first at {elsewhere.nonzero()[0].tolist()}"
        )
        for g, w, direction in zip(got, want, SIGNED_ZEROS, strict=True):
            count = int((~same_bits(g, w, SIGNED_ZEROS[direction])).sum())
            if count:
                differ[f"{case.name} {case.dtype} {direction}"] = f"{count} of {g.numel()}"
    print(f"qnorm_rope against the eager chain, elements that differ: {differ or 'none'}")


def test_partial_rope_is_classified_interleaved_out_of_place_and_in_place():
    """The classifier (dsrope_gate.semantics) names both partial RoPE kernels `interleaved`, forward and
    backward, on the canonical cases of every dtype (fp32 tells interleaved from fma-rotation, bf16 from
    truncating-store); the emulations compute on the CPU."""
    for form in ("out of place", "in place"):
        evidence = {"forward": [], "backward": []}
        for case in canonical():
            x, cos, sin, grad = case.build(DEVICE)
            if form == "out of place":
                out, dx = forward_backward(apply_partial_rope_triton, x, grad, cos, sin, case.rotary)
            else:
                out, dx = in_place(x, cos, sin, case.rotary, grad)
            cpu = [t.cpu() for t in (x, cos, sin, grad)]
            for direction, got, emulation in (("forward", out, rope_forward), ("backward", dx, rope_backward)):
                emulated = {label: emulation(label)(*cpu[:3], case.rotary, None, cpu[3]) for label in ROTATIONS}
                evidence[direction].append({label: agreement(got.cpu(), e) for label, e in emulated.items()})
        for direction, cases in evidence.items():
            assert classify(cases) == ["interleaved"], (form, direction, cases)
