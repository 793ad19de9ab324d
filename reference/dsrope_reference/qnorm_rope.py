"""FP64 model of Q RMSNorm + partial interleaved RoPE, forward and backward, and the error model
of a correct FP32-arithmetic kernel.

Exact function (docs/contract.md), per row of D channels, rnd = round to nearest even into x.dtype:
  r  = 1 / sqrt(mean(x^2) + eps)                              (the kernel keeps it in FP32)
  y  = rnd(x * r)                                             boundary 1
  out: pass-through channels y; pair k: rnd(ya*c - yb*s), rnd(ya*s + yb*c)
Backward, upstream gradient g:
  g' = pair k: rnd(ga*c + gb*s), rnd(-ga*s + gb*c); other channels g    boundary 2
  dx = rnd(r * (g' - xhat * mean(g' * xhat))),  xhat = x * r

Reference values are computed in FP64 from the exact formulas and rounded correctly; the
mpmath path (`certify_*`) recomputes them at 200 bits with exact rounding decisions (ties
included) and the suite checks that both agree bit for bit on small cases. Ties cannot occur at
boundary 1: r is irrational unless mean(x^2) + eps is a dyadic square, and then x*r is exact.

Error model: u = 2**-24, gamma(n) = n*u / (1 - n*u).
  rstd: the kernel's sum of D squares in any order, the division by D (approximate division
    allowed: 2 roundings) and the +eps carry relative error theta <= gamma(D + 4), plus
    2**-125 / z absolute for squares flushed from the FP32 subnormal range; rsqrt may be
    approximate, rho <= 2**-22 (PTX rsqrt.approx.f32 is documented at 2**-22.9). Hence
    |r_k / r - 1| <= delta_r = (1 - theta)**-0.5 * (1 + rho) - 1.
  boundary 1: the kernel's x * r_k before its store is within |x r| ((1 + delta_r)(1 + u) - 1)
    of x r, so y lies in [rnd(x r - rad), rnd(x r + rad)]; where that is one value, y is exact.
  rotation: reference/rope.py's interval over the box of allowed ya, yb.
  backward: per element, a first-order-free bound B assembled term by term in `backward`
    (saved r_k, xhat_k = x r_k, products, the mean over D in any order, the final subtraction
    and product, FMA contraction anywhere: each step adds at most one FP32 rounding), and dx
    must lie in [rnd(dx - B), rnd(dx + B)].
  If the FP32 sum of squares surely overflows (sum x^2 > FLT_MAX (1 + gamma)), the kernel's
  r is 0 and y is 0; in the band where it may or may not overflow both are allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mpmath
import torch

from dsrope_reference.floats import U32, exact_sum, fmt, judge, round_down, round_nearest, round_up
from dsrope_reference.rope import (
    Model,
    interleave,
    partial_rope,
    rotation_interval,
    round_nearest_exact,
    tables,
    two_sum,
)

RSQRT_REL = 2.0**-22
TINY = 2.0**-126
FLT_MAX = float(torch.finfo(torch.float32).max)


def gamma(n: int) -> float:
    return n * U32 / (1 - n * U32)


@dataclass
class Forward:
    out: Model
    normalized: Model  # boundary-1 value y = rnd(x * r)
    rstd: Model  # FP64 exact r, [B*S*H] token-major; lo/hi: the FP32 values a kernel may save


@dataclass
class Backward:
    dx: Model
    derotated: Model  # boundary-2 value g'


def token_major_rows(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S] per-row values -> [B*S*H] in token-major row order (b*S + s)*H + h."""
    return t.transpose(1, 2).reshape(-1)


def split(t: torch.Tensor, rotary: int):
    d = t.shape[-1]
    return t[..., : d - rotary], t[..., d - rotary :: 2], t[..., d - rotary + 1 :: 2]


def join(keep, a, b):
    return torch.cat((keep, interleave(a, b)), dim=-1)


