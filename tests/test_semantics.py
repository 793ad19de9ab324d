"""The semantics emulations (src/dsrope_gate/semantics.py) and their classifier, on the CPU.

- every emulation's output is classified as exactly its own label over a set of cases (bf16 and fp16
  on a DSV4 geometry and a small odd one, plus one fp32 case), so the 99.9% threshold separates them;
  documented ties: fp32 outputs (truncating-store is interleaved, the norms and backward boundaries
  are no-ops) and fma-rotation, which in bf16/fp16 agrees with interleaved on all but a few elements;
- the contract's emulations equal tests/differential.py's eager chains bit for bit, forward and
  backward (autograd);
- the reference error model accepts the contract and fma-rotation and rejects every other label
  (bf16 and fp16, some elements outside);
- an implementation one ulp off on a random 1% of elements gets no label.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from dsrope_reference import qnorm_rope as qnorm_model
from dsrope_reference.floats import bits, round_down, round_up
from dsrope_reference.rope import partial_rope, round_nearest_exact, two_sum

from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope, forward_backward
from dsrope_gate.inputs import gen, tables, values
from dsrope_gate.layouts import Layout, materialize
from dsrope_gate.ops import DIRECTIONS, ROWS
from dsrope_gate.semantics import agreement, agreement_matrix, classify, fma32, truncate

EPS = 1e-6
GEOMETRIES = {
    # name: ([B, H, S, D], rotary, x's layout)
    "dsv4": ((2, 4, 16, 512), 64, Layout()),
    "odd": ((1, 3, 5, 96), 32, Layout(order=(0, 2, 1, 3), step=(1, 1, 2, 1), offset=3)),
}
HALF = [(torch.bfloat16, "dsv4"), (torch.float16, "dsv4"), (torch.bfloat16, "odd"), (torch.float16, "odd")]
MIXED = HALF + [(torch.float32, "odd")]  # the fp32 case tells fma-rotation from interleaved
# (op, direction) -> label -> emulation; (op, direction) -> the contract's label: the ops' records
SEMANTICS = {(op.name, d): op.emulations[d] for op in ROWS.values() for d in DIRECTIONS}
CONTRACT = {(op.name, d): op.labels()[d] for op in ROWS.values() for d in DIRECTIONS}
KEYS = list(SEMANTICS)


def case(dtype, geometry: str, seed: int = 0):
    shape, rotary, layout = GEOMETRIES[geometry]
    x = materialize(values(shape, dtype, seed), layout)
    cos, sin = tables(shape[0], shape[2], rotary, seed, device="cpu")
    grad = values(shape, dtype, seed + 1)
    return x, cos, sin, rotary, EPS, grad


def run(fn, direction: str, x, cos, sin, rotary, eps, grad):
    return fn(x, cos, sin, rotary, eps) if direction == "forward" else fn(x, cos, sin, rotary, eps, grad)


@functools.cache
def outputs(key, dtype, geometry: str) -> dict:
    """label -> that emulation's result on the case."""
    args = case(dtype, geometry)
    return {label: run(fn, key[1], *args) for label, fn in SEMANTICS[key].items()}


def shares(got: torch.Tensor, key, dtype, geometry: str) -> dict:
    return {label: agreement(got, emulated) for label, emulated in outputs(key, dtype, geometry).items()}


def evidence(key, label: str, cases) -> list[dict]:
    """The agreement of `label`'s emulation with every emulation, per case (an implementation that IS it)."""
    return [shares(outputs(key, dtype, geometry)[label], key, dtype, geometry) for dtype, geometry in cases]


