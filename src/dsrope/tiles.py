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
    programs (decode: S = 1, B * H rows), for the QNorm forward on channel-contiguous x: the smallest
    launches are latency-bound. (Partial RoPE launches few rows on a kernel of their own,
    rope.rotate_config.) A row's result must not depend on how many rows share its launch. The QNorm
    forward's row sum of squares follows the layout Triton gives the row tile, and that
    depends on M only where x's channels are strided (triton 3.6, sm_90, D = 512): a contiguous row
    is loaded 8 (FP32: 4) channels a thread over the warp's 32 threads at every M, hence one order of
    summation (`python -m tools.rotation_ptx --rows-per-program`: the same per-row PTX at M = 1, 2, 4,
    8), while a channel-strided row is spread over 32 threads at M = 1 and 8 at M = 4. Measured on an
    H100 (2026-12-05, docs/decode.md): with this rule applied to every x, the two channel-strided
    goldens huge-fp16 and huge-fp32 changed (rstd 1 ulp on 4 and 2 of 12 rows) and the 16
    channel-contiguous goldens of D = 512 kept their bits at M = 1; the launcher asks only for
    contiguous channels. Not for the QNorm backward (two warps). BLOCK >= 256 only (the decode
    geometry, D = 512), where it was measured."""
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
