"""Where the elements outside the model are (dsrope_gate.conformance.violations) and the named diagnosis of
qnorm_rope's backward (dsrope_gate.diagnoses): the groups count exactly the elements an implementation
moved, by case kind, dtype and the decade of x's row RMS, with their ulp distances; the FP32 underflow of
rstd^3 is named for autograd through F.rms_norm (the eager chain) on huge rows, and for nothing that is
wrong in another way: a wrong-sign backward, a backward without the projection term, a backward that is
wrong elsewhere too. The verdict stays "does not conform".

Error model of the expectations: a partial_rope implementation that moves a leading (copied) channel by k
ulps is outside the model by exactly k ulps (copied channels must be bit-identical); the rest is counting.
"""

from __future__ import annotations

import math

import torch
from dsrope_reference import qnorm_rope as reference
from dsrope_reference.floats import inside

from dsrope_gate import conformance
from dsrope_gate.cases import Case, Drawn, Inputs, Tables, Values
from dsrope_gate.conformance import violations
from dsrope_gate.conformance.judging import prepare, run_impl
from dsrope_gate.conformance.render import render, summary
from dsrope_gate.diagnoses import RSTD_CUBED_UNDERFLOW, rstd_cubed_underflows
from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope
from dsrope_gate.inputs import tables
from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE

EPS = 1e-6
NAME = RSTD_CUBED_UNDERFLOW.name


# --- the diagnosis, element by element ---------------------------------------------------------------------


def rows_of_rms(exponents: list[float], dtype, d=512, seed=0) -> torch.Tensor:
    """x [1, len(exponents), 1, d]: row i of N(0, 1) values scaled to an rms of 2^exponents[i]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, len(exponents), 1, d, generator=g, dtype=torch.float64)
    rms = torch.tensor(exponents, dtype=torch.float64).exp2()[None, :, None, None]
    return (x / x.pow(2).mean(-1, keepdim=True).sqrt() * rms).to(dtype)


def eager_dx(x, grad, cos, sin, rotary, eps):
    """The input gradient of the eager chain (F.rms_norm, then the FP32 rotation) through torch's autograd."""
    with torch.enable_grad():  # inside a custom backward too
        leaf = x.detach().requires_grad_()
        (dx,) = torch.autograd.grad(eager_qnorm_rope(leaf, cos, sin, rotary, eps), leaf, grad)
    return dx


def no_projection_dx(x, grad, cos, sin, rotary, eps):
    """r g' rounded to x.dtype: the contract's backward without its projection term x r^3 mean(g' x)."""
    derotated = eager_partial_rope(grad, cos, -sin, rotary)  # boundary 2: the conjugate rotation, rounded
    r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (r * derotated.float()).to(x.dtype)


def explained(x, got, grad, cos, sin, rotary=64):
    """(elements outside the model, whether the diagnosis explains them) for got as the input gradient."""
    model = reference.backward(x, grad, cos, sin, rotary, EPS).dx
    got64 = got.double()
    outside = ~inside(got64, model.ref, model.lo, model.hi)
    case = Case("rows", tuple(x.shape), rotary, str(x.dtype).removeprefix("torch."), None, eps=EPS)
    return int(outside.sum()), rstd_cubed_underflows(case, Inputs(x, cos, sin, grad), got64, model, outside)


