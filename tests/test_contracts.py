"""The contracts (dsrope_reference.contracts) judged like the judge: each contract's FP64 model accepts its
own eager emulation and its own bounds, and rejects one rounding step past a bound, NaN and infinities
where its reference is finite, and the other contracts' emulations where they differ.

Emulations (dsrope_gate.semantics, or plain torch written here):
  two-boundaries    F.rms_norm in x.dtype, the FP32 rotation, cast (autograd for the backward)
  fp32-through      F.rms_norm on x.float(), the FP32 rotation, cast; its autograd is no-boundary-2
  every-op-rounded  the official q norm op by op on x.dtype tensors, then the FP32 rotation (backward:
                    torch's derivative formulas op by op, every_op_rounded_backward)
  bf16-tables       the two-boundaries chain on tables rounded to bf16 first (backward: the label
                    bf16-tables, checked here against the two-boundaries emulation on rounded tables)
Partial RoPE has no norm: fp32-through and every-op-rounded name the contract's rotation there.

Cases: a DSV4 row geometry (D = 512, R = 64) with normal values, and edges: tiny, huge (the golden edge:
rms 2^40, one row whose FP32 sum of squares overflows; fp16: squares past its range), mixed scales,
zero rows, eps = 0.5 (of the order of mean(x^2)), and midpoint values on dyadic tables (exact FP32
rotations on x.dtype rounding midpoints).
"""

from __future__ import annotations

import functools

import mpmath
import pytest
import torch
import torch.nn.functional as F
from dsrope_reference import contracts, every_op_rounded, qnorm_rope, rope
from dsrope_reference.floats import bits, inside, round_nearest
from dsrope_reference.qnorm_rope import mp_round

from dsrope_gate import semantics
from dsrope_gate.cases import Case, Drawn, Seeded, Tables, Values
from dsrope_gate.differential import eager_partial_rope
from dsrope_gate.layouts import CONTIGUOUS

CONTRACTS = list(contracts.CONTRACTS)
DTYPES = ("bfloat16", "float16", "float32")
KEYS = [(op, direction) for op in ("qnorm_rope", "partial_rope") for direction in ("forward", "backward")]
SHAPE, ROTARY = (2, 2, 3, 512), 64
# the contracts whose partial RoPE is the contract's rotation: one emulation, one model
SAME_ROTATION = {"two-boundaries", "fp32-through", "every-op-rounded"}


EMULATIONS = {
    "two-boundaries": {
        ("qnorm_rope", "forward"): semantics.qnorm_forward("two-boundaries", "interleaved"),
        ("qnorm_rope", "backward"): semantics.qnorm_backward("two-boundaries"),
    },
    "fp32-through": {
        ("qnorm_rope", "forward"): semantics.qnorm_forward("fp32-through", "interleaved"),
        ("qnorm_rope", "backward"): semantics.qnorm_backward("no-boundary-2"),
    },
    "every-op-rounded": {
        ("qnorm_rope", "forward"): semantics.qnorm_forward("every-op-rounded", "interleaved"),
        ("qnorm_rope", "backward"): semantics.qnorm_backward("every-op-rounded"),
    },
    "bf16-tables": {
        ("qnorm_rope", "forward"): semantics.qnorm_forward("two-boundaries", "bf16-tables"),
        ("qnorm_rope", "backward"): semantics.qnorm_backward("bf16-tables"),
        ("partial_rope", "forward"): semantics.rope_forward("bf16-tables"),
        ("partial_rope", "backward"): semantics.rope_backward("bf16-tables"),
    },
}
for name in SAME_ROTATION:
    EMULATIONS[name][("partial_rope", "forward")] = semantics.rope_forward("interleaved")
    EMULATIONS[name][("partial_rope", "backward")] = semantics.rope_backward("interleaved")

KINDS = {
    "canonical": Seeded(11),
    "tiny": Seeded(12, "tiny"),
    "huge": Seeded(13, "huge"),
    "mixed": Drawn(Values("mixed", 14), Tables("angles", 15), Values("mixed", 16)),
    "zero_rows": Seeded(17, "zero_rows"),
    "large_eps": Seeded(22),  # eps = 0.5, of the order of mean(x^2): the eps-add's rounding shows
    "midpoint": Drawn(Values("midpoint", 18), Tables("dyadic", 19), Values("midpoint", 20)),
}


