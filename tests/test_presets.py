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


def loaded_one(name):
    skipped = []
    found = presets.load([name], "cpu", None, skipped.append)
    if not found:
        pytest.skip("; ".join(skipped) or f"{name} did not load")
    from dsrope.interpreter import install_interpreter_rounding

    install_interpreter_rounding()  # their Triton stores round to nearest even, as on a GPU
    return found[0]


def test_sglang_batched_rope_writes_past_the_rotary_slice_when_r_is_not_a_power_of_two():
    """sglang's batched path (what its DSV4 model runs) on 3 heads of 96 channels: R = 64 is the contract's
    bits; R = 48 runs over next_power_of_2(48) = 64 channels, 16 past the slice: into the next head's
    leading channels (the very last row's overrun lands in the adapter's padding)."""
    import torch

    from dsrope_gate.differential import eager_partial_rope
    from dsrope_gate.inputs import tables, values

    impl = loaded_one("sglang-batched")
    x = values((2, 3, 5, 96), torch.bfloat16, 0)
    for rotary in (64, 48):
        cos, sin = tables(2, 5, rotary, 0, per_batch=True, device="cpu")
        differ = impl.fn(x, cos, sin, rotary).view(torch.int16) != eager_partial_rope(x, cos, sin, rotary).view(
            torch.int16
        )
        if rotary == 64:
            assert not differ.any()
        else:
            # only the 16 leading channels of heads past the first of all: the next head's in the token-major
            # rows (the last head's run over into the next token's first head)
            assert set(differ.nonzero()[:, 3].tolist()) == set(range(16))
            assert not differ[0, 0, 0].any() and differ[:, :, :, :16].float().mean() > 0.5


def test_megatron_mla_rope_for_q_is_the_contracts_rotation_in_fp32_both_ways():
    """Megatron-Core's fused q rope (one module of its wheel): forward and backward bit for bit the
    contract's in fp32 (its bf16 backward in the interpreter: docs/conformance.md)."""
    import torch

    from dsrope_gate.differential import eager_partial_rope, forward_backward
    from dsrope_gate.inputs import tables, values

    impl = loaded_one("megatron-core")
    x = values((2, 3, 5, 96), torch.float32, 0)
    grad = values((2, 3, 5, 96), torch.float32, 1)
    cos, sin = tables(2, 5, 64, 0, per_batch=True, device="cpu")
    xg = x.clone().requires_grad_()
    out = impl.fn(xg, cos, sin, 64)
    (dx,) = torch.autograd.grad(out, xg, grad)
    expected, expected_dx = forward_backward(eager_partial_rope, x, grad, cos, sin, 64)
    assert torch.equal(out.detach(), expected) and torch.equal(dx, expected_dx)
