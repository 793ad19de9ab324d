"""Property suite: hypothesis-drawn shapes, layouts and values (dsrope_gate.strategies) for every
public kernel, forward and backward.

Properties, for apply_partial_rope_triton (rope), qnorm_rope_triton (qnorm) and rope_utils'
apply_rotary_emb / apply_rotary_emb_half_split (v3), forward and backward:
  within_model       every element inside the reference's interval (reference/rope.py,
                     reference/qnorm_rope.py, reference/rope_utils.py: zero violations; the
                     saved rstd and a trainable table's gradient too); the result in token-major
                     storage (docs/contract.md; v3: apply_rotary_emb's documented contiguous result); no
                     input storage, NaN gaps included, is written.
  layout_invariant   a strided input (x, cos, sin, grad) and a contiguous copy of it give
                     bit-identical results; on a GPU, results that pass through a reduction
                     (QNorm rows, a V3 table gradient) only where the reduced values agree,
                     within the model elsewhere (REDUCTION_ORDER_FOLLOWS_LAYOUT).
  inverse            forward RoPE then the inverse rotation returns the input within the model
                     of `round_trip_bound` (qnorm: returns the normalized row y).
  scaling            qnorm only: x * 2**k gives the same output where that is exact in FP32
                     (see `exact_scaling_rows`).

Seeded faults this suite catches with the ci profile (kernel copies, run by hand): head stride
taken as S*D, S and H strides swapped, cos batch stride taken as contiguous, the gradient's
storage offset dropped in the backward, the pair mask of qnorm's tile dropped. Dropping the pair
mask in partial RoPE's tile changes no stored value (those lanes are never stored): only a
memory checker sees its out-of-bounds reads.

A failure prints (hypothesis `note`) a command that replays the failing case:
    python -m tests.test_properties <test name> "<Case(...)>" [k=<int>]
Hypothesis profiles (conftest.py): ci (default on CPU), dev, nightly, gpu; choose one with
`--hypothesis-profile`, e.g. `nox -s tests -- --hypothesis-profile nightly`.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from unittest import mock

import torch

if __name__ == "__main__":
    # a standalone replay does not load conftest.py; the kernels must see this before import
    from dsrope_gate.startup import interpret_without_gpu

    interpret_without_gpu()

from dsrope_reference import qnorm_rope as qmodel  # noqa: E402
from dsrope_reference import rope_utils as v3_model  # noqa: E402
from dsrope_reference.floats import (  # noqa: E402
    U32,
    bits,  # noqa: E402
    fmt,
)
from dsrope_reference.rope import partial_rope, tables  # noqa: E402
from hypothesis import event, example, given, note, target  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dsrope.rope  # noqa: E402
from dsrope import apply_partial_rope_triton, qnorm_rope_triton  # noqa: E402
from dsrope.rope_utils import apply_rotary_emb, apply_rotary_emb_half_split  # noqa: E402
from dsrope_gate.cases import Case, Drawn, Tables, Values  # noqa: E402
from dsrope_gate.inputs import DEVICE  # noqa: E402
from dsrope_gate.layouts import Layout, layout_of  # noqa: E402
from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE  # noqa: E402
from dsrope_gate.strategies import V3Case, cases, v3_cases  # noqa: E402

TINY32 = 2.0**-126  # smallest normal FP32
# On a GPU, an FP32 reduction associates in the order the compiled code chose for its access
# pattern: Triton picks the per-thread vector width from the strides and alignment it specializes
# on, and torch's CUDA reductions follow the memory layout. Reduced results (the QNorm rstd and
# backward mean, the V3 table gradient) may then differ in the last bits between a strided and a
# contiguous input (seen on the H200: channel stride 2 moved rstd by 1 ulp). The interpreter and
# the CPU reduce in one order whatever the strides.
REDUCTION_ORDER_FOLLOWS_LAYOUT = DEVICE.type != "cpu"
FLT_MAX = float(torch.finfo(torch.float32).max)


# --- helpers ------------------------------------------------------------------------------------


def build(case, test: str, **extra):
    """The case's tensors; records the one-line reproduction shown if the property fails."""
    args = " ".join(f"{k}={v!r}" for k, v in extra.items())
    note(f"reproduce: python -m tests.test_properties {test} {shlex.quote(repr(case))} {args}".rstrip())
    tensors = case.build(DEVICE)
    names = ("x", "cos", "sin", "grad") if len(tensors) == 4 else ("x", "table", "grad")
    note("; ".join(f"{n} {layout_of(t)}" for n, t in zip(names, tensors, strict=True)))
    return tensors


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """All of t's storage as a 1-D tensor (the NaN gaps of a strided view included)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (n,))


def assert_identical(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape, f"{what}: shapes {list(a.shape)} vs {list(b.shape)}"
    differ = bits(a) != bits(b)
    if differ.any():
        i = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(
            f"{what}: {int(differ.sum())} of {differ.numel()} elements differ, first at {list(i)}: "
            f"{a.detach().cpu()[i].item()!r} vs {b.detach().cpu()[i].item()!r} "
            f"(bits {bits(a)[i].item() & 0xFFFFFFFF:#x} vs {bits(b)[i].item() & 0xFFFFFFFF:#x})"
        )


class Untouched:
    """Snapshots of tensors' whole storage; `check()` asserts none was written."""

    def __init__(self, **tensors):
        self.tensors = tensors
        self.before = {k: whole_storage(t).clone() for k, t in tensors.items()}

    def check(self):
        for k, t in self.tensors.items():
            assert_identical(whole_storage(t), self.before[k], f"storage of {k} written by the kernel")


