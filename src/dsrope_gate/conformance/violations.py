"""Where the elements outside the model are: the one home of what the markdown report, the command's summary
and assert_conforms say about them.

Per judged case (`of_case`, stored in the case's entry): the elements judged and those outside per decade of
x's row RMS (the magnitude of the input row; a backward's elements are grouped by x's row as well, not by the
gradient's), the ulp distances of those outside from the reference (a histogram and the largest), and the
names of the op's diagnoses (dsrope_gate.diagnoses) that explain every one of them. Over a direction's cases
(`summarize`): the same counts per case kind, dtype and decade, the histogram and the largest distance, and
the diagnosis that explains every case with elements outside (none where one case is left unexplained).
"""

from __future__ import annotations

import math

import torch
from dsrope_reference.floats import NAN_VS_NUMBER, ulp_distance

# ulp histogram bins: (largest distance in the bin, its label); NaN against a number is its own bin
ULP_BINS = ((1, "1"), (2, "2"), (4, "3-4"), (16, "5-16"), (256, "17-256"), (NAN_VS_NUMBER - 1, ">256"))
NAN_BIN = "NaN vs number"


def x_row_rms(x: torch.Tensor) -> torch.Tensor:
    """The RMS of each row of x [B, H, S, D] over its D channels, FP64 on the CPU, [B, H, S]."""
    x64 = x.detach().to("cpu", torch.float64)
    return x64.pow(2).mean(-1).sqrt() if x64.shape[-1] else torch.zeros(x64.shape[:-1], dtype=torch.float64)


def decade(rms: float) -> str:
    """The decade of a row RMS, "[1e17, 1e18)"; "0" for a zero row, "non-finite" (a NaN or inf in the row)."""
    if not math.isfinite(rms):
        return "non-finite"
    e = math.floor(math.log10(rms)) if rms > 0 else None
    return f"[1e{e}, 1e{e + 1})" if e is not None else "0"


def ulp_bin(distance: int) -> str:
    return next((label for top, label in ULP_BINS if distance <= top), NAN_BIN)


def in_order(histogram: dict) -> dict:
    """A histogram's bins in the order of ULP_BINS, NaN last."""
    return {label: histogram[label] for label in (*(label for _, label in ULP_BINS), NAN_BIN) if label in histogram}


def ulps(got64: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The ulp distance of each element judged (FP64 values of `dtype`) from the reference, in `dtype`."""
    return ulp_distance(got64.to(dtype), ref.to(dtype))


def of_case(op, direction: str, p, got64: torch.Tensor, model, ok: torch.Tensor) -> dict:
    """The fields of a judged case's entry that say where its elements are (every case has the first: the
    denominators of summarize's groups)."""
    rows = x_row_rms(p.inputs.x)
    outside = ~ok
    per_row_outside = outside.sum(-1)
    any_outside = bool(outside.any())
    # ulp distances only where some element is outside: most judged cases have none, and this runs on each
    distance = ulps(got64, model.ref, p.inputs.x.dtype) if any_outside else None
    per_row_max = torch.where(outside, distance, 0).amax(-1) if any_outside else torch.zeros_like(per_row_outside)
    where: dict[str, dict] = {}
    d = got64.shape[-1]
    per_row = zip(*(t.flatten().tolist() for t in (rows, per_row_outside, per_row_max)), strict=True)
    for rms, n, most in per_row:
        group = where.setdefault(decade(rms), {"elements": 0, "outside": 0, "max_ulp": 0})
        group["elements"] += d
        group["outside"] += n
        group["max_ulp"] = max(group["max_ulp"], most)
    fields = {"x_row_rms": where}
    if any_outside:
        histogram: dict[str, int] = {}
        for v in distance[outside].tolist():
            histogram[ulp_bin(v)] = histogram.get(ulp_bin(v), 0) + 1
        fields["ulp_histogram"] = in_order(histogram)
        fields["explained_by"] = [
            diagnosis.name
            for diagnosis in op.diagnoses.get(direction, ())
            if diagnosis.explains(p.case, p.inputs, got64, model, outside)
        ]
    return fields


def summarize(op, direction: str, record: dict) -> dict:
    """A direction's fields that say where its elements outside the model are, from its cases' entries."""
    groups: dict[tuple, dict] = {}
    histogram: dict[str, int] = {}
    for c in record["cases"]:
        for rms, counts in c["x_row_rms"].items():
            group = groups.setdefault((c["kind"], c["dtype"], rms), {"elements": 0, "outside": 0, "max_ulp": 0})
            group["elements"] += counts["elements"]
            group["outside"] += counts["outside"]
            group["max_ulp"] = max(group["max_ulp"], counts["max_ulp"])
        for label, n in c.get("ulp_histogram", {}).items():
            histogram[label] = histogram.get(label, 0) + n
    where = [
        {"kind": kind, "dtype": dtype, "x_row_rms": rms} | counts
        for (kind, dtype, rms), counts in groups.items()
        if counts["outside"]
    ]
    bad = [c for c in record["cases"] if c["outside_model"]]
    named = [d for d in op.diagnoses.get(direction, ()) if bad and all(d.name in c["explained_by"] for c in bad)]
    return {
        "where": where,
        "max_ulp": max((g["max_ulp"] for g in where), default=0),
        "ulp_histogram": in_order(histogram),
        "diagnosis": {"name": named[0].name, "text": named[0].text} if named else None,
    }


# --- in words ---------------------------------------------------------------------------------------------------


def _ulp_text(distance: int) -> str:
    return "(a NaN against a number)" if distance >= NAN_VS_NUMBER else str(distance)


def histogram_text(record: dict) -> str:
    return ", ".join(f"{label}: {n}" for label, n in record["ulp_histogram"].items())


def lines(record: dict, shown: int = 6) -> list[str]:
    """Where the elements outside the model are, in plain lines (assert_conforms's message, the summary):
    the groups that hold the most first."""
    where = sorted(record.get("where") or [], key=lambda g: -g["outside"])
    if not where:
        return []
    groups = ", ".join(
        f"{g['kind']} {g['dtype']} {g['x_row_rms']} {g['outside']}/{g['elements']} (max {_ulp_text(g['max_ulp'])} ulp)"
        for g in where[:shown]
    )
    more = f"; and {len(where) - shown} more groups" if len(where) > shown else ""
    out = [
        f"Where (case kind, dtype, decade of x's row rms: outside / judged): {groups}{more}",
        f"Ulp distances from the reference (outside the model): {histogram_text(record)}; "
        f"max {_ulp_text(record['max_ulp'])}",
    ]
    if record.get("diagnosis"):
        out.append(f"Diagnosis: {record['diagnosis']['name']}: {record['diagnosis']['text']}.")
    return out


def table(record: dict) -> list[str]:
    """The same as a markdown table, for the report."""
    where = record.get("where") or []
    if not where:
        return []
    out = [
        "| case kind | dtype | x's row rms | outside the model | judged | max ulp |",
        "|---|---|---|---|---|---|",
    ]
    out += [
        f"| {g['kind']} | {g['dtype']} | {g['x_row_rms']} | {g['outside']} | {g['elements']} | "
        f"{_ulp_text(g['max_ulp'])} |"
        for g in where
    ]
    out += ["", f"Ulp distances from the reference: {histogram_text(record)}."]
    if record.get("diagnosis"):
        out += ["", f"**Diagnosis: {record['diagnosis']['name']}**: {record['diagnosis']['text']}."]
    return out