@functools.cache
def case(kind: str, dtype: str) -> Case:
    values = Seeded(21, "nan") if kind == "nan" else KINDS[kind]
    shape, rotary = ((2, 2, 3, 64), 32) if kind == "nan" else (SHAPE, ROTARY)
    eps = 0.5 if kind == "large_eps" else 1e-6
    return Case(name=kind, shape=shape, rotary=rotary, dtype=dtype, values=values, grad_layout=CONTIGUOUS, eps=eps)


@functools.cache
def inputs(kind: str, dtype: str):
    return case(kind, dtype).build("cpu")


@functools.cache
def model_of(contract: str, key, kind: str, dtype: str):
    """The contract's model of `key`'s stage on the case (cached: every test reads the same ones)."""
    (op, direction), c = key, case(kind, dtype)
    x, cos, sin, grad = inputs(kind, dtype)
    if op == "qnorm_rope" and direction == "forward":
        return contracts.forward(x, cos, sin, c.rotary, c.eps, contract).out
    if op == "qnorm_rope":
        return contracts.backward(x, grad, cos, sin, c.rotary, c.eps, contract).dx
    t = x if direction == "forward" else grad
    return contracts.partial_rope(t, cos, sin, c.rotary, inverse=direction == "backward", contract=contract)


@functools.cache
def emulated(contract: str, key, kind: str, dtype: str) -> torch.Tensor:
    c, (x, cos, sin, grad) = case(kind, dtype), inputs(kind, dtype)
    return EMULATIONS[contract][key](x, cos, sin, c.rotary, c.eps, grad)


def accepted(values: torch.Tensor, model) -> torch.Tensor:
    return inside(values.to(torch.float64), model.ref, model.lo, model.hi)


def representable(t64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t64.to(torch.float32).to(dtype).to(torch.float64) == t64


# --- the registry ------------------------------------------------------------------------------------------


def test_unknown_contract_names_the_known_ones():
    x, cos, sin, grad = inputs("nan", "bfloat16")
    for call in (
        lambda: contracts.forward(x, cos, sin, 32, 1e-6, "fp32_through"),
        lambda: contracts.backward(x, grad, cos, sin, 32, 1e-6, "two boundaries"),
        lambda: contracts.partial_rope(x, cos, sin, 32, contract="bf16"),
    ):
        with pytest.raises(ValueError, match="contract: expected one of two-boundaries, fp32-through, every-op"):
            call()
    assert contracts.DEFAULT == "two-boundaries" and all(contracts.CONTRACTS[n].description for n in CONTRACTS)


def test_two_boundaries_is_the_default_and_the_existing_models():
    """The default contract is reference/qnorm_rope.py's and reference/rope.py's models themselves (the
    golden store holds their bits); partial RoPE's fp32-through and every-op-rounded are that rotation."""
    two = contracts.CONTRACTS["two-boundaries"]
    assert (two.forward, two.backward, two.partial_rope) == (qnorm_rope.forward, qnorm_rope.backward, rope.partial_rope)
    assert all(contracts.CONTRACTS[n].partial_rope is rope.partial_rope for n in SAME_ROTATION)
    c, (x, cos, sin, _) = case("nan", "bfloat16"), inputs("nan", "bfloat16")
    default = vars(contracts.forward(x, cos, sin, c.rotary, c.eps).out).values()
    direct = vars(qnorm_rope.forward(x, cos, sin, c.rotary, c.eps).out).values()
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(default, direct, strict=True))


# --- each contract against its own emulation and its own bounds ---------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", KEYS, ids="-".join)
@pytest.mark.parametrize("contract", CONTRACTS)
def test_each_contract_accepts_its_own_emulation(contract, key, dtype):
    for kind in KINDS:
        check = model_of(contract, key, kind, dtype).judge(emulated(contract, key, kind, dtype))
        assert check.violations == 0, f"{contract} {key} {kind} {dtype}: {check}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key", KEYS, ids="-".join)
