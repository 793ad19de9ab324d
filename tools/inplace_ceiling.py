"""What bounds the in-place partial RoPE on CUDA (issue 27): its access pattern or its kernel.

The in-place kernel moves R = 64 bf16 channels (128 bytes) out of every D = 512-channel row (1 KiB).
This times, on the same shapes and in the same run:
- the kernel (`rope._rotate_inplace`) at the launcher's config and at a few others;
- `_move_rotary`, below: the same tile and addressing, each row's rotary slice loaded and stored back
  unchanged (no tables, no arithmetic), optionally with cache hints or as a persistent loop: the
  memory system's answer for this access pattern without any of the kernel's work;
- both on a tensor with D = R (the same bytes, contiguous): the answer without the 1 KiB row stride;
- torch's copy_ of the same number of bytes, contiguous (copy bandwidth at this size, not at 4 GiB).
Shares are of the benchmark's copy bandwidth (bench.bench.copy_bandwidth, 4 GiB), as in the bench.

    python -m tools.inplace_ceiling
    ncu --metrics ... -k regex:_rotate_inplace python -m tools.inplace_ceiling --ncu   # one launch per layout

--ncu: the launcher (apply_partial_rope_triton_) once on a token-major 1x128x16384 x (D = 512) and once on
the same bytes contiguous (D = R), for Nsight Compute's DRAM counters: the bytes each launch really
moves and its share of the DRAM's peak.
"""

from __future__ import annotations

import itertools
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from dsrope import rope

D, R = 512, 64
SHAPES = [(1, 64, 4096), (1, 128, 16384), (4, 128, 4096)]


@triton.jit
def _move_rotary(
    x, rows, SEQUENCE,
    HEADS: tl.constexpr, DIM: tl.constexpr, ROTARY: tl.constexpr,
    XB, XH, XS, XD,
    M: tl.constexpr, BLOCK: tl.constexpr, HINTS: tl.constexpr, PROGRAMS: tl.constexpr, ADJACENT: tl.constexpr,
):  # fmt: skip
    """Each row's trailing ROTARY channels loaded and stored back, addressed as _rotate_inplace does.
    PROGRAMS > 0: a persistent loop of PROGRAMS programs over the tiles. HINTS: evict-first loads and
    streaming stores. ADJACENT > 0: a tile is ADJACENT neighbouring heads at M // ADJACENT positions
    (HEADS % ADJACENT == 0 assumed) instead of M consecutive token-major rows."""
    tiles = tl.cdiv(rows, M)
    start = tl.program_id(0)
    if PROGRAMS > 0:
        step = PROGRAMS
    else:
        step = tiles
    for tile in tl.range(start, tiles, step):
        i = tl.arange(0, M)
        if ADJACENT > 0:
            head_block = tile % (HEADS // ADJACENT)
            token_block = tile // (HEADS // ADJACENT)
            token = token_block * (M // ADJACENT) + i // ADJACENT
            row = (token * HEADS + head_block * ADJACENT + i % ADJACENT).to(tl.int64)
        else:
            row = (tile * M + i).to(tl.int64)  # rows < 2**31 here
        head = row % HEADS
        position = (row // HEADS) % SEQUENCE
        batch = row // (HEADS * SEQUENCE)
        x_row = x + (batch * XB + position * XS + head * XH)[:, None]
        lane = tl.arange(0, BLOCK).to(tl.int64)[None, :]
        lane_ok = (row < rows)[:, None] & (lane < ROTARY)
        at = x_row + (lane + (DIM - ROTARY)) * XD
        if HINTS:
            v = tl.load(at, mask=lane_ok, eviction_policy="evict_first")
            tl.store(at, v, mask=lane_ok, cache_modifier=".cs")
        else:
            v = tl.load(at, mask=lane_ok)
            tl.store(at, v, mask=lane_ok)


def inputs(b, h, s, dim):
    x = torch.randn(b, s, h, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # token-major
    ang = torch.rand(1, s, R, device="cuda").expand(b, s, R)
    return x, torch.cos(ang), torch.sin(ang)


def kernel_call(x, cos, sin, m, warps):
    """The kernel on M consecutive token-major rows a program (every head of a token in a tile, as the
    load+store kernel below walks them)."""
    b, h, s, dim = x.shape
    config = dict(M=m, GROUP=min(m, triton.next_power_of_2(h)), BLOCK=R, num_warps=warps)
    return lambda: rope._rotate_inplace[rope.inplace_grid(config, h, b * s)](
        x, cos, sin, b * s, s, h, dim, R, *x.stride(), *cos.stride(), *sin.stride(), **config
    )


def move_call(x, m, warps, hints=False, programs=0, adjacent=0):
    b, h, s, dim = x.shape
    rows = b * h * s
    grid = (programs if programs else triton.cdiv(rows, m),)
    return lambda: _move_rotary[grid](
        x,
        rows,
        s,
        h,
        dim,
        R,
        *x.stride(),
        M=m,
        BLOCK=R,
        HINTS=hints,
        PROGRAMS=programs,
        ADJACENT=adjacent,
        num_warps=warps,
    )


def ncu_launches():
    from dsrope import apply_partial_rope_triton_

    for dim in (D, R):
        x, cos, sin = inputs(1, 128, 16384, dim)
        apply_partial_rope_triton_(x, cos, sin, R)
        torch.cuda.synchronize()
        print(f"launched: 1x128x16384, D = {dim}, {2 * x.numel() // dim * R * 2} bytes to move", flush=True)


def main():
    if "--ncu" in sys.argv:
        return ncu_launches()
    from bench.bench import copy_bandwidth

    copy = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy_ 4 GiB: {copy / 1e9:.0f} GB/s; {sms} SMs")  # fmt: skip
    print("| shape | what | ms | of copy |\n|---|---|---|---|")
    for b, h, s in SHAPES:
        moved = 2 * b * h * s * R * 2

        def row(what, fn, shape=f"{b}x{h}x{s}", nbytes=moved):
            ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
            print(f"| {shape} | {what} | {ms:.4f} | {nbytes / (ms * 1e-3) / copy:.3f} |", flush=True)

        x, cos, sin = inputs(b, h, s, D)
        for m, w in itertools.product((16, 32), (1, 2, 4)):
            row(f"kernel M={m} warps={w}", kernel_call(x, cos, sin, m, w))
        for m, w in ((16, 2), (16, 4), (32, 4)):
            row(f"load+store only M={m} warps={w}", move_call(x, m, w))
            row(f"load+store only M={m} warps={w}, streaming hints", move_call(x, m, w, hints=True))
        for adjacent in (2, 4):
            row(
                f"load+store only M=16 warps=4, {adjacent} heads x {16 // adjacent} positions",
                move_call(x, 16, 4, adjacent=adjacent),
            )
        for k in (2, 4, 8):
            row(f"load+store only M=16 warps=4, persistent {k} x {sms}", move_call(x, 16, 4, programs=k * sms))
        del x
        x, cos, sin = inputs(b, h, s, R)  # D = R: the same bytes, contiguous
        row("kernel M=16 warps=2, D = R (contiguous)", kernel_call(x, cos, sin, 16, 2))
        row("load+store only M=16 warps=4, D = R (contiguous)", move_call(x, 16, 4))
        flat = x.reshape(-1)
        other = torch.empty_like(flat)
        row("torch copy_ of the same bytes (contiguous)", lambda other=other, flat=flat: other.copy_(flat))
        del x, flat, other
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