def test_the_underflow_of_rstd_cubed_explains_the_eager_backward_and_only_it():
    """Rows of rms 2^46.5 to 2^59.5: rstd^3 subnormal below 2^49.7, 0 above. The eager chain's elements outside
    the model are explained in fp32 and bf16. A wrong sign is not; the projection term dropped is not where
    rstd^3 is subnormal (where it is 0, flushing it is dropping it: the same function); an element outside
    the model in a row of normal magnitude is not, whatever the rest."""
    huge = [46.5, 47.5, 48.5, 49.5, 50.5, 53.5, 56.5, 59.2]
    for dtype in (torch.float32, torch.bfloat16):
        x = rows_of_rms(huge, dtype)
        grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        cos, sin = tables(1, 1, 64, 2, device="cpu")  # the diagnosis is judged on the CPU, also on a GPU host
        dx = eager_dx(x, grad, cos, sin, 64, EPS)
        outside, yes = explained(x, dx, grad, cos, sin)
        assert outside > 1000 and yes, (dtype, outside)
        outside, yes = explained(x, -dx, grad, cos, sin)
        assert outside > 1000 and not yes, dtype

        subnormal = rows_of_rms(huge[:4], dtype)
        dropped = no_projection_dx(subnormal, grad[:, :4], cos, sin, 64, EPS)
        outside, yes = explained(subnormal, dropped, grad[:, :4], cos, sin)
        assert outside > 100 and not yes, (dtype, outside)

        mixed = rows_of_rms([*huge, 3.0], dtype)  # one row of normal magnitude
        grad9 = torch.cat((grad, grad[:, :1]), 1)
        dx = eager_dx(mixed, grad9, cos, sin, 64, EPS)
        hi = reference.backward(mixed, grad9, cos, sin, 64, EPS).dx.hi[0, -1, 0, 0].to(dtype)
        dx[0, -1, 0, 0] = torch.nextafter(hi, torch.tensor(math.inf, dtype=dtype))  # one step past the model
        outside, yes = explained(mixed, dx, grad9, cos, sin)
        assert outside > 1000 and not yes, dtype

        # a row whose FP32 sum of squares overflows (rms 2^64: rstd 0, dx 0 by the contract) is no underflow
        # row: a nonzero value there is not explained, even one the flushed formula allows (r^3 a quarter step)
        overflowing = rows_of_rms([*huge, 64.0], dtype)
        dx = eager_dx(overflowing, grad9, cos, sin, 64, EPS)
        derotated = eager_partial_rope(grad9, cos, -sin, 64)  # g', boundary 2
        x64, g64 = overflowing[0, -1, 0].double(), derotated[0, -1, 0].double()
        dx[0, -1, 0, 0] = (-x64[0] * (g64 * x64).mean() * 2.0**-151).to(dtype)  # r g' - x r^3 mean(g' x), r = 0
        outside, yes = explained(overflowing, dx, grad9, cos, sin)
        assert outside > 1000 and not yes, dtype


# --- the diagnosis and the groups through the conformance command ---------------------------------------


def drawn(name, kind, seed, dtype="float32", shape=(1, 4, 2, 128)):
    return Case(name, shape, 64, dtype, Drawn(Values(kind, seed), Tables("angles", seed + 1), Values("normal", 7)))


# normal rows; rows of rms about 2^54 (fp32: rstd^3 0), about 2^47 (subnormal) in fp32 and bf16
CASES = [
    drawn("normal", "normal", 0),
    drawn("huge 2^54", "huge", 0),
    drawn("huge 2^47", "huge", 1),
    drawn("huge 2^54 bf16", "huge", 0, "bfloat16"),
]


def with_backward(dx_of):
    """qnorm_rope: the eager chain's forward, dx_of(x, grad, cos, sin, rotary, eps) its input gradient."""

    class QNormRoPE(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, rotary, eps):
            ctx.save_for_backward(x, cos, sin)
            ctx.args = (rotary, eps)
            return eager_qnorm_rope(x, cos, sin, rotary, eps)

        @staticmethod
        def backward(ctx, grad):
            x, cos, sin = ctx.saved_tensors
            return dx_of(x, grad, cos, sin, *ctx.args), None, None, None, None

    return lambda x, cos, sin, rotary, eps: QNormRoPE.apply(x, cos, sin, rotary, eps)


def negated_in_normal_rows(x, grad, cos, sin, rotary, eps):
    """The eager chain's gradient, negated in rows of rms below 2^42: right where the diagnosis applies,
    wrong elsewhere."""
    dx = eager_dx(x, grad, cos, sin, rotary, eps)
    normal = x.double().pow(2).mean(-1, keepdim=True).sqrt() < 2.0**42
    return torch.where(normal, -dx, dx)


def judged(op, cases, impls, accept=()) -> dict:
    from dsrope_gate.conformance.calling import call

    prepared = [prepare(op, c, c.build("cpu")) for c in cases]
    results = {}
    for name, fn in impls:
        caller = lambda case, inputs, fn=fn: call(op, fn, case, inputs)
        results[name] = run_impl(name, caller, op, prepared, "cpu", lambda msg: None, accept=accept)[0]
    return results


META = {"date": "today", "device": "cpu", "torch": "t", "triton": "t", "cases": 4, "sweep": 0, "seed": 0}


