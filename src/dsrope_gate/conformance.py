"""Conformance: point the gate at any implementation of qnorm_rope or partial_rope and get a verdict,
element by element, and the semantics it computes, from evidence.

    python -m dsrope_gate.conformance --op qnorm_rope --impl mypkg.rope:qnorm_rope [--impl file.py:fn]
        [--preset NAME ...] [--device cpu|cuda] [--against TARGET] [--json PATH] [--out DIR]
    nox -s conformance -- <the same arguments>

An implementation is a callable with the signature of the dsrope function it stands for (contract:
docs/contract.md): `qnorm_rope(x, cos, sin, rotary, eps)` or `partial_rope(x, cos, sin, rotary)`, x
[B, H, S, D] of any strides, cos/sin FP32 [B, S, R]. TARGET is `module.path:callable` (importable with
the current sys.path, PYTHONPATH included) or `path/to/file.py:callable`.

What it runs: the canonical DeepSeek-V4 (D=512, R=64) and V3 (D=192, R=64: the rope slice trailing the
128 nope channels) cases in bf16, fp16 and fp32; the golden inputs (golden/, when the checkout's store is
there or --golden names one); layout probes (one small case per layout class, below); and a seeded
hypothesis sweep over shapes, layouts and values (dsrope_gate.strategies). Each case runs twice: once
on an input that does not require grad (the forward; the bits of every input's storage, gaps included,
are compared before and after: writes into an input are reported), and once on an input that requires
grad: when the output carries a grad_fn its input gradient is judged too; without one the backward is
reported as absent (forward only).

Verdict: an implementation conforms (per direction) when no element of any case it accepted lies outside
the error model of the reference (dsrope_reference) and no accepted case returned a wrong shape or dtype.
Cases it refuses (ValueError, TypeError, NotImplementedError, AssertionError: an error that says no) or
crashes on (any other exception) are listed, not counted as elements.

Semantics: for each known semantics an eager emulation (dsrope_gate.semantics) runs on the same inputs;
per case the share of elements whose bits equal each emulation's is reported, on the cases with normal
values (the canonical cases, the layout probes, the golden cases of random normal values). Edge values
(huge, tiny, subnormal, zero rows, the sweep's drawn kinds) judge the verdict only: there any reduction
order of a correct kernel moves the last bits of many elements. A label is listed when its
emulation agrees best (ties together) with at least 99.9% on every case whose bits carry the semantics:
every dtype for partial_rope; bf16 and fp16 for qnorm_rope, whose fp32 cases judge the verdict only (the
rounding boundaries are no-ops there, and a kernel's own rstd, its reduction order and an approximate
rsqrt, moves last bits of every element of a row).

--device cpu runs Triton code in the interpreter with dsrope's round-to-nearest-even fp32 -> bf16
conversion (what a GPU does) and eager code as it is; --device cuda compiles.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

OPS = ("qnorm_rope", "partial_rope")
REFUSALS = (ValueError, TypeError, NotImplementedError, AssertionError)
THRESHOLD = 0.999
# The dtypes whose bits carry the semantics. qnorm_rope: bf16 and fp16 only; in fp32 the rounding
# boundaries are no-ops and a kernel's own rstd (reduction order, approximate rsqrt) moves last bits.
SEMANTIC_DTYPES = {"qnorm_rope": ("bfloat16", "float16"), "partial_rope": ("bfloat16", "float16", "float32")}


# --- targets ---------------------------------------------------------------------------------------


def load_target(spec: str):
    """`module.path:callable` or `path/to/file.py:callable` -> the callable (attribute paths allowed)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"--impl {spec!r}: expected module.path:callable or path/to/file.py:callable")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise ValueError(f"--impl {spec!r}: no file {path}")
        module_spec = importlib.util.spec_from_file_location(f"_conformance_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--impl {spec!r}: {attr} is not callable")
    return obj


