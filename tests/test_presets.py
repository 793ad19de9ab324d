"""The peers' pinned releases, judged on CPU by the conformance command (dsrope_gate.presets): each
verdict and semantics as measured when the presets were written (docs/conformance.md), so that a peer
release, or a change of our classifier, that changes what they compute fails here with what changed.

Presets that run on CPU: transformers (eager), sglang (its Triton kernels in the interpreter) and
nemo-automodel (its public function's eager path on CPU; its DeepSeek-V4 q path). veomni and
flash-attn need CUDA for their kernels (their device helpers have no CPU form): the H200 judges them.
The `tests` session installs the pinned releases (noxfile.py); without one, its expectations are skipped
with the command that installs it.
"""

from __future__ import annotations

import pytest

from dsrope_gate import conformance, presets
from dsrope_gate.inputs import ON_GPU
from dsrope_gate.ops import JUDGED

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU expectations; the H200's are in docs/conformance.md")

# result name -> (forward: conforms, semantics), (backward: conforms, semantics) or None (forward only)
EXPECTED = {
    "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb": (
        (False, ["rounded-rstd", "interleaved"]),
        (False, []),
    ),
    "transformers:apply_rotary_pos_emb": ((True, ["interleaved"]), (False, [])),
    "sglang:fused_norm_rope_inplace_triton": ((False, ["fp32-through", "interleaved"]), None),
    "sglang:apply_rotary_emb_triton": ((True, ["interleaved"]), None),
    "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope": (
        (True, ["two-boundaries", "interleaved"]),
        (True, ["two-boundaries"]),
    ),
    "nemo-automodel:apply_complex_rope": ((True, ["interleaved"]), (True, ["interleaved"])),
}
PEERS = ("transformers", "sglang", "nemo-automodel")


@pytest.fixture(scope="module")
def judged():
    skipped = []
    loaded = presets.load(PEERS, "cpu", None, skipped.append)
    results = {}
    for op in JUDGED.values():
        impls = [(impl.name, impl.fn) for impl in loaded if impl.op is op]
        if impls:
            found, _ = conformance.run(op, impls, "cpu", examples=2, progress=lambda msg: None)
            results |= {r["impl"]: r for r in found}
    return results, skipped


@pytest.mark.parametrize("name", list(EXPECTED))
def test_peer_verdict_and_semantics(judged, name):
    results, skipped = judged
    if name not in results:
        pytest.skip("; ".join(s for s in skipped if name.split(":")[0] in s) or f"{name} did not load")
    r = results[name]
    (fwd_ok, fwd_sem), backward = EXPECTED[name]
    got = (r["forward"]["conforms"], r["forward"]["semantics"])
    assert got == (fwd_ok, fwd_sem), f"{name} forward: expected {(fwd_ok, fwd_sem)}, the pinned release gives {got}"
    if backward is None:
        assert r["backward"] is None, f"{name}: a backward appeared (its output now carries a grad_fn)"
    else:
        got = (r["backward"]["conforms"], r["backward"]["semantics"])
        assert got == backward, f"{name} backward: expected {backward}, the pinned release gives {got}"
    assert r["forward"]["writes_into_input"] == [], f"{name}: the adapter let it write into the caller's input"
