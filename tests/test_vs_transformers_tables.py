"""DeepSeek-V3 tables against transformers' (the table half of the differential checks): its YaRN
inverse frequencies and attention factor (modeling_rope_utils.ROPE_INIT_FUNCTIONS["yarn"]) and its
DeepseekV3RotaryEmbedding cos/sin, against dsrope.rope_utils and the mpmath oracle.

transformers is another transcription of the same FP32 computation, with two differences in the
bits. (1) The interpolated frequency: transformers computes fl(1 / fl(factor * p)), DeepSeek's code
fl(fl(1 / p) / factor) (p = fl(theta ** (2j / d))); for a power-of-two factor both are exact in the
factor and agree, otherwise they differ by one ulp on some channels with a nonzero ramp. (2) cos and
sin: transformers takes torch.cos / torch.sin (torch's vectorized FP32 ones), DeepSeek's code
torch.polar (the C library's cosf/sinf). Where the bits differ, DeepSeek's FP32 computation decides
the table (dsrope's default equals it bit for bit: tests/test_rope_utils.py), and the tests here
state exactly what differs (which entries, by how many ulp), so they fail when that changes. The
mpmath oracle bounds both: the same per-entry frequency bound (reference.fp32_frequency_bounds: the
two orders round as often) and 1 ulp for cos/sin of each one's own FP32 angle; transformers'
interpolated frequencies happen to be closer to the exact values (DeepSeek-V3 pair 29: 0.24 vs
1.52 * 2**-24), yet the trained table is DeepSeek's.
Each test fails on a mutant of dsrope's side (tools/mutants.py): utils.yarn_interpolation_as_transformers,
utils.mscale_ignored, utils.angle_in_fp64.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference import rope_utils as ref
from dsrope_reference.floats import ordered

from dsrope.rope_utils import freqs_cis_from_position_ids, precompute_freqs_cis, yarn_get_mscale
from dsrope_gate.inputs import gen
from tests.test_rope_utils import V3_MAX_SEQ, V3_SCALING

transformers = pytest.importorskip(
    "transformers",
    reason="transformers (the test extra, pinned 5.17.0) is not installed: the differential tests against it "
    "are skipped; the rest of the CPU suite does not need it",
)
from transformers import DeepseekV3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding  # noqa: E402

# DeepSeek-V3's rope parameters as transformers takes them (rope_theta inside, no "type")
V3_ROPE = {k: v for k, v in V3_SCALING.items() if k != "type"} | {"rope_theta": 10000.0}
CASES = {
    # name: (qk_rope_head_dim, max_position_embeddings, rope parameters, {pair: transformers' bits
    #        minus DeepSeek's, in ulp} where the inverse frequencies differ)
    "deepseek_v3": (64, V3_MAX_SEQ, V3_ROPE, {23: -1, 24: -1, 29: -1, 31: -1}),
    "mscale_0.707": (64, V3_MAX_SEQ, dict(V3_ROPE, mscale=0.707), {23: -1, 24: -1, 29: -1, 31: -1}),
    "factor_4": (64, 512, dict(V3_ROPE, factor=4.0, original_max_position_embeddings=128), {}),
    "d128_theta_1e6_factor_10_no_mscale": (
        128,
        81920,
        dict(rope_theta=1e6, factor=10.0, beta_fast=32, beta_slow=1, original_max_position_embeddings=8192),
        {31: -1, 32: -1, 34: -1, 35: 1, 37: 1, 39: -1, 42: -1, 44: -1, 45: -1, 46: -1}
        | {48: 1, 51: 1, 53: 1, 54: -1, 56: -1, 59: -1},
    ),
}


def config(name: str) -> DeepseekV3Config:
    dim, max_positions, rope, _ = CASES[name]
    return DeepseekV3Config(
        qk_rope_head_dim=dim, max_position_embeddings=max_positions, rope_parameters=dict(rope_type="yarn", **rope)
    )


def ours(name: str) -> torch.Tensor:
    dim, max_positions, rope, _ = CASES[name]
    return precompute_freqs_cis(dim, max_positions, rope["rope_theta"], rope)


@pytest.mark.parametrize("name", list(CASES))
def test_yarn_frequencies_vs_transformers(name):
    """transformers' YaRN inverse frequencies differ from DeepSeek's FP32 ones (dsrope's default)
    exactly on the listed pairs, by the listed ulps; both lie within the mpmath bound."""
    dim, max_positions, rope, differences = CASES[name]
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](config(name), "cpu")
    mine = ours(name)
    assert theirs.dtype == torch.float32 and theirs.shape == mine.shape
    steps = ordered(theirs) - ordered(mine)
    assert {j: int(steps[j]) for j in steps.nonzero().flatten().tolist()} == differences
    model = ref.frequencies(dim, max_positions, rope["rope_theta"], rope)
    assert model.judge(mine).violations == 0, model.judge(mine)
    assert model.judge(theirs).violations == 0, model.judge(theirs)


@pytest.mark.parametrize("name", list(CASES))
def test_attention_factor_vs_transformers(name):
    """transformers' attention factor (cos and sin are scaled by it) is yarn_get_mscale(factor, mscale)
    / yarn_get_mscale(factor, mscale_all_dim) with both given, yarn_get_mscale(factor) otherwise, bit
    for bit (the same FP64 expression), and within 2**-50 relative of mpmath. DeepSeek-V3: 1.0."""
    _, _, rope, _ = CASES[name]
    _, factor = ROPE_INIT_FUNCTIONS["yarn"](config(name), "cpu")
    if "mscale" in rope and "mscale_all_dim" in rope:
        expected = yarn_get_mscale(rope["factor"], rope["mscale"]) / yarn_get_mscale(
            rope["factor"], rope["mscale_all_dim"]
        )
        exact = ref.yarn_mscale(rope["factor"], rope["mscale"]) / ref.yarn_mscale(
            rope["factor"], rope["mscale_all_dim"]
        )
    else:
        expected, exact = yarn_get_mscale(rope["factor"]), ref.yarn_mscale(rope["factor"], 1)
    assert factor == expected, (factor, expected)
    assert abs(factor - exact) <= 2.0**-50 * exact, (factor, float(exact))
    if name == "deepseek_v3":
        assert factor == 1.0


def test_rotary_table_vs_transformers():
    """DeepseekV3RotaryEmbedding's cos/sin [1, N, 64] (both halves pair j's, times the attention
    factor 1.0) at positions up to 163839 against dsrope's default complex table, both on CPU: on
    the 28 pairs whose frequency bits agree, the angles agree and cos/sin differ by at most one ulp
    (torch.cos vs torch.polar: both within 1 ulp of the same exact value); on all 32 pairs each
    side lies within 1 ulp of mpmath's cos/sin of its own FP32 angle."""
    name = "deepseek_v3"
    freqs = ours(name)
    embedding = DeepseekV3RotaryEmbedding(config(name))
    positions = torch.randint(0, V3_MAX_SEQ, (1, 96), generator=gen(50))
    positions[0, :3] = torch.tensor([0, 1, V3_MAX_SEQ - 1])
    cos, sin = embedding(torch.zeros(1, 96, 64), positions)
    assert torch.equal(cos[..., :32], cos[..., 32:]) and torch.equal(sin[..., :32], sin[..., 32:])
    cos, sin = cos[0, :, :32], sin[0, :, :32]
    table = freqs_cis_from_position_ids(positions, freqs)[0]
    agree = embedding.inv_freq == freqs
    assert agree.sum() == 28
    for theirs, mine in ((cos, table.real), (sin, table.imag)):
        assert (ordered(theirs) - ordered(mine))[:, agree].abs().max() <= 1
    their_cos, their_sin = ref.rotation_table(positions[0], embedding.inv_freq, ulps=1)
    my_cos, my_sin = ref.rotation_table(positions[0], freqs, ulps=1)
    for what, model, values in (
        ("transformers cos", their_cos, cos),
        ("transformers sin", their_sin, sin),
        ("dsrope cos", my_cos, table.real),
        ("dsrope sin", my_sin, table.imag),
    ):
        check = model.judge(values)
        assert check.violations == 0, f"{what}: {check}"
