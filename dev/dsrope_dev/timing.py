"""The GPU timing the bench (bench/bench.py) and the tile sweep (tools/sweep.py) share, and their yardsticks:
the device's copy bandwidth, a copy in the QNorm forward's addressing (rows_copy), and decode calls timed
one by one or under CUDA graph replay.

Shapes are DeepSeek-V4's query head: D channels of which the trailing R are rotated.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from dsrope.qnorm_rope import forward_config

D, R = 512, 64
DECODE_SHAPES = [(b, h) for b in (1, 8, 64, 256) for h in (64, 128)]  # (B, H) of the decode rows, S = 1
DECODE_CALLS, DECODE_REPLAYS, DECODE_SAMPLES = 200, 20, 5


def copy_bandwidth():
    x = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda").normal_()  # 4 GiB, far above L2
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return 2 * (1 << 31) * 2 / (ms * 1e-3)


@triton.jit
def _rows_copy(x, out, rows, S, H: tl.constexpr, D: tl.constexpr, XB, XH, XS, M: tl.constexpr):
    """The QNorm forward's addressing with nothing between load and store: M token-major rows a program, each
    read from x's layout (channels contiguous) and stored token-major. D a power of two."""
    row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
    token = row // H
    ok = (row < rows)[:, None]
    c = tl.arange(0, D).to(tl.int64)[None, :]
    v = tl.load(x + ((token // S) * XB + (row % H) * XH + (token % S) * XS)[:, None] + c, mask=ok)
    tl.store(out + (row * D)[:, None] + c, v, mask=ok)


def rows_copy(x, out):
    """x [B, H, S, D] (channels contiguous) copied into out's token-major rows by _rows_copy at the QNorm
    forward's tile for x (its M rows a program and warps): the yardstick of a prefill forward row, what a copy
    reaches when it reads x's layout and writes token-major rows as the forward must (docs/records/*-tuning.md)."""
    b, h, s, d = x.shape
    rows = b * h * s
    config = forward_config(x)
    grid = (triton.cdiv(rows, config["M"]),)
    _rows_copy[grid](x, out, rows, s, h, d, x.stride(0), x.stride(1), x.stride(2), M=config["M"],
                     num_warps=config.get("num_warps", 1))  # fmt: skip


def decode_inputs(b, h):
    """x [B, H, 1, D] (a view of token-major storage, which at S=1 is also head-major contiguous),
    cos/sin [B, 1, R] with each sequence at its own position, as in a decode step."""
    x = torch.randn(b, 1, h, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    pos = torch.randint(0, 1 << 16, (b, 1, 1), device="cuda").float()
    inv = 10000.0 ** (-torch.arange(R // 2, device="cuda", dtype=torch.float32) * 2 / R)
    ang = torch.cat((pos * inv, pos * inv), -1)
    return x, torch.cos(ang), torch.sin(ang)


def per_call_us(fn):
    """Wall time of one call without CUDA graphs: DECODE_CALLS back-to-back calls between two
    synchronizes, host clock; the median of DECODE_SAMPLES."""
    samples = []
    for _ in range(DECODE_SAMPLES):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(DECODE_CALLS):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / DECODE_CALLS * 1e6)
    return statistics.median(samples)


def replayed_call_samples(fn) -> list[float]:
    """Wall times of one call under CUDA graph replay, us: DECODE_CALLS calls captured in one graph,
    DECODE_REPLAYS replays between two synchronizes (host clock), DECODE_SAMPLES such measurements."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (compiles, fills the caching allocator)
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(DECODE_CALLS):
            fn()
    graph.replay()
    samples = []
    for _ in range(DECODE_SAMPLES):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(DECODE_REPLAYS):
            graph.replay()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / (DECODE_REPLAYS * DECODE_CALLS) * 1e6)
    del graph
    return samples


def per_replayed_call_us(fn) -> float:
    """The median of replayed_call_samples."""
    return statistics.median(replayed_call_samples(fn))


def inplace_copy(x):
    """A `copy_` of the in-place kernel's bytes at decode x [B, H, 1, D]: B*H*R elements, contiguous (the
    reference of the in-place decode target)."""
    src = torch.randn(x.shape[0] * x.shape[1] * R, device=x.device, dtype=x.dtype)
    return functools.partial(torch.empty_like(src).copy_, src)


def settle_graph_replay() -> None:
    """Time one throwaway graph before the first row: a process's first replayed graph reads low
    (docs/records/*-tuning.md), so every row is timed after it, in the same state as its copy_."""
    x = torch.empty(1 << 20, device="cuda")
    replayed_call_samples(functools.partial(x.mul_, 1.0))