@pytest.mark.parametrize("contract", CONTRACTS)
def test_each_model_accepts_its_bounds_and_rejects_past_them_and_non_finite(contract, key, dtype):
    """On a case with NaN inputs (one rotary channel of x, one pass-through channel of the gradient):
    the reference and each bound are accepted; one representable step past a bound, NaN or an infinity
    where the reference is finite and a number where it is NaN are rejected."""
    model = model_of(contract, key, "nan", dtype)
    torch_dtype = case("nan", dtype).torch_dtype
    finite, nan = model.ref.isfinite(), model.ref.isnan()
    assert finite.any() and nan.any(), "the case must hold finite and NaN reference values"
    ref = model.ref.to(torch.float32).to(torch_dtype)
    assert bool(accepted(ref, model).all())
    top = torch.finfo(torch_dtype).max
    for bound, toward in ((model.hi, float("inf")), (model.lo, float("-inf"))):
        exact = finite & representable(bound, torch_dtype)
        assert exact[finite].float().mean() > 0.9, "the model's bounds are values of the dtype"
        assert bool(accepted(torch.where(exact, bound, model.ref).to(torch.float32).to(torch_dtype), model).all())
        checked = exact & (bound.abs() < top)
        in_dtype = bound.to(torch.float32).to(torch_dtype)
        past = torch.nextafter(in_dtype, torch.full_like(in_dtype, toward))
        assert not bool(accepted(past, model)[checked].any()), f"one step past {'hi' if toward > 0 else 'lo'} accepted"
    for wrong in (float("nan"), float("inf"), float("-inf")):
        got = torch.where(finite, torch.full_like(ref, wrong), ref)
        assert not bool(accepted(got, model)[finite].any()), f"{wrong} accepted where the reference is finite"
    assert not bool(accepted(torch.where(nan, torch.zeros_like(ref), ref), model)[nan].any())


# --- the contracts told apart ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("key", KEYS, ids="-".join)
@pytest.mark.parametrize("contract", CONTRACTS)
def test_each_contract_rejects_the_others_where_they_differ(contract, key, dtype):
    """In bf16 and fp16 (the dtypes whose bits carry the roundings) every other contract's emulation has
    elements outside this contract's model, except where the two are one function: partial RoPE under
    two-boundaries, fp32-through and every-op-rounded (the contract's rotation, the same bits)."""
    model = model_of(contract, key, "canonical", dtype)
    for other in CONTRACTS:
        if other == contract:
            continue
        got, own = emulated(other, key, "canonical", dtype), emulated(contract, key, "canonical", dtype)
        if key[0] == "partial_rope" and {contract, other} <= SAME_ROTATION:
            assert torch.equal(bits(got), bits(own)), (contract, other)
            continue
        check = model.judge(got)
        assert not torch.equal(bits(got), bits(own)) and check.violations > 0, f"{other} inside {contract}: {check}"


@pytest.mark.parametrize("key", KEYS, ids="-".join)
@pytest.mark.parametrize("contract", CONTRACTS)
def test_fp32_tells_only_the_tables_apart(contract, key):
    """In fp32 the norms' roundings are FP32 ones, within each other's error models: two-boundaries,
    fp32-through and every-op-rounded accept each other's emulations there; bf16 tables move a rotation's
    result by far more than FP32's error and stay apart from them."""
    model = model_of(contract, key, "canonical", "float32")
    for other in CONTRACTS:
        check = model.judge(emulated(other, key, "canonical", "float32"))
        apart = (contract == "bf16-tables") != (other == "bf16-tables")
        assert (check.violations > 0) == apart, f"{other} against {contract}: {check}"


