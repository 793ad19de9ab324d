"""Oracle for the DeepSeek-V3 rope utilities: mpmath tables, FP64 rotations for both pairings.

Tables (mpmath, PREC bits, then compared to the FP32 tables):
  inverse frequencies  f_j = theta ** (-2j / d); YaRN (when rope_scaling carries factor,
    beta_fast, beta_slow, original_max_position_embeddings and max_seq_len > original):
    correction dim  cd(r) = d * ln(original / (2 pi r)) / (2 ln theta),
    low = max(floor(cd(beta_fast)), 0), high = min(ceil(cd(beta_slow)), d - 1) (high + 0.001 if equal),
    ramp_j = clamp((j - low) / (high - low), 0, 1),  f_j <- f_j / factor * ramp_j + f_j * (1 - ramp_j).
  rotation table  angle = fl32(fl32(p) * f_j) (the FP32 product: part of the definition, reproduced
    exactly here), entry = (cos angle, sin angle) evaluated in mpmath.
Error model of a table entry (FP32 output t, exact value v): |t - v| <= TABLE_REL * |v|, with
TABLE_REL = 2**-24 + 2**-40: one rounding to FP32 (at most 2**-24 relative, the unit roundoff) of
a value computed with FP64-level accuracy (pow, log, cos in FP64 are within a few 2**-53 relative,
far below the 2**-40 allowed). An FP32 pow or cos (errors of several FP32 ulps) falls outside it.

Rotations (x's dtype, exact inputs, one rounding; reference/rope.py's per-element model: an FP32
computation of a*c - b*s in any order, with or without FMA):
  interleaved  pair j = channels (2j, 2j + 1)
  half_split   pair j = channels (j, j + d/2)
Both take x [*tokens, d] or [*tokens, heads, d] and the complex table [*tokens, d/2]: the leading
dims of x are the table's rows, a head dim (if any) shares its token's row.
"""

from __future__ import annotations

import mpmath
import torch
from mpmath import libmp

from reference.floats import round_down, round_nearest, round_up
from reference.qnorm_rope import gamma
from reference.rope import Model, interleave, rotate_pairs

PREC = 128
TABLE_REL = 2.0**-24 + 2.0**-40
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


def table_model(exact: list, shape) -> Model:
    """Correctly rounded FP32 values and the FP32 interval |t - v| <= TABLE_REL |v|, as FP64 tensors."""
    with mpmath.workprec(PREC):
        rel = mpmath.mpf(TABLE_REL)
        ref = [_to_fp32(v, "n") for v in exact]
        lo = [_to_fp32(v - rel * abs(v), "c") for v in exact]
        hi = [_to_fp32(v + rel * abs(v), "f") for v in exact]
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64).reshape(shape)
    return Model(as_tensor(ref), as_tensor(lo), as_tensor(hi))


def frequencies(dim: int, max_seq_len: int, theta: float, rope_scaling=None) -> Model:
    return table_model(inverse_frequencies(dim, max_seq_len, theta, rope_scaling), (dim // 2,))


def fp32_angles(positions: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """fl32(fl32(p) * f) exactly, as FP64: the product of two FP32 numbers is exact in FP64."""
    p = round_nearest(positions.to("cpu", torch.float64), torch.float32)
    return round_nearest(p[..., None] * freqs.to("cpu", torch.float64), torch.float32)


def rotation_table(positions: torch.Tensor, freqs: torch.Tensor) -> tuple[Model, Model]:
    """cos and sin models [*positions.shape, d/2] of the FP32 angles."""
    angles = fp32_angles(positions, freqs)
    with mpmath.workprec(PREC):
        exact = [mpmath.mpf(a) for a in angles.flatten().tolist()]
        cos = [mpmath.cos(a) for a in exact]
        sin = [mpmath.sin(a) for a in exact]
    return table_model(cos, angles.shape), table_model(sin, angles.shape)


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
