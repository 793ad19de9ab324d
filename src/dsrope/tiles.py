"""How a launch covers its rows: rows per program, channel tile and warps; and the token-major output
storage the rows are written to."""

from __future__ import annotations

import functools

import torch

from dsrope.interpreter import INTERPRET


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache  # once per geometry: a decode call is dominated by host time (docs/performance.md)
def tile_config(dim: int, elements: int, warps: int = 1) -> dict:
    """Rows per program (M), channel tile (BLOCK) and warps for a kernel walking rows of `dim`.

    The interpreter pays per program: big blocks on CPU. On the H200 small programs won
    (tools/sweep.py, docs/records/2026-12-02-h200-benchmark.md): `elements` per program and `warps`,
    1024 x 1 warp for partial
    RoPE, 2048 x 1 for the QNorm forward (1024 on a channel-contiguous x: qnorm_rope.forward_config),
    1024 x 2 for its backward. The dict is shared between
    calls: read it, never change it.
    """
    block = next_pow2(dim)
    if INTERPRET:
        return dict(M=max(1, min(64, (1 << 16) // block)), BLOCK=block)
    return dict(M=max(1, elements // block), BLOCK=block, num_warps=warps if block <= 1024 else max(warps, 4))


def token_major_empty(x: torch.Tensor) -> torch.Tensor:
    """A fresh [B, H, S, D] tensor in contiguous [B, S, H, D] storage (torch's contiguous strides of
    [B, S, H, D], transposed). One allocation call: torch.empty(...).transpose(1, 2) took 3x the
    host time (docs/records/2026-12-03-h200-decode-and-host-time.md)."""
    b, h, s, d = x.shape
    stride_h = max(d, 1)
    stride_s = max(h, 1) * stride_h
    return x.new_empty_strided((b, h, s, d), (max(s, 1) * stride_s, stride_h, stride_s, 1))
