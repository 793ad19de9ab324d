"""Differential checks of the DeepSeek-V3 rotations against transformers' DeepSeek-V3 code (pinned in
pyproject's test extra), and of transformers against our reference (reference/rope_utils.py).

Theirs (transformers.models.deepseek_v3.modeling_deepseek_v3): apply_rotary_pos_emb_interleave
(pairs (2j, 2j + 1)) and apply_rotary_pos_emb (rotate_half: pairs (j, j + d/2)). Ours:
dsrope.rope_utils.apply_rotary_emb (the Triton kernel for a table without grad, the eager FP32
complex product for a trainable one), apply_rotary_emb_qk (the kernel with the fused table) and
apply_rotary_emb_half_split (eager FP32). Both sides get the same FP32 table (ours: complex
[*tokens, d/2]; theirs: cos, sin = cat(f, f) [*tokens, d]), so these tests compare rotations only;
the tables themselves are compared in tests/test_vs_transformers_tables.py. How their layouts and
dtypes map onto ours: tests/differential.py.

Error model of every comparison: reference/rope.py's per-element interval (an FP32 computation of
a*c - b*s and a*s + b*c in any order, with or without FMA, one rounding into x's dtype). Theirs,
run in FP32 on the upcast inputs and rounded once, is such a computation, so it must lie inside
the model: zero elements outside (this is transformers agreeing with our reference). Ours must too.
Bits:
- CPU: ours and theirs perform the same FP32 operations in the same order, so they agree bit for
  bit on every element. Checked, not assumed: theirs computes fl(fl(a*c) - fl(b*s)) and
  fl(fl(b*c) + fl(a*s)) as separate torch ops; our kernel in Triton's interpreter computes
  a*c + (-b)*s and b*c + a*s as separate numpy FP32 ops (negation is exact, a sum of two terms
  commutes exactly); our eager paths are torch FP32 ops (half-split: the same products and sums;
  the interleaved eager path: torch's vectorized complex product, two products and one sum per
  part, no FMA on this CPU). The results are rounded once into x's dtype on both sides.
- GPU: the compiled kernel may contract a product into an FMA (torch's eager ops round each one),
  and so may torch's CUDA complex product: both sides are held to the model, and to equal bits
  only where the model allows one value (Model.lo == Model.hi: most bf16 elements). The
  half-split comparison stays bit for bit on GPU: both sides are the same eager torch ops.

Documented differences (not errors, each with its test): transformers' interleave function returns
the rotated pairs de-interleaved (pair j in channels j and j + d/2; ours keeps pairs in place, as
docs/contract.md says), and transformers computes in its input's dtype with cos/sin cast to it, which in
bf16/fp16 is another function (test_transformers_in_its_input_dtype_is_another_function).

Mutants (tools/mutants.py) each test fails under, shown with
`python -m tools.mutants --only NAME --tests test_vs_transformers` (docs/development.md):
  test_interleaved_matches_transformers_interleave  utils.kernel_conjugate_table (kernel),
                                                    utils.eager_interleaved_pairs_halves (eager)
  test_qk_fused_matches_transformers                rope.forward_sine_sign
  test_half_split_matches_transformers_rotate_half  utils.half_split_halves_swapped
  test_pairings_are_not_interchangeable             utils.half_split_pairs_adjacent
  test_interleaved_gradients_match_transformers     rope.backward_sine_sign (kernel),
                                                    utils.eager_interleaved_pairs_halves (eager)
  test_transformers_in_its_input_dtype_is_another_function  utils.kernel_conjugate_table
"""

from __future__ import annotations

import pytest
import torch

from dsrope_gate.differential import (
    TRANSFORMERS_MISSING,
    cos_sin_cat,
    de_interleaved,
    pairs_in_place,
    transformers_fp32,
)

hf = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3", reason=TRANSFORMERS_MISSING)

from dsrope_reference import rope_utils as ref  # noqa: E402
from dsrope_reference.floats import bits  # noqa: E402
from dsrope_reference.rope import Model  # noqa: E402

from dsrope.rope_utils import (  # noqa: E402
    apply_rotary_emb,
    apply_rotary_emb_half_split,
    apply_rotary_emb_qk,
    freqs_cis_from_position_ids,
    precompute_freqs_cis,
)
from dsrope_gate.inputs import DEVICE, DTYPES, ON_GPU, gen, values  # noqa: E402
from tests.test_rope_utils import V3_MAX_SEQ, V3_SCALING  # noqa: E402  (the config those tests use)

