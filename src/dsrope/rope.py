"""Partial interleaved RoPE (DeepSeek-V4) in one pass, with its conjugate backward.

Rows are walked in token-major order, `row = (b*S + s)*H + h`, so the output is written as a
contiguous [B, S, H, D] buffer while `x` is read through its own strides (no transpose copy).
The trailing `rotary` channels are rotated pairwise, pair k = channels (D-R+2k, D-R+2k+1); the
leading D-R channels are copied. Math is FP32 with one rounding at the store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsrope._common import (
    INTERPRET,
    check_rotary,
    check_table,
    check_x,
    next_pow2,
    token_major_empty,
)


@triton.jit
def _rotate(
    x, cos, sin, out, rows, SEQUENCE,
    HEADS: tl.constexpr, DIM: tl.constexpr, ROTARY: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    INVERSE: tl.constexpr, M: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_PAIRS: tl.constexpr,
):
    """Rotate M rows of x [B, H, S, D] into token-major storage `out` [B, S, H, D].

    INVERSE negates the sine: the backward applies the conjugate rotation with the same kernel.
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

    PASS: tl.constexpr = DIM - ROTARY
    if PASS > 0:
        c = tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
        mask = row_ok[:, None] & (c < PASS)
        tl.store(out_row + c, tl.load(x_row + c * XD, mask=mask), mask=mask)

    k = tl.arange(0, BLOCK_PAIRS).to(tl.int64)[None, :]
    mask = row_ok[:, None] & (k < ROTARY // 2)
    even = PASS + 2 * k
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    a = tl.load(x_row + even * XD, mask=mask).to(tl.float32)
    b_ = tl.load(x_row + (even + 1) * XD, mask=mask).to(tl.float32)
    c_ = tl.load(cos + (b * CB + s * CS)[:, None] + k * CD, mask=mask)
    s_ = tl.load(sin + (b * SB + s * SS)[:, None] + k * SD, mask=mask)
    if INVERSE:
        s_ = -s_
    tl.store(out_row + even, (a * c_ - b_ * s_).to(out.dtype.element_ty), mask=mask)
    tl.store(out_row + even + 1, (a * s_ + b_ * c_).to(out.dtype.element_ty), mask=mask)


def _rows_per_program(channels: int) -> int:
    # The interpreter pays per program, the GPU per register: big blocks on CPU, ~8K elements on GPU.
    budget = 1 << 16 if INTERPRET else 1 << 13
    return max(1, min(64, budget // next_pow2(channels)))


def _launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, inverse: bool) -> torch.Tensor:
    """Rotate x [B, H, S, D] (any strides) into a [B, H, S, D] view of token-major storage."""
    out = token_major_empty(x)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    if rows == 0 or dim == 0:
        return out
    m = _rows_per_program(dim)
    _rotate[(triton.cdiv(rows, m),)](
        x, cos, sin, out, rows, seq, heads, dim, rotary,
        *x.stride(), *cos.stride(), *sin.stride(),
        INVERSE=inverse, M=m,
        BLOCK_PASS=next_pow2(max(dim - rotary, 1)), BLOCK_PAIRS=next_pow2(rotary // 2),
    )
    return out


class _PartialRoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, rotary):
        ctx.save_for_backward(cos, sin)
        ctx.rotary = rotary
        return _launch(x, cos, sin, rotary, inverse=False)

    @staticmethod
    def backward(ctx, grad_output):
        cos, sin = ctx.saved_tensors
        return _launch(grad_output, cos, sin, ctx.rotary, inverse=True), None, None, None


def apply_partial_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int) -> torch.Tensor:
    """Rotate the trailing `rotary` interleaved channels of x [B, H, S, D].

    cos, sin: fixed FP32 [B, S, rotary] (any strides); entry k of the last dim is pair k's
    frequency. Returns x's logical shape and dtype in token-major storage.
    """
    check_x(x)
    if x.shape[-1] % 2:
        raise ValueError(f"x: expected an even channel count, got {x.shape[-1]}")
    check_rotary(rotary, x.shape[-1])
    check_table("cos", cos, x, rotary)
    check_table("sin", sin, x, rotary)
    return _PartialRoPE.apply(x, cos, sin, rotary)