# --- inputs ----------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """One case: the tensors as the implementation gets them and how they were made."""

    name: str
    source: str  # canonical | golden | layout | sweep
    layout: str  # the layout class (Layouts in the report)
    x: object
    cos: object
    sin: object
    grad: object
    rotary: int
    eps: float
    recipe: str  # how to rebuild the inputs (seed, strides, offsets)
    evidence: bool = True  # normal values: the case's bits are evidence of the semantics
    models: dict = field(default_factory=dict)  # "forward"/"backward" -> dsrope_reference Model
    emulated: dict = field(default_factory=dict)  # direction -> label -> the emulation's output

    @property
    def dtype(self) -> str:
        return str(self.x.dtype).removeprefix("torch.")


def describe(t) -> str:
    return f"shape {list(t.shape)} strides {list(t.stride())} offset {t.storage_offset()} {t.dtype}"


def _case(name, source, layout, x, cos, sin, grad, rotary, eps, recipe):
    recipe = f"{recipe}; x {describe(x)}; cos {describe(cos)}; grad {describe(grad)}"
    return Inputs(name, source, layout, x, cos, sin, grad, rotary, eps, recipe)


def canonical(op: str, device) -> list[Inputs]:
    """DeepSeek-V4 heads (D=512, R=64) and V3 heads (D=192: nope 128 + rope 64), token-major x (the
    production layout), one table for the batch (stride 0), every dtype."""
    import torch

    from dsrope_gate.inputs import tables
    from dsrope_gate.layouts import TOKEN_MAJOR, materialize

    out = []
    for model, shape, seed in (("dsv4", (2, 16, 8, 512), 7), ("v3", (2, 8, 8, 192), 11)):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
            grad = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
            cos, sin = tables(shape[0], shape[2], 64, seed=seed + 1, device=device)
            name = f"{model}-{str(dtype).removeprefix('torch.')}"
            recipe = f"canonical {name}: randn seed {seed}, tables seed {seed + 1}"
            x = materialize(x.to(device), TOKEN_MAJOR)
            out.append(_case(name, "canonical", "token-major", x, cos, sin, grad.to(device), 64, 1e-6, recipe))
    return out


def golden(op: str, device, root: Path | None) -> tuple[list[Inputs], str]:
    """The golden store's cases for `op`, their inputs in their recorded layouts and their stored models."""
    from dsrope_reference.rope import Model

    from dsrope_gate import golden as store

    root = store.GOLDEN if root is None else root
    if not (root / "manifest.json").is_file():
        return [], f"golden inputs: no store at {root} (pass --golden DIR)"
    manifest = store.verify_all(root)
    out = []
    for record in manifest["cases"]:
        if op not in record["kernels"]:
            continue
        _, tensors = store.load_case(root, manifest, record["name"])
        inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
        laid = store.laid_out_inputs(record, inputs, device)
        layout = record["x_layout"].replace("_", "-")
        recipe = f"golden case {record['name']} ({root})"
        case = _case(
            record["name"],
            "golden",
            layout,
            laid["x"],
            laid["cos"],
            laid["sin"],
            laid["grad"],
            record["rotary"],
            record["eps"],
            recipe,
        )
        case.evidence = record["values"] == "randn"
        for direction, stage in (("forward", "out"), ("backward", "dx")):
            m = store.decode_stage(f"{op}.{stage}", tensors)
            case.models[direction] = Model(m["ref"], m["lo"], m["hi"])
        out.append(case)
    return out, f"golden inputs: {len(out)} cases from {root}"