# DeepSeek-V3's rope: qk_rope_head_dim 64, theta 10000, YaRN factor 40 over 4096 positions; and a
# plain table of another width and theta.
CONFIGS = {
    "v3": (64, V3_MAX_SEQ, 10000.0, V3_SCALING),
    "plain_theta_1e6": (32, 8192, 1e6, None),
}
# Where transformers' q/k sit relative to ours ([B, S, H, d] bshd, [T, H, d] thd):
#   bshd: the same tensor, cos unsqueezed at 2;  bhsd: transformers' documented [B, H, S, d] (our
#   input transposed, a strided view for ours), cos unsqueezed at 1;  thd: [T, H, d], cos at 1.
LAYOUTS = ("bshd", "bhsd", "thd")
BITS = "the same FP32 operations in the same order" if not ON_GPU else "the model allows one value"


def table(tokens, config: str, seed: int) -> torch.Tensor:
    """Our complex table for random positions in [1, 2**16) (no row is the identity)."""
    dim, max_seq_len, theta, scaling = CONFIGS[config]
    positions = torch.randint(1, 1 << 16, tuple(tokens), generator=gen(seed)).to(DEVICE)
    freqs = precompute_freqs_cis(dim, max_seq_len, theta, scaling)
    return freqs_cis_from_position_ids(positions, freqs, "bshd" if len(tokens) == 2 else "thd")


def inputs(layout: str, config: str, dtype, seed: int):
    """q [B, S, H, d] (bshd, bhsd: a strided view) or [T, H, d] (thd), a shared key without a head
    dim, the table."""
    dim = CONFIGS[config][0]
    tokens = (7,) if layout == "thd" else (2, 5)
    q = values((*tokens, 3, dim), dtype, seed).to(DEVICE)
    if layout == "bhsd":  # stored as transformers' [B, H, S, d]; ours reads the [B, S, H, d] view
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
    k = values((*tokens, dim), dtype, seed + 1).to(DEVICE)
    return q, k, table(tokens, config, seed + 2)


def transformers_rotation(function, q, k, freqs_cis, layout: str):
    """transformers' `function` on our q [.., H, d] and shared key [.., d] placed in `layout`, in FP32
    and rounded once; the results come back in our layout (still in transformers' channel order)."""
    cos, sin = cos_sin_cat(freqs_cis)
    if layout == "bhsd":
        q_out, k_out = transformers_fp32(function, q.transpose(1, 2), k[:, None], cos, sin, unsqueeze_dim=1)
        return q_out.transpose(1, 2), k_out[:, 0]
    axis = 2 if layout == "bshd" else 1
    q_out, k_out = transformers_fp32(function, q, k.unsqueeze(axis), cos, sin, unsqueeze_dim=axis)
    return q_out, k_out.squeeze(axis)


def ours_interleaved(q, k, freqs_cis, layout: str, path: str):
    fmt = "thd" if layout == "thd" else "bshd"
    if path == "eager":
        freqs_cis = freqs_cis.clone().requires_grad_()
    return apply_rotary_emb(q, freqs_cis, fmt), apply_rotary_emb(k, freqs_cis, fmt, unsqueeze_dim=2)


def assert_agree(ours: torch.Tensor, theirs: torch.Tensor, model: Model, what: str, everywhere: bool = not ON_GPU):
    """Both inside the model; equal bits on every element (`everywhere`) or where the model allows one."""
    check = model.judge(theirs)
    assert check.violations == 0, f"{what}: transformers outside our reference's model: {check}"
    check = model.judge(ours)
    assert check.violations == 0, f"{what}: ours outside the model: {check}"
    where = torch.ones(ours.shape, dtype=torch.bool) if everywhere else model.lo == model.hi
    differ = (bits(ours) != bits(theirs)) & where
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {int(where.sum())} elements differ from transformers where "
        f"{'we expect the same bits (' + BITS + ')' if everywhere else 'the model allows one value'}; "
        f"first at {differ.nonzero()[0].tolist()}"
    )