def assert_token_major(out: torch.Tensor, x: torch.Tensor, what: str) -> None:
    assert out.shape == x.shape and out.dtype == x.dtype, f"{what}: {layout_of(out)} for x {layout_of(x)}"
    assert out.transpose(1, 2).is_contiguous(), f"{what} not token-major: {layout_of(out)}"
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), f"{what} aliases x"


def assert_within(check, what: str) -> None:
    target(float(check.max_ulp), label=f"max ulp, {what}")
    assert check.violations == 0, f"{what}: {check}"


def rope(x, cos, sin, rotary):
    out = apply_partial_rope_triton(x, cos, sin, rotary)
    assert_token_major(out, x, "rope output")
    return out


def rope_backward(x, cos, sin, rotary, grad):
    x = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(apply_partial_rope_triton(x, cos, sin, rotary), x, grad)
    assert_token_major(dx, x, "rope input gradient")
    return dx


def qnorm(x, cos, sin, rotary, eps):
    """Output and the saved FP32 rstd [B*S*H] (read from the autograd node: docs/contract.md fixes it)."""
    x = x.detach().requires_grad_()
    out = qnorm_rope_triton(x, cos, sin, rotary, eps)
    assert_token_major(out, x, "qnorm output")
    rows = x.shape[0] * x.shape[1] * x.shape[2]
    saved = [t for t in out.grad_fn.saved_tensors if t.dim() == 1 and t.numel() == rows]
    assert len(saved) == 1 and saved[0].dtype == torch.float32, "expected one saved FP32 rstd [B*S*H]"
    return out, saved[0]


def qnorm_backward(x, cos, sin, rotary, eps, grad):
    x = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(qnorm_rope_triton(x, cos, sin, rotary, eps), x, grad)
    assert_token_major(dx, x, "qnorm input gradient")
    return dx


def contiguous(*ts):
    # .contiguous() of a broadcast (stride 0) or strided tensor is a dense row-major copy
    return [t.contiguous() for t in ts]


# --- examples found once (kept: they replay first, in every profile) ------------------------------