def fp32_through_implementation(x, cos, sin, rotary, eps, grad):
    """A newcomer's fp32-through q norm + rope in plain torch (the normalized row kept FP32 into the
    rotation, one cast at the end) and its autograd input gradient."""
    xg = x.detach().clone().requires_grad_()
    d, half = x.shape[-1], rotary // 2
    y = F.rms_norm(xg.float(), (d,), eps=eps)
    c, s = cos[:, None, :, :half], sin[:, None, :, :half]
    a, b = y[..., d - rotary :: 2], y[..., d - rotary + 1 :: 2]
    out = torch.cat((y[..., : d - rotary], torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)), -1)
    out = out.to(x.dtype)
    (dx,) = torch.autograd.grad(out, xg, grad)
    return out.detach(), dx


def test_newcomer_fp32_through_conforms_to_fp32_through_and_not_to_two_boundaries():
    """The fp32-through implementation is inside the fp32-through model on every case, forward and
    backward, and outside the two-boundaries model in bf16 and fp16 (both directions); dsrope's kernel
    (two-boundaries) the other way round."""
    from dsrope import qnorm_rope_triton

    for dtype in DTYPES:
        for kind in KINDS:
            c, (x, cos, sin, grad) = case(kind, dtype), inputs(kind, dtype)
            out, dx = fp32_through_implementation(x, cos, sin, c.rotary, c.eps, grad)
            for key, got in ((("qnorm_rope", "forward"), out), (("qnorm_rope", "backward"), dx)):
                check = model_of("fp32-through", key, kind, dtype).judge(got)
                assert check.violations == 0, f"{key} {kind} {dtype}: {check}"
                if kind == "canonical" and dtype != "float32":
                    assert model_of("two-boundaries", key, kind, dtype).judge(got).violations > 0, (key, dtype)
    for dtype in ("bfloat16", "float16"):
        c, (x, cos, sin, grad) = case("canonical", dtype), inputs("canonical", dtype)
        xg = x.detach().clone().requires_grad_()
        out = qnorm_rope_triton(xg, cos, sin, c.rotary, c.eps)
        (dx,) = torch.autograd.grad(out, xg, grad)
        for key, got in ((("qnorm_rope", "forward"), out), (("qnorm_rope", "backward"), dx)):
            assert model_of("two-boundaries", key, "canonical", dtype).judge(got).violations == 0, (key, dtype)
            assert model_of("fp32-through", key, "canonical", dtype).judge(got).violations > 0, (key, dtype)


def test_bf16_tables_backward_is_the_two_boundaries_backward_on_rounded_tables():
    for dtype in DTYPES:
        c, (x, cos, sin, grad) = case("canonical", dtype), inputs("canonical", dtype)
        rounded = cos.bfloat16().float(), sin.bfloat16().float()
        plain = semantics.qnorm_backward("two-boundaries")(x, *rounded, c.rotary, c.eps, grad)
        assert torch.equal(bits(emulated("bf16-tables", ("qnorm_rope", "backward"), "canonical", dtype)), bits(plain))


# --- the references themselves -------------------------------------------------------------------------------


