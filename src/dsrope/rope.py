"""Partial interleaved RoPE (DeepSeek-V4) in one pass, with its conjugate backward; and its in-place form.

Rows are walked in token-major order, `row = (b*S + s)*H + h`, so the output is written as a
contiguous [B, S, H, D] buffer while `x` is read through its own strides (no transpose copy).
The trailing `rotary` channels are rotated pairwise, pair k = channels (D-R+2k, D-R+2k+1); the
leading D-R channels are copied. Math is FP32, each product and the sum rounded (`rotate_lane`, launched
UNFUSED: no multiply-add contraction), rounded once more at the store.

In place (`apply_partial_rope_triton_`): only the R rotary channels of each row are read and written,
through x's own strides, with the same arithmetic (the same bits); the leading D-R channels are not
touched. Out of place a partial rope must move all D channels; in place it moves R of them.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from dsrope.checks import check_rotary, check_table, check_writable, check_x, wants_autograd
from dsrope.interpreter import INTERPRET
from dsrope.pair_rotation import UNFUSED, negated, pair_table, rotate_lane, swap_pairs
from dsrope.tiles import next_pow2, tile_config, token_major_empty


# Arguments grouped as the seed groups them (pointers, sizes, each tensor's strides, constexprs);
# `fmt: skip` keeps ruff format from putting each on its own line.
@triton.jit
def _rotate(
    x, cos, sin, out, rows, SEQUENCE,
    HEADS: tl.constexpr, DIM: tl.constexpr, ROTARY: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    INVERSE: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Rotate M rows of x [B, H, S, D] into token-major storage `out` [B, S, H, D].

    Each row is one contiguous tile of channels; a rotary lane also loads its pair partner
    (position j ^ 1 within the rotary slice, same cache lines), so loads and stores stay
    contiguous. INVERSE negates the sine: the backward is the same kernel.
    """
    # int64 from the start: row * DIM and b * XB pass 2**31 on large tensors.
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    row_ok = row < rows
    h = row % HEADS
    token = row // HEADS
    s = token % SEQUENCE
    b = token // SEQUENCE
    x_row = x + (b * XB + h * XH + s * XS)[:, None]
    out_row = out + (row * DIM)[:, None]

    channel = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    valid = row_ok[:, None] & (channel < DIM)
    j = channel - (DIM - ROTARY)  # position inside the rotary slice; pair k = j // 2
    rot = valid & (j >= 0)
    second = (j & 1) == 1  # second channel of its pair
    # j ^ 1 is the partner's position; a select between channel - 1 and channel + 1 made the compiler
    # treat the partner addresses as contiguous and vectorize them (wrong values for odd D - R on H200)
    partner_channel = (j ^ 1) + (DIM - ROTARY)
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    value = tl.load(x_row + channel * XD, mask=valid)
    own = value.to(tl.float32)
    partner = tl.load(x_row + partner_channel * XD, mask=rot).to(tl.float32)
    k = j // 2
    cs = tl.load(cos + (b * CB + s * CS)[:, None] + k * CD, mask=rot)
    sn = tl.load(sin + (b * SB + s * SS)[:, None] + k * SD, mask=rot)
    if INVERSE:
        sn = negated(sn)
    # first of a pair: a*c - b*s; second: b*c + a*s
    rotated = rotate_lane(own, cs, tl.where(second, partner, negated(partner)) * sn)
    result = tl.where(rot, rotated.to(out.dtype.element_ty), value)
    tl.store(out_row + channel, result, mask=valid)