# D = 3: partial RoPE takes only an even D (the round trip must slice channel 0 off), and the
# 4-lane tile's last lane reads the table's NaN tail when the pair mask is dropped (fault Q5).
ODD_CHANNELS = Case(
    name="odd channels",
    shape=(1, 1, 1, 3),
    rotary=2,
    dtype="bfloat16",
    values=Drawn(x=Values(kind="normal", seed=0), tables=Tables(kind="angles", seed=0), grad=Values("normal", 0)),
    x_layout=Layout(order=(0, 2, 1, 3)),
    grad_layout=Layout(order=(0, 2, 1, 3)),
    cos_layout=Layout(),
    sin_layout=Layout(),
)
# half-split of a permuted x: its result follows x's layout (no contiguity is promised)
HALF_SPLIT_PERMUTED = V3Case(
    lead=(1, 2),
    heads=1,
    dim=4,
    pairing="half_split",
    dtype="bfloat16",
    x=Values(kind="normal", seed=0),
    x_layout=Layout(order=(0, 2, 3, 1)),
    table=Tables(kind="angles", seed=0),
    table_layout=Layout(),
    trainable=False,
    grad=Values(kind="normal", seed=0),
    grad_layout=Layout(),
)

# Found by the suite (eager path of a trainable table): a table read with a channel step gave other
# FP32 bits than its contiguous copy (torch's strided and vectorized complex products round
# differently); an upstream gradient at an odd storage offset crashed the backward (view_as_real's
# backward views it as complex).
STRIDED_TRAINABLE_TABLE = V3Case(
    lead=(1,),
    heads=0,
    dim=64,
    pairing="interleaved",
    dtype="float32",
    x=Values(kind="normal", seed=0),
    x_layout=Layout(order=(0, 1)),
    table=Tables(kind="angles", seed=0),
    table_layout=Layout(order=(0, 1), step=(1, 2)),
    trainable=True,
    grad=Values(kind="normal", seed=0),
    grad_layout=Layout(order=(0, 1)),
)
ODD_OFFSET_GRADIENT = replace(
    STRIDED_TRAINABLE_TABLE,
    dim=2,
    table_layout=Layout(order=(0, 1)),
    grad_layout=Layout(order=(0, 1), offset=1),
)


# --- partial RoPE ------------------------------------------------------------------------------


@given(case=cases(PARTIAL_ROPE))
def test_rope_forward_within_model(case):
    x, cos, sin, _ = build(case, "test_rope_forward_within_model")
    untouched = Untouched(x=x, cos=cos, sin=sin)
    out = rope(x, cos, sin, case.rotary)
    assert_within(partial_rope(x, cos, sin, case.rotary).judge(out), "rope forward")
    untouched.check()


@given(case=cases(PARTIAL_ROPE))
def test_rope_backward_within_model(case):
    x, cos, sin, grad = build(case, "test_rope_backward_within_model")
    untouched = Untouched(grad=grad, cos=cos, sin=sin)
    dx = rope_backward(x, cos, sin, case.rotary, grad)
    assert_within(partial_rope(grad, cos, sin, case.rotary, inverse=True).judge(dx), "rope backward")
    untouched.check()


@given(case=cases(PARTIAL_ROPE))
def test_rope_forms_agree(case):
    """The whole-row kernel (prefill launches) stores the split kernel's bits (decode launches, and
    every launch of this module: its rows are few), forward and backward (dsrope.rope.rotate_config)."""
    x, cos, sin, grad = build(case, "test_rope_forms_agree")
    split = rope(x, cos, sin, case.rotary), rope_backward(x, cos, sin, case.rotary, grad)
    with mock.patch.object(dsrope.rope, "SPLIT_ROWS", -1):
        whole_row = rope(x, cos, sin, case.rotary), rope_backward(x, cos, sin, case.rotary, grad)
    assert_identical(whole_row[0], split[0], "rope forward, whole-row kernel against split")
    assert_identical(whole_row[1], split[1], "rope backward, whole-row kernel against split")