# One small bf16 case per layout class: what the implementation accepts, refuses or gets wrong.
LAYOUT_PROBES = {
    "token-major": dict(x=dict(order=(0, 2, 1, 3))),
    "contiguous head-major": dict(x=dict()),
    "permuted (channels outer)": dict(x=dict(order=(3, 0, 1, 2))),
    "stepped slices": dict(x=dict(step=(2, 1, 3, 1))),
    "storage offset": dict(x=dict(order=(0, 2, 1, 3), offset=7)),
    "padded token-major buffer": dict(x=dict(order=(0, 2, 1, 3), pad=(0, 0, 2, 8))),
    "per-batch tables": dict(per_batch=True),
    "strided tables": dict(table=dict(order=(2, 0, 1), pad=(3, 1, 2), offset=11)),
    "stride-0 gradient": dict(grad=dict(broadcast=(0, 1, 2, 3))),
    "non-finite rows": dict(nonfinite=True),
    "empty (S = 0)": dict(empty=True),
}


def layout_probes(op: str, device) -> list[Inputs]:
    import torch

    from dsrope_gate.inputs import tables
    from dsrope_gate.layouts import Layout, materialize

    out = []
    for i, (klass, spec) in enumerate(LAYOUT_PROBES.items()):
        b, h, s, d, r = 2, 3, 0 if spec.get("empty") else 5, 96, 32
        g = torch.Generator().manual_seed(300 + i)
        x = torch.randn((b, h, s, d), generator=g, dtype=torch.float64)
        if spec.get("nonfinite") and s:
            x[0, 1, 2, 7], x[1, 0, 3, d - 3], x[1, 2, 0, :] = float("nan"), float("inf"), float("-inf")
        x = x.to(torch.bfloat16)
        grad = torch.ones(x.shape, dtype=x.dtype) if "grad" in spec else torch.randn(x.shape, generator=g).bfloat16()
        cos, sin = tables(b, s, r, seed=400 + i, per_batch=spec.get("per_batch", False), device="cpu")
        table_layout = Layout(**spec.get("table", {}))
        cos, sin = (materialize(t.contiguous().to(device), table_layout) for t in (cos, sin))
        x = materialize(x.to(device), Layout(**spec.get("x", dict(order=(0, 2, 1, 3)))))
        grad = materialize(grad.to(device), Layout(**spec.get("grad", {})))
        recipe = f"layout probe {klass!r}: randn seed {300 + i}, tables seed {400 + i}"
        probe = _case(f"layout: {klass}", "layout", klass, x, cos, sin, grad, r, 1e-6, recipe)
        probe.evidence = not spec.get("nonfinite")  # edge values: the verdict only
        out.append(probe)
    return out


def sweep(op: str, device, examples: int, seed: int) -> list[Inputs]:
    """`examples` cases drawn by hypothesis from a fixed seed (dsrope_gate.strategies): shapes, any
    layouts (NaN in every gap), stride-0 tables and gradients, value kinds, dtypes, eps."""
    if examples <= 0:
        return []
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from dsrope_gate.strategies import cases

    drawn = []

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(cases("qnorm" if op == "qnorm_rope" else "rope"))
    def collect(case):
        drawn.append(case)

    collect()
    out = []
    for i, case in enumerate(drawn[:examples]):
        x, cos, sin, grad = case.build(device)
        drawn_case = _case(f"sweep {i}", "sweep", "drawn", x, cos, sin, grad, case.rotary, case.eps, repr(case))
        drawn_case.evidence = False
        out.append(drawn_case)
    return out


def reference(op: str, case: Inputs) -> dict:
    """The reference's models of the case (computed once, FP64 on the CPU)."""
    if not case.models:
        from dsrope_reference import qnorm_rope as qmodel
        from dsrope_reference.rope import partial_rope

        if op == "qnorm_rope":
            case.models["forward"] = qmodel.forward(case.x, case.cos, case.sin, case.rotary, case.eps).out
            case.models["backward"] = qmodel.backward(case.x, case.grad, case.cos, case.sin, case.rotary, case.eps).dx
        else:
            case.models["forward"] = partial_rope(case.x, case.cos, case.sin, case.rotary)
            case.models["backward"] = partial_rope(case.grad, case.cos, case.sin, case.rotary, inverse=True)
    return case.models


