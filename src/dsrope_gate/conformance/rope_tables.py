"""The rope_tables op through the conformance command's doors (ops.ROPE_TABLES.own_judge_module): its cases, how
a table builder is loaded and called, and its results in the row ops' JSON shape, so that the command's report
and exit status, the parity matrix and assert_conforms read them as they read the others.

An implementation is `rope_tables(positions, rotary, theta, rope_scaling) -> (cos, sin)` (dsrope_gate.tables):
a callable, or a tables.TableBuilder, which also declares the attention factor it folds into its tables (any
callable with an `attention_factor(rope_scaling)` attribute does). The cases: dsrope_gate.tables.CASES. Each
call gets a fresh copy of the case's positions, whose bytes are compared before and after: a write into them
fails the verdict. A table that is not two FP32 [B, S, R] tensors is a wrong output. The pairs' entries
(k < R/2) of cos and sin are judged against the contract's model (dsrope_reference.rope_tables, computed
once per case and declared factor) and their agreement with every label read (tables.classify).

The result's forward record holds per case its kind (v4-main, v4-compress, v3, ramp-clamped), the declared
factor and the labels' shares; `attention_factors` names the factors other than 1 (the verdict's words say
them). A table op has no backward (None). A case's output, for --against and the parity matrix: cos and sin
stacked, [2, B, S, R/2].
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from dsrope_reference.floats import ulp_distance
from dsrope_reference.rope_tables import CPU_ULPS, CUDA_ULPS

from dsrope_gate import tables
from dsrope_gate.conformance.calling import (
    REFUSALS,
    Call,
    Watch,
    error_line,
    same_layout_copy,
    signature_problem,
)
from dsrope_gate.conformance.judging import Prepared, claim, refusals, verdict, verdict_text


class TableInputs(NamedTuple):
    """A table case's one input: positions int64 [B, S]."""

    positions: torch.Tensor


def collect_cases(op, progress, device="cpu"):
    """(the prepared cases, a note): tables.CASES with their positions on `device`; the reference is computed per
    case and declared factor when first judged (tables.reference_model keeps it)."""
    made = [Prepared(case, TableInputs(case.position_ids(device)), contract=tables.CONTRACT) for case in tables.CASES]
    progress(f"{len(made)} cases")
    return made, f"table cases: dsrope_gate.tables.CASES ({len(made)})"


def preset_entries(names, progress) -> list[tuple]:
    """(preset, builder name, TableBuilder) of every table builder of the named presets (NAME, NAME@VERSION or
    all; a preset without table builders is passed over, with a line where it was named)."""
    from dsrope_gate import table_builders

    if "all" in names:
        names = list(table_builders.BUILDERS)
    found = []
    for preset in dict.fromkeys(names):
        if preset.partition("@")[0] not in table_builders.BUILDERS:
            progress(f"preset {preset}: no table builders (dsrope_gate.table_builders.BUILDERS)")
            continue
        found += [(preset, b.name, b) for b in table_builders.load([preset], progress)]
    return found


def load_preset(preset: str, name: str, device: str):
    """The table builder `name` of preset `preset` (a TableBuilder: it declares its attention factor)."""
    from dsrope_gate import table_builders

    said = []
    found = [b for b in table_builders.load([preset], said.append) if b.name == name]
    if not found:
        raise LookupError("; ".join(said) or f"preset {preset} has no table builder {name!r}")
    return found[0]


def call(op, fn, case, inputs, in_place=False, device=None, started=None) -> Call:
    """fn on a fresh copy of the case's positions (on `device`), its writes into them watched: a Call whose out
    is the pairs' entries of cos and sin stacked [2, B, S, R/2] (on the CPU) and whose extras hold the attention
    factor fn declares for the case."""
    wrong = signature_problem(op, fn)
    if wrong:
        return Call("wrong signature", error=wrong)
    if started:
        started("forward")
    positions = same_layout_copy(inputs[0], device)
    watch = Watch({"positions": positions}, "forward")
    try:
        with torch.no_grad():
            out = op.call(fn, case, positions, inputs)
        factor = tables.declared_factor(fn, case.rope_scaling)
    except REFUSALS as e:
        return Call("refused", error=error_line(e))
    except Exception as e:  # a builder's crash is a finding, never the command's
        return Call("raised", error=error_line(e))
    writes = watch.writes()
    problem = tables.malformed(case, out)
    if problem:
        return Call("wrong output", error=problem, writes=writes)
    half = case.rotary // 2
    pairs = torch.stack([t[..., :half].detach() for t in out]).cpu()
    return Call("ok", out=pairs, writes=writes, extras={"attention_factor": factor})


def case_kind(case) -> str:
    """The column of a case in the parity matrix: its configuration (tables.kind)."""
    return tables.kind(case)