@given(case=cases(PARTIAL_ROPE))
def test_rope_layout_invariant(case):
    x, cos, sin, grad = build(case, "test_rope_layout_invariant")
    xc, cc, sc, gc = contiguous(x, cos, sin, grad)
    assert_identical(rope(x, cos, sin, case.rotary), rope(xc, cc, sc, case.rotary), "rope forward")
    dx, dxc = rope_backward(x, cos, sin, case.rotary, grad), rope_backward(xc, cc, sc, case.rotary, gc)
    assert_identical(dx, dxc, "rope backward")


def round_trip_bound(a_mag, b_mag, c, s, dtype):
    """Bound on |back - x| for one pair after back = inverse(forward(x)), per output of the pair.

    Stated model: for a pair with magnitudes |a|, |b| <= P and table entries c, s (FP32, exact
    in FP64), K = |c| + |s|, q = c*c + s*s; u = 2**-24, u_d = 2**-p the unit roundoff of
    x.dtype, tau = half the smallest subnormal of x.dtype, T = 2**-126 (FP32 subnormals may be
    flushed: at most 4T per rotation output).
      forward: each output o = rnd(v + e), v the exact rotation, |v| <= K P, |e| <= 2u K P + 4T,
               so |o - v| <= d_o = (u_d + 2u (1 + u_d)) K P + tau + 4T.
      inverse: w = R^T o exactly equals q x + R^T (o - v), |R^T (o - v)| <= K d_o; the kernel's
               FP32 value is within 2u K (K P + d_o) + 4T of w, and its rounding to x.dtype
               adds u_d |w'| + tau, |w'| <= W = q |x| + K d_o + 2u K (K P + d_o) + 4T.
      |back - x| <= |q - 1| |x| + K d_o + 2u K (K P + d_o) + 4T + u_d W + tau.
    R^T R = q I exactly, so a table that is not a rotation (q != 1) is in the model too.
    Returns (bound for the first, bound for the second, where the bound applies: no overflow).
    """
    f = fmt(dtype)
    u_d = f.unit_roundoff
    tau = 2.0 ** (f.emin - f.precision)
    big_p = torch.maximum(a_mag, b_mag)
    k = c.abs() + s.abs()
    q = c * c + s * s
    d_o = (u_d + 2 * U32 * (1 + u_d)) * k * big_p + tau + 4 * TINY32
    inverse_err = 2 * U32 * k * (k * big_p + d_o) + 4 * TINY32

    def bound(mag):
        w = q * mag + k * d_o + inverse_err
        return ((q - 1).abs() * mag + k * d_o + inverse_err + u_d * w + tau) * (1 + 2.0**-40), w

    (first, w1), (second, w2) = bound(a_mag), bound(b_mag)
    finite = (k * big_p + d_o < f.max) & (torch.maximum(w1, w2) < f.max)
    return first, second, finite


def assert_round_trip(back, x_ref, x_width, x_mag, pairs, c, s, what, keep=None):
    """back (kernel) against x_ref (FP64), whose true value is within x_width of x_ref and at
    most x_mag in magnitude. pairs(t) -> (first, second): the channels of the rotated pairs, c
    and s their FP64 table entries (broadcasting against them); keep(t): the channels copied
    unchanged (must come back within x_width, i.e. exactly where x_width is 0)."""
    back64 = back.detach().to("cpu", torch.float64)
    if keep is not None:
        assert (keep(back64 - x_ref).abs() <= keep(x_width)).all(), f"{what}: pass-through channel changed"
    mag, ref, width, got = pairs(x_mag), pairs(x_ref), pairs(x_width), pairs(back64)
    first, second, finite = round_trip_bound(mag[0], mag[1], c, s, back.dtype)
    for i, (name, bound) in enumerate((("first", first), ("second", second))):
        allowed = bound + width[i]
        bad = finite & ~((got[i] - ref[i]).abs() <= allowed)
        if bad.any():
            at = tuple(bad.nonzero()[0].tolist())
            raise AssertionError(
                f"{what}: {int(bad.sum())} {name} channels of pairs off by more than the model, first at "
                f"pair index {list(at)}: back {got[i][at].item()!r}, input {ref[i][at].item()!r}, "
                f"allowed error {allowed[at].item()!r}"
            )
    event("round trip checked on all pairs" if finite.all() else "round trip: overflowing pairs left out")


