"""Benchmark the DSV4 kernels against the eager chain and torch.compile of it (CUDA only).

For each shape (B in {1, 4}, H in {64, 128}, S in {4096, 16384}, D=512, R=64, bf16), each input
layout (the production [B, H, S, D] view of token-major storage, and a contiguous head-major
tensor), each kernel and direction (forward, backward, forward+backward): the median time over
warm runs (triton.testing.do_bench; forward+backward: the forward and its autograd backward captured
in one CUDA graph, the replay timed by do_bench, so that the row times kernels and not the host's
enqueue), the bytes that must move (each input read once, each output written once), GB/s, the
fraction of the device-to-device copy bandwidth measured in this run, and the speedup over eager and
over torch.compile (same run). Beside each shape and layout, the QNorm forward's bound: a copy in its
addressing (rows_copy: x read in its layout, rows stored token-major, at the forward's tile), whose share
of copy bandwidth goes in the forward rows' rows_copy_fraction and into the QNorm forward's target. Ours
is timed three times (once before the others, twice after) and the median of those medians is reported.
Writes a CSV, a markdown table and a PNG chart.

Decode rows (S=1, B in {1, 8, 64, 256}, H in {64, 128}, D=512, R=64, bf16, forward without
gradient, per-sequence positions): the wall time of one call as a decode loop pays it, for ours,
the eager chain, torch.compile of it, and a same-size `copy_` (the yardstick: one launch moving
the same bytes). Two ways: without CUDA graphs (host clock around `DECODE_CALLS` back-to-back
calls and a synchronize: the CPU launch overhead included) and under CUDA graph replay
(`DECODE_CALLS` calls captured in one graph, the host clock around `DECODE_REPLAYS` replays).
Each the median of `DECODE_SAMPLES` such measurements. Writes decode.csv and decode.md.

    python -m bench.bench --out out/bench            # everything: prefill and decode rows
    python -m bench.bench --decode                   # the decode rows only
    python -m bench.bench --quick [--decode]         # one shape, for a smoke run

Peers (dsrope_gate.presets): `--peers [NAMES]` times them forward beside ours (in-place table, prefill and
decode; `--decode` the decode rows only: one call of each peer per timed call). `--backward [--peers
[NAMES]]`: forward+backward rows of ours, the eager chain and the named peers (token-major x, one
autograd.grad per timed call, under graph replay where it can be captured), cells saying why where
a row is not timed (dsrope_dev.peer_timing).

    python -m bench.bench --backward --peers         # forward+backward: every preset
    python -m bench.bench --decode --peers           # decode rows of ours and every peer

The prefill and decode runs end with the project's targets (dsrope_dev.perf_targets, docs/performance.md
Targets) checked on their rows: targets.md with a MISSED column, a summary line, exit status 1 when one is
missed (--no-fail: 0).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import functools
import math
import statistics
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, qnorm_rope_triton  # noqa: E402
from dsrope_dev import perf_targets  # noqa: E402
from dsrope_dev.timing import (  # noqa: E402
    DECODE_CALLS,
    DECODE_SAMPLES,
    DECODE_SHAPES,
    D,
    R,
    copy_bandwidth,
    decode_inputs,
    inplace_copy,
    per_call_us,
    per_replayed_call_us,
    rows_copy,
    settle_graph_replay,
)
from dsrope_gate import differential  # noqa: E402
from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE  # noqa: E402

EPS = 1e-6
TRITON_SAMPLES = 3
SHAPES = [(b, h, s) for b in (1, 4) for h in (64, 128) for s in (4096, 16384)]


def eager_qnorm_rope(x, cos, sin):
    """The unfused reference chain (dsrope_gate.differential): F.rms_norm, then the FP32 rotation."""
    return differential.eager_qnorm_rope(x, cos, sin, R, EPS)


def eager_partial_rope(x, cos, sin):
    return differential.eager_partial_rope(x, cos, sin, R)


# Shapes, layouts and requires_grad vary across the run: allow the recompiles (the default limit
# of 8 silently falls back to eager). Buffer donation off so a backward can be timed on its own
# with retain_graph; it does not change the generated kernels.
for _name in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, _name):
        setattr(torch._dynamo.config, _name, 256)
torch._functorch.config.donated_buffer = False

compiled = {
    "qnorm_rope": torch.compile(eager_qnorm_rope, dynamic=True),
    "partial_rope": torch.compile(eager_partial_rope, dynamic=True),
}
IMPLS = {
    "qnorm_rope": {
        "triton": lambda x, c, s: qnorm_rope_triton(x, c, s, R, EPS),
        "eager": eager_qnorm_rope,
        "compile": lambda x, c, s: compiled["qnorm_rope"](x, c, s),
    },
    "partial_rope": {
        "triton": lambda x, c, s: apply_partial_rope_triton(x, c, s, R),
        "eager": eager_partial_rope,
        "compile": lambda x, c, s: compiled["partial_rope"](x, c, s),
    },
}


def bytes_moved(kernel, direction, b, h, s):
    n = b * h * s * D * 2  # bf16
    rows = b * h * s
    tables = 2 * s * (R // 2) * 4  # the unique half of cos and sin, batch broadcast
    rstd = rows * 4 if kernel == "qnorm_rope" else 0
    fwd = 2 * n + tables  # read x, write out: the forward row's call wants no gradient, so stores no rstd
    bwd = (3 * n + rstd if kernel == "qnorm_rope" else 2 * n) + tables  # read x, g (+ rstd), write dx
    return {"forward": fwd, "backward": bwd, "forward+backward": fwd + rstd + bwd}[direction]


def make_inputs(b, h, s, layout):
    if layout == "token_major":
        x = torch.randn(b, s, h, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    else:
        x = torch.randn(b, h, s, D, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(s, device="cuda", dtype=torch.float32)[:, None]
    inv = 10000.0 ** (-torch.arange(R // 2, device="cuda", dtype=torch.float32) * 2 / R)
    ang = torch.cat((pos * inv, pos * inv), -1)[None].expand(b, s, R)
    return x, torch.cos(ang), torch.sin(ang)


def rows_copy_fraction(x, copy):
    """rows_copy's share of the copy bandwidth `copy` (x read, its rows written): the median of TRITON_SAMPLES
    do_bench medians, as ours is timed."""
    out = torch.empty(x.numel(), device=x.device, dtype=x.dtype)
    ms = statistics.median(
        [do_bench(lambda: rows_copy(x, out), warmup=25, rep=100, return_mode="median") for _ in range(TRITON_SAMPLES)]
    )
    return 2 * x.numel() * x.element_size() / (ms * 1e-3) / copy


def time_one(fn, x, cos, sin, direction):
    try:
        return _time_one(fn, x, cos, sin, direction)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        print(f"out of memory: {getattr(fn, '__name__', fn)} {direction} {tuple(x.shape)}", flush=True)
        return float("nan")


def _time_one(fn, x, cos, sin, direction):
    if direction == "forward":
        return do_bench(lambda: fn(x, cos, sin), warmup=25, rep=100, return_mode="median")
    g = torch.randn_like(x)
    if direction == "backward":
        xg = x.detach().requires_grad_()
        out = fn(xg, cos, sin)
        return do_bench(
            lambda: torch.autograd.grad(out, xg, g, retain_graph=True), warmup=25, rep=100, return_mode="median"
        )

    leaf = x.detach().requires_grad_()

    def both():
        torch.autograd.grad(fn(leaf, cos, sin), leaf, g)

    try:
        return _replayed_ms(both)
    except RuntimeError as e:  # a peer that syncs or allocates on the host mid-call: timed host-driven, said so
        torch.cuda.empty_cache()
        print(f"forward+backward of {getattr(fn, '__name__', fn)} not capturable in a CUDA graph "
              f"({type(e).__name__}: {str(e)[:120]}); timed host-driven", flush=True)  # fmt: skip
        return do_bench(both, warmup=25, rep=100, return_mode="median")


def _replayed_ms(fn):
    """fn captured once in a CUDA graph and the graph replayed under do_bench (median, ms): the GPU's time
    for fn's kernels, with do_bench's L2 flush before each replay as for the other prefill rows. The
    forward+backward rows are timed this way because the host's enqueue of a forward and its autograd
    backward is within 1.4-2.8x of the GPU's work at 1 x 64 x 4096
    (docs/records/2026-12-06-h100-decode-and-prefill-tuning.md), and
    host-driven samples there read 20-30% slow on unchanged kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture, as torch asks before capturing autograd
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the warm-up's cached blocks back, so the graph's private pool can take them
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    try:
        return do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
    finally:
        del graph
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--quick", action="store_true", help="one shape per table, for a smoke run")
    ap.add_argument("--decode", action="store_true", help="only the decode rows (S=1)")
    ap.add_argument("--impls", default="triton,eager,compile")
    ap.add_argument("--inplace", action="store_true", help="only the in-place partial RoPE rows (and --peers')")
    ap.add_argument("--backward", action="store_true", help="forward+backward rows of ours, eager and --peers")
    ap.add_argument("--no-fail", action="store_true", help="exit 0 even when a target is missed")
    ap.add_argument(
        "--peers", nargs="?", const="all", default="",
        help="also time the presets that run on CUDA (in-place table): all, or names joined by commas",
    )  # fmt: skip
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    versions = f"{datetime.date.today()}, {gpu}, torch {torch.__version__}, triton {triton.__version__}"
    if args.backward:
        fwd_bwd(out, [(1, 64, 4096)] if args.quick else SHAPES, versions, args.peers.split(",") if args.peers else [])
        return
    if args.inplace or args.peers:
        peers = peer_impls(args.peers.split(",")) if args.peers else []
        prefill_shapes = [] if args.decode else [(1, 64, 4096)] if args.quick else SHAPES
        inplace(out, prefill_shapes, DECODE_SHAPES[:1] if args.quick else DECODE_SHAPES, versions, peers)
        return
    targets = []
    if not args.decode:
        rows = prefill(out, args.impls.split(","), [(1, 64, 4096)] if args.quick else SHAPES, versions)
        targets += [t for row in rows for t in perf_targets.prefill_targets(row)]
    rows = decode(out, DECODE_SHAPES[:1] if args.quick else DECODE_SHAPES, versions, args.impls.split(","))
    targets += [t for row in rows for t in perf_targets.decode_targets(row)]
    return check_targets(out, targets, args.no_fail)


