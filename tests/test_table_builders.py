"""The table builders of the pinned projects and dsrope's own (dsrope_gate.table_builders), judged on the CPU
over dsrope_gate.tables.CASES (DeepSeek-V4's main and compress layers, DeepSeek-V3, a clamped ramp; positions
near 0, near the original length and up to 2**20): every verdict (entries outside the model per case, the
refusals) and the semantics each builder is classified with, as measured with torch 2.13 on x86 CPUs.

- FP32 builders conform everywhere. DeepSeek's op order (dsrope, sglang, nemo-automodel) is the contract;
  transformers, veomni and megatron-core compute the YaRN interpolated frequency as 1 / (factor * theta**e),
  yarn-reciprocal-product (inside the model; other bits on DeepSeek-V3, whose factor 40 is no power of two);
  dsrope's fp64=True computes its frequencies in FP64 (fp64-frequencies).
- the builders that build the table in the activations' dtype, called as their models call them with bf16
  activations, fall outside the model on about half the entries even far past the original length, where the
  model is widest: bf16-cache.
- transformers' DeepseekV3RotaryEmbedding and megatron-core's YarnRotaryEmbedding fold YaRN's attention factor
  into the table: their HF-convention ratio, 1.2773 on DeepSeek-V4's compress configuration (no mscale keys),
  declared by their adapters and judged against the scaled reference.
- vLLM's cos_sin_cache holds positions 0 to 2**20 - 1 (DeepSeek-V4's max_position_embeddings): it refuses the
  far cases, which reach 2**20 (partial).
Every verdict is the conformance command's (`--op rope_tables --preset all`, judged in this process once) and
assert_conforms's; the builders that need CUDA are judged on the GPU (marked gpu). A project whose pinned package
is missing is skipped with the command that installs it.
"""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from dsrope_gate import table_builders, tables
from dsrope_gate.cli import main
from dsrope_gate.presets import Missing
from dsrope_gate.tables import CASES, CONTRACT
from dsrope_gate.testing import assert_conforms

NAMES = [case.name for case in CASES]
YARN = [case.name for case in CASES if case.scaling is not None]
PLAIN = [case.name for case in CASES if case.scaling is None]
CONFORMS = dict.fromkeys(NAMES, 0)
# entries outside the model per case (cos and sin; None: refused), as measured
BF16_TABLES = {
    "v4-main/start": 958,
    "v4-main/original": 744,
    "v4-main/far": 441,
    "v4-compress/start": 843,
    "v4-compress/original": 816,
    "v4-compress/far": 533,
    "v3/start": 881,
    "v3/original": 967,
    "v3/far": 433,
    "ramp-clamped/far": 230,
}
EXPECTED = {
    # builder: (outside per case, labels)
    "dsrope:freqs_cis_from_position_ids": (CONFORMS, [CONTRACT]),
    "dsrope:freqs_cis_from_position_ids(fp64=True)": (CONFORMS, ["fp64-frequencies"]),
    "transformers:DeepseekV4RotaryEmbedding": (CONFORMS, ["yarn-reciprocal-product"]),
    "transformers:DeepseekV4RotaryEmbedding(bf16 activations)": (BF16_TABLES, ["bf16-cache"]),
    "transformers:DeepseekV3RotaryEmbedding": (CONFORMS, ["yarn-reciprocal-product"]),
    "sglang:precompute_freqs_cis": (CONFORMS, [CONTRACT]),
    "nemo-automodel:deepseek_v4.DeepseekV4RotaryEmbedding": (CONFORMS, [CONTRACT]),
    "nemo-automodel:deepseek_v4.DeepseekV4RotaryEmbedding(bf16 activations)": (BF16_TABLES, ["bf16-cache"]),
    "nemo-automodel:deepseek_v3.freqs_cis_from_position_ids": (CONFORMS, [CONTRACT]),
    "megatron-core:YarnRotaryEmbedding": (
        dict.fromkeys(PLAIN, None) | dict.fromkeys(YARN, 0),
        ["yarn-reciprocal-product"],
    ),
    "megatron-core:YarnRotaryEmbedding(bf16 activations)": (
        BF16_TABLES
        | dict.fromkeys(PLAIN, None)
        | {"v4-compress/start": 992, "v4-compress/original": 830, "v4-compress/far": 541},
        ["bf16-cache"],
    ),
    "megatron-core:RotaryEmbedding": (dict.fromkeys(PLAIN, 0) | dict.fromkeys(YARN, None), [CONTRACT]),
    "veomni:DeepseekV4RotaryEmbedding": (CONFORMS, ["yarn-reciprocal-product"]),
    "vllm:DeepseekV4ScalingRotaryEmbedding.cos_sin_cache": (
        CONFORMS | dict.fromkeys(("v4-main/far", "v4-compress/far", "v3/far", "ramp-clamped/far"), None),
        ["yarn-reciprocal-product"],
    ),
}
# a refusal names what the builder does not build
REFUSALS = ("megatron-core's", "positions: their cache holds positions 0 to ")
FOLDS_MSCALE = ("transformers:DeepseekV3RotaryEmbedding", "megatron-core:YarnRotaryEmbedding")
ATLAS_FACTOR = 0.1 * math.log(16) + 1
CASE = {case.name: case for case in CASES}


