"""Judging: the cases an implementation runs on (with the reference's models, computed once), each output
against the error model element by element, the semantics read off the bits, two implementations compared
bit by bit, and one implementation's results over every case."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from dsrope_reference.floats import describe_violation, inside, ulp_distance
from dsrope_reference.rope import Model

from dsrope_gate import semantics
from dsrope_gate.cases import Case, Inputs
from dsrope_gate.conformance import violations
from dsrope_gate.ops import DEFAULT_CONTRACT, DIRECTIONS, Op

# A label is named where its emulation agrees best (ties together) with this share on every case.
THRESHOLD = 0.999


@dataclass
class Prepared:
    """A case ready to judge: its inputs on the device, the reference's model per direction (FP64, CPU),
    and the emulations' outputs per direction (computed at first use, once whatever the number of
    implementations judged)."""

    case: Case
    inputs: Inputs
    models: dict = field(default_factory=dict)
    emulated: dict = field(default_factory=dict)
    contract: str = DEFAULT_CONTRACT  # the contract the models are of (dsrope_reference.contracts)

    @property
    def recipe(self) -> str:
        """Python that rebuilds the inputs (a golden case's stored values are what its recipe makes)."""
        where = "from dsrope_gate.cases import *; from dsrope_gate.layouts import Layout; "
        device = self.inputs.x.device.type
        tensors = "; ".join(f"{k} {describe(getattr(self.inputs, k))}" for k in ("x", "cos", "grad"))
        return f"{where}x, cos, sin, grad = {self.case!r}.build({device!r})  # {tensors}"


def describe(t: torch.Tensor) -> str:
    return f"shape {list(t.shape)} strides {list(t.stride())} offset {t.storage_offset()} {t.dtype}"


def prepare(op: Op, case: Case, inputs: Inputs, models: dict | None = None, contract: str = DEFAULT_CONTRACT):
    """The case with its reference models under `contract`: given (a golden case's stored ones, the default
    contract's) or computed here."""
    if models is None:
        stages = op.reference(case, inputs, contract)
        models = {direction: stages[stage] for direction, stage in DIRECTIONS.items()}
    return Prepared(case, inputs, models, contract=contract)


# --- one output against the reference ---------------------------------------------------------------------


def first_violation(op: Op, p: Prepared, direction: str, got64: torch.Tensor, model: Model, ok) -> dict:
    """The first element outside the model, with what reproduces it: `input` the values it was computed from
    (x's in the forward, the gradient's in the backward), `x_row_rms` the RMS of x's row in both."""
    i = tuple(int(v) for v in (~ok).nonzero()[0].tolist())
    b, h, s, d = i
    x = p.inputs.x if direction == "forward" else p.inputs.grad
    dim, r = x.shape[-1], p.case.rotary
    pair = d - (d - (dim - r)) % 2 if d >= dim - r else None
    row = x[b, h, s].detach().cpu().double()
    k = (pair - (dim - r)) // 2 if pair is not None else None
    return {
        "case": p.case.name,
        "recipe": p.recipe,
        "index": list(i),
        "message": describe_violation(i, got64, model.ref, model.lo, model.hi, "got"),
        "channel": "rotary" if pair is not None else "leading",
        "input": [row[pair].item(), row[pair + 1].item()] if pair is not None else row[d].item(),
        "cos_sin": [p.inputs.cos[b, s, k].item(), p.inputs.sin[b, s, k].item()] if k is not None else None,
        "got": got64[i].item(),
        "contract": model.ref[i].item(),
        "bounds": [model.lo[i].item(), model.hi[i].item()],
        "rotary": r,
        "eps": p.case.eps if "eps" in op.signature else None,
        "x_row_rms": float(violations.x_row_rms(p.inputs.x[b, h, s][None, None, None])),
        "ulp": int(violations.ulps(got64[i], model.ref[i], p.inputs.x.dtype)),
    }


def judge(op: Op, p: Prepared, direction: str, got: torch.Tensor):
    """(elements, outside, first violation or None, where: violations.of_case) of got against the model."""
    model = p.models[direction]
    got64 = got.detach().to("cpu", torch.float64)
    ok = inside(got64, model.ref, model.lo, model.hi)
    outside = int((~ok).sum())
    first = first_violation(op, p, direction, got64, model, ok) if outside else None
    return got.numel(), outside, first, violations.of_case(op, direction, p, got64, model, ok)


def shares(op: Op, p: Prepared, direction: str, got: torch.Tensor) -> dict:
    """Per known semantics: the share of elements whose bits equal its emulation's."""
    if direction not in p.emulated:
        x, cos, sin, grad = (t.detach().cpu() for t in p.inputs)
        emulations = op.emulations[direction].items()
        p.emulated[direction] = {
            label: emulate(x, cos, sin, p.case.rotary, p.case.eps, grad) for label, emulate in emulations
        }
    got = got.detach().cpu()
    return {label: semantics.agreement(got, out) for label, out in p.emulated[direction].items()}


def listing(values: list, shown: int = 16) -> dict:
    """A list too long to print whole: how many there are, the first `shown` and the last."""
    return {"count": len(values), "first": values[:shown], "last": values[-1] if values else None}


def listing_text(found: dict) -> str:
    """A listing in words: "448, 449, 450 (3 in all)", "448, ..., 463 and 48 more (64 in all, the last 511)"."""
    n, first = found["count"], found["first"]
    if n <= len(first):
        return f"{', '.join(map(str, first))} ({n} in all)"
    return f"{', '.join(map(str, first))} and {n - len(first)} more ({n} in all, the last {found['last']})"


def bits_compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    """Two implementations' outputs on the same case: bitwise-equal share, max ulp, where they differ."""
    a, b = a.detach().cpu(), b.detach().cpu()
    distance = ulp_distance(a, b)
    same = distance == 0
    differ = (~same).nonzero()
    return {
        "elements": a.numel(),
        "bitwise_equal": float(same.float().mean()) if a.numel() else 1.0,
        "max_ulp": int(distance.max()) if a.numel() else 0,
        "differ_channels": listing(sorted({int(c) for c in differ[:, -1].tolist()})),
        "differ_rows": int(torch.unique(differ[:, :-1], dim=0).shape[0]) if len(differ) else 0,
    }


# --- one implementation, every case ---------------------------------------------------------------------


def run_impl(name: str, caller, op: Op, cases: list[Prepared], device: str, progress, each_case=None, accept=()):
    """(result as in the JSON, the outputs per case for --against) of one implementation: `caller(case,
    inputs)` gives a calling.Call per case (in this process, or a child's: dsrope_gate.conformance.isolation,
    whose death ends the run with the cases judged so far). `progress` gets one line when the implementation
    is judged, `each_case` (when given) one per case. `accept`: the names of diagnoses the user accepts: where
    one explains every element outside the model of a direction, they do not fail its verdict."""
    from dsrope_gate.conformance.isolation import ChildDied

    directions = {"forward": _direction(), "backward": _direction()}
    layouts, wrote, token_major, outputs = {}, set(), None, {}
    any_backward, death = False, None
    for i, p in enumerate(cases, 1):
        case = p.case
        if each_case:
            each_case(f"{name} {op} {i}/{len(cases)} {case.name}")
        try:
            result = caller(case, p.inputs)
        except ChildDied as e:
            death = e.death
            break
        outcome = result.status
        for write in result.writes:
            directions[write["direction"]]["writes"].append({"case": case.name} | write)
            wrote.add(write["tensor"])
        if result.status == "ok":
            outputs[case.name] = (result.out, result.dx)
            if case.kind == "canonical" and token_major is None:
                token_major = result.token_major
            any_backward |= result.has_backward
            for direction, got in (("forward", result.out), ("backward", result.dx)):
                if got is None:
                    continue
                record = directions[direction]
                elements, outside, first, where = judge(op, p, direction, got)
                entry = {"case": case.name, "kind": case.kind, "dtype": case.dtype, "elements": elements}
                entry |= {"outside_model": outside} | where
                if case.evidence and case.dtype in op.semantic_dtypes and elements:
                    entry["shares"] = shares(op, p, direction, got)
                record["cases"].append(entry)
                record["elements"] += elements
                record["outside_model"] += outside
                if first and record["first_violation"] is None:
                    record["first_violation"] = first
                if direction == "forward" and outside:
                    outcome = "silently wrong"
        else:
            for direction in directions.values():
                direction["not_run"].append({"case": case.name, "status": result.status, "error": result.error})
        if result.error and result.status == "ok":
            directions["backward"]["not_run"].append({"case": case.name, "status": "raised", "error": result.error})
        if case.kind == "probe":
            layouts[case.name] = outcome if outcome != "ok" else "accepted"
    res = {"impl": name, "op": op.name, "device": device, "contract": cases[0].contract if cases else DEFAULT_CONTRACT}
    if death is not None:
        res["death"] = {"verdict": death.verdict, "reason": death.reason, "case": death.case, "call": death.direction}
    for direction, record in directions.items():
        record |= violations.summarize(op, direction, record)
        named = record["diagnosis"]["name"] if record["diagnosis"] else None
        record["accepted"] = {"diagnosis": named, "elements": record["outside_model"]} if named in accept else None
        record["verdict"] = verdict(record, death)
        # None where nothing was judged: no claim either way
        record["conforms"] = {"conforms": True, "partial": True}.get(record["verdict"], None)
        if record["verdict"] in ("does not conform", "crashed", "timed out"):
            record["conforms"] = False
        record["semantics"] = classify(record["cases"])
        record["semantics_by_dtype"] = classify_by_dtype(record["cases"])
    res["forward"] = directions["forward"] | {
        "layouts": layouts,
        "refusals": refusals(directions["forward"]["not_run"]),
        "writes_into_input": sorted(wrote),
        "token_major_output": token_major,
    }
    # no backward: some forward ran and none of its outputs carried a grad_fn (forward only); where no forward
    # ran at all the backward was not run either
    res["backward"] = directions["backward"] if any_backward or not outputs or death else None
    verdicts = ", ".join(f"{d} {verdict_text(res[d], res)}" for d in directions if res[d] is not None)
    progress(f"{name} {op}: {verdicts or 'forward only'} ({len(cases)} cases)")
    return res, outputs


VERDICTS = ("conforms", "does not conform", "partial", "not run", "crashed", "timed out")


def verdict(record: dict, death=None) -> str:
    """What happened in one direction: "crashed" or "timed out" (the implementation's process died, or a call
    outlived its time limit: `death`), "does not conform" (an element outside the model that no accepted
    diagnosis explains, a write into an input, or an accepted case returned a wrong shape or dtype), "not run"
    (no element judged: every case raised or was refused), "partial" (every element judged inside the model,
    but some cases were not run: record["not_run"] says which and why), "conforms" (every case run, every
    element inside the model)."""
    if death is not None:
        return death.verdict
    wrong = any(n["status"] == "wrong output" for n in record["not_run"])
    if (record["outside_model"] and not record.get("accepted")) or wrong or record["writes"]:
        return "does not conform"
    if not record["elements"]:
        return "not run"
    return "partial" if record["not_run"] else "conforms"


def verdict_text(record: dict, result: dict) -> str:
    """The verdict in words: "crashed: SIGSEGV in dsv4-bfloat16 (forward)", "does not conform: writes into cos"."""
    v = record["verdict"]
    death = result.get("death")
    if death and v == death["verdict"]:
        call = f" ({death['call']})" if death["call"] else ""
        return f"{v}: {death['reason']}" + (f" in {death['case']}{call}" if death["case"] else " loading")
    if v == "does not conform" and record.get("writes") and not record["outside_model"]:
        return f"{v}: writes into {', '.join(dict.fromkeys(w['tensor'] for w in record['writes']))}"
    accepted = record.get("accepted")
    if accepted and v in ("conforms", "partial"):
        return f"{v} ({accepted['elements']} elements accepted: {accepted['diagnosis']})"
    return v


def refusals(not_run: list[dict]) -> dict[str, list[str]]:
    """The cases not run grouped by what was said: "refused (ValueError: x must be contiguous)" -> the cases,
    so that a refusal is credited to what the implementation refused, in its own words."""
    groups: dict[str, list[str]] = {}
    for n in not_run:
        groups.setdefault(f"{n['status']} ({n['error']})", []).append(n["case"])
    return groups


def _direction() -> dict:
    return {
        "elements": 0,
        "outside_model": 0,
        "first_violation": None,
        "cases": [],
        "not_run": [],
        "writes": [],
        "accepted": None,
    }


def classify(cases: list[dict]) -> list[str]:
    evidence = [c["shares"] for c in cases if "shares" in c]
    return semantics.classify(evidence, THRESHOLD) if evidence else []


def classify_by_dtype(cases: list[dict]) -> dict[str, list[str]]:
    """dtype -> the labels its cases' bits carry (the dtypes with evidence only): an implementation may
    compute one semantics in bf16 and another in fp16."""
    dtypes = dict.fromkeys(c["dtype"] for c in cases if "shares" in c)
    return {dtype: classify([c for c in cases if c["dtype"] == dtype]) for dtype in dtypes}


def semantics_text(record: dict) -> str:
    """The semantics in words: the labels shared by every dtype, or each dtype's where they differ
    ("truncating-store on bfloat16; interleaved on float16, float32"); nothing judged, nothing claimed."""
    if not record["elements"]:
        return "nothing judged"
    by_dtype = record.get("semantics_by_dtype") or {}
    named = lambda labels: ", ".join(labels) or "no known semantics"
    if record["semantics"] or len({tuple(v) for v in by_dtype.values()}) <= 1:
        return named(record["semantics"])
    groups: dict[tuple, list[str]] = {}
    for dtype, labels in by_dtype.items():
        groups.setdefault(tuple(labels), []).append(dtype)
    return "; ".join(f"{named(labels)} on {', '.join(dtypes)}" for labels, dtypes in groups.items())


def against(outputs_a: dict, outputs_b: dict) -> dict:
    """Per direction: two implementations' outputs compared bit by bit on the cases both ran."""
    out = {}
    for index, direction in enumerate(DIRECTIONS):
        per_case = []
        for name in outputs_a:
            if name not in outputs_b:
                continue
            a, b = outputs_a[name][index], outputs_b[name][index]
            if a is None or b is None:
                continue
            per_case.append({"case": name} | bits_compare(a, b))
        if per_case:
            total = sum(c["elements"] for c in per_case)
            equal = sum(c["bitwise_equal"] * c["elements"] for c in per_case)
            out[direction] = {
                "bitwise_equal": equal / total if total else 1.0,
                "max_ulp": max(c["max_ulp"] for c in per_case),
                "cases": per_case,
            }
        else:
            out[direction] = None
    return out
