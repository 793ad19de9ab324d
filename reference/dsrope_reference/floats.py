"""Floating-point formats, correct rounding from FP64, the ULP distance and the interval check.

`torch` rounds fp64 -> bf16/fp16 through fp32 (two roundings), so rounding here is done by hand:
for a format with p significand bits and minimum normal exponent emin, the spacing of the
format around v is q = 2**(max(floor(log2|v|), emin) - p + 1); v / q is exact in FP64 (a power
of two scaling) and rounding it to an integer (half to even, floor, ceil) rounds v into the
format. Overflow follows IEEE: round-to-nearest goes to inf at max + half a spacing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

U32 = 2.0**-24  # unit roundoff of FP32


@dataclass(frozen=True)
class Format:
    name: str
    precision: int  # significand bits, hidden bit included
    emin: int  # exponent of the smallest normal
    emax: int

    @property
    def max(self) -> float:
        return (2.0 - 2.0 ** (1 - self.precision)) * 2.0**self.emax

    @property
    def unit_roundoff(self) -> float:
        return 2.0**-self.precision


FORMATS = {
    torch.bfloat16: Format("bfloat16", 8, -126, 127),
    torch.float16: Format("float16", 11, -14, 15),
    torch.float32: Format("float32", 24, -126, 127),
}


def fmt(dtype: torch.dtype) -> Format:
    return FORMATS[dtype]


def _spacing(v: torch.Tensor, f: Format) -> torch.Tensor:
    _, e = torch.frexp(v)  # v = m * 2**e with 0.5 <= |m| < 1, so floor(log2|v|) = e - 1
    e = torch.clamp(e.to(torch.float64) - 1, min=f.emin)
    return torch.exp2(e - (f.precision - 1))


def _round(v: torch.Tensor, dtype: torch.dtype, to_integer) -> torch.Tensor:
    f = fmt(dtype)
    v = v.to(torch.float64)
    q = _spacing(v, f)
    r = to_integer(v / q) * q
    # a carry into the next binade is exact; only overflow needs care
    finite = torch.isfinite(v)
    over = finite & (r.abs() > f.max)
    r = torch.where(over, torch.copysign(torch.full_like(r, float("inf")), v), r)
    return torch.where(finite, r, v)


def round_nearest(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round FP64 values into `dtype`, nearest with ties to even; result is FP64 (exactly representable)."""
    return _round(v, dtype, torch.round)


