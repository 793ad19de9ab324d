"""FP64 model of partial interleaved RoPE and the per-element error model of an FP32 kernel.

Exact function (docs/contract.md): for pair k of the trailing R channels, (a, b) = x[D-R+2k], x[D-R+2k+1],
c = cos[b, s, k], s = sin[b, s, k] (s negated for the inverse):
    out = (rnd(a*c - b*s), rnd(a*s + b*c)),   leading D-R channels copied.

Reference value: the correctly rounded exact result. a*c and b*s are exact in FP64 (at most
24 x 24 significand bits); their sum is split exactly into hi + lo (TwoSum), and a hi that
sits exactly on a rounding midpoint is nudged by the sign of lo, so every rounding decision,
ties included, is the exact one.

Error model: an FP32 kernel computes a*c - b*s with two products and one sum, in any
association and with or without FMA contraction; each step adds at most one FP32 rounding, so
its pre-store value w satisfies |w - v| <= E = gamma_2 (|a*c| + |b*s|) + T, u = 2**-24,
gamma_2 = 2u / (1 - 2u) (2u alone misses the second-order term: rn(rn(ac) + rn(bs)) can be off
by 2u(|ac| + |bs|) + u**2 (|ac| + |bs|), fma(a, c, rn(bs)) by u|ac| + 2u|bs| + u**2 |bs|), where
T = 2**-126 for each of a*c, b*s, v that is nonzero and below 2**-126 in magnitude: an FP32
subnormal may be flushed to zero (or lose bits to gradual underflow). Exact zeros stay exact,
and E = 0 when a*c, b*s and v are all FP32 normal numbers (every evaluation is then exact). The
store rounds w to nearest, so the output must lie in [rnd(v - E), rnd(v + E)]. Where that
interval sits inside one rounding cell (most elements in bf16/fp16) only the correctly rounded
value is allowed. Copied channels must be bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsrope_reference.floats import U32, judge, round_down, round_nearest, round_up

TINY = 2.0**-126
GAMMA_2 = 2 * U32 / (1 - 2 * U32)  # two FP32 roundings, second-order term included


def fp32_exact(t: torch.Tensor) -> torch.Tensor:
    """t is an FP32 normal number or zero (subnormals excluded: they may be flushed)."""
    return (round_nearest(t, torch.float32) == t) & ((t == 0) | (t.abs() >= TINY))


def flush_slack(*terms: torch.Tensor) -> torch.Tensor:
    """2**-126 for each term that is an FP32 subnormal (nonzero, below the smallest normal)."""
    return sum(((t != 0) & (t.abs() < TINY)).to(torch.float64) for t in terms) * TINY


@dataclass
class Model:
    """Per-element reference (correctly rounded), and the interval a correct kernel may return."""

    ref: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor

    def judge(self, out: torch.Tensor):
        return judge(out, self.ref, self.lo, self.hi)


def two_sum(a: torch.Tensor, b: torch.Tensor):
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return s, err


def round_nearest_exact(hi: torch.Tensor, lo: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Correctly round the exact value hi + lo (|lo| <= ulp64(hi)/2) into dtype."""
    down, up = round_down(hi, dtype), round_up(hi, dtype)
    on_midpoint = (down != up) & ((down + up) / 2 == hi)
    nudged = torch.where(lo > 0, up, down)
    return torch.where(on_midpoint & (lo != 0), nudged, round_nearest(hi, dtype))


def rotate_pairs(a, b, c, s, dtype):
    """One rotation a*c - b*s, a*s + b*c of exact FP64 inputs: (refs, intervals) per output."""
    ac, bs, as_, bc = a * c, b * s, a * s, b * c
    first_hi, first_lo = two_sum(ac, -bs)
    second_hi, second_lo = two_sum(as_, bc)
    ref = (
        exact_or_ieee(first_hi, round_nearest_exact(first_hi, first_lo, dtype)),
        exact_or_ieee(second_hi, round_nearest_exact(second_hi, second_lo, dtype)),
    )
    return ref, rotation_interval(a, a, b, b, c, s, dtype)


