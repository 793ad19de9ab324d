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
    (tools/sweep.py, docs/perf.md): `elements` per program and `warps`, 1024 x 1 warp for partial
    RoPE, 2048 x 1 for the QNorm forward, 1024 x 2 for its backward. The dict is shared between
    calls: read it, never change it.
    """
    block = next_pow2(dim)
    if INTERPRET:
        return dict(M=max(1, min(64, (1 << 16) // block)), BLOCK=block)
    return dict(M=max(1, elements // block), BLOCK=block, num_warps=warps if block <= 1024 else max(warps, 4))


@functools.cache
def _programs_wanted(device_index: int) -> int:
    return 2 * torch.cuda.get_device_properties(device_index).multi_processor_count


def spread_rows(config: dict, rows: int, device: torch.device) -> dict:
    """`config` with fewer rows per program where there are too few rows to give every SM two
    programs (decode: S = 1, B * H rows), for partial RoPE: the smallest launches are latency-bound.
    Each output element is computed by the same instructions for any M (no reduction), so the bits
    do not change. Not for the QNorm kernels: a row's result must not depend on how many rows share
    its launch, and there M changes a row's sum of squares in the last bit on some rows. Measured
    twice: on the H200 (docs/gpu-runs.md) and on an H100 on 2026-12-05 (the split forward with this
    rule at decode against 3e8890d's kernels, same device): rstd 1 ulp apart on 4 of the 12 rows of
    the huge-fp16 golden and 2 of huge-fp32, out up to 16 ulp (FP32), although the triton 3.6 layout
    of the [M, 512] tile is threadsPerWarp [1, 32] for every M and random rows spanning 2**-60 to
    2**60 kept their bits (docs/decode.md). BLOCK >= 256 only (the decode geometry, D = 512), where
    it was measured."""
    m = config["M"]
    if INTERPRET or config["BLOCK"] < 256 or rows >= m * _programs_wanted(device.index):
        return config
    per_program = max(1, rows // _programs_wanted(device.index))
    while m > per_program:
        m //= 2
    return {**config, "M": m}


def token_major_empty(x: torch.Tensor) -> torch.Tensor:
    """A fresh [B, H, S, D] tensor in contiguous [B, S, H, D] storage (torch's contiguous strides of
    [B, S, H, D], transposed). One allocation call: torch.empty(...).transpose(1, 2) took 3x the
    host time (docs/perf.md, decode)."""
    b, h, s, d = x.shape
    stride_h = max(d, 1)
    stride_s = max(h, 1) * stride_h
    return x.new_empty_strided((b, h, s, d), (max(s, 1) * stride_s, stride_h, stride_s, 1))
