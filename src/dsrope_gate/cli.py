"""The conformance command line: `python -m dsrope_gate.conformance` (nox -s conformance). What it judges:
dsrope_gate.conformance; the parity matrix (`--parity`): dsrope_gate.parity. Its exit status, for a CI step:
EXIT_STATUS (`--help` prints it).

By default every implementation is judged in a child process of its own (dsrope_gate.conformance.isolation):
an exit, a signal, a CUDA fault or a call past `--timeout` is that implementation's verdict, the others are
judged as if it were absent, and the report and the JSON are always written. `--in-process` judges in this
process, for debugging.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from dsrope_reference.contracts import CONTRACTS, DEFAULT

from dsrope_gate import semantics
from dsrope_gate.cases import DTYPES
from dsrope_gate.conformance import EXAMPLES, TIMEOUT, Target
from dsrope_gate.ops import JUDGED

DESCRIPTION = "Judge any implementation of qnorm_rope or partial_rope against the contract, element by element."

# the labels the report can print: each semantics' (dsrope_gate.semantics), and the two words for none
LABELS = semantics.LABELS | {
    "no known semantics": "no emulation agrees with 99.9% of the elements on every evidence case",
    "nothing judged": "no element was judged: no semantics claimed",
}
VERDICT_MEANING = {
    "conforms": "every case ran and no element lies outside the error model",
    "does not conform": "an element outside the model, a write into an input, or a wrong shape/dtype/None returned",
    "partial": "every element judged is inside the model, but some cases were refused, raised or had the "
    "wrong signature",
    "not run": "nothing judged in this direction (every case refused or raised): no claim either way",
    "crashed": "its process died (an exit, a signal, an out-of-memory kill, a CUDA fault): the cases it "
    "finished are kept",
    "timed out": "a call outlived --timeout: the cases it finished are kept",
}
EXIT_STATUS = {
    0: "every direction judged conforms (an implementation without a grad_fn has no backward to judge)",
    1: "an implementation does not conform, is partial, crashed, timed out or was not run: a CI step must not "
    "pass on cases it skipped",
    2: "a usage error: a bad option, an unknown op, preset or label, an implementation that cannot be loaded or "
    "does not take the op's arguments",
    3: "the judge itself failed (an internal error, a missing optional dependency): never an implementation's fault",
}


def exit_status(results: list[dict]) -> int:
    """EXIT_STATUS for the results of a run (backward None: no grad_fn, forward only, not counted): 2 where every
    direction of some implementation was not run for its signature (it cannot take the op's arguments)."""
    for r in results:
        statuses = {n["status"] for d in ("forward", "backward") if r[d] for n in r[d].get("not_run", ())}
        if statuses == {"wrong signature"}:
            return 2
    verdicts = [r[d]["verdict"] for r in results for d in ("forward", "backward") if r[d] is not None]
    return 0 if verdicts and all(v == "conforms" for v in verdicts) else 1


def epilog() -> str:
    """What --help says beyond the options: the ops' signatures, the verdicts, the labels, the exit status."""
    lines = ["An implementation is a callable with the signature of the op it stands for:"]
    lines += [f"  {op.signature}" for op in JUDGED.values()]
    lines += [
        "x [B, H, S, D] of any strides, dtype bf16/fp16/fp32; cos, sin FP32 [B, S, R]; the trailing R channels",
        "rotated as interleaved pairs (docs/contract.md). It runs on the default case set: the canonical",
        "DeepSeek-V4/V3 cases, the golden inputs, one probe per layout class and the seeded sweep; the backward",
        "through autograd when the output has a grad_fn.",
        "",
        "Verdict, per direction (forward, backward):",
    ]
    lines += [f"  {k:18} {v}" for k, v in VERDICT_MEANING.items()]
    lines += ["", "Contracts (--contract; an FP64 reference with a per-element error model each):"]
    lines += [f"  {name:18} {c.description}" for name, c in CONTRACTS.items()]
    lines += ["", "Semantics read off the bits (the emulation each agrees with, bf16/fp16 cases for qnorm_rope):"]
    lines += [f"  {k:18} {v}" for k, v in LABELS.items()]
    lines += [
        "",
        "A case not run reads refused (ValueError, TypeError, NotImplementedError, AssertionError), raised (any",
        "other exception), wrong signature (the callable cannot take the op's arguments) or wrong output.",
        "",
        "Exit status:",
    ]
    lines += [f"  {k}  {v}" for k, v in EXIT_STATUS.items()]
    return "\n".join(lines)


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dsrope_gate.conformance",
        description=DESCRIPTION,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = ap.add_argument
    add("--op", choices=tuple(JUDGED), action="append", help="the op(s) to judge (default: both where given presets)")
    add("--impl", action="append", default=[], help="module.path:callable or path/to/file.py:callable; repeatable")
    add("--in-place", action="store_true", help="every --impl rotates x itself: what it writes into x is judged")
    add(
        "--contract",
        choices=tuple(CONTRACTS),
        default=DEFAULT,
        help=f"the contract judged (default {DEFAULT}; docs/contract.md derives each)",
    )
    add("--preset", action="append", default=[], help="a preset (dsrope_gate.presets), or 'all'; repeatable")
    add("--against", help="a second implementation to compare each with, element by element")
    add("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible, else cpu")
    add("--examples", type=non_negative, default=EXAMPLES, help=f"hypothesis-drawn cases per op (default {EXAMPLES})")
    add("--seed", type=int, default=0, help="the sweep's seed (default 0)")
    add("--dtype", action="append", choices=DTYPES, help="only the canonical cases of these dtypes (default all)")
    add(
        "--golden",
        type=Path,
        default=None,
        help="a golden store (default: $DSROPE_GOLDEN, else the checkout's golden/, else the installed one)",
    )
    add("--json", type=Path, default=None, help="write the results as JSON here")
    add("--parity", action="store_true", help="the parity matrix of every pair of the implementations named")
    add(
        "--accept",
        action="append",
        default=[],
        metavar="DIAGNOSIS",
        help="accept a known limit knowingly: elements a named diagnosis explains do not fail a verdict; repeatable",
    )
    add("--timeout", type=positive_seconds, default=TIMEOUT, help=f"seconds per call (default {TIMEOUT:g})")
    add("--in-process", action="store_true", help="judge in this process, no child per implementation (debugging)")
    add("--verbose", action="store_true", help="progress on stderr per case (default: one line per implementation)")
    add("--out", type=Path, default=Path("out/conformance"), help="the report's folder (default out/conformance)")
    return ap


class UsageError(Exception):
    """A usage error found after parsing (an implementation that cannot be loaded): exit status 2."""


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.parity and args.against:
        ap.error("--against does not combine with --parity: the parity matrix already compares every pair")
    if args.impl and not args.op:
        ap.error("--impl needs --op")
    if not args.impl and not args.preset:
        ap.error("nothing to judge: give --impl (with --op) or --preset")
    from dsrope_gate.diagnoses import check_accepted

    try:
        check_accepted(args.accept)
    except ValueError as e:
        ap.error(str(e))
    try:
        return judge(args)
    except UsageError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        print(f"{ap.prog}: the judge failed: a package it needs is missing: {e}", file=sys.stderr)
        return 3
    except Exception:
        print(f"{ap.prog}: the judge itself failed (not the implementation's fault):", file=sys.stderr)
        traceback.print_exc()
        return 3


def preset_targets(names, device, ops, progress) -> list[tuple[str, Target]]:
    """(op name, Target) of every implementation of the named presets, each name listed in a child process
    of its own: the peers' code is never imported into the judge's own process, and two releases of one
    package (transformers@5.17.0, transformers@5.23.0) cannot share one."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    listed, skipped = [], []
    with context.Pool(1, maxtasksperchild=1) as pool:
        for name in dict.fromkeys(names):
            found, said = pool.apply(list_presets, ([name], device, ops))
            listed, skipped = listed + found, skipped + said
    for line in skipped:
        progress(line)
    return [(op, Target(name, preset=preset, in_place=False)) for preset, name, op in listed]


def list_presets(names, device, ops):
    """([(preset, implementation name, op name)], the lines saying which presets were skipped and why)."""
    import os

    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from dsrope_gate import presets

    skipped = []
    listed = []
    chosen = list(presets.PRESETS) if "all" in names else list(dict.fromkeys(names))
    for preset in chosen:
        for impl in presets.load([preset], device, ops, skipped.append):
            listed.append((preset, impl.name, impl.op.name))
    return listed, skipped


def judge(args) -> int:
    import os

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton code is imported (children inherit it)
    elif not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible")
    isolate = not args.in_process
    start = time.time()

    def progress(msg):
        print(f"[{time.time() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    jobs: dict[str, list[Target]] = {}
    for spec in args.impl:
        check_spec(spec)
        for op in args.op:
            jobs.setdefault(op, []).append(Target(spec, spec=spec, in_place=args.in_place))
    if args.preset:
        from dsrope_gate import presets

        unknown = [n for n in args.preset if n != "all" and n.split("@")[0] not in presets.PRESETS]
        if unknown:
            raise UsageError(f"--preset: unknown {unknown}; known: {', '.join(presets.PRESETS)} or all")
        for name in args.preset:
            base, at, version = name.partition("@")
            if at and version not in presets.releases(base):
                raise UsageError(f"--preset {name}: {base}'s pinned releases are {presets.releases(base) or 'none'}")
        if isolate:
            listed = preset_targets(args.preset, device, args.op, progress)
        else:
            loaded = presets.load(args.preset, device, args.op, progress)
            listed = [(impl.op.name, Target(impl.name, fn=impl.fn)) for impl in loaded]
        for op, target in listed:
            jobs.setdefault(op, []).append(target)
    if not jobs:
        raise UsageError("no implementation to judge: every preset named was skipped (see above)")
    against = None
    if args.against:
        check_spec(args.against)
        against = Target(args.against, spec=args.against)
    results, metas = judge_jobs(jobs, device, args, progress, against)
    if args.parity:
        return exit_status(results)
    meta = metas[0] | {"cases": "/".join(str(m["cases"]) for m in metas)}
    write_reports(results, metas, meta, args)
    return exit_status(results)


def check_spec(spec: str) -> None:
    """A usage error for a target that cannot name a callable, before any child starts."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise UsageError(f"--impl {spec!r}: expected module.path:callable or path/to/file.py:callable")
    if where.endswith(".py") and not Path(where).is_file():
        raise UsageError(f"--impl {spec!r}: no file {Path(where).resolve()}")


def judge_jobs(jobs, device, args, progress, against=None):
    """(results, metas) of every job, each op's cases built and its reference computed once; with `against`,
    each result carries its bit comparison with it. A target that cannot be loaded is a usage error."""
    from dsrope_gate.conformance import judge_all
    from dsrope_gate.conformance.isolation import LoadError
    from dsrope_gate.conformance.judging import against as compare

    results, metas, rows = [], [], []
    each_case = progress if args.verbose else None
    for op, targets in jobs.items():
        everyone = targets + ([against] if against else [])
        try:
            found, outputs, cases, meta = judge_all(
                op, everyone, device, args.examples, args.seed, args.golden, progress, each_case,
                isolate=not args.in_process, timeout=args.timeout, dtypes=args.dtype, accept=tuple(args.accept),
                contract=args.contract,
            )  # fmt: skip
        except LoadError as e:
            raise UsageError(f"cannot load an implementation of {op}: {e}") from e
        if args.parity:
            from dsrope_gate.parity import pairs

            rows += pairs(found, outputs, cases)
        if against:
            for result, out in zip(found[:-1], outputs[:-1], strict=True):
                result["against"] = {"impl": against.name} | compare(out, outputs[-1])
            found = found[:-1]
        results += found
        metas.append(meta)
    if args.parity:
        from dsrope_gate.parity import write

        print(write(rows, results, metas, args.out, args.json, progress))
    return results, metas


def write_reports(results, metas, meta, args) -> None:
    from dsrope_gate.conformance.render import render, summary

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(render(results, meta))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": metas, "results": results}, indent=1, default=str))
    # the result last, where a terminal or a CI log shows it: the summary ends with the verdict table
    where = args.out / "report.md" if not args.json else f"{args.out / 'report.md'}, {args.json}"
    print(summary(results, meta, where))
