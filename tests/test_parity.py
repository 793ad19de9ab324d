"""The parity matrix (dsrope_gate.parity) on the CPU: every pair's bitwise-equal share, max ulp and reason,
for emulations of known semantics and the CPU-capable presets (dsrope, eager-chain, transformers, sglang,
nemo-automodel), on the canonical cases and the layout probes (no golden store, no sweep: the shares
pinned here are of those 17 cases).

- a pair that computes the same function reads 100% with "same semantics";
- a pair known to differ (the contract's norm and sglang's, boundary 1 missing) reads its share and
  "two-boundaries vs fp32-through";
- the shares measured when the matrix was written are pinned, so that a peer release or a change of the
  classifier that changes them fails here with what changed.
"""

from __future__ import annotations

import json

import pytest

from dsrope_gate import parity, presets
from dsrope_gate.inputs import ON_GPU
from dsrope_gate.ops import JUDGED, ROWS

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU shares; the H200's are in docs/parity.md")

PRESETS = ("dsrope", "eager-chain", "transformers", "sglang", "nemo-automodel")


def emulation(op, label):
    emulate = JUDGED[op].emulations["forward"][label]
    return lambda x, cos, sin, rotary, *eps: emulate(x, cos, sin, rotary, eps[0] if eps else None, None)


EMULATIONS = {
    "qnorm_rope": ["two-boundaries+interleaved", "fp32-through+interleaved"],
    "partial_rope": ["interleaved", "half-split"],
}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    no_golden = tmp_path_factory.mktemp("no-golden")
    loaded = presets.load(PRESETS, "cpu", None, lambda msg: None)
    rows, results = [], []
    for op in ROWS.values():
        impls = [(impl.name, impl.fn) for impl in loaded if impl.op is op]
        impls += [(f"emulation {label}", emulation(op.name, label)) for label in EMULATIONS[op.name]]
        r, found, _ = parity.parity(op, impls, "cpu", examples=0, golden_root=no_golden, progress=lambda m: None)
        rows += r
        results += found
    return rows, results


def row(rows, a, b, direction, dtype):
    found = [r for r in rows if {r["a"], r["b"]} == {a, b} and r["direction"] == direction and r["dtype"] == dtype]
    assert len(found) == 1, (a, b, direction, dtype, found)
    return found[0]


def test_the_contract_emulation_and_its_implementations_are_bitwise_equal(matrix):
    rows, _ = matrix
    for other in ("eager-chain:F.rms_norm+fp32-rotation", "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope"):
        for dtype in ("bfloat16", "float16", "float32"):
            r = row(rows, "emulation two-boundaries+interleaved", other, "forward", dtype)
            assert (r["bitwise_equal"], r["max_ulp"]) == (1.0, 0), r
    r = row(rows, "emulation two-boundaries+interleaved", "eager-chain:F.rms_norm+fp32-rotation", "forward", "bfloat16")
    assert r["reason"] == "same semantics (two-boundaries, interleaved)"
    r = row(rows, "eager-chain:fp32-rotation", "sglang:apply_rotary_emb_triton", "forward", "bfloat16")
    assert (r["bitwise_equal"], r["reason"]) == (1.0, "same semantics (interleaved)")


def test_a_pair_known_to_differ_reads_its_share_and_reason(matrix):
    """The trainer's eager chain against sglang's fused q norm: boundary 1 missing on their side."""
    rows, _ = matrix
    for dtype in ("bfloat16", "float16"):
        r = row(rows, "eager-chain:F.rms_norm+fp32-rotation", "sglang:fused_norm_rope_inplace_triton", "forward", dtype)
        assert r["reason"] == "two-boundaries vs fp32-through", r
        assert 0.9 < r["bitwise_equal"] < 0.99, r
        assert r["outside_a"] == 0 and r["outside_b"] > 0, r  # boundary 1 missing lies outside the model
        r = row(rows, "emulation two-boundaries+interleaved", "emulation fp32-through+interleaved", "forward", dtype)
        assert r["reason"] == "two-boundaries vs fp32-through" and r["bitwise_equal"] < 0.99, r
    # sglang's kernel and the emulation of its semantics: the same function
    r = row(rows, "emulation fp32-through+interleaved", "sglang:fused_norm_rope_inplace_triton", "forward", "bfloat16")
    assert r["reason"] == "same semantics (fp32-through, interleaved)" and r["bitwise_equal"] >= 0.999, r
    r = row(rows, "emulation interleaved", "emulation half-split", "forward", "bfloat16")
    assert r["reason"] == "interleaved vs half-split" and r["bitwise_equal"] < 0.9, r
    # forward only: the pair's backward says so, no share
    r = row(rows, "eager-chain:fp32-rotation", "sglang:apply_rotary_emb_triton", "backward", "bfloat16")
    assert r["bitwise_equal"] is None and r["reason"] == "no backward: sglang:apply_rotary_emb_triton forward only"


