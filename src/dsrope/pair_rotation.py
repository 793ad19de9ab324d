"""Triton helpers of the interleaved pair rotation, shared by the kernels: the rotation of one lane
(rotate_lane), an exact negation (negated), a pair's partner from registers (swap_pairs) and a pair's table
entry given to both of its lanes (pair_table). Lanes (2i, 2i+1) of a tile hold one pair."""

from __future__ import annotations

import triton
import triton.language as tl

# Launch options of every rotating kernel: no fused multiply-add, each product and sum rounded to FP32 (the contract)
UNFUSED = {"enable_fp_fusion": False}


@triton.jit
def rotate_lane(own, cos, signed_partner_times_sin):
    """own * cos + signed_partner_times_sin, one lane of the partial RoPE rotation (first of a pair:
    a*c + (-b*s); second: b*c + a*s), in the partial RoPE kernels (out of place and in place) and the QNorm
    forward.

    Both products and the sum are rounded to FP32, the contract's roundings (docs/contract.md): the
    launchers pass UNFUSED, so the compiler contracts no product into the add (left to it, it fused one
    product per lane, a choice it made per specialization). The interpreter computes the same roundings.
    """
    return own * cos + signed_partner_times_sin


@triton.jit
def negated(x):
    """-x for FP32 x, its sign bit flipped whatever x is (torch's negation, Triton 3.9's). Triton's unary minus
    is 0 - x before 3.9 (the device's 3.6, 3.2's interpreter), which keeps +0 positive: a rotated lane whose two
    products are zeros would store a zero of the other sign than the eager chain's a*c - b*s. x * -1.0 would keep
    a NaN's sign where the interpreter's negation flips it."""
    return (x.to(tl.uint32, bitcast=True) ^ 0x80000000).to(tl.float32, bitcast=True)


@triton.jit
def swap_pairs(t, M: tl.constexpr, BLOCK: tl.constexpr):
    """t [M, BLOCK] with the two lanes of every pair (2i, 2i+1) exchanged, in registers.

    A pair partner loaded a second time from memory is a gather: one scalar load and one 64-bit
    address per lane, which cost the QNorm backward most of its issue slots and registers (SASS for
    sm_90: 64 of its 98 loads per thread at 8 rows, docs/records/2026-12-02-h200-benchmark.md). A split and
    a join stay in registers.
    """
    first, second = tl.split(tl.reshape(t, (M, BLOCK // 2, 2)))
    return tl.reshape(tl.join(second, first), (M, BLOCK))


@triton.jit
def pair_table(
    table, row_offset, stride, row_ok, FIRST: tl.constexpr, PAIRS: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr
):
    """table[row_offset + k * stride] for the pair k = i - FIRST of lanes (2i, 2i+1), as [M, BLOCK].

    One contiguous load per pair, then the entry given to both of its lanes; 0 outside 0 <= k < PAIRS.
    """
    k = tl.arange(0, BLOCK // 2).to(tl.int64)[None, :] - FIRST
    entry = tl.load(table + row_offset[:, None] + k * stride, mask=row_ok[:, None] & (k >= 0) & (k < PAIRS), other=0.0)
    return tl.reshape(tl.join(entry, entry), (M, BLOCK))
