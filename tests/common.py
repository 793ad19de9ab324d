"""Shared test inputs: device, frequency tables, values."""

from __future__ import annotations

import torch

from tests.layouts import Layout, materialize

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def tables(batch: int, seq: int, rotary: int, seed: int = 0, expand_batch: bool = True, theta: float = 10000.0):
    """cos, sin FP32 [B, S, R]: entries k < R/2 are pair k's, the rest NaN (the kernels must not read them).

    With expand_batch the batch dim has stride 0, the common production case.
    """
    g = gen(seed)
    half = rotary // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / max(rotary, 1))
    pos = torch.randint(0, 1 << 16, (1 if expand_batch else batch, seq, 1), generator=g).double()
    ang = pos * inv
    nan = torch.full(ang.shape, float("nan"), dtype=torch.float64)
    cos = torch.cat((torch.cos(ang), nan), -1).float().to(DEVICE)
    sin = torch.cat((torch.sin(ang), nan), -1).float().to(DEVICE)
    if expand_batch:
        cos, sin = cos.expand(batch, seq, rotary), sin.expand(batch, seq, rotary)
    return cos, sin


def values(shape, dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = gen(seed)
    v = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return v.to(dtype)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of t as integers of its width (on the CPU), for bit-for-bit comparisons."""
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().cpu().contiguous().view(ints)


def laid_out(shape, dtype, layout: Layout, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return materialize(values(shape, dtype, seed, scale).to(DEVICE), layout)
