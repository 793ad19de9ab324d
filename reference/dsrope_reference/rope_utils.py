"""Oracle for the DeepSeek-V3 rope utilities: mpmath tables and their error models, upstream's FP32
table transcribed, FP64 rotations for both pairings.

Tables (mpmath, PREC bits, then compared to the FP32 tables):
  inverse frequencies  f_j = theta ** (-2j / d); YaRN (when rope_scaling carries factor,
    beta_fast, beta_slow, original_max_position_embeddings and max_seq_len > original):
    correction dim  cd(r) = d * ln(original / (2 pi r)) / (2 ln theta),
    low = max(floor(cd(beta_fast)), 0), high = min(ceil(cd(beta_slow)), d - 1) (high + 0.001 if equal),
    ramp_j = clamp((j - low) / (high - low), 0, 1),  f_j <- f_j / factor * ramp_j + f_j * (1 - ramp_j).
  rotation table  angle = fl32(fl32(p) * f_j) (the FP32 product: part of the definition, reproduced
    exactly here), entry = (cos angle, sin angle) evaluated in mpmath.

Two tables, two error models (u = 2**-24, the unit roundoff of FP32):
- The trained table (dsrope's default): upstream's op sequence in FP32 (`upstream_frequencies` and
  `upstream_table` below transcribe it). Inverse frequencies: each entry within its own relative
  bound from `fp32_frequency_bounds` (derivation there: pow within 1 ulp, each IEEE op one
  rounding, the YaRN ramp's rounding amplified where the blend is small). Measured on CPU (torch
  2.13): DeepSeek-V3 (d 64, theta 1e4, YaRN factor 40, beta 32/1, original 4096) max relative
  error 2.13 u (pair 19, inside the ramp; bound there 6.9 u, at most 7.0 u over the table); plain
  theta 1e4, d 64: 1.17 u; plain theta 1e6, d 128: 1.38 u (bound 3.0 u for every plain entry with
  d a power of two: pow's 1 ulp and the reciprocal's rounding).
  cos and sin: torch.polar in FP32 of the exact FP32 angle, i.e. the C library's cosf and sinf:
  within `ulps` units in the last place of the exact value (CPU, glibc: 1, its documented bound;
  CUDA's cosf/sinf: 2, the CUDA programming guide's). The argument is an exact float, so this
  relative statement holds near the zeros of cos too (no float is a zero of cos, and both
  libraries reduce the argument exactly); since |v| <= 1 it gives the absolute bound
  |t - v| <= ulps * 2**-24 that a rotation sees. Measured on the whole DeepSeek-V3 table (163840
  positions x 32 pairs, CPU): max 0.5604 ulp for cos and for sin (0.547 * 2**-24 absolute);
  98.8% of the cos and 98.6% of the sin entries correctly rounded.
- fp64=True: computed in FP64, rounded once: |t - v| <= TABLE_REL * |v| with
  TABLE_REL = 2**-24 + 2**-40: one rounding to FP32 of a value with FP64-level accuracy (pow, log,
  cos in FP64 are within a few 2**-53 relative, far below the 2**-40 allowed). The trained table
  falls outside it (its pow and cosf err by up to about 0.56 FP32 ulp).

Rotations (x's dtype, exact inputs, one rounding; reference/rope.py's per-element model: an FP32
computation of a*c - b*s in any order, with or without FMA):
  interleaved  pair j = channels (2j, 2j + 1)
  half_split   pair j = channels (j, j + d/2)
Both take x [*tokens, d] or [*tokens, heads, d] and the complex table [*tokens, d/2]: the leading
dims of x are the table's rows, a head dim (if any) shares its token's row.
"""

from __future__ import annotations

import math

import mpmath
import torch
from mpmath import libmp

from dsrope_reference.floats import round_down, round_nearest, round_up
from dsrope_reference.qnorm_rope import gamma
from dsrope_reference.rope import Model, interleave, rotate_pairs

PREC = 128
TABLE_REL = 2.0**-24 + 2.0**-40
U = 2.0**-24  # unit roundoff of FP32
POW_ULPS = 1  # torch's FP32 pow on CPU: SLEEF's powf_u10 (vectorized) or the C library's powf, each <= 1 ulp
YARN_KEYS = ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings")
PAIRINGS = ("interleaved", "half_split")


