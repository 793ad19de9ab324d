"""DeepSeek-V3 rope utilities (seed 004): YaRN inverse frequencies, rotation tables, and the two
pairings of the rope channels.

Pairings (the classic bug is mixing them up; both use the same table and the same angles):
  apply_rotary_emb             pair j = channels (2j, 2j + 1)   main MLA attention (interleaved)
  apply_rotary_emb_half_split  pair j = channels (j, j + d/2)   V3.2 DSA indexer (rotate_half)
Pair j with table entry (c, s) = (cos, sin) of angle j becomes (a*c - b*s, a*s + b*c), in FP32
with one rounding into x's dtype.

Table formats (the seed leaves them open; ours):
  complex  `freqs_cis_from_position_ids(..., for_fused_rope=False)`: complex64, one row per TOKEN,
           [B, S, d/2] (bshd) or [T, d/2] (thd); entry j = exp(i * angle_j(position of the token)).
  fused    `for_fused_rope=True`: float32 [2, P, d], one row per POSITION p = 0 .. P-1; [0] holds
           cos, [1] sin; entries j and j + d/2 of a row both hold pair j's value (the kernel reads
           the first half; the copy in the second half makes it the usual [cos, cos] table).
angle_j(p) = fl32(fl32(p) * freqs[j]): the FP32 product the published DeepSeek code computes
(another angle would be another table at large positions).

The trained bits (default): precompute_freqs_cis and freqs_cis_from_position_ids run the op
sequence of the code DeepSeek-V3 models were trained and published with (DeepSeek's reference
inference code, inference/model.py precompute_freqs_cis, and the Automodel module this package
mirrors, deepseek_v3/rope_utils.py), every op in FP32: 1.0 / (theta ** (arange(0, d, 2) / d)), the
YaRN blend freqs / factor * (1 - smooth) + freqs * smooth, and torch.polar(ones, angle), whose
real and imaginary parts are also the fused table's cos and sin. On CPU that is the upstream table
bit for bit. The frequencies are always computed on the CPU; on CUDA the angles' cos and sin are
the device's FP32 ones, so a CUDA table can differ from a CPU one in the last bit (as upstream's
code run on CUDA would too, whose frequencies could differ as well: not reproduced here).
For a golden suite these bits are the contract: a more accurate table is a different table.
fp64=True (keyword of both functions) asks for the most accurate table instead: frequencies, and
cos and sin of the same FP32 angle, evaluated in FP64 and rounded once to FP32 (within 2**-24 +
2**-40 relative of the exact values on either device). reference/rope_utils.py states and tests
the error of both.

Context parallelism (cp_size > 1): a sequence of L tokens is cut into 2*cp_size chunks of
L/(2*cp_size) tokens and rank r holds chunks r and 2*cp_size-1-r, in that order (the usual load
balance for causal attention).
"""

from __future__ import annotations

import math

import torch

from dsrope.checks import (
    check_bool,
    check_complex_table,
    check_cp,
    check_device,
    check_even_int,
    check_format,
    check_freqs,
    check_fused_table,
    check_int,
    check_position_ids,
    check_qk,
    check_real,
    check_rope_scaling,
    check_sequence_lengths,
    check_unsqueeze_dim,
    check_x,
    kernels_run_on,
)
from dsrope.rope import apply_partial_rope_unchecked

# --- frequencies ---------------------------------------------------------------------------------


def yarn_get_mscale(scale=1, mscale=1) -> float:
    """YaRN's attention scale: 0.1 * mscale * ln(scale) + 1 when scale > 1, else 1."""
    scale = check_real("scale", scale, 0.0)
    mscale = check_real("mscale", mscale, float("-inf"))
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _correction_dim(rotations: float, dim: int, theta: float, positions: int) -> float:
    """The (fractional) channel index whose frequency turns `rotations` times over `positions`."""
    return dim * math.log(positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))