def trailing_pairs(rotary):
    """docs/contract.md's pairs: channels (D-R+2k, D-R+2k+1); the leading D-R channels are kept."""
    pairs = lambda t: (t[..., t.shape[-1] - rotary :: 2], t[..., t.shape[-1] - rotary + 1 :: 2])
    keep = lambda t: t[..., : t.shape[-1] - rotary]
    return pairs, keep


@given(case=cases(PARTIAL_ROPE))
def test_rope_inverse_returns_input(case):
    """Forward, then the backward (the conjugate rotation) applied to the output: x again."""
    x, cos, sin, _ = build(case, "test_rope_inverse_returns_input")
    out = rope(x, cos, sin, case.rotary)
    back = rope_backward(x, cos, sin, case.rotary, out)
    x64 = x.detach().to("cpu", torch.float64)
    pairs, keep = trailing_pairs(case.rotary)
    c, s = tables(cos, sin, case.rotary)
    assert_round_trip(back, x64, torch.zeros_like(x64), x64.abs(), pairs, c, s, "rope round trip", keep)


# --- Q RMSNorm + RoPE ----------------------------------------------------------------------------


@given(case=cases(QNORM_ROPE))
def test_qnorm_forward_within_model(case):
    x, cos, sin, _ = build(case, "test_qnorm_forward_within_model")
    untouched = Untouched(x=x, cos=cos, sin=sin)
    out, rstd = qnorm(x, cos, sin, case.rotary, case.eps)
    model = qmodel.forward(x, cos, sin, case.rotary, case.eps)
    assert_within(model.out.judge(out), "qnorm forward")
    check = model.rstd.judge(rstd)
    assert check.violations == 0, f"saved rstd (token-major rows): {check}"
    untouched.check()


@given(case=cases(QNORM_ROPE))
@example(case=ODD_CHANNELS)
def test_qnorm_backward_within_model(case):
    x, cos, sin, grad = build(case, "test_qnorm_backward_within_model")
    untouched = Untouched(x=x, grad=grad, cos=cos, sin=sin)
    dx = qnorm_backward(x, cos, sin, case.rotary, case.eps, grad)
    assert_within(qmodel.backward(x, grad, cos, sin, case.rotary, case.eps).dx.judge(dx), "qnorm backward")
    untouched.check()


@given(case=cases(QNORM_ROPE))
def test_qnorm_layout_invariant(case):
    """Strided and contiguous inputs give the same bits (on CPU: everything). On a GPU the row
    reductions may associate differently (REDUCTION_ORDER_FOLLOWS_LAYOUT): there every row whose
    rstd has the same bits must have the same output bits (all that follows the sum is per
    element); the backward's mean is a reduction too, so dx is held to the model only, by
    test_qnorm_backward_within_model, which draws the same layouts."""
    x, cos, sin, grad = build(case, "test_qnorm_layout_invariant")
    xc, cc, sc, gc = contiguous(x, cos, sin, grad)
    r, eps = case.rotary, case.eps
    (out, rstd), (outc, rstdc) = qnorm(x, cos, sin, r, eps), qnorm(xc, cc, sc, r, eps)
    if REDUCTION_ORDER_FOLLOWS_LAYOUT:
        b, h, s, _ = x.shape
        same = (bits(rstd) == bits(rstdc)).view(b, s, h).transpose(1, 2).to(out.device)  # [B, H, S]
        event(f"rows with other rstd bits: {'none' if bool(same.all()) else 'some'}")
        assert_identical(out[same], outc[same], "qnorm forward, rows with the same rstd bits")
        return
    assert_identical(out, outc, "qnorm forward")
    assert_identical(rstd, rstdc, "qnorm saved rstd")
    dx, dxc = qnorm_backward(x, cos, sin, r, eps, grad), qnorm_backward(xc, cc, sc, r, eps, gc)
    assert_identical(dx, dxc, "qnorm backward")