# --- running one implementation on one case ------------------------------------------------------------


@dataclass
class Call:
    status: str  # ok | refused | crashed | wrong output
    out: object = None
    dx: object = None
    error: str = ""
    wrote: list = field(default_factory=list)  # inputs whose storage changed
    has_backward: bool = False
    token_major: bool = False


def _storage_bits(t):
    """A copy of every byte of t's storage (gaps included), to see whether a call wrote into it."""
    import torch

    storage = t.untyped_storage()
    if not storage.nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).clone()


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _check_output(out, x) -> str:
    import torch

    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        return f"returned {list(out.shape)} {out.dtype}, expected {list(x.shape)} {x.dtype}"
    return ""


def call(fn, op: str, case: Inputs) -> Call:
    """The forward on copies of the case's inputs in their layouts (nothing requires grad; a write into
    any of them is seen, and the case's own tensors stay as they were for the next implementation),
    then the backward on a fresh x that requires grad, when the output carries a grad_fn."""
    import numpy
    import torch

    inputs = {"x": _same_layout_copy(case.x), "cos": _same_layout_copy(case.cos), "sin": _same_layout_copy(case.sin)}
    before = {k: _storage_bits(v) for k, v in inputs.items()}
    args = (inputs["x"], inputs["cos"], inputs["sin"], case.rotary) + ((case.eps,) if op == "qnorm_rope" else ())
    try:
        with numpy.errstate(all="ignore"), torch.no_grad():
            out = fn(*args)
    except REFUSALS as e:
        return Call("refused", error=_error(e))
    except Exception as e:  # an implementation's crash is a finding, never the command's
        return Call("crashed", error=_error(e))
    wrote = [k for k, v in inputs.items() if before[k] is not None and not torch.equal(before[k], _storage_bits(v))]
    problem = _check_output(out, case.x)
    if problem:
        return Call("wrong output", error=problem, wrote=wrote)
    result = Call("ok", out=out.detach().clone(), wrote=wrote, token_major=out.transpose(1, 2).is_contiguous())
    x = _same_layout_copy(case.x).requires_grad_(True)
    try:
        with numpy.errstate(all="ignore"), torch.enable_grad():
            y = fn(x, case.cos, case.sin, case.rotary, *((case.eps,) if op == "qnorm_rope" else ()))
            if isinstance(y, torch.Tensor) and y.grad_fn is not None:
                result.has_backward = True
                (dx,) = torch.autograd.grad(y, x, case.grad) if x.numel() else (torch.empty_like(x),)
                result.dx = dx.detach()
    except Exception as e:
        result.error = "backward: " + _error(e)
    return result


def _same_layout_copy(t):
    """t's values, strides and storage offset in a copy of its whole storage (gaps included)."""
    import torch

    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride()
    )


# --- judging -----------------------------------------------------------------------------------------


def first_violation(op, case, direction, got, model, ok) -> dict:
    """The first element outside the model, with what reproduces it."""
    import torch

    i = tuple(int(v) for v in (~ok).nonzero()[0].tolist())
    b, h, s, d = i
    x = case.x if direction == "forward" else case.grad
    dim, r = x.shape[-1], case.rotary
    pair = d - (d - (dim - r)) % 2 if d >= dim - r else None
    row = x[b, h, s].detach().cpu().double()
    k = (pair - (dim - r)) // 2 if pair is not None else None
    return {
        "case": case.name,
        "recipe": case.recipe,
        "index": list(i),
        "channel": "rotary" if pair is not None else "leading",
        "input": [row[pair].item(), row[pair + 1].item()] if pair is not None else row[d].item(),
        "cos_sin": [case.cos[b, s, k].item(), case.sin[b, s, k].item()] if k is not None else None,
        "got": got[i].item(),
        "contract": model.ref[i].item(),
        "bounds": [model.lo[i].item(), model.hi[i].item()],
        "rotary": r,
        "eps": case.eps if op == "qnorm_rope" else None,
        "row_rms": float(torch.sqrt(torch.mean(row**2))) if row.numel() else None,
    }