def test_fp32_through_reference_is_the_correctly_rounded_exact_function():
    """mpmath at 200 bits: out = rnd(r (a c - b s)) on the pairs and rnd(x r) elsewhere, r = 1/sqrt(mean(x^2)
    + eps) exact; the model's reference equals it bit for bit (bf16 and fp16, a few DSV4 rows)."""
    for dtype in ("bfloat16", "float16"):
        c, (x, cos, sin, _) = case("canonical", dtype), inputs("canonical", dtype)
        x, cos, sin = x[:1, :1], cos[:1], sin[:1]
        ref = contracts.forward(x, cos, sin, c.rotary, c.eps, "fp32-through").out.ref
        d, r_ = x.shape[-1], c.rotary
        with mpmath.workprec(200):
            for t in range(x.shape[2]):
                row = [mpmath.mpf(float(v)) for v in x[0, 0, t].double()]
                r = 1 / mpmath.sqrt(mpmath.fsum(v * v for v in row) / d + mpmath.mpf(c.eps))
                want = [mp_round(v * r, x.dtype) for v in row]
                for k in range(r_ // 2):
                    cs, sn = mpmath.mpf(float(cos[0, t, k])), mpmath.mpf(float(sin[0, t, k]))
                    a, b = row[d - r_ + 2 * k], row[d - r_ + 2 * k + 1]
                    want[d - r_ + 2 * k] = mp_round(r * (a * cs - b * sn), x.dtype)
                    want[d - r_ + 2 * k + 1] = mp_round(r * (a * sn + b * cs), x.dtype)
                assert ref[0, 0, t].tolist() == want, (dtype, t)


def test_fp32_through_backward_is_the_no_boundary_2_gradient():
    """Autograd through the fp32-through chain is the no-boundary-2 emulation bit for bit, and the model's
    reference is reference/qnorm_rope.py's FP64 no-boundary-2 formula (two codes, one function)."""
    for dtype in DTYPES:
        c, (x, cos, sin, grad) = case("canonical", dtype), inputs("canonical", dtype)
        _, dx = fp32_through_implementation(x, cos, sin, c.rotary, c.eps, grad)
        no_boundary_2 = semantics.qnorm_backward("no-boundary-2")(x, cos, sin, c.rotary, c.eps, grad)
        assert torch.equal(bits(dx), bits(no_boundary_2))
        model = contracts.backward(x, grad, cos, sin, c.rotary, c.eps, "fp32-through").dx
        assert torch.equal(model.ref, qnorm_rope.backward_no_boundary2(x, grad, cos, sin, c.rotary, c.eps))


def test_every_op_rounded_norm_reference_is_the_chain_with_exact_operations():
    """mpmath at 200 bits, op by op: q = rnd(rnd32(x^2)), m = rnd(rnd32(sum q / D)), z = rnd(rnd32(m +
    eps32)), rs = rnd(rnd32(1/sqrt(z))), y = rnd(rnd32(x rs)): the model's normalized row equals it."""
    for dtype in DTYPES:
        c, (x, cos, sin, _) = case("canonical", dtype), inputs("canonical", dtype)
        x = x[:1, :2]
        y = contracts.forward(x, cos[:1], sin[:1], c.rotary, c.eps, "every-op-rounded").normalized.ref

        def stored(v, dtype=x.dtype):
            return mpmath.mpf(mp_round(mpmath.mpf(mp_round(v, torch.float32)), dtype))

        eps32 = mpmath.mpf(mp_round(mpmath.mpf(c.eps), torch.float32))
        with mpmath.workprec(200):
            for h in range(x.shape[1]):
                for t in range(x.shape[2]):
                    row = [mpmath.mpf(float(v)) for v in x[0, h, t].double()]
                    q = [stored(v * v) for v in row]
                    rs = stored(1 / mpmath.sqrt(stored(stored(mpmath.fsum(q) / len(row)) + eps32)))
                    assert y[0, h, t].tolist() == [float(stored(v * rs)) for v in row], (dtype, h, t)


def official_chain(x, cos, sin, rotary, eps):
    """DeepSeek's eager q norm as its code reads, in x.dtype, then the FP32 rotation cast back."""
    return eager_partial_rope(x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps), cos, sin, rotary)


@pytest.mark.parametrize("dtype", DTYPES)
def test_official_chain_under_autograd_is_inside_every_op_rounded(dtype):
    """The official code run by torch on the CPU (x.dtype tensors, autograd) on DSV4 rows, where torch's
    vectorized ops compute each op in FP32 and round it once: inside the every-op-rounded model forward
    and backward, and (bf16, fp32) the emulation's bits; fp16's pow(rs, 3) rounds once on the CPU (the
    GPU's base * base * base rounds each product), which the model also allows."""
    c = Case(name="official", shape=(2, 4, 16, 512), rotary=64, dtype=dtype, values=Seeded(31), grad_layout=CONTIGUOUS)
    x, cos, sin, grad = c.build("cpu")
    xg = x.detach().clone().requires_grad_()
    out = official_chain(xg, cos, sin, c.rotary, c.eps)
    (dx,) = torch.autograd.grad(out, xg, grad)
    assert contracts.forward(x, cos, sin, c.rotary, c.eps, "every-op-rounded").out.judge(out).violations == 0
    check = contracts.backward(x, grad, cos, sin, c.rotary, c.eps, "every-op-rounded").dx.judge(dx)
    assert check.violations == 0, str(check)
    emulation = semantics.qnorm_backward("every-op-rounded")(x, cos, sin, c.rotary, c.eps, grad)
    if dtype != "float16":
        assert torch.equal(bits(dx), bits(emulation))