@given(case=cases(QNORM_ROPE))
@example(case=ODD_CHANNELS)
def test_qnorm_then_inverse_rope_returns_normalized(case):
    """qnorm, then partial RoPE with the sine negated (the inverse rotation): the normalized row
    y = rnd(x * r) again, within round_trip_bound widened by y's own interval in the model."""
    x, cos, sin, _ = build(case, "test_qnorm_then_inverse_rope_returns_normalized")
    out, _ = qnorm(x, cos, sin, case.rotary, case.eps)
    odd = out.shape[-1] % 2  # partial RoPE takes an even D: leave channel 0 out (never rotated)
    back = rope(out[..., odd:], cos, -sin, case.rotary)
    y = qmodel.forward(x, cos, sin, case.rotary, case.eps).normalized
    width = torch.maximum(y.hi - y.ref, y.ref - y.lo)[..., odd:]
    magnitude = torch.maximum(y.lo.abs(), y.hi.abs())[..., odd:]
    pairs, keep = trailing_pairs(case.rotary)
    c, s = tables(cos, sin, case.rotary)
    what = "qnorm then inverse rope"
    assert_round_trip(back, y.ref[..., odd:], width, magnitude, pairs, c, s, what, keep)


def exact_scaling_rows(x64, x2_64, k, eps):
    """Rows [B, H, S] where x2 = 2**k x provably gives rstd2 = 2**-k rstd and the same y, out.

    In exact math r(2**k x) = 2**-k r(x) only when eps = 0, and FP32 keeps it only where every
    step commutes with the power of two. A sufficient condition, for an FP32 kernel that sums
    the squares in any order, rounds the mean (a division, which no FMA absorbs) and then adds
    eps, with an rsqrt that commutes with scaling by 4**k (any correctly rounded sqrt and
    division do: the interpreter computes 1/sqrt; a GPU's approximate rsqrt is assumed to):
      - 2**k x is exact in x.dtype for every element of the row;
      - every nonzero square x_i**2 and (2**k x_i)**2 is an FP32 normal number (>= 2**-126),
        so are all partial sums; the sum S stays below FLT_MAX / (1 + gamma(D));
      - the FP32 mean A >= S (1 - gamma(D+2)) / D is normal, and eps < half an ulp of A, for
        both rows: then A + eps rounds to A, and the scaled row's mean is exactly 4**k A.
    Then rstd2 = rsqrt(4**k A) = 2**-k rsqrt(A) and 2**k x * 2**-k r = x * r exactly, so y, the
    rotation and the output are the same bits.
    """
    d = x64.shape[-1]
    gamma = lambda n: n * U32 / (1 - n * U32)
    exact = (x2_64 == x64 * 2.0**k).all(-1)
    ok = exact
    for t in (x64, x2_64):
        nonzero = t != 0
        ok = ok & ((~nonzero) | (t.abs() >= 2.0**-63)).all(-1)
        squares = (t * t).sum(-1)
        ok = ok & (squares * (1 + gamma(d)) < FLT_MAX)
        mean_lo = squares * (1 - gamma(d + 2)) / d
        ok = ok & (mean_lo >= TINY32)
        half_ulp = torch.exp2(torch.floor(torch.log2(mean_lo.clamp(min=TINY32))) - 24)
        ok = ok & (eps < half_ulp)
    return ok


SCALING_CASES = cases(
    QNORM_ROPE, value_kinds=["normal", "mixed", "midpoint", "zero_rows", "huge"], eps=[1e-30, 2.0**-100, 1e-20]
)