@triton.jit
def _rotate_split(
    x, cos, sin, out, rows, SEQUENCE,
    HEADS: tl.constexpr, DIM: tl.constexpr, ROTARY: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    INVERSE: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr, RBLOCK: tl.constexpr,
):  # fmt: skip
    """_rotate's function for launches of few rows (decode), on two tiles a row, each loaded and stored
    contiguously: the leading D - R channels copied on an [M, BLOCK] tile, the ROTARY channels rotated
    on their own [M, RBLOCK] tile as _rotate_inplace rotates them (partner from registers, swap_pairs;
    one table load per pair, pair_table; rotate_lane on the same operands: the same bits as _rotate).
    At decode a program's time is its instructions, and the whole-row form pays the partner's and the
    tables' addressing on every lane (docs/records/2026-12-04-h200-decode-bound.md); at prefill the bytes
    decide, and the whole-row form moved them 1-2% faster (rotate_config).
    """
    # int64 from the start: row * DIM and b * XB pass 2**31 on large tensors.
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    row_ok = row < rows
    h = row % HEADS
    token = row // HEADS
    s = token % SEQUENCE
    b = token // SEQUENCE
    x_row = x + (b * XB + h * XH + s * XS)[:, None]
    out_row = out + (row * DIM)[:, None]

    # Every load before the first store: a warp issues in order and a store waits for its data, so a
    # load after it would start a memory latency only when the first one has ended (decode)
    # the leading channels: a copy
    channel = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    passed = row_ok[:, None] & (channel < DIM - ROTARY)
    leading = tl.load(x_row + channel * XD, mask=passed)
    # the rotary channels: pair k = lanes (2k, 2k+1) of the tile; int64: channel * XD passes 2**31
    j = tl.arange(0, RBLOCK).to(tl.int64)[None, :]
    rot = row_ok[:, None] & (j < ROTARY)
    rotary_channel = j + (DIM - ROTARY)
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    own = tl.load(x_row + rotary_channel * XD, mask=rot).to(tl.float32)
    cs = pair_table(cos, b * CB + s * CS, CD, row_ok, 0, ROTARY // 2, M, RBLOCK)
    sn = pair_table(sin, b * SB + s * SS, SD, row_ok, 0, ROTARY // 2, M, RBLOCK)
    tl.store(out_row + channel, leading, mask=passed)

    second = (j & 1) == 1  # second channel of its pair
    partner = swap_pairs(own, M, RBLOCK)
    if INVERSE:
        sn = negated(sn)
    # first of a pair: a*c - b*s; second: b*c + a*s
    rotated = rotate_lane(own, cs, tl.where(second, partner, negated(partner)) * sn)
    tl.store(out_row + rotary_channel, rotated.to(out.dtype.element_ty), mask=rot)


# The out-of-place kernel by the launch's rows: the split form up to SPLIT_ROWS (decode), where it was the
# fastest, else the whole-row _rotate, the fastest at prefill (docs/records/*-tuning.md, "Partial RoPE out of
# place").
ROTATE_ELEMENTS = 1024
SPLIT_ROWS, SPLIT_ELEMENTS, SPLIT_WARPS = 16384, 2048, 2


def rotate_config(dim: int, rotary: int, rows: int) -> tuple:
    """(kernel, tile) of an out-of-place launch of `rows` rows: the split form and its tile where the
    rows are few, else the whole-row form. Both compute every element by the same instructions (no
    reduction; rotate_lane on the same operands): the bits depend on neither the form nor the tile
    (tests/test_rope.py runs both; tests/test_gpu.py holds them to each other's bits on the GPU)."""
    if rows <= SPLIT_ROWS:
        return _rotate_split, _split_tile(dim, rotary)
    return _rotate, tile_config(dim, ROTATE_ELEMENTS)


@functools.cache  # host time: once per geometry (tiles.tile_config); the dict is shared, never changed
def _split_tile(dim: int, rotary: int) -> dict:
    return {**tile_config(dim, SPLIT_ELEMENTS, SPLIT_WARPS), "RBLOCK": next_pow2(rotary)}


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, inverse: bool) -> torch.Tensor:
    """Rotate x [B, H, S, D] (any strides) into a [B, H, S, D] view of token-major storage."""
    out = token_major_empty(x)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    if rows == 0 or dim == 0:
        return out
    kernel, config = rotate_config(dim, rotary, rows)
    kernel[(triton.cdiv(rows, config["M"]),)](
        x, cos, sin, out, rows, seq, heads, dim, rotary,
        *x.stride(), *cos.stride(), *sin.stride(), INVERSE=inverse, **config, **UNFUSED,
    )  # fmt: skip
    return out


@triton.jit
def _rotate_inplace(
    x, cos, sin, tokens, SEQUENCE,
    HEADS: tl.constexpr, DIM: tl.constexpr, ROTARY: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    M: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Rotate the trailing ROTARY channels of M rows of x [B, H, S, D] in place: GROUP neighbouring
    heads at M // GROUP consecutive tokens (token = b * S + s).

    A tile holds the rotary slice of each row only (BLOCK >= ROTARY lanes). Each row is one load and
    one store: the pair partner comes from registers (swap_pairs), not from a second load (a gather,
    slower: docs/records/2026-12-04-h200-inplace-and-peers-benchmark.md), and each table entry is loaded
    once per pair (pair_table). Rows are disjoint
    (check_writable), so no store meets a value still to be read. The rotation is _rotate's, rotate_lane
    on the same operands (the same bits).
    """
    tl.static_assert(M % GROUP == 0)  # a tile is whole tokens of GROUP heads: no row twice
    head_blocks: tl.constexpr = (HEADS + GROUP - 1) // GROUP
    tile = tl.program_id(0)
    i = tl.arange(0, M)
    # int64: token * XS, b * XB and h * XH pass 2**31 on large tensors
    h = ((tile % head_blocks) * GROUP + i % GROUP).to(tl.int64)
    token = (tile // head_blocks).to(tl.int64) * (M // GROUP) + i // GROUP
    row_ok = (h < HEADS) & (token < tokens)
    s = token % SEQUENCE
    b = token // SEQUENCE
    x_row = x + (b * XB + s * XS + h * XH)[:, None]

    # position inside the rotary slice; int64: channel * XD passes 2**31 on a channel-strided x
    j = tl.arange(0, BLOCK).to(tl.int64)[None, :]
    rot = row_ok[:, None] & (j < ROTARY)
    second = (j & 1) == 1  # second channel of its pair
    channel = j + (DIM - ROTARY)
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    own = tl.load(x_row + channel * XD, mask=rot).to(tl.float32)
    partner = swap_pairs(own, M, BLOCK)
    cs = pair_table(cos, s * CS + b * CB, CD, row_ok, 0, ROTARY // 2, M, BLOCK)
    sn = pair_table(sin, s * SS + b * SB, SD, row_ok, 0, ROTARY // 2, M, BLOCK)
    # first of a pair: a*c - b*s; second: b*c + a*s
    rotated = rotate_lane(own, cs, tl.where(second, partner, negated(partner)) * sn)
    tl.store(x_row + channel * XD, rotated.to(x.dtype.element_ty), mask=rot)


def inplace_config(rotary: int, heads: int, tokens: int, seq: int) -> dict:
    """Tile of _rotate_inplace: M rows (GROUP heads at M // GROUP tokens), BLOCK lanes, warps.

    INPLACE_ELEMENTS elements on INPLACE_WARPS warps a program, INPLACE_GROUP heads side by side, and at
    decode (S = 1) INPLACE_DECODE_GROUP: the sweeps' fastest (docs/records/*-tuning.md, "Partial RoPE in
    place"). Where the tokens cannot fill a tile, every row of a tile is a head of one token, and a launch of
    few rows gets fewer rows per program, down to 4 (at least INPLACE_PROGRAMS programs). Any tile gives
    every element the same instructions (no reduction): the bits do not depend on it. The interpreter pays
    per program: big tiles on CPU.
    """
    config = tile_config(rotary, INPLACE_ELEMENTS, INPLACE_WARPS)
    m = config["M"]
    while not INTERPRET and m > 4 and heads * tokens < INPLACE_PROGRAMS * m:
        m //= 2
    heads_side_by_side = INPLACE_DECODE_GROUP if seq == 1 else INPLACE_GROUP
    group = min(m, next_pow2(heads), heads_side_by_side if tokens >= m // heads_side_by_side else m)
    return {**config, "M": m, "GROUP": group}


INPLACE_ELEMENTS, INPLACE_GROUP, INPLACE_DECODE_GROUP, INPLACE_WARPS, INPLACE_PROGRAMS = 1024, 2, 8, 4, 16


def inplace_grid(config: dict, heads: int, tokens: int) -> tuple:
    group = config["GROUP"]
    return (triton.cdiv(heads, group) * triton.cdiv(tokens, config["M"] // group),)


def _launch_inplace(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> None:
    """Rotate the trailing `rotary` channels of x [B, H, S, D] (checked writable) in place."""
    batch, heads, seq, dim = x.shape
    tokens = batch * seq
    if tokens * heads == 0:
        return
    config = inplace_config(rotary, heads, tokens, seq)
    _rotate_inplace[inplace_grid(config, heads, tokens)](
        x, cos, sin, tokens, seq, heads, dim, rotary,
        *x.stride(),
        *cos.stride(), *sin.stride(), **config, **UNFUSED,
    )  # fmt: skip


# --- torch.library ops: what torch.compile sees of a kernel, an opaque call with a fake -----
# Inductor hands a custom op's inputs over with the strides they had when traced (needs_exact_strides,
# also the default for custom ops since torch 2.8), so a compiled call launches on the layouts the
# eager call would see. The fake implementations allocate as the launchers do: token-major outputs.


@torch.library.custom_op("dsrope::partial_rope", mutates_args=(), tags=(torch.Tag.needs_exact_strides,))
def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """Forward of apply_partial_rope_triton on checked arguments."""
    return _launch(x, cos, sin, rotary, inverse=False)


@torch.library.custom_op("dsrope::partial_rope_backward", mutates_args=(), tags=(torch.Tag.needs_exact_strides,))
def partial_rope_backward(grad: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """Backward of partial_rope: the conjugate rotation of the upstream gradient."""
    return _launch(grad, cos, sin, rotary, inverse=True)


@partial_rope.register_fake
@partial_rope_backward.register_fake
def _token_major_like(x, cos, sin, rotary):
    return token_major_empty(x)


class _PartialRoPE(torch.autograd.Function):
    """Autograd of partial RoPE; only cos and sin are saved.

    Two ways in, one formula: eager calls go through `apply` (see apply_partial_rope_unchecked), whose
    forward and backward call the launcher directly; the op gets `save` as its setup_context and
    `backward_op`, which calls the backward op so that tracing sees it. Both launch `_launch` on the
    same arguments.
    """

    @staticmethod
    def forward(ctx, x, cos, sin, rotary):
        _PartialRoPE.save(ctx, (x, cos, sin, rotary), None)
        return _launch(x, cos, sin, rotary, inverse=False)

    @staticmethod
    def save(ctx, inputs, output):
        _, cos, sin, rotary = inputs
        ctx.save_for_backward(cos, sin)
        ctx.rotary = rotary

    @staticmethod
    def backward(ctx, grad_output):
        cos, sin = ctx.saved_tensors
        return _launch(grad_output, cos, sin, ctx.rotary, inverse=True), None, None, None

    @staticmethod
    def backward_op(ctx, grad_output):
        cos, sin = ctx.saved_tensors
        return partial_rope_backward(grad_output, cos, sin, ctx.rotary), None, None, None


torch.library.register_autograd("dsrope::partial_rope", _PartialRoPE.backward_op, setup_context=_PartialRoPE.save)


def apply_partial_rope_unchecked(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """apply_partial_rope_triton without its argument checks, for a caller that made them (rope_utils,
    whose tables it builds itself): the same result, less host time.

    Under torch.compile: the op. In eager, host time decides (docs/performance.md): the
    autograd.Function when a gradient is wanted (the op's dispatch and autograd wrapper cost 2.5 times
    as much), else the launcher alone (inference, decode). Every path launches `_launch` on the same
    arguments: the same bits."""
    if torch.compiler.is_compiling():
        return partial_rope(x, cos, sin, rotary)
    if wants_autograd(x):
        return _PartialRoPE.apply(x, cos, sin, rotary)
    return _launch(x, cos, sin, rotary, inverse=False)


def apply_partial_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """Rotate the trailing `rotary` interleaved channels of x [B, H, S, D].

    cos, sin: fixed FP32 [B, S, rotary] (any strides); entry k of the last dim is pair k's
    frequency. Returns x's logical shape and dtype in token-major storage.
    """
    check_x(x, even_channels=True)
    check_rotary(rotary, x.shape[-1])
    check_table("cos", cos, x, rotary)
    check_table("sin", sin, x, rotary)
    return apply_partial_rope_unchecked(x, cos, sin, rotary)


# --- in place ------------------------------------------------------------------------------------------


@torch.library.custom_op("dsrope::partial_rope_", mutates_args=("x",), tags=(torch.Tag.needs_exact_strides,))
def partial_rope_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> None:
    """apply_partial_rope_triton_ on checked arguments: x's rotary channels rotated in place."""
    _launch_inplace(x, cos, sin, rotary)


@partial_rope_.register_fake
def _partial_rope_fake(x, cos, sin, rotary):
    return None


class _PartialRoPEInplace(torch.autograd.Function):
    """Autograd of the in-place rotation: x is marked dirty (its version moves on, so a tensor autograd
    saved before the call is refused when used); the backward is _PartialRoPE's, the conjugate rotation
    of the gradient, which needs only cos and sin."""

    @staticmethod
    def forward(ctx, x, cos, sin, rotary):
        _PartialRoPE.save(ctx, (x, cos, sin, rotary), None)
        partial_rope_(x, cos, sin, rotary)
        ctx.mark_dirty(x)
        return x

    backward = staticmethod(_PartialRoPE.backward_op)


def apply_partial_rope_triton_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """Rotate the trailing `rotary` interleaved channels of x [B, H, S, D] in place; return x.

    The rotated channels hold the bits apply_partial_rope_triton gives them; the leading channels are
    neither read nor written. x may have any strides whose elements do not share memory (stride 0 and
    overlapping views are refused: an in-place write there would change other elements too); cos, sin
    as for apply_partial_rope_triton. With autograd, x's gradient is the conjugate rotation of the
    upstream gradient; a leaf that requires grad is refused, as torch refuses in-place ops on it.
    """
    check_x(x, even_channels=True)
    check_writable(x)
    check_rotary(rotary, x.shape[-1])
    check_table("cos", cos, x, rotary)
    check_table("sin", sin, x, rotary)
    if torch.is_grad_enabled() and x.requires_grad:
        return _PartialRoPEInplace.apply(x, cos, sin, rotary)
    if torch.compiler.is_compiling():
        partial_rope_(x, cos, sin, rotary)
    else:
        _launch_inplace(x, cos, sin, rotary)  # eager: the op's dispatch costs host time (docs/performance.md)
    return x