@pytest.mark.parametrize("path", ["kernel", "eager"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_interleaved_matches_transformers_interleave(dtype, config, layout, path):
    """apply_rotary_emb (q with heads; the shared key with unsqueeze_dim=2) against
    apply_rotary_pos_emb_interleave, whose output is compared with its pairs put back in place."""
    q, k, freqs_cis = inputs(layout, config, dtype, seed=1)
    theirs_q, theirs_k = transformers_rotation(hf.apply_rotary_pos_emb_interleave, q, k, freqs_cis, layout)
    ours_q, ours_k = ours_interleaved(q, k, freqs_cis, layout, path)
    everywhere = not ON_GPU
    assert_agree(ours_q, pairs_in_place(theirs_q), ref.interleaved(q, freqs_cis), f"q {path}", everywhere)
    assert_agree(ours_k, pairs_in_place(theirs_k), ref.interleaved(k, freqs_cis), f"shared key {path}", everywhere)


@pytest.mark.parametrize("qkv_format", ["bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_fused_matches_transformers(dtype, qkv_format):
    """apply_rotary_emb_qk with the fused table (float32 [2, P, d], row p = cat(cos, cos), cat(sin, sin)
    of position p): its rows are transformers' cos, sin rows for tokens at positions 0 .. S-1 as
    they are, no conversion. q with 3 heads, k with one (MLA's shared key)."""
    dim, max_seq_len, theta, scaling = CONFIGS["v3"]
    lead = (2, 6) if qkv_format == "bshd" else (6,)
    q = values((*lead, 3, dim), dtype, seed=3).to(DEVICE)
    k = values((*lead, 1, dim), dtype, seed=4).to(DEVICE)
    positions = torch.arange(6, device=DEVICE).expand(lead)
    fused = freqs_cis_from_position_ids(
        positions, precompute_freqs_cis(dim, max_seq_len, theta, scaling), qkv_format, True
    )
    ours_q, ours_k = apply_rotary_emb_qk(q, k, fused, qkv_format, rope_fusion=True)
    cos, sin = fused[0, :6].expand(*lead, dim), fused[1, :6].expand(*lead, dim)
    axis = 2 if qkv_format == "bshd" else 1
    theirs_q, theirs_k = transformers_fp32(hf.apply_rotary_pos_emb_interleave, q, k, cos, sin, axis)
    freqs_cis = torch.complex(cos[..., : dim // 2], sin[..., : dim // 2])
    assert_agree(ours_q, pairs_in_place(theirs_q), ref.interleaved(q, freqs_cis), "q")
    assert_agree(ours_k, pairs_in_place(theirs_k), ref.interleaved(k, freqs_cis), "k")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_half_split_matches_transformers_rotate_half(dtype, config, layout):
    """apply_rotary_emb_half_split (q with heads, the key without) against apply_rotary_pos_emb:
    the same layout on both sides, and the same eager torch ops, so bit for bit on CPU and GPU."""
    q, k, freqs_cis = inputs(layout, config, dtype, seed=5)
    theirs_q, theirs_k = transformers_rotation(hf.apply_rotary_pos_emb, q, k, freqs_cis, layout)
    fmt = "thd" if layout == "thd" else "bshd"
    ours_q, ours_k = apply_rotary_emb_half_split(q, freqs_cis, fmt), apply_rotary_emb_half_split(k, freqs_cis, fmt)
    assert_agree(ours_q, theirs_q, ref.half_split(q, freqs_cis), "q", everywhere=True)
    assert_agree(ours_k, theirs_k, ref.half_split(k, freqs_cis), "key", everywhere=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pairings_are_not_interchangeable(dtype):
    """Ours interleaved matches transformers' interleave function (pairs in place) and not its rotate_half
    one; our half-split matches rotate_half and not the interleave function, in either channel order:
    each mismatch differs on >= 90% of the elements, and transformers' wrong pairing falls outside our
    model of the right one on >= 90%."""
    q, k, freqs_cis = inputs("bshd", "v3", dtype, seed=7)
    interleave, _ = transformers_rotation(hf.apply_rotary_pos_emb_interleave, q, k, freqs_cis, "bshd")
    rotate_half, _ = transformers_rotation(hf.apply_rotary_pos_emb, q, k, freqs_cis, "bshd")
    ours = {"interleaved": apply_rotary_emb(q, freqs_cis), "half_split": apply_rotary_emb_half_split(q, freqs_cis)}
    right = {"interleaved": pairs_in_place(interleave), "half_split": rotate_half}
    wrong = {
        "interleaved": (rotate_half, pairs_in_place(rotate_half), de_interleaved(rotate_half)),
        "half_split": (interleave, pairs_in_place(interleave)),
    }
    for pairing, out in ours.items():
        model = ref.rotation(q, freqs_cis, pairing)
        assert_agree(out, right[pairing], model, pairing, everywhere=not ON_GPU or pairing == "half_split")
        for other in wrong[pairing]:
            same = (bits(out) == bits(other)).double().mean().item()
            assert same <= 0.1, f"ours {pairing} equals transformers' other pairing on {same:.2%} of the elements"
        outside = model.judge(wrong[pairing][0])
        assert outside.violations >= 0.9 * outside.checked, f"the {pairing} model accepts the other pairing: {outside}"


@pytest.mark.parametrize("path", ["kernel", "eager"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_interleaved_gradients_match_transformers(dtype, path):
    """Autograd through transformers' interleave function (FP32 on the upcast input, its upstream
    gradient de-interleaved to its channel order) against ours: the kernel's conjugate rotation, or
    autograd through the eager complex product. dx: the rotation of the gradient by the conjugate
    table, the same model and bits as the forward. Trainable table (eager): both table gradients
    inside reference/rope_utils.table_gradient's model (sums over the heads in different orders:
    no bits demanded)."""
    q, _, freqs_cis = inputs("bshd", "v3", dtype, seed=9)
    g = values(q.shape, dtype, seed=10).to(DEVICE)
    q = q.requires_grad_()
    trainable = path == "eager"
    table = freqs_cis.clone().requires_grad_(trainable)
    wrt = (q, table) if trainable else (q,)
    ours = torch.autograd.grad(apply_rotary_emb(q, table), wrt, g)

    c, s = (t.detach().clone().requires_grad_(trainable) for t in (freqs_cis.real, freqs_cis.imag))
    cos, sin = torch.cat((c, c), -1), torch.cat((s, s), -1)
    theirs_q, _ = transformers_fp32(
        hf.apply_rotary_pos_emb_interleave, q, q.detach()[..., :1, :], cos, sin, unsqueeze_dim=2
    )
    theirs = torch.autograd.grad(theirs_q, (q, c, s) if trainable else (q,), de_interleaved(g))

    assert_agree(ours[0], theirs[0], ref.rotation(g, freqs_cis.conj(), "interleaved"), f"dx {path}", not ON_GPU)
    if trainable:
        d_cos, d_sin = ref.table_gradient(q, g, freqs_cis, "interleaved")
        for what, model, mine, other in (
            ("d/dcos", d_cos, ours[1].real, theirs[1]),
            ("d/dsin", d_sin, ours[1].imag, theirs[2]),
        ):
            assert model.judge(mine).violations == 0, f"ours {what}: {model.judge(mine)}"
            assert model.judge(other).violations == 0, f"transformers {what}: {model.judge(other)}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_transformers_in_its_input_dtype_is_another_function(dtype, record_property):
    """transformers as its DeepSeek-V3 attention runs it: cos, sin cast to q's dtype (its rotary
    embedding returns them so) and every product and sum rounded to that dtype. That is not the
    function ours computes (FP32 math, one rounding, FP32 table): on these inputs it falls outside
    our model on some elements, while ours has none outside. This is why the comparisons above run
    transformers in FP32 on the upcast inputs."""
    q, k, freqs_cis = inputs("bshd", "v3", dtype, seed=11)
    cos, sin = (t.to(dtype) for t in cos_sin_cat(freqs_cis))
    native, _ = hf.apply_rotary_pos_emb_interleave(q, k.unsqueeze(2), cos, sin, unsqueeze_dim=2)
    assert native.dtype == dtype
    model = ref.interleaved(q, freqs_cis)
    ours = model.judge(apply_rotary_emb(q, freqs_cis))
    assert ours.violations == 0, f"ours: {ours}"
    theirs = model.judge(pairs_in_place(native))
    record_property(f"native_{dtype}_outside", theirs.violations / theirs.checked)
    assert theirs.violations > 0, f"transformers in {dtype} is not told apart from ours: {theirs}"
