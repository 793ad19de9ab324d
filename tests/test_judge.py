"""The judge judged: the reference's error model (dsrope_reference, through each op's record) rejects
known-wrong outputs for every op, direction and dtype, not only accepts correct ones.

On one small case per (op, direction, dtype) with NaN inputs in it (a NaN in one rotary channel of x, one
in a pass-through channel of the gradient: golden kind "nan"), the correctly rounded reference and each
bound of the model are accepted, and these are rejected element by element:
- NaN, +inf or -inf where the reference is finite; a finite value (0) where it is NaN;
- one rounding step (one representable value of the dtype) above the upper bound or below the lower one;
- at an exact rounding midpoint (midpoint values, dyadic tables: the rotation is exact in FP32), the odd
  neighbour: the model allows the even one alone (ties to even).
The error model is stated in dsrope_reference.rope and dsrope_reference.qnorm_rope; these tests state no
other bound, they check that the stated one is enforced.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference.floats import inside, round_down, round_nearest, round_up

from dsrope_gate.cases import Case, Drawn, Seeded, Tables, Values
from dsrope_gate.layouts import CONTIGUOUS
from dsrope_gate.ops import DIRECTIONS, JUDGED, PARTIAL_ROPE

DTYPES = ("bfloat16", "float16", "float32")
OPS = list(JUDGED.values())


def model_of(op, direction: str, dtype: str):
    case = Case(
        name="judge", shape=(2, 2, 3, 64), rotary=32, dtype=dtype, values=Seeded(5, "nan"), grad_layout=CONTIGUOUS
    )
    inputs = case.build("cpu")
    return op.reference(case, inputs)[DIRECTIONS[direction]], case.torch_dtype


def accepted(values: torch.Tensor, model) -> torch.Tensor:
    return inside(values.to(torch.float64), model.ref, model.lo, model.hi)


def representable(t64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t64.to(torch.float32).to(dtype).to(torch.float64) == t64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("op", OPS, ids=str)
def test_model_accepts_the_reference_and_its_bounds(op, direction, dtype):
    model, torch_dtype = model_of(op, direction, dtype)
    assert bool(accepted(model.ref.to(torch.float32).to(torch_dtype), model).all())
    finite = model.ref.isfinite()
    for bound in (model.lo, model.hi):
        exact = finite & representable(bound, torch_dtype)
        assert exact[finite].float().mean() > 0.9, "the model's bounds are values of the dtype"
        values = torch.where(exact, bound, model.ref).to(torch.float32).to(torch_dtype)
        assert bool(accepted(values, model).all())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("op", OPS, ids=str)
def test_model_rejects_non_finite_where_finite_and_finite_where_nan(op, direction, dtype):
    model, torch_dtype = model_of(op, direction, dtype)
    ref = model.ref.to(torch.float32).to(torch_dtype)
    finite, nan = model.ref.isfinite(), model.ref.isnan()
    assert finite.any() and nan.any(), "the case must hold finite and NaN reference values"
    for wrong in (float("nan"), float("inf"), float("-inf")):
        got = torch.where(finite, torch.full_like(ref, wrong), ref)
        assert not bool(accepted(got, model)[finite].any()), f"{wrong} accepted where the reference is finite"
    got = torch.where(nan, torch.zeros_like(ref), ref)
    assert not bool(accepted(got, model)[nan].any()), "a finite value accepted where the reference is NaN"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("op", OPS, ids=str)
def test_model_rejects_one_step_past_each_bound(op, direction, dtype):
    model, torch_dtype = model_of(op, direction, dtype)
    top = torch.finfo(torch_dtype).max
    for bound, toward in ((model.hi, float("inf")), (model.lo, float("-inf"))):
        finite = model.ref.isfinite()
        checked = finite & representable(bound, torch_dtype) & (bound.abs() < top)
        assert checked[finite].float().mean() > 0.9
        in_dtype = bound.to(torch.float32).to(torch_dtype)
        past = torch.nextafter(in_dtype, torch.full_like(in_dtype, toward))
        assert not bool(accepted(past, model)[checked].any()), (
            f"one step past the {'upper' if toward > 0 else 'lower'} bound accepted"
        )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("direction", list(DIRECTIONS))
def test_model_allows_only_the_even_neighbour_at_a_midpoint(direction, dtype):
    """Midpoint values and dyadic tables: the FP32 rotation is exact and many results are exact midpoints
    of two values of the dtype; there a correct kernel stores the even one (round to nearest even), and
    the model allows it alone."""
    case = Case(
        name="ties",
        shape=(2, 3, 4, 32),
        rotary=32,
        dtype=dtype,
        values=Drawn(Values("midpoint", 1), Tables("dyadic", 2), Values("midpoint", 3)),
        cos_layout=CONTIGUOUS,
        sin_layout=CONTIGUOUS,
    )
    inputs = case.build("cpu")
    model = PARTIAL_ROPE.reference(case, inputs)[DIRECTIONS[direction]]
    x = (inputs.x if direction == "forward" else inputs.grad).double()
    c = inputs.cos[..., :16].double()[:, None]
    s = inputs.sin[..., :16].double()[:, None] * (1 if direction == "forward" else -1)
    a, b = x[..., 0::2], x[..., 1::2]
    exact = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)  # products of few bits: exact in FP64
    down, up = round_down(exact, case.torch_dtype), round_up(exact, case.torch_dtype)
    midpoint = (down != up) & (exact - down == up - exact)
    assert midpoint.sum() >= 10, "the case must hold exact midpoints"
    even = round_nearest(exact, case.torch_dtype)
    odd = torch.where(even == down, up, down)
    assert torch.equal(model.ref[midpoint], even[midpoint])
    assert bool(accepted(even.float().to(case.torch_dtype), model)[midpoint].all())
    assert not bool(accepted(odd.float().to(case.torch_dtype), model)[midpoint].any()), "the odd neighbour accepted"