def round_down(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    f = fmt(dtype)
    r = _round(v, dtype, torch.floor)
    # floor never overflows to +inf: the largest value below +max-exceeding v is max
    return torch.where(r == float("inf"), torch.full_like(r, f.max), r)


def round_up(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    f = fmt(dtype)
    r = _round(v, dtype, torch.ceil)
    return torch.where(r == float("-inf"), torch.full_like(r, -f.max), r)


def nearest_interval(center: torch.Tensor, radius: torch.Tensor, dtype: torch.dtype):
    """All values round-to-nearest can give for some w in [center - radius, center + radius].

    Rounding is monotone, so that set is [RN(lo), RN(hi)]: where the interval lies inside one
    rounding cell, the only allowed result is the correctly rounded one.
    """
    return round_nearest(center - radius, dtype), round_nearest(center + radius, dtype)


def exact_sum(t: torch.Tensor, keepdim: bool = False) -> torch.Tensor:
    """Correctly rounded FP64 sum over the last dim (math.fsum).

    torch.sum's order depends on the machine (vector width, threads): on the H200 host it gave
    other last bits than here, and the goldens must be the same bits everywhere. A correctly
    rounded sum does not depend on the order. Rows with inf/NaN follow IEEE (order-free there too).
    """
    t = t.to(torch.float64)
    rows = t.reshape(-1, t.shape[-1]).tolist() if t.shape[-1] else [[] for _ in range(math.prod(t.shape[:-1]))]

    def one(row):
        try:
            return math.fsum(row)
        except (OverflowError, ValueError):  # inf, NaN or overflow: IEEE's answer is order-free
            return sum(row)

    out = torch.tensor([one(r) for r in rows], dtype=torch.float64).reshape(t.shape[:-1])
    return out.unsqueeze(-1) if keepdim else out


INT_OF = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}
NAN_VS_NUMBER = 1 << 62  # the ulp distance of a NaN from a number: beyond any distance of two numbers


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t as integers of its width, on the CPU: the project's one view of a float's bits
    (bit-for-bit comparisons, orders, encodings)."""
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().cpu().contiguous().view(width)


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Integers (int64) whose order and differences count the bit patterns of t's dtype between two values.

    One-to-one: -0 sits one step below +0, and NaNs map beyond +-inf by their bits, so equal integers mean
    equal bits (the golden store encodes intervals as steps in this order and inverts it with from_ordered).
    """
    raw = bits(t).to(torch.int64)
    magnitude = raw & ((1 << (t.element_size() * 8 - 1)) - 1)
    return torch.where(raw < 0, -magnitude - 1, raw)


def from_ordered(o: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    sign = -(1 << (torch.finfo(dtype).bits - 1))
    bits = torch.where(o < 0, (-o - 1) | sign, o)
    return bits.to(INT_OF[dtype]).view(dtype)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The project's one ULP distance: the number of representable values of the (common) dtype between a
    and b. -0 and +0 are one value (0 apart; a span across zero counts zero once); NaN vs NaN 0 (any
    payload), NaN vs number NAN_VS_NUMBER."""
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    oa, ob = ordered(a), ordered(b)
    oa, ob = torch.where(oa < 0, oa + 1, oa), torch.where(ob < 0, ob + 1, ob)  # -0 onto +0
    d = (oa - ob).abs()
    both_nan = torch.isnan(a) & torch.isnan(b)
    one_nan = torch.isnan(a) ^ torch.isnan(b)
    d = torch.where(both_nan, torch.zeros_like(d), d)
    return torch.where(one_nan, torch.full_like(d, NAN_VS_NUMBER), d)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, zeros' signs included, NaN meeting NaN (any payload)."""
    return a.shape == b.shape and bool(((a == b) & (a.signbit() == b.signbit()) | (a.isnan() & b.isnan())).all())


@dataclass
class Check:
    """Result of judging a kernel output against a model."""

    checked: int
    violations: int
    bit_exact: int
    max_ulp: int
    first_violation: str

    @property
    def exact_fraction(self) -> float:
        return self.bit_exact / max(self.checked, 1)

    def __str__(self) -> str:
        return (
            f"{self.checked} elements, {self.violations} outside the model, "
            f"{self.exact_fraction:.4%} bit-exact, max {self.max_ulp} ulp. {self.first_violation}"
        )


def inside(out64: torch.Tensor, ref: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Per element, whether out (FP64 values) is what the model allows: NaN where ref is NaN, ref itself
    where ref is infinite, a value in [lo, hi] elsewhere."""
    return torch.where(
        torch.isnan(ref),
        torch.isnan(out64),
        torch.where(torch.isfinite(ref), (out64 >= lo) & (out64 <= hi), out64 == ref),
    )


def budget_used(out64: torch.Tensor, ref: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Per element, the share of the error model's allowance the output uses: |out - ref| over the room on
    its side (hi - ref above ref, ref - lo below). 0 for the correctly rounded value, at most 1 inside the
    model, inf where the model allows nothing on that side (or NaN, or another infinity, is returned)."""
    err = out64 - ref
    room = torch.where(err > 0, hi - ref, ref - lo)
    share = torch.where(err == 0, torch.zeros_like(err), err.abs() / room)
    ok = inside(out64, ref, lo, hi)
    share = torch.where(torch.isfinite(ref), share, torch.where(ok, 0.0, float("inf")))
    return torch.where(torch.isnan(share), float("inf"), share)


def judge(out: torch.Tensor, ref: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> Check:
    """out (kernel, its dtype) against ref/lo/hi (FP64). NaN must meet NaN; inf must equal ref."""
    out64 = out.detach().to("cpu", torch.float64)
    ref, lo, hi = (t.to(torch.float64) for t in (ref, lo, hi))
    assert out64.shape == ref.shape, (out64.shape, ref.shape)
    ok = inside(out64, ref, lo, hi)
    ref_in_dtype = ref.to(out.dtype) if out.dtype == torch.float32 else _exact_cast(ref, out.dtype)
    ulps = ulp_distance(out.detach().cpu(), ref_in_dtype)
    bad = (~ok).nonzero()
    first = describe_violation(tuple(bad[0].tolist()), out64, ref, lo, hi) if len(bad) else ""
    return Check(
        checked=ref.numel(),
        violations=int((~ok).sum()),
        bit_exact=int((ulps == 0).sum()),
        max_ulp=int(ulps.max()) if ulps.numel() else 0,
        first_violation=first,
    )


def describe_violation(i: tuple, got64: torch.Tensor, ref, lo, hi, what: str = "kernel") -> str:
    """The one wording of an element outside the model: its index, the value judged (`what`), the interval
    allowed and the correctly rounded reference."""
    return (
        f"first at index {list(i)}: {what} {got64[i].item()!r}, "
        f"allowed [{lo[i].item()!r}, {hi[i].item()!r}], ref {ref[i].item()!r}"
    )


def _exact_cast(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast FP64 values that are already representable in dtype (so no double rounding happens)."""
    return v.to(torch.float32).to(dtype)