EAGER_Q = "eager-chain:F.rms_norm+fp32-rotation"
EAGER_ROPE = "eager-chain:fp32-rotation"
# (A, B, direction) -> bitwise-equal share per dtype (bf16, fp16, fp32) on the canonical and probe cases,
# rounded to 4 decimals, as measured (CPU, torch 2.13, triton 3.9's interpreter). qnorm_rope
# in fp32: dsrope's kernel and sglang's compute rstd in another order than torch's F.rms_norm (the fp32
# bits carry no semantics, docs/contract.md), which moves last bits of whole rows.
PINNED = {
    ("dsrope:qnorm_rope_triton", EAGER_Q, "forward"): [1.0, 1.0, 0.8485],
    ("dsrope:qnorm_rope_triton", EAGER_Q, "backward"): [1.0, 0.9999, 0.5247],
    (EAGER_Q, "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb", "forward"): [0.7257, 0.7327, 1.0],
    (EAGER_Q, "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb", "backward"): [0.5979, 0.6042, 1.0],
    (EAGER_Q, "sglang:fused_norm_rope_inplace_triton", "forward"): [0.9416, 0.9482, 0.8485],
    (EAGER_Q, "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope", "forward"): [1.0, 1.0, 1.0],
    (EAGER_Q, "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope", "backward"): [1.0, 1.0, 1.0],
    ("dsrope:apply_partial_rope_triton", "dsrope:apply_partial_rope_triton_", "backward"): [1.0, 1.0, 1.0],
    ("dsrope:apply_partial_rope_triton", EAGER_ROPE, "forward"): [1.0, 1.0, 1.0],
    (EAGER_ROPE, "transformers:apply_rotary_pos_emb", "forward"): [1.0, 1.0, 1.0],
    (EAGER_ROPE, "transformers:apply_rotary_pos_emb", "backward"): [0.9392, 0.9466, 1.0],
    (EAGER_ROPE, "sglang:apply_rotary_emb_triton", "forward"): [1.0, 1.0, 1.0],
    (EAGER_ROPE, "nemo-automodel:apply_complex_rope", "forward"): [1.0, 1.0, 1.0],
    (EAGER_ROPE, "nemo-automodel:apply_complex_rope", "backward"): [1.0, 1.0, 1.0],
}


def test_pinned_shares(matrix):
    rows, _ = matrix
    got = {}
    for r in rows:
        if r["bitwise_equal"] is not None:
            got.setdefault((r["a"], r["b"], r["direction"]), []).append(round(r["bitwise_equal"], 4))
    for key, shares in PINNED.items():
        assert got[key] == shares, (key, got[key], shares)


def test_render_json_and_picture(matrix, tmp_path):
    rows, results = matrix
    meta = {"date": "d", "device": "cpu", "torch": "t", "triton": "t", "cases": 17, "sweep": 0, "seed": 0}
    text = parity.render(rows, results, [meta | {"golden": "none"}])
    assert "| `eager-chain:F.rms_norm+fp32-rotation` | `sglang:fused_norm_rope_inplace_triton` | bf16 |" in text
    assert "two-boundaries vs fp32-through" in text
    parity.picture(rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (["two-boundaries", "interleaved"], ["fp32-through", "interleaved"], "two-boundaries vs fp32-through"),
        (["interleaved"], ["interleaved"], "same semantics (interleaved)"),
        (["two-boundaries"], [], "two-boundaries vs no known semantics"),
        ([], [], "both no known semantics"),
        (["interleaved"], ["interleaved", "truncating-store"], "interleaved vs interleaved, truncating-store"),
        (None, ["interleaved"], "semantics not judged in this dtype"),
    ],
)
def test_reason(a, b, expected):
    assert parity.reason(a, b) == expected


LABEL_SETS = [
    ["two-boundaries", "interleaved"],
    ["fp32-through", "interleaved"],
    ["interleaved"],
    ["interleaved", "truncating-store"],
    ["half-split"],
    [],
    None,
]


@pytest.mark.parametrize("a", LABEL_SETS, ids=str)
@pytest.mark.parametrize("b", LABEL_SETS, ids=str)
def test_reason_read_from_both_sides(a, b):
    """A pair's reason read from B's side is A's read backwards: "X vs Y" becomes "Y vs X", the rest stays."""
    forward, backward = parity.reason(a, b), parity.reason(b, a)
    if " vs " in forward:
        left, right = forward.split(" vs ")
        assert backward == f"{right} vs {left}", (forward, backward)
        assert left != right
    else:
        assert backward == forward
    if a is not None and b is not None and a != b:
        assert " vs " in forward  # different labels never read as the same semantics


def test_the_command_line_writes_markdown_json_and_picture(tmp_path):
    """`--parity` on two implementations given by --impl: the three files, the pair's row in the JSON."""
    from dsrope_gate.cli import main

    impls = ["dsrope_gate.differential:eager_partial_rope", "dsrope:apply_partial_rope_triton"]
    argv = ["--parity", "--op", "partial_rope", "--device", "cpu", "--examples", "0", "--golden", str(tmp_path)]
    assert main(argv + [a for impl in impls for a in ("--impl", impl)] + ["--out", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert {(r["a"], r["b"]) for r in written["pairs"]} == {tuple(impls)}
    bf16 = [r for r in written["pairs"] if r["dtype"] == "bfloat16" and r["direction"] == "forward"]
    assert [(r["bitwise_equal"], r["reason"]) for r in bf16] == [(1.0, "same semantics (interleaved)")]
    assert (tmp_path / "out" / "parity.md").read_text().startswith("# Parity matrix")
    assert (tmp_path / "out" / "parity.png").read_bytes()[:4] == b"\x89PNG"