def exact_or_ieee(value: torch.Tensor, rounded: torch.Tensor) -> torch.Tensor:
    """The correctly rounded value where the FP64 computation is finite; its IEEE result (inf, NaN) where
    an input is infinite or NaN: any FP32 evaluation order gives the same one (inf * finite is inf,
    inf - inf is NaN), and TwoSum's error term is NaN there."""
    return torch.where(torch.isfinite(value), rounded, value)


def rotation_interval(a_lo, a_hi, b_lo, b_hi, c, s, dtype):
    """Outputs an FP32 kernel may store when it rotates some a in [a_lo, a_hi], b in [b_lo, b_hi].

    The exact rotation is linear in a and b, so its range over the box is reached at the box's
    corners; the kernel's own FP32 error E (module docstring) widens it on both sides.
    """

    def span(p_lo, p_hi, q_lo, q_hi, sign):
        """Range of p + sign*q over the corners, and the sum of the magnitudes for E."""
        p = torch.minimum(p_lo, p_hi), torch.maximum(p_lo, p_hi)
        q = torch.minimum(q_lo, q_hi), torch.maximum(q_lo, q_hi)
        lo = p[0] + (q[0] if sign > 0 else -q[1])
        hi = p[1] + (q[1] if sign > 0 else -q[0])
        magnitude = torch.maximum(p_lo.abs(), p_hi.abs()) + torch.maximum(q_lo.abs(), q_hi.abs())
        return lo, hi, magnitude, (p_lo, p_hi, q_lo, q_hi)

    def interval(p_lo, p_hi, q_lo, q_hi, sign):
        lo, hi, magnitude, terms = span(p_lo, p_hi, q_lo, q_hi, sign)
        err = GAMMA_2 * magnitude + flush_slack(*terms, lo, hi)
        # When both products and the result are FP32 numbers, every evaluation order, with or
        # without FMA, is exact: no FP32 error to allow (this is what makes ties testable). The result
        # is judged exactly: lo is the FP64 sum, which rounds a sum of terms 2**53 apart (TwoSum's
        # error term is then not 0, and the FP32 kernel's sum rounds too).
        _, sum_error = two_sum(p_lo, q_lo if sign > 0 else -q_lo)
        exact = (p_lo == p_hi) & (q_lo == q_hi) & fp32_exact(p_lo) & fp32_exact(q_lo) & fp32_exact(lo)
        exact = exact & (sum_error == 0)
        err = torch.where(exact, torch.zeros_like(err), err)
        return round_nearest(lo - err, dtype), round_nearest(hi + err, dtype)

    first = interval(a_lo * c, a_hi * c, b_lo * s, b_hi * s, -1)
    second = interval(a_lo * s, a_hi * s, b_lo * c, b_hi * c, +1)
    return first, second


def interleave(even: torch.Tensor, odd: torch.Tensor) -> torch.Tensor:
    return torch.stack((even, odd), dim=-1).flatten(-2)


def tables(cos: torch.Tensor, sin: torch.Tensor, rotary: int):
    """[B, S, R] FP32 tables -> FP64 [B, 1, S, R/2], the frequencies of the pairs."""
    c = cos[..., : rotary // 2].to("cpu", torch.float64)[:, None]
    s = sin[..., : rotary // 2].to("cpu", torch.float64)[:, None]
    return c, s


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, inverse: bool = False) -> Model:
    """Model of rotating the trailing `rotary` channels of x [B, H, S, D]; output in x.dtype."""
    dtype = x.dtype
    x64 = x.detach().to("cpu", torch.float64)
    c, s = tables(cos, sin, rotary)
    if inverse:
        s = -s
    d = x.shape[-1]
    keep = x64[..., : d - rotary]
    a, b = x64[..., d - rotary :: 2], x64[..., d - rotary + 1 :: 2]
    (ref_a, ref_b), ((lo_a, hi_a), (lo_b, hi_b)) = rotate_pairs(a, b, c, s, dtype)
    ref = torch.cat((keep, interleave(ref_a, ref_b)), dim=-1)
    lo = torch.cat((keep, interleave(lo_a, lo_b)), dim=-1)
    hi = torch.cat((keep, interleave(hi_a, hi_b)), dim=-1)
    return Model(ref, lo, hi)
