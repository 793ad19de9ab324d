"""What bounds qnorm_rope and partial RoPE at decode (issue 36, step 1): a copy, the kernels, and kernels
that do only part of their work, all timed as the bench times decode (CUDA graph replay).

Decode: S = 1, x [B, H, 1, D] bf16 (a view of token-major storage), D = 512, R = 64, cos/sin [B, 1, R] with
each sequence at its own position (bench.bench.decode_inputs, rebuilt here), B in {1, 8, 64, 256},
H in {64, 128}. Every call is timed under CUDA graph replay as bench.bench.per_replayed_call_us does it:
DECODE_CALLS calls captured in one graph, DECODE_REPLAYS replays between two synchronizes (host clock), the
median of DECODE_SAMPLES such measurements, us per call. Per shape, in one run:

- `copy_` of x's bytes (the bench's yardstick) and of the in-place kernel's bytes (B*H*R, contiguous);
  a Triton flat copy of x's bytes (one kernel node, large tiles);
- dsrope's public calls: qnorm_rope_triton, apply_partial_rope_triton, apply_partial_rope_triton_;
- `_stage`, below, at the QNorm launcher's grid and tile (tile_config(D, 2048): M rows a program, BLOCK,
  warps), a ladder of kernels that each add one part of the QNorm forward:
    empty      the same grid doing nothing (the cost of a kernel node with this grid)
    ld/st      each row loaded and stored to token-major out (a copy in the kernel's tiling)
    +reduce    the row's sum of squares, rsqrt, y = x * rstd rounded to bf16 stored
    +pair      the rotation as dsrope does it: partner and cos/sin loaded per lane after the reduction
    +rstd      rstd stored: the QNorm forward's whole function (dsrope's arithmetic, its own kernel)
  and beside the ladder: +rstd without the rotation, the rotation without the reduction (partial
  RoPE's work), the partner from registers (swap_pairs) instead of a second load, the rotation's
  loads issued before the reduction (EARLY), and the split form (ROPE 3: the rotary slice on its own
  [M, R] tile, loaded before the reduction, partner from registers, one table load per pair); the
  ladder again at one warp and M = 1, 2 (LADDER_TILES);
- grid shape: `empty` and `ld/st` at M in {1..16} x warps in {1, 2, 4}; dsrope's own `_qnorm_rope` at
  M in {1, 2, 4, 8} x warps {1, 2, 4}; the full-function `_stage` (partner from registers, loads early)
  at M in {1, 2, 4} x warps {1, 2, 4}; the split form at M in {1, 2, 4, 8} x warps {1, 2, 4};
- partial RoPE: empty / ld/st / rotation-only / split rotation-only `_stage` at the out-of-place
  launcher's tile (spread_rows); dsrope's `_rotate` at M in {1, 2, 4} x warps {1, 2, 4}; the split
  rotation-only `_stage` at M in {1, 2, 4}, one warp; `_slice_stage` (each row's rotary slice loaded and
  stored back, the in-place launcher's tile and addressing) and its empty form.

docs/decode.md has the H200 results (2026-12-04) and what they say.

Bits: for every variant that computes the QNorm forward's whole function, whether its out and rstd equal
the shipped launch's bit for bit on this run's input (informational: one random input per shape).

    python -m tools.decode_ceiling --out DIR            # on CUDA: decode_ceiling.csv, decode_ceiling.md
    python -m tools.decode_ceiling --ncu                # one launch of each representative kernel, for ncu
    python -m tools.decode_ceiling --prefill --out DIR  # on CUDA: prefill_ceiling.csv, prefill_ceiling.md
    TRITON_INTERPRET=1 python -m tools.decode_ceiling --check   # CPU: every variant runs, ceilings correct

Prefill (--prefill): the bench's smallest prefill row, 1 x 64 x 4096, and 1 x 128 x 16384, each layout: a
`copy_` of x's bytes, the ld/st `_stage` (a copy in the QNorm forward's tiling and addressing) at several tiles,
and the two public forwards, timed as the bench times a prefill forward: what a copy can reach when it reads
head-major x and writes token-major rows, as the forward must.

Imports torch, triton and dsrope only (no bench, no dsrope_gate): the constants and the timing method are
the bench's, repeated here.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import itertools
import multiprocessing
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from bench.bench import DECODE_CALLS, DECODE_REPLAYS, DECODE_SAMPLES, bytes_moved, copy_bandwidth, replayed_call_samples
from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, qnorm_rope_triton
from dsrope import qnorm_rope as qnorm_module
from dsrope import rope as rope_module
from dsrope.interpreter import INTERPRET
from dsrope.pair_rotation import pair_table, swap_pairs
from dsrope.tiles import next_pow2, tile_config

D, R, EPS = 512, 64, 1e-6  # bench.bench's
SHAPES = [(b, h) for b in (1, 8, 64, 256) for h in (64, 128)]  # bench.bench.DECODE_SHAPES
GRID_M, GRID_WARPS = (1, 2, 4, 8, 16), (1, 2, 4)
DSROPE_M, FULL_M = (1, 2, 4, 8), (1, 2, 4)


@triton.jit
def _stage(
    x, cos, sin, out, rstd, rows, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    EPS: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr,
    MOVE: tl.constexpr, REDUCE: tl.constexpr, ROPE: tl.constexpr, RSTD: tl.constexpr, EARLY: tl.constexpr,
    RBLOCK: tl.constexpr,
):  # fmt: skip
    """Part of the QNorm forward on M token-major rows a program, addressed as qnorm_rope._qnorm_rope.

    MOVE 0: nothing (an empty program). MOVE: load each row, store it to token-major out. REDUCE: rstd of
    the row, y = x * rstd rounded to out's dtype. ROPE 1: rotate the trailing R lanes with the partner
    from registers (swap_pairs); ROPE 2: partner and cos/sin loaded per lane as _qnorm_rope does; ROPE 3
    (split): the rotary slice as its own [M, RBLOCK] tile, loaded again (the same lines) before the
    reduction, partner from registers, one table load per pair (pair_table), stored apart from the
    D - R leading channels: the rotation's work on R lanes, not on every lane of the row. RSTD: store
    rstd (needs REDUCE). EARLY: the rotation's loads issued before the reduction. D - R even.
    """
    if MOVE:
        row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)
        row_ok = row < rows
        h = row % H
        token = row // H
        s = token % S
        b = token // S
        c = tl.arange(0, BLOCK).to(tl.int64)[None, :]
        valid = row_ok[:, None] & (c < D)
        j = c - (D - R)
        rot = valid & (j >= 0)
        second = (j & 1) == 1
        partner = (j ^ 1) + (D - R)
        x_row = x + (b * XB + h * XH + s * XS)[:, None]
        dtype = out.dtype.element_ty
        v = tl.load(x_row + c * XD, mask=valid)
        if ROPE == 3:
            k = tl.arange(0, RBLOCK).to(tl.int64)[None, :]
            slice_ok = row_ok[:, None] & (k < R)
            xs = tl.load(x_row + (k + (D - R)) * XD, mask=slice_ok).to(tl.float32)
            cs = pair_table(cos, b * CB + s * CS, CD, row_ok, 0, R // 2, M, RBLOCK)
            sn = pair_table(sin, b * SB + s * SS, SD, row_ok, 0, R // 2, M, RBLOCK)
        elif ROPE > 0:
            if EARLY:
                cs = tl.load(cos + (b * CB + s * CS)[:, None] + (j // 2) * CD, mask=rot)
                sn = tl.load(sin + (b * SB + s * SS)[:, None] + (j // 2) * SD, mask=rot)
                if ROPE == 2:
                    p = tl.load(x_row + partner * XD, mask=rot).to(tl.float32)
        y = v
        if REDUCE:
            vf = v.to(tl.float32)
            r = tl.rsqrt(tl.sum(vf * vf, axis=1) / D + EPS)
            if RSTD:
                tl.store(rstd + row, r, mask=row_ok)
            y = (vf * r[:, None]).to(dtype)
        if ROPE == 3:
            if REDUCE:
                ys = (xs * r[:, None]).to(dtype).to(tl.float32)
            else:
                ys = xs
            mate = swap_pairs(ys, M, RBLOCK)
            rotated = ys * cs + tl.where((k & 1) == 1, mate, -mate) * sn
            tl.store(out + (row * D)[:, None] + (D - R) + k, rotated.to(dtype), mask=slice_ok)
            tl.store(out + (row * D)[:, None] + c, y, mask=valid & (c < D - R))
        elif ROPE > 0:
            if not EARLY:
                if ROPE == 2:
                    p = tl.load(x_row + partner * XD, mask=rot).to(tl.float32)
                cs = tl.load(cos + (b * CB + s * CS)[:, None] + (j // 2) * CD, mask=rot)
                sn = tl.load(sin + (b * SB + s * SS)[:, None] + (j // 2) * SD, mask=rot)
            if ROPE == 1:
                y_partner = swap_pairs(y.to(tl.float32), M, BLOCK)
            elif REDUCE:
                y_partner = (p * r[:, None]).to(dtype).to(tl.float32)
            else:
                y_partner = p
            rotated = y.to(tl.float32) * cs + tl.where(second, y_partner, -y_partner) * sn
            y = tl.where(rot, rotated.to(dtype), y)
        if ROPE != 3:
            tl.store(out + (row * D)[:, None] + c, y, mask=valid)


@triton.jit
def _slice_stage(
    x, cos, sin, tokens, S,
    H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    XB, XH, XS, XD, CB, CS, CD, SB, SS, SD,
    M: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr, MOVE: tl.constexpr,
):  # fmt: skip
    """Each row's trailing R channels loaded and stored back in place, with rope._rotate_inplace's tile
    (GROUP neighbouring heads at M // GROUP tokens) and addressing; MOVE 0: an empty program."""
    if MOVE:
        head_blocks: tl.constexpr = (H + GROUP - 1) // GROUP
        tile = tl.program_id(0)
        i = tl.arange(0, M)
        head = ((tile % head_blocks) * GROUP + i % GROUP).to(tl.int64)
        token = (tile // head_blocks).to(tl.int64) * (M // GROUP) + i // GROUP
        row_ok = (head < H) & (token < tokens)
        position = token % S
        batch = token // S
        x_row = x + (batch * XB + position * XS + head * XH)[:, None]
        lane = tl.arange(0, BLOCK).to(tl.int64)[None, :]
        ok = row_ok[:, None] & (lane < R)
        at = x_row + (lane + (D - R)) * XD
        tl.store(at, tl.load(at, mask=ok), mask=ok)


@triton.jit
def _flat_copy(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    tl.store(dst + i, tl.load(src + i, mask=ok), mask=ok)


# --- inputs and variants ----------------------------------------------------------------------------------


class Inputs(NamedTuple):
    x: torch.Tensor  # [B, H, 1, D], token-major storage
    cos: torch.Tensor
    sin: torch.Tensor
    out: torch.Tensor  # flat [B*H*D], token-major rows
    rstd: torch.Tensor
    x_inplace: torch.Tensor  # a second x for the in-place calls (they rotate it on every call)
    copy_dst: torch.Tensor
    slice_src: torch.Tensor  # B*H*R contiguous: the in-place kernel's bytes
    slice_dst: torch.Tensor
    flat_dst: torch.Tensor


def device():
    return torch.device("cpu" if INTERPRET else "cuda")


def make_inputs(b, h, seed=0):
    """bench.bench.decode_inputs: x [B, H, 1, D] token-major, cos/sin [B, 1, R] at per-sequence positions."""
    dev = device()
    g = torch.Generator(device=dev).manual_seed(seed + 1000 * b + h)
    x = torch.randn(b, 1, h, D, device=dev, dtype=torch.bfloat16, generator=g).transpose(1, 2)
    pos = torch.randint(0, 1 << 16, (b, 1, 1), device=dev, generator=g).float()
    inv = 10000.0 ** (-torch.arange(R // 2, device=dev, dtype=torch.float32) * 2 / R)
    ang = torch.cat((pos * inv, pos * inv), -1)
    x_inplace = x.clone(memory_format=torch.preserve_format)
    slice_src = torch.randn(b * h * R, device=dev, dtype=torch.bfloat16, generator=g)
    return Inputs(
        x=x,
        cos=torch.cos(ang),
        sin=torch.sin(ang),
        out=torch.full((b * h * D,), float("nan"), device=dev, dtype=torch.bfloat16),
        rstd=torch.full((b * h,), float("nan"), device=dev, dtype=torch.float32),
        x_inplace=x_inplace,
        copy_dst=torch.empty_like(x),
        slice_src=slice_src,
        slice_dst=torch.empty_like(slice_src),
        flat_dst=torch.empty(b * h * D, device=dev, dtype=torch.bfloat16),
    )


def qnorm_tile():
    """The QNorm forward launcher's tile when this tool was run (2026-12-04): tile_config(dim, 2048)."""
    config = tile_config(D, 2048)
    return config["M"], config.get("num_warps", 1)


def rope_tile(rows):
    """The out-of-place partial RoPE launcher's tile when this tool was run (2026-12-04, before rope.rotate_config):
    tile_config(dim, 1024) with fewer rows a program where the rows could not give every SM two programs."""
    config = tile_config(D, 1024)
    if not torch.cuda.is_available():  # --check in the interpreter: its tile as tile_config gives it
        return config["M"], 1
    m, per_program = config["M"], max(1, rows // (2 * torch.cuda.get_device_properties(0).multi_processor_count))
    while m > per_program:
        m //= 2
    return m, config.get("num_warps", 1)


LADDER = {  # name -> _stage flags
    "empty": dict(MOVE=0, REDUCE=0, ROPE=0, RSTD=0, EARLY=0),
    "ld/st": dict(MOVE=1, REDUCE=0, ROPE=0, RSTD=0, EARLY=0),
    "+reduce": dict(MOVE=1, REDUCE=1, ROPE=0, RSTD=0, EARLY=0),
    "+pair": dict(MOVE=1, REDUCE=1, ROPE=2, RSTD=0, EARLY=0),
    "+rstd": dict(MOVE=1, REDUCE=1, ROPE=2, RSTD=1, EARLY=0),
    "reduce+rstd, no pair": dict(MOVE=1, REDUCE=1, ROPE=0, RSTD=1, EARLY=0),
    "pair only, no reduce": dict(MOVE=1, REDUCE=0, ROPE=2, RSTD=0, EARLY=0),
    "full, partner in registers": dict(MOVE=1, REDUCE=1, ROPE=1, RSTD=1, EARLY=0),
    "full, loads early": dict(MOVE=1, REDUCE=1, ROPE=2, RSTD=1, EARLY=1),
    "full, registers + early": dict(MOVE=1, REDUCE=1, ROPE=1, RSTD=1, EARLY=1),
    "split, no rstd": dict(MOVE=1, REDUCE=1, ROPE=3, RSTD=0, EARLY=0),
    "full, split": dict(MOVE=1, REDUCE=1, ROPE=3, RSTD=1, EARLY=0),
    "split pair only, no reduce": dict(MOVE=1, REDUCE=0, ROPE=3, RSTD=0, EARLY=0),
}
FULL_FUNCTION = {"+rstd", "full, partner in registers", "full, loads early", "full, registers + early", "full, split"}
# the ladder again at the one-warp tiles the first run found faster (one warp: rstd kept its bits there)
LADDER_TILES = ((1, 1), (2, 1))
LADDER_AT_TILES = (
    "empty",
    "ld/st",
    "+reduce",
    "reduce+rstd, no pair",
    "+pair",
    "+rstd",
    "split, no rstd",
    "full, split",
)
SPLIT_M, ROPE_M = (1, 2, 4, 8), (1, 2, 4)


class Variant(NamedTuple):
    group: str  # reference, ours, ladder, grid, partial, inplace, repeat
    name: str
    kind: str  # copy_x, copy_slice, flat, op_qnorm, op_rope, op_rope_, stage, dsrope_qnorm, dsrope_rope, slice
    M: int = 0
    warps: int = 0
    flags: tuple = ()  # sorted (key, value) of _stage / _slice_stage flags

    @property
    def key(self):
        return (self.kind, self.M, self.warps, self.flags)


def stage_variant(group, name, m, warps, ladder):
    return Variant(group, name, "stage", m, warps, tuple(sorted(LADDER[ladder].items())))


def variants(b, h):
    """Every call timed at one decode shape, in timing order."""
    rows = b * h
    qm, qw = qnorm_tile()
    pm, pw = rope_tile(rows)
    inplace = rope_module.inplace_config(R, h, b, 1)
    group = (("GROUP", inplace["GROUP"]),)
    out = [
        Variant("reference", "copy_ (x bytes)", "copy_x"),
        Variant("reference", "copy_ (x bytes), second", "copy_x"),
        Variant("reference", "copy_ (in-place bytes, B*H*R)", "copy_slice"),
        Variant("reference", "triton flat copy (x bytes, 4096 x 4 warps)", "flat", 4096, 4),
        Variant("ours", "qnorm_rope_triton", "op_qnorm", qm, qw),
        Variant("ours", "apply_partial_rope_triton", "op_rope", pm, pw),
        Variant("ours", "apply_partial_rope_triton_", "op_rope_", inplace["M"], inplace.get("num_warps", 1), group),
        Variant("ours", "_qnorm_rope at the launcher's tile", "dsrope_qnorm", qm, qw),
    ]
    out += [stage_variant("ladder", name, qm, qw, name) for name in LADDER]
    for m, w in itertools.product(GRID_M, GRID_WARPS):
        out.append(stage_variant("grid", f"empty M={m} w={w}", m, w, "empty"))
        out.append(stage_variant("grid", f"ld/st M={m} w={w}", m, w, "ld/st"))
    for m, w in itertools.product(DSROPE_M, GRID_WARPS):
        out.append(Variant("grid", f"_qnorm_rope M={m} w={w}", "dsrope_qnorm", m, w))
    for m, w in itertools.product(FULL_M, GRID_WARPS):
        out.append(stage_variant("grid", f"full registers+early M={m} w={w}", m, w, "full, registers + early"))
    for m, w in LADDER_TILES:
        out += [stage_variant("ladder", f"{name} M={m} w={w}", m, w, name) for name in LADDER_AT_TILES]
    for m, w in itertools.product(SPLIT_M, GRID_WARPS):
        out.append(stage_variant("grid", f"full split M={m} w={w}", m, w, "full, split"))
    for name in ("empty", "ld/st", "pair only, no reduce", "split pair only, no reduce"):
        out.append(stage_variant("partial", f"{name} at the partial RoPE tile", pm, pw, name))
    for m, w in itertools.product(ROPE_M, GRID_WARPS):
        out.append(Variant("partial", f"_rotate M={m} w={w}", "dsrope_rope", m, w))
    for m in ROPE_M:
        out.append(stage_variant("partial", f"split pair only M={m} w=1", m, 1, "split pair only, no reduce"))
    for move in (0, 1):
        name = f"slice {'ld/st' if move else 'empty'} at the in-place tile"
        out.append(
            Variant("inplace", name, "slice", inplace["M"], inplace.get("num_warps", 1), (*group, ("MOVE", move)))
        )
    out += [
        Variant("repeat", "copy_ (x bytes), again", "copy_x"),
        Variant("repeat", "qnorm_rope_triton, again", "op_qnorm", qm, qw),
    ]
    return out


def make_call(v: Variant, t: Inputs):
    """(programs launched, a function making the call) for variant v on inputs t."""
    x = t.x
    b, h, s, d = x.shape
    rows = b * h * s
    tables = (*t.cos.stride(), *t.sin.stride())
    if v.kind == "copy_x":
        return None, functools.partial(t.copy_dst.copy_, x)
    if v.kind == "copy_slice":
        return None, functools.partial(t.slice_dst.copy_, t.slice_src)
    if v.kind == "flat":
        n = x.numel()
        grid = (triton.cdiv(n, v.M),)
        return grid[0], lambda: _flat_copy[grid](x, t.flat_dst, n, BLOCK=v.M, num_warps=v.warps)
    if v.kind == "op_qnorm":
        return triton.cdiv(rows, v.M), functools.partial(qnorm_rope_triton, x, t.cos, t.sin, R, EPS)
    if v.kind == "op_rope":
        return triton.cdiv(rows, v.M), functools.partial(apply_partial_rope_triton, x, t.cos, t.sin, R)
    if v.kind == "op_rope_":
        config = dict(M=v.M, **dict(v.flags))
        grid = rope_module.inplace_grid(config, h, b * s)[0]
        return grid, functools.partial(apply_partial_rope_triton_, t.x_inplace, t.cos, t.sin, R)
    if v.kind == "dsrope_qnorm":
        grid = (triton.cdiv(rows, v.M),)
        return grid[0], lambda: qnorm_module._qnorm_rope[grid](
            x, t.cos, t.sin, t.out, t.rstd, rows, s, h, d, R, *x.stride(), *tables,
            EPS=EPS, M=v.M, BLOCK=next_pow2(d), RBLOCK=R, num_warps=v.warps,
            CHUNK=qnorm_module.row_chunk(next_pow2(d), x.element_size(), v.warps),
        )  # fmt: skip
    if v.kind == "dsrope_rope":
        grid = (triton.cdiv(rows, v.M),)
        return grid[0], lambda: rope_module._rotate[grid](
            x, t.cos, t.sin, t.out, rows, s, h, d, R, *x.stride(), *tables,
            INVERSE=False, M=v.M, BLOCK=next_pow2(d), num_warps=v.warps,
        )  # fmt: skip
    if v.kind == "stage":
        grid = (triton.cdiv(rows, v.M),)
        return grid[0], lambda: _stage[grid](
            x, t.cos, t.sin, t.out, t.rstd, rows, s, h, d, R, *x.stride(), *tables,
            EPS=EPS, M=v.M, BLOCK=next_pow2(d), RBLOCK=next_pow2(R), num_warps=v.warps, **dict(v.flags),
        )  # fmt: skip
    if v.kind == "slice":
        config = dict(M=v.M, **dict(v.flags))
        grid = rope_module.inplace_grid(config, h, b * s)
        xi = t.x_inplace
        return grid[0], lambda: _slice_stage[grid](
            xi, t.cos, t.sin, b * s, s, h, d, R, *xi.stride(), *tables,
            BLOCK=R, num_warps=v.warps, **config,
        )  # fmt: skip
    raise ValueError(v.kind)


def storage_rows(out: torch.Tensor) -> torch.Tensor:
    """A [B, H, S, D] token-major output as its flat storage (token-major rows)."""
    return out.transpose(1, 2).reshape(-1)


def bits_equal(v: Variant, t: Inputs, ref_out: torch.Tensor, ref_rstd: torch.Tensor):
    """Whether v's out and rstd equal ref's bit for bit, on fresh NaN-filled buffers; '' when v does not
    compute the QNorm forward's whole function."""
    full = v.kind == "dsrope_qnorm" or (v.kind == "stage" and any(dict(v.flags) == LADDER[n] for n in FULL_FUNCTION))
    if not full:
        return ""
    fresh = t._replace(out=torch.full_like(t.out, float("nan")), rstd=torch.full_like(t.rstd, float("nan")))
    make_call(v, fresh)[1]()
    same_out = torch.equal(fresh.out.view(torch.int16), ref_out.view(torch.int16))
    same_rstd = torch.equal(fresh.rstd.view(torch.int32), ref_rstd.view(torch.int32))
    return f"out {'=' if same_out else '!='}, rstd {'=' if same_rstd else '!='}"


# --- timing: the bench's graph replay ------------------------------------------------------------------------


def per_replayed_call_us(fn):
    """(median, min, max) of the bench's graph-replay samples of one call, us."""
    samples = replayed_call_samples(fn)
    return statistics.median(samples), min(samples), max(samples)


def registers(fn):
    """(registers, spills) of the kernel fn launches, where it is a Triton launch returning its kernel."""
    compiled = fn()
    return getattr(compiled, "n_regs", ""), getattr(compiled, "n_spills", "")


# --- compile in parallel workers (fills Triton's cache), as tools/sweep.py does ------------------------


def compile_jobs():
    """(B, H, variant) for every Triton launch of the run, one per distinct specialization (H is a constexpr;
    the in-place kernels' `tokens` argument is specialized apart where it is 1, at B = 1)."""
    seen, jobs = set(), []
    for b, h in SHAPES:
        for v in variants(b, h):
            if v.kind in ("copy_x", "copy_slice"):
                continue
            key = (h, b == 1 and v.kind in ("slice", "op_rope_"), v.key)  # tokens: an int argument
            if key not in seen:
                seen.add(key)
                jobs.append((b, h, v))
    return jobs


def compile_some(args):
    part, parts = args
    cache = {}
    for i, (b, h, v) in enumerate(compile_jobs()):
        if i % parts == part:
            if (b, h) not in cache:
                cache[(b, h)] = make_inputs(b, h)
            make_call(v, cache[(b, h)])[1]()
    torch.cuda.synchronize()
    return part


# --- the run -----------------------------------------------------------------------------------------------


def environment():
    props = torch.cuda.get_device_properties(0)
    return (
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {torch.cuda.get_device_name()} "
        f"({props.multi_processor_count} SMs, {props.L2_cache_size // 2**20} MiB L2), torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), triton {triton.__version__}, python {platform.python_version()}; graph replay: "
        f"{DECODE_CALLS} calls x {DECODE_REPLAYS} replays, median of {DECODE_SAMPLES}"
    )


def run(out_dir: Path, shapes, workers: int):
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(compile_some, [(p, workers) for p in range(workers)])
    meta = environment()
    print(f"{meta}; compiled in {time.time() - start:.0f} s", flush=True)
    rows = []
    with torch.no_grad():
        for b, h in shapes:
            t = make_inputs(b, h)
            ref_out, ref_rstd = qnorm_module._forward(t.x, t.cos, t.sin, R, EPS)
            ref_out = storage_rows(ref_out)
            for v in variants(b, h):
                programs, fn = make_call(v, t)
                regs, spills = (
                    registers(fn) if v.kind in ("flat", "dsrope_qnorm", "dsrope_rope", "stage", "slice") else ("", "")
                )
                bits = bits_equal(v, t, ref_out, ref_rstd)
                us, lo, hi = per_replayed_call_us(fn)
                row = dict(B=b, H=h, group=v.group, name=v.name, M=v.M or "", warps=v.warps or "",
                           programs=programs or "", us=round(us, 3), us_min=round(lo, 3), us_max=round(hi, 3),
                           regs=regs, spills=spills, bits_vs_shipped=bits)  # fmt: skip
                rows.append(row)
                print(" ".join(f"{k}={val}" for k, val in row.items()), flush=True)
            del t
            torch.cuda.empty_cache()
    with open(out_dir / "decode_ceiling.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = markdown(rows, meta)
    (out_dir / "decode_ceiling.md").write_text(summary)
    print(summary)


def markdown(rows, meta):
    """One line per shape: the reference, ours, the ladder at the launcher's tile, the best grid points."""
    by_shape = {}
    for r in rows:
        by_shape.setdefault((r["B"], r["H"]), {})[r["name"]] = r
    names = ["copy_ (x bytes)", "triton flat copy (x bytes, 4096 x 4 warps)", "qnorm_rope_triton"]
    names += list(LADDER)
    lines = [f"Measured {meta}. us per call under graph replay.", ""]
    lines.append(
        "| B | H | "
        + " | ".join(names)
        + " | best ld/st | best _qnorm_rope | best full registers+early | best full split |"
    )
    lines.append("|" + "---|" * (len(names) + 6))
    for (b, h), got in by_shape.items():
        cells = [f"{got[n]['us']:.2f}" if n in got else "-" for n in names]

        def best(prefix, got=got):
            found = [r for n, r in got.items() if n.startswith(prefix)]
            r = min(found, key=lambda r: r["us"])
            return f"{r['us']:.2f} (M={r['M']} w={r['warps']})"

        lines.append(f"| {b} | {h} | " + " | ".join(cells) + f" | {best('ld/st M=')} | {best('_qnorm_rope M=')} | "
                     f"{best('full registers+early M=')} | {best('full split M=')} |")  # fmt: skip
    lines.append("")
    lines.append("| B | H | partial out of place | its ld/st | its empty | its rotation-only | copy_ x | in place | "
                 "slice ld/st | slice empty | copy_ in-place bytes |")  # fmt: skip
    lines.append("|" + "---|" * 11)
    for (b, h), got in by_shape.items():
        cells = [
            got[n]["us"]
            for n in (
                "apply_partial_rope_triton", "ld/st at the partial RoPE tile", "empty at the partial RoPE tile",
                "pair only, no reduce at the partial RoPE tile", "copy_ (x bytes)", "apply_partial_rope_triton_",
                "slice ld/st at the in-place tile", "slice empty at the in-place tile", "copy_ (in-place bytes, B*H*R)",
            )
        ]  # fmt: skip
        lines.append(f"| {b} | {h} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


# --- Nsight Compute: one launch of each representative kernel -----------------------------------------------

NCU_SHAPES = [(1, 64), (64, 64)]


def ncu_variants(b, h):
    qm, qw = qnorm_tile()
    pm, pw = rope_tile(b * h)
    return [
        Variant("ours", "qnorm_rope_triton", "op_qnorm", qm, qw),
        stage_variant("ladder", "empty", qm, qw, "empty"),
        stage_variant("ladder", "ld/st", qm, qw, "ld/st"),
        stage_variant("ladder", "+reduce", qm, qw, "+reduce"),
        stage_variant("ladder", "+pair", qm, qw, "+pair"),
        stage_variant("ladder", "full, split", qm, qw, "full, split"),
        Variant("grid", "_qnorm_rope M=1 w=1", "dsrope_qnorm", 1, 1),
        Variant("grid", "_qnorm_rope M=2 w=1", "dsrope_qnorm", 2, 1),
        stage_variant("grid", "ld/st M=1 w=1", 1, 1, "ld/st"),
        stage_variant("grid", "+reduce M=1 w=1", 1, 1, "+reduce"),
        stage_variant("grid", "full split M=1 w=1", 1, 1, "full, split"),
        stage_variant("grid", "full split M=2 w=1", 2, 1, "full, split"),
        Variant("ours", "apply_partial_rope_triton", "op_rope", pm, pw),
        stage_variant("partial", "split pair only at the partial RoPE tile", pm, pw, "split pair only, no reduce"),
        Variant("reference", "triton flat copy (x bytes, 4096 x 4 warps)", "flat", 4096, 4),
    ]


def ncu_launches():
    """Each representative kernel launched once per NCU_SHAPES (compiled first, so that only these launch);
    the order goes to stderr (ncu's IDs follow it)."""
    with torch.no_grad():
        prepared = []
        for b, h in NCU_SHAPES:
            t = make_inputs(b, h)
            for v in ncu_variants(b, h):
                prepared.append((b, h, v, t))
        kernels = {
            "op_qnorm": qnorm_module._qnorm_rope, "op_rope": rope_module._rotate, "stage": _stage,
            "dsrope_qnorm": qnorm_module._qnorm_rope, "flat": _flat_copy,
        }  # fmt: skip
        for _, _, v, t in prepared:  # compile without launching: warmup
            fn = make_call(v, t)[1]
            try:
                with _warmup_only(kernels[v.kind]):
                    fn()
            except Exception as e:  # then it launches once more: ncu's IDs count it
                print(f"warm-up launched {v.name}: {type(e).__name__}: {e}"[:300], file=sys.stderr, flush=True)
                fn()
        torch.cuda.synchronize()
        for i, (b, h, v, t) in enumerate(prepared):
            programs, fn = make_call(v, t)
            fn()
            torch.cuda.synchronize()
            print(f"launch {i}: B={b} H={h} {v.name} M={v.M} warps={v.warps} programs={programs}",
                  file=sys.stderr, flush=True)  # fmt: skip


class _warmup_only:
    """Within: the Triton kernel's launches compile and do not launch (JITFunction.run with warmup=True)."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __enter__(self):
        run = self.kernel.run
        self.saved = run
        self.kernel.run = lambda *a, warmup=False, **k: run(*a, warmup=True, **k)

    def __exit__(self, *exc):
        self.kernel.run = self.saved


# --- prefill: what bounds the forward at the bench's smallest head-major row (issue 36) ---------------------

PREFILL_SHAPES = [(1, 64, 4096), (1, 128, 16384)]  # bench.bench.SHAPES' smallest; a large one beside it
PREFILL_TILES = ((2, 2), (4, 4), (8, 8), (16, 8), (16, 16))  # (M rows a program, warps); (8, 8): the launcher's
PREFILL_ROUNDS = 3


def prefill_inputs(b, h, s, layout):
    """bench.bench.make_inputs' x, cos, sin (on this tool's device), with the buffers the variants write."""
    dev = device()
    if layout == "token_major":
        x = torch.randn(b, s, h, D, device=dev, dtype=torch.bfloat16).transpose(1, 2)
    else:
        x = torch.randn(b, h, s, D, device=dev, dtype=torch.bfloat16)
    pos = torch.arange(s, device=dev, dtype=torch.float32)[:, None]
    inv = 10000.0 ** (-torch.arange(R // 2, device=dev, dtype=torch.float32) * 2 / R)
    ang = torch.cat((pos * inv, pos * inv), -1)[None].expand(b, s, R)
    cos, sin = torch.cos(ang), torch.sin(ang)
    rows = b * h * s
    return Inputs(
        x=x, cos=cos, sin=sin,
        out=torch.full((rows * D,), float("nan"), device=x.device, dtype=x.dtype),
        rstd=torch.full((rows,), float("nan"), device=x.device, dtype=torch.float32),
        x_inplace=None, copy_dst=torch.empty_like(x), slice_src=None, slice_dst=None, flat_dst=None,
    )  # fmt: skip


def prefill_variants():
    """(name, Variant, the bench's byte count: "copy" for x in and out, else the op's forward)."""
    out = [("copy_ (x bytes)", Variant("reference", "copy_", "copy_x"), "copy")]
    for m, w in PREFILL_TILES:
        out.append((f"ld/st M={m} w={w}", stage_variant("ladder", "ld/st", m, w, "ld/st"), "copy"))
    out.append(("qnorm_rope_triton", Variant("ours", "qnorm", "op_qnorm", 1, 1), "qnorm_rope"))
    out.append(("apply_partial_rope_triton", Variant("ours", "rope", "op_rope", 1, 1), "partial_rope"))
    return out


def prefill_bytes(what, b, h, s):
    return 2 * b * h * s * D * 2 if what == "copy" else bytes_moved(what, "forward", b, h, s)


def prefill_run(out_dir: Path):
    """Each PREFILL_SHAPES x layout: copy_ of x's bytes, the ld/st `_stage` (a copy in the forward's tiling and
    addressing: rows in token-major order, read from x's layout, stored token-major) at PREFILL_TILES, and the
    two public forwards; each timed as the bench times a prefill forward (do_bench median, its L2 flush), in
    PREFILL_ROUNDS interleaved rounds; share of the bench's copy bandwidth (bench.bench.copy_bandwidth) with the
    bench's byte counts. Writes prefill_ceiling.csv and .md."""
    out_dir.mkdir(parents=True, exist_ok=True)
    copy = copy_bandwidth()
    rounds = f"do_bench median, the median of {PREFILL_ROUNDS} rounds"
    meta = f"{environment().split(';')[0]}; copy bandwidth {copy / 1e9:.0f} GB/s; {rounds}"
    print(meta, flush=True)
    rows = []
    for b, h, s in PREFILL_SHAPES:
        for layout in ("token_major", "head_major"):
            t = prefill_inputs(b, h, s, layout)
            calls = [(name, make_call(v, t)[1], what) for name, v, what in prefill_variants()]
            for _, fn, _ in calls:  # compile and warm every variant before the rounds
                fn()
            times = {name: [] for name, _, _ in calls}
            for _ in range(PREFILL_ROUNDS):
                for name, fn, _ in calls:
                    times[name].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
            for name, _, what in calls:
                ms = statistics.median(times[name])
                share = prefill_bytes(what, b, h, s) / (ms * 1e-3) / copy
                row = dict(shape=f"{b}x{h}x{s}", layout=layout, name=name, ms=round(ms, 5),
                           ms_min=round(min(times[name]), 5), ms_max=round(max(times[name]), 5),
                           share_of_copy=round(share, 4))  # fmt: skip
                rows.append(row)
                print(" ".join(f"{k}={val}" for k, val in row.items()), flush=True)
            del t, calls
            torch.cuda.empty_cache()
    with open(out_dir / "prefill_ceiling.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    names = [name for name, _, _ in prefill_variants()]
    lines = [f"Measured {meta}. Share of copy bandwidth.", "", "| shape | layout | " + " | ".join(names) + " |"]
    lines.append("|" + "---|" * (len(names) + 2))
    for shape, layout in dict.fromkeys((r["shape"], r["layout"]) for r in rows):
        got = {r["name"]: r["share_of_copy"] for r in rows if (r["shape"], r["layout"]) == (shape, layout)}
        lines.append(f"| {shape} | {layout} | " + " | ".join(f"{got[n]:.3f}" for n in names) + " |")
    (out_dir / "prefill_ceiling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def check_prefill():
    """The prefill variants on a small input of each layout: ld/st stores x's rows token-major at every tile,
    the ops equal their own launches."""
    for layout in ("token_major", "head_major"):
        t = prefill_inputs(1, 4, 8, layout)
        x_rows = storage_rows(t.x.transpose(1, 2).contiguous().transpose(1, 2))  # x's rows, token-major order
        for name, v, _ in prefill_variants():
            fresh = t._replace(out=torch.full_like(t.out, float("nan")), copy_dst=torch.full_like(t.x, float("nan")))
            got = make_call(v, fresh)[1]()
            if v.kind == "copy_x":
                assert torch.equal(fresh.copy_dst, t.x), name
            elif v.kind == "stage":
                assert torch.equal(fresh.out.view(torch.int16), x_rows.view(torch.int16)), (layout, name)
            else:
                op = qnorm_rope_triton if v.kind == "op_qnorm" else apply_partial_rope_triton
                want = op(t.x, t.cos, t.sin, R, EPS) if v.kind == "op_qnorm" else op(t.x, t.cos, t.sin, R)
                got, want = (got[0], want[0]) if v.kind == "op_qnorm" else (got, want)
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (layout, name)
            print(f"prefill {layout:11s} {name:30s} ok")


# --- CPU check (TRITON_INTERPRET=1): every variant runs and the ceilings compute what they say ----------


def check():
    assert INTERPRET, "--check runs under TRITON_INTERPRET=1"
    b, h = 2, 64
    t = make_inputs(b, h)
    ref_out, ref_rstd = qnorm_module._forward(t.x, t.cos, t.sin, R, EPS)
    ref_out = storage_rows(ref_out)
    x_rows = storage_rows(t.x)
    xf = x_rows.view(-1, D).float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + EPS)
    normed = (xf * rstd[:, None]).to(torch.bfloat16).reshape(-1)
    slice_before = t.x_inplace.clone()
    for v in variants(b, h):
        fresh = t._replace(out=torch.full_like(t.out, float("nan")), rstd=torch.full_like(t.rstd, float("nan")))
        fresh.copy_dst.fill_(float("nan"))
        fresh.flat_dst.fill_(float("nan"))
        before = fresh.x_inplace.clone()
        make_call(v, fresh)[1]()
        flags = dict(v.flags)
        what = "ran"
        if v.kind == "copy_x":
            assert torch.equal(fresh.copy_dst, t.x)
        elif v.kind == "flat":
            assert torch.equal(fresh.flat_dst.view(torch.int16), x_rows.view(torch.int16)), v
            what = "= x"
        elif v.kind == "slice":
            assert torch.equal(fresh.x_inplace.view(torch.int16), before.view(torch.int16)), v  # loads and stores back
            what = "x unchanged"
        elif v.kind == "dsrope_rope":
            ref = storage_rows(apply_partial_rope_triton(t.x, t.cos, t.sin, R))
            assert torch.equal(fresh.out.view(torch.int16), ref.view(torch.int16)), v
            what = "= apply_partial_rope_triton"
        elif v.kind in ("stage", "dsrope_qnorm"):
            if v.kind == "stage" and not flags["MOVE"]:
                assert torch.isnan(fresh.out).all(), v
                what = "wrote nothing"
            elif v.kind == "stage" and flags == LADDER["ld/st"]:
                assert torch.equal(fresh.out.view(torch.int16), x_rows.view(torch.int16)), v
                what = "= x"
            elif v.kind == "stage" and not flags["REDUCE"]:  # rotation only: partial RoPE's function
                ref = storage_rows(apply_partial_rope_triton(t.x, t.cos, t.sin, R)).float()
                err = (fresh.out.float() - ref).abs().max().item()
                assert err <= 2**-6 * ref.abs().max().item(), (v, err)  # rounding apart (no fma here)
                what = f"partial RoPE within {err:.2g}"
            elif v.kind == "stage" and not flags["ROPE"]:
                # the leading D - R channels of the shipped output are x * rstd, rounded
                got, want = fresh.out.view(-1, D)[:, : D - R], ref_out.view(-1, D)[:, : D - R]
                assert torch.equal(got.view(torch.int16), want.view(torch.int16)), v
                err = (fresh.out.float() - normed.float()).abs().max().item()
                what = f"= shipped's unrotated channels, torch's x * rstd within {err:.2g}"
            else:
                same = torch.equal(fresh.out.view(torch.int16), ref_out.view(torch.int16))
                err = (fresh.out.float() - ref_out.float()).abs().max().item()
                assert same or err <= 2**-6 * ref_out.float().abs().max().item(), (v, err)
                what = "= shipped" if same else f"shipped within {err:.2g}"
            if flags.get("RSTD", v.kind == "dsrope_qnorm"):
                assert torch.allclose(fresh.rstd, ref_rstd, rtol=1e-6, atol=0), v
                what += ", rstd"
        print(f"{v.group:10s} {v.name:50s} {what}")
    assert not torch.equal(t.x_inplace, slice_before)  # the in-place op rotated it
    check_prefill()
    print("check passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="out/decode_ceiling")
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="B = 1 and B = 64 at H = 64 only")
    parser.add_argument("--ncu", action="store_true")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--prefill", action="store_true", help="the prefill forward's bound (PREFILL_SHAPES)")
    args = parser.parse_args()
    if args.check:
        return check()
    if args.prefill:
        return prefill_run(Path(args.out))
    if args.ncu:
        return ncu_launches()
    shapes = [(1, 64), (64, 64)] if args.quick else SHAPES
    run(Path(args.out), shapes, args.workers)


if __name__ == "__main__":
    main()
