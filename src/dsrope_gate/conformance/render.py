"""The conformance report in markdown: one row per implementation, op and direction, then per
implementation its layouts, writes, first violation, semantics shares per case, cases not run, and the
bitwise comparison with --against."""

from __future__ import annotations

import json

from dsrope_gate.conformance.judging import semantics_text
from dsrope_gate.semantics import LABELS

# the verdicts a reader must not miss
EMPHASIZED = {"does not conform": "**does not conform**", "not run": "**not run**"}


def _labels(direction: dict) -> set[str]:
    by_dtype = direction.get("semantics_by_dtype") or {}
    return set(direction["semantics"]).union(*by_dtype.values())


def _fmt_share(v: float) -> str:
    return "100%" if v == 1 else f"{100 * v:.3f}%"


def render(results: list[dict], meta: dict) -> str:
    lines = [
        "# Conformance report",
        "",
        f"{meta['date']}; device {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; "
        f"{meta['cases']} cases per implementation ({meta['sweep']} drawn, seed {meta['seed']}); {meta['golden']}",
        "",
        "| implementation | op | direction | verdict | semantics | elements | outside the model | not run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for direction in ("forward", "backward"):
            d = r[direction]
            if d is None:
                row = f"| `{r['impl']}` | {r['op']} | backward | no backward (no grad_fn): forward only | | | | |"
                lines.append(row)
                continue
            verdict = EMPHASIZED.get(d["verdict"], d["verdict"])
            sem = semantics_text(d)
            lines.append(
                f"| `{r['impl']}` | {r['op']} | {direction} | {verdict} | {sem} | {d['elements']} | "
                f"{d['outside_model']} | {len(d['not_run'])} |"
            )
    named = {label for r in results for d in (r["forward"], r["backward"]) if d for label in _labels(d)}
    if named:
        lines += ["", "Semantics labels in this report:"]
        lines += [f"- `{label}`: {LABELS[label]}" for label in LABELS if label in named]
    for r in results:
        lines += ["", f"## `{r['impl']}` ({r['op']}, {r['device']})", ""]
        f = r["forward"]
        lines.append("Layouts: " + "; ".join(f"{k}: {v}" for k, v in f["layouts"].items()))
        lines.append("")
        wrote = ", ".join(f["writes_into_input"]) or "none"
        lines.append(f"Writes into its inputs: {wrote}. Output a token-major view: {f['token_major_output']}.")
        for direction in ("forward", "backward"):
            d = r[direction]
            if d is None:
                lines += ["", "Backward: the output carries no grad_fn; forward only."]
                continue
            lines += ["", f"### {direction}", ""]
            ran = len({c["case"] for c in d["cases"]})
            lines.append(
                f"Verdict: {d['verdict']} ({d['elements']} elements of {ran} cases judged, {d['outside_model']} "
                f"outside the model, {len(d['not_run'])} cases not run); semantics: {semantics_text(d)}."
            )
            if d["first_violation"]:
                lines.append("First element outside the model (reproduction):")
                lines.append("```")
                lines.append(json.dumps(d["first_violation"], indent=1))
                lines.append("```")
            bad = [c for c in d["cases"] if c["outside_model"]]
            if bad:
                lines.append(
                    "Elements outside the model per case: "
                    + ", ".join(f"{c['case']} {c['outside_model']}/{c['elements']}" for c in bad)
                )
            labels = sorted({label for c in d["cases"] for label in c.get("shares", {})})
            if labels:
                lines += ["", "| case | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
                for c in d["cases"]:
                    if "shares" in c:
                        cells = " | ".join(_fmt_share(c["shares"][label]) for label in labels)
                        lines.append(f"| {c['case']} | {cells} |")
            if d["not_run"]:
                lines += [
                    "",
                    "Not run: " + "; ".join(f"{n['case']}: {n['status']} ({n['error']})" for n in d["not_run"][:12]),
                ]
                if len(d["not_run"]) > 12:
                    lines[-1] += f"; and {len(d['not_run']) - 12} more (the JSON lists every one)"
        if "against" in r:
            a = r["against"]
            lines += ["", f"### against `{a['impl']}`", ""]
            for direction in ("forward", "backward"):
                d = a.get(direction)
                if d:
                    equal = _fmt_share(d["bitwise_equal"])
                    lines.append(f"{direction}: {equal} of elements bitwise equal, max {d['max_ulp']} ulp apart")
                    for c in d["cases"]:
                        if c["bitwise_equal"] < 1:
                            lines.append(
                                f"- {c['case']}: {_fmt_share(c['bitwise_equal'])} equal, max {c['max_ulp']} ulp, "
                                f"{c['differ_rows']} rows differ, in channels {c['differ_channels']}"
                            )
    return "\n".join(lines) + "\n"
