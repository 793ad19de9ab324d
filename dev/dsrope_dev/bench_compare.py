"""Two runs of bench/bench.py side by side, target by target: each prefill row's share of copy bandwidth and
each decode row's time over copy_ (the numbers dsrope_dev.perf_targets holds limits on), before and after,
with each run's MISSED column.

A run is the folder `python -m bench.bench --out DIR` wrote: bench.csv (prefill rows) and decode.csv (decode
rows); either may be missing (`--decode` writes only the second). The targets are recomputed from the rows
with this tree's perf_targets, so both runs are held to the same limits.

    python -m tools.bench_compare BEFORE_DIR AFTER_DIR     # a markdown table on stdout, then a summary line
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from dsrope_dev import perf_targets

RUN_FILES = {"bench.csv": perf_targets.prefill_targets, "decode.csv": perf_targets.decode_targets}


def cell(text: str):
    """A CSV field as the bench wrote it: an int, a float, or the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_targets(folder: Path) -> dict[tuple[str, int], perf_targets.Target]:
    """(row, position among the row's targets) -> Target, for every row of a bench run's CSVs. Empty fields
    (a column another row has) are left out, as the bench's row dict did not hold them."""
    out = {}
    for name, targets_of in RUN_FILES.items():
        path = Path(folder) / name
        if not path.is_file():
            continue
        with open(path, newline="") as f:
            for record in csv.DictReader(f):
                row = {k: cell(v) for k, v in record.items() if v != ""}
                for i, target in enumerate(targets_of(row)):
                    out[target.row, i] = target
    return out


def value(target) -> str:
    return "not run" if target is None else "not measured" if math.isnan(target.value) else f"{target.value:.3f}"


def status(target) -> str:
    return "" if target is None else "MISSED" if target.missed else "met"


def compare(before: dict, after: dict) -> list[str]:
    """Markdown lines: every target of either run, before and after (value, status) and after - before; then
    a summary line. A target one run lacks says `not run` on that side."""
    lines = ["| row | target | before | after | after - before | before | after |", "|---|---|---|---|---|---|---|"]
    for key in list(dict.fromkeys([*before, *after])):
        b, a = before.get(key), after.get(key)
        delta = f"{a.value - b.value:+.3f}" if a is not None and b is not None else ""
        what = (a or b).what
        lines.append(f"| {key[0]} | {what} | {value(b)} | {value(a)} | {delta} | {status(b)} | {status(a)} |")
    lines.append("")
    lines.append(f"before: {summary(before)}; after: {summary(after)}")
    return lines


def summary(targets: dict) -> str:
    missed = sum(t.missed for t in targets.values())
    return f"{len(targets) - missed} of {len(targets)} met, {missed} MISSED"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path, help="the folder of the first bench run (bench.csv, decode.csv)")
    ap.add_argument("after", type=Path, help="the folder of the second bench run")
    args = ap.parse_args(argv)
    before, after = read_targets(args.before), read_targets(args.after)
    if not before and not after:
        print(f"no bench.csv or decode.csv in {args.before} or {args.after}")
        return 2
    print("\n".join(compare(before, after)))
    return 0
