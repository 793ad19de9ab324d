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
A project whose pinned package is missing is skipped with the command that installs it.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from dsrope_gate import table_builders, tables
from dsrope_gate.presets import Missing
from dsrope_gate.tables import CASES, CONTRACT

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
}
FOLDS_MSCALE = ("transformers:DeepseekV3RotaryEmbedding", "megatron-core:YarnRotaryEmbedding")
ATLAS_FACTOR = 0.1 * math.log(16) + 1


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


@functools.cache
def verdicts(name: str):
    return tables.judge(builder(name))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_builder_verdicts(name):
    """Entries outside the model on each case, as measured; a refusal names what the builder does not build."""
    outside, _ = EXPECTED[name]
    got = {v.case.name: (None if v.refused else v.outside) for v in verdicts(name)}
    assert got == outside, {k: v for k, v in got.items() if v != outside[k]}
    for v in verdicts(name):
        assert (v.refused != "") == (outside[v.case.name] is None)
        assert v.refused == "" or "megatron-core's" in v.refused
        assert v.conforms == (outside[v.case.name] == 0)
        assert v.elements == 2 * v.case.batch * v.case.seq * v.case.rotary // 2 or v.refused


@pytest.mark.parametrize("name", list(EXPECTED))
def test_builder_semantics(name):
    _, expected = EXPECTED[name]
    assert tables.labels(verdicts(name)) == expected


def test_every_builder_is_pinned():
    loaded = [name for name, b in builders().items() if isinstance(b, tables.TableBuilder)]
    assert sorted(loaded) == sorted(n for n in EXPECTED if n in loaded) and len(loaded) == len(EXPECTED)


@pytest.mark.parametrize("name", FOLDS_MSCALE)
def test_builders_that_fold_the_attention_factor_declare_it(name):
    """Their HF-convention factor: 1.2773 on DeepSeek-V4's compress configuration (no mscale keys: HF's defaults
    1 and 0), 1 on DeepSeek-V3 (mscale = mscale_all_dim = 1) and on plain tables; the table without the declared
    factor would be outside the model (the verdicts above hold with it)."""
    factors = {v.case.name: v.attention_factor for v in verdicts(name) if not v.refused}
    assert all(factors[n] == ATLAS_FACTOR for n in ("v4-compress/start", "v4-compress/far"))
    assert all(factors[n] == 1.0 for n in factors if n.startswith(("v3/", "v4-main/")))
    compress = [v for v in verdicts(name) if v.case.name.startswith("v4-compress/")]
    assert all(v.shares["mscale-ratio"] == 1.0 and v.shares["mscale-factor-only"] == 1.0 for v in compress)
    undeclared = tables.TableBuilder("undeclared", builder(name).fn)
    assert all(v.outside > 0.9 * v.elements for v in tables.judge(undeclared, [v.case for v in compress]))


def test_other_builders_fold_no_attention_factor():
    for name in EXPECTED:
        if name.startswith(FOLDS_MSCALE):
            continue
        assert all(v.attention_factor == 1.0 for v in verdicts(name) if not v.refused), name


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
