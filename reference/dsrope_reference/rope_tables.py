"""Oracle for rope tables: the op rope_tables(positions, rotary, theta, rope_scaling) -> (cos, sin), FP32
[B, S, R] whose entries k < R/2 are pair k's (the rest are not judged). docs/tables-and-pipelines.md ("The
rope tables' contract") states the contract; this module computes it per element in mpmath.

The contract `fp32-elementwise`, for position p and pair k (P = fl32(p), u = 2**-24):
  f_k   the inverse frequency theta**(-2k/R), YaRN-corrected whenever rope_scaling is given
        (rope_utils.inverse_frequencies: the ramp from floor(cd(beta_fast)) to ceil(cd(beta_slow)));
  f'_k  its FP32 value, any FP32 number within the relative bound r_k of rope_utils.fp32_frequency_bounds
        (upstream's op sequence: pow within `pow_ulps` ulp, every other op one IEEE rounding);
  a     = fl32(P * f'_k), the FP32 product (part of the definition: another angle is another table);
  t     = A' * c rounded to FP32, c the platform's FP32 cos (sin) of a, within `ulps` ulp of cos(a),
          A' the FP32 value of the declared attention factor A (no product at all when A = 1).

Error model, per element. P and f' are FP32 numbers, so P * f' is exact in FP64 and rounding to nearest is
monotone: for f' in [f_lo, f_hi] = [ceil32(f (1 - r)), floor32(f (1 + r))] every angle lies in
I = [fl32(P f_lo), fl32(P f_hi)]. At large positions I is wide: the frequency's own error times p, plus the
product's rounding (at p = 2**20, pair 0 of a plain table, whose FP32 interval is 5u wide: 0.3125 rad, five
FP32 angles 2**-4 apart). I is the real interval, a superset of the FP32 angles in it. Over the
closed interval I, cos and sin reach their extremes at the ends or at the critical points inside it: cos
at k*pi (+1 for even k, -1 for odd), sin at pi/2 + k*pi (+1 for even k, -1 for odd); `extremes` evaluates
the ends in mpmath and finds the multiples of pi/2 in I with PREC-bit arithmetic (an FP32 or FP64 number
is never within 2**-100 of a multiple of pi/2 at these magnitudes). With m, M those extremes and
mx = max(|m|, |M|), every c satisfies m - w <= c <= M + w, w = ulps * ulp(mx), ulp(v) = 2**(floor(log2|v|) - 23)
(ulp grows with |v|, and |cos a| <= mx on I); an exact zero (sin 0) allows only zero. c is an FP32
number: [ceil32(m - w), floor32(M + w)]. With A != 1, A' lies within u |A| of A and t = fl32(c A') is
monotone in c for A' > 0, so t lies in [fl32(min over corners), fl32(max over corners)], each corner a
product of an end of c's interval and A (1 -+ u), computed exactly in mpmath.

The reference value is the correctly rounded A * cos(fl32(P * fl32(f))): the table a builder with
correctly rounded frequencies and cos/sin would give. The allowances: on CPU cos/sin 1 ulp (glibc's cosf,
SLEEF's u10 functions) and pow 1 ulp (rope_utils.POW_ULPS); on CUDA the CUDA C++ Programming Guide's
maximum errors, cosf/sinf 2 ulp and powf 4 ulp (CUDA_ULPS).
"""

from __future__ import annotations

import mpmath
import torch

from dsrope_reference.rope import Model
from dsrope_reference.rope_utils import PREC, YARN_KEYS, U, _to_fp32, fp32_angles, frequencies

CPU_ULPS = (1, 1)  # (cos/sin ulps, pow ulps) of the CPU's FP32 functions
CUDA_ULPS = (2, 4)  # the CUDA C++ Programming Guide: cosf, sinf 2 ulp; powf 4 ulp


def yarn_length(rope_scaling) -> int:
    """A max_seq_len past the original length: rope_utils' functions apply YaRN only there, the op whenever
    rope_scaling is given (the caller decides where)."""
    if rope_scaling is None:
        return 1
    missing = [key for key in YARN_KEYS if key not in rope_scaling]
    if missing:
        raise ValueError(f"rope_scaling: expected the keys {YARN_KEYS}, missing {missing}")
    return int(rope_scaling["original_max_position_embeddings"]) + 1


def frequency_model(rotary: int, theta: float, rope_scaling=None, pow_ulps: float = 1) -> Model:
    """FP64 [R/2]: the correctly rounded FP32 frequencies and the FP32 interval [f_lo, f_hi] of each."""
    return frequencies(rotary, yarn_length(rope_scaling), theta, rope_scaling, pow_ulps=pow_ulps)