def parts(label: str) -> list[str]:
    return label.split("+")


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_each_emulation_is_classified_as_itself(key):
    for label in SEMANTICS[key]:
        assert classify(evidence(key, label, MIXED)) == parts(label), label


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_half_precision_ties_only_fma_with_interleaved(key):
    """bf16/fp16 alone: every label is itself, except that fma-rotation and interleaved may tie: the
    FP32 ulp differences of the fused products rarely move a bf16/fp16 rounding (0-2 elements of 65,536
    per DSV4 case), so both pass the threshold on each other and only the best mean can tell them."""
    pair = ["interleaved", "fma-rotation"]
    for label in SEMANTICS[key]:
        got = classify(evidence(key, label, HALF))
        if parts(label)[-1] in pair:
            norm = parts(label)[:-1]
            assert got in (parts(label), norm + pair), (label, got)
            other = label.replace(parts(label)[-1], pair[1 - pair.index(parts(label)[-1])])
            assert min(s[other] for s in evidence(key, label, HALF)) >= 0.999
        else:
            assert got == parts(label), label


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_fp32_ties_are_the_roundings_that_vanish(key):
    """fp32 outputs: the store truncates nothing, fp32-through and no-boundary-2 round nothing, dtype-math
    computes in FP32; every-op-rounded's backward is autograd through F.rms_norm's own composite (pow, mean,
    add, rsqrt, mul) in fp32, the contract emulation's backward bit for bit."""
    op, direction = key
    contract = evidence(key, CONTRACT[key], [(torch.float32, "odd")])
    got = classify(contract)
    if key == ("qnorm_rope", "backward"):
        assert got == ["two-boundaries", "no-boundary-2", "every-op-rounded"]
        return
    assert {"interleaved", "truncating-store", "dtype-math"} <= set(got)
    assert not {"half-split", "fma-rotation"} & set(got)
    if op == "qnorm_rope":
        assert {"two-boundaries", "fp32-through"} <= set(got)
    assert contract[0][CONTRACT[key].replace("interleaved", "fma-rotation")] < 0.99  # fp32 separates fma


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_threshold_separates_every_pair_but_fma_and_interleaved_in_bf16(key):
    """The DSV4 bf16 agreement matrix (semantics.agreement_matrix): symmetric, 1 on the diagonal, every pair
    below 0.999 except the rotations interleaved and fma-rotation under the same norm."""
    x, cos, sin, rotary, eps, grad = case(torch.bfloat16, "dsv4")
    matrix = agreement_matrix(SEMANTICS[key], x, cos, sin, rotary, eps, grad)
    for p, row in matrix.items():
        for q, share in row.items():
            assert share == matrix[q][p]
            same_but_fma = {p.replace("fma-rotation", "interleaved"), q.replace("fma-rotation", "interleaved")}
            if p == q:
                assert share == 1.0
            elif len(same_but_fma) == 1:
                assert share >= 0.9999, (p, q, share)
            else:
                assert share < 0.999, (p, q, share)


@pytest.mark.parametrize(("dtype", "geometry"), MIXED)
def test_contract_equals_the_eager_chain(dtype, geometry):
    x, cos, sin, rotary, eps, grad = case(dtype, geometry)
    rope = SEMANTICS["partial_rope", "forward"]["interleaved"](x, cos, sin, rotary)
    rope_eager, rope_dx = forward_backward(eager_partial_rope, x, grad, cos, sin, rotary)
    assert torch.equal(bits(rope), bits(rope_eager))
    dx = SEMANTICS["partial_rope", "backward"]["interleaved"](x, cos, sin, rotary, eps, grad)
    assert torch.equal(bits(dx), bits(rope_dx))

    qnorm = SEMANTICS["qnorm_rope", "forward"]["two-boundaries+interleaved"](x, cos, sin, rotary, eps)
    qnorm_eager, qnorm_dx = forward_backward(eager_qnorm_rope, x, grad, cos, sin, rotary, eps)
    assert torch.equal(bits(qnorm), bits(qnorm_eager))
    dx = SEMANTICS["qnorm_rope", "backward"]["two-boundaries"](x, cos, sin, rotary, eps, grad)
    assert torch.equal(bits(dx), bits(qnorm_dx))


def test_contract_backward_takes_the_gradient_of_sum():
    """The stride-0 gradient of .sum() (a ones scalar expanded) gives autograd's dx of out.sum()."""
    x, cos, sin, rotary, eps, _ = case(torch.bfloat16, "odd")
    ones = torch.ones((), dtype=x.dtype).expand(x.shape)
    for key, chain, args in (
        (("partial_rope", "backward"), eager_partial_rope, (cos, sin, rotary)),
        (("qnorm_rope", "backward"), eager_qnorm_rope, (cos, sin, rotary, eps)),
    ):
        _, expected = forward_backward(chain, x, None, *args)
        got = SEMANTICS[key][CONTRACT[key]](x, cos, sin, rotary, eps, ones)
        assert torch.equal(bits(got), bits(expected)), key


