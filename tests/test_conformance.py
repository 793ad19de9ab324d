"""The conformance command's own power (dsrope_gate.conformance): fed the emulation of each known
semantics as an implementation it names that semantics and gives the right verdict; dsrope's kernels and
the eager chain conform with the contract's semantics; a kernel off by one ulp on 1% of its elements does
not conform and has no known semantics; an implementation that raises, returns the wrong shape or writes
into its input is reported as such and the run goes on.

Each module-level run judges every implementation on one case set (canonical, golden, layout probes and
a small seeded sweep), so the reference is computed once per op.
"""

from __future__ import annotations

import json

import pytest
import torch

import dsrope
from dsrope_gate import conformance
from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope
from dsrope_gate.inputs import ON_GPU
from dsrope_gate.ops import JUDGED

SWEEP = 4  # drawn cases per run: the canonical, golden and layout cases carry most of the evidence

# Inside the error model (the verdict conforms) and which labels each emulation must be named with.
CONTRACT = {"qnorm_rope": "two-boundaries+interleaved", "partial_rope": "interleaved"}
INSIDE = {"interleaved", "fma-rotation", "two-boundaries"}


def off_by_one_ulp(fn, share=0.01, seed=0):
    """fn's output with a random `share` of its elements moved one ulp (NaN and inf left alone)."""

    def wrong(x, cos, sin, rotary, *eps):
        out = fn(x, cos, sin, rotary, *eps)
        g = torch.Generator().manual_seed(seed + out.numel())
        pick = (torch.rand(out.shape, generator=g) < share).to(out.device) & out.isfinite()
        return torch.where(pick, torch.nextafter(out, torch.full_like(out, float("inf"))), out)

    return wrong


def raises(x, cos, sin, rotary, *eps):
    raise RuntimeError("this implementation always fails")


def wrong_shape(x, cos, sin, rotary, *eps):
    return x[..., :-2].clone()


def writes_into_x(x, cos, sin, rotary, *eps):
    out = eager_partial_rope(x, cos, sin, rotary)
    x.zero_()
    return out


def writes_into_a_gap(x, cos, sin, rotary, *eps):
    """Correct output; also writes one element of x's storage that is not one of x's elements (a gap)."""
    out = contract(x, cos, sin, rotary, *eps)
    storage = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
    covered = torch.zeros(storage.numel(), dtype=torch.bool, device=x.device)
    covered.as_strided(x.shape, x.stride(), x.storage_offset()).fill_(True)
    gaps = (~covered).nonzero()
    if len(gaps):
        storage[gaps[0, 0]] = 7.0
    return out


def leaves_last_row(x, cos, sin, rotary, *eps):
    """A partial result: correct everywhere but the last row of every head, which is left as x."""
    out = contract(x, cos, sin, rotary, *eps).clone()
    out[:, :, -1:] = x[:, :, -1:]
    return out


