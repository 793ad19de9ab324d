"""The kernels' tiles on CUDA: use it when a kernel or a launcher's tile changes, or on a new GPU, to choose
rows per program (M) and warps (the launchers' tile_config calls and the decode tiles of rope.py and
qnorm_rope.py take the winners; bits do not depend on the tile except where a launcher says so).

Times every config of each kernel on a token-major and a head-major input at a small and a large DSV4 shape:
one line per config (median time, GB/s, share of the copy bandwidth measured in the same run, registers
and spills), the best config per (kernel, shape, layout), the rows as CSV. Every config is compiled first
in parallel worker processes (they fill Triton's cache), so the timing process only loads kernels. With
--decode, also the decode rows under CUDA graph replay (us per call beside a copy_ of the same bytes) and
the launcher's own tile at each.

    python -m tools.sweep --out out/sweep
    python -m tools.sweep --kernels rope qnorm_fwd --decode        # also the decode rows (graph replay)
    python -m tools.sweep --kernels rope_inplace --decode-only     # the decode rows alone
    python -m tools.sweep --one qnorm_bwd token_major 8 1          # 3 launches of one config, for ncu
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
import multiprocessing
import statistics
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from dsrope import qnorm_rope, rope
from dsrope.pair_rotation import UNFUSED
from dsrope_dev.timing import (
    DECODE_SHAPES,
    D,
    R,
    copy_bandwidth,
    decode_inputs,
    inplace_copy,
    per_replayed_call_us,
    settle_graph_replay,
)

EPS = 1e-6
SHAPES = [(1, 64, 4096), (1, 128, 16384)]
LAYOUTS = ("token_major", "head_major")
KERNELS = ("rope", "qnorm_fwd", "qnorm_bwd", "rope_inplace")
CONFIGS = [
    dict(M=m, num_warps=w)
    for m, w in itertools.product((1, 2, 4, 8, 16), (1, 2, 4))
    if m * D // (32 * w) >= 8  # at least 8 elements per thread
]
# in place: a tile of R = 64 lanes per row, hence more rows per program
INPLACE_CONFIGS = [
    dict(M=m, GROUP=g, num_warps=w)
    for m, g, w in itertools.product((8, 16, 32), (1, 2, 4, 16), (2, 4, 8))
    if 4 <= m * R // (32 * w) <= 64 and g <= m  # 4 to 64 elements per thread
]
# decode (S = 1, B * H rows): fewer rows per program, timed under CUDA graph replay
DECODE_CONFIGS = [dict(M=m, num_warps=w) for m, w in itertools.product((2, 4, 8, 16, 32), (1, 2, 4)) if m * R >= 32 * w]


def tensors(b, h, s, layout):
    shape = (b, s, h, D) if layout == "token_major" else (b, h, s, D)
    make = lambda: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    x, g = make(), make()
    if layout == "token_major":
        x, g = x.transpose(1, 2), g.transpose(1, 2)
    ang = torch.rand(1, s, R, device="cuda").expand(b, s, R)
    out = torch.empty(b, s, h, D, device="cuda", dtype=torch.bfloat16)
    rstd = torch.empty(b * s * h, device="cuda", dtype=torch.float32)
    return x, g, torch.cos(ang), torch.sin(ang), out, rstd


def launch(kernel, t, config):
    """(bytes that must move, a function launching one config of `kernel` on tensors t)."""
    x, g, cos, sin, out, rstd = t
    b, h, s, _ = x.shape
    rows = b * h * s
    n = x.numel() * 2
    grid = (triton.cdiv(rows, config["M"]),)
    geometry = (rows, s, h, D, R)
    tables = (*cos.stride(), *sin.stride())
    kw = dict(config, BLOCK=D, **UNFUSED)  # the launchers' launch options: timed as they run
    if kernel == "rope":
        return 2 * n, lambda: rope._rotate[grid](x, cos, sin, out, *geometry, *x.stride(), *tables, INVERSE=False, **kw)
    if kernel == "rope_split":  # the decode form (rope.rotate_config)
        return 2 * n, lambda: rope._rotate_split[grid](
            x, cos, sin, out, *geometry, *x.stride(), *tables, INVERSE=False, **dict(kw, RBLOCK=R)
        )
    if kernel == "rope_inplace":  # x rotated again on every call: only the R rotary channels move
        group = config.get("GROUP", min(config["M"], triton.next_power_of_2(h)))
        config = dict(config, GROUP=group, BLOCK=R, **UNFUSED)
        return 2 * rows * R * 2, lambda: rope._rotate_inplace[rope.inplace_grid(config, h, b * s)](
            x, cos, sin, b * s, s, h, D, R, *x.stride(), *tables, **config
        )
    if kernel == "qnorm_fwd":
        chunk = qnorm_rope.row_chunk(D, x.element_size(), config["num_warps"])
        kw = dict(kw, RBLOCK=R, CHUNK=chunk, STORE_RSTD=rstd is not None)  # rstd None: the call without autograd
        return 2 * n + (0 if rstd is None else rows * 4), lambda: qnorm_rope._qnorm_rope[grid](
            x, cos, sin, out, rstd, *geometry, *x.stride(), *tables, EPS=EPS, **kw
        )
    return 3 * n + rows * 4, lambda: qnorm_rope._qnorm_rope_backward[grid](
        x, g, cos, sin, rstd, out, *geometry, *x.stride(), *g.stride(), *tables, **kw
    )


KERNEL_CHOICE = list(KERNELS)  # --kernels


# the QNorm forward: whole rows on each warp (M a multiple of the warps), so every tile has the row sums' bits
QNORM_CONFIGS = [c for c in CONFIGS if c["M"] % c["num_warps"] == 0]
QNORM_DECODE_CONFIGS = [dict(M=m, num_warps=1) for m in (1, 2, 4, 8)]
QNORM_DECODE_CONFIGS += [dict(M=w * k, num_warps=w) for w in (2, 4, 8) for k in (1, 2, 4)]


def jobs():
    for kernel in KERNEL_CHOICE:
        configs = {"rope_inplace": INPLACE_CONFIGS, "qnorm_fwd": QNORM_CONFIGS}.get(kernel, CONFIGS)
        for config in configs:
            yield kernel, config


def slice_ceiling(t):
    """(bytes, a torch call moving the in-place kernel's bytes: x's rotary slice read and written in place)."""
    x = t[0]
    b, h, s, _ = x.shape
    rotary = x[..., D - R :]
    return 2 * b * h * s * R * 2, lambda: rotary.mul_(1.0)


def decode():
    """The decode sweeps of the kernels chosen (--kernels): rope, qnorm_fwd and rope_inplace."""
    settle_graph_replay()
    if "rope" in KERNEL_CHOICE:
        decode_rope()
    if "qnorm_fwd" in KERNEL_CHOICE:
        decode_qnorm()
    if "rope_inplace" in KERNEL_CHOICE:
        decode_inplace()


def decode_rope():
    """The out-of-place kernels at decode under CUDA graph replay (us per call): the split kernel at every config
    with M <= 8, the whole-row kernel at M = 1, 2 (one warp), the launcher (rope.rotate_config), and a copy_ of
    the same bytes."""
    for b, h in DECODE_SHAPES:
        x, cos, sin = decode_inputs(b, h)
        t = (x, None, cos, sin, torch.empty(b, 1, h, D, device="cuda", dtype=x.dtype), None)
        found = [(per_replayed_call_us(launch("rope_split", t, c)[1]), "split", c) for c in CONFIGS if c["M"] <= 8]
        whole = [dict(M=m, num_warps=1) for m in (1, 2)]
        found += [(per_replayed_call_us(launch("rope", t, c)[1]), "whole-row", c) for c in whole]
        y = torch.empty_like(x)
        copy = per_replayed_call_us(functools.partial(y.copy_, x))
        for us, version, c in sorted(found, key=lambda f: f[0]):
            print(f"decode rope B={b} H={h} {version} M={c['M']} warps={c['num_warps']} {us:.2f} us "
                  f"({us / copy:.2f} x copy_)", flush=True)  # fmt: skip
        kernel, launcher = rope.rotate_config(D, R, b * h)
        us = per_replayed_call_us(functools.partial(rope._launch, x, cos, sin, R, False))
        print(f"decode rope B={b} H={h} launcher {kernel.__name__} M={launcher['M']} warps={launcher['num_warps']}: "
              f"{us:.2f} us ({us / copy:.2f} x copy_), copy_ {copy:.2f} us", flush=True)  # fmt: skip


def decode_qnorm():
    """The QNorm forward at decode under CUDA graph replay (us per call): one warp at M = 1, 2, 4, 8 and whole
    rows on 2, 4 and 8 warps at 1, 2 and 4 rows a warp (QNORM_DECODE_CONFIGS: each row's sum the same bits at
    every one, tests/test_gpu.py::test_qnorm_rows_on_warps_keep_the_bits), the launcher (forward_config), and a
    copy_ of x's bytes."""
    for b, h in DECODE_SHAPES:
        x, cos, sin = decode_inputs(b, h)
        out = torch.empty(b, 1, h, D, device="cuda", dtype=x.dtype)
        t = (x, None, cos, sin, out, None)  # decode: the call without autograd, which stores no rstd
        found = [(per_replayed_call_us(launch("qnorm_fwd", t, c)[1]), "tile", c) for c in QNORM_DECODE_CONFIGS]
        y = torch.empty_like(x)
        copy = per_replayed_call_us(functools.partial(y.copy_, x))
        for us, version, c in sorted(found, key=lambda f: f[0]):
            print(f"decode qnorm B={b} H={h} {version} M={c['M']} warps={c['num_warps']} {us:.2f} us "
                  f"({us / copy:.2f} x copy_)", flush=True)  # fmt: skip
        launcher = qnorm_rope.forward_config(x)
        us = per_replayed_call_us(functools.partial(qnorm_rope._forward, x, cos, sin, R, EPS, with_rstd=False))
        print(f"decode qnorm B={b} H={h} launcher M={launcher['M']} warps={launcher['num_warps']}: {us:.2f} us "
              f"({us / copy:.2f} x copy_), copy_ {copy:.2f} us", flush=True)  # fmt: skip