def fp32_rotation(x, cos, sin, rotary):
    """tests/differential.py's eager rotation without its store: the FP32 values."""
    return eager_partial_rope(x.float(), cos, sin, rotary)


def rotate_half_chain(x, cos, sin, rotary):
    """The rotate_half formula x*cat(c, c) + rotate_half(x)*cat(s, s) on the trailing R channels, FP32."""
    d, half = x.shape[-1], rotary // 2
    y = x.float()
    c, s = cos[:, None, :, :half], sin[:, None, :, :half]
    first, second = y[..., d - rotary : d - half], y[..., d - half :]
    cc, ss = torch.cat((c, c), -1), torch.cat((s, s), -1)
    rotated = torch.cat((first, second), -1) * cc + torch.cat((-second, first), -1) * ss
    return torch.cat((y[..., : d - rotary], rotated), -1).to(x.dtype)


def leading_chain(x, cos, sin, rotary):
    """The eager rotation of the leading R channels: move them to the end, rotate, move them back."""
    d = x.shape[-1]
    moved = torch.cat((x[..., rotary:], x[..., :rotary]), -1)
    out = eager_partial_rope(moved, cos, sin, rotary)
    return torch.cat((out[..., d - rotary :], out[..., : d - rotary]), -1)


def truncating_chain(x, cos, sin, rotary):
    v = fp32_rotation(x, cos, sin, rotary).double()
    return torch.where(v >= 0, round_down(v, x.dtype), round_up(v, x.dtype)).to(x.dtype)


def bf16_tables_chain(x, cos, sin, rotary):
    """The eager rotation on tables rounded to bf16 (their values back in FP32)."""
    return eager_partial_rope(x, cos.bfloat16().float(), sin.bfloat16().float(), rotary)


def rotary_factor_twice_chain(x, cos, sin, rotary):
    """The eager rotation of R*R/D channels (even) trailing x[..., :D-R+R*R/D], i.e. the leading ones of the
    rope slice; the rest of the slice unchanged."""
    d = x.shape[-1]
    turned = 2 * (rotary * rotary // (2 * d))
    end = d - rotary + turned
    return torch.cat((eager_partial_rope(x[..., :end], cos, sin, turned), x[..., end:]), -1)


def dtype_math_chain(x, cos, sin, rotary):
    """A hand-written rope in x.dtype: the tables cast to x.dtype, a*c - b*s and a*s + b*c as torch's x.dtype
    ops (each product and the sum rounded to x.dtype), the leading channels as they are."""
    d, half = x.shape[-1], rotary // 2
    c, s = cos[:, None, :, :half].to(x.dtype), sin[:, None, :, :half].to(x.dtype)
    a, b = x[..., d - rotary :: 2], x[..., d - rotary + 1 :: 2]
    return torch.cat((x[..., : d - rotary], torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)), -1)


