"""FP64 model of partial interleaved RoPE and the per-element error model of an FP32 kernel.

Exact function (SPEC.md): for pair k of the trailing R channels, (a, b) = x[D-R+2k], x[D-R+2k+1],
c = cos[b, s, k], s = sin[b, s, k] (s negated for the inverse):
    out = (rnd(a*c - b*s), rnd(a*s + b*c)),   leading D-R channels copied.

Reference value: the correctly rounded exact result. a*c and b*s are exact in FP64 (at most
24 x 24 significand bits); their sum is split exactly into hi + lo (TwoSum), and a hi that
sits exactly on a rounding midpoint is nudged by the sign of lo, so every rounding decision,
ties included, is the exact one.

Error model: an FP32 kernel computes a*c - b*s with two products and one sum, in any
association and with or without FMA contraction; each step adds at most one FP32 rounding, so
its pre-store value w satisfies |w - v| <= E = 2u(|a*c| + |b*s|) + T, u = 2**-24, where
T = 2**-126 for each of a*c, b*s, v that is nonzero and below 2**-126 in magnitude: an FP32
subnormal may be flushed to zero (or lose bits to gradual underflow). Exact zeros stay exact. The
store rounds w to nearest, so the output must lie in [rnd(v - E), rnd(v + E)]. Where that
interval sits inside one rounding cell (most elements in bf16/fp16) only the correctly rounded
value is allowed. Copied channels must be bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.floats import U32, judge, nearest_interval, round_down, round_nearest, round_up

TINY = 2.0**-126


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
    """One rotation step a*c - b*s and a*s + b*c on FP64 inputs: reference, center, radius."""
    ac, bs, as_, bc = a * c, b * s, a * s, b * c
    first_hi, first_lo = two_sum(ac, -bs)
    second_hi, second_lo = two_sum(as_, bc)
    first_err = 2 * U32 * (ac.abs() + bs.abs()) + flush_slack(ac, bs, first_hi)
    second_err = 2 * U32 * (as_.abs() + bc.abs()) + flush_slack(as_, bc, second_hi)
    ref = (round_nearest_exact(first_hi, first_lo, dtype), round_nearest_exact(second_hi, second_lo, dtype))
    lo_hi = (nearest_interval(first_hi, first_err, dtype), nearest_interval(second_hi, second_err, dtype))
    return ref, lo_hi


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
