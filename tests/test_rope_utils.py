"""dsrope.rope_utils (DeepSeek-V3 rope utilities) against reference/rope_utils.py.

Error models (that module's docstring):
- tables, default (the trained table): bit for bit upstream's FP32 op sequence (reference's
  transcription of DeepSeek's inference/model.py and Automodel's deepseek_v3/rope_utils.py), and
  against mpmath: each inverse frequency within its own derived relative bound (measured max
  2.13 * 2**-24 for DeepSeek-V3, bound there 6.9 * 2**-24), cos and sin within COS_SIN_ULPS ulp
  (measured max 0.5604 ulp on CPU over the whole DeepSeek-V3 table).
- tables, fp64=True: every FP32 entry t within TABLE_REL = 2**-24 + 2**-40 relative of the mpmath
  value v: one rounding to FP32 of a value computed with FP64-level accuracy.
  The FP32 angle fl32(fl32(p) * f) is part of both definitions and reproduced exactly by the reference.
- rotations: reference/rope.py's per-element interval (an FP32 computation of a*c - b*s, any
  order, FMA or not, one rounding into x's dtype); zero elements outside it, in bf16 >= 99% equal
  to the correctly rounded value bit for bit.
- table gradients: FP64 autograd of the exact rotation, FP32 error <= gamma(2*heads + 2) * sum|products|.
On CPU the kernel path runs in Triton's interpreter (with the project's round-to-nearest-even fix).
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference import rope_utils as ref
from dsrope_reference.rope import Model
from hypothesis import given
from hypothesis import strategies as st

import dsrope.checks
import dsrope.rope
from dsrope.rope_utils import (
    apply_rotary_emb,
    apply_rotary_emb_half_split,
    apply_rotary_emb_qk,
    freqs_cis_from_position_ids,
    precompute_freqs_cis,
    yarn_get_mscale,
)
from dsrope_gate.inputs import DEVICE, DTYPES, ON_GPU, gen, values
from dsrope_gate.layouts import Layout, layout_of, materialize

V3_SCALING = dict(
    type="yarn",
    factor=40,
    beta_fast=32,
    beta_slow=1,
    mscale=1.0,
    mscale_all_dim=1.0,
    original_max_position_embeddings=4096,
)
V3_MAX_SEQ = 163840
# The trained table's cos and sin are the device's FP32 cosf/sinf of the exact FP32 angle: glibc's on
# CPU (documented bound 1 ulp), CUDA's on a GPU (2 ulp, the CUDA programming guide).
COS_SIN_ULPS = 2 if ON_GPU else 1


def v3_freqs(dim: int) -> torch.Tensor:
    return precompute_freqs_cis(dim, V3_MAX_SEQ, 10000.0, V3_SCALING)


def rotation_table(tokens, dim: int, seed: int, trainable: bool = False) -> torch.Tensor:
    """Complex table for random positions in [1, 2**16): no row is the identity rotation."""
    positions = torch.randint(1, 1 << 16, tuple(tokens), generator=gen(seed)).to(DEVICE)
    qkv_format = "bshd" if len(tokens) == 2 else "thd"
    table = freqs_cis_from_position_ids(positions, v3_freqs(dim), qkv_format)
    return table.requires_grad_() if trainable else table


def x_values(shape, dtype, seed: int) -> torch.Tensor:
    return values(shape, dtype, seed).to(DEVICE)


def assert_within(check, what: str) -> None:
    assert check.violations == 0, f"{what}: {check}"


@pytest.fixture
def launches(monkeypatch):
    """Counts launches of the Triton rotation kernel."""
    calls = []
    real = dsrope.rope._launch

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(dsrope.rope, "_launch", counting)
    return calls


# --- tables against mpmath ---------------------------------------------------------------------


@pytest.mark.parametrize("scale,mscale", [(1, 1), (0.5, 1), (40, 1), (40, 0.707), (4.0, 1.0), (1.5, 2)])
def test_yarn_get_mscale(scale, mscale):
    """FP64 arithmetic on a few terms: within 2**-50 relative of the mpmath value."""
    got = yarn_get_mscale(scale, mscale)
    exact = ref.yarn_mscale(scale, mscale)
    assert isinstance(got, float)
    assert abs(got - exact) <= 2.0**-50 * abs(exact), (got, float(exact))


@pytest.mark.parametrize("scale", [40, 4.0, 1.5, 1, 0.5])
@pytest.mark.parametrize("mscale", [0.707, 1.0, 0])
def test_yarn_get_mscale_equals_upstream(scale, mscale):
    """Bit for bit upstream's yarn_get_mscale for the mscale values published configurations use (0.707,
    1.0) and 0, above, at and below scale 1 (mscale 0 gives exactly 1.0: mutant utils.mscale_zero_as_default)."""
    assert yarn_get_mscale(scale, mscale) == ref.upstream_mscale(scale, mscale)


FREQUENCY_CASES = {
    # name: (qk_rope_head_dim, max_seq_len, rope_theta, rope_scaling)
    "v3_yarn": (64, V3_MAX_SEQ, 10000.0, V3_SCALING),
    "v3_within_original": (64, 4096, 10000.0, V3_SCALING),  # max_seq_len == original: plain
    "plain_none": (128, 8192, 1e6, None),
    "plain_partial_keys": (64, V3_MAX_SEQ, 10000.0, {"type": "linear", "factor": 40}),
    "plain_tiny": (6, 100, 500.0, None),
    "yarn_low_clamped_to_0": (
        64,
        1024,
        10000.0,
        dict(V3_SCALING, factor=4, original_max_position_embeddings=128),
    ),
    "yarn_high_clamped": (64, 32768, 50.0, dict(V3_SCALING, factor=8, beta_slow=0.05)),
    # low == high == 0: the published +0.001 gives a step ramp (only pair 0 keeps its frequency)
    "yarn_zero_width_ramp": (8, 64, 10000.0, dict(V3_SCALING, factor=4, original_max_position_embeddings=4)),
    # paths the published configurations never reach, each pinned bit for bit to upstream below
    # (and each failed no test before: mutants utils.yarn_skipped_at_factor_1, utils.yarn_below_original_length)
    "yarn_factor_1": (64, V3_MAX_SEQ, 10000.0, dict(V3_SCALING, factor=1)),  # the blend still runs in FP32
    "v3_below_original": (64, 2048, 10000.0, V3_SCALING),  # max_seq_len < original: plain frequencies
    # both ramp ends clamped at once (low below 0, high past dim - 1)
    "yarn_both_ends_clamped": (
        64,
        4096,
        10000.0,
        dict(V3_SCALING, beta_fast=1024, beta_slow=1e-6, original_max_position_embeddings=1024),
    ),
}


@pytest.mark.parametrize("fp64", [False, True], ids=["trained", "fp64"])
@pytest.mark.parametrize("name", list(FREQUENCY_CASES))
def test_inverse_frequencies_against_mpmath(name, fp64):
    """Trained (FP32) table: each entry within its derived bound (reference.fp32_frequency_bounds;
    measured on CPU: DeepSeek-V3 max 2.13 * 2**-24 relative at pair 19, plain theta 1e6 d 128 max
    1.38 * 2**-24). fp64: within TABLE_REL, and >= 99% correctly rounded."""
    dim, max_seq_len, theta, scaling = FREQUENCY_CASES[name]
    freqs = precompute_freqs_cis(dim, max_seq_len, theta, scaling, fp64=fp64)
    assert freqs.dtype == torch.float32 and freqs.shape == (dim // 2,)
    check = ref.frequencies(dim, max_seq_len, theta, scaling, fp64=fp64).judge(freqs)
    assert_within(check, name)
    if fp64:
        assert check.exact_fraction >= 0.99, f"{name}: {check}"


def test_fp64_model_tells_the_tables_apart():
    """The trained DeepSeek-V3 frequencies fall outside the fp64 model (TABLE_REL; 6 of 32 entries on
    CPU with torch 2.13): the two models are not one model stated twice, and the tables differ."""
    freqs = v3_freqs(64)
    check = ref.frequencies(64, V3_MAX_SEQ, 10000.0, V3_SCALING, fp64=True).judge(freqs)
    assert check.violations >= 1, check
    assert not torch.equal(freqs, precompute_freqs_cis(64, V3_MAX_SEQ, 10000.0, V3_SCALING, fp64=True))


# --- the trained table: upstream's FP32 computation, bit for bit -----------------------------------

# name: (FREQUENCY_CASES entry): DeepSeek-V3, a plain table with another theta and width, a YaRN
# ramp clamped at 0 with factor 4
UPSTREAM_TABLES = ("v3_yarn", "plain_none", "yarn_low_clamped_to_0")
LARGE_POSITIONS = [(1 << 24) - 1, (1 << 24) + 1, (1 << 31) - 1]  # rounded to FP32 before the product


@pytest.mark.parametrize("name", list(FREQUENCY_CASES))
def test_frequencies_equal_upstream(name):
    """The default frequencies are upstream's FP32 frequencies bit for bit: against reference/'s
    transcription of upstream's op sequence (a second, independent writing of it, not dsrope's
    code). A misreading shared by both would pass here; transformers' own transcription
    (tests/test_vs_transformers_tables.py) and the mpmath bounds are the independent anchors."""
    dim, max_seq_len, theta, scaling = FREQUENCY_CASES[name]
    freqs = precompute_freqs_cis(dim, max_seq_len, theta, scaling)
    assert torch.equal(freqs, ref.upstream_frequencies(dim, max_seq_len, theta, scaling))


@pytest.mark.parametrize("name", UPSTREAM_TABLES)
def test_tables_equal_upstream(name):
    """Complex (bshd; thd at every fifth) and fused tables at every position 0 .. max_seq_len - 1,
    at random positions of a batch of two and past 2**24: upstream's torch.polar of the FP32 angle bit for
    bit (on CPU upstream's own table; on CUDA with the device's FP32 cos and sin); the fused table's
    cos and sin are the complex table's real and imaginary parts. As above, against reference/'s
    transcription; on CUDA the frequencies are the CPU ones on both sides."""
    dim, max_seq_len, theta, scaling = FREQUENCY_CASES[name]
    freqs = precompute_freqs_cis(dim, max_seq_len, theta, scaling)
    every = torch.arange(max_seq_len, device=DEVICE)[None]
    upstream = ref.upstream_table(every, freqs)
    assert torch.equal(freqs_cis_from_position_ids(every, freqs), upstream)
    assert torch.equal(freqs_cis_from_position_ids(every[0, ::5], freqs, "thd"), upstream[0, ::5])
    fused = freqs_cis_from_position_ids(every, freqs, for_fused_rope=True)
    assert torch.equal(fused[0], torch.cat((upstream[0].real, upstream[0].real), -1))
    assert torch.equal(fused[1], torch.cat((upstream[0].imag, upstream[0].imag), -1))
    picked = torch.randint(0, max_seq_len, (2, 61), generator=gen(40))
    picked[1, :3] = torch.tensor(LARGE_POSITIONS)
    picked = picked.to(DEVICE)
    assert torch.equal(freqs_cis_from_position_ids(picked, freqs), ref.upstream_table(picked, freqs))


def test_yarn_ramp_shape():
    """DeepSeek-V3 (d=64, beta_fast=32, beta_slow=1, original 4096): ramp from pair 10 to 23;
    below it the plain frequency, above it the plain frequency / 40 (within one FP32 rounding)."""
    low, high = ref.yarn_ramp_bounds(64, 10000.0, V3_SCALING)
    assert (low, high) == (10, 23)
    yarn = v3_freqs(64).double()
    plain = precompute_freqs_cis(64, V3_MAX_SEQ, 10000.0, None).double()
    assert torch.equal(yarn[:11], plain[:11])
    ratio = yarn[23:] / plain[23:]
    assert ((ratio - 1 / 40).abs() <= 2**-22 / 40).all(), ratio
    assert ((yarn[11:23] < plain[11:23]) & (yarn[11:23] > plain[11:23] / 40)).all()


@pytest.mark.parametrize("fp64", [False, True], ids=["trained", "fp64"])
def test_rotation_table_against_mpmath(fp64):
    """Complex rows [B, S, d/2] and [T, d/2]: cos, sin of the FP32 angle. Trained: within
    COS_SIN_ULPS ulp (measured on CPU over the whole DeepSeek-V3 table: max 0.5604 ulp, for cos at
    position 31602 pair 7 and for sin at position 75736 pair 31, both among the positions here);
    fp64: within TABLE_REL."""
    freqs = v3_freqs(64)
    positions = torch.randint(0, 1 << 20, (2, 8), generator=gen(1))
    positions[0, :5] = torch.tensor([0, 1, (1 << 24) - 1, 31602, 75736])
    for qkv_format, pos in (("bshd", positions), ("thd", positions[1])):
        table = freqs_cis_from_position_ids(pos.to(DEVICE), freqs, qkv_format, fp64=fp64)
        assert table.dtype == torch.complex64 and table.shape == (*pos.shape, 32), table.shape
        cos, sin = ref.rotation_table(pos, freqs, None if fp64 else COS_SIN_ULPS)
        assert_within(cos.judge(table.real), f"{qkv_format} cos")
        assert_within(sin.judge(table.imag), f"{qkv_format} sin")


@pytest.mark.parametrize("fp64", [False, True], ids=["trained", "fp64"])
@pytest.mark.parametrize("qkv_format,cp_size", [("bshd", 1), ("bshd", 2), ("thd", 1), ("thd", 3)])
def test_fused_table_format(qkv_format, cp_size, fp64):
    """float32 [2, P, d], P = position_ids.shape[-1] * cp_size: row p is position p, cos then sin,
    both halves of a row equal, bit for bit the complex table's real and imaginary parts at
    positions 0 .. P-1; only the shape of position_ids matters."""
    freqs = v3_freqs(16)
    shape = (2, 6) if qkv_format == "bshd" else (6,)
    ids = torch.randint(0, 1000, shape, generator=gen(2)).to(DEVICE)
    fused = freqs_cis_from_position_ids(ids, freqs, qkv_format, for_fused_rope=True, cp_size=cp_size, fp64=fp64)
    positions = 6 * cp_size
    assert fused.dtype == torch.float32 and fused.shape == (2, positions, 16), fused.shape
    assert torch.equal(fused[:, :, :8], fused[:, :, 8:])
    rows = freqs_cis_from_position_ids(torch.arange(positions, device=DEVICE), freqs, "thd", fp64=fp64)
    assert torch.equal(fused[0, :, :8], rows.real) and torch.equal(fused[1, :, :8], rows.imag)
    cos, sin = ref.rotation_table(torch.arange(positions), freqs, None if fp64 else COS_SIN_ULPS)
    assert_within(cos.judge(fused[0, :, :8]), "fused cos")
    assert_within(sin.judge(fused[1, :, :8]), "fused sin")
    other = freqs_cis_from_position_ids(ids + 7, freqs, qkv_format, for_fused_rope=True, cp_size=cp_size, fp64=fp64)
    assert torch.equal(fused, other)


# --- both pairings against the reference -------------------------------------------------------


@pytest.mark.parametrize("trainable", [False, True], ids=["kernel", "eager"])
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interleaved_against_reference(dtype, qkv_format, trainable):
    shape = (2, 6, 3, 16) if qkv_format == "bshd" else (10, 3, 16)
    x = x_values(shape, dtype, seed=3)
    table = rotation_table(shape[:-2], 16, seed=4, trainable=trainable)
    out = apply_rotary_emb(x, table, qkv_format)
    assert out.shape == x.shape and out.dtype == dtype
    assert_within(ref.interleaved(x, table).judge(out), f"{qkv_format} {dtype}")


HALF_SPLIT_SHAPES = {
    "bshd": (2, 6, 3, 16),
    "bshd_no_heads": (2, 6, 16),
    "thd": (10, 3, 16),
    "thd_no_heads": (10, 16),
}


@pytest.mark.parametrize("name", list(HALF_SPLIT_SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_half_split_against_reference(dtype, name):
    shape = HALF_SPLIT_SHAPES[name]
    qkv_format = name.split("_")[0]
    tokens = shape[:2] if qkv_format == "bshd" else shape[:1]
    x = x_values(shape, dtype, seed=5)
    table = rotation_table(tokens, 16, seed=6)
    out = apply_rotary_emb_half_split(x, table, qkv_format)
    assert out.shape == x.shape and out.dtype == dtype
    assert_within(ref.half_split(x, table).judge(out), f"{name} {dtype}")


@pytest.mark.parametrize("function", ["interleaved_kernel", "interleaved_eager", "half_split"])
def test_bf16_exact_rate(function):
    """DeepSeek-V3 rope width d=64, 8 heads: zero violations and >= 99% bit-exact in bf16."""
    x = x_values((2, 16, 8, 64), torch.bfloat16, seed=7)
    table = rotation_table((2, 16), 64, seed=8, trainable=function == "interleaved_eager")
    if function == "half_split":
        check = ref.half_split(x, table).judge(apply_rotary_emb_half_split(x, table))
    else:
        check = ref.interleaved(x, table).judge(apply_rotary_emb(x, table))
    assert_within(check, function)
    assert check.exact_fraction >= 0.99, f"{function}: {check}"


@pytest.mark.parametrize("trainable", [False, True], ids=["kernel", "eager"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_pairings_differ_and_each_function_matches_only_its_own(dtype, trainable):
    """Same x, same table: the two pairings' references differ on most elements, and each
    function's output violates the other pairing's model on most elements (>= 90%)."""
    x = x_values((2, 8, 4, 64), dtype, seed=9)
    table = rotation_table((2, 8), 64, seed=10, trainable=trainable)
    interleaved, half_split = ref.interleaved(x, table), ref.half_split(x, table)
    differ = (interleaved.ref != half_split.ref).double().mean().item()
    assert differ >= 0.9, f"references differ on {differ:.2%} only"

    out_interleaved = apply_rotary_emb(x, table)
    out_half_split = apply_rotary_emb_half_split(x, table)
    assert_within(interleaved.judge(out_interleaved), "apply_rotary_emb vs its own pairing")
    assert_within(half_split.judge(out_half_split), "apply_rotary_emb_half_split vs its own pairing")
    wrong = half_split.judge(out_interleaved)
    assert wrong.violations >= 0.9 * wrong.checked, f"apply_rotary_emb passes the half-split model: {wrong}"
    wrong = interleaved.judge(out_half_split)
    assert wrong.violations >= 0.9 * wrong.checked, f"half_split passes the interleaved model: {wrong}"


# --- formats ------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainable", [False, True], ids=["kernel", "eager"])
def test_thd_matches_bshd(trainable):
    """thd [T, H, d] with [T, d/2] is bshd with a batch of one, bit for bit (both pairings)."""
    x = x_values((9, 3, 16), torch.bfloat16, seed=11)
    table = rotation_table((9,), 16, seed=12, trainable=trainable)
    thd = apply_rotary_emb(x, table, "thd")
    bshd = apply_rotary_emb(x[None], table[None], "bshd")[0]
    assert torch.equal(thd, bshd)
    for xs in (x, x[:, 0]):  # with and without a head dim
        thd = apply_rotary_emb_half_split(xs, table, "thd")
        assert torch.equal(thd, apply_rotary_emb_half_split(xs[None], table[None], "bshd")[0])


@pytest.mark.parametrize("unsqueeze_dim", [2, -2])
@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
def test_shared_key_unsqueeze_dim(qkv_format, unsqueeze_dim):
    """A shared key without a head dim ([B, S, d] / [T, d]) rotates as a key with one head."""
    shape = (2, 7, 16) if qkv_format == "bshd" else (7, 16)
    k = x_values(shape, torch.bfloat16, seed=13)
    table = rotation_table(shape[:-1], 16, seed=14)
    out = apply_rotary_emb(k, table, qkv_format, unsqueeze_dim=unsqueeze_dim)
    assert out.shape == k.shape
    with_head = apply_rotary_emb(k.unsqueeze(-2), table, qkv_format)
    assert torch.equal(out, with_head.squeeze(-2))
    assert_within(ref.interleaved(k, table).judge(out), f"shared key {qkv_format}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_table_runs_kernel_and_agrees_with_eager(dtype, launches):
    """A table without grad goes through the Triton kernel, a trainable one through the eager
    FP32 complex product; both inside the model, and in bf16 they agree on >= 99%."""
    x = x_values((2, 8, 4, 32), dtype, seed=15)
    table = rotation_table((2, 8), 32, seed=16)
    fused = apply_rotary_emb(x, table)
    assert len(launches) == 1, launches
    eager = apply_rotary_emb(x, table.clone().requires_grad_())
    assert len(launches) == 1, "the trainable table must not go through the kernel"
    model = ref.interleaved(x, table)
    assert_within(model.judge(fused), "kernel")
    assert_within(model.judge(eager), "eager")
    agree = (fused == eager).double().mean().item()
    if dtype == torch.bfloat16:
        assert agree >= 0.99, f"kernel and eager agree on {agree:.2%}"


def test_kernel_needs_its_device(monkeypatch, launches):
    """Without the interpreter a CPU table is rotated eagerly; rope_fusion=True is refused."""
    monkeypatch.setattr(dsrope.checks, "INTERPRET", False)
    x = values((1, 4, 2, 8), torch.float32, seed=17)
    table = freqs_cis_from_position_ids(torch.arange(4)[None], v3_freqs(8))
    assert_within(ref.interleaved(x, table).judge(apply_rotary_emb(x, table)), "eager on CPU")
    assert launches == []
    fused = freqs_cis_from_position_ids(torch.arange(4)[None], v3_freqs(8), for_fused_rope=True)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        apply_rotary_emb_qk(x, x, fused)


LAYOUTS = {
    "permuted": Layout(order=(2, 0, 1, 3)),  # heads outermost
    "padded": Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3)),
    "stepped": Layout(step=(2, 1, 3, 1)),
    "channels_stepped_offset": Layout(order=(1, 0, 2, 3), step=(1, 1, 1, 2), offset=5),
    "channel_outer": Layout(order=(3, 0, 1, 2)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_strided_inputs(name):
    """x [B, S, H, d] with any strides (NaN in every gap), tables with a stride-0 batch and padded rows."""
    x = materialize(x_values((2, 5, 3, 16), torch.bfloat16, seed=18), LAYOUTS[name])
    wide = rotation_table((1, 5), 32, seed=19)[..., :8]  # rows of a wider table: row stride 32
    table = wide.expand(2, 5, 8)
    assert_within(ref.interleaved(x, table).judge(apply_rotary_emb(x, table)), f"{name} {layout_of(x)}")
    assert_within(ref.half_split(x, table).judge(apply_rotary_emb_half_split(x, table)), f"{name} {layout_of(x)}")


@pytest.mark.parametrize("trainable", [False, True], ids=["kernel", "eager"])
def test_nan_stays_in_its_pair(trainable):
    """A NaN turns both channels of its own pair into NaN and nothing else, in each pairing."""
    x = x_values((1, 3, 2, 8), torch.float32, seed=30)
    x[0, 1, 0, 2] = float("nan")
    table = rotation_table((1, 3), 8, seed=31, trainable=trainable)
    interleaved = torch.zeros(x.shape, dtype=torch.bool)
    interleaved[0, 1, 0, 2:4] = True  # pair 1 = channels (2, 3)
    half_split = torch.zeros(x.shape, dtype=torch.bool)
    half_split[0, 1, 0, [2, 6]] = True  # pair 2 = channels (2, 6)
    assert torch.equal(torch.isnan(apply_rotary_emb(x, table)).cpu(), interleaved)
    assert torch.equal(torch.isnan(apply_rotary_emb_half_split(x, table)).cpu(), half_split)


def test_empty_inputs():
    for shape in ((0, 3, 2, 8), (2, 0, 2, 8), (2, 3, 0, 8)):
        x = torch.empty(shape, dtype=torch.bfloat16, device=DEVICE)
        table = torch.ones(shape[:2] + (4,), dtype=torch.complex64, device=DEVICE)
        assert apply_rotary_emb(x, table).shape == shape
        assert apply_rotary_emb_half_split(x, table).shape == shape
    q = torch.empty((0, 2, 8), device=DEVICE)
    fused = freqs_cis_from_position_ids(torch.zeros(0, dtype=torch.long, device=DEVICE), v3_freqs(8), "thd", True)
    cu = torch.zeros(2, dtype=torch.int32)
    out_q, out_k = apply_rotary_emb_qk(q, q, fused, "thd", cu_seqlens=cu)
    assert out_q.shape == q.shape and out_k.shape == q.shape


# --- q and k: fused path, packed sequences, context parallelism ---------------------------------

QK_CASES = {
    # name: (format, global sequence lengths, cp_size, cp_rank, use cu_seqlens)
    "bshd": ("bshd", [6], 1, 0, False),
    "bshd_cp2_rank0": ("bshd", [8], 2, 0, False),
    "bshd_cp2_rank1": ("bshd", [8], 2, 1, False),
    "thd_one_sequence": ("thd", [7], 1, 0, False),
    "thd_packed": ("thd", [3, 5, 0, 4], 1, 0, True),
    "thd_packed_cp2_rank1": ("thd", [4, 8, 4], 2, 1, True),
    "thd_packed_cp3_rank2": ("thd", [6, 12], 3, 2, True),
}


@pytest.mark.parametrize("name", list(QK_CASES))
def test_qk_fused_equals_unfused(name, launches):
    """rope_fusion=True (fused table, positions from place / cu_seqlens / cp shard) equals
    rope_fusion=False (complex rows at the positions the reference derives), bit for bit, and
    both are inside the interleaved model; the trainable (eager) table too."""
    qkv_format, lengths, cp_size, cp_rank, packed = QK_CASES[name]
    positions = ref.shard_positions(lengths, cp_size, cp_rank)  # position of every local token
    local = positions.numel()
    batch = 2 if qkv_format == "bshd" else None
    lead = (batch, local) if batch else (local,)
    q = x_values((*lead, 4, 16), torch.bfloat16, seed=20)
    k = x_values((*lead, 1, 16), torch.bfloat16, seed=21)
    position_ids = (positions.expand(batch, local) if batch else positions).to(DEVICE)
    freqs = v3_freqs(16)
    complex_table = freqs_cis_from_position_ids(position_ids, freqs, qkv_format)
    fused_table = freqs_cis_from_position_ids(position_ids, freqs, qkv_format, True, cp_size)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32) if packed else None
    args = dict(format=qkv_format, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)

    fused_q, fused_k = apply_rotary_emb_qk(q, k, fused_table, rope_fusion=True, **args)
    assert len(launches) == 2
    plain_q, plain_k = apply_rotary_emb_qk(q, k, complex_table, rope_fusion=False, **args)
    eager_q, eager_k = apply_rotary_emb_qk(q, k, complex_table.clone().requires_grad_(), rope_fusion=False, **args)
    assert torch.equal(fused_q, plain_q) and torch.equal(fused_k, plain_k)
    for what, x, out in (
        ("q", q, fused_q),
        ("k", k, fused_k),
        ("eager q", q, eager_q),
        ("eager k", k, eager_k),
    ):
        assert_within(ref.interleaved(x, complex_table).judge(out), f"{name} {what}")
    if packed and cp_size == 1:  # positions restart: the first token of every sequence is not rotated
        starts = [s for s, n in zip(cu_seqlens[:-1].tolist(), lengths, strict=True) if n]
        assert torch.equal(fused_q[starts], q[starts]) and torch.equal(fused_k[starts], k[starts])


# --- gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pairing", ref.PAIRINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_trainable_table_gradient_against_fp64_autograd(dtype, pairing):
    function = apply_rotary_emb if pairing == "interleaved" else apply_rotary_emb_half_split
    x = x_values((2, 5, 3, 16), dtype, seed=22).requires_grad_()
    g = x_values((2, 5, 3, 16), dtype, seed=23)
    table = rotation_table((2, 5), 16, seed=24, trainable=True)
    dx, dtable = torch.autograd.grad(function(x, table), (x, table), g)
    d_cos, d_sin = ref.table_gradient(x, g, table, pairing)
    assert_within(d_cos.judge(dtable.real), f"{pairing} d/dcos")
    assert_within(d_sin.judge(dtable.imag), f"{pairing} d/dsin")
    # d out / d x is the rotation by the conjugate table
    assert_within(ref.rotation(g, table.detach().conj(), pairing).judge(dx), f"{pairing} dx")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_table_gradient_of_x(dtype, launches):
    """Through the kernel (table without grad), dx is the conjugate rotation of the upstream gradient,
    here with a stride-0 gradient (of .sum()) and a permuted one."""
    x = x_values((2, 5, 3, 16), dtype, seed=25).requires_grad_()
    table = rotation_table((2, 5), 16, seed=26)
    out = apply_rotary_emb(x, table)
    out.sum().backward()
    ones = torch.ones(x.shape, dtype=dtype)
    assert_within(ref.interleaved(ones, table.conj()).judge(x.grad), "grad of sum")
    g = materialize(x_values(x.shape, dtype, seed=27), LAYOUTS["permuted"])
    (dx,) = torch.autograd.grad(apply_rotary_emb(x, table), x, g)
    assert_within(ref.interleaved(g, table.conj()).judge(dx), f"grad {layout_of(g)}")
    assert len(launches) == 4  # two forwards, two backwards


# --- property: random shapes --------------------------------------------------------------------


@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 6),
    heads=st.integers(1, 4),
    pairs=st.integers(1, 12),
    qkv_format=st.sampled_from(["bshd", "thd"]),
    dtype=st.sampled_from(DTYPES),
    trainable=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(batch, seq, heads, pairs, qkv_format, dtype, trainable, seed):
    """Any pair count (not a power of two), heads, tokens: both pairings inside their models."""
    lead = (batch, seq) if qkv_format == "bshd" else (batch * seq,)
    x = x_values((*lead, heads, 2 * pairs), dtype, seed)
    table = rotation_table(lead, 2 * pairs, seed + 1, trainable)
    assert_within(ref.interleaved(x, table).judge(apply_rotary_emb(x, table, qkv_format)), "interleaved")
    out = apply_rotary_emb_half_split(x, table, qkv_format)
    assert_within(ref.half_split(x, table).judge(out), "half_split")


# --- refused inputs ---------------------------------------------------------------------------------


def refused_cases():
    x = torch.zeros(2, 3, 2, 8, device=DEVICE)
    table = torch.ones(2, 3, 4, dtype=torch.complex64, device=DEVICE)
    ids = torch.zeros(2, 3, dtype=torch.long, device=DEVICE)
    freqs = v3_freqs(8)
    q = torch.zeros(6, 2, 8, device=DEVICE)
    fused = freqs_cis_from_position_ids(torch.zeros(6, dtype=torch.long, device=DEVICE), freqs, "thd", True)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    pre = (precompute_freqs_cis, dict(qk_rope_head_dim=8, max_seq_len=64, rope_theta=1e4, rope_scaling=None))
    mscale = (yarn_get_mscale, dict(scale=2.0, mscale=1.0))
    pos = (freqs_cis_from_position_ids, dict(position_ids=ids, freqs=freqs))
    rot = (apply_rotary_emb, dict(x=x, freqs_cis=table))
    half = (apply_rotary_emb_half_split, dict(x=x, freqs_cis=table))
    qk = (apply_rotary_emb_qk, dict(q=q, k=q, freqs_cis=fused, format="thd", cu_seqlens=cu))
    qk_plain = (apply_rotary_emb_qk, dict(q=q, k=q, freqs_cis=table[0], format="thd", rope_fusion=False))
    yarn = dict(V3_SCALING)
    return [
        (pre, dict(qk_rope_head_dim=7), ValueError, "qk_rope_head_dim", "even"),
        (pre, dict(qk_rope_head_dim=0), ValueError, "qk_rope_head_dim", ">= 2"),
        (pre, dict(qk_rope_head_dim=8.0), TypeError, "qk_rope_head_dim", "int"),
        (pre, dict(max_seq_len=0), ValueError, "max_seq_len", ">= 1"),
        (pre, dict(rope_theta=1.0), ValueError, "rope_theta", "> 1"),
        (pre, dict(rope_theta=float("nan")), ValueError, "rope_theta", "finite"),
        (pre, dict(fp64=1), TypeError, "fp64", "bool"),
        (pre, dict(rope_scaling=[("factor", 40)]), TypeError, "rope_scaling", "dict"),
        (pre, dict(rope_scaling=dict(yarn, factor=-1)), ValueError, "rope_scaling['factor']", "> 0"),
        (
            pre,
            dict(rope_scaling=dict(yarn, beta_fast=0.5)),
            ValueError,
            "rope_scaling['beta_fast']",
            "beta_slow",
        ),
        (
            pre,
            dict(rope_scaling=dict(yarn, original_max_position_embeddings=4096.5)),
            TypeError,
            "rope_scaling['original_max_position_embeddings']",
            "int",
        ),
        (mscale, dict(scale="2"), TypeError, "scale", "number"),
        (mscale, dict(mscale=float("inf")), ValueError, "mscale", "finite"),
        (pos, dict(position_ids=ids.float()), TypeError, "position_ids", "int32 or int64"),
        (pos, dict(position_ids=ids[0]), ValueError, "position_ids", "rank 2"),
        (pos, dict(qkv_format="sbhd"), ValueError, "qkv_format", "'bshd' or 'thd'"),
        (pos, dict(freqs=freqs.double()), TypeError, "freqs", "float32"),
        (pos, dict(cp_size=0), ValueError, "cp_size", ">= 1"),
        (pos, dict(for_fused_rope="yes"), TypeError, "for_fused_rope", "bool"),
        (pos, dict(fp64="no"), TypeError, "fp64", "bool"),
        (rot, dict(x=x[0]), ValueError, "x", "rank 4"),
        (rot, dict(x=x.to(torch.int32)), TypeError, "x", "dtype"),
        (rot, dict(x=x.double()), TypeError, "x", "dtype"),
        (rot, dict(x="x"), TypeError, "x", "torch.Tensor"),
        (rot, dict(x=torch.zeros(2, 3, 2, 7, device=DEVICE)), ValueError, "x", "even"),
        (rot, dict(freqs_cis=table.real), TypeError, "freqs_cis", "complex64"),
        (rot, dict(freqs_cis=table.to(torch.complex128)), TypeError, "freqs_cis", "complex64"),
        (rot, dict(freqs_cis=table[:, :2]), ValueError, "freqs_cis", "[batch, sequence, channels/2]"),
        (rot, dict(freqs_cis=table.to("meta")), ValueError, "freqs_cis", "x's device"),
        (rot, dict(unsqueeze_dim=1), ValueError, "unsqueeze_dim", "2"),
        (rot, dict(unsqueeze_dim=2), ValueError, "x", "rank 3"),
        (rot, dict(qkv_format="thd"), ValueError, "x", "rank 3"),
        (rot, dict(qkv_format="sbhd"), ValueError, "qkv_format", "'bshd' or 'thd'"),
        (half, dict(x=x[None]), ValueError, "x", "rank 4"),
        (half, dict(freqs_cis=table[:1]), ValueError, "freqs_cis", "shape"),
        (qk, dict(format="bshd"), ValueError, "q", "rank 4"),
        (qk, dict(k=q[..., :4]), ValueError, "k", "channels"),
        (qk, dict(cu_seqlens=cu.float()), ValueError, "cu_seqlens", "int32/int64"),
        (qk, dict(cu_seqlens=torch.tensor([0, 2, 5])), ValueError, "cu_seqlens", "last offset"),
        (qk, dict(cu_seqlens=torch.tensor([1, 2, 6])), ValueError, "cu_seqlens", "from 0"),
        (qk, dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), ValueError, "cu_seqlens", "non-decreasing"),
        (qk, dict(cp_size=2, cp_rank=2), ValueError, "cp_rank", "< cp_size"),
        (
            qk,
            dict(cp_size=2, cu_seqlens=torch.tensor([0, 6, 12])),
            ValueError,
            "cp_size",
            "divisible by 2 * cp_size",
        ),
        (qk, dict(freqs_cis=table[0]), TypeError, "freqs_cis", "for_fused_rope=True"),
        (qk, dict(freqs_cis=fused[:, :3]), ValueError, "freqs_cis", "positions >= 4"),
        (qk, dict(freqs_cis=fused.clone().requires_grad_()), ValueError, "freqs_cis", "requires_grad"),
        (qk, dict(rope_fusion="yes"), TypeError, "rope_fusion", "bool"),
        (
            qk,
            dict(format="bshd", q=x, k=x, cu_seqlens=cu),
            ValueError,
            "cu_seqlens",
            "None for format 'bshd'",
        ),
        (qk_plain, dict(freqs_cis=table), ValueError, "freqs_cis", "[tokens, channels/2]"),
    ]


def case_id(case):
    (function, _), change, _, arg, _ = case
    return f"{function.__name__}-{arg}-{'-'.join(change)}"


@pytest.mark.parametrize("case", refused_cases(), ids=case_id)
def test_refused_inputs(case, monkeypatch):
    (function, kwargs), change, error, arg, words = case

    def no_launch(*args, **kwargs):
        raise AssertionError("launched before the input was refused")

    monkeypatch.setattr(dsrope.rope, "_launch", no_launch)
    with pytest.raises(error) as info:
        function(**(kwargs | change))
    message = str(info.value)
    assert message.startswith(arg) and words in message, message


def test_model_is_not_vacuous():
    """The rotation model allows one value on most bf16 elements (so it can fail)."""
    x = x_values((2, 8, 4, 64), torch.bfloat16, seed=28)
    model: Model = ref.interleaved(x, rotation_table((2, 8), 64, seed=29))
    single = (model.lo == model.hi).double().mean().item()
    assert single >= 0.95, f"only {single:.2%} of the elements have a single allowed value"