def precompute_freqs_cis(
    qk_rope_head_dim: int,
    max_seq_len: int,
    rope_theta: float,
    rope_scaling: dict | None,
    *,
    fp64: bool = False,
) -> torch.Tensor:
    """FP32 inverse frequencies [qk_rope_head_dim / 2] (CPU): freqs[j] = 1 / rope_theta ** (2j / d).

    YaRN: when rope_scaling carries factor, beta_fast, beta_slow and
    original_max_position_embeddings, and max_seq_len exceeds the original length, channels
    below the beta_fast correction dim keep their frequency, channels above the beta_slow one
    are divided by factor, and a linear ramp blends the two in between. Any other rope_scaling
    (None, or lacking one of the keys) gives the plain frequencies. The attention scale
    (yarn_get_mscale) is not folded into the table.

    Default: the trained table, upstream's FP32 op sequence (module docstring), bit for bit.
    fp64=True: the same ops in FP64, rounded once to FP32 (within 2**-24 + 2**-40 relative of the
    exact value). reference/rope_utils.py bounds the error of each entry of either table;
    tests/test_rope_utils.py checks both against mpmath.
    """
    dim = check_even_int("qk_rope_head_dim", qk_rope_head_dim, 2)
    check_int("max_seq_len", max_seq_len, 1)
    theta = check_real("rope_theta", rope_theta, 1.0)
    yarn = check_rope_scaling(rope_scaling)
    dtype = torch.float64 if check_bool("fp64", fp64) else torch.float32

    # Upstream's ops in upstream's order: in FP32 each rounds (a Python number operand is rounded to
    # FP32 first), so another order, the negative power or 1 / (factor * x) is another table.
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))
    if yarn is not None and max_seq_len > yarn[3]:
        factor, beta_fast, beta_slow, original = yarn
        low = max(math.floor(_correction_dim(beta_fast, dim, theta, original)), 0)
        high = min(math.ceil(_correction_dim(beta_slow, dim, theta, original)), dim - 1)
        if low == high:
            high += 0.001  # the published ramp: never a zero-width ramp
        ramp = torch.clamp((torch.arange(dim // 2, dtype=dtype) - low) / (high - low), 0, 1)
        smooth = 1 - ramp  # 1: keep the frequency, 0: divide it by factor
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs.to(torch.float32)


def _rotations(positions: torch.Tensor, freqs: torch.Tensor, fp64: bool) -> torch.Tensor:
    """complex64 exp(i * angle) [*positions.shape, d/2] of the FP32 angles fl32(fl32(p) * freqs[j])."""
    # Upstream's einsum("bt,d->btd", p, freqs) sums nothing: it is this one FP32 product per entry. A
    # broadcast multiply, not a matmul: a matmul may run in TF32 on CUDA and truncate the angle.
    angle = positions.to(torch.float32)[..., None] * freqs
    angle = angle.to(torch.float64 if fp64 else torch.float32)
    return torch.polar(torch.ones_like(angle), angle).to(torch.complex64)


@torch.no_grad()
def freqs_cis_from_position_ids(
    position_ids: torch.Tensor,
    freqs: torch.Tensor,
    qkv_format: str = "bshd",
    for_fused_rope: bool = False,
    cp_size: int = 1,
    *,
    fp64: bool = False,
) -> torch.Tensor:
    """The rotation table for position_ids (integer [B, S] for bshd, [T] for thd), on their device.

    for_fused_rope=False: the complex format, complex64 [B, S, d/2] or [T, d/2], one row per token
      at the position it is given (any positions: packed sequences, left padding, a cp shard).
    for_fused_rope=True: the fused format, float32 [2, P, d], one row per position 0 .. P-1 with
      P = position_ids.shape[-1] * cp_size, the global length of the sequence (bshd) or packed
      batch (thd) this rank's shard belongs to. Only the shape of position_ids is used: the fused
      path of apply_rotary_emb_qk finds each token's position from its place (bshd: its index;
      thd: its offset in its cu_seqlens sequence; both through the context-parallel split).
    freqs: FP32 [d/2] from precompute_freqs_cis (moved to position_ids' device).
    Positions beyond 2**24 are rounded to FP32 before the product (upstream's FP32 angle).
    Default: the trained table, upstream's torch.polar of the FP32 angle in FP32 on position_ids'
    device; the fused table's cos and sin are the complex table's real and imaginary parts, bit
    for bit. fp64=True: cos and sin of the same FP32 angle in FP64, rounded once to FP32.
    """
    check_format("qkv_format", qkv_format)
    check_position_ids(position_ids, qkv_format)
    check_freqs(freqs)
    check_bool("for_fused_rope", for_fused_rope)
    check_int("cp_size", cp_size, 1)
    check_bool("fp64", fp64)
    freqs = freqs.to(position_ids.device)

    if for_fused_rope:
        positions = torch.arange(position_ids.shape[-1] * cp_size, device=position_ids.device)
        table = _rotations(positions, freqs, fp64)
        cos, sin = table.real, table.imag
        return torch.stack((torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)))
    return _rotations(position_ids, freqs, fp64)


# --- rotations -------------------------------------------------------------------------------------


def _runs_kernel(x: torch.Tensor, table: torch.Tensor) -> bool:
    """A cached table (no grad) on a device the Triton kernel runs on."""
    return kernels_run_on(x.device) and not table.requires_grad


def _kernel(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved rotation of all channels of x [B, S, H, d] by the kernel; cos, sin FP32 [B, S, d].

    The kernel takes [B, H, S, d] with any strides and returns token-major storage, so the
    transposes are views and the result is a contiguous [B, S, H, d]. The arguments are checked here
    (x, and the tables built from checked ones): apply_partial_rope_unchecked, the op
    dsrope::partial_rope under torch.compile, the autograd.Function or the launcher in eager.
    """
    return apply_partial_rope_unchecked(x.transpose(1, 2), cos, sin, x.shape[-1]).transpose(1, 2)


def _interleaved(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, d] rotated by the complex table [B, S, d/2], pairs (2j, 2j+1)."""
    if _runs_kernel(x, table):
        cos, sin = table.real, table.imag
        return _kernel(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    # Eager FP32 complex product: autograd reaches a trainable table. Both factors contiguous: torch's
    # CPU complex product rounds differently on its strided and vectorized paths, and the result must
    # not depend on the table's strides. stack, not view_as_real: the backward of view_as_real views
    # the upstream gradient as complex, which fails for a gradient at an odd storage offset.
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2).contiguous())
    rotated = pairs * table.contiguous()[:, :, None, :]
    return torch.stack((rotated.real, rotated.imag), -1).flatten(-2).to(x.dtype)


def _to_bshd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    return x if qkv_format == "bshd" else x.unsqueeze(0)


def apply_rotary_emb(
    x: torch.Tensor, freqs_cis: torch.Tensor, qkv_format: str = "bshd", unsqueeze_dim: int | None = None
) -> torch.Tensor:
    """Rotate adjacent channel pairs (2j, 2j+1) of x by the complex table (FP32 math, x's dtype out).

    x: [B, S, H, d] (bshd) or [T, H, d] (thd); a shared key without a head dim, [B, S, d] or
    [T, d], needs unsqueeze_dim=2 (or -2): the head dim inserted after thd gains its batch dim.
    freqs_cis: complex64 [B, S, d/2] or [T, d/2] (the complex format, one row per token).
    A table without grad on CUDA (or on CPU with TRITON_INTERPRET=1) goes through the Triton
    kernel; a trainable table (requires_grad) goes through the eager FP32 complex product, so
    autograd reaches it. Returns x's shape and dtype (contiguous).
    """
    check_format("qkv_format", qkv_format)
    check_unsqueeze_dim(unsqueeze_dim)
    if qkv_format == "bshd":
        ranks = (
            {3: "[batch, sequence, channels]"}
            if unsqueeze_dim is not None
            else {4: "[batch, sequence, heads, channels]"}
        )
    else:
        ranks = {2: "[tokens, channels]"} if unsqueeze_dim is not None else {3: "[tokens, heads, channels]"}
    check_x(x, "x", ranks, even_channels=True, device=False)
    tokens = x.shape[:2] if qkv_format == "bshd" else x.shape[:1]
    check_complex_table(freqs_cis, x, tokens, qkv_format)

    x4 = _to_bshd(x, qkv_format)
    if unsqueeze_dim is not None:
        x4 = x4.unsqueeze(2)
    return _interleaved(x4, _to_bshd(freqs_cis, qkv_format)).reshape(x.shape)


def apply_rotary_emb_half_split(x: torch.Tensor, freqs_cis: torch.Tensor, qkv_format: str = "bshd") -> torch.Tensor:
    """Rotate pairs (j, j + d/2) of x (rotate_half layout) by the complex table, FP32 math, x's dtype out.

    x: [B, S, H, d] or [B, S, d] (bshd), [T, H, d] or [T, d] (thd). freqs_cis: the same complex64
    table as apply_rotary_emb, [B, S, d/2] or [T, d/2]: pair j turns by the same angle in both
    pairings. Eager (autograd reaches x and a trainable table). Returns x's shape and dtype.
    """
    check_format("qkv_format", qkv_format)
    if qkv_format == "bshd":
        ranks = {4: "[batch, sequence, heads, channels]", 3: "[batch, sequence, channels]"}
    else:
        ranks = {3: "[tokens, heads, channels]", 2: "[tokens, channels]"}
    check_x(x, "x", ranks, even_channels=True, device=False)
    tokens = x.shape[:2] if qkv_format == "bshd" else x.shape[:1]
    check_complex_table(freqs_cis, x, tokens, qkv_format)

    has_heads = x.dim() == len(tokens) + 2
    cos, sin = freqs_cis.real, freqs_cis.imag
    if has_heads:
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    xf = x.float()
    a, b = xf[..., :half], xf[..., half:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), -1).to(x.dtype)


# --- q and k together ------------------------------------------------------------------------------


def _shard_positions(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions, inside a sequence of `length` tokens, of the tokens rank cp_rank holds, in order."""
    if cp_size == 1:
        return torch.arange(length)
    chunk = length // (2 * cp_size)
    mirror = 2 * cp_size - 1 - cp_rank
    return torch.cat(
        (
            torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
            torch.arange(mirror * chunk, (mirror + 1) * chunk),
        )
    )


def _fused_tables(freqs_cis, q: torch.Tensor, format: str, lengths: list[int], cp_size: int, cp_rank: int):
    """FP32 cos, sin [B, S, d] (thd: B = 1) for the kernel, rows picked from the fused table."""
    d = q.shape[-1]
    batch, tokens = (q.shape[0], q.shape[1]) if format == "bshd" else (1, q.shape[0])
    if cp_size == 1 and len(lengths) == 1:
        table = freqs_cis[:, :tokens]  # positions are the token indices: a view
    else:
        rows = torch.cat([_shard_positions(n, cp_size, cp_rank) for n in lengths]).to(q.device)
        table = freqs_cis.index_select(1, rows)
    return table[0][None].expand(batch, tokens, d), table[1][None].expand(batch, tokens, d)


def apply_rotary_emb_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    freqs_cis: torch.Tensor,
    format: str = "bshd",
    rope_fusion: bool = True,
    cu_seqlens: torch.Tensor | None = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved rotation of q and k ([B, S, H, d] bshd or [T, H, d] thd; k may have other heads).

    rope_fusion=True: the Triton kernel with the fused table (float32 [2, P, d] from
      freqs_cis_from_position_ids(..., for_fused_rope=True)); each token's position is its place:
      bshd its index in the sequence, thd its offset inside its sequence of cu_seqlens (positions
      restart at every sequence; without cu_seqlens the tokens are one sequence). With cp_size > 1
      the local tokens are rank cp_rank's two chunks of each sequence (module docstring), and
      cu_seqlens holds the global offsets (last = q.shape[0] * cp_size).
    rope_fusion=False: apply_rotary_emb on q and k with the complex table, one row per local
      token; the rows already carry the positions, so cu_seqlens and cp are checked, not used.
    The two give the same result when the complex rows hold the positions the fused path derives.
    cu_seqlens is read on the host (one device sync) to check it and to pick the table rows: such a
    call does not compile with fullgraph=True and cannot be captured in a CUDA graph. cp_size > 1
    compiles, but builds the row indices on the CPU and copies them over (from pageable memory: not
    capturable either). Without cu_seqlens and with cp_size = 1 nothing is read or copied on the host
    (docs/records/2026-12-03-h200-decode-and-host-time.md).
    """
    check_format("format", format)
    check_bool("rope_fusion", rope_fusion)
    check_qk(q, k, format)
    check_cp(cp_size, cp_rank)
    lengths = check_sequence_lengths(cu_seqlens, q, format, cp_size)
    if not rope_fusion:
        return apply_rotary_emb(q, freqs_cis, format), apply_rotary_emb(k, freqs_cis, format)

    check_device("q", q)
    check_fused_table(freqs_cis, q, max(lengths))
    cos, sin = _fused_tables(freqs_cis, q, format, lengths, cp_size, cp_rank)
    q4, k4 = _to_bshd(q, format), _to_bshd(k, format)
    return _kernel(q4, cos, sin).reshape(q.shape), _kernel(k4, cos, sin).reshape(k.shape)
