"""The YaRN paths that DeepSeek-V3's own configuration never reaches, pinned bit for bit.

DeepSeek-V3 (d 64, theta 1e4, factor 40, beta 32/1, original 4096) takes one path through YaRN: a ramp
from pair 10 to 23, neither bound clamped, a factor above 1, a max_seq_len above the original length.
Each configuration below takes another path, and dsrope.rope_utils must give upstream's bits there too:
- a zero-width ramp (low == high), where upstream widens the ramp by 0.001, at either end of the table;
- ramp bounds clamped at the table's ends (low at 0, high at dim - 1), and clamped past each other
  (low > high), where upstream's one-sided clamps give a ramp of all ones or all zeros;
- factor 1, where upstream still blends in FP32 (and a bit moves: it is not the plain table);
- max_seq_len equal to or below original_max_position_embeddings: no YaRN correction at all;
- yarn_get_mscale at the mscale values published configurations use (0.707, 1.0, and 0, the default
  mscale_all_dim of DeepSeek-V2's YaRN class) and at scale 1, as well as in the attention-scale ratio.

The oracle here is this module's own transcription of upstream (DeepSeek-V3's inference/model.py
precompute_freqs_cis, and yarn_get_mscale from its Hugging Face modeling_deepseek.py), written
independently of dsrope's code and of reference/'s transcription; every comparison is on the FP32 (or
FP64) bit patterns, so -0.0 against 0.0 or one ulp anywhere fails. Each configuration also asserts
the path it reaches (the transcription's ramp bounds) and, where one exists, that a plausible
fault would change the bits, so the case is not vacuous.
Mutants that only these tests kill (dsrope_dev.mutation.catalog_rope_utils, the YaRN paths' block):
utils.yarn_skipped_at_factor_1, utils.yarn_applied_below_original, utils.yarn_low_clamped_at_top,
utils.yarn_high_clamped_at_zero, utils.mscale_zero_as_default.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch
from dsrope_reference.floats import bits
from hypothesis import given
from hypothesis import strategies as st

from dsrope.rope_utils import precompute_freqs_cis, yarn_get_mscale

# --- the transcription ----------------------------------------------------------------------------
# The upstream op order, step by step, on the same dtypes: FP32 tensors, Python floats for the
# scalars (each rounds to FP32 when it meets a tensor). Nothing here calls dsrope.


def upstream_ramp_bounds(dim: int, base: float, beta_fast: float, beta_slow: float, original: int):
    """Upstream's find_correction_range: floor of the beta_fast channel, ceil of the beta_slow one, then
    ONE-sided clamps (low not below 0, high not above dim - 1). The bounds may end up crossed."""

    def correction_dim(rotations):  # upstream's find_correction_dim, same expression, FP64
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(correction_dim(beta_fast))
    high = math.ceil(correction_dim(beta_slow))
    return max(low, 0), min(high, dim - 1)


def upstream_ramp(low, high, n: int) -> torch.Tensor:
    """Upstream's linear_ramp_factor: a zero-width ramp is widened by 0.001 first."""
    if low == high:
        high = high + 0.001
    return torch.clamp((torch.arange(n, dtype=torch.float32) - low) / (high - low), 0, 1)


def upstream_frequencies(dim: int, seqlen: int, base: float, scaling: dict | None) -> torch.Tensor:
    """Upstream's precompute_freqs_cis up to the inverse frequencies (before the outer product)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if scaling is not None and seqlen > scaling["original_max_position_embeddings"]:
        low, high = upstream_ramp_bounds(
            dim, base, scaling["beta_fast"], scaling["beta_slow"], scaling["original_max_position_embeddings"]
        )
        smooth = 1 - upstream_ramp(low, high, dim // 2)
        freqs = freqs / scaling["factor"] * (1 - smooth) + freqs * smooth
    return freqs


def upstream_mscale(scale=1, mscale=1) -> float:
    """Upstream's yarn_get_mscale: 1.0 at scale <= 1, else 0.1 * mscale * ln(scale) + 1.0 (FP64, in that
    order; there is no branch on mscale: mscale 0 gives 1.0 through the formula)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


# --- configurations ------------------------------------------------------------------------------