def exact_rstd(x64: torch.Tensor, eps: float):
    """r, and the bound delta_r on the kernel's relative error; r = 0 where FP32 surely overflows."""
    d = x64.shape[-1]
    squares = exact_sum(x64 * x64)
    # z and r row by row in Python floats: each operation IEEE-754 correctly rounded on every
    # machine. torch's vectorized CPU kernels for the same FP64 expression gave r 2 ulp apart on the
    # H200 host (torch 2.11) and here (torch 2.13), and the goldens must be the same bits everywhere.
    z = torch.tensor([s / d + eps for s in squares.flatten().tolist()], dtype=torch.float64).reshape(squares.shape)
    r = torch.tensor([1 / math.sqrt(v) for v in z.flatten().tolist()], dtype=torch.float64)
    r = r.reshape(z.shape)
    theta = gamma(d + 4) + 2.0**-125 / z
    delta = (1 - theta) ** -0.5 * (1 + RSQRT_REL) - 1
    overflow = squares * (1 - gamma(d)) > FLT_MAX
    maybe = ~overflow & (squares * (1 + gamma(d)) >= FLT_MAX)
    return torch.where(overflow, torch.zeros_like(r), r), delta, maybe


def normalized_interval(x64: torch.Tensor, eps: float):
    """r, delta_r, the rows whose FP32 sum of squares may overflow, x*r (FP64) and the radius around x*r
    within which a kernel's FP32 x * r_k lies before any store (subnormal results: 2**-126 more)."""
    r, delta, maybe_overflow = exact_rstd(x64, eps)
    r_ = r[..., None]
    xr = x64 * r_
    rad = xr.abs() * ((1 + delta[..., None]) * (1 + U32) - 1)
    rad = rad + torch.where((xr != 0) & (xr.abs() < TINY), TINY, 0.0)
    return r, delta, maybe_overflow, xr, rad


def or_zero(lo: torch.Tensor, hi: torch.Tensor, maybe_overflow: torch.Tensor):
    """[lo, hi] widened to hold 0 in the rows where the FP32 sum of squares may overflow (r_k = 0 there)."""
    zero = torch.zeros_like(lo)
    lo = torch.where(maybe_overflow[..., None], torch.minimum(lo, zero), lo)
    hi = torch.where(maybe_overflow[..., None], torch.maximum(hi, zero), hi)
    return lo, hi


def rstd_model(r: torch.Tensor, delta: torch.Tensor, maybe_overflow: torch.Tensor) -> Model:
    """The FP32 rstd a kernel may save: [B*S*H] token-major, r_k within delta_r of r, 0 where it may overflow."""
    r_rows = token_major_rows(r)
    rad_r = token_major_rows(r * delta)
    rstd = Model(r_rows, round_nearest(r_rows - rad_r, torch.float32), round_nearest(r_rows + rad_r, torch.float32))
    maybe = token_major_rows(maybe_overflow)
    rstd.lo = torch.where(maybe, torch.zeros_like(rstd.lo), rstd.lo)
    return rstd