def test_the_diagnosis_is_named_in_the_json_and_the_report_and_the_verdict_stays():
    results = judged(
        QNORM_ROPE,
        CASES,
        [
            ("eager", eager_qnorm_rope),
            ("wrong sign", with_backward(lambda *a: -eager_dx(*a))),
            ("no projection", with_backward(no_projection_dx)),
            ("negated in normal rows", with_backward(negated_in_normal_rows)),
        ],
    )
    backward = results["eager"]["backward"]
    assert backward["verdict"] == "does not conform" and backward["conforms"] is False
    assert backward["diagnosis"] == {"name": NAME, "text": RSTD_CUBED_UNDERFLOW.text}
    # grouped by x's row magnitude (2^54 ~ 1.8e16), not the gradient's (N(0, 1))
    assert {(g["dtype"], g["x_row_rms"]) for g in backward["where"]} >= {("float32", "[1e16, 1e17)")}, backward
    assert all(g["kind"] == "drawn" and g["x_row_rms"] != "[1e0, 1e1)" for g in backward["where"]), backward
    assert sum(g["outside"] for g in backward["where"]) == backward["outside_model"]
    assert sum(backward["ulp_histogram"].values()) == backward["outside_model"]
    first = backward["first_violation"]
    assert first["x_row_rms"] > 2.0**46 and first["ulp"] > 0, first
    for name in ("wrong sign", "no projection", "negated in normal rows"):
        wrong = results[name]["backward"]
        assert wrong["verdict"] == "does not conform" and wrong["diagnosis"] is None, name
    # the per-case evidence: the wrong implementation's huge cases alone are explained, its normal one is not
    per_case = {c["case"]: c.get("explained_by") for c in results["negated in normal rows"]["backward"]["cases"]}
    assert per_case["huge 2^54"] == [NAME] and per_case["normal"] == [], per_case

    text = render(list(results.values()), META | {"golden": "none"})
    row = next(line for line in text.splitlines() if line.startswith("| `eager` | qnorm_rope | backward |"))
    assert f"| **does not conform** (diagnosis: {NAME}) |" in row, row
    assert f"**Diagnosis: {NAME}**" in text and "#### Where the elements outside the model are (backward)" in text
    assert "| drawn | float32 | [1e16, 1e17) |" in text
    short = summary(list(results.values()), META | {"golden": "none"}, "report.md")
    assert short.rstrip().splitlines()[-1].startswith("| `negated in normal rows` | qnorm_rope | backward |")
    assert f"Diagnosis: {NAME}: " in short and short.count("Diagnosis:") == 1


def test_an_accepted_diagnosis_lets_the_elements_it_explains_pass_and_no_other():
    """accept=[the rstd^3 underflow]: the eager chain's backward conforms, the elements named; a backward wrong
    in normal rows too is not explained, so nothing is accepted; a wrong sign is never accepted."""
    results = judged(
        QNORM_ROPE,
        CASES,
        [
            ("eager", eager_qnorm_rope),
            ("wrong sign", with_backward(lambda *a: -eager_dx(*a))),
            ("negated in normal rows", with_backward(negated_in_normal_rows)),
        ],
        accept=(NAME,),
    )
    backward = results["eager"]["backward"]
    assert backward["verdict"] == "conforms" and backward["conforms"] is True
    assert backward["accepted"] == {"diagnosis": NAME, "elements": backward["outside_model"]}
    assert backward["outside_model"] > 0  # still counted and shown: accepted, not hidden
    from dsrope_gate.conformance.judging import verdict_text

    text = verdict_text(backward, results["eager"])
    assert text == f"conforms ({backward['outside_model']} elements accepted: {NAME})", text
    for name in ("wrong sign", "negated in normal rows"):
        wrong = results[name]["backward"]
        assert wrong["verdict"] == "does not conform" and wrong["accepted"] is None, name


def test_accept_takes_known_diagnoses_only():
    import pytest

    from dsrope_gate.diagnoses import KNOWN, check_accepted

    assert check_accepted([NAME]) == (NAME,) and NAME in KNOWN
    with pytest.raises(ValueError, match=r"unknown diagnosis \['rstd underflow'\]; known: \['fp32 underflow"):
        check_accepted(["rstd underflow"])


def moves_leading_channels(x, cos, sin, rotary):
    """The contract's output with every leading (copied) channel of the rows of x's rms in [1, 10) moved up by
    STEPS[dtype] ulps."""
    out = eager_partial_rope(x, cos, sin, rotary)
    rows = x.double().pow(2).mean(-1, keepdim=True).sqrt()
    pick = (rows >= 1) & (rows < 10) & (torch.arange(x.shape[-1]) < x.shape[-1] - rotary)
    moved = out
    for _ in range(STEPS[x.dtype]):
        moved = torch.nextafter(moved, torch.full_like(moved, math.inf))
    return torch.where(pick, moved, out)