def official_chain_fp32_variant(x, cos, sin, rotary, eps, sequential=False, rs_steps=0):
    """The official chain in fp32 as a GPU may run it: the row's squares summed one by one in FP32 from
    the largest down (`sequential`: a reduction order far less accurate than torch's), and rs the
    correctly rounded 1/sqrt(z) moved `rs_steps` FP32 steps (rsqrtf is within 2 ulp)."""
    square = x * x
    if sequential:
        total = torch.zeros(x.shape[:-1] + (1,), dtype=torch.float32)
        for column in square.sort(-1, descending=True).values.unbind(-1):
            total = total + column[..., None]
    else:
        total = square.sum(-1, keepdim=True)
    rs = (1 / torch.sqrt((total / x.shape[-1] + eps).double())).float()
    toward = torch.full_like(rs, float("inf") if rs_steps > 0 else 0.0)
    for _ in range(abs(rs_steps)):
        rs = torch.nextafter(rs, toward)
    return eager_partial_rope(x * rs, cos, sin, rotary)


def test_every_op_rounded_allows_any_fp32_reduction_order_and_a_gpu_rsqrt():
    """fp32 shows the FP32 allowances. Canonical rows: the squares summed one by one from the largest
    (an error of order D u, where torch's pairwise sum has a few u) are inside. Tiny rows (squares 0, so
    z = eps exactly and nothing but the rsqrt moves rs): rs one FP32 step off the correctly rounded one
    either way is inside (a GPU's rsqrtf), 40 steps are not. (In bf16 and fp16 no value z of the dtype has
    1/sqrt(z) within 2^-22 of a rounding midpoint: rs is one value.)"""
    c, (x, cos, sin, _) = case("canonical", "float32"), inputs("canonical", "float32")
    model = contracts.forward(x, cos, sin, c.rotary, c.eps, "every-op-rounded").out
    sequential = official_chain_fp32_variant(x, cos, sin, c.rotary, c.eps, sequential=True)
    assert not torch.equal(bits(sequential), bits(official_chain_fp32_variant(x, cos, sin, c.rotary, c.eps)))
    assert model.judge(sequential).violations == 0
    c, (x, cos, sin, _) = case("tiny", "float32"), inputs("tiny", "float32")
    model = contracts.forward(x, cos, sin, c.rotary, c.eps, "every-op-rounded").out
    for steps in (-1, 1):
        check = model.judge(official_chain_fp32_variant(x, cos, sin, c.rotary, c.eps, rs_steps=steps))
        assert check.violations == 0, str(check)
    assert model.judge(official_chain_fp32_variant(x, cos, sin, c.rotary, c.eps, rs_steps=40)).violations > 0


def test_every_op_rounded_keeps_the_official_chains_overflow():
    """fp16 squares past 65504 are inf: the row's mean is inf, rs 0 and the output 0; in the backward
    rs^3 = 0 times an infinite row sum, or 0 times an infinite 2x, is NaN: the model's reference says so
    where the emulation does, and a kernel that returns the two-boundaries values there is rejected."""
    c, (x, cos, sin, grad) = case("huge", "float16"), inputs("huge", "float16")
    fwd = contracts.forward(x, cos, sin, c.rotary, c.eps, "every-op-rounded")
    assert bool((fwd.rstd.ref == 0).all()) and bool((fwd.out.ref == 0).all())
    bwd = contracts.backward(x, grad, cos, sin, c.rotary, c.eps, "every-op-rounded").dx
    emulation = emulated("every-op-rounded", ("qnorm_rope", "backward"), "huge", "float16")
    assert bool(bwd.ref.isnan().any()) and torch.equal(bwd.ref.isnan(), emulation.isnan())
    assert fwd.out.judge(emulated("two-boundaries", ("qnorm_rope", "forward"), "huge", "float16")).violations > 0