def decode_inplace():
    """The in-place kernel's decode tiles under CUDA graph replay (us per call): rows per program, warps and
    GROUP (heads of one token side by side; M // GROUP tokens a tile) at every tile that the shape's tokens
    fill from B = 8 up (inplace_groups), the launcher (rope.inplace_config) and a torch mul_ of the rotary
    slice and a `copy_` of the kernel's bytes (B*H*R contiguous elements, the bench's in-place reference).
    INPLACE_ROUNDS rounds, each timing every tile once in turn, so that a drift of the device reaches all
    tiles alike; the median of the rounds is printed, the rounds' spread beside it."""
    for b, h in DECODE_SHAPES:
        x, cos, sin = decode_inputs(b, h)
        t = (x, None, cos, sin, None, None)
        configs = [dict(c, GROUP=g) for c in DECODE_CONFIGS for g in inplace_groups(c["M"], b, h)]
        launcher = rope.inplace_config(R, h, b, 1)
        calls = [launch("rope_inplace", t, c)[1] for c in configs]
        calls.append(functools.partial(rope._launch_inplace, x, cos, sin, R))
        rounds = [[per_replayed_call_us(call) for call in calls] for _ in range(INPLACE_ROUNDS)]
        times = [sorted(r[i] for r in rounds) for i in range(len(calls))]
        order = sorted(range(len(configs)), key=lambda i: statistics.median(times[i]))
        spread = [f"{statistics.median(us):.2f} us ({us[0]:.2f}-{us[-1]:.2f})" for us in times]
        for i in order:
            c = configs[i]
            print(f"decode B={b} H={h} M={c['M']} GROUP={c['GROUP']} warps={c['num_warps']} {spread[i]}", flush=True)
        tile = f"M={launcher['M']} GROUP={launcher['GROUP']} warps={launcher.get('num_warps')}"
        print(f"decode B={b} H={h} launcher {tile}: {spread[-1]}", flush=True)
        ceiling = per_replayed_call_us(slice_ceiling(t)[1])
        copy = per_replayed_call_us(inplace_copy(x))
        print(f"decode B={b} H={h} torch slice mul_ {ceiling:.2f} us, copy_ {copy:.2f} us", flush=True)


