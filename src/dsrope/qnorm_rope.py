"""Q RMSNorm + partial interleaved RoPE (DeepSeek-V4) in token-major storage, with its backward.

The two bf16 rounding boundaries are intentional; they reproduce the unfused eager chain
(`F.rms_norm`, then an FP32 rotation cast back to x.dtype) that models were trained with:
  1. forward: the normalized row y = x * rstd is rounded to x.dtype BEFORE it is rotated;
  2. backward: the upstream gradient is de-rotated and rounded to x.dtype BEFORE the RMSNorm
     backward.
Keeping FP32 across either boundary computes a different function (SPEC.md).

Rows are walked in token-major order, row = (b*S + s)*H + h; `rstd` is saved in that order.
Pass-through channels [0, D-R) and the rotary pairs (D-R+2k, D-R+2k+1) are separate blocks, so
D and R/2 need not be powers of two and D may be odd.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsrope._common import (
    INTERPRET,
    check_eps,
    check_rotary,
    check_table,
    check_x,
    next_pow2,
    token_major_empty,
)


@triton.jit
def _row_coordinates(row, S, H: tl.constexpr):
    h = row % H
    token = row // H
    return token // S, h, token % S


@triton.jit
def _qnorm_rope(
    x, cos, sin, out, rstd, rows, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    EPS: tl.constexpr, M: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_PAIRS: tl.constexpr,
):
    """Normalize and rotate M rows per program into token-major `out` [B, S, H, D]."""
    # int64 from the start: row * D and b * XB pass 2**31 on large tensors.
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    row_ok = row < rows
    b, h, s = _row_coordinates(row, S, H)
    x_row = x + (b * XB + h * XH + s * XS)[:, None]
    out_row = out + (row * D)[:, None]

    c = tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
    pass_mask = row_ok[:, None] & (c < D - R)
    k = tl.arange(0, BLOCK_PAIRS).to(tl.int64)[None, :]
    pair_mask = row_ok[:, None] & (k < R // 2)
    even = D - R + 2 * k
    # Upcast right after the load: the interpreter does bf16 arithmetic on raw bits.
    xp = tl.load(x_row + c * XD, mask=pass_mask).to(tl.float32)
    xa = tl.load(x_row + even * XD, mask=pair_mask).to(tl.float32)
    xb = tl.load(x_row + (even + 1) * XD, mask=pair_mask).to(tl.float32)

    squares = tl.sum(xp * xp, axis=1) + tl.sum(xa * xa + xb * xb, axis=1)
    r = tl.rsqrt(squares / D + EPS)
    tl.store(rstd + row, r, mask=row_ok)

    dtype = out.dtype.element_ty
    tl.store(out_row + c, (xp * r[:, None]).to(dtype), mask=pass_mask)
    # Boundary 1: round the normalized pair to x.dtype, then rotate it in FP32.
    ya = (xa * r[:, None]).to(dtype).to(tl.float32)
    yb = (xb * r[:, None]).to(dtype).to(tl.float32)
    cs = tl.load(cos + (b * CB + s * CS)[:, None] + k * CD, mask=pair_mask)
    sn = tl.load(sin + (b * SB + s * SS)[:, None] + k * SD, mask=pair_mask)
    tl.store(out_row + even, (ya * cs - yb * sn).to(dtype), mask=pair_mask)
    tl.store(out_row + even + 1, (ya * sn + yb * cs).to(dtype), mask=pair_mask)


@triton.jit
def _qnorm_rope_backward(
    x, grad, cos, sin, rstd, out, rows, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, GB, GH, GS, GD, CB, CS, CD, SB, SS, SD,
    M: tl.constexpr, BLOCK_PASS: tl.constexpr, BLOCK_PAIRS: tl.constexpr,
):
    """De-rotate the upstream gradient, round it, then apply the RMSNorm input gradient."""
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    row_ok = row < rows
    b, h, s = _row_coordinates(row, S, H)
    x_row = x + (b * XB + h * XH + s * XS)[:, None]
    g_row = grad + (b * GB + h * GH + s * GS)[:, None]
    out_row = out + (row * D)[:, None]

    c = tl.arange(0, BLOCK_PASS).to(tl.int64)[None, :]
    pass_mask = row_ok[:, None] & (c < D - R)
    k = tl.arange(0, BLOCK_PAIRS).to(tl.int64)[None, :]
    pair_mask = row_ok[:, None] & (k < R // 2)
    even = D - R + 2 * k

    r = tl.load(rstd + row, mask=row_ok)[:, None]
    xp = tl.load(x_row + c * XD, mask=pass_mask).to(tl.float32) * r
    xa = tl.load(x_row + even * XD, mask=pair_mask).to(tl.float32) * r
    xb = tl.load(x_row + (even + 1) * XD, mask=pair_mask).to(tl.float32) * r
    gp = tl.load(g_row + c * GD, mask=pass_mask).to(tl.float32)
    ga = tl.load(g_row + even * GD, mask=pair_mask).to(tl.float32)
    gb = tl.load(g_row + (even + 1) * GD, mask=pair_mask).to(tl.float32)
    cs = tl.load(cos + (b * CB + s * CS)[:, None] + k * CD, mask=pair_mask)
    sn = tl.load(sin + (b * SB + s * SS)[:, None] + k * SD, mask=pair_mask)

    # Boundary 2: the de-rotated gradient is rounded to x.dtype before the RMSNorm backward.
    dtype = out.dtype.element_ty
    da = (ga * cs + gb * sn).to(dtype).to(tl.float32)
    db = (gb * cs - ga * sn).to(dtype).to(tl.float32)

    mean = (tl.sum(gp * xp, axis=1) + tl.sum(da * xa + db * xb, axis=1)) / D
    mean = mean[:, None]
    tl.store(out_row + c, (r * (gp - xp * mean)).to(dtype), mask=pass_mask)
    tl.store(out_row + even, (r * (da - xa * mean)).to(dtype), mask=pair_mask)
    tl.store(out_row + even + 1, (r * (db - xb * mean)).to(dtype), mask=pair_mask)


def _blocks(dim: int, rotary: int) -> dict:
    # The interpreter pays per program, the GPU per register: big blocks on CPU, ~8K elements on GPU.
    budget = 1 << 16 if INTERPRET else 1 << 13
    return dict(
        M=max(1, min(64, budget // next_pow2(dim))),
        BLOCK_PASS=next_pow2(max(dim - rotary, 1)),
        BLOCK_PAIRS=next_pow2(rotary // 2),
    )


def _forward(x, cos, sin, rotary, eps):
    out = token_major_empty(x)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows == 0 or dim == 0:
        return out, rstd
    blocks = _blocks(dim, rotary)
    _qnorm_rope[(triton.cdiv(rows, blocks["M"]),)](
        x, cos, sin, out, rstd, rows, seq, heads, dim, rotary,
        *x.stride(), *cos.stride(), *sin.stride(), EPS=eps, **blocks,
    )
    return out, rstd


def _backward(x, grad, cos, sin, rstd, rotary):
    out = token_major_empty(x)
    batch, heads, seq, dim = x.shape
    rows = batch * seq * heads
    if rows == 0 or dim == 0:
        return out
    blocks = _blocks(dim, rotary)
    _qnorm_rope_backward[(triton.cdiv(rows, blocks["M"]),)](
        x, grad, cos, sin, rstd, out, rows, seq, heads, dim, rotary,
        *x.stride(), *grad.stride(), *cos.stride(), *sin.stride(), **blocks,
    )
    return out


class _QNormRoPE(torch.autograd.Function):
    """Autograd implementation with FP32 saved inverse RMS."""

    @staticmethod
    def forward(ctx, x, cos, sin, rotary, eps):
        out, rstd = _forward(x, cos, sin, rotary, eps)
        ctx.save_for_backward(x, cos, sin, rstd)
        ctx.rotary = rotary
        return out

    @staticmethod
    def backward(ctx, grad_output):
        x, cos, sin, rstd = ctx.saved_tensors
        if grad_output.shape != x.shape:
            raise ValueError(f"grad_output: expected shape {list(x.shape)}, got {list(grad_output.shape)}")
        return _backward(x, grad_output.to(x.dtype), cos, sin, rstd, ctx.rotary), None, None, None, None


def qnorm_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary: int, eps: float) -> torch.Tensor:
    """RMSNorm each row of x [B, H, S, D] over D (no weight), then rotate its trailing `rotary`
    interleaved channels. cos, sin: fixed FP32 [B, S, rotary], any strides. Returns x's logical
    shape and dtype in token-major storage."""
    check_x(x)
    check_rotary(rotary, x.shape[-1])
    check_eps(eps)
    check_table("cos", cos, x, rotary)
    check_table("sin", sin, x, rotary)
    return _QNormRoPE.apply(x, cos, sin, rotary, float(eps))
