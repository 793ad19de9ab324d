"""The forward+backward table of `bench --backward` (bench/bench.py), as pure functions the CPU tests can
reach (tests never import bench): which implementations a row runs, and the markdown of the rows.

A row is one (op, B, H, S) and one implementation (a dsrope_gate.presets.Implementation): its time in ms,
or a marker saying why there is none. The markers and what they mean are LEGEND's; each table ends with
the legend of the markers it shows.
"""

from __future__ import annotations

NO_BACKWARD = "no backward"
OVER_2_31 = "not run (> 2**31)"
FAILED = "failed"
LEGEND = {
    NO_BACKWARD: "the implementation is forward only: its result carries no grad_fn (Implementation.backward is None)",
    OVER_2_31: "the input has more than 2**31 elements and the implementation's kernel forms element offsets in 32 "
    "bits (Implementation.offsets_32bit): it would address wrong memory, and a fault there ends every later row",
    FAILED: "the call raised; the errors are listed under the table",
}


def not_run(impl, elements: int) -> str | None:
    """The marker for a forward+backward row of `impl` on an input of `elements` elements that is not timed,
    or None where it is timed."""
    if impl.backward is None:
        return NO_BACKWARD
    if impl.offsets_32bit and elements > 2**31:
        return OVER_2_31
    return None


def row(op: str, b: int, h: int, s: int, impl: str, ms: float | None = None, marker: str | None = None, error=""):
    """One cell's record: its time, or its marker (FAILED with the error)."""
    if (ms is None) == (marker is None):
        raise ValueError(f"row: give ms or marker, not both or neither (ms={ms}, marker={marker})")
    if marker is not None and marker not in LEGEND:
        raise ValueError(f"row: marker {marker!r} is none of {list(LEGEND)}")
    return dict(op=op, B=b, H=h, S=s, impl=impl, ms=ms, marker=marker, error=" ".join(error.split()))


def markdown(rows: list[dict], meta: str) -> str:
    """One table per op: a line per shape, a column per implementation (in the order first seen), each cell
    the time in ms or its marker; under each table the legend of the markers in it and the errors of its
    FAILED cells."""
    lines = [f"Measured {meta}.", ""]
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        impls = list(dict.fromkeys(r["impl"] for r in mine))
        shapes = list(dict.fromkeys((r["B"], r["H"], r["S"]) for r in mine))
        cells = {(r["B"], r["H"], r["S"], r["impl"]): r for r in mine}
        lines += [f"{op}, forward+backward, ms:", "", "| B | H | S | " + " | ".join(impls) + " |"]
        lines.append("|---|---|---|" + "---|" * len(impls))
        for b, h, s in shapes:
            shown = [_cell(cells.get((b, h, s, i))) for i in impls]
            lines.append(f"| {b} | {h} | {s} | " + " | ".join(shown) + " |")
        markers = [m for m in LEGEND if any(r["marker"] == m for r in mine)]
        if markers:
            lines += [""] + [f"- {m}: {LEGEND[m]}" for m in markers]
        lines += [
            f"  - {r['impl']} at {r['B']} x {r['H']} x {r['S']}: {r['error']}" for r in mine if r["marker"] == FAILED
        ]
        lines.append("")
    return "\n".join(lines)


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    return r["marker"] if r["marker"] is not None else f"{r['ms']:.3f}"
