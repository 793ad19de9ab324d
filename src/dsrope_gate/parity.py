"""The parity matrix: which pairs of implementations compute the same bits, where, and why not.

    python -m dsrope_gate.conformance --parity [--preset NAME ...] [--impl ...] [--op ...] [--device cpu|cuda]

A report over judged results: every named implementation is judged once on the same cases (the default
case set, dsrope_gate.conformance; each in a child process of its own from the command); then for every
pair, per op, direction and dtype: the share of elements whose bits are equal, the largest difference in
ulp, and the reason read from the semantics each was named with ("two-boundaries vs fp32-through"). A
trainer and an inference engine that must agree bit for bit (RL log-probs, distillation) read their pair's
row. Writes parity.md, parity.json and parity.png (a heatmap: one panel per op and direction, a row per
pair, a column per dtype; skipped with one line without matplotlib) into --out.
"""

from __future__ import annotations

import itertools
import json

from dsrope_reference.floats import NAN_VS_NUMBER

from dsrope_gate.cases import SHORT
from dsrope_gate.conformance import EXAMPLES, TIMEOUT, judge_all
from dsrope_gate.conformance.judging import against, semantics_text
from dsrope_gate.ops import DIRECTIONS, op_named

DTYPES = ("bfloat16", "float16", "float32")


def reason(labels_a: list[str] | None, labels_b: list[str] | None) -> str:
    """Why two implementations' bits may differ, from the labels each was named with in one dtype (None:
    that dtype carries no semantics for the op, [] no known semantics): the labels they do not share."""
    if labels_a is None or labels_b is None:
        return "semantics not judged in this dtype"
    if labels_a == labels_b:
        return f"same semantics ({', '.join(labels_a)})" if labels_a else "both no known semantics"
    only_a = [label for label in labels_a if label not in labels_b]
    only_b = [label for label in labels_b if label not in labels_a]
    if not only_a or not only_b:  # one side's labels are a tie that includes the other's: both in full
        only_a, only_b = labels_a, labels_b
    named = lambda labels: ", ".join(labels) or "no known semantics"
    return f"{named(only_a)} vs {named(only_b)}"


def pairs(results: list[dict], outputs: list[dict], cases) -> list[dict]:
    """One row per pair of implementations, direction and dtype: bitwise-equal share, max ulp, reason."""
    dtype_of = {p.case.name: p.case.dtype for p in cases}
    rows = []
    for (ra, oa), (rb, ob) in itertools.combinations(zip(results, outputs, strict=True), 2):
        for direction in DIRECTIONS:
            for dtype in DTYPES:
                row = {"op": ra["op"], "direction": direction, "dtype": dtype, "a": ra["impl"], "b": rb["impl"]}
                row |= {"elements": 0, "cases": 0, "bitwise_equal": None, "max_ulp": None}
                missing = [r["impl"] for r in (ra, rb) if r[direction] is None]
                if missing:
                    rows.append(row | {"reason": f"no backward: {', '.join(missing)} forward only"})
                    continue
                in_dtype = {name: out for name, out in oa.items() if dtype_of[name] == dtype}
                compared = against(in_dtype, ob)[direction]
                if compared is None:
                    if any(dtype_of[name] == dtype for name in dtype_of):
                        rows.append(row | {"reason": "no case of this dtype ran on both"})
                    continue
                row["cases"] = len(compared["cases"])
                row["elements"] = sum(c["elements"] for c in compared["cases"])
                row["bitwise_equal"], row["max_ulp"] = compared["bitwise_equal"], compared["max_ulp"]
                by_dtype_a = ra[direction]["semantics_by_dtype"]
                by_dtype_b = rb[direction]["semantics_by_dtype"]
                row["reason"] = reason(by_dtype_a.get(dtype), by_dtype_b.get(dtype))
                # the semantics are read on normal values only: a pair may share them and still differ where
                # one of the two leaves the error model (sglang's batched overrun on drawn cases of R not a power of 2)
                row["outside_a"], row["outside_b"] = (outside(r[direction], dtype) for r in (ra, rb))
                rows.append(row)
    return rows


def outside(record: dict, dtype: str) -> int:
    """The elements of one direction's cases of `dtype` outside the reference's error model."""
    return sum(c["outside_model"] for c in record["cases"] if c["dtype"] == dtype)


def parity(op, impls, device="cpu", examples=EXAMPLES, seed=0, golden_root=None, progress=print, isolate=False,
           timeout=TIMEOUT, contract="two-boundaries"):  # fmt: skip
    """(the pairs' rows, each implementation's conformance result, meta) of the implementations (Targets or
    (name, callable) pairs) on `op`, judged on the default case set."""
    judged = judge_all(
        op_named(op), impls, device, examples, seed, golden_root, progress, None, isolate, timeout, contract=contract
    )
    results, outputs, cases, meta = judged
    return pairs(results, outputs, cases), results, meta


# --- outputs ---------------------------------------------------------------------------------------------------


def share_text(v: float | None) -> str:
    if v is None:
        return "-"
    return "100%" if v == 1 else f"{100 * v:.3f}%"


def ulp_text(v: int | None) -> str:
    if v is None:
        return "-"
    return "NaN vs number" if v >= NAN_VS_NUMBER else str(v)


