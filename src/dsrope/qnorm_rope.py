"""Q RMSNorm + partial interleaved RoPE (DeepSeek-V4) in token-major storage, with its backward.

The two bf16 rounding boundaries are intentional; they reproduce the unfused eager chain
(`F.rms_norm`, then an FP32 rotation cast back to x.dtype) that models were trained with:
  1. forward: the normalized row y = x * rstd is rounded to x.dtype BEFORE it is rotated;
  2. backward: the upstream gradient is de-rotated and rounded to x.dtype BEFORE the RMSNorm
     backward.
Keeping FP32 across either boundary computes a different function (docs/contract.md).

Rows are walked in token-major order, row = (b*S + s)*H + h; `rstd` is saved in that order.
Each row is one contiguous tile of channels (masked, so D and R/2 need not be powers of two and D may
be odd). A rotary lane needs its pair partner and its table entry; both kernels take the partner from
the neighbouring lane in registers (swap_pairs) and the table entry from one load per pair
(pair_table). The forward rotates on a tile of the R rotary channels alone, loaded a second time
(docs/records/2026-12-05-h100-decode-tuning.md); the backward, which moves three tensors, on the row's tile
(docs/records/2026-12-02-h200-benchmark.md: backward 0.92 -> 1.04 of copy bandwidth on the H200).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsrope.checks import check_eps, check_rotary, check_table, check_x, wants_autograd
from dsrope.interpreter import INTERPRET
from dsrope.pair_rotation import UNFUSED, negated, pair_table, rotate_lane, swap_pairs
from dsrope.tiles import next_pow2, tile_config, token_major_empty


@triton.jit
def _rows(row, rows, S, H: tl.constexpr):
    """Whether each token-major row exists, and its (b, h, s)."""
    token = row // H
    return row < rows, token // S, row % H, token % S


@triton.jit
def _row_tile(row, rows, S, H: tl.constexpr, D: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    """Coordinates of M token-major rows and the lanes of their channel tile.

    Lane l holds channel c = l - SHIFT, SHIFT = (D - R) % 2: every rotary pair then sits on the
    aligned lanes (2i, 2i+1) (what the backward's swap_pairs and pair_table need; the second
    channel of a pair is on an odd lane). D itself may be odd (SHIFT = 1); the tile still fits:
    D - R odd means D odd and >= 3, so BLOCK = next_pow2(D) >= D + 1.
    """
    shift = (D - R) % 2  # constexpr
    row_ok, b, h, s = _rows(row, rows, S, H)
    lane = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    c = lane - shift
    valid = row_ok[:, None] & (c >= 0) & (c < D)
    rot = valid & (c >= D - R)
    second = (lane & 1) == 1
    return b, h, s, c, row_ok, valid, rot, second, (D - R + shift) // 2


# The kernels' arguments are grouped as the seed groups them (pointers, sizes, the strides of each
# tensor, constexprs); `fmt: skip` keeps ruff format from putting each on its own line.
@triton.jit
def _qnorm_rope(
    x, cos, sin, out, rstd, rows, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    EPS: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr, RBLOCK: tl.constexpr, CHUNK: tl.constexpr,
    STORE_RSTD: tl.constexpr,
):  # fmt: skip
    """Normalize and rotate M rows per program into token-major `out` [B, S, H, D].

    The row's sum of squares on its [M, BLOCK // CHUNK, CHUNK] tile: lane g * CHUNK + k of a row (channel
    lane - SHIFT, as _row_tile) at [row, g, k]. With rows on the first axis the compiler gives each warp
    whole rows, at any number of warps, and each thread the lanes it holds at one warp; CHUNK is one pass
    of a warp over the row (32 threads x one 16-byte vector), so a row's sum is the same additions in the
    same order at every rows-per-program and warps (tests/test_gpu.py::test_qnorm_rows_on_warps_keep_the_bits).
    The leading D - R channels stored from that tile, the R rotary channels on an [M, RBLOCK] tile of
    their own (loaded again: the same cache lines), rotated as partial RoPE rotates them (partner from
    registers, one table load per pair, rotate_lane). The rotation's arithmetic on the rotary tile only:
    on the whole row's tile every lane paid its partner and table addressing (docs/records/*-tuning.md,
    "QNorm forward").
    """
    # int64 from the start: row * D and b * XB pass 2**31 on large tensors.
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    row_ok, b, h, s = _rows(row, rows, S, H)
    x_row = x + (b * XB + h * XH + s * XS)[:, None]
    out_row = out + (row * D)[:, None]
    chunk = tl.arange(0, BLOCK // CHUNK).to(tl.int64)[None, :, None] * CHUNK
    c = chunk + tl.arange(0, CHUNK).to(tl.int64)[None, None, :] - (D - R) % 2
    valid = row_ok[:, None, None] & (c >= 0) & (c < D)
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    v = tl.load(x_row[:, :, None] + c * XD, mask=valid).to(tl.float32)
    # the rotary channels on a tile of their own, pair k = lanes (2k, 2k+1), and their table entries:
    # loaded before the row sum, so that their latency overlaps the reduction's (decode)
    j = tl.arange(0, RBLOCK).to(tl.int64)[None, :]
    in_slice = row_ok[:, None] & (j < R)
    rotary_channel = j + (D - R)
    own = tl.load(x_row + rotary_channel * XD, mask=in_slice).to(tl.float32)
    cs = pair_table(cos, b * CB + s * CS, CD, row_ok, 0, R // 2, M, RBLOCK)
    sn = pair_table(sin, b * SB + s * SS, SD, row_ok, 0, R // 2, M, RBLOCK)

    r = tl.rsqrt(tl.sum(tl.reshape(v * v, (M, BLOCK)), axis=1) / D + EPS)
    if STORE_RSTD:  # for the backward only: its store's layout change is a barrier on the decode path
        tl.store(rstd + row, r, mask=row_ok)

    # Boundary 1: the normalized row is rounded to x.dtype, then rotated in FP32.
    dtype = out.dtype.element_ty
    tl.store(out_row[:, :, None] + c, (v * r[:, None, None]).to(dtype), mask=valid & (c < D - R))  # leading channels
    own = (own * r[:, None]).to(dtype).to(tl.float32)
    partner = swap_pairs(own, M, RBLOCK)
    # first of a pair: ya*c - yb*s; second: yb*c + ya*s
    rotated = rotate_lane(own, cs, tl.where((j & 1) == 1, partner, negated(partner)) * sn)
    tl.store(out_row + rotary_channel, rotated.to(dtype), mask=in_slice)


@triton.jit
def _qnorm_rope_backward(
    x, grad, cos, sin, rstd, out, rows, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, GB, GH, GS, GD, CB, CS, CD, SB, SS, SD,
    M: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """De-rotate the upstream gradient, round it, then apply the RMSNorm input gradient."""
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    b, h, s, c, row_ok, valid, rot, second, first_pair = _row_tile(row, rows, S, H, D, R, BLOCK)

    r = tl.load(rstd + row, mask=row_ok)[:, None]
    xhat = tl.load(x + (b * XB + h * XH + s * XS)[:, None] + c * XD, mask=valid).to(tl.float32) * r
    g = tl.load(grad + (b * GB + h * GH + s * GS)[:, None] + c * GD, mask=valid).to(tl.float32)
    g_partner = swap_pairs(g, M, BLOCK)
    cs = pair_table(cos, b * CB + s * CS, CD, row_ok, first_pair, R // 2, M, BLOCK)
    sn = pair_table(sin, b * SB + s * SS, SD, row_ok, first_pair, R // 2, M, BLOCK)

    # Boundary 2: the de-rotated gradient is rounded to x.dtype before the RMSNorm backward.
    # first of a pair: ga*c + gb*s; second: gb*c - ga*s
    dtype = out.dtype.element_ty
    derotated = (g * cs + tl.where(second, negated(g_partner), g_partner) * sn).to(dtype).to(tl.float32)
    g = tl.where(rot, derotated, g)

    mean = tl.sum(g * xhat, axis=1)[:, None] / D
    tl.store(out + (row * D)[:, None] + c, (r * (g - xhat * mean)).to(dtype), mask=valid)


# Elements per program of the forward's one-warp tile (more warps there change rstd's bits): on a channel-strided
# x the tile its bits were recorded with (M sets its row sums' order), on a channel-contiguous one the fastest
# M, every M giving the same bits there (docs/records/*-tuning.md, "QNorm forward").
FORWARD_ELEMENTS, CONTIGUOUS_ELEMENTS = 2048, 1024


# Whole rows on several warps: (least rows of the launch, M rows a program, warps), the last entry a launch
# reaches wins; below the first, one warp. Only for an x that `rows_fit_warps` accepts (then each row's sum is
# the same PTX as on one warp). One row a warp on two warps at decode, on eight from 65536 rows: the fastest at
# each (docs/records/*-tuning.md, "QNorm forward"; no launch between 32768 and 262144 rows was timed).
ROWS_ON_WARPS: tuple[tuple[int, int, int], ...] = ((1, 2, 2), (65536, 8, 8))


def warp_pass(element_size: int) -> int:
    """Lanes one warp covers in one pass over a row: 32 threads x one 16-byte vector of elements this size."""
    return 32 * 16 // element_size


def row_chunk(block: int, element_size: int, warps: int) -> int:
    """The forward's CHUNK: the whole row tile on one warp; one warp's pass over the row (warp_pass) when whole
    rows go on several warps."""
    return block if warps == 1 else warp_pass(element_size)


def rows_fit_warps(x: torch.Tensor) -> bool:
    """Whether x's rows can go whole onto several warps with their one-warp bits: channels contiguous, D a
    power of two of at least 256 (the tile BLOCK = D holds whole passes of a warp), and x's address and
    strides multiples of 16 (as Triton specializes them), so that every thread loads 16-byte vectors: a
    pass of a warp is then CHUNK = warp_pass(x.element_size()) lanes, and the tile [M, D // CHUNK, CHUNK] gives each
    thread the lanes, in the order, it holds on one warp (tests/test_gpu.py::test_qnorm_rows_on_warps_keep_the_bits)."""
    dim = x.shape[-1]
    return (
        not INTERPRET
        and x.stride(-1) == 1
        and dim >= 256
        and next_pow2(dim) == dim
        and x.data_ptr() % 16 == 0
        and all(stride % 16 == 0 for stride in x.stride()[:-1])
    )


def forward_config(x: torch.Tensor) -> dict:
    """The forward's tile for x: M rows a program, BLOCK lanes, CHUNK lanes a pass, warps."""
    dim = x.shape[-1]
    tile = (0, 0)  # one warp
    if ROWS_ON_WARPS and rows_fit_warps(x):
        rows = x.numel() // dim
        tier = sum(rows >= least for least, _, _ in ROWS_ON_WARPS)
        tile = ROWS_ON_WARPS[tier - 1][1:] if tier else tile
    return _forward_config(dim, x.stride(-1) == 1, x.element_size(), *tile)


@functools.cache  # once per geometry (host time, as tile_config); the dict is shared: never change it
def _forward_config(dim: int, channel_contiguous: bool, element_size: int, rows_per_program: int, warps: int) -> dict:
    block = next_pow2(dim)
    if warps:  # whole rows on warps
        return dict(M=rows_per_program, BLOCK=block, num_warps=warps, CHUNK=row_chunk(block, element_size, warps))
    contiguous = channel_contiguous and block >= 256
    return dict(tile_config(dim, CONTIGUOUS_ELEMENTS if contiguous else FORWARD_ELEMENTS), CHUNK=block)


def _outputs(x):
    """The forward's outputs: `out` token-major like x, FP32 `rstd` with one entry per row."""
    batch, heads, seq, _ = x.shape
    return token_major_empty(x), x.new_empty(batch * seq * heads, dtype=torch.float32)


def _forward(x, cos, sin, rotary, eps, with_rstd=True):
    """(out, rstd); without rstd (a call no backward follows) (out, None): rstd is neither allocated nor stored."""
    out, rstd = _outputs(x) if with_rstd else (token_major_empty(x), None)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    if rows == 0 or dim == 0:
        return out, rstd
    config = forward_config(x)
    _qnorm_rope[(triton.cdiv(rows, config["M"]),)](
        x, cos, sin, out, rstd, rows, seq, heads, dim, rotary,
        *x.stride(), *cos.stride(), *sin.stride(), EPS=eps, RBLOCK=next_pow2(rotary), STORE_RSTD=with_rstd,
        **config, **UNFUSED,
    )  # fmt: skip
    return out, rstd


def _backward(x, grad, cos, sin, rstd, rotary):
    out = token_major_empty(x)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    if rows == 0 or dim == 0:
        return out
    config = tile_config(dim, 1024, warps=2)
    _qnorm_rope_backward[(triton.cdiv(rows, config["M"]),)](
        x, grad, cos, sin, rstd, out, rows, seq, heads, dim, rotary,
        *x.stride(), *grad.stride(), *cos.stride(), *sin.stride(), **config, **UNFUSED,
    )  # fmt: skip
    return out


# --- torch.library ops: what torch.compile sees of a kernel, an opaque call with a fake -----
# As in rope.py: inputs keep their traced strides under inductor (needs_exact_strides); the fake
# implementations allocate as the launchers do.


@torch.library.custom_op("dsrope::qnorm_rope", mutates_args=(), tags=(torch.Tag.needs_exact_strides,))
def qnorm_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward of qnorm_rope_triton on checked arguments: (out, rstd)."""
    return _forward(x, cos, sin, rotary, eps)


@qnorm_rope.register_fake
def _qnorm_rope_fake(x, cos, sin, rotary, eps):
    return _outputs(x)


@torch.library.custom_op("dsrope::qnorm_rope_backward", mutates_args=(), tags=(torch.Tag.needs_exact_strides,))
def qnorm_rope_backward(
    x: torch.Tensor, grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rstd: torch.Tensor, rotary: int
) -> torch.Tensor:
    """Input gradient of qnorm_rope from the upstream gradient and the saved rstd."""
    return _backward(x, grad, cos, sin, rstd, rotary)


@qnorm_rope_backward.register_fake
def _qnorm_rope_backward_fake(x, grad, cos, sin, rstd, rotary):
    return token_major_empty(x)


class _QNormRoPE(torch.autograd.Function):
    """Autograd implementation with FP32 saved inverse RMS.

    Two ways in, one formula (as _PartialRoPE): eager calls that want a gradient go through `apply`,
    whose forward and backward call the launchers directly; the op gets `save` as its setup_context
    and `backward_op`, which calls the backward op so that tracing sees it.
    """

    @staticmethod
    def forward(ctx, x, cos, sin, rotary, eps):
        out, rstd = _forward(x, cos, sin, rotary, eps)
        _QNormRoPE.save(ctx, (x, cos, sin, rotary, eps), (out, rstd))
        return out

    @staticmethod
    def save(ctx, inputs, output):
        x, cos, sin, rotary, _ = inputs
        ctx.save_for_backward(x, cos, sin, output[1])
        ctx.rotary = rotary

    @staticmethod
    def backward_inputs(ctx, grad_output):
        """The backward's arguments: x, the gradient in x's dtype, cos, sin, rstd, rotary."""
        x, cos, sin, rstd = ctx.saved_tensors
        if grad_output.shape != x.shape:
            raise ValueError(f"grad_output: expected shape {list(x.shape)}, got {list(grad_output.shape)}")
        return x, grad_output.to(x.dtype), cos, sin, rstd, ctx.rotary

    @staticmethod
    def backward(ctx, grad_output):
        return _backward(*_QNormRoPE.backward_inputs(ctx, grad_output)), None, None, None, None

    @staticmethod
    def backward_op(ctx, grad_output, grad_rstd):
        # rstd is an output of the op only to be saved; no gradient flows into it
        return qnorm_rope_backward(*_QNormRoPE.backward_inputs(ctx, grad_output)), None, None, None, None


torch.library.register_autograd("dsrope::qnorm_rope", _QNormRoPE.backward_op, setup_context=_QNormRoPE.save)


def _run(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> torch.Tensor:
    """QNorm + RoPE of checked arguments, as rope.apply_partial_rope_unchecked: the op under
    torch.compile; in eager the autograd.Function when a gradient is wanted, else the launcher alone, which
    stores no rstd. The same launchers on the same arguments: the same bits of `out`."""
    if torch.compiler.is_compiling():
        return qnorm_rope(x, cos, sin, rotary, eps)[0]
    if wants_autograd(x):
        return _QNormRoPE.apply(x, cos, sin, rotary, eps)
    return _forward(x, cos, sin, rotary, eps, with_rstd=False)[0]


def qnorm_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> torch.Tensor:
    """RMSNorm each row of x [B, H, S, D] over D (no weight), then rotate its trailing `rotary`
    interleaved channels. cos, sin: fixed FP32 [B, S, rotary], any strides. Returns x's logical
    shape and dtype in token-major storage."""
    check_x(x)
    check_rotary(rotary, x.shape[-1])
    check_eps(eps)
    check_table("cos", cos, x, rotary)
    check_table("sin", sin, x, rotary)
    return _run(x, cos, sin, rotary, float(eps))
