"""The peers' pinned releases, judged on CPU by the conformance command (dsrope_gate.presets): each
verdict and semantics as measured when the presets were written (docs/presets.md), so that a peer
release, or a change of our classifier, that changes what they compute fails here with what changed.

Presets that run on CPU: transformers (eager), sglang and sglang-batched (their Triton kernels in the
interpreter), nemo-automodel (its public function's eager path on CPU; its DeepSeek-V4 q path) and
megatron-core (its Triton kernels in the interpreter, triton >= 3.4). veomni and flash-attn need CUDA for
their kernels (their device helpers have no CPU form): the H200 judges them. The controls (dsrope, the
eager chain) are held to the contract by tests/test_conformance.py. The `tests` session installs the pinned
releases (noxfile.py) and megatron-core's module is fetched at first use (DSROPE_PEERS_CACHE); without
one, its expectations are skipped with the command that installs it. One test per implementation, so that
xdist spreads them (each judges one on every case of `examples=2`: 10-70 s in the interpreter).
"""

from __future__ import annotations

import pytest

from dsrope_gate import conformance, presets
from dsrope_gate.inputs import ON_GPU

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU expectations; the H200's are in docs/parity.md")

# preset -> result name -> (forward: verdict, semantics), (backward: verdict, semantics) or None (forward only)
EXPECTED = {
    "transformers": {
        "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb": (
            ("does not conform", ["rounded-rstd", "interleaved"]),
            ("does not conform", []),
        ),
        "transformers:apply_rotary_pos_emb": (("conforms", ["interleaved"]), ("does not conform", [])),
    },
    "sglang": {
        "sglang:fused_norm_rope_inplace_triton": (("does not conform", ["fp32-through", "interleaved"]), None),
        "sglang:apply_rotary_emb_triton": (("conforms", ["interleaved"]), None),
    },
    # R not a power of two (drawn cases) runs past the rotary slice; every canonical case is the contract's bits
    "sglang-batched": {"sglang:apply_rotary_emb_triton(batched)": (("does not conform", ["interleaved"]), None)},
    "nemo-automodel": {
        "nemo-automodel:deepseek_v4.q_norm+_apply_partial_rope": (
            ("conforms", ["two-boundaries", "interleaved"]),
            ("conforms", ["two-boundaries"]),
        ),
        "nemo-automodel:apply_complex_rope": (("conforms", ["interleaved"]), ("conforms", ["interleaved"])),
    },
    # partial: it refuses the drawn cases whose R/2 is not a power of two; its bf16 backward in the interpreter
    # negates raw bf16 bits (docs/presets.md)
    "megatron-core": {
        "megatron-core:fused_apply_mla_rope_for_q": (("partial", ["interleaved"]), ("does not conform", [])),
    },
}


def loaded_preset(preset):
    skipped = []
    loaded = presets.load([preset], "cpu", None, skipped.append)
    if not loaded:
        pytest.skip("; ".join(skipped) or f"{preset} did not load")
    return loaded


@pytest.mark.parametrize("preset", list(EXPECTED))
def test_every_implementation_of_a_peer_is_pinned(preset):
    assert sorted(impl.name for impl in loaded_preset(preset)) == sorted(EXPECTED[preset])


@pytest.mark.parametrize(("preset", "name"), [(p, n) for p, names in EXPECTED.items() for n in names])
def test_peer_verdicts_and_semantics(preset, name):
    found = [impl for impl in loaded_preset(preset) if impl.name == name]
    assert len(found) == 1, f"{preset} no longer has {name}"
    impl = found[0]
    (r,), _ = conformance.run(impl.op, [(name, impl.fn)], "cpu", examples=2, progress=lambda msg: None)
    forward, backward = EXPECTED[preset][name]
    got = (r["forward"]["verdict"], r["forward"]["semantics"])
    assert got == forward, f"{name} forward: expected {forward}, the pinned release gives {got}"
    if backward is None:
        assert r["backward"] is None, f"{name}: a backward appeared (its output now carries a grad_fn)"
    else:
        got = (r["backward"]["verdict"], r["backward"]["semantics"])
        assert got == backward, f"{name} backward: expected {backward}, the pinned release gives {got}"
    assert r["forward"]["writes_into_input"] == [], f"{name}: the adapter let it write into the caller's input"


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_backward_is_declared_where_the_output_carries_a_grad_fn(preset):
    """Implementation.backward (the benchmark's 'no backward' cells) says None exactly where fn's result on
    an input that requires grad has no grad_fn."""
    import torch

    from dsrope_gate.inputs import tables, values

    loaded = loaded_preset(preset)
    x = values((1, 2, 3, 96), torch.bfloat16, 0).requires_grad_()
    cos, sin = tables(1, 3, 64, 0, per_batch=True, device="cpu")
    ran = 0
    for impl in loaded:
        try:
            out = impl.fn(x, cos, sin, 64, 1e-6) if impl.op.name == "qnorm_rope" else impl.fn(x, cos, sin, 64)
        except Exception as e:  # flash-attn's launcher on CPU: nothing to see here, the H200 judges it
            print(f"{impl.name}: {type(e).__name__}: {e}")
            continue
        ran += 1
        assert (out.grad_fn is not None) == (impl.backward is not None), (
            f"{impl.name}: backward={impl.backward!r}, its output's grad_fn is {out.grad_fn}"
        )
    if not ran:
        pytest.skip(f"no implementation of {preset} runs on CPU")


def test_megatron_is_not_loadable_below_triton_3_4_without_cuda(monkeypatch):
    """Their module defines no kernel below triton 3.4 without CUDA (its HAVE_TRITON): the preset is skipped
    with that reason rather than judged as crashing. The CI runs an older triton too (noxfile.TRITONS): the
    triton found decides which way the unpatched load goes; the patched version forces the old one's."""
    import triton
    from packaging.version import Version

    def load():
        said = []
        return presets.load(["megatron-core"], "cpu", None, said.append), said

    found, said = load()
    if any("is not in" in s for s in said):
        pytest.skip("; ".join(said))  # the module is not fetched here
    assert bool(found) == (Version(triton.__version__) >= Version("3.4")), said
    monkeypatch.setattr(triton, "__version__", "3.3.1")
    found, said = load()
    assert found == [] and len(said) == 1 and "turns its Triton kernels off" in said[0], said


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
    contract's in fp32 (its bf16 backward in the interpreter: docs/presets.md)."""
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
