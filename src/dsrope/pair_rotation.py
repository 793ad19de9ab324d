"""Triton helpers of the interleaved pair rotation, shared by the kernels: the rotation of one lane
(rotate_lane), a pair's partner from registers (swap_pairs) and a pair's table entry given to both of
its lanes (pair_table). Lanes (2i, 2i+1) of a tile hold one pair."""

from __future__ import annotations

import triton
import triton.language as tl

from dsrope.interpreter import INTERPRET

COMPILED = tl.constexpr(not INTERPRET)


@triton.jit
def rotate_lane(own, cos, signed_partner_times_sin):
    """own * cos + signed_partner_times_sin, one lane of the partial RoPE rotation (first of a pair:
    a*c + (-b*s); second: b*c + a*s), in both partial RoPE kernels (out of place and in place).

    Compiled: fma(own, cos, rn(signed partner * sin)), the fused product written out. Left to the
    compiler, which product of `own * cos + partner * sin` is fused is a choice made per
    specialization: on the H200 (triton 3.6) the in-place kernel fused the other product of a second
    lane on an fp16 x with channel stride 2 and stored 1 ulp away from the out-of-place kernel where the
    two forms straddle a rounding midpoint (tests/test_rope_inplace.py::test_layouts_property;
    docs/records/2026-12-04-h200-gpu-runs.md). Written out, both kernels compute the same bits; the
    out-of-place kernel's PTX
    for sm_90 is the same as with the compiler's choice (docs/records/*-probes-removed.md). Triton
    3.9 warns that 3.10 stops fusing by default; written out, the rotation keeps its one fused product
    there too. The interpreter rounds both products and the sum to FP32 (docs/contract.md).
    """
    if COMPILED:
        return tl.fma(own, cos, signed_partner_times_sin)
    else:
        return own * cos + signed_partner_times_sin


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