@given(case=SCALING_CASES, k=st.sampled_from([1, -1, 2, -2, 3, -3, 6, -6]))
@example(case=replace(ODD_CHANNELS, eps=1e-30), k=1)
def test_qnorm_power_of_two_scaling(case, k):
    """x and 2**k x give the same output bits, rstd * 2**-k and dx * 2**-k, on the rows where
    exact_scaling_rows proves it. Backward: xhat = x r is the same product, so the mean and
    g' - xhat * mean are the same bits and dx2 = rnd(2**-k r * q) = 2**-k dx wherever no step
    leaves the normal range: checked on elements whose model interval, for both rows, lies
    within [2 N, MAX / 2] (N, MAX: smallest normal and largest value of x.dtype) with one sign."""
    from dsrope_gate.layouts import materialize

    x, cos, sin, grad = build(case, "test_qnorm_power_of_two_scaling", k=k)
    x64 = x.detach().to("cpu", torch.float64)
    x2 = materialize((x64 * 2.0**k).to(torch.float32).to(x.dtype).to(DEVICE), case.x_layout)
    x2_64 = x2.detach().to("cpu", torch.float64)
    rows = exact_scaling_rows(x64, x2_64, k, case.eps)
    event(f"rows provably exact: {'all' if rows.all() else 'some' if rows.any() else 'none'}")
    r, eps = case.rotary, case.eps
    (out, rstd), (out2, rstd2) = qnorm(x, cos, sin, r, eps), qnorm(x2, cos, sin, r, eps)
    assert_identical(out.detach().cpu()[rows], out2.detach().cpu()[rows], f"output of x vs 2**{k} x")
    token_rows = qmodel.token_major_rows(rows)
    scaled_rstd = (rstd.cpu()[token_rows].double() * 2.0**-k).float()
    assert_identical(scaled_rstd, rstd2.cpu()[token_rows], "rstd * 2**-k")

    dx, dx2 = qnorm_backward(x, cos, sin, r, eps, grad), qnorm_backward(x2, cos, sin, r, eps, grad)
    f = fmt(x.dtype)
    normal = 2.0**f.emin
    safe = rows[..., None].expand(dx.shape).clone()
    for xi in (x, x2):
        model = qmodel.backward(xi, grad, cos, sin, r, eps).dx
        lo, hi = model.lo, model.hi
        smallest, largest = torch.minimum(lo.abs(), hi.abs()), torch.maximum(lo.abs(), hi.abs())
        safe &= (lo * hi > 0) & (smallest >= 2 * normal) & (largest <= f.max / 2)
    scaled = (dx.detach().cpu().double()[safe] * 2.0**-k).to(torch.float32).to(x.dtype)
    assert_identical(scaled, dx2.detach().cpu()[safe], f"dx * 2**-k for x vs 2**{k} x")


# --- DeepSeek-V3 rope utilities -----------------------------------------------------------------


def v3(case: V3Case, x, table):
    """The function under test; its result has x's shape and dtype. apply_rotary_emb documents a
    contiguous result; apply_rotary_emb_half_split promises no layout (its result follows x's)."""
    if case.pairing == "interleaved":
        out = apply_rotary_emb(x, table, case.qkv_format, unsqueeze_dim=None if case.heads else 2)
        assert out.is_contiguous(), f"apply_rotary_emb result not contiguous: {layout_of(out)}"
    else:
        out = apply_rotary_emb_half_split(x, table, case.qkv_format)
    assert out.shape == x.shape and out.dtype == x.dtype, f"{layout_of(out)} for x {layout_of(x)}"
    return out


def v3_backward(case: V3Case, x, table, grad):
    """dx, and the table's gradient when it is trainable (else None)."""
    x = x.detach().requires_grad_()
    inputs = (x, table) if case.trainable else (x,)
    grads = torch.autograd.grad(v3(case, x, table), inputs, grad)
    assert grads[0].shape == x.shape and grads[0].dtype == x.dtype, f"dx {layout_of(grads[0])}"
    return grads[0], (grads[1] if case.trainable else None)


