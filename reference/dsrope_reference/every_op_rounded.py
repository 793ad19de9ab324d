"""FP64 model of the every-op-rounded contract: DeepSeek's official eager q norm
`x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)` on x.dtype tensors as a GPU runs it, then the
contract's FP32 rotation (reference/rope.py); forward and backward (autograd through that chain).

Every op of the chain computes its result in FP32 from its x.dtype operands and stores it in x.dtype:
stored(v) = rnd(rnd32(v)), rnd32 round-to-nearest-even into FP32, rnd into x.dtype. stored is monotone,
so an op whose exact result lies in [lo, hi] stores a value in [stored(lo), stored(hi)], and where an
FP32 result may fall below 2**-126 a flushing GPU may store 0 instead: 0 joins the interval. The model
propagates such an interval through every stage; where the stages' inputs are single values (most
elements), the interval is the single value the chain stores. Per row of D channels, eps32 = rnd32(eps):

  q  = stored(x*x)                        exact in FP32 for bf16/fp16, one FP32 rounding for fp32
  m  = rnd(M), M the FP32 mean of q: the sum in any order, times rnd32(1/D) or divided by D; the q are
       >= 0, so |M - S/D| <= gamma(D + 2) S/D (S the exact sum; D - 1 additions, two roundings for 1/D
       and the product, or a division of up to two), plus 2**-126 (2k + 1) where k terms lie below
       2**-126 (flushed partial sums); M is inf where the FP32 sum reaches 2**128 (1 - 2**-25)
  z  = rnd(rnd32(m + eps32))              the sum exact in FP64 (TwoSum), rounded once into FP32
  rs = rnd(R), R the FP32 rsqrt of z within rho = 2**-22 of 1/sqrt(z) (CUDA's rsqrtf: 2 ulp), plus
       2**-50 for the FP64 evaluation of 1/sqrt
  y  = stored(x * rs)                     the box of y feeds reference/rope.py's rotation interval
Backward (torch's derivative formulas, the ones autograd runs through this chain): the upstream gradient
g is de-rotated in FP32 and cast to x.dtype (gy: boundary 2, the two-boundaries model's `derotated`), then
  t   = stored(gy * x)                    mul's gradient for rs, per element ...
  G   = stored(sum t)                     ... summed over the row (autograd's sum to rs's shape), in FP32 in
                                          any order: |sum - exact| <= gamma(D - 1) sum|t| + D 2**-126
  P   = stored(stored(rs*rs) * rs)        rsqrt's -0.5 * grad * result.pow(3); torch's pow by 3 multiplies
                                          base * base * base in x.dtype, each product stored; a cube in FP32
                                          stored once (within 2**-21: two roundings or powf's 4 ulp, plus
                                          2**-149 (1 + rs) in FP32's subnormals) is allowed too
  gz  = stored(stored(-0.5 * G) * P)
  gq  = stored(gz / D)                    mean's grad.expand() / D: within gamma(2) before the store
  dx2 = stored(gq * stored(2 * x))        pow's grad * (2 * x.pow(1)); 2x may overflow fp16 to inf
  dx1 = stored(gy * rs)                   mul's gradient for x
  dx  = stored(dx1 + dx2)                 autograd sums the two paths in x.dtype
The reference is the same chain with exact sums and a correctly rounded rsqrt and cube. IEEE specials
follow from FP64's own: an x.dtype square that overflows makes m, z inf and rs 0, so y is 0 (NaN where x
is infinite); in the backward rs**3 = 0 times an infinite G, or 0 times an infinite 2x, is NaN, as on the
GPU. The model assumes the FP32 partial sums of a row stay below 2**128 in magnitude (a row of |gy x| near
FP32's largest value is outside it).
"""

from __future__ import annotations

import torch

from dsrope_reference.floats import exact_sum, round_nearest
from dsrope_reference.qnorm_rope import RSQRT_REL, Backward, Forward, gamma, join, split, token_major_rows
from dsrope_reference.rope import (
    TINY,
    Model,
    exact_or_ieee,
    partial_rope,
    rotation_interval,
    round_nearest_exact,
    tables,
    two_sum,
)

F32 = torch.float32
RHO = RSQRT_REL + 2.0**-50  # the FP32 rsqrt, and the FP64 evaluation of 1/sqrt
POW_REL = 2.0**-21  # the FP32 cube: two roundings of b*b*b, or powf's 4 ulp
SUBNORMAL_STEP = 2.0**-149
OVER = 2.0**128 * (1 - 2.0**-25)  # FP32 round-to-nearest overflows to inf from here on


