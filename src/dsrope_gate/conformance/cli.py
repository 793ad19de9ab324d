"""The conformance command line: `python -m dsrope_gate.conformance` (nox -s conformance). Its arguments
and what it judges: dsrope_gate.conformance."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from dsrope_gate.conformance import run
from dsrope_gate.conformance.render import render
from dsrope_gate.ops import JUDGED

DESCRIPTION = "Judge any implementation of qnorm_rope or partial_rope against the contract, element by element."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dsrope_gate.conformance", description=DESCRIPTION)
    ap.add_argument(
        "--op", choices=tuple(JUDGED), action="append", help="the op(s) to judge (default: both where given presets)"
    )
    ap.add_argument("--impl", action="append", default=[], help="module.path:callable or path/to/file.py:callable")
    ap.add_argument("--preset", action="append", default=[], help="a preset (dsrope_gate.presets), or 'all'")
    ap.add_argument("--against", help="a second implementation to compare each with, element by element")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible, else cpu")
    ap.add_argument("--examples", type=int, default=24, help="hypothesis-drawn cases per op (default 24)")
    ap.add_argument("--seed", type=int, default=0, help="the sweep's seed (default 0)")
    ap.add_argument("--golden", type=Path, default=None, help="a golden store (default: the checkout's golden/)")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--parity", action="store_true", help="the parity matrix of every pair (dsrope_gate.parity)")
    ap.add_argument("--out", type=Path, default=Path("out/conformance"), help="the markdown report's folder")
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
        except (ValueError, ImportError, AttributeError, OSError) as e:
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
        r, meta = run(op, impls, device, args.examples, args.seed, args.golden, other, progress)
        results += r
        metas.append(meta)
    text = render(results, metas[0] | {"cases": "/".join(str(m["cases"]) for m in metas)})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": metas, "results": results}, indent=1, default=str))
    print(text)
    progress(f"wrote {args.out / 'report.md'}" + (f" and {args.json}" if args.json else ""))
    return 0
