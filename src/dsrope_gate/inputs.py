"""Inputs for judging a kernel: the device, the one maker of cos/sin tables, values."""

from __future__ import annotations

import torch

from dsrope_gate.layouts import Layout, materialize

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def angles(positions: torch.Tensor, rotary: int, theta: float = 10000.0):
    """FP64 cos, sin of position * theta**(-2k/R) for the R/2 pairs k (positions [..., 1] -> [..., R/2])."""
    inv = theta ** (-torch.arange(rotary // 2, dtype=torch.float64) * 2 / max(rotary, 1))
    ang = positions.double() * inv
    return torch.cos(ang), torch.sin(ang)


def tables(
    batch: int,
    seq: int,
    rotary: int,
    seed: int | torch.Generator = 0,
    per_batch: bool = False,
    theta: float = 10000.0,
    device=None,
):
    """cos, sin FP32 [B, S, R] as the kernels take them: entries k < R/2 are pair k's (positions < 2**16
    drawn from `seed`, a seed or a generator), the rest NaN (a kernel must not read them).

    Without per_batch every batch shares one table and the batch dim has stride 0 (`expand`, the common
    production case); with it each batch draws its own positions. `device` defaults to DEVICE.
    """
    g = gen(seed) if isinstance(seed, int) else seed
    pos = torch.randint(0, 1 << 16, (batch if per_batch else 1, seq, 1), generator=g)
    c, s = angles(pos, rotary, theta)
    nan = torch.full(c.shape, float("nan"), dtype=torch.float64)
    device = DEVICE if device is None else device
    cos = torch.cat((c, nan), -1).float().to(device)
    sin = torch.cat((s, nan), -1).float().to(device)
    return cos.expand(batch, seq, rotary), sin.expand(batch, seq, rotary)


def values(shape, dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = gen(seed)
    v = torch.randn(shape, generator=g, dtype=torch.float64) * scale
    return v.to(dtype)


def laid_out(shape, dtype, layout: Layout, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return materialize(values(shape, dtype, seed, scale).to(DEVICE), layout)