def stored(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What one op stores for its exact result v: the FP32 result rounded to nearest, then into dtype."""
    return round_nearest(round_nearest(v, F32), dtype)


def stored_interval(lo: torch.Tensor, hi: torch.Tensor, dtype: torch.dtype):
    """The values one op may store for an exact result in [lo, hi]: [stored(lo), stored(hi)], and 0 where
    the FP32 result may be flushed (the interval meets (0, 2**-126) or (-2**-126, 0) on one side of 0)."""
    out_lo, out_hi = stored(lo, dtype), stored(hi, dtype)
    flushable = ((lo > 0) & (lo < TINY)) | ((hi < 0) & (hi > -TINY))
    zero = torch.zeros_like(out_lo)
    return torch.where(flushable, torch.minimum(out_lo, zero), out_lo), torch.where(
        flushable, torch.maximum(out_hi, zero), out_hi
    )


def product_range(a_lo, a_hi, b_lo, b_hi):
    """[min, max] of a*b over the box (exact in FP64 for x.dtype operands; NaN where a corner is 0 * inf)."""
    corners = (a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi)
    lo, hi = corners[0], corners[0]
    for c in corners[1:]:
        lo, hi = torch.minimum(lo, c), torch.maximum(hi, c)
    return lo, hi


def fp32_sum(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """rnd32(p + q), the sum exact (TwoSum) and rounded once; IEEE's result for infinite or NaN terms."""
    hi, lo = two_sum(p, q)
    return exact_or_ieee(hi, round_nearest_exact(hi, lo, F32))


def stored_sum(p_lo, p_hi, q_lo, q_hi, dtype: torch.dtype):
    """The values stored(p + q) may take for p in [p_lo, p_hi], q in [q_lo, q_hi] (monotone in both)."""
    lo, hi = fp32_sum(p_lo, q_lo), fp32_sum(p_hi, q_hi)
    return stored_interval(lo, hi, dtype)


def fp32_mean(q_ref, q_lo, q_hi, dtype: torch.dtype):
    """m = rnd(M) for the FP32 mean M over the last dim of non-negative terms q: (ref, lo, hi), [..., 1]."""
    d = q_ref.shape[-1]
    total = exact_sum(q_ref, keepdim=True)
    total_lo, total_hi = exact_sum(q_lo, keepdim=True), exact_sum(q_hi, keepdim=True)
    small = ((q_hi > 0) & (q_hi < TINY)).sum(-1, keepdim=True)
    near_zero = (total_hi > 0) & (total_hi / d < 2 * TINY)
    slack = torch.where((small > 0) | near_zero, TINY * (2 * small + 1), 0.0)
    g = gamma(d + 2)
    inf = torch.full_like(total, float("inf"))
    m_lo = torch.clamp(total_lo / d * (1 - g) - slack, min=0)
    m_lo = torch.where(total_lo * (1 - gamma(d - 1)) >= OVER, inf, m_lo)
    m_hi = torch.where(total_hi * (1 + gamma(d - 1)) >= OVER, inf, total_hi / d * (1 + g) + slack)
    ref = torch.where(total >= OVER, inf, stored(total / d, dtype))
    return ref, round_nearest(m_lo, dtype), round_nearest(m_hi, dtype)


def fp32_row_sum(t_ref, t_lo, t_hi, dtype: torch.dtype):
    """stored(sum of t) over the last dim, the FP32 sum in any order, for t in [t_lo, t_hi]: [..., 1]."""
    d = t_ref.shape[-1]
    # infinite terms give IEEE's sum (inf, or NaN for both signs): the rounding error is the finite terms'
    largest = torch.maximum(t_lo.abs(), t_hi.abs())
    magnitude = exact_sum(torch.where(largest.isfinite(), largest, 0.0), keepdim=True)
    err = gamma(d - 1) * magnitude + torch.where(magnitude > 0, d * TINY, 0.0)
    lo = exact_sum(t_lo, keepdim=True) - err
    hi = exact_sum(t_hi, keepdim=True) + err
    return (stored(exact_sum(t_ref, keepdim=True), dtype), *stored_interval(lo, hi, dtype))


def cube(rs_ref, rs_lo, rs_hi, dtype: torch.dtype):
    """result.pow(3) of rs >= 0 (ref, lo, hi): torch's base * base * base on x.dtype values, each product
    stored (the reference); an FP32 cube stored once (two roundings, or powf's 4 ulp, and FP32's subnormal
    steps) is allowed too. Both are monotone in rs."""
    twice = lambda r: stored(stored(r * r, dtype) * r, dtype)
    once_lo = stored(torch.clamp(rs_lo**3 * (1 - POW_REL) - SUBNORMAL_STEP * (1 + rs_lo), min=0), dtype)
    once_hi = stored(rs_hi**3 * (1 + POW_REL) + SUBNORMAL_STEP * (1 + rs_hi), dtype)
    lo, hi = stored_interval(torch.minimum(once_lo, twice(rs_lo)), torch.maximum(once_hi, twice(rs_hi)), dtype)
    return twice(rs_ref), lo, hi


def norm_stages(x64: torch.Tensor, eps: float, dtype: torch.dtype) -> dict:
    """The forward's stored values, each (ref, lo, hi): "rs" [..., 1] and "y" [..., D]."""
    square = x64 * x64
    q_ref = stored(square, dtype)
    q_lo, q_hi = stored_interval(square, square, dtype)
    m = fp32_mean(q_ref, q_lo, q_hi, dtype)
    eps32 = torch.tensor(eps, dtype=torch.float64).float().double()
    z_ref, z_lo, z_hi = (round_nearest(fp32_sum(v, eps32.expand_as(v)), dtype) for v in m)
    z_lo, _ = stored_interval(z_lo, z_lo, dtype)  # a flushed z (eps below 2**-126) is 0: rs inf
    rs = (
        stored(1 / torch.sqrt(z_ref), dtype),
        *stored_interval((1 - RHO) / torch.sqrt(z_hi), (1 + RHO) / torch.sqrt(z_lo), dtype),
    )
    y = (stored(x64 * rs[0], dtype), *stored_interval(*product_range(x64, x64, rs[1], rs[2]), dtype))
    return {"rs": rs, "y": y}


def forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> Forward:
    """out: the rotation of y (reference/rope.py's interval over y's box); normalized: y; rstd: the x.dtype
    rs of each row, [B*S*H] token-major (what the chain keeps for its backward)."""
    dtype = x.dtype
    x64 = x.detach().to("cpu", torch.float64)
    stages = norm_stages(x64, eps, dtype)
    y_ref, y_lo, y_hi = stages["y"]
    c, s = tables(cos, sin, rotary)
    keep_ref, a_ref, b_ref = split(y_ref, rotary)
    keep_lo, a_lo, b_lo = split(y_lo, rotary)
    keep_hi, a_hi, b_hi = split(y_hi, rotary)
    first = two_sum(a_ref * c, -(b_ref * s))
    second = two_sum(a_ref * s, b_ref * c)
    rot_ref = (
        exact_or_ieee(first[0], round_nearest_exact(*first, dtype)),
        exact_or_ieee(second[0], round_nearest_exact(*second, dtype)),
    )
    (lo1, hi1), (lo2, hi2) = rotation_interval(a_lo, a_hi, b_lo, b_hi, c, s, dtype)
    rs = Model(*(token_major_rows(t[..., 0]) for t in stages["rs"]))
    return Forward(
        out=Model(join(keep_ref, *rot_ref), join(keep_lo, lo1, lo2), join(keep_hi, hi1, hi2)),
        normalized=Model(y_ref, y_lo, y_hi),
        rstd=rs,
    )


def backward(x, grad, cos, sin, rotary: int, eps: float) -> Backward:
    """dx of autograd through the chain (module docstring), stage by stage; derotated: gy."""
    dtype = x.dtype
    d = x.shape[-1]
    x64 = x.detach().to("cpu", torch.float64)
    rs_ref, rs_lo, rs_hi = norm_stages(x64, eps, dtype)["rs"]
    derotated = partial_rope(grad.detach(), cos, sin, rotary, inverse=True)
    gy_ref, gy_lo, gy_hi = derotated.ref, derotated.lo, derotated.hi

    t = stored(gy_ref * x64, dtype), *stored_interval(*product_range(gy_lo, gy_hi, x64, x64), dtype)
    g_ref, g_lo, g_hi = fp32_row_sum(*t, dtype)
    p_ref, p_lo, p_hi = cube(rs_ref, rs_lo, rs_hi, dtype)
    h_ref, (h_lo, h_hi) = stored(-0.5 * g_ref, dtype), stored_interval(-0.5 * g_hi, -0.5 * g_lo, dtype)
    gz_ref = stored(h_ref * p_ref, dtype)
    gz_lo, gz_hi = stored_interval(*product_range(h_lo, h_hi, p_lo, p_hi), dtype)
    q_lo, q_hi = gz_lo / d, gz_hi / d
    gq_ref = stored(gz_ref / d, dtype)
    widen = lambda q: torch.where(q.isfinite(), gamma(2) * q.abs(), 0.0)  # noqa: E731 (an infinite q stays)
    gq_lo, gq_hi = stored_interval(q_lo - widen(q_lo), q_hi + widen(q_hi), dtype)
    two_x = stored(2 * x64, dtype)
    dx2_ref = stored(gq_ref * two_x, dtype)
    dx2_lo, dx2_hi = stored_interval(*product_range(gq_lo, gq_hi, two_x, two_x), dtype)
    dx1_ref = stored(gy_ref * rs_ref, dtype)
    dx1_lo, dx1_hi = stored_interval(*product_range(gy_lo, gy_hi, rs_lo, rs_hi), dtype)
    dx_ref = round_nearest(fp32_sum(dx1_ref, dx2_ref), dtype)
    dx_lo, dx_hi = stored_sum(dx1_lo, dx1_hi, dx2_lo, dx2_hi, dtype)
    return Backward(dx=Model(dx_ref, dx_lo, dx_hi), derotated=derotated)
