"""The conformance report in markdown: one row per implementation, op and direction, then per
implementation its layouts, writes, first violation, where the elements outside the model are (case kind,
dtype, x's row magnitude, ulp distances, a diagnosis), semantics shares per case, cases not run, and the
bitwise comparison with --against; and the command's short summary for the terminal, the verdict table last."""

from __future__ import annotations

import json

from dsrope_gate.conformance import violations
from dsrope_gate.conformance.judging import listing_text, semantics_text, verdict_text
from dsrope_gate.semantics import LABELS

# the verdicts a reader must not miss
EMPHASIZED = ("does not conform", "not run", "crashed", "timed out")


def _labels(direction: dict) -> set[str]:
    by_dtype = direction.get("semantics_by_dtype") or {}
    return set(direction["semantics"]).union(*by_dtype.values())


def _fmt_share(v: float) -> str:
    return "100%" if v == 1 else f"{100 * v:.3f}%"


def _header(meta: dict) -> str:
    return (
        f"contract {meta.get('contract', 'two-boundaries')}; "
        f"{meta['date']}; device {meta['device']}; torch {meta['torch']}; triton {meta['triton']}; "
        f"{meta['cases']} cases per implementation ({meta['sweep']} drawn, seed {meta['seed']}); {meta['golden']}"
    )


def verdict_table(results: list[dict]) -> list[str]:
    """One row per implementation, op and direction: the verdict (with its diagnosis where one explains every
    element outside the model), the semantics and the counts."""
    lines = [
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
            verdict = verdict_text(d, r)
            if d["verdict"] in EMPHASIZED:
                verdict = f"**{verdict}**"
            if d.get("diagnosis"):
                verdict += f" (diagnosis: {d['diagnosis']['name']})"
            sem = semantics_text(d)
            lines.append(
                f"| `{r['impl']}` | {r['op']} | {direction} | {verdict} | {sem} | {d['elements']} | "
                f"{d['outside_model']} | {len(d['not_run'])} |"
            )
    return lines


def write_line(w: dict) -> str:
    """One write into an input: the tensor, the case, the call and the first changed element."""
    where = f"element {w['index']}" if w["index"] is not None else f"a gap (storage element {w['storage_element']})"
    return (
        f"writes into {w['tensor']} in case {w['case']!r} ({w['direction']}): first at {where}, "
        f"{w['before']!r} -> {w['after']!r} ({w['changed_bytes']} bytes changed)"
    )


def first_violation_line(first: dict) -> str:
    return (
        f"First element outside the model: case {first['case']!r}, index {first['index']}, {first['channel']} "
        f"channel: got {first['got']!r}, allowed [{first['bounds'][0]!r}, {first['bounds'][1]!r}], reference "
        f"{first['contract']!r} ({first['ulp']} ulp)"
    )


def against_lines(r: dict) -> list[str]:
    a = r.get("against")
    if not a:
        return []
    out = []
    for direction in ("forward", "backward"):
        d = a.get(direction)
        if d:
            out.append(
                f"  against `{a['impl']}` {direction}: {_fmt_share(d['bitwise_equal'])} of elements bitwise equal, "
                f"max {d['max_ulp']} ulp apart"
            )
    return out


def summary(results: list[dict], meta: dict, report) -> str:
    """What the command prints: the run; per implementation and direction that is not clean, its verdict in
    words, its first element outside the model, where the others are, its writes into inputs and the cases
    not run; --against's comparison; where the full report is; and the verdict table last."""
    lines = [f"Conformance: {_header(meta)}"]
    for r in results:
        for direction in ("forward", "backward"):
            d = r[direction]
            if d is None:
                continue
            if d["verdict"] == "conforms" and not (direction == "forward" and r.get("against")):
                continue
            lines += ["", f"`{r['impl']}` {r['op']} {direction}: {verdict_text(d, r)}"]
            if d["first_violation"]:
                lines.append(f"  {first_violation_line(d['first_violation'])}")
            lines += [f"  {line}" for line in violations.lines(d)]
            lines += [f"  {write_line(w)}" for w in d["writes"][:3]]
            if len(d["writes"]) > 3:
                lines.append(f"  and {len(d['writes']) - 3} more writes (the report lists them)")
            if d["not_run"]:
                statuses = sorted({n["status"] for n in d["not_run"]})
                lines.append(f"  Not run: {len(d['not_run'])} cases ({', '.join(statuses)}; the report lists them)")
            if direction == "forward":
                lines += against_lines(r)
    lines += ["", f"Full report: {report}", ""]
    return "\n".join(lines + verdict_table(results)) + "\n"


def layouts_line(forward: dict) -> str:
    """The layout probes by outcome; refusals and raises grouped by what the implementation said."""
    groups: dict[str, list[str]] = {}
    said = {case: reason for reason, cases in forward.get("refusals", {}).items() for case in cases}
    for probe, outcome in forward["layouts"].items():
        key = said.get(probe, outcome) if outcome in ("refused", "raised", "wrong output") else outcome
        groups.setdefault(key, []).append(probe)
    return "Layouts: " + "; ".join(f"{key}: {', '.join(probes)}" for key, probes in groups.items())


def render(results: list[dict], meta: dict) -> str:
    lines = ["# Conformance report", "", _header(meta), "", *verdict_table(results)]
    named = {label for r in results for d in (r["forward"], r["backward"]) if d for label in _labels(d)}
    if named:
        lines += ["", "Semantics labels in this report:"]
        lines += [f"- `{label}`: {LABELS[label]}" for label in LABELS if label in named]
    for r in results:
        lines += ["", f"## `{r['impl']}` ({r['op']}, {r['device']})", ""]
        f = r["forward"]
        lines.append(layouts_line(f))
        lines.append("")
        wrote = ", ".join(f["writes_into_input"]) or "none"
        lines.append(f"Writes into its inputs: {wrote}. Output a token-major view: {f['token_major_output']}.")
        if r.get("death"):
            lines.append(f"Its process: {verdict_text(f, r)}; the cases before it are judged below.")
        for direction in ("forward", "backward"):
            d = r[direction]
            if d is None:
                lines += ["", "Backward: the output carries no grad_fn; forward only."]
                continue
            lines += ["", f"### {direction}", ""]
            ran = len({c["case"] for c in d["cases"]})
            lines.append(
                f"Verdict: {verdict_text(d, r)} ({d['elements']} elements of {ran} cases judged, {d['outside_model']} "
                f"outside the model, {len(d['not_run'])} cases not run); semantics: {semantics_text(d)}."
            )
            if d["first_violation"]:
                lines.append("First element outside the model (reproduction):")
                lines.append("```")
                lines.append(json.dumps(d["first_violation"], indent=1))
                lines.append("```")
            if d["writes"]:
                lines += ["", "Writes into inputs:"] + [f"- {write_line(w)}" for w in d["writes"]]
            bad = [c for c in d["cases"] if c["outside_model"]]
            if bad:
                lines += ["", f"#### Where the elements outside the model are ({direction})", ""]
                lines += violations.table(d)
                lines.append("")
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
                                f"{c['differ_rows']} rows differ, in channels {listing_text(c['differ_channels'])}"
                            )
    return "\n".join(lines) + "\n"