def angle_model(positions: torch.Tensor, freqs: Model) -> Model:
    """FP64 [*positions.shape, R/2]: fl32(P * f) at the reference frequency and at both ends of the interval."""
    return Model(*(fp32_angles(positions, f) for f in (freqs.ref, freqs.lo, freqs.hi)))


def extremes(lo: mpmath.mpf, hi: mpmath.mpf):
    """((min cos, max cos), (min sin, max sin)) over the closed interval [lo, hi], in mpmath."""
    with mpmath.workprec(PREC):
        c_lo, s_lo = mpmath.cos_sin(lo)
        c_hi, s_hi = (c_lo, s_lo) if hi == lo else mpmath.cos_sin(hi)
        cos = [min(c_lo, c_hi), max(c_lo, c_hi)]
        sin = [min(s_lo, s_hi), max(s_lo, s_hi)]
        quarter = mpmath.pi / 2
        first, last = int(mpmath.ceil(lo / quarter)), int(mpmath.floor(hi / quarter))
        for k in range(first, min(last, first + 3) + 1):  # four consecutive quarters hold every extreme
            if k % 4 == 0:
                cos[1] = mpmath.mpf(1)
            elif k % 4 == 1:
                sin[1] = mpmath.mpf(1)
            elif k % 4 == 2:
                cos[0] = mpmath.mpf(-1)
            else:
                sin[0] = mpmath.mpf(-1)
        return tuple(cos), tuple(sin)


def ulp(v: mpmath.mpf) -> mpmath.mpf:
    """The FP32 spacing at v: 2**(floor(log2|v|) - 23)."""
    return mpmath.ldexp(1, mpmath.frexp(v)[1] - 24)


def evaluated(low: mpmath.mpf, high: mpmath.mpf, ulps: float) -> tuple[float, float]:
    """The FP32 values a function within `ulps` ulp of its exact value gives where that value lies in
    [low, high]: [ceil32(low - w), floor32(high + w)], w = ulps * ulp(max(|low|, |high|)); exact zero stays."""
    if low == high == 0:
        return 0.0, 0.0
    w = ulps * ulp(max(abs(low), abs(high)))
    return _to_fp32(low - w, "c"), _to_fp32(high + w, "f")


def scaled(lo: float, hi: float, factor: float) -> tuple[float, float]:
    """The values fl32(c * A') takes for FP32 c in [lo, hi] and A' within u |A| of A = factor (> 0)."""
    if factor == 1:
        return lo, hi
    a = mpmath.mpf(factor)
    ends = (a * (1 - mpmath.mpf(U)), a * (1 + mpmath.mpf(U)))
    low = min(mpmath.mpf(lo) * e for e in ends)
    high = max(mpmath.mpf(hi) * e for e in ends)
    return _to_fp32(low, "n"), _to_fp32(high, "n")


def table_model(
    positions: torch.Tensor,
    rotary: int,
    theta: float,
    rope_scaling=None,
    attention_factor: float = 1.0,
    ulps: float = 1,
    pow_ulps: float = 1,
) -> tuple[Model, Model]:
    """cos and sin models [*positions.shape, R/2] (FP64 tensors) of the contract fp32-elementwise, for
    integer positions >= 0, with the declared attention factor and the platform's allowances."""
    if not (attention_factor > 0 and attention_factor < float("inf")):
        raise ValueError(f"attention_factor: expected a positive finite number, got {attention_factor!r}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions: expected values >= 0, got {int(positions.min())}")
    angles = angle_model(positions.to("cpu"), frequency_model(rotary, theta, rope_scaling, pow_ulps))
    shape = angles.ref.shape
    refs, los, his = angles.ref.flatten().tolist(), angles.lo.flatten().tolist(), angles.hi.flatten().tolist()
    out = {"cos": ([], [], []), "sin": ([], [], [])}
    with mpmath.workprec(PREC):
        factor = mpmath.mpf(attention_factor)
        for ref, lo, hi in zip(refs, los, his, strict=True):
            bounds = dict(zip(("cos", "sin"), extremes(mpmath.mpf(lo), mpmath.mpf(hi)), strict=True))
            exact = dict(zip(("cos", "sin"), mpmath.cos_sin(mpmath.mpf(ref)), strict=True))
            for name, (values, lows, highs) in out.items():
                low, high = scaled(*evaluated(*bounds[name], ulps), attention_factor)
                values.append(_to_fp32(factor * exact[name], "n") if exact[name] else 0.0)
                lows.append(low)
                highs.append(high)
    as_tensor = lambda v: torch.tensor(v, dtype=torch.float64).reshape(shape)
    return tuple(Model(*(as_tensor(v) for v in out[name])) for name in ("cos", "sin"))
