"""The peers' pinned releases, judged on CPU by the conformance command (dsrope_gate.presets): each
verdict and semantics as measured when the presets were written (docs/presets.md), so that a peer
release, or a change of our classifier, that changes what they compute fails here with what changed.

Presets that run on CPU: transformers (eager), sglang and sglang-batched (their Triton kernels in the
interpreter), nemo-automodel (its public function's eager path on CPU; its DeepSeek-V4 q path),
megatron-core (its Triton kernels in the interpreter, triton >= 3.4) and vllm (its DeepSeek-V4 Triton
kernels in the interpreter). veomni and flash-attn need CUDA for their kernels (their device helpers have
no CPU form): the H200 judges them. The controls (dsrope, the eager chain) are held to the contract by
tests/test_conformance.py. The `tests` session installs the pinned releases (noxfile.py); megatron-core's
and vllm's modules are fetched at first use and transformers 5.23.0 is installed into its own folder at
first use (DSROPE_PEERS_CACHE); without one, its expectations are skipped with the command that installs
it. One test per implementation, so that xdist spreads them (each judges one on every case of
`examples=2`: 10-70 s in the interpreter).
"""

from __future__ import annotations

import pytest

from dsrope_gate import conformance, presets, table_builders
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
    # partial: their kernels are built for D = 512 (the q-norm's also for R = 64, module constants) and refuse
    # the V3, probe and drawn cases; the q-norm rotates the FP32 normalized row (fp32-through)
    "vllm": {
        "vllm:xpu_qnorm_rope_kv_fp8_insert": (("does not conform", ["fp32-through", "interleaved"]), None),
        "vllm:fused_inv_rope_fp8_quant(quantize=False,-sin)": (("partial", ["interleaved"]), None),
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
    x = values((1, 2, 3, 512), torch.bfloat16, 0).requires_grad_()
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


def test_vllm_qnorm_rope_q_bits_are_the_q_parts_alone():
    """vLLM's q-norm + rope launch also runs one program per token that rotates kv into a buffer of its own:
    q's bits are the same whatever kv holds, and are the fp32-through emulation's (the FP32 normalized row
    rotated unrounded, one rounding at the store), bit for bit in bf16."""
    import torch

    from dsrope_gate import semantics
    from dsrope_gate.inputs import tables, values

    impl = loaded_one("vllm")
    module = presets._vllm_modules()["vllm.models.deepseek_v4.xpu.xpu_qnorm_rope_kv_fp8_insert"]
    x = values((2, 3, 5, 512), torch.bfloat16, 0)
    cos, sin = tables(2, 5, 64, 0, per_batch=True, device="cpu")
    out = impl.fn(x, cos, sin, 64, 1e-6)
    expected = semantics.qnorm_forward("fp32-through", "interleaved")(x, cos, sin, 64, 1e-6)
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))

    q = x.transpose(1, 2).contiguous().view(10, 3, 512)
    tokens = torch.arange(10)
    cache = torch.cat((cos[..., :32], sin[..., :32]), -1).reshape(10, 64).contiguous()
    with presets._VllmImports(presets._vllm_modules()):
        module.xpu_qnorm_rope_kv_fp8_insert(
            q, values((10, 512), torch.bfloat16, 5), torch.empty(1, 0, dtype=torch.uint8), tokens, tokens, cache,
            1e-6, 1,
        )  # fmt: skip
    assert torch.equal(q.view(2, 5, 3, 512).transpose(1, 2).view(torch.int16), out.view(torch.int16))


def test_a_release_is_refused_where_another_release_of_its_package_is_imported():
    """Two releases of one package cannot share a process: asking for transformers@5.23.0 where 5.17.0 is
    imported raises VersionConflict naming both (and changes nothing); a version that is not pinned is
    refused with the pinned ones."""
    import sys

    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != "5.17.0":
        pytest.skip(f"transformers {transformers.__version__} is imported here, the pin is 5.17.0")
    path = list(sys.path)
    with pytest.raises(presets.VersionConflict, match="transformers@5.23.0: transformers 5.17.0 is already imported"):
        presets.load(["transformers@5.23.0"], "cpu")
    assert sys.path == path
    with pytest.raises(ValueError, match="pinned: transformers@5.17.0, transformers@5.23.0"):
        presets.load(["transformers@5.20.0"], "cpu")


RELEASE_OUTPUTS = """
import sys, torch
from dsrope_gate import presets, table_builders
from dsrope_gate.inputs import tables, values

said = []
impls = presets.load([sys.argv[1]], "cpu", None, said.append)
builders = table_builders.load([sys.argv[1]], said.append)
if not impls or not builders:
    print("; ".join(said))
    sys.exit(3)
import transformers
x = values((2, 3, 5, 512), torch.bfloat16, 0)
cos, sin = tables(2, 5, 64, 0, per_batch=True, device="cpu")
out = {"version": transformers.__version__, "file": transformers.__file__}
for impl in impls:
    args = (x, cos, sin, 64, 1e-6) if impl.op.name == "qnorm_rope" else (x, cos, sin, 64)
    out[impl.name.partition(":")[2]] = impl.fn(*args)
positions = torch.tensor([[0, 1, 4095, 65535, 65536, 1000003]])
compress = dict(factor=16, original_max_position_embeddings=65536)
for b in builders:
    out[b.name.partition(":")[2]] = b.fn(positions, 64, 160000.0, compress)
torch.save(out, sys.argv[2])
"""