def test_every_op_rounded_stored_is_monotone_and_flushes():
    """stored() rounds through FP32 (a double rounding the interval follows), and an FP32 result below
    2^-126 may be flushed: 0 joins the interval only there."""
    v = torch.tensor([1 + 2.0**-8 + 2.0**-30, 2.0**-130, -(2.0**-130), 3.0], dtype=torch.float64)
    assert every_op_rounded.stored(v, torch.bfloat16)[0] == 1.0  # rnd32 lands on the bf16 midpoint: even
    assert round_nearest(v, torch.bfloat16)[0] == 1 + 2.0**-7  # rounded once it goes up
    lo, hi = every_op_rounded.stored_interval(v, v, torch.bfloat16)
    assert lo.tolist() == [1.0, 0.0, -(2.0**-130), 3.0] and hi.tolist() == [1.0, 2.0**-130, 0.0, 3.0]


def test_every_op_rounded_holds_autograds_rstd_cubed_underflow_in_fp32():
    """fp32 rows of rms 2^45 to 2^55: autograd through F.rms_norm (the two-boundaries emulation) forms
    rstd^3 below FP32's normal range and falls outside the two-boundaries backward model; every-op-rounded
    is that chain (F.rms_norm's composite in fp32) and holds it."""
    c = Case(
        name="huge",
        shape=SHAPE,
        rotary=ROTARY,
        dtype="float32",
        values=Drawn(Values("huge", 41), Tables("angles", 42), Values("normal", 43)),
        grad_layout=CONTIGUOUS,
    )
    x, cos, sin, grad = c.build("cpu")
    dx = semantics.qnorm_backward("two-boundaries")(x, cos, sin, c.rotary, c.eps, grad)
    assert contracts.backward(x, grad, cos, sin, c.rotary, c.eps).dx.judge(dx).violations > 0
    check = contracts.backward(x, grad, cos, sin, c.rotary, c.eps, "every-op-rounded").dx.judge(dx)
    assert check.violations == 0, str(check)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_on_the_gpu_each_chain_is_inside_its_contract(dtype):
    """On CUDA: the official code under autograd (torch's GPU ops, rsqrtf, its reductions) inside
    every-op-rounded; the plain-torch fp32-through chain inside fp32-through; dsrope's kernels inside
    two-boundaries and, in bf16/fp16, outside fp32-through and every-op-rounded."""
    from dsrope import qnorm_rope_triton
    from dsrope_gate.inputs import DEVICE

    c = Case(name="gpu", shape=(2, 16, 8, 512), rotary=64, dtype=dtype, values=Seeded(51), grad_layout=CONTIGUOUS)
    x, cos, sin, grad = c.build("cpu")
    on = [t.to(DEVICE) for t in (x, cos, sin, grad)]
    models = {
        name: (
            contracts.forward(x, cos, sin, c.rotary, c.eps, name).out,
            contracts.backward(x, grad, cos, sin, c.rotary, c.eps, name).dx,
        )
        for name in ("two-boundaries", "fp32-through", "every-op-rounded")
    }

    def official(xg, cos, sin):
        return official_chain(xg, cos, sin, c.rotary, c.eps)

    def dsrope(xg, cos, sin):
        return qnorm_rope_triton(xg, cos, sin, c.rotary, c.eps)

    for name, run in (("every-op-rounded", official), ("two-boundaries", dsrope)):
        xg = on[0].detach().clone().requires_grad_()
        out = run(xg, on[1], on[2])
        (dx,) = torch.autograd.grad(out, xg, on[3])
        for model, got in zip(models[name], (out, dx), strict=True):
            check = model.judge(got.cpu())
            assert check.violations == 0, f"{name} {dtype}: {check}"
        if name == "two-boundaries" and dtype != "float32":
            for other in ("fp32-through", "every-op-rounded"):
                assert models[other][0].judge(out.cpu()).violations > 0, other
    out, dx = fp32_through_implementation(on[0], on[1], on[2], c.rotary, c.eps, on[3])
    for model, got in zip(models["fp32-through"], (out, dx), strict=True):
        check = model.judge(got.cpu())
        assert check.violations == 0, f"fp32-through {dtype}: {check}"