def nan_in_one_element(x, cos, sin, rotary, *eps):
    out = contract(x, cos, sin, rotary, *eps).clone()
    if out.numel():
        out.view(-1)[out.numel() // 2] = float("nan")
    return out


def zero_where_nan(x, cos, sin, rotary, *eps):
    return torch.nan_to_num(contract(x, cos, sin, rotary, *eps), nan=0.0)


def crashes_on_bf16(x, cos, sin, rotary, *eps):
    if x.dtype == torch.bfloat16:
        raise RuntimeError("no bf16 kernel")
    return contract(x, cos, sin, rotary, *eps)


def contract(x, cos, sin, rotary, *eps):
    return eager_partial_rope(x, cos, sin, rotary) if not eps else eager_qnorm_rope(x, cos, sin, rotary, *eps)


def refuses_fp16(x, cos, sin, rotary, *eps):
    if x.dtype == torch.float16:
        raise TypeError("x: float16 is not supported")
    return contract(x, cos, sin, rotary, *eps)


def emulation_impl(op, label):
    """The emulation as an implementation; it computes on the CPU on any device (on a GPU, torch's own
    reductions would move last bits, and this test is about the command, not about torch's kernels)."""
    emulate = JUDGED[op].emulations["forward"][label]

    def impl(x, cos, sin, rotary, *eps):
        out = emulate(x.cpu(), cos.cpu(), sin.cpu(), rotary, eps[0] if eps else None, None)
        return out.to(x.device)

    return impl


def per_dtype_impl(op, labels: dict):
    """The emulation of labels[dtype] on each dtype: what an implementation with one kernel per dtype does."""
    by_dtype = {dtype: emulation_impl(op, label) for dtype, label in labels.items()}
    return lambda x, *args: by_dtype[str(x.dtype).removeprefix("torch.")](x, *args)


def judge(op, impls):
    results, meta = conformance.run(
        op, impls, "cuda" if ON_GPU else "cpu", examples=SWEEP, seed=0, progress=lambda m: None
    )
    json.dumps(results, default=str)  # the JSON the command writes holds these
    return op, {r["impl"]: r for r in results}, meta


@pytest.fixture(scope="module", params=["qnorm_rope", "partial_rope"])
def dsrope_judged(request):
    """dsrope's kernel and the eager chain, judged apart from the other implementations: only these
    compile Triton kernels, and pytest-xdist builds a module fixture once per worker that needs it."""
    op = request.param
    kernel = dsrope.qnorm_rope_triton if op == "qnorm_rope" else dsrope.apply_partial_rope_triton
    return judge(op, [("dsrope", kernel), ("eager-chain", JUDGED[op].eager)])


@pytest.fixture(scope="module", params=["qnorm_rope", "partial_rope"])
def judged(request):
    """Implementations in eager torch (no Triton): the emulations, the eager chain and wrong ones."""
    op = request.param
    eager = JUDGED[op].eager
    impls = [("eager-chain", eager), ("off-by-one-ulp", off_by_one_ulp(eager))]
    impls += [("raises", raises), ("wrong-shape", wrong_shape), ("refuses-fp16", refuses_fp16)]
    impls += [("wrong-signature", lambda x, cos: x)]
    impls += [("writes-into-a-gap", writes_into_a_gap), ("leaves-last-row", leaves_last_row)]
    impls += [("nan-in-one-element", nan_in_one_element), ("zero-where-nan", zero_where_nan)]
    impls += [("crashes-on-bf16", crashes_on_bf16)]
    norm = "two-boundaries+" if op == "qnorm_rope" else ""
    labels = {"bfloat16": f"{norm}truncating-store", "float16": f"{norm}interleaved", "float32": f"{norm}interleaved"}
    impls += [("truncates-bf16-only", per_dtype_impl(op, labels))]
    if op == "partial_rope":
        impls.append(("writes-into-x", writes_into_x))
    return judge(op, impls)


@pytest.fixture(scope="module", params=["qnorm_rope", "partial_rope"])
def emulations_judged(request):
    """Each known semantics' emulation fed to the command as an implementation (its own fixture: one test
    uses it, so each xdist worker that builds a fixture builds the one its test needs)."""
    op = request.param
    return judge(op, [(f"emulation {label}", emulation_impl(op, label)) for label in JUDGED[op].emulations["forward"]])


def test_each_semantics_is_named_with_its_own_label(emulations_judged):
    op, results, _ = emulations_judged
    for label in JUDGED[op].emulations["forward"]:
        forward = results[f"emulation {label}"]["forward"]
        assert forward["semantics"] == label.split("+"), (label, forward["semantics"])
        inside = all(part in INSIDE for part in label.split("+"))
        assert forward["conforms"] == inside, (label, forward["outside_model"], forward["first_violation"])


def test_dsrope_and_the_eager_chain_conform_with_the_contracts_semantics(dsrope_judged):
    op, results, _ = dsrope_judged
    for name in ("dsrope", "eager-chain"):
        r = results[name]
        assert r["forward"]["conforms"] and r["backward"]["conforms"], name
        # on the GPU too: the kernels are launched without multiply-add contraction (the contract's roundings)
        assert r["forward"]["semantics"] == CONTRACT[op].split("+"), (name, r["forward"]["semantics"])
        backward = ["two-boundaries"] if op == "qnorm_rope" else ["interleaved"]
        assert r["backward"]["semantics"] == backward, (name, r["backward"]["semantics"])
        assert r["forward"]["writes_into_input"] == [] and r["forward"]["token_major_output"] is (name == "dsrope")
        assert set(r["forward"]["layouts"].values()) == {"accepted"}, r["forward"]["layouts"]


def test_one_ulp_on_one_percent_does_not_conform_and_has_no_semantics(judged):
    _, results, _ = judged
    forward = results["off-by-one-ulp"]["forward"]
    assert not forward["conforms"] and forward["outside_model"] > 0
    assert forward["semantics"] == []
    first = forward["first_violation"]
    assert {"case", "recipe", "index", "input", "got", "contract", "bounds"} <= set(first)


def test_failures_are_reported_not_raised(judged):
    op, results, _ = judged
    failing = results["raises"]["forward"]
    assert failing["elements"] == 0 and failing["conforms"] is None and failing["verdict"] == "not run"
    backward = results["raises"]["backward"]  # no forward ran: the backward was not run either
    assert backward is not None and backward["verdict"] == "not run" and backward["semantics"] == []
    assert {n["status"] for n in failing["not_run"]} == {"raised"}
    assert "RuntimeError: this implementation always fails" in failing["not_run"][0]["error"]
    assert set(failing["layouts"].values()) == {"raised"}
    assert failing["refusals"] == {
        "raised (RuntimeError: this implementation always fails)": [n["case"] for n in failing["not_run"]]
    }  # credited to what it said, in its own words

    shape = results["wrong-shape"]["forward"]
    assert shape["verdict"] == "does not conform" and shape["conforms"] is False
    assert {n["status"] for n in shape["not_run"]} == {"wrong output"}
    assert set(shape["layouts"].values()) == {"wrong output"}  # its own word, not "silently wrong"

    signature = results["wrong-signature"]["forward"]  # a TypeError of the call itself: not a refusal
    assert signature["verdict"] == "not run" and {n["status"] for n in signature["not_run"]} == {"wrong signature"}
    assert set(signature["layouts"].values()) == {"wrong signature"}

    fp16 = results["refuses-fp16"]["forward"]
    assert fp16["conforms"] and fp16["verdict"] == "partial" and {n["status"] for n in fp16["not_run"]} == {"refused"}
    assert all("float16" in n["case"] or "fp16" in n["case"] or n["case"].startswith("sweep") for n in fp16["not_run"])

    if op == "partial_rope":  # its output is right; the write into x fails it, with the first element changed
        wrote = results["writes-into-x"]["forward"]
        assert wrote["writes_into_input"] == ["x"] and wrote["verdict"] == "does not conform"
        assert wrote["outside_model"] == 0 and wrote["writes"][0]["index"] is not None


def test_wrong_outputs_do_not_conform(judged):
    """A partial result, one NaN where the reference is finite, a finite value where it is NaN: each is
    outside the model, in the forward, with its first element reported."""
    _, results, _ = judged
    for name in ("leaves-last-row", "nan-in-one-element", "zero-where-nan"):
        forward = results[name]["forward"]
        assert forward["verdict"] == "does not conform" and forward["conforms"] is False, name
        assert forward["outside_model"] > 0 and forward["first_violation"] is not None, name
    assert (
        results["nan-in-one-element"]["forward"]["first_violation"]["got"]
        != results["nan-in-one-element"]["forward"]["first_violation"]["got"]
    )  # NaN: the reported value is NaN


def test_a_write_into_a_gap_of_x_fails_the_verdict(judged):
    """The bytes between x's elements (NaN-poisoned gaps of strided layouts) are part of what a call must
    leave alone: a write there is a write into x, reported at its storage element (no logical index)."""
    _, results, _ = judged
    forward = results["writes-into-a-gap"]["forward"]
    assert forward["writes_into_input"] == ["x"] and forward["verdict"] == "does not conform"
    assert forward["outside_model"] == 0 and all(w["index"] is None for w in forward["writes"])


def test_some_cases_crashing_is_partial_and_says_which(judged):
    _, results, _ = judged
    r = results["crashes-on-bf16"]
    for direction in ("forward", "backward"):
        d = r[direction]
        assert d["verdict"] == "partial" and d["conforms"], direction
        assert d["not_run"] and all(n["status"] == "raised" and "no bf16 kernel" in n["error"] for n in d["not_run"])
        assert {c["dtype"] for c in d["cases"]} == {"float16", "float32"}, direction


def test_against_compares_two_implementations_element_by_element():
    """The other implementation: one ulp off on half the elements, a second ulp further on fp16 cases.
    The comparison weighs cases by their elements, takes the largest distance of any case, and lists
    each case's own."""
    one_ulp = off_by_one_ulp(eager_partial_rope, share=0.5)

    def one_or_two_ulp(x, cos, sin, rotary):
        out = one_ulp(x, cos, sin, rotary)
        if x.dtype != torch.float16:
            return out
        return torch.where(out.isfinite(), torch.nextafter(out, torch.full_like(out, float("inf"))), out)

    results, _ = conformance.run(
        "partial_rope",
        [("dsrope", dsrope.apply_partial_rope_triton)],
        "cuda" if ON_GPU else "cpu",
        examples=0,
        against_impl=("one-or-two-ulp", one_or_two_ulp),
        progress=lambda msg: None,
    )
    against = results[0]["against"]
    assert against["impl"] == "one-or-two-ulp"
    per_case = {c["case"]: c for c in against["forward"]["cases"]}
    fp16 = [c for name, c in per_case.items() if name.endswith(("-float16", "-fp16"))]
    assert fp16 and all(c["bitwise_equal"] < 0.01 for c in fp16), [(c["case"], c["bitwise_equal"]) for c in fp16]
    assert 0.2 < against["forward"]["bitwise_equal"] < 0.6
    # ours is the eager rotation bit for bit on either device (no multiply-add contraction): the moves are the ulps
    assert against["forward"]["max_ulp"] == 2 and per_case["dsv4-bfloat16"]["max_ulp"] == 1
    assert {c["max_ulp"] for c in fp16} == {2}
    assert against["backward"]["bitwise_equal"] == 1.0  # the ulp moves are in the forward only


def test_semantics_are_named_per_dtype_where_they_differ(judged):
    """Truncating bf16 stores, rounding fp16 (and fp32) to nearest: no one label fits every dtype, and each
    dtype is named for what it does."""
    from dsrope_gate.conformance.judging import semantics_text

    op, results, _ = judged
    forward = results["truncates-bf16-only"]["forward"]
    norm = ["two-boundaries"] if op == "qnorm_rope" else []
    assert forward["semantics"] == []
    by_dtype = forward["semantics_by_dtype"]
    assert by_dtype["bfloat16"] == [*norm, "truncating-store"] and by_dtype["float16"] == [*norm, "interleaved"]
    text = semantics_text(forward)
    assert "truncating-store on bfloat16" in text and "interleaved on float16" in text, text
    assert forward["verdict"] == "does not conform"  # truncation leaves the error model


def test_the_report_and_the_json_carry_each_verdict(judged):
    """The markdown table names each implementation's verdict and semantics as the JSON holds them; the
    first violation leads with the case that holds it (the first judged case with an element outside)."""
    from dsrope_gate.conformance.render import render

    op, results, meta = judged
    text = render(list(results.values()), meta)
    expected = {
        "eager-chain": "| conforms |",
        "refuses-fp16": "| partial |",
        "raises": "| **not run** |",
        "leaves-last-row": "| **does not conform** |",
    }
    for name, cell in expected.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` | {op} | forward |"))
        assert cell in row, row
        assert results[name]["forward"]["verdict"] == cell.strip("| *")
    row = next(line for line in text.splitlines() if line.startswith(f"| `raises` | {op} | forward |"))
    assert "| nothing judged |" in row  # no semantics claimed with nothing judged
    forward = results["leaves-last-row"]["forward"]
    first_bad = next(c["case"] for c in forward["cases"] if c["outside_model"])
    assert forward["first_violation"]["case"] == first_bad
    outcomes = {probe: outcome for probe, outcome in forward["layouts"].items() if not probe.startswith("empty")}
    assert set(outcomes.values()) == {"silently wrong"} and forward["layouts"]["empty (S = 0)"] == "accepted"
    assert json.loads(json.dumps(results, default=str))[name]["forward"]["verdict"] == "does not conform"


def test_the_report_defines_every_label_it_prints(judged):
    from dsrope_gate.conformance.render import render
    from dsrope_gate.semantics import LABELS

    _, results, meta = judged
    text = render(list(results.values()), meta)
    printed = {label for r in results.values() for label in r["forward"]["semantics"]}
    assert printed and all(f"- `{label}`: {LABELS[label]}" in text for label in printed)


def test_the_dtypes_whose_bits_carry_semantics_are_pinned(judged):
    """qnorm_rope's fp32 bits carry its rstd's reduction order, not its roundings: bf16 and fp16 only;
    partial_rope's every dtype. The judged cases carry semantics shares in exactly those dtypes."""
    from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE

    assert QNORM_ROPE.semantic_dtypes == ("bfloat16", "float16")
    assert PARTIAL_ROPE.semantic_dtypes == ("bfloat16", "float16", "float32")
    op, results, _ = judged
    for direction in ("forward", "backward"):
        cases = results["eager-chain"][direction]["cases"]
        assert {c["dtype"] for c in cases if "shares" in c} == set(JUDGED[op].semantic_dtypes), direction