def test_a_release_pinned_beside_loads_in_a_fresh_process_and_5_23_gives_5_17s_bits_on_cpu(tmp_path):
    """`transformers@5.23.0` in a fresh process: its own folder (CACHE/transformers-5.23.0) first on sys.path
    before transformers is imported, its names tagged with the version; its q path (the unweighted norm and
    the rotation) and its tables give 5.17.0's bits on CPU (docs/records/2026-12-07-transformers-5.17-vs-5.23.md:
    the angle product moved from a matmul to an elementwise product, one rounding of one product either way)."""
    import os
    import subprocess
    import sys

    import torch

    saved = tmp_path / "outputs.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run(
        [sys.executable, "-c", RELEASE_OUTPUTS, "transformers@5.23.0", str(saved)],
        env=env,
        capture_output=True,
        text=True,
    )
    if run.returncode == 3:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stderr[-2000:]
    theirs = torch.load(saved)
    assert theirs["version"] == "5.23.0" and str(presets.CACHE / "transformers-5.23.0") in theirs["file"]
    names = sorted(k for k in theirs if k not in ("version", "file"))
    ours = {impl.name.partition(":")[2]: impl for impl in loaded_preset("transformers")}
    builders = {b.name.partition(":")[2]: b for b in table_builders.load(["transformers"], lambda msg: None)}
    assert names == sorted([*ours, *builders])
    from dsrope_gate.inputs import tables, values

    x = values((2, 3, 5, 512), torch.bfloat16, 0)
    cos, sin = tables(2, 5, 64, 0, per_batch=True, device="cpu")
    for name, impl in ours.items():
        args = (x, cos, sin, 64, 1e-6) if impl.op.name == "qnorm_rope" else (x, cos, sin, 64)
        assert torch.equal(impl.fn(*args).view(torch.int16), theirs[name].view(torch.int16)), name
    positions = torch.tensor([[0, 1, 4095, 65535, 65536, 1000003]])
    for name, b in builders.items():
        got = b.fn(positions, 64, 160000.0, dict(factor=16, original_max_position_embeddings=65536))
        for a, c in zip(got, theirs[name], strict=True):
            assert torch.equal(a.view(torch.int32), c.view(torch.int32)), name


def test_the_command_lists_two_releases_of_one_package_each_in_a_process_of_its_own():
    """The conformance command lists the implementations of each preset name in a child of its own, so that
    `--preset transformers@5.17.0 --preset transformers@5.23.0` judges both (in one process the second
    would raise VersionConflict)."""
    from dsrope_gate.cli import preset_targets

    said = []
    listed = preset_targets(["transformers@5.17.0", "transformers@5.23.0"], "cpu", ["partial_rope"], said.append)
    if said:
        pytest.skip("; ".join(said))
    names = [target.name for _, target in listed]
    assert names == ["transformers@5.17.0:apply_rotary_pos_emb", "transformers@5.23.0:apply_rotary_pos_emb"]
    assert [target.preset for _, target in listed] == ["transformers@5.17.0", "transformers@5.23.0"]


# preset result name -> (contract, forward verdict, outside the model) under a contract other than the default:
# vLLM's q-norm+rope is fp32-through by design; judged against that contract it is exactly that (it refuses
# the shapes its module constants do not hold: partial), while sglang's fused q path is fp32-through too
CONTRACT_EXPECTED = {
    "vllm:xpu_qnorm_rope_kv_fp8_insert": ("vllm", "fp32-through", "partial", 0),
    "sglang:fused_norm_rope_inplace_triton": ("sglang", "fp32-through", "conforms", 0),
    "transformers:DeepseekV4UnweightedRMSNorm+apply_rotary_pos_emb": (
        "transformers",
        "fp32-through",
        "does not conform",
        None,
    ),
}


@pytest.mark.parametrize("name", list(CONTRACT_EXPECTED))
def test_verdicts_under_the_fp32_through_contract(name):
    preset, contract, verdict, outside = CONTRACT_EXPECTED[name]
    impl = next(i for i in loaded_preset(preset) if i.name == name)
    (r,), meta = conformance.run(impl.op, [(name, impl.fn)], "cpu", examples=2, contract=contract,
                                 progress=lambda msg: None)  # fmt: skip
    assert r["contract"] == meta["contract"] == contract
    forward = r["forward"]
    assert forward["verdict"] == verdict, (name, forward["verdict"], forward["outside_model"], forward["not_run"][:2])
    if outside is not None:
        assert forward["outside_model"] == outside
    assert "fp32-through" in forward["semantics"] or verdict == "does not conform"
