"""How a launch covers its rows: rows per program, channel tile and warps; and the token-major output
storage the rows are written to."""

from __future__ import annotations

import functools

import torch

from dsrope.interpreter import INTERPRET


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache  # once per geometry: a decode call is dominated by host time (docs/perf.md)
def tile_config(dim: int, elements: int, warps: int = 1) -> dict:
    """Rows per program (M), channel tile (BLOCK) and warps for a kernel walking rows of `dim`.

    The interpreter pays per program: big blocks on CPU. On the H200 small programs won
    (tools/sweep.py, docs/perf.md): `elements` per program and `warps`, 2048 x 1 for the QNorm forward,
    1024 x 2 for its backward; partial RoPE's is rope.ROTATE_ELEMENTS. The dict is shared between
    calls: read it, never change it.
    """
    block = next_pow2(dim)
    if INTERPRET:
        return dict(M=max(1, min(64, (1 << 16) // block)), BLOCK=block)
    return dict(M=max(1, elements // block), BLOCK=block, num_warps=warps if block <= 1024 else max(warps, 4))


def spread_rows(config: dict, rows: int) -> dict:
    """`config` with fewer rows per program where the rows are too few to give a launch SPREAD_PROGRAMS
    programs (decode: S = 1, B * H rows), halving M down to 1: the smallest launches are latency-bound.
    For partial RoPE only: each output element is computed by the same instructions for any M (no
    reduction), so the bits do not change. Not for the QNorm kernels: there M changes a row's sum of
    squares in the last bit on some rows (on the H200 one row per program gave rstd 1 ulp apart on rows
    of the huge-fp16 and huge-fp32 goldens, docs/gpu-runs.md), and a row's result must not depend on how
    many rows share its launch. SPREAD_PROGRAMS is provisional, to be chosen by the H200 decode sweep
    (tools/sweep.py --kernels rope --decode; the rule before the split rotation gave every SM two
    programs, measured for that form: docs/perf.md)."""
    m = config["M"]
    if INTERPRET:
        return config
    while m > 1 and (rows + m - 1) // m < SPREAD_PROGRAMS:
        m //= 2
    return config if m == config["M"] else {**config, "M": m}


SPREAD_PROGRAMS = 64


def token_major_empty(x: torch.Tensor) -> torch.Tensor:
    """A fresh [B, H, S, D] tensor in contiguous [B, S, H, D] storage (torch's contiguous strides of
    [B, S, H, D], transposed). One allocation call: torch.empty(...).transpose(1, 2) took 3x the
    host time (docs/perf.md, decode)."""
    b, h, s, d = x.shape
    stride_h = max(d, 1)
    stride_s = max(h, 1) * stride_h
    return x.new_empty_strided((b, h, s, d), (max(s, 1) * stride_s, stride_h, stride_s, 1))