def official_norm(x, eps):
    """DeepSeek's eager q norm as its code reads, in x.dtype."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize(("dtype", "geometry"), MIXED)
def test_emulations_equal_their_definitions_written_another_way(dtype, geometry):
    """half-split, leading-channels, truncating-store, bf16-tables, rotary-factor-twice and dtype-math against stock-op
    chains and the reference's directed rounding (backward: the same chain with the sine negated, the
    conjugate rotation); fma-rotation against the reference's exact rounding; fp32-through against the
    eager rotation; every-op-rounded against the official eager code in x.dtype (DSV4 rows)."""
    x, cos, sin, rotary, eps, grad = case(dtype, geometry)
    chains = {"half-split": rotate_half_chain, "leading-channels": leading_chain, "truncating-store": truncating_chain}
    chains |= {"bf16-tables": bf16_tables_chain, "rotary-factor-twice": rotary_factor_twice_chain}
    chains |= {"dtype-math": dtype_math_chain}
    for label, chain in chains.items():
        got = SEMANTICS["partial_rope", "forward"][label](x, cos, sin, rotary)
        assert torch.equal(bits(got), bits(chain(x, cos, sin, rotary))), label
        got = SEMANTICS["partial_rope", "backward"][label](x, cos, sin, rotary, eps, grad)
        assert torch.equal(bits(got), bits(chain(grad, cos, -sin, rotary))), label
    # fma-rotation: each lane's cos product fused, the other product rounded to FP32 first
    y = x.float()
    d, half = y.shape[-1], rotary // 2
    a, b = y[..., d - rotary :: 2].double(), y[..., d - rotary + 1 :: 2].double()
    c, s = cos[:, None, :, :half].double(), sin[:, None, :, :half].double()
    first = round_nearest_exact(*two_sum(a * c, -(b * s).float().double()), torch.float32)
    second = round_nearest_exact(*two_sum(b * c, (a * s).float().double()), torch.float32)
    fused = torch.cat((y[..., : d - rotary], torch.stack((first, second), -1).flatten(-2).float()), -1).to(dtype)
    got = SEMANTICS["partial_rope", "forward"]["fma-rotation"](x, cos, sin, rotary)
    assert torch.equal(bits(got), bits(fused))

    through = SEMANTICS["qnorm_rope", "forward"]["fp32-through+interleaved"](x, cos, sin, rotary, eps)
    normalized = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    assert torch.equal(bits(through), bits(fp32_rotation(normalized, cos, sin, rotary).to(dtype)))
    # every-op-rounded is the official code's bits where torch rounds each op once: on the DSV4 rows (its
    # vectorized rsqrt); the odd case's 15 rows take torch's scalar bf16 rsqrt, which rounds sqrt first
    if geometry == "dsv4":
        official = SEMANTICS["qnorm_rope", "forward"]["every-op-rounded+interleaved"](x, cos, sin, rotary, eps)
        assert torch.equal(bits(official), bits(eager_partial_rope(official_norm(x, eps), cos, sin, rotary)))


@pytest.mark.parametrize("op", ["partial_rope", "qnorm_rope"])
def test_a_hand_written_rope_in_the_input_dtype_is_classified_dtype_math(op):
    """A plain-torch rope in x.dtype (dtype_math_chain), alone (partial RoPE) or after F.rms_norm in x.dtype
    (the contract's norm): the classifier names dtype-math and nothing else for the rotation, over bf16,
    fp16 and the fp32 case (where it ties with the FP32 rotations and the bf16/fp16 cases decide)."""
    key = (op, "forward")
    got = []
    for dtype, geometry in MIXED:
        x, cos, sin, rotary, eps, _ = case(dtype, geometry)
        y = F.rms_norm(x, (x.shape[-1],), eps=eps) if op == "qnorm_rope" else x
        got.append(shares(dtype_math_chain(y, cos, sin, rotary).contiguous(), key, dtype, geometry))
    assert classify(got) == (["two-boundaries", "dtype-math"] if op == "qnorm_rope" else ["dtype-math"])
    label = "two-boundaries+dtype-math" if op == "qnorm_rope" else "dtype-math"
    assert min(g[label] for g in got) == 1.0
    interleaved = label.replace("dtype-math", "interleaved")
    assert max(g[interleaved] for g in got[:4]) < 0.999  # bf16/fp16: a different function from the contract's


INSIDE = {"interleaved", "fma-rotation", "two-boundaries", "two-boundaries+interleaved", "two-boundaries+fma-rotation"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_error_model_accepts_the_contract_and_fma_only(dtype):
    x, cos, sin, rotary, eps, grad = case(dtype, "dsv4")
    models = {
        ("partial_rope", "forward"): partial_rope(x, cos, sin, rotary),
        ("partial_rope", "backward"): partial_rope(grad, cos, sin, rotary, inverse=True),
        ("qnorm_rope", "forward"): qnorm_model.forward(x, cos, sin, rotary, eps).out,
        ("qnorm_rope", "backward"): qnorm_model.backward(x, grad, cos, sin, rotary, eps).dx,
    }
    for key, model in models.items():
        for label, out in outputs(key, dtype, "dsv4").items():
            check = model.judge(out)
            if label in INSIDE:
                assert check.violations == 0, (key, label, str(check))
            else:
                assert check.violations > 0, (key, label, str(check))


def one_ulp_off(t: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """t with a random `share` of its elements moved by one ulp (their bits +- 1)."""
    ints = bits(t).clone()
    pick = torch.rand(ints.shape, generator=gen(seed)) < share
    step = torch.where(torch.rand(ints.shape, generator=gen(seed + 1)) < 0.5, 1, -1).to(ints.dtype)
    ints = torch.where(pick, ints + step, ints)
    return ints.view(t.dtype)


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_one_ulp_off_on_one_percent_gets_no_label(key):
    cases = MIXED
    contract = [outputs(key, dtype, geometry)[CONTRACT[key]] for dtype, geometry in cases]
    noisy = [one_ulp_off(t, 0.01, seed) for seed, t in enumerate(contract)]
    evidence = [shares(t, key, dtype, geometry) for t, (dtype, geometry) in zip(noisy, cases, strict=True)]
    assert max(max(s.values()) for s in evidence) < 0.999
    assert classify(evidence) == []


@pytest.mark.parametrize("key", KEYS, ids="-".join)
def test_emulations_read_through_strides_and_leave_inputs_alone(key):
    x, cos, sin, rotary, eps, grad = case(torch.bfloat16, "odd")
    before = [bits(t).clone() for t in (x, cos, sin, grad)]
    for label, fn in SEMANTICS[key].items():
        strided = run(fn, key[1], x, cos, sin, rotary, eps, grad)
        dense = run(fn, key[1], x.contiguous(), cos.contiguous(), sin.contiguous(), rotary, eps, grad)
        assert strided.is_contiguous() and strided.dtype == x.dtype and strided.shape == x.shape
        assert torch.equal(bits(strided), bits(dense)), label
    for t, b in zip((x, cos, sin, grad), before, strict=True):
        assert torch.equal(bits(t), b)


def test_agreement_counts_bits_nan_meets_nan_and_signed_zeros_differ():
    one = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    assert agreement(one, one.clone()) == 1.0
    assert agreement(one, torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.bfloat16)) == 0.75
    nan, other_nan = torch.tensor([0x7FC0, 0x7FC1], dtype=torch.int16).view(torch.bfloat16)
    assert agreement(nan[None], other_nan[None]) == 1.0  # payloads are not semantics
    zero = torch.tensor([0.0], dtype=torch.bfloat16)
    assert agreement(zero, -zero) == 0.0  # the bits differ
    assert agreement(one[:0], one[:0]) == 1.0
    assert agreement(one.float(), one) == 0.0 and agreement(one[:2], one[:2, None]) == 0.0


def test_classify_needs_the_threshold_on_every_case_and_keeps_ties():
    assert classify([{"p": 1.0, "q": 0.5}, {"p": 0.9995, "q": 0.5}]) == ["p"]
    assert classify([{"p": 1.0, "q": 0.5}, {"p": 0.998, "q": 0.5}]) == []
    assert classify([{"p": 1.0, "q": 1.0}]) == ["p", "q"]
    # the best mean decides: q is never below threshold but p agrees more on average
    assert classify([{"p": 1.0, "q": 0.9995}, {"p": 0.9999, "q": 0.9999}]) == ["p"]
    assert classify([{"a+x": 1.0, "b+x": 1.0, "a+y": 0.2}]) == ["a", "b", "x"]
    assert classify([]) == []


def test_truncate_rounds_toward_zero():
    v = torch.randn(20000, generator=gen(0), dtype=torch.float64) * torch.exp2(torch.randint(-30, 30, (20000,)))
    v = torch.cat((v, torch.tensor([7e4, -7e4, 3e38, 1e-8, -1e-8, 0.0]))).float()
    for dtype in (torch.bfloat16, torch.float16):
        expected = torch.where(v >= 0, round_down(v.double(), dtype), round_up(v.double(), dtype))
        assert torch.equal(truncate(v, dtype).double(), expected), dtype
    assert torch.isnan(truncate(torch.tensor([float("nan")]), torch.bfloat16)).all()


def test_fma32_rounds_once():
    g = gen(1)
    a, b, c = (
        torch.randn(20000, generator=g) * torch.exp2(torch.randint(-20, 20, (20000,), generator=g)) for _ in "abc"
    )
    expected = round_nearest_exact(*two_sum(a.double() * b.double(), c.double()), torch.float32).float()
    assert torch.equal(bits(fma32(a, b, c)), bits(expected))
    # (1 + 2**-23) * 1.5 is an FP32 midpoint; a tiny addend decides it, which FP64 alone would lose
    a, b = torch.tensor([1 + 2.0**-23] * 3), torch.tensor([1.5] * 3)
    c = torch.tensor([-(2.0**-60), 0.0, 2.0**-60])
    assert fma32(a, b, c).tolist() == [1.5 + 2.0**-23, 1.5 + 2.0**-22, 1.5 + 2.0**-22]