def first_violation(case, judged: tables.TableVerdict, pairs: torch.Tensor, cuda: bool) -> dict:
    """The first entry outside the model, in the fields the report reads (index: [table, b, s, k], table 0 cos
    and 1 sin), with what rebuilds its positions."""
    t, b, s, k = judged.first
    model = tables.reference_model(case, judged.attention_factor, CUDA_ULPS if cuda else CPU_ULPS)[t]
    value, ref = pairs[t, b, s, k].double(), model.ref[b, s, k]
    position = int(case.position_ids()[b, s])
    return {
        "case": case.name,
        "index": [t, b, s, k],
        "where": f"{('cos', 'sin')[t]}, position {position}, pair {k}",
        "got": value.item(),
        "contract": ref.item(),
        "bounds": [model.lo[b, s, k].item(), model.hi[b, s, k].item()],
        "ulp": int(ulp_distance(value.float(), ref.float())),
        "attention_factor": judged.attention_factor,
        "recipe": f"from dsrope_gate.tables import *; case = {case!r}; positions = case.position_ids()",
    }


def run_impl(name: str, caller, op, cases, device: str, progress, each_case=None, accept=()):
    """(result as in the JSON, the outputs per case: (pairs [2, B, S, R/2], None)) of one table builder over the
    prepared cases; `caller(case, inputs)` gives a calling.Call (in this process or a child's, whose death ends
    the run with the cases judged so far). `accept` names row diagnoses: none applies to tables."""
    from dsrope_gate.conformance.isolation import ChildDied

    record = {"elements": 0, "outside_model": 0, "first_violation": None, "cases": [], "not_run": [], "writes": []}
    outputs, death = {}, None
    for i, p in enumerate(cases, 1):
        case = p.case
        if each_case:
            each_case(f"{name} {op} {i}/{len(cases)} {case.name}")
        try:
            result = caller(case, p.inputs)
        except ChildDied as e:
            death = e.death
            break
        record["writes"] += [{"case": case.name} | write for write in result.writes]
        if result.status != "ok":
            record["not_run"].append({"case": case.name, "status": result.status, "error": result.error})
            continue
        factor = result.extras["attention_factor"]
        judged = tables.judge_pairs(case, result.out[0], result.out[1], factor, device == "cuda")
        outputs[case.name] = (result.out, None)
        record["cases"].append(
            {"case": case.name, "kind": tables.kind(case), "dtype": "float32", "elements": judged.elements}
            | {"outside_model": judged.outside, "attention_factor": factor, "shares": judged.shares}
        )
        record["elements"] += judged.elements
        record["outside_model"] += judged.outside
        if judged.outside and record["first_violation"] is None:
            record["first_violation"] = first_violation(case, judged, result.out, device == "cuda")
    record |= {"accepted": None, "where": [], "max_ulp": 0, "ulp_histogram": {}, "diagnosis": None}
    record["verdict"] = verdict(record, death)
    record["conforms"] = claim(record["verdict"])
    record["semantics"] = tables.classify([c["shares"] for c in record["cases"]])
    record["semantics_by_dtype"] = {"float32": record["semantics"]} if record["cases"] else {}
    factors = {c["kind"]: c["attention_factor"] for c in record["cases"]}
    record["attention_factors"] = {kind: factor for kind, factor in factors.items() if factor != 1}
    record |= {"layouts": {}, "refusals": refusals(record["not_run"]), "token_major_output": None}
    record["writes_into_input"] = sorted({w["tensor"] for w in record["writes"]})
    res = {"impl": name, "op": op.name, "device": device, "contract": tables.CONTRACT}
    res |= {"forward": record, "backward": None}
    if death is not None:
        res["death"] = {"verdict": death.verdict, "reason": death.reason, "case": death.case, "call": death.direction}
    progress(f"{name} {op}: forward {verdict_text(record, res)} ({len(cases)} cases)")
    return res, outputs


def first_violation_lines(first: dict, prepared) -> list[str]:
    """assert_conforms's words for the first entry outside the model, with what reproduces it."""
    t, b, s, k = first["index"]
    call = "cos, sin = fn(positions, case.rotary, case.theta, case.rope_scaling)"
    return [
        f"First entry outside the model: case {first['case']!r}, {first['where']}: got {first['got']!r}, allowed "
        f"[{first['bounds'][0]!r}, {first['bounds'][1]!r}], reference {first['contract']!r} ({first['ulp']} ulp; "
        f"declared attention factor {first['attention_factor']:.6g})",
        "Reproduce (paste into Python, with fn your implementation):",
        f"  {first['recipe']}",
        f"  {call}; print({('cos', 'sin')[t]}[{b}, {s}, {k}])",
    ]
