"""The accuracy report's table: rows of kernel x dtype x direction (elements, the share of the error
budget used, max ULP, bit-exact share, error-model violations, golden status), rendered as markdown and
as a chart of the budget used."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy
import torch
from dsrope_reference.floats import budget_used, describe_violation, judge, ulp_distance

# the direction each judged stage belongs to; the forward's rstd is its own row
DIRECTION = {"out": "forward", "rstd": "forward (rstd)", "dx": "backward"}


def ulps(out: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    ref = ref64.to(torch.float32).to(out.dtype) if out.dtype != torch.float32 else ref64.to(torch.float32)
    return ulp_distance(out.detach().cpu(), ref)


class Table:
    def __init__(self):
        self.rows = defaultdict(
            lambda: dict(elements=0, violations=0, exact=0, max_ulp=0, budget=0.0, golden=set(), first="")
        )
        self.errors = defaultdict(list)  # stage -> budget used per element, for the histogram
        self.notes = []  # rows left out, and why: printed under the table

    def add(self, kernel, dtype, stage, out, ref, lo, hi, golden_status=None):
        check = judge(out, ref, lo, hi)
        row = self.rows[(kernel, dtype, DIRECTION[stage])]
        row["elements"] += check.checked
        row["violations"] += check.violations
        row["exact"] += check.bit_exact
        row["max_ulp"] = max(row["max_ulp"], check.max_ulp)
        if check.violations and not row["first"]:
            row["first"] = check.first_violation
        if golden_status:
            row["golden"].add(golden_status)
        used = budget_used(out.detach().to("cpu", torch.float64), *(t.to(torch.float64) for t in (ref, lo, hi)))
        row["budget"] = max(row["budget"], float(used.max()) if used.numel() else 0.0)
        self.errors[f"{kernel}.{stage} {dtype}"].append(used[torch.isfinite(ref)])
        return check

    def add_versus(self, kernel, dtype, direction, ours, theirs, model):
        """A differential row: ours against another implementation's output `theirs` under `model`."""
        ours, theirs = ours.detach().cpu(), theirs.detach().cpu()
        distance = ulp_distance(ours, theirs)
        value = theirs.to(torch.float64)
        outside = ~((value >= model.lo) & (value <= model.hi))
        disagree = (model.lo == model.hi) & (distance > 0)
        bad = outside | disagree
        row = self.rows[(kernel, dtype, direction)]
        used = budget_used(value, model.ref.to(torch.float64), model.lo.to(torch.float64), model.hi.to(torch.float64))
        row["budget"] = max(row["budget"], float(used.max()) if used.numel() else 0.0)
        row["elements"] += theirs.numel()
        row["violations"] += int(bad.sum())
        row["exact"] += int((distance == 0).sum())
        row["max_ulp"] = max(row["max_ulp"], int(distance.max()) if distance.numel() else 0)
        if bad.any() and not row["first"]:
            i = tuple(bad.nonzero()[0].tolist())
            theirs_judged = describe_violation(i, value, model.ref, model.lo, model.hi, "theirs")
            row["first"] = f"{theirs_judged}; ours {ours[i].item()!r}"


def render(table: Table, meta: dict) -> tuple[str, list[dict]]:
    head = ["kernel", "dtype", "direction", "elements", "budget used", "max ulp", "bit-exact", "violations", "golden"]
    rows = []
    for (kernel, dtype, direction), r in sorted(table.rows.items()):
        rows.append(
            dict(
                kernel=kernel,
                dtype=dtype,
                direction=direction,
                elements=r["elements"],
                budget_used=r["budget"],
                max_ulp=r["max_ulp"],
                bit_exact=r["exact"] / max(r["elements"], 1),
                violations=r["violations"],
                golden="; ".join(sorted(r["golden"])) or "-",
                first_violation=r["first"],
            )
        )
    lines = [
        f"device: {meta['device']}; torch {meta['torch']}; triton {meta['triton']}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['dtype']} | {r['direction']} | {r['elements']} | {r['budget_used']:.3f} | "
            f"{r['max_ulp']} | {r['bit_exact']:.4%} | {r['violations']} | {r['golden']} |"
        )
    lines += ["", BUDGET_NOTE]
    lines += ["", *(f"note: {n}" for n in table.notes)] if table.notes else []
    return "\n".join(lines), rows


BUDGET_NOTE = (
    "budget used: over the row, the largest |result - correctly rounded reference| divided by the room the "
    "error model leaves that element on its side (<= 1 is inside the model; 0: every element correctly "
    "rounded). The room is counted in representable values: in bf16/fp16 it is mostly one value, so a result "
    "one rounding step off, where the exact value lies close enough to a rounding boundary for the model to "
    "allow that step, reads 1.000. max ulp counts representable values between result and reference: where a "
    "rotation nearly cancels, the reference is tiny and an error far inside the budget is thousands of its "
    "ulps (the fp32 rows)."
)


def chart(table: Table, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    stages = sorted(table.errors)
    cols = 3
    fig, axes = plt.subplots((len(stages) + cols - 1) // cols, cols, figsize=(15, 2.6 * ((len(stages) + 2) // 3)))
    bins = numpy.linspace(0.0, 1.1, 23)  # the budget used in steps of 0.05; the last bin holds > 1.05
    for ax, stage in zip(axes.flat, stages, strict=False):
        e = torch.cat(table.errors[stage]).to(torch.float64)
        top = float(e.max()) if e.numel() else 0.0
        ax.hist(e.clamp(max=1.09).numpy(), bins=bins, log=True)
        ax.axvline(1.0, color="red", linewidth=0.8)
        ax.set_title(f"{stage}: {e.numel()} elements, max {top:.3f} of the budget", fontsize=8)
        ax.set_xlabel("|error| / allowed error (1 = the error model's bound)", fontsize=7)
    for ax in list(axes.flat)[len(stages) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True