INPLACE_ROUNDS = 3


def inplace_groups(m, b, h):
    """GROUP values of the decode sweep at M rows a program: every row of a tile a head of one token
    (GROUP = min(M, H rounded up to a power of two)), and from B = 8 up also fewer heads at more tokens,
    down to one head of M tokens."""
    one_token = min(m, triton.next_power_of_2(h))
    if b < 8:
        return [one_token]
    return [g for g in (1, 2, 4, 8, 16, 32) if g <= one_token and b >= m // g]


def compile_some(args):
    """Worker: launch each of its configs once on a small tensor set (fills Triton's cache)."""
    part, parts, kernels = args
    KERNEL_CHOICE[:] = kernels
    for layout in LAYOUTS:
        t = tensors(1, 64, 256, layout)
        for i, (kernel, config) in enumerate(jobs()):
            if i % parts == part:
                launch(kernel, t, config)[1]()
    torch.cuda.synchronize()
    return part


def main():
    parser = argparse.ArgumentParser(prog="python -m tools.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out/sweep")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    decode_help = "rope, qnorm_fwd and rope_inplace at decode shapes (graph replay)"
    parser.add_argument("--decode", action="store_true", help=decode_help)
    parser.add_argument("--decode-only", action="store_true", help="the decode rows alone (no prefill sweep)")
    parser.add_argument("--one", nargs=4, metavar=("KERNEL", "LAYOUT", "M", "WARPS"))
    args = parser.parse_args()
    KERNEL_CHOICE[:] = args.kernels
    if args.one:
        kernel, layout, m, warps = args.one
        t = tensors(*SHAPES[-1], layout)
        fn = launch(kernel, t, dict(M=int(m), num_warps=int(warps)))[1]
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return
    if args.decode_only:
        decode()
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        pool.map(compile_some, [(p, args.workers, args.kernels) for p in range(args.workers)])
    print("compiled", flush=True)

    copy = copy_bandwidth()  # the bench's, so that "of copy" means the same in the sweep and in the bench
    print(f"copy {copy / 1e9:.0f} GB/s", flush=True)
    rows = []
    for (b, h, s), layout in itertools.product(SHAPES, LAYOUTS):
        t = tensors(b, h, s, layout)
        for kernel, config in jobs():
            nbytes, fn = launch(kernel, t, config)
            compiled = fn()
            ms = do_bench(fn, warmup=25, rep=60, return_mode="median")
            row = dict(
                kernel=kernel,
                B=b,
                H=h,
                S=s,
                layout=layout,
                M=config["M"],
                group=config.get("GROUP", ""),
                warps=config["num_warps"],
                ms=round(ms, 4),
                gbs=round(nbytes / ms / 1e6),
                of_copy=round(nbytes / ms / 1e-3 / copy, 3),
                regs=getattr(compiled, "n_regs", ""),
                spills=getattr(compiled, "n_spills", ""),
            )
            rows.append(row)
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if "rope_inplace" in KERNEL_CHOICE:
            nbytes, fn = slice_ceiling(t)
            ms = do_bench(fn, warmup=25, rep=60, return_mode="median")
            share = nbytes / ms / 1e-3 / copy
            print(f"torch slice mul_ (the in-place bytes) {b}x{h}x{s} {layout}: {ms:.4f} ms, of copy {share:.3f}")
        del t
        torch.cuda.empty_cache()
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if args.decode:
        decode()
    print("\nbest per kernel, shape, layout:")
    for key, group in itertools.groupby(
        sorted(rows, key=lambda r: (r["kernel"], r["B"], r["H"], r["S"], r["layout"])),
        key=lambda r: (r["kernel"], r["B"], r["H"], r["S"], r["layout"]),
    ):
        best = max(group, key=lambda r: r["of_copy"])
        print(key, f"best M={best['M']} warps={best['warps']} {best['of_copy']}")


if __name__ == "__main__":
    main()