@functools.cache
def builders() -> dict:
    """Every builder of every project that loads here; a project that does not: its reason."""
    found = {}
    for project, factory in table_builders.BUILDERS.items():
        try:
            found.update({b.name: b for b in factory()})
        except Missing as e:
            found[project] = str(e)
    return found


def builder(name: str):
    loaded = builders()
    if name not in loaded:
        reason = loaded.get(name.split(":")[0], "not loaded")
        pytest.skip(f"{name}: {reason}")
    return loaded[name]


def verdict_of(outside: dict) -> str:
    """The verdict of per-case counts of entries outside the model (None: refused)."""
    if any(outside.values()):
        return "does not conform"
    return "partial" if None in outside.values() else "conforms"


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict:
    """Every builder's result through the conformance command (`--op rope_tables --preset all`, in this process:
    each builder's own child is tests/test_table_op.py's), by name; the command's exit status under None."""
    out = tmp_path_factory.mktemp("tables")
    argv = ["--op", "rope_tables", "--preset", "all", "--in-process", "--out", str(out), "--json", str(out / "r.json")]
    rc = main(argv)
    results = json.loads((out / "r.json").read_text())["results"]
    return {r["impl"]: r for r in results} | {None: rc}


def forward(judged: dict, name: str) -> dict:
    if name not in judged:
        builder(name)  # skips with the reason its project did not load
    return judged[name]["forward"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_builder_verdicts(judged, name):
    """Entries outside the model on each case, as measured, and the verdict the command gives for them; a refusal
    names what the builder does not build."""
    outside, _ = EXPECTED[name]
    record = forward(judged, name)
    got = {c["case"]: c["outside_model"] for c in record["cases"]} | {n["case"]: None for n in record["not_run"]}
    assert got == outside, {k: v for k, v in got.items() if v != outside.get(k)}
    assert all(
        n["status"] == "refused" and n["error"].split(": ", 1)[1].startswith(REFUSALS) for n in record["not_run"]
    )
    assert record["verdict"] == verdict_of(outside) and record["writes"] == []
    assert all(c["elements"] == 2 * CASE[c["case"]].batch * CASE[c["case"]].seq * 32 for c in record["cases"])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_builder_semantics(judged, name):
    _, expected = EXPECTED[name]
    assert forward(judged, name)["semantics"] == expected


def test_every_builder_is_pinned_and_the_command_fails_on_the_bf16_ones(judged):
    loaded = [name for name, b in builders().items() if isinstance(b, tables.TableBuilder)]
    assert sorted(loaded) == sorted(n for n in EXPECTED if n in loaded) and len(loaded) == len(EXPECTED)
    assert sorted(n for n in judged if n is not None) == sorted(loaded)
    assert judged[None] == 1  # some builder does not conform


@pytest.mark.parametrize("name", list(EXPECTED))
def test_assert_conforms_gives_each_builder_the_commands_verdict(name):
    """assert_conforms on a TableBuilder (it declares its attention factor): passes where the command's verdict is
    conforms, with the builder's semantics; fails with that verdict and the first entry outside otherwise."""
    outside, labels = EXPECTED[name]
    b = builder(name)
    if verdict_of(outside) == "conforms":
        result = assert_conforms(b, "rope_tables", semantics=labels)
        assert result["impl"] == name and result["forward"]["semantics"] == labels and result["backward"] is None
        return
    with pytest.raises(AssertionError) as failure:
        assert_conforms(b, "rope_tables")
    text = str(failure.value)
    assert text.startswith(f"{name} does not conform to rope_tables on cpu:\nrope_tables forward: "), text
    assert verdict_of(outside) in text.splitlines()[1], text
    if any(outside.values()):
        first = next(case for case, n in outside.items() if n)
        assert f"First entry outside the model: case {first!r}, " in text and "cos, sin = fn(positions" in text, text


@pytest.mark.parametrize("name", FOLDS_MSCALE)
def test_builders_that_fold_the_attention_factor_declare_it(judged, name):
    """Their HF-convention factor: 1.2773 on DeepSeek-V4's compress configuration (no mscale keys: HF's defaults
    1 and 0), 1 on DeepSeek-V3 (mscale = mscale_all_dim = 1) and on plain tables, named by the verdict; the table
    without the declared factor would be outside the model (the verdicts above hold with it)."""
    record = forward(judged, name)
    factors = {c["case"]: c["attention_factor"] for c in record["cases"]}
    assert all(factors[n] == ATLAS_FACTOR for n in ("v4-compress/start", "v4-compress/far"))
    assert all(factors[n] == 1.0 for n in factors if n.startswith(("v3/", "v4-main/")))
    assert record["attention_factors"] == {"v4-compress": ATLAS_FACTOR, "ramp-clamped": ATLAS_FACTOR}
    compress = [c for c in record["cases"] if c["case"].startswith("v4-compress/")]
    assert all(c["shares"]["mscale-ratio"] == 1.0 and c["shares"]["mscale-factor-only"] == 1.0 for c in compress)
    undeclared = tables.TableBuilder("undeclared", builder(name).fn)
    assert all(v.outside > 0.9 * v.elements for v in tables.judge(undeclared, [CASE[c["case"]] for c in compress]))


def test_other_builders_fold_no_attention_factor(judged):
    for name in EXPECTED:
        if name.startswith(FOLDS_MSCALE) or name not in judged:
            continue
        record = forward(judged, name)
        assert all(c["attention_factor"] == 1.0 for c in record["cases"]) and record["attention_factors"] == {}, name


def test_transformers_frequencies_anchor_the_yarn_labels():
    """transformers' own YaRN (ROPE_INIT_FUNCTIONS["yarn"]) on DeepSeek-V3: truncate=True is the
    yarn-reciprocal-product choice bit for bit (and not the contract's); truncate=False lies within one FP32
    rounding of the yarn-untruncated choice and far from the contract's ramp."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = tables.V3["scaling"].config()
    theirs = {}
    for truncate in (True, False):
        rope = dict(rope_type="yarn", rope_theta=10000.0, truncate=truncate, **table_builders._yarn_keys(scaling))
        config = transformers.DeepseekV3Config(
            qk_rope_head_dim=64, rope_parameters=rope, max_position_embeddings=163840
        )
        theirs[truncate], _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = {c: tables.label_frequencies(c, 64, 10000.0, scaling) for c in (None, "yarn-reciprocal-product")}
    assert torch.equal(theirs[True], ours["yarn-reciprocal-product"])
    assert not torch.equal(theirs[True], ours[None])
    untruncated = tables.label_frequencies("yarn-untruncated", 64, 10000.0, scaling)
    assert ((theirs[False].double() / untruncated.double() - 1).abs() <= 2**-22).all()
    assert (theirs[False].double() / ours[None].double() - 1).abs().max() > 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("name", [name for name in EXPECTED if "bf16" not in name])
def test_fp32_builders_conform_on_cuda(name):
    """On CUDA with FP32 matmuls (torch's default, TF32 off) every FP32 builder conforms under the CUDA
    allowances (cosf, sinf 2 ulp; powf 4 ulp) and keeps its CPU semantics."""
    torch.backends.cuda.matmul.allow_tf32 = False
    verdicts = tables.judge(builder(name), CASES, "cuda")
    assert all(v.conforms or v.refused for v in verdicts), [(v.case.name, v.first_violation) for v in verdicts]
    assert tables.labels(verdicts) == EXPECTED[name][1]


def test_vllm_and_transformers_tables_agree_bit_for_bit_on_cpu():
    """vLLM's cos_sin_cache and transformers' DeepseekV4RotaryEmbedding (FP32), each given DeepSeek-V4's config
    through its adapter, hold the same bits on CPU for a main layer (plain rope at 1e4) and a compress layer (YaRN
    factor 16 over 65536 at 160000): an adapter that mapped theta, the YaRN dict or the layer type wrongly would
    part them. Both are the rope at all: near position 0 they are within 4e-6 of the FP64 cos and sin (FP32
    inverse frequencies within 2 ulp, angles p*f for p < 8: under 2e-6 of angle, plus the cos's own rounding).
    Our convention: FP32 [B, S, R], pair k's entry in k and k + R/2. transformers' bf16-activations builder is its
    FP32 tables rounded to bf16; vLLM refuses positions past its cache (2**20 rows)."""
    from dsrope_gate.inputs import angles

    hf = builder("transformers:DeepseekV4RotaryEmbedding")
    vllm = builder("vllm:DeepseekV4ScalingRotaryEmbedding.cos_sin_cache")
    bf16 = builder("transformers:DeepseekV4RotaryEmbedding(bf16 activations)")
    g = torch.Generator().manual_seed(0)
    positions = torch.stack(
        (torch.arange(64), torch.arange(65536 - 32, 65536 + 32), torch.randint(0, 1 << 20, (64,), generator=g))
    )
    compress = dict(factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1)
    for theta, scaling in ((10000.0, None), (160000.0, compress)):
        ours = hf(positions, 64, theta, scaling)
        theirs = vllm(positions, 64, theta, scaling)
        for table in (*ours, *theirs):
            assert table.shape == (3, 64, 64) and table.dtype == torch.float32
            assert torch.equal(table[..., 32:], table[..., :32])
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(ours, bf16(positions, 64, theta, scaling), strict=True):
            assert torch.equal(a.bfloat16().float(), b)
    near_zero = positions[:1, :8]
    c64, s64 = angles(near_zero[..., None], 64)
    for table, exact in zip(vllm(near_zero, 64, 10000.0, None), (c64, s64), strict=True):
        assert (table[..., :32].double() - exact).abs().max() < 4e-6
    with pytest.raises(NotImplementedError, match="positions: their cache holds positions 0 to 1048575"):
        vllm(torch.tensor([[1 << 20]]), 64, 10000.0, None)
