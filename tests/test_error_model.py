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

import math

import pytest
import torch
from dsrope_reference.floats import (
    NAN_VS_NUMBER,
    budget_used,
    inside,
    round_down,
    round_nearest,
    round_up,
    same_values,
    ulp_distance,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dsrope_gate.cases import Case, Drawn, Inputs, Seeded, Tables, Values
from dsrope_gate.layouts import CONTIGUOUS
from dsrope_gate.ops import DIRECTIONS, JUDGED, PARTIAL_ROPE
from dsrope_gate.strategies import cases

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


# --- the rounding helpers, the ulp distance and the budget (dsrope_reference.floats) ------------------------

NUMPY = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def doubles(dtype: torch.dtype, n: int = 4000, seed: int = 0) -> torch.Tensor:
    """FP64 values that probe a rounding into dtype: random significands over its whole exponent range
    (subnormals and overflow included), exact midpoints of two neighbours, midpoints moved by one FP64 ulp
    (where rounding through FP32 first goes wrong), signed zeros and infinities."""
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(seed)
    mantissa = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[dtype]
    low, high = math.log2(info.smallest_normal) - mantissa - 2, math.log2(info.max) + 1
    e = torch.rand(n, generator=g, dtype=torch.float64) * (high - low) + low
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    v = sign * torch.exp2(e)
    grid = v.to(torch.float32).to(dtype).double()
    up = torch.nextafter(grid.to(dtype), torch.full_like(grid, math.inf).to(dtype)).double()
    mid = (grid + up) / 2
    mid = mid[torch.isfinite(mid)]
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, info.max, -info.max, info.tiny, info.smallest_normal / 4])
    return torch.cat((v, mid, torch.nextafter(mid, mid * 2), torch.nextafter(mid, mid / 2), specials))