@given(case=v3_cases())
def test_v3_forward_within_model(case):
    x, table, _ = build(case, "test_v3_forward_within_model")
    untouched = Untouched(x=x, table=table.detach())
    out = v3(case, x, table)
    assert_within(v3_model.rotation(x, table, case.pairing).judge(out), f"{case.pairing} forward")
    untouched.check()


@given(case=v3_cases())
def test_v3_backward_within_model(case):
    """dx is the rotation of the upstream gradient by the conjugate table; a trainable table's
    gradient lies within reference/rope_utils.table_gradient's model."""
    x, table, grad = build(case, "test_v3_backward_within_model")
    dx, dtable = v3_backward(case, x, table, grad)
    model = v3_model.rotation(grad, table.detach().conj(), case.pairing)
    assert_within(model.judge(dx), f"{case.pairing} backward")
    if dtable is not None:
        d_cos, d_sin = v3_model.table_gradient(x, grad, table, case.pairing)
        assert_within(d_cos.judge(dtable.real), f"{case.pairing} d/dcos")
        assert_within(d_sin.judge(dtable.imag), f"{case.pairing} d/dsin")


@given(case=v3_cases())
@example(case=HALF_SPLIT_PERMUTED)
@example(case=STRIDED_TRAINABLE_TABLE)
@example(case=ODD_OFFSET_GRADIENT)
def test_v3_layout_invariant(case):
    """Strided and contiguous inputs give the same bits, except a trainable table's gradient on a
    GPU (a reduction: REDUCTION_ORDER_FOLLOWS_LAYOUT), which must then lie within its model."""
    x, table, grad = build(case, "test_v3_layout_invariant")
    xc, tc, gc = contiguous(x, table.detach(), grad)
    if case.trainable:
        tc.requires_grad_()
    assert_identical(v3(case, x, table), v3(case, xc, tc), f"{case.pairing} forward")
    (dx, dtable), (dxc, dtablec) = v3_backward(case, x, table, grad), v3_backward(case, xc, tc, gc)
    assert_identical(dx, dxc, f"{case.pairing} backward")
    if not case.trainable:
        return
    if not REDUCTION_ORDER_FOLLOWS_LAYOUT:
        assert_identical(torch.view_as_real(dtable), torch.view_as_real(dtablec), f"{case.pairing} table grad")
        return
    # the table gradient sums over heads (and batch, for a shared table): within the model instead
    d_cos, d_sin = v3_model.table_gradient(x, grad, table, case.pairing)
    assert_within(d_cos.judge(dtable.real), f"{case.pairing} d/dcos (strided)")
    assert_within(d_sin.judge(dtable.imag), f"{case.pairing} d/dsin (strided)")


@given(case=v3_cases())
def test_v3_inverse_returns_input(case):
    """Rotating the output by the conjugate table returns x within round_trip_bound."""
    x, table, _ = build(case, "test_v3_inverse_returns_input")
    back = v3(case, v3(case, x, table), table.conj())
    x64 = x.detach().to("cpu", torch.float64)
    c, s = v3_model.token_tables(table, x)
    pairs = lambda t: v3_model.split_pairs(t, case.pairing)
    assert_round_trip(back, x64, torch.zeros_like(x64), x64.abs(), pairs, c, s, f"{case.pairing} round trip")


def main(argv: list[str]) -> None:
    """Replay one case: python -m tests.test_properties <test name> "<Case(...)>" [name=value ...]."""
    import ast

    from hypothesis import Phase, settings

    name, source, *extra = argv
    names = {"Case": Case, "Drawn": Drawn, "V3Case": V3Case, "Values": Values, "Tables": Tables, "Layout": Layout}
    case = eval(source, names)
    kwargs = {k: ast.literal_eval(v) for k, v in (e.split("=", 1) for e in extra)}
    fixed = {k: st.just(v) for k, v in {"case": case, **kwargs}.items()}
    replay = given(**fixed)(globals()[name].hypothesis.inner_test)
    settings(max_examples=1, database=None, phases=[Phase.generate], deadline=None)(replay)()
    print(f"{name}: passed on {case!r} {kwargs or ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