def judge(op, case, direction, got):
    """(elements, outside, first violation or None) of got against the reference's model."""
    import torch
    from dsrope_reference.floats import inside

    model = reference(op, case)[direction]
    got64 = got.detach().to("cpu", torch.float64)
    ok = inside(got64, model.ref, model.lo, model.hi)
    outside = int((~ok).sum())
    return got.numel(), outside, (first_violation(op, case, direction, got64, model, ok) if outside else None)


def shares(op, case, direction, got) -> dict:
    """Per known semantics: the share of elements whose bits equal its emulation's (the emulations run
    once per case and direction, whatever the number of implementations judged)."""
    from dsrope_gate import semantics

    if direction not in case.emulated:
        x, cos, sin, grad = (t.detach().cpu() for t in (case.x, case.cos, case.sin, case.grad))
        case.emulated[direction] = {
            label: emulate(x, cos, sin, case.rotary, case.eps, grad)
            for label, emulate in semantics.emulations(op, direction).items()
        }
    got = got.detach().cpu()
    return {label: semantics.agreement(got, out) for label, out in case.emulated[direction].items()}


def bits_compare(a, b) -> dict:
    """Two implementations' outputs on the same case: bitwise-equal share, max ulp, where they differ."""
    import torch
    from dsrope_reference.floats import ulp_distance

    a, b = a.detach().cpu(), b.detach().cpu()
    distance = ulp_distance(a, b)
    same = distance == 0
    differ = (~same).nonzero()
    return {
        "elements": a.numel(),
        "bitwise_equal": float(same.float().mean()) if a.numel() else 1.0,
        "max_ulp": int(distance.max()) if a.numel() else 0,
        "differ_channels": sorted({int(c) for c in differ[:, -1].tolist()})[:16],
        "differ_rows": int(torch.unique(differ[:, :-1], dim=0).shape[0]) if len(differ) else 0,
    }


# --- one implementation, every case ----------------------------------------------------------------


def run_impl(name: str, fn, op: str, cases: list[Inputs], device: str, progress) -> tuple[dict, dict]:
    """(result as in the JSON, the outputs per case for --against)."""
    directions = {"forward": _direction(), "backward": _direction()}
    layouts, wrote, token_major, outputs = {}, set(), None, {}
    any_backward = False
    for i, case in enumerate(cases, 1):
        progress(f"{name} {op} {i}/{len(cases)} {case.name}")
        result = call(fn, op, case)
        outcome = result.status
        if result.status == "ok":
            outputs[case.name] = (result.out, result.dx)
            wrote |= set(result.wrote)
            if case.source == "canonical" and token_major is None:
                token_major = result.token_major
            any_backward |= result.has_backward
            for direction, got in (("forward", result.out), ("backward", result.dx)):
                if got is None:
                    continue
                record = directions[direction]
                elements, outside, first = judge(op, case, direction, got)
                entry = {"case": case.name, "dtype": case.dtype, "elements": elements, "outside_model": outside}
                if case.evidence and case.dtype in SEMANTIC_DTYPES[op] and elements:
                    entry["shares"] = shares(op, case, direction, got)
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
        if result.status == "wrong output":
            outcome = "silently wrong"
        if result.error and result.status == "ok":
            directions["backward"]["not_run"].append({"case": case.name, "status": "crashed", "error": result.error})
        if case.source == "layout":
            layouts[case.layout] = outcome if outcome != "ok" else "accepted"
    res = {"impl": name, "op": op, "device": device}
    for record in directions.values():
        wrong = any(n["status"] == "wrong output" for n in record["not_run"])
        record["conforms"] = record["elements"] > 0 and record["outside_model"] == 0 and not wrong
        record["semantics"] = classify(record["cases"])
    res["forward"] = directions["forward"] | {
        "layouts": layouts,
        "writes_into_input": sorted(wrote),
        "token_major_output": token_major,
    }
    res["backward"] = directions["backward"] if any_backward else None
    return res, outputs