STEPS = {torch.bfloat16: 3, torch.float16: 1, torch.float32: 20}


def test_groups_count_the_moved_elements_by_kind_dtype_magnitude_and_ulp(tmp_path):
    results, _, cases, _ = conformance.judge_all(
        "partial_rope", [("moves", moves_leading_channels)], "cpu", examples=0, golden_root=tmp_path, progress=print
    )
    forward = results[0]["forward"]
    expected: dict[tuple, int] = {}
    for p in cases:
        x = p.inputs.x
        rows = violations.x_row_rms(x)
        lead = x[..., : x.shape[-1] - p.case.rotary]
        moved = int((lead.isfinite() & ((rows >= 1) & (rows < 10))[..., None]).sum())
        if moved:
            key = (p.case.kind, p.case.dtype)
            expected[key] = expected.get(key, 0) + moved
    got = {(g["kind"], g["dtype"]): g["outside"] for g in forward["where"]}
    assert got == expected and {g["x_row_rms"] for g in forward["where"]} == {"[1e0, 1e1)"}, forward["where"]
    assert {g["dtype"]: g["max_ulp"] for g in forward["where"]} == {"bfloat16": 3, "float16": 1, "float32": 20}
    by_dtype = lambda dtype: sum(n for (_, d), n in expected.items() if d == dtype)
    assert forward["ulp_histogram"] == {
        "1": by_dtype("float16"),
        "3-4": by_dtype("bfloat16"),
        "17-256": by_dtype("float32"),
    }
    assert forward["max_ulp"] == 20 and forward["diagnosis"] is None
    assert results[0]["backward"]["where"] == [] and results[0]["backward"]["ulp_histogram"] == {}
    assert PARTIAL_ROPE.diagnoses == {}


def test_decades_of_row_rms_below_one_included():
    assert [violations.decade(v) for v in (0.5, 0.05, 0.1, 1.0, 9.99, 10.0, 5e-30, 3e17)] == [
        "[1e-1, 1e0)",
        "[1e-2, 1e-1)",
        "[1e-1, 1e0)",
        "[1e0, 1e1)",
        "[1e0, 1e1)",
        "[1e1, 1e2)",
        "[1e-30, 1e-29)",
        "[1e17, 1e18)",
    ]
    assert violations.decade(0.0) == "0"
    assert violations.decade(math.inf) == violations.decade(math.nan) == "non-finite"


def moves_every_leading_channel(x, cos, sin, rotary):
    out = eager_partial_rope(x, cos, sin, rotary)
    lead = torch.arange(x.shape[-1]) < x.shape[-1] - rotary
    return torch.where(lead, torch.nextafter(out, torch.full_like(out, math.inf)), out)


def test_groups_hold_rows_of_every_magnitude_below_one_included():
    """Rows of rms 2^-20 .. 2^20 (decades 1e-7 .. 1e6) in one case: each decade's group counts its rows'
    elements (D a row) and the moved leading channels (D - R a row) of those rows only."""
    exponents = [-20.0, -10.0, -4.0, -1.0, 0.0, 3.0, 10.0, 20.0]
    x = rows_of_rms(exponents, torch.float32, d=96)
    cos, sin = tables(1, 1, 32, seed=3, device="cpu")
    grad = torch.ones_like(x)
    case = Case("magnitudes", tuple(x.shape), 32, "float32", Drawn(Values("normal", 0), Tables("angles", 0),
                Values("normal", 0)))  # fmt: skip
    p = prepare(PARTIAL_ROPE, case, Inputs(x, cos, sin, grad))
    from dsrope_gate.conformance.calling import call

    caller = lambda c, inputs: call(PARTIAL_ROPE, moves_every_leading_channel, c, inputs)
    result, _ = run_impl("moves", caller, PARTIAL_ROPE, [p], "cpu", lambda m: None)
    groups = {g["x_row_rms"]: (g["outside"], g["elements"]) for g in result["forward"]["where"]}
    expected: dict[str, tuple] = {}
    for e in exponents:
        key = violations.decade(2.0**e)
        outside, elements = expected.get(key, (0, 0))
        expected[key] = (outside + 96 - 32, elements + 96)
    assert groups == expected, (groups, expected)
    assert "[1e-7, 1e-6)" in groups and "[1e-2, 1e-1)" in groups and "[1e-1, 1e0)" in groups