def scaling(factor, original, beta_fast=32, beta_slow=1):
    return dict(
        type="yarn",
        factor=factor,
        beta_fast=beta_fast,
        beta_slow=beta_slow,
        mscale=1.0,
        mscale_all_dim=1.0,
        original_max_position_embeddings=original,
    )


EDGES = {
    # name: (qk_rope_head_dim, max_seq_len, rope_theta, rope_scaling, upstream's (low, high) or None
    #        when YaRN does not apply)
    "zero_width_ramp_at_0": (8, 64, 1e4, scaling(4, 4), (0, 0)),  # raw -2 / 0: step after pair 0
    "zero_width_ramp_at_top": (64, 3_600_000, 100.0, scaling(40, 1_800_000), (63, 63)),  # raw 63.2 / 80
    "low_clamped_at_0": (64, 1024, 1e4, scaling(4, 128), (0, 11)),  # raw low -2
    "high_clamped_at_dim_minus_1": (64, 32768, 50.0, scaling(8, 4096, beta_slow=0.05), (24, 63)),  # raw high 78
    "bounds_crossed_at_top": (64, 1 << 23, 100.0, scaling(40, 1 << 22), (69, 63)),  # every pair / factor
    "bounds_crossed_at_0": (64, 64, 1e4, scaling(40, 4), (0, -1)),  # every pair keeps its frequency
    "factor_1": (64, 163840, 1e4, scaling(1, 4096), (10, 23)),  # the V3 ramp, factor 1: pair 13 moves
    "factor_1_low_clamped": (64, 1024, 1e4, scaling(1, 128), (0, 11)),
    "seqlen_equals_original": (64, 4096, 1e4, scaling(40, 4096), None),
    "seqlen_below_original": (64, 2048, 1e4, scaling(40, 4096), None),
    "seqlen_1_below_original": (64, 1, 1e4, scaling(40, 4096), None),
}


def bit_list(t: torch.Tensor) -> list[int]:
    assert t.dtype == torch.float32, t.dtype
    return bits(t).tolist()


def float_bits(v: float) -> int:
    return struct.unpack("<q", struct.pack("<d", v))[0]