def forward(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> Forward:
    dtype = x.dtype
    x64 = x.detach().to("cpu", torch.float64)
    r, delta, maybe_overflow, xr, rad = normalized_interval(x64, eps)
    y_ref = round_nearest(xr, dtype)
    y_lo, y_hi = round_nearest(xr - rad, dtype), round_nearest(xr + rad, dtype)
    # where the FP32 sum of squares may overflow, the kernel's y may also be 0
    y_lo, y_hi = or_zero(y_lo, y_hi, maybe_overflow)

    c, s = tables(cos, sin, rotary)
    keep_ref, a_ref, b_ref = split(y_ref, rotary)
    keep_lo, a_lo, b_lo = split(y_lo, rotary)
    keep_hi, a_hi, b_hi = split(y_hi, rotary)
    first = two_sum(a_ref * c, -(b_ref * s))
    second = two_sum(a_ref * s, b_ref * c)
    rot_ref = round_nearest_exact(*first, dtype), round_nearest_exact(*second, dtype)
    (lo1, hi1), (lo2, hi2) = rotation_interval(a_lo, a_hi, b_lo, b_hi, c, s, dtype)
    return Forward(
        out=Model(join(keep_ref, *rot_ref), join(keep_lo, lo1, lo2), join(keep_hi, hi1, hi2)),
        normalized=Model(y_ref, y_lo, y_hi),
        rstd=rstd_model(r, delta, maybe_overflow),
    )


def backward(x, grad, cos, sin, rotary: int, eps: float) -> Backward:
    x64 = x.detach().to("cpu", torch.float64)
    r, delta, _ = exact_rstd(x64, eps)
    derotated = partial_rope(grad.detach(), cos, sin, rotary, inverse=True)
    g = derotated.ref
    dg = torch.maximum(derotated.hi - g, g - derotated.lo)
    return Backward(dx=rmsnorm_backward(x64, r[..., None], delta[..., None], g, dg, x.dtype), derotated=derotated)


def rmsnorm_backward(x64, r, delta, g, dg, dtype: torch.dtype) -> Model:
    """The model of dx = rnd(r (g - xhat mean(g xhat))) for a kernel whose gradient into the RMSNorm
    backward is within dg of g (the bound B of the module docstring); r, delta: [..., 1]."""
    d = x64.shape[-1]
    xhat = x64 * r
    m = exact_sum(g * xhat, keepdim=True) / d
    dx = r * (g - xhat * m)

    u = U32
    e1 = (1 + delta) * (1 + u) - 1  # relative error of the kernel's xhat
    ax = xhat.abs()
    a = (g.abs() + dg) * ax * (1 + e1)
    dp = dg * ax * (1 + e1) + g.abs() * ax * e1 + u * a
    dsum = exact_sum(dp, keepdim=True) + gamma(d) * exact_sum(a * (1 + u), keepdim=True)
    dm = dsum / d + 2 * u * (m.abs() + dsum / d)
    mk = m.abs() + dm
    dq = ax * (1 + e1) * dm + ax * e1 * m.abs() + u * ax * (1 + e1) * mk
    dd = dg + dq + u * (g.abs() + dg + ax * m.abs() + dq)
    big_d = (g - xhat * m).abs() + dd
    bound = r * (delta * big_d + dd * (1 + delta)) + u * r * (1 + delta) * big_d
    live = (dx != 0) | (dd > 0)
    bound = bound + torch.where(live, 4 * TINY * (r + 1), 0.0)
    lo, hi = round_nearest(dx - bound, dtype), round_nearest(dx + bound, dtype)
    return Model(round_nearest(dx, dtype), lo, hi)


def forward_fp32_through(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> Forward:
    """The fp32-through contract: boundary 1 absent, the FP32 normalized row xhat = x * r_k goes into the
    rotation unrounded; out = rnd(r (a*c - b*s)) on the pairs, rnd(x r) on the other channels.

    xhat is an FP32 number within `rad` of x*r (the box [RD32(xr - rad), RU32(xr + rad)]); the rotation's
    interval over that box is reference/rope.py's. The reference is r (a*c - b*s) rounded once (a*c and
    b*s exact in FP64, their difference and the product by r rounded in FP64: ties cannot occur, r is
    irrational unless x*r is exact)."""
    dtype = x.dtype
    x64 = x.detach().to("cpu", torch.float64)
    r, delta, maybe_overflow, xr, rad = normalized_interval(x64, eps)
    h_lo, h_hi = or_zero(round_down(xr - rad, torch.float32), round_up(xr + rad, torch.float32), maybe_overflow)
    y_lo, y_hi = or_zero(round_nearest(xr - rad, dtype), round_nearest(xr + rad, dtype), maybe_overflow)

    c, s = tables(cos, sin, rotary)
    r_ = r[..., None]
    keep, a, b = split(x64, rotary)
    rot_ref = round_nearest(r_ * (a * c - b * s), dtype), round_nearest(r_ * (a * s + b * c), dtype)
    _, a_lo, b_lo = split(h_lo, rotary)
    _, a_hi, b_hi = split(h_hi, rotary)
    (lo1, hi1), (lo2, hi2) = rotation_interval(a_lo, a_hi, b_lo, b_hi, c, s, dtype)
    keep_ref, keep_lo, keep_hi = (split(t, rotary)[0] for t in (round_nearest(xr, dtype), y_lo, y_hi))
    return Forward(
        out=Model(join(keep_ref, *rot_ref), join(keep_lo, lo1, lo2), join(keep_hi, hi1, hi2)),
        normalized=Model(round_nearest(xr, torch.float32), h_lo, h_hi),
        rstd=rstd_model(r, delta, maybe_overflow),
    )


def backward_fp32_through(x, grad, cos, sin, rotary: int, eps: float) -> Backward:
    """The gradient of the fp32-through chain (autograd through F.rms_norm(x.float()), the FP32 rotation
    and the cast to x.dtype): the de-rotated gradient stays FP32 into the RMSNorm backward (boundary 2
    absent, the no-boundary-2 gradient), dx rounded once.

    g' is the exact de-rotation (ga*c + gb*s in FP64: exact products, one FP64 rounding of the sum); the
    kernel's FP32 g'_k lies in reference/rope.py's FP32 interval of it, so dg = its distance from g'
    there (plus 2**-52 |g'| for the FP64 rounding), and the RMSNorm backward's bound B follows."""
    x64 = x.detach().to("cpu", torch.float64)
    r, delta, _ = exact_rstd(x64, eps)
    derotated = partial_rope(grad.detach().float(), cos, sin, rotary, inverse=True)
    c, s = tables(cos, sin, rotary)
    keep, ga, gb = split(grad.detach().to("cpu", torch.float64), rotary)
    g = join(keep, ga * c + gb * s, -ga * s + gb * c)
    dg = torch.maximum(derotated.hi - g, g - derotated.lo) + 2.0**-52 * g.abs()
    return Backward(dx=rmsnorm_backward(x64, r[..., None], delta[..., None], g, dg, x.dtype), derotated=derotated)


# --- alternatives: functions peers ship, or plausible slips. The suite must reject each. --------


def forward_no_boundary1(x, cos, sin, rotary, eps) -> torch.Tensor:
    """(a) FP32 kept from the norm through the rotation: y is not rounded before rotating."""
    x64 = x.detach().to("cpu", torch.float64)
    r, _, _ = exact_rstd(x64, eps)
    xr = x64 * r[..., None]
    c, s = tables(cos, sin, rotary)
    keep, a, b = split(xr, rotary)
    return round_nearest(join(keep, a * c - b * s, a * s + b * c), x.dtype)


def backward_no_boundary2(x, grad, cos, sin, rotary, eps) -> torch.Tensor:
    """(b) RMSNorm backward on the unrounded FP32 de-rotated gradient."""
    x64 = x.detach().to("cpu", torch.float64)
    g64 = grad.detach().to("cpu", torch.float64)
    r, _, _ = exact_rstd(x64, eps)
    r = r[..., None]
    c, s = tables(cos, sin, rotary)
    keep, ga, gb = split(g64, rotary)
    g = join(keep, ga * c + gb * s, -ga * s + gb * c)
    xhat = x64 * r
    m = exact_sum(g * xhat, keepdim=True) / x.shape[-1]
    return round_nearest(r * (g - xhat * m), x.dtype)


def forward_rotate_then_normalize(x, cos, sin, rotary, eps) -> torch.Tensor:
    """(c) rotate first (rounded to x.dtype), then normalize the rotated row and round again."""
    rotated = partial_rope(x, cos, sin, rotary).ref
    r, _, _ = exact_rstd(rotated, eps)
    return round_nearest(rotated * r[..., None], x.dtype)


# --- FP64 autograd: proves the backward formula ---------------------------------------------------


def qnorm_rope_fp64(x, cos, sin, rotary, eps):
    """The exact function without roundings, in differentiable FP64 torch ops."""
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    c, s = (t[..., : rotary // 2].to(x)[:, None] for t in (cos, sin))
    keep, a, b = split(y, rotary)
    return join(keep, a * c - b * s, a * s + b * c)


class QNormRoPEFormula(torch.autograd.Function):
    """qnorm_rope_fp64 whose backward is the formula the kernel implements (without roundings)."""

    @staticmethod
    def forward(ctx, x, cos, sin, rotary, eps):
        ctx.save_for_backward(x, cos, sin)
        ctx.rotary, ctx.eps = rotary, eps
        return qnorm_rope_fp64(x, cos, sin, rotary, eps)

    @staticmethod
    def backward(ctx, g):
        x, cos, sin = ctx.saved_tensors
        rotary = ctx.rotary
        c, s = (t[..., : rotary // 2].to(x)[:, None] for t in (cos, sin))
        keep, ga, gb = split(g, rotary)
        gd = join(keep, ga * c + gb * s, -ga * s + gb * c)
        r = torch.rsqrt((x * x).mean(-1, keepdim=True) + ctx.eps)
        xhat = x * r
        return r * (gd - xhat * (gd * xhat).mean(-1, keepdim=True)), None, None, None, None


# --- mpmath certification -------------------------------------------------------------------------

PREC = 200


def mp_round(v: mpmath.mpf, dtype: torch.dtype) -> float:
    """Correct round-to-nearest-even of an mpmath value into dtype (exact decision, ties to even)."""
    f = fmt(dtype)
    if not mpmath.isfinite(v):
        return float(v)
    if v == 0:
        return 0.0
    _, e = mpmath.frexp(v)
    e = max(int(e) - 1, f.emin)
    q = mpmath.mpf(2) ** (e - f.precision + 1)
    n = v / q
    fl = mpmath.floor(n)
    frac = n - fl
    if frac > 0.5 or (frac == 0.5 and int(fl) % 2 == 1):
        fl += 1
    out = fl * q
    if abs(out) > f.max:
        return math.copysign(math.inf, float(v))
    return float(out)


def certify_forward(x, cos, sin, rotary, eps):
    """mpmath recomputation of the correctly rounded y and out, and of r (as FP64)."""
    dtype = x.dtype
    with mpmath.workprec(PREC):
        xs = x.detach().double().cpu()
        cs, ss = (t.detach().double().cpu() for t in (cos, sin))
        b_, h_, s_, d = xs.shape
        y = torch.empty_like(xs)
        out = torch.empty_like(xs)
        r_all = torch.empty(b_, h_, s_, dtype=torch.float64)
        for i in range(b_):
            for j in range(h_):
                for t in range(s_):
                    row = [mpmath.mpf(float(v)) for v in xs[i, j, t]]
                    r = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in row) / d + mpmath.mpf(eps))
                    r_all[i, j, t] = float(r)
                    yr = [mp_round(v * r, dtype) for v in row]
                    y[i, j, t] = torch.tensor(yr, dtype=torch.float64)
                    o = list(yr)
                    for k in range(rotary // 2):
                        c = mpmath.mpf(float(cs[i, t, k]))
                        sn = mpmath.mpf(float(ss[i, t, k]))
                        a, bb = mpmath.mpf(yr[d - rotary + 2 * k]), mpmath.mpf(yr[d - rotary + 2 * k + 1])
                        o[d - rotary + 2 * k] = mp_round(a * c - bb * sn, dtype)
                        o[d - rotary + 2 * k + 1] = mp_round(a * sn + bb * c, dtype)
                    out[i, j, t] = torch.tensor(o, dtype=torch.float64)
    return y, out, r_all


def certify_backward(x, grad, cos, sin, rotary, eps):
    """mpmath recomputation of the correctly rounded g' and dx."""
    dtype = x.dtype
    with mpmath.workprec(PREC):
        xs, gs = x.detach().double().cpu(), grad.detach().double().cpu()
        cs, ss = (t.detach().double().cpu() for t in (cos, sin))
        b_, h_, s_, d = xs.shape
        gd_all = torch.empty_like(xs)
        dx = torch.empty_like(xs)
        for i in range(b_):
            for j in range(h_):
                for t in range(s_):
                    row = [mpmath.mpf(float(v)) for v in xs[i, j, t]]
                    g = [mpmath.mpf(float(v)) for v in gs[i, j, t]]
                    for k in range(rotary // 2):
                        c = mpmath.mpf(float(cs[i, t, k]))
                        sn = mpmath.mpf(float(ss[i, t, k]))
                        ga, gb = g[d - rotary + 2 * k], g[d - rotary + 2 * k + 1]
                        g[d - rotary + 2 * k] = mpmath.mpf(mp_round(ga * c + gb * sn, dtype))
                        g[d - rotary + 2 * k + 1] = mpmath.mpf(mp_round(-ga * sn + gb * c, dtype))
                    r = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in row) / d + mpmath.mpf(eps))
                    xhat = [v * r for v in row]
                    m = mpmath.fsum(a * b for a, b in zip(g, xhat, strict=True)) / d
                    gd_all[i, j, t] = torch.tensor([float(v) for v in g], dtype=torch.float64)
                    rounded = [mp_round(r * (gv - xv * m), dtype) for gv, xv in zip(g, xhat, strict=True)]
                    dx[i, j, t] = torch.tensor(rounded)
    return gd_all, dx


__all__ = [
    "Backward",
    "Forward",
    "QNormRoPEFormula",
    "backward",
    "backward_no_boundary2",
    "certify_backward",
    "certify_forward",
    "forward",
    "forward_no_boundary1",
    "forward_rotate_then_normalize",
    "judge",
    "qnorm_rope_fp64",
]
