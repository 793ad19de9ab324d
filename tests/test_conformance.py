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


def refuses_fp16(x, cos, sin, rotary, *eps):
    if x.dtype == torch.float16:
        raise TypeError("x: float16 is not supported")
    return eager_partial_rope(x, cos, sin, rotary) if not eps else eager_qnorm_rope(x, cos, sin, rotary, *eps)


def emulation_impl(op, label):
    """The emulation as an implementation; it computes on the CPU on any device (on a GPU, torch's own
    reductions would move last bits, and this test is about the command, not about torch's kernels)."""
    emulate = JUDGED[op].emulations["forward"][label]

    def impl(x, cos, sin, rotary, *eps):
        out = emulate(x.cpu(), cos.cpu(), sin.cpu(), rotary, eps[0] if eps else None, None)
        return out.to(x.device)

    return impl


@pytest.fixture(scope="module", params=["qnorm_rope", "partial_rope"])
def judged(request):
    op = request.param
    kernel = dsrope.qnorm_rope_triton if op == "qnorm_rope" else dsrope.apply_partial_rope_triton
    eager = eager_qnorm_rope if op == "qnorm_rope" else eager_partial_rope
    impls = [("dsrope", kernel), ("eager-chain", eager), ("off-by-one-ulp", off_by_one_ulp(eager))]
    impls += [("raises", raises), ("wrong-shape", wrong_shape), ("refuses-fp16", refuses_fp16)]
    if op == "partial_rope":
        impls.append(("writes-into-x", writes_into_x))
    impls += [(f"emulation {label}", emulation_impl(op, label)) for label in JUDGED[op].emulations["forward"]]
    device = "cuda" if ON_GPU else "cpu"
    results, meta = conformance.run(op, impls, device, examples=SWEEP, seed=0, progress=lambda msg: None)
    json.dumps(results, default=str)  # the JSON the command writes holds these
    return op, {r["impl"]: r for r in results}, meta


def test_each_semantics_is_named_with_its_own_label(judged):
    op, results, _ = judged
    for label in JUDGED[op].emulations["forward"]:
        forward = results[f"emulation {label}"]["forward"]
        assert forward["semantics"] == label.split("+"), (label, forward["semantics"])
        inside = all(part in INSIDE for part in label.split("+"))
        assert forward["conforms"] == inside, (label, forward["outside_model"], forward["first_violation"])


def test_dsrope_and_the_eager_chain_conform_with_the_contracts_semantics(judged):
    op, results, _ = judged
    for name in ("dsrope", "eager-chain"):
        r = results[name]
        assert r["forward"]["conforms"] and r["backward"]["conforms"], name
        if ON_GPU and name == "dsrope":  # compiled: products may be fused into the adds (FMA contraction)
            fused = [p.replace("interleaved", "fma-rotation") for p in CONTRACT[op].split("+")]
            assert r["forward"]["semantics"] in (CONTRACT[op].split("+"), fused), r["forward"]["semantics"]
        else:
            assert r["forward"]["semantics"] == CONTRACT[op].split("+"), (name, r["forward"]["semantics"])
        backward = ["two-boundaries"] if op == "qnorm_rope" else ["interleaved"]
        if not (ON_GPU and name == "dsrope" and op == "partial_rope"):
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
    assert failing["elements"] == 0 and not failing["conforms"]
    assert {n["status"] for n in failing["not_run"]} == {"crashed"}
    assert "RuntimeError: this implementation always fails" in failing["not_run"][0]["error"]
    assert set(failing["layouts"].values()) == {"crashed"}

    shape = results["wrong-shape"]["forward"]
    assert not shape["conforms"] and {n["status"] for n in shape["not_run"]} == {"wrong output"}
    assert set(shape["layouts"].values()) == {"silently wrong"}

    fp16 = results["refuses-fp16"]["forward"]
    assert fp16["conforms"] and {n["status"] for n in fp16["not_run"]} == {"refused"}
    assert all("float16" in n["case"] or "fp16" in n["case"] or n["case"].startswith("sweep") for n in fp16["not_run"])

    if op == "partial_rope":
        wrote = results["writes-into-x"]["forward"]
        assert wrote["writes_into_input"] == ["x"] and wrote["conforms"]


def test_against_compares_two_implementations_element_by_element():
    one_ulp = off_by_one_ulp(eager_partial_rope, share=0.5)
    results, _ = conformance.run(
        "partial_rope",
        [("dsrope", dsrope.apply_partial_rope_triton)],
        "cuda" if ON_GPU else "cpu",
        examples=0,
        against_impl=("one-ulp", one_ulp),
        progress=lambda msg: None,
    )
    against = results[0]["against"]
    assert against["impl"] == "one-ulp"
    assert 0.3 < against["forward"]["bitwise_equal"] < 0.7
    if not ON_GPU:  # compiled, ours fuses products into the adds: fp32 elements near cancellation move more
        assert against["forward"]["max_ulp"] == 1
    if not ON_GPU:  # compiled, ours may fuse products into the adds where eager rounds each
        assert against["backward"]["bitwise_equal"] == 1.0  # the ulp moves are in the forward only