@pytest.mark.parametrize("name", list(EDGES))
def test_yarn_edge_frequencies_equal_upstream(name):
    """dsrope's default frequencies are the transcription's, bit for bit, on each edge path."""
    dim, seqlen, theta, rope_scaling, bounds = EDGES[name]
    if bounds is not None:
        o = rope_scaling["original_max_position_embeddings"]
        assert seqlen > o
        assert upstream_ramp_bounds(dim, theta, rope_scaling["beta_fast"], rope_scaling["beta_slow"], o) == bounds
    expected = upstream_frequencies(dim, seqlen, theta, rope_scaling)
    got = precompute_freqs_cis(dim, seqlen, theta, rope_scaling)
    assert got.dtype == torch.float32 and got.shape == (dim // 2,)
    assert bit_list(got) == bit_list(expected)


def test_edge_cases_are_not_vacuous():
    """Each edge configuration tells its path from the neighbouring one: the bits a plausible fault
    would give differ from upstream's."""

    def freqs(name, **changes):
        dim, seqlen, theta, rope_scaling, _ = EDGES[name]
        return upstream_frequencies(dim, changes.get("seqlen", seqlen), theta, rope_scaling)

    def plain(name):
        dim, seqlen, theta, _, _ = EDGES[name]
        return upstream_frequencies(dim, seqlen, theta, None)

    # factor 1: the FP32 blend moves pair 13 (DeepSeek-V3's ramp) by one ulp; skipping it is a fault
    moved = [
        j
        for j, (a, b) in enumerate(zip(bit_list(freqs("factor_1")), bit_list(plain("factor_1")), strict=True))
        if a != b
    ]
    assert moved == [13], moved
    assert bit_list(freqs("factor_1_low_clamped")) != bit_list(plain("factor_1_low_clamped"))
    # crossed at the top: upstream divides EVERY pair by factor (a clamp of low to dim - 1 keeps them all)
    crossed = freqs("bounds_crossed_at_top")
    assert bit_list(crossed) == bit_list(plain("bounds_crossed_at_top") / 40)
    # crossed at 0: upstream keeps every frequency (a clamp of high to 0 would divide pairs 1.. by 40)
    assert bit_list(freqs("bounds_crossed_at_0")) == bit_list(plain("bounds_crossed_at_0"))
    # zero width at 0: pair 0 keeps its frequency, the others are divided (a step, not a NaN)
    step = freqs("zero_width_ramp_at_0")
    assert bit_list(step[:1]) == bit_list(plain("zero_width_ramp_at_0")[:1])
    assert bit_list(step[1:]) == bit_list(plain("zero_width_ramp_at_0")[1:] / 4)
    # zero width at the top: the whole table keeps its frequencies
    assert bit_list(freqs("zero_width_ramp_at_top")) == bit_list(plain("zero_width_ramp_at_top"))
    # at or below the original length no correction; one position more and it applies
    for name in ("seqlen_equals_original", "seqlen_below_original", "seqlen_1_below_original"):
        assert bit_list(freqs(name)) == bit_list(plain(name))
        assert bit_list(freqs(name, seqlen=4097)) != bit_list(plain(name))


# mscale values of published configurations: DeepSeek-V2 / V2-Lite 0.707, DeepSeek-V3 and its
# successors 1.0, and 0 (DeepSeek-V2's YaRN class default for mscale_all_dim); scales at, below and
# above 1, including DeepSeek-V3's factor 40.
MSCALES = (0.707, 1.0, 0, 0.0)
SCALES = (1, 1.0, 0.5, 4, 40, 40.0)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mscale", MSCALES)
def test_yarn_get_mscale_equals_upstream(scale, mscale):
    """yarn_get_mscale is the transcription's FP64 value bit for bit (0.0 and 1 as well as 0.707)."""
    got = yarn_get_mscale(scale, mscale)
    expected = upstream_mscale(scale, mscale)
    assert isinstance(got, float)
    assert float_bits(got) == float_bits(expected), (got.hex(), expected.hex())
    if mscale == 0 or scale <= 1:
        assert got == 1.0


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mscale_all_dim", MSCALES)
@pytest.mark.parametrize("mscale", MSCALES)
def test_attention_scale_ratio_equals_upstream(scale, mscale, mscale_all_dim):
    """The attention scale the DeepSeek YaRN embedding uses, mscale(s, mscale) / mscale(s, mscale_all_dim),
    bit for bit (DeepSeek-V3: 1.0; mscale_all_dim 0 leaves the numerator alone)."""
    got = yarn_get_mscale(scale, mscale) / yarn_get_mscale(scale, mscale_all_dim)
    expected = upstream_mscale(scale, mscale) / upstream_mscale(scale, mscale_all_dim)
    assert float_bits(got) == float_bits(expected), (got.hex(), expected.hex())
    if mscale_all_dim == 0:
        assert float_bits(got) == float_bits(upstream_mscale(scale, mscale))


def test_mscale_zero_differs_from_default():
    """mscale 0 is not 'no mscale given': at DeepSeek-V3's factor 40 the default mscale 1 gives ~1.369."""
    assert yarn_get_mscale(40, 0) == 1.0
    assert yarn_get_mscale(40) == upstream_mscale(40, 1) > 1.36


@given(
    scale=st.floats(0.0, 1e6, exclude_min=True) | st.integers(1, 10**6),
    mscale=st.floats(-4.0, 4.0, allow_nan=False) | st.sampled_from(MSCALES),
    mscale_all_dim=st.floats(-4.0, 4.0, allow_nan=False) | st.sampled_from(MSCALES),
)
def test_mscale_and_attention_scale_ratio_equal_upstream_over_a_drawn_range(scale, mscale, mscale_all_dim):
    """The fixed grid above, over any scale in (0, 1e6] (floats and ints; 0 is refused) and any mscale in [-4, 4]: the
    transcription's FP64 value bit for bit, and the attention-scale ratio where its denominator is not 0."""
    got = yarn_get_mscale(scale, mscale)
    assert float_bits(got) == float_bits(upstream_mscale(scale, mscale)), (scale, mscale, got)
    denominator = upstream_mscale(scale, mscale_all_dim)
    if denominator != 0:
        ratio = got / yarn_get_mscale(scale, mscale_all_dim)
        assert float_bits(ratio) == float_bits(upstream_mscale(scale, mscale) / denominator)