# --- tables in mpmath ---------------------------------------------------------------------------


def yarn_mscale(scale, mscale) -> mpmath.mpf:
    with mpmath.workprec(PREC):
        if scale <= 1:
            return mpmath.mpf(1)
        return mpmath.mpf(mscale) * mpmath.log(scale) / 10 + 1


def yarn_applies(max_seq_len: int, rope_scaling) -> bool:
    if rope_scaling is None or not all(key in rope_scaling for key in YARN_KEYS):
        return False
    return max_seq_len > rope_scaling["original_max_position_embeddings"]


def inverse_frequencies(dim: int, max_seq_len: int, theta: float, rope_scaling=None) -> list:
    """Exact (PREC-bit) inverse frequencies, YaRN-corrected when it applies."""
    with mpmath.workprec(PREC):
        theta = mpmath.mpf(theta)
        freqs = [theta ** (-mpmath.mpf(2 * j) / dim) for j in range(dim // 2)]
        if not yarn_applies(max_seq_len, rope_scaling):
            return freqs
        low, high = yarn_ramp_bounds(dim, theta, rope_scaling)
        factor = mpmath.mpf(rope_scaling["factor"])
        out = []
        for j, f in enumerate(freqs):
            ramp = min(max((j - low) / (high - low), mpmath.mpf(0)), mpmath.mpf(1))
            out.append(f / factor * ramp + f * (1 - ramp))
        return out


def yarn_ramp_bounds(dim: int, theta, rope_scaling):
    """(low, high) of the YaRN ramp, in mpmath."""
    with mpmath.workprec(PREC):
        theta = mpmath.mpf(theta)
        original = rope_scaling["original_max_position_embeddings"]

        def correction_dim(rotations):
            return dim * mpmath.log(original / (rotations * 2 * mpmath.pi)) / (2 * mpmath.log(theta))

        low = max(int(mpmath.floor(correction_dim(mpmath.mpf(rope_scaling["beta_fast"])))), 0)
        high = min(int(mpmath.ceil(correction_dim(mpmath.mpf(rope_scaling["beta_slow"])))), dim - 1)
        if low == high:
            return mpmath.mpf(low), high + mpmath.mpf("0.001")
        return mpmath.mpf(low), mpmath.mpf(high)


def _to_fp32(v: mpmath.mpf, rounding: str) -> float:
    """v rounded into FP32 ('n' nearest-even, 'f' down, 'c' up); v is zero or an FP32 normal."""
    assert v == 0 or abs(v) >= 2**-126, v
    return float(mpmath.mpf(libmp.mpf_pos(v._mpf_, 24, rounding)))


def _model(ref: list, lo: list, hi: list, shape) -> Model:
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64).reshape(shape)
    return Model(as_tensor(ref), as_tensor(lo), as_tensor(hi))


def table_model(exact: list, shape, rel=TABLE_REL) -> Model:
    """Correctly rounded FP32 values and the FP32 interval |t - v| <= rel |v| (rel: one number, or a
    list with one per entry), as FP64 tensors."""
    rels = rel if isinstance(rel, list) else [rel] * len(exact)
    with mpmath.workprec(PREC):
        ref = [_to_fp32(v, "n") for v in exact]
        lo = [_to_fp32(v - mpmath.mpf(r) * abs(v), "c") for v, r in zip(exact, rels, strict=True)]
        hi = [_to_fp32(v + mpmath.mpf(r) * abs(v), "f") for v, r in zip(exact, rels, strict=True)]
    return _model(ref, lo, hi, shape)


def ulp_model(exact: list, shape, ulps: float) -> Model:
    """Correctly rounded FP32 values and the FP32 interval |t - v| <= ulps * ulp(v), ulp(v) the FP32
    spacing at v, 2**(floor(log2|v|) - 23); an exact zero allows only zero."""
    with mpmath.workprec(PREC):
        ref = [_to_fp32(v, "n") for v in exact]
        reach = [ulps * mpmath.ldexp(1, mpmath.frexp(v)[1] - 24) if v else mpmath.mpf(0) for v in exact]
        lo = [_to_fp32(v - r, "c") for v, r in zip(exact, reach, strict=True)]
        hi = [_to_fp32(v + r, "f") for v, r in zip(exact, reach, strict=True)]
    return _model(ref, lo, hi, shape)


def frequencies(
    dim: int, max_seq_len: int, theta: float, rope_scaling=None, fp64: bool = False, pow_ulps: float = POW_ULPS
) -> Model:
    """Model of the FP32 inverse frequencies: the trained table's per-entry bounds (pow within `pow_ulps`
    ulp), or TABLE_REL (fp64)."""
    exact = inverse_frequencies(dim, max_seq_len, theta, rope_scaling)
    rel = TABLE_REL if fp64 else fp32_frequency_bounds(dim, max_seq_len, theta, rope_scaling, pow_ulps)
    return table_model(exact, (dim // 2,), rel)


def fp32_frequency_bounds(
    dim: int, max_seq_len: int, theta: float, rope_scaling=None, pow_ulps: float = POW_ULPS
) -> list:
    """Relative error bound of each entry of the trained (FP32) inverse frequencies vs the exact f_j.

    Only pow is approximate; +, -, *, / are IEEE operations, each correctly rounded, so where their
    operands are known exactly (the exponents, the YaRN ramp) their FP32 results are computed here.
    Plain: e' = fl(2j / d) (exact when d is a power of two) and theta' = fl(theta) make
    theta'^-e' = f / (1 + rho) with rho computed here; p = pow(theta', e') within pow_ulps ulp (2u
    relative each; POW_ULPS on CPU) and f' = fl(1 / p) give
    |f' / f - 1| <= r1 = (1 + u) / ((1 - |rho|)(1 - 2u pow_ulps)) - 1.
    YaRN: the FP32 ramp r = clamp(fl((j - low) / w)) (w: the FP32 width, from upstream's Python
    (high + 0.001) - low where the ramp has zero width), smooth = fl(1 - r) and a = fl(1 - smooth)
    are computed exactly. The blend fl(fl(fl(f' / F') a) + fl(f' smooth)) is a sum of nonnegative
    terms, each within (1 + r1)(1 + phi)(1 + u)(1 + u) - 1 resp. (1 + r1)(1 + u) - 1 of its exact
    value (phi: F' = fl(factor) vs factor; a product by 0 or 1 is exact, a term times 0 absent),
    plus u for the sum of two terms: r_b of V = f (a / F + smooth). V differs from the exact
    f (R / F + 1 - R) by s = |a / F + smooth - (R / F + 1 - R)| / (R / F + 1 - R) relative: the FP32
    ramp's rounding, amplified where the blend is small (R near 1, a large factor).
    Bound: (1 + r_b)(1 + s) - 1.
    """
    with mpmath.workprec(PREC):
        u = mpmath.mpf(U)
        fl = lambda v: mpmath.mpf(_to_fp32(mpmath.mpf(v), "n"))
        theta_32 = fl(theta)
        plain = []
        for j in range(dim // 2):
            e = mpmath.mpf(2 * j) / dim
            rho = abs(theta_32 ** fl(e) / mpmath.mpf(theta) ** e - 1)
            plain.append((1 + u) / ((1 - rho) * (1 - 2 * u * pow_ulps)) - 1)
        if not yarn_applies(max_seq_len, rope_scaling):
            return plain
        low, high = yarn_ramp_bounds(dim, theta, rope_scaling)
        zero_width = high != int(high)
        width_32 = fl(float(low) + 0.001 - float(low) if zero_width else high - low)
        factor = mpmath.mpf(rope_scaling["factor"])
        phi = abs(factor / fl(factor) - 1)
        clamp = lambda v: min(max(v, mpmath.mpf(0)), mpmath.mpf(1))
        out = []
        for j, r1 in enumerate(plain):
            exact_ramp = clamp((j - low) / (high - low))
            ramp = clamp(fl((j - low) / width_32))
            smooth = fl(1 - ramp)
            a = fl(1 - smooth)
            rounds = lambda w: u if 0 < w < 1 else 0  # a product by 0 or 1 is exact
            terms = [(1 + r1) * (1 + phi) * (1 + u) * (1 + rounds(a))] if a else []
            terms += [(1 + r1) * (1 + rounds(smooth))] if smooth else []
            r_b = max(terms) * (1 + (u if len(terms) == 2 else 0)) - 1
            exact = exact_ramp / factor + 1 - exact_ramp
            s = abs(a / factor + smooth - exact) / exact
            out.append((1 + r_b) * (1 + s) - 1)
        return out


def fp32_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """fl32(fl32(p) * f) exactly, as FP64: the product of two FP32 numbers is exact in FP64."""
    p = round_nearest(positions.to("cpu", torch.float64), torch.float32)
    return round_nearest(p[..., None] * freqs.to("cpu", torch.float64), torch.float32)


def rotation_table(positions: torch.Tensor, freqs: torch.Tensor, ulps: float | None = None) -> tuple[Model, Model]:
    """cos and sin models [*positions.shape, d/2] of the FP32 angles: the trained table's (cosf and sinf
    within `ulps` ulp), or, with ulps None, the fp64 table's (TABLE_REL)."""
    angles = fp32_angles(positions, freqs)
    with mpmath.workprec(PREC):
        exact = [mpmath.mpf(a) for a in angles.flatten().tolist()]
        cos = [mpmath.cos(a) for a in exact]
        sin = [mpmath.sin(a) for a in exact]
    if ulps is None:
        return table_model(cos, angles.shape), table_model(sin, angles.shape)
    return ulp_model(cos, angles.shape, ulps), ulp_model(sin, angles.shape, ulps)


# --- the trained table: upstream's FP32 op sequence, transcribed -----------------------------------
# From DeepSeek's reference inference code (deepseek-ai/DeepSeek-V3, inference/model.py,
# precompute_freqs_cis) and NVIDIA NeMo Automodel (nemo_automodel/components/models/deepseek_v3/
# rope_utils.py: precompute_freqs_cis, freqs_cis_from_position_ids), the code DeepSeek-V3 models were
# trained and published with: the same ops in the same order on the same dtypes (FP32 tensors,
# Python number operands), so that dsrope's default table is held to it bit for bit.


def upstream_frequencies(dim: int, max_seq_len: int, theta, rope_scaling=None) -> torch.Tensor:
    """FP32 [d/2]: upstream precompute_freqs_cis's frequencies, before the outer product."""

    def correction_dim(rotations):
        original = rope_scaling["original_max_position_embeddings"]
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if yarn_applies(max_seq_len, rope_scaling):
        low = max(math.floor(correction_dim(rope_scaling["beta_fast"])), 0)
        high = min(math.ceil(correction_dim(rope_scaling["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / rope_scaling["factor"] * (1 - smooth) + freqs * smooth
    return freqs


def upstream_mscale(scale: float, mscale: float) -> float:
    """Upstream yarn_get_mscale (DeepSeek-V3's modeling code), its Python-float (FP64) op order."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def upstream_table(position_ids: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """complex64 [B, T, d/2]: Automodel's freqs_cis_from_position_ids (complex format) for integer
    position_ids [B, T], on their device (DeepSeek's torch.outer(arange(seqlen), freqs) is its B = 1)."""
    angles = torch.einsum("bt,d->btd", position_ids.to(dtype=torch.float32), freqs.to(position_ids.device))
    return torch.polar(torch.ones_like(angles), angles)


# --- rotations in FP64 ----------------------------------------------------------------------------


def token_tables(freqs_cis: torch.Tensor, x: torch.Tensor):
    """FP64 cos, sin of the complex table, shaped to broadcast against x's pairs [..., d/2]."""
    rows = freqs_cis.dim() - 1
    assert tuple(x.shape[:rows]) == tuple(freqs_cis.shape[:-1]), (x.shape, freqs_cis.shape)
    assert x.shape[-1] == 2 * freqs_cis.shape[-1], (x.shape, freqs_cis.shape)
    assert x.dim() - rows in (1, 2), (x.shape, freqs_cis.shape)
    shape = (*freqs_cis.shape[:-1], *(1,) * (x.dim() - rows - 1), freqs_cis.shape[-1])
    t = freqs_cis.detach().to("cpu", torch.complex128)
    return t.real.reshape(shape), t.imag.reshape(shape)


def split_pairs(v: torch.Tensor, pairing: str):
    """The two channels of every pair: (2j, 2j+1) interleaved, (j, j + d/2) half-split."""
    if pairing == "interleaved":
        return v[..., 0::2], v[..., 1::2]
    assert pairing == "half_split", pairing
    half = v.shape[-1] // 2
    return v[..., :half], v[..., half:]


def join_pairs(first: torch.Tensor, second: torch.Tensor, pairing: str) -> torch.Tensor:
    return interleave(first, second) if pairing == "interleaved" else torch.cat((first, second), -1)


def rotation(x: torch.Tensor, freqs_cis: torch.Tensor, pairing: str) -> Model:
    """Model of rotating x by the complex table with `pairing`; output in x.dtype."""
    c, s = token_tables(freqs_cis, x)
    a, b = split_pairs(x.detach().to("cpu", torch.float64), pairing)
    (ref_a, ref_b), ((lo_a, hi_a), (lo_b, hi_b)) = rotate_pairs(a, b, c, s, x.dtype)
    return Model(join_pairs(ref_a, ref_b, pairing), join_pairs(lo_a, lo_b, pairing), join_pairs(hi_a, hi_b, pairing))


def interleaved(x: torch.Tensor, freqs_cis: torch.Tensor) -> Model:
    return rotation(x, freqs_cis, "interleaved")


def half_split(x: torch.Tensor, freqs_cis: torch.Tensor) -> Model:
    return rotation(x, freqs_cis, "half_split")


def rotate_fp64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairing: str) -> torch.Tensor:
    """The exact rotation in FP64, differentiable (real arithmetic, no complex numbers)."""
    a, b = split_pairs(x, pairing)
    return join_pairs(a * cos - b * sin, a * sin + b * cos, pairing)


def table_gradient(x: torch.Tensor, grad: torch.Tensor, freqs_cis: torch.Tensor, pairing: str):
    """Gradient of sum(grad * rotation(x)) w.r.t. the table's cos and sin (its real and imaginary
    parts), by FP64 autograd, and the FP32 interval for each.

    Each entry is a sum over the n = 2 * heads products that share the table entry (d/dc: a*g1 and
    b*g2; d/ds: -b*g1 and a*g2). Computed in FP32 in any order (complex products, then a sum over
    the heads) its error is at most gamma(n + 2) * sum |products|.
    """
    x64 = x.detach().to("cpu", torch.float64)
    g64 = grad.detach().to("cpu", torch.float64)
    c, s = token_tables(freqs_cis, x)
    c, s = c.clone().requires_grad_(), s.clone().requires_grad_()
    dc, ds = torch.autograd.grad(rotate_fp64(x64, c, s, pairing), (c, s), g64)
    a, b = split_pairs(x64.abs(), pairing)
    g1, g2 = split_pairs(g64.abs(), pairing)
    heads = x.numel() // (2 * freqs_cis.numel()) if freqs_cis.numel() else 1
    err = gamma(2 * heads + 2)
    shape = freqs_cis.shape

    def model(ref, magnitude):
        ref = ref.reshape(shape)
        bound = err * magnitude.sum_to_size(c.shape).reshape(shape)
        return Model(ref, round_up(ref - bound, torch.float32), round_down(ref + bound, torch.float32))

    return model(dc, a * g1 + b * g2), model(ds, b * g1 + a * g2)


# --- positions of context-parallel shards ------------------------------------------------------------


def shard_positions(lengths: list[int], cp_size: int, cp_rank: int) -> torch.Tensor:
    """Position inside its sequence of every token rank cp_rank holds, in the local order.

    Each sequence (global lengths) is cut into 2 * cp_size equal chunks; the rank holds chunk
    cp_rank then chunk 2 * cp_size - 1 - cp_rank; the packed batch keeps the sequence order.
    """
    pieces = []
    for n in lengths:
        if cp_size == 1:
            pieces.append(torch.arange(n))
            continue
        chunks = torch.arange(n).reshape(2 * cp_size, n // (2 * cp_size))
        pieces += [chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