def correctly_rounded(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """v rounded once to nearest even, by numpy (float16, float32: its double conversions round once) and
    for bfloat16 by ml_dtypes from FP32 rounded to odd (FP32 keeps 16 bits more than bf16, so rounding to
    odd there and then to nearest even rounds once; ml_dtypes 0.6 converts float64 through float32 to
    nearest, a double rounding: seen on the H200 host). Independent of the reference's
    arithmetic."""
    import ml_dtypes
    import numpy as np

    a = v.numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype != torch.bfloat16:
            return torch.from_numpy(a.astype(NUMPY[dtype]).astype(np.float64))
        f = a.astype(np.float32)
        finite = np.isfinite(a)
        toward_zero = np.where(finite & (np.abs(f.astype(np.float64)) > np.abs(a)), np.nextafter(f, np.float32(0)), f)
        inexact = finite & (toward_zero.astype(np.float64) != a)
        odd = (toward_zero.view(np.uint32) | inexact.astype(np.uint32)).view(np.float32)
        return torch.from_numpy(odd.astype(ml_dtypes.bfloat16).astype(np.float64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_round_nearest_is_the_correct_rounding_and_down_up_bracket_it(dtype):
    v = doubles(dtype)
    nearest = round_nearest(v, dtype)
    assert same_values(nearest, correctly_rounded(v, dtype)), "round_nearest is not round-to-nearest-even"
    down, up = round_down(v, dtype), round_up(v, dtype)
    finite = torch.isfinite(v)
    assert bool(((down <= v) & (v <= up))[finite].all())
    assert bool(((nearest == down) | (nearest == up) | nearest.isinf())[finite].all())
    exact = correctly_rounded(v, dtype) == v
    assert bool((down == up)[finite & exact].all()) and bool((down < up)[finite & ~exact].all())
    step = torch.nextafter(down.to(torch.float32).to(dtype), up.to(torch.float32).to(dtype)).double()
    assert bool((step == up)[finite & ~exact].all()), "round_down and round_up are not neighbours"


def test_ulp_distance_counts_values_once_across_zero_and_nan_apart():
    one = torch.tensor([1.0], dtype=torch.bfloat16)
    nxt = torch.nextafter(one, torch.tensor([2.0], dtype=torch.bfloat16))
    tiny = torch.tensor([2.0**-133], dtype=torch.bfloat16)  # the smallest bf16 subnormal
    pairs = [
        (one, one, 0),
        (one, nxt, 1),
        (torch.tensor([0.0]), torch.tensor([-0.0]), 0),
        (tiny, -tiny, 2),
        (torch.tensor([float("nan")]), torch.tensor([float("nan")]), 0),
        (torch.tensor([float("nan")]), torch.tensor([1.0]), NAN_VS_NUMBER),
        (torch.tensor([float("inf")]), torch.tensor([torch.finfo(torch.float32).max]), 1),
    ]
    for a, b, want in pairs:
        a, b = a.to(b.dtype), b
        assert int(ulp_distance(a, b)) == want == int(ulp_distance(b, a)), (a, b)


def test_same_values_tells_signed_zeros_apart_and_lets_nan_meet_nan():
    assert same_values(torch.tensor([0.0, float("nan")]), torch.tensor([0.0, float("nan")]))
    assert not same_values(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not same_values(torch.tensor([1.0]), torch.tensor([float("nan")]))


def test_budget_used_is_zero_at_the_reference_one_at_a_bound_and_beyond_one_past_it():
    ref = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, float("nan")], dtype=torch.float64)
    lo, hi = ref - 0.5, ref + 0.25
    out = torch.tensor([1.0, 1.25, 0.5, 1.5, float("nan"), 3.0], dtype=torch.float64)
    used = budget_used(out, ref, lo, hi)
    assert used[:3].tolist() == [0.0, 1.0, 1.0] and used[3] == 2.0 and used[4] == math.inf
    assert used[5] == math.inf  # a number where the reference is NaN


@pytest.mark.parametrize("dtype", DTYPES)
def test_model_accepts_an_infinity_only_of_its_sign(dtype):
    """Infinite inputs rotated give infinite references (partial RoPE: -inf rows, an inf channel): the
    model accepts that infinity and rejects the other one, NaN and the largest finite value."""
    case = Case(
        name="infinities",
        shape=(2, 3, 5, 96),
        rotary=32,
        dtype=dtype,
        values=Seeded(7, "nonfinite"),
        grad_layout=CONTIGUOUS,
    )
    model = PARTIAL_ROPE.reference(case, case.build("cpu"))["out"]
    infinite = model.ref.isinf()
    assert infinite.sum() >= 32, "the case must hold infinite references"
    ref = model.ref.to(torch.float32).to(case.torch_dtype)
    assert bool(accepted(ref, model)[infinite].all())
    largest = torch.finfo(case.torch_dtype).max
    for wrong in (-ref, torch.full_like(ref, float("nan")), torch.sign(ref) * largest):
        assert not bool(accepted(wrong, model)[infinite].any())


@pytest.mark.parametrize("inverse", [False, True])
def test_a_value_just_off_a_midpoint_rounds_to_its_side(inverse):
    """a*c on a bf16 midpoint (1 + 2**-8) and b*s = 2**-60 below FP64's resolution there: TwoSum keeps the
    midpoint in its high part and the sign of the rest decides. Forward: a*c - b*s lies just below the
    midpoint (1.0), a*s + b*c just above it (1 + 2**-7); the inverse flips the sine and both sides. An FP32
    kernel's sum rounds the 2**-60 away and stores the even neighbour, 1.0: the model allows both there,
    the correctly rounded value and the FP32 kernel's (found by this test: the model allowed 1.0 alone,
    taking the FP64-rounded sum for an exact one)."""
    from dsrope_reference.rope import partial_rope

    x = torch.ones(1, 1, 1, 2, dtype=torch.bfloat16)
    cos = torch.full((1, 1, 2), 1 + 2.0**-8)
    sin = torch.full((1, 1, 2), 2.0**-60)
    model = partial_rope(x, cos, sin, 2, inverse=inverse)
    below, above = 1.0, 1 + 2.0**-7
    want = [above, below] if inverse else [below, above]
    assert model.ref.flatten().tolist() == want
    fp32_kernel = torch.tensor([[[[below, below]]]], dtype=torch.bfloat16)
    assert bool(accepted(model.ref.to(torch.bfloat16), model).all()) and bool(accepted(fp32_kernel, model).all())


@settings(deadline=None)
@given(case=st.sampled_from(OPS).flatmap(cases))
def test_the_reference_lies_inside_its_own_model(case):
    """For any drawn case, op and direction the correctly rounded reference is inside the interval the
    model allows: a judge that rejects the contract's own value would fail a correct kernel."""
    inputs = case.build("cpu")
    for op in OPS:
        if case.shape[-1] % 2 and op.even_channels:
            continue
        for stage, model in op.reference(case, inputs).items():
            if stage in op.stages and stage != "rstd":
                ref = model.ref.to(torch.float32).to(case.torch_dtype)
                assert bool(accepted(ref, model).all()), f"{op} {stage}: {case!r}"


def test_qnorm_model_allows_both_results_where_the_fp32_sum_may_overflow():
    """A float32 row whose sum of squares lies within the FP32 reduction's error of FLT_MAX: a correct
    kernel's sum may overflow (r = 0, the output 0) or not (the normalized row): the model allows both,
    for the output and the saved rstd, and nothing else there (a row of ones is rejected)."""
    from dsrope_reference.qnorm_rope import FLT_MAX, gamma

    d = 64
    v = torch.tensor(math.sqrt(FLT_MAX / d), dtype=torch.float32)
    squares = d * v.double() ** 2
    assert abs(squares / FLT_MAX - 1) < gamma(d), "the row must sit in the band where the FP32 sum may overflow"
    x = v.expand(1, 1, 1, d).clone()
    cos, sin = torch.ones(1, 1, 32), torch.zeros(1, 1, 32)
    case = Case(name="band", shape=(1, 1, 1, d), rotary=32, dtype="float32", values=Seeded(0), eps=1e-6)
    stages = JUDGED["qnorm_rope"].reference(case, Inputs(x, cos, sin, torch.ones_like(x)))
    out, rstd = stages["out"], stages["rstd"]
    assert bool(accepted(torch.zeros(1, 1, 1, d), out).all()), "the overflowed kernel's zeros rejected"
    assert bool(accepted(out.ref.float(), out).all())
    assert bool(accepted(torch.zeros(1), rstd).all()) and bool(accepted(rstd.ref.float(), rstd).all())
    assert not bool(accepted(torch.full((1, 1, 1, d), 2.0), out).any())