def render(rows: list[dict], results: list[dict], metas: list[dict]) -> str:
    meta = metas[0]
    lines = [
        "# Parity matrix",
        "",
        f"contract {meta.get('contract', 'two-boundaries')}; "
        f"{meta['date']}; device {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; cases per op "
        f"{'/'.join(str(m['cases']) for m in metas)} ({meta['sweep']} drawn, seed {meta['seed']}); {meta['golden']}",
        "",
        "Each implementation ran once on the same cases; a pair's share is of the elements of the cases both ran.",
        "",
        "| implementation | op | forward | semantics | backward | semantics |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = [f"`{r['impl']}`", r["op"]]
        for direction in DIRECTIONS:
            d = r[direction]
            cells += [d["verdict"], semantics_text(d)] if d is not None else ["forward only", ""]
        lines.append("| " + " | ".join(cells) + " |")
    panels = {}
    for row in rows:
        panels.setdefault((row["op"], row["direction"]), []).append(row)
    for (op, direction), group in panels.items():
        lines += ["", f"## {op} {direction}", ""]
        lines.append("| A | B | dtype | bitwise equal | max ulp | reason | outside the model (A / B) |")
        lines.append("|---|---|---|---|---|---|---|")
        for row in group:
            out = f"{row['outside_a']} / {row['outside_b']}" if "outside_a" in row else "-"
            lines.append(
                f"| `{row['a']}` | `{row['b']}` | {SHORT[row['dtype']]} | {share_text(row['bitwise_equal'])} | "
                f"{ulp_text(row['max_ulp'])} | {row['reason']} | {out} |"
            )
    return "\n".join(lines) + "\n"


def short(name: str, width: int = 42) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


# the colour of a share: bitwise equal, then how many elements in a million differ
BINS = (0.0, 0.9, 0.99, 0.999, 0.99999, 0.9999999999, 1.0001)
COLOURS = ("#b2182b", "#ef8a62", "#fddbc7", "#d1e5f0", "#67a9cf", "#1a9850")
BIN_NAMES = ("< 90%", "90-99%", "99-99.9%", "99.9-99.999%", "> 99.999%", "100%")


def picture(rows: list[dict], path) -> None:
    """One panel per op and direction: a row per pair, a column per dtype, coloured by the bitwise-equal share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    panels = {}
    for row in rows:
        if row["bitwise_equal"] is None:  # forward only, or no case ran on both: the markdown says which
            continue
        panels.setdefault((row["op"], row["direction"]), {}).setdefault((row["a"], row["b"]), {})[row["dtype"]] = row
    heights = [len(p) + 1.5 for p in panels.values()]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(13, 0.3 * sum(heights) + 0.8),
        squeeze=False,
        gridspec_kw={"height_ratios": heights, "hspace": 0.5},
    )
    axes = axes[:, 0]
    for ax, ((op, direction), by_pair) in zip(axes, panels.items(), strict=True):
        names = [f"{short(a)}  vs  {short(b)}" for a, b in by_pair]
        grid = [[(cells.get(dtype) or {}).get("bitwise_equal") for dtype in DTYPES] for cells in by_pair.values()]
        values = [[float("nan") if v is None else v for v in row] for row in grid]
        ax.imshow(values, cmap=ListedColormap(COLOURS), norm=BoundaryNorm(BINS, len(COLOURS)), aspect="auto")
        for i, cells in enumerate(by_pair.values()):
            for j, dtype in enumerate(DTYPES):
                row = cells.get(dtype)
                text = "-" if row is None else share_text(row["bitwise_equal"])
                if row is not None and row["max_ulp"]:
                    ulp = ulp_text(row["max_ulp"])
                    text += f"  ({ulp if ulp.startswith('NaN') else ulp + ' ulp'})"
                ax.text(j, i, text, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(DTYPES)), [SHORT[d] for d in DTYPES])
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.xaxis.tick_top()
        ax.set_title(f"{op} {direction}: share of bitwise-equal elements (max ulp apart)", fontsize=10, pad=18)
    handles = [Patch(color=c, label=n) for c, n in zip(COLOURS, BIN_NAMES, strict=True)]
    axes[-1].legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=len(COLOURS), fontsize=9,
                    frameon=False, title="pairs forward only or with no case in common: parity.md")  # fmt: skip
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write(rows: list[dict], results: list[dict], metas: list[dict], out, json_path, progress) -> str:
    """parity.md, parity.json and parity.png (when matplotlib is installed) into `out` (and the JSON to
    json_path); returns the markdown."""
    text = render(rows, results, metas)
    out.mkdir(parents=True, exist_ok=True)
    (out / "parity.md").write_text(text)
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        progress("parity.png skipped: matplotlib is not installed (pip install 'dsrope[report]' or matplotlib)")
    else:
        picture(rows, out / "parity.png")
    summary = [
        {"impl": r["impl"], "op": r["op"]}
        | {
            d: None if r[d] is None else {"verdict": r[d]["verdict"], "semantics": r[d]["semantics"]}
            for d in DIRECTIONS
        }
        for r in results
    ]
    document = json.dumps({"meta": metas, "implementations": summary, "pairs": rows}, indent=1, default=str)
    for path in (out / "parity.json", json_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(document)
    progress(f"wrote {out / 'parity.md'}, parity.json" + (" and parity.png" if (out / "parity.png").exists() else ""))
    return text