def _direction() -> dict:
    return {"elements": 0, "outside_model": 0, "first_violation": None, "cases": [], "not_run": []}


def classify(cases: list[dict]) -> list[str]:
    from dsrope_gate import semantics

    evidence = [c["shares"] for c in cases if "shares" in c]
    return semantics.classify(evidence, THRESHOLD) if evidence else []


def against(op, outputs_a: dict, outputs_b: dict) -> dict:
    out = {}
    for direction, index in (("forward", 0), ("backward", 1)):
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


# --- report ------------------------------------------------------------------------------------------------


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
            verdict = "conforms" if d["conforms"] else "**does not conform**"
            sem = ", ".join(d["semantics"]) or "no known semantics"
            lines.append(
                f"| `{r['impl']}` | {r['op']} | {direction} | {verdict} | {sem} | {d['elements']} | "
                f"{d['outside_model']} | {len(d['not_run'])} |"
            )
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


# --- command line ------------------------------------------------------------------------------------------


def collect_cases(op, device, examples, seed, golden_root, progress) -> tuple[list[Inputs], str]:
    progress("building cases")
    cases = canonical(op, device)
    gold, note = golden(op, device, golden_root)
    cases += gold + layout_probes(op, device) + sweep(op, device, examples, seed)
    progress(f"{len(cases)} cases; computing the reference")
    for case in cases:
        reference(op, case)
    return cases, note


def run(
    op,
    impls: list[tuple[str, object]],
    device="cpu",
    examples=24,
    seed=0,
    golden_root=None,
    against_impl=None,
    progress=print,
) -> tuple[list[dict], dict]:
    """Judge each (name, callable) on `op`; with against_impl (name, callable) compare each with it."""
    import datetime

    import torch
    import triton

    if device == "cpu":
        # every Triton kernel judged here (any project's) stores bf16 rounded to nearest even, as a GPU
        # does; Triton's interpreter alone truncates
        from dsrope.interpreter import install_interpreter_rounding

        install_interpreter_rounding()
    cases, note = collect_cases(op, device, examples, seed, golden_root, progress)
    results = []
    other = None
    if against_impl is not None:
        other_result, other_outputs = run_impl(*against_impl, op, cases, device, progress)
        other = (against_impl[0], other_outputs)
    for name, fn in impls:
        result, outputs = run_impl(name, fn, op, cases, device, progress)
        if other is not None:
            result["against"] = {"impl": other[0]} | against(op, outputs, other[1])
        results.append(result)
    if other is not None:
        results.append(other_result)
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cases": len(cases),
        "sweep": examples,
        "seed": seed,
        "golden": note,
    }
    return results, meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dsrope_gate.conformance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", choices=OPS, action="append", help="the op(s) to judge (default: both where given presets)")
    ap.add_argument("--impl", action="append", default=[], help="module.path:callable or path/to/file.py:callable")
    ap.add_argument("--preset", action="append", default=[], help="a preset (dsrope_gate.presets), or 'all'")
    ap.add_argument("--against", help="a second implementation to compare each with, element by element")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when visible, else cpu")
    ap.add_argument("--examples", type=int, default=24, help="hypothesis-drawn cases per op (default 24)")
    ap.add_argument("--seed", type=int, default=0, help="the sweep's seed (default 0)")
    ap.add_argument("--golden", type=Path, default=None, help="a golden store (default: the checkout's golden/)")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
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

        for name, op, fn in presets.load(args.preset, device, args.op, progress):
            jobs.setdefault(op, []).append((name, fn))
    if not jobs:
        ap.error("nothing to judge: give --impl (with --op) or --preset")
    other = (args.against, target(args.against)) if args.against else None

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


if __name__ == "__main__":
    raise SystemExit(main())