def check_targets(out, targets, no_fail) -> int:
    """Print and write (targets.md) every target with its MISSED column, then the summary line; the exit
    status: 1 when a target is missed, unless no_fail."""
    lines = perf_targets.table(targets)
    (out / "targets.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(perf_targets.summary(targets), flush=True)
    return 1 if any(t.missed for t in targets) and not no_fail else 0


def prefill(out, impls, shapes, versions):
    copy = copy_bandwidth()
    meta = f"{versions}, copy bandwidth {copy / 1e9:.0f} GB/s (read+write)"
    print(meta, flush=True)
    rows = []
    for b, h, s in shapes:
        for layout in ("token_major", "head_major"):
            x, cos, sin = make_inputs(b, h, s, layout)
            bound = rows_copy_fraction(x, copy)
            for kernel in ("qnorm_rope", "partial_rope"):
                for direction in ("forward", "backward", "forward+backward"):
                    ms = {i: time_one(IMPLS[kernel][i], x, cos, sin, direction) for i in impls}
                    # ours again after the others: the median of these TRITON_SAMPLES medians, so
                    # that one disturbed do_bench does not decide a row; the spread goes in the CSV
                    samples = [ms["triton"]] + [
                        time_one(IMPLS[kernel]["triton"], x, cos, sin, direction) for _ in range(TRITON_SAMPLES - 1)
                    ]
                    ms["triton"] = statistics.median(samples)
                    nbytes = bytes_moved(kernel, direction, b, h, s)
                    gbs = nbytes / (ms["triton"] * 1e-3) / 1e9
                    row = dict(
                        kernel=kernel,
                        direction=direction,
                        B=b,
                        H=h,
                        S=s,
                        layout=layout,
                        triton_ms=ms["triton"],
                        triton_ms_min=min(samples),
                        triton_ms_max=max(samples),
                        bytes=nbytes,
                        GBps=gbs,
                        copy_fraction=gbs * 1e9 / copy,
                        **({"rows_copy_fraction": bound} if direction == "forward" else {}),
                        **{f"{i}_ms": ms[i] for i in impls if i != "triton"},
                        **{f"speedup_vs_{i}": ms[i] / ms["triton"] for i in impls if i != "triton"},
                    )
                    rows.append(row)
                    print(
                        " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                        flush=True,
                    )
            del x, cos, sin
            torch.cuda.empty_cache()
    write_csv(out / "bench.csv", rows)
    write_markdown(out / "perf.md", rows, meta, impls)
    write_chart(out / "perf.png", rows, copy)
    worst = min(r["copy_fraction"] for r in rows)
    print(f"worst fraction of copy bandwidth: {worst:.3f}")
    return rows


# --- decode: S=1, the host's launch overhead against the GPU's work ------------------------------


def decode_row(kernel, b, h, impls=("triton", "eager", "compile")):
    x, cos, sin = decode_inputs(b, h)
    y = torch.empty_like(x)
    fns = {i: functools.partial(IMPLS[kernel][i], x, cos, sin) for i in ("triton", "eager", "compile") if i in impls}
    fns["copy"] = functools.partial(y.copy_, x)
    for fn in fns.values():  # compile and warm everything before timing
        fn()
    row = dict(kernel=kernel, B=b, H=h, S=1)
    row |= {f"{i}_us": per_call_us(fn) for i, fn in fns.items()}
    row |= {f"{i}_graph_us": per_replayed_call_us(fn) for i, fn in fns.items()}
    row["ours_vs_compile"] = row["triton_us"] / row["compile_us"] if "compile" in fns else float("nan")
    row["ours_vs_copy_graph"] = row["triton_graph_us"] / row["copy_graph_us"]
    if kernel == "partial_rope":
        row |= inplace_decode_times(x, cos, sin)
    return row


def inplace_decode_times(x, cos, sin) -> dict:
    """The in-place partial RoPE under graph replay (on a copy of x, rotated again on every call) and
    inplace_copy, us per call."""
    xi = x.clone()
    call = functools.partial(apply_partial_rope_triton_, xi, cos, sin, R)
    call()
    times = dict(
        inplace_graph_us=per_replayed_call_us(call),
        inplace_copy_graph_us=per_replayed_call_us(inplace_copy(x)),
    )
    times["inplace_vs_copy_graph"] = times["inplace_graph_us"] / times["inplace_copy_graph_us"]
    return times


def decode(out, shapes, versions, impls):
    settle_graph_replay()
    meta = (
        f"{versions}; decode rows: forward without gradient, per-call wall time in us "
        f"({DECODE_CALLS} calls x {DECODE_SAMPLES} samples, median)"
    )
    print(meta, flush=True)
    rows = []
    with torch.no_grad():
        for b, h in shapes:
            for kernel in ("qnorm_rope", "partial_rope"):
                rows.append(decode_row(kernel, b, h, impls))
                print(
                    " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in rows[-1].items()),
                    flush=True,
                )
            torch.cuda.empty_cache()
    write_csv(out / "decode.csv", rows)
    write_decode_markdown(out / "decode.md", rows, meta)
    return rows


# --- partial RoPE in place beside out of place (issue 27), and the peers (issue 26) --------------------


def peer_impls(names: list[str]) -> list:
    """The presets' implementations (dsrope_gate.presets.Implementation) of `names` ("all": every one)
    that load here (CUDA), the controls left out: ours and the eager chain have their own columns."""
    from dsrope_gate import presets

    loaded = presets.load(names, "cuda", None, lambda msg: print(msg, flush=True))
    return [impl for impl in loaded if impl.name.split(":")[0] not in ("dsrope", "eager-chain")]


def called(fn):
    """prepare(x, cos, sin) -> the call to time: fn on these inputs, with nothing left to do but the call."""
    return lambda x, cos, sin: functools.partial(fn, x, cos, sin)


def inplace_bytes(b, h, s, moved_channels):
    """Bytes a partial RoPE must move: read and write `moved_channels` per row (bf16), and the tables."""
    return 2 * b * h * s * moved_channels * 2 + 2 * s * (R // 2) * 4


def inplace(out, shapes, decode_shapes, versions, peers):
    """Forward rows (no gradient): partial RoPE ours out of place (moves D channels per row), ours in place
    (moves R), each peer's (theirs in place move R); Q norm + RoPE ours and each peer's (D). Every
    implementation gets both layouts (a peer that copies a layout it does not take pays for it: that is
    its cost on that layout); GB/s and share of copy on each one's bytes. A peer's adapter that runs an
    in-place function on a copy (sglang, flash-attn) times the copy too:
    docs/records/2026-12-04-h200-inplace-and-peers-benchmark.md. No `shapes`: the
    decode rows only."""
    copy = copy_bandwidth() if shapes else float("nan")
    bandwidth = f", copy bandwidth {copy / 1e9:.0f} GB/s (read+write)" if shapes else ""
    meta = f"{versions}{bandwidth}; forward, no gradient"
    print(meta, flush=True)
    rows = []
    impls = {
        "dsrope out of place": ("partial_rope", called(lambda x, c, s: apply_partial_rope_triton(x, c, s, R)), D),
        "dsrope in place": ("partial_rope", called(lambda x, c, s: apply_partial_rope_triton_(x, c, s, R)), R),
    }
    for peer in (p for p in peers if p.op is PARTIAL_ROPE):
        if peer.prepare_in_place:  # their call alone, tables made beforehand
            prepare = lambda x, c, s, p=peer: p.prepare_in_place(x, c, s, R)
            impls[f"{peer.name} (in place)"] = ("partial_rope", prepare, R)
        elif peer.in_place:  # theirs in place, on x itself: R channels
            impls[f"{peer.name} (in place)"] = (
                "partial_rope",
                called(lambda x, c, s, p=peer: p.in_place(x, c, s, R)),
                R,
            )
        else:
            impls[peer.name] = ("partial_rope", called(lambda x, c, s, p=peer: p.fn(x, c, s, R)), D)
    # Q norm + RoPE forward: every channel is read and written by every implementation
    impls["dsrope qnorm_rope_triton"] = ("qnorm_rope", called(lambda x, c, s: qnorm_rope_triton(x, c, s, R, EPS)), D)
    for peer in (p for p in peers if p.op is QNORM_ROPE):
        impls[peer.name] = ("qnorm_rope", called(lambda x, c, s, p=peer: p.fn(x, c, s, R, EPS)), D)
    with torch.no_grad():
        for b, h, s in shapes:
            for layout in ("token_major", "head_major"):
                x, cos, sin = make_inputs(b, h, s, layout)
                for name, (_, prepare, moved) in impls.items():
                    if x.numel() > 2**31 and not name.startswith("dsrope"):
                        # veomni 0.1.12 crashed past 2**31 elements (illegal address, H200 2026-12-04) and
                        # the crash poisons the CUDA context for every later row: peers stop below it
                        continue
                    try:
                        call = prepare(x, cos, sin)
                        ms = statistics.median(do_bench(call, warmup=25, rep=100, return_mode="all"))
                    except Exception as e:  # a peer that refuses a layout: a row saying so
                        print(f"{name} {b}x{h}x{s} {layout}: {type(e).__name__}: {e}"[:300], flush=True)
                        ms = float("nan")
                    nbytes = inplace_bytes(b, h, s, moved)
                    gbs = nbytes / (ms * 1e-3) / 1e9
                    row = dict(impl=name, B=b, H=h, S=s, layout=layout, ms=ms, bytes=nbytes, GBps=gbs,
                               copy_fraction=gbs * 1e9 / copy)  # fmt: skip
                    rows.append(row)
                    print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
                del x, cos, sin
                torch.cuda.empty_cache()
        decode_rows = []
        for b, h in decode_shapes:
            x, cos, sin = decode_inputs(b, h)
            for name, (_, prepare, _moved) in impls.items():
                try:
                    call = prepare(x, cos, sin)
                    call()
                    row = dict(impl=name, B=b, H=h, S=1, us=per_call_us(call), graph_us=per_replayed_call_us(call))
                except Exception as e:
                    print(f"{name} decode {b}x{h}: {type(e).__name__}: {e}"[:300], flush=True)
                    row = dict(impl=name, B=b, H=h, S=1, us=float("nan"), graph_us=float("nan"))
                decode_rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    if rows:
        write_csv(out / "inplace.csv", rows)
    write_csv(out / "inplace_decode.csv", decode_rows)
    lines = [f"Measured {meta}."]
    if rows:
        lines += [
            "",
            "| impl | B | H | S | layout | ms | bytes moved | GB/s | of copy |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['B']} | {r['H']} | {r['S']} | {r['layout']} | {r['ms']:.4f} | {r['bytes']} | "
            f"{r['GBps']:.0f} | {r['copy_fraction']:.1%} |"
        )
    lines += ["", "Decode (S=1, token-major x, per-call wall time in us; graph: under CUDA graph replay):", ""]
    lines += ["| impl | B | H | us | graph us |", "|---|---|---|---|---|"]
    for r in decode_rows:
        lines.append(f"| {r['impl']} | {r['B']} | {r['H']} | {r['us']:.2f} | {r['graph_us']:.2f} |")
    (out / "inplace.md").write_text("\n".join(lines) + "\n")


# --- forward+backward of ours, the eager chain and the peers (issue 34) --------------------------------


def fwd_bwd(out, shapes, versions, names):
    """One forward and its autograd.grad per timed call (_time_one's forward+backward), token-major x, for
    every implementation of the presets dsrope, eager-chain and `names`; where one is not timed its cell
    says why (dsrope_dev.peer_timing). Writes fwd_bwd.csv and fwd_bwd.md."""
    from dsrope_dev import peer_timing
    from dsrope_gate import presets

    impls = presets.load(["dsrope", "eager-chain", *names], "cuda", None, lambda msg: print(msg, flush=True))
    meta = f"{versions}; forward+backward, token-major x, the pair's CUDA graph replayed under do_bench, median (ms)"
    print(meta, flush=True)
    rows = []
    for b, h, s in shapes:
        x, cos, sin = make_inputs(b, h, s, "token_major")
        for impl in impls:
            rows.append(fwd_bwd_row(impl, x, cos, sin, peer_timing))
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
        del x, cos, sin
        torch.cuda.empty_cache()
        # after every shape: a run cut by its timeout still leaves the rows it timed
        write_csv(out / "fwd_bwd.csv", rows)
        (out / "fwd_bwd.md").write_text(peer_timing.markdown(rows, meta))


def fwd_bwd_row(impl, x, cos, sin, peer_timing):
    b, h, s, _ = x.shape
    args = (impl.op.name, b, h, s, impl.name)
    marker = peer_timing.not_run(impl, x.numel())
    if marker:
        return peer_timing.row(*args, marker=marker)
    extra = (R, EPS) if impl.op is QNORM_ROPE else (R,)
    try:
        return peer_timing.row(
            *args, ms=_time_one(lambda x, c, s: impl.fn(x, c, s, *extra), x, cos, sin, "forward+backward")
        )
    except Exception as e:  # out of memory, a refused shape: a cell saying so, the other rows go on
        torch.cuda.empty_cache()
        return peer_timing.row(*args, marker=peer_timing.FAILED, error=f"{type(e).__name__}: {e}"[:200])


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        # every row's columns, in order of appearance (decode: only partial RoPE rows have in-place times)
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="")
        w.writeheader()
        w.writerows(rows)


def write_decode_markdown(path, rows, meta):
    head = [
        "kernel",
        "B",
        "H",
        "ours",
        "eager",
        "compile",
        "copy_",
        "ours / compile",
        "graph: ours",
        "graph: eager",
        "graph: compile",
        "graph: copy_",
        "graph: ours / copy_",
        "graph: in place / copy_ of its bytes",
    ]
    lines = [f"Measured {meta}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        times = ("triton", "eager", "compile", "copy")  # "nan": an implementation not timed (--impls)
        cells = [r["kernel"], r["B"], r["H"]] + [f"{r.get(f'{i}_us', math.nan):.1f}" for i in times]
        cells += [f"{r['ours_vs_compile']:.2f}"]
        cells += [f"{r.get(f'{i}_graph_us', math.nan):.2f}" for i in times]
        cells += [
            f"{r['ours_vs_copy_graph']:.2f}",
            f"{r['inplace_vs_copy_graph']:.2f}" if "inplace_graph_us" in r else "-",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def write_markdown(path, rows, meta, impls):
    others = [i for i in impls if i != "triton"]
    head = ["kernel", "direction", "B", "H", "S", "layout", "ms", "GB/s", "of copy"] + [f"vs {i}" for i in others]
    lines = [f"Measured {meta}.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            r["kernel"],
            r["direction"],
            r["B"],
            r["H"],
            r["S"],
            r["layout"],
            f"{r['triton_ms']:.3f}",
            f"{r['GBps']:.0f}",
            f"{r['copy_fraction']:.1%}",
        ] + [f"{r[f'speedup_vs_{i}']:.2f}x" for i in others]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def write_chart(path, rows, copy):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart")
        return
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, kernel in zip(axes, ("qnorm_rope", "partial_rope"), strict=True):
        sel = [r for r in rows if r["kernel"] == kernel]
        labels = [f"{r['direction'][:3]} {r['B']}x{r['H']}x{r['S']} {r['layout'][:4]}" for r in sel]
        ax.barh(range(len(sel)), [r["copy_fraction"] for r in sel])
        ax.axvline(0.9, color="red", linestyle="--", label="90% of copy")
        ax.set_yticks(range(len(sel)), labels, fontsize=5)
        ax.set_title(f"{kernel}: fraction of copy bandwidth ({copy / 1e12:.2f} TB/s)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
