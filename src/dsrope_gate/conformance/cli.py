"""The conformance command line: `python -m dsrope_gate.conformance` (nox -s conformance). Its arguments
and what it judges: dsrope_gate.conformance. Its exit status, for a CI step: EXIT_STATUS (`--help` prints it)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dsrope_gate import semantics
from dsrope_gate.conformance import run
from dsrope_gate.conformance.render import render, summary
from dsrope_gate.ops import JUDGED

DESCRIPTION = "Judge any implementation of qnorm_rope or partial_rope against the contract, element by element."

# One line per label the report can print (tests/test_cli.py checks that every emulation's label has one).
# the labels the report can print: each semantics' (dsrope_gate.semantics), and the two words for none
LABELS = semantics.LABELS | {
    "no known semantics": "no emulation agrees with 99.9% of the elements on every evidence case",
    "nothing judged": "no element was judged: no semantics claimed",
}
VERDICT_MEANING = {
    "conforms": "every case ran and no element lies outside the error model",
    "does not conform": "an element outside the model, or a wrong shape/dtype/None returned",
    "partial": "every element judged is inside the model, but some cases were refused, crashed or had the "
    "wrong signature",
    "not run": "nothing judged in this direction (every case refused or crashed): no claim either way",
}
EXIT_STATUS = {
    0: "every direction judged conforms (an implementation without a grad_fn has no backward to judge)",
    1: "a direction does not conform, is partial, or was not run while another was: a CI step must not pass "
    "on cases it skipped",
    2: "nothing was run (every direction 'not run'), or a usage or load error",
}


def exit_status(results: list[dict]) -> int:
    """EXIT_STATUS for the results of a run (backward None: no grad_fn, forward only, not counted)."""
    verdicts = [r[d]["verdict"] for r in results for d in ("forward", "backward") if r[d] is not None]
    if all(v == "not run" for v in verdicts):
        return 2
    return 0 if all(v == "conforms" for v in verdicts) else 1


def epilog() -> str:
    """What --help says beyond the options: the ops' signatures, the verdicts, the labels, the exit status."""
    lines = ["An implementation is a callable with the signature of the op it stands for:"]
    lines += [f"  {op.signature}" for op in JUDGED.values()]
    lines += [
        "x [B, H, S, D] of any strides, dtype bf16/fp16/fp32; cos, sin FP32 [B, S, R]; the trailing R channels",
        "rotated as interleaved pairs (docs/contract.md). It runs on the canonical DeepSeek-V4/V3 cases, the",
        "golden inputs, one probe per layout class and the seeded sweep; the backward through autograd when the",
        "output has a grad_fn.",
        "",
        "Verdict, per direction (forward, backward):",
    ]
    lines += [f"  {k:18} {v}" for k, v in VERDICT_MEANING.items()]
    lines += ["", "Semantics read off the bits (the emulation each agrees with, bf16/fp16 cases for qnorm_rope):"]
    lines += [f"  {k:18} {v}" for k, v in LABELS.items()]
    lines += [
        "",
        "A case not run reads refused (ValueError, TypeError, NotImplementedError, AssertionError), crashed (any",
        "other exception), wrong signature (the callable cannot take the op's arguments) or wrong output.",
        "",
        "Exit status:",
    ]
    lines += [f"  {k}  {v}" for k, v in EXIT_STATUS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dsrope_gate.conformance",
        description=DESCRIPTION,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--op", choices=tuple(JUDGED), action="append", help="the op(s) to judge (default: both where given presets)"
    )
    ap.add_argument(
        "--impl",
        action="append",
        default=[],
        help="module.path:callable or path/to/file.py:callable; repeatable (each judged on its own)",
    )
    ap.add_argument(
        "--preset", action="append", default=[], help="a preset (dsrope_gate.presets), or 'all'; repeatable"
    )
    ap.add_argument("--against", help="a second implementation to compare each with, element by element")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible, else cpu")
    ap.add_argument("--examples", type=int, default=24, help="hypothesis-drawn cases per op (default 24)")
    ap.add_argument("--seed", type=int, default=0, help="the sweep's seed (default 0)")
    ap.add_argument(
        "--golden",
        type=Path,
        default=None,
        help="a golden store (default: $DSROPE_GOLDEN, else the checkout's golden/, else the installed one)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument(
        "--parity",
        action="store_true",
        help="the parity matrix of every pair of the implementations named (dsrope_gate.parity)",
    )
    ap.add_argument(
        "--verbose", action="store_true", help="progress on stderr per case (default: one line per implementation)"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("out/conformance"),
        help="the markdown report's folder (default out/conformance)",
    )
    args = ap.parse_args(argv)

    import os

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any Triton code is imported
    elif not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible")
    start = time.time()

    def progress(msg):
        print(f"[{time.time() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def target(spec):
        from dsrope_gate.targets import load_target

        try:
            return load_target(spec)
        except Exception as e:  # any error loading the user's code (a SyntaxError too) is a load error: rc 2
            ap.error(f"cannot load {spec!r}: {type(e).__name__}: {e}")

    jobs = {}  # op -> [(name, callable)]
    for spec in args.impl:
        if not args.op:
            ap.error("--impl needs --op")
        for op in args.op:
            jobs.setdefault(op, []).append((spec, target(spec)))
    if args.preset:
        from dsrope_gate import presets

        for impl in presets.load(args.preset, device, args.op, progress):
            jobs.setdefault(impl.op.name, []).append((impl.name, impl.fn))
    if not jobs:
        ap.error("nothing to judge: give --impl (with --op) or --preset")
    other = (args.against, target(args.against)) if args.against else None

    if args.parity:
        from dsrope_gate import parity

        return parity.main(jobs, device, args.examples, args.seed, args.golden, args.out, args.json, progress)
    results, metas = [], []
    for op, impls in jobs.items():
        each_case = progress if args.verbose else None
        r, meta = run(op, impls, device, args.examples, args.seed, args.golden, other, progress, each_case)
        results += r
        metas.append(meta)
    meta = metas[0] | {"cases": "/".join(str(m["cases"]) for m in metas)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(render(results, meta))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": metas, "results": results}, indent=1, default=str))
    # the result last, where a terminal or a CI log shows it: the summary ends with the verdict table
    print(summary(results, meta, args.out / "report.md" if not args.json else f"{args.out / 'report.md'}, {args.json}"))
    return exit_status(results)
