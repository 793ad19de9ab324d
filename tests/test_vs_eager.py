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
- partial RoPE on CPU: the same FP32 operations in the same order on both sides (the kernel in
  Triton's interpreter computes a*c + (-b)*s and b*c + a*s as separate FP32 ops, as torch's eager
  ops do; its backward with the negated sine gives g1*c + g2*s and g2*c - g1*s, which is what
  autograd sums), so bit for bit on every element, forward and backward;
- QNorm: not everywhere, on either device: the kernel's sum of squares (and on GPU its approximate
  rsqrt) is not torch's, so r may differ in its last FP32 bits and y = rnd(x * r) with it.
On GPU the compiled kernels may contract products into FMAs: the model and the single-valued
elements decide there, as for QNorm.
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

import pytest
import torch
from dsrope_reference import qnorm_rope as qnorm_model
from dsrope_reference.floats import bits
from dsrope_reference.rope import Model, partial_rope

from dsrope import apply_partial_rope_triton, qnorm_rope_triton
from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope, forward_backward
from dsrope_gate.inputs import DTYPES, ON_GPU, laid_out, tables
from dsrope_gate.layouts import TOKEN_MAJOR, Layout

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
    assert_agree(out, eager_out, partial_rope(x, cos, sin, rotary), "forward", everywhere=not ON_GPU)
    backward = partial_rope(ones_if_none(grad, x), cos, sin, rotary, inverse=True)
    assert_agree(dx, eager_dx, backward, "backward", everywhere=not ON_GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["qnorm_rope", "partial_rope"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dsv4_shapes_match_eager_on_gpu(dtype, kernel, record_property):
    """DSV4 [B, H, S, D] = [2, 16, 64, 512], R = 64, token-major x, dense gradient: both sides inside
    the model, equal bits where it allows one value (the CPU tests above at smaller sizes)."""
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
        assert_agree(o, e, m, what, everywhere=False)
        for o, e, m, what in zip(ours, eager, models, ("forward", "backward"), strict=True)
    ]
    record_property("single_valued", f"forward {shares[0]:.2%}, backward {shares[1]:.2%}")
    print(f"{kernel} {dtype}: single-valued forward {shares[0]:.2%}, backward {shares[1]:.2%}")
