"""The bench's targets (dsrope_dev.perf_targets): a row at its limit meets the target, a row one float step
past it is MISSED, and a number that was not measured (NaN) is MISSED. Exact: the values are ratios of
times chosen so that the ratio is the limit itself (x / 1.0 == x) or its float neighbour. And the yardstick
of the QNorm forward's prefill target (dsrope_dev.timing.rows_copy) copies the rows it should."""

from __future__ import annotations

import math

import pytest

from dsrope_dev import perf_targets


def decode_row(kernel, b, h, graph_ratio=1.0, compile_ratio=0.5, inplace_ratio=1.0):
    row = dict(kernel=kernel, B=b, H=h, triton_us=compile_ratio, compile_us=1.0)
    row |= dict(triton_graph_us=graph_ratio, copy_graph_us=1.0)
    if kernel == "partial_rope":
        row |= dict(inplace_graph_us=inplace_ratio, inplace_copy_graph_us=1.0)
    return row


def missed(targets, what):
    (target,) = [t for t in targets if what in t.what]
    return target.missed


def past(limit, at_most=True):
    return math.nextafter(limit, math.inf if at_most else -math.inf)


@pytest.mark.parametrize(("b", "h", "limit"), [(1, 64, 1.05 * 1.18), (8, 128, 1.05 * 1.20), (256, 128, 1.15)])
def test_qnorm_decode_limit_is_the_floor_margin_or_the_copy_ratio(b, h, limit):
    """max(1.15, 1.05 x the floor in docs/performance.md): 1.239 and 1.26 over the floor, 1.15 where the floor is
    below copy_ (B = 256, H = 128: 0.97)."""
    assert perf_targets.qnorm_decode_limit(b, h) == limit
    row = decode_row("qnorm_rope", b, h, limit)
    assert not missed(perf_targets.decode_targets(row), "copy_")
    assert missed(perf_targets.decode_targets(decode_row("qnorm_rope", b, h, past(limit))), "copy_")


def test_qnorm_decode_limit_of_an_unmeasured_row_is_the_copy_ratio():
    assert perf_targets.qnorm_decode_limit(2, 64) == perf_targets.DECODE_COPY_RATIO == 1.15


@pytest.mark.parametrize("form", ["out of place", "in place"])
def test_partial_rope_decode_at_and_past_its_copy_ratio(form):
    limit = perf_targets.DECODE_COPY_RATIO
    key = "graph_ratio" if form == "out of place" else "inplace_ratio"
    at = perf_targets.decode_targets(decode_row("partial_rope", 1, 64, **{key: limit}))
    beyond = perf_targets.decode_targets(decode_row("partial_rope", 1, 64, **{key: past(limit)}))
    assert not any(t.missed for t in at)
    assert [t.what.split(" / ")[0] for t in beyond if t.missed] == [f"ours {form}"]


def test_decode_slower_than_torch_compile_is_missed():
    assert not missed(perf_targets.decode_targets(decode_row("qnorm_rope", 1, 64, 1.0, compile_ratio=1.0)), "compile")
    row = decode_row("qnorm_rope", 1, 64, 1.0, compile_ratio=past(1.0))
    assert missed(perf_targets.decode_targets(row), "compile")


@pytest.mark.parametrize(
    ("kernel", "direction", "share"),
    [("partial_rope", "forward", 0.90), ("partial_rope", "backward", 0.90), ("qnorm_rope", "forward", 0.95)],
)
def test_prefill_share_at_and_one_step_below(kernel, direction, share):
    row = dict(kernel=kernel, direction=direction, B=1, H=64, S=4096, layout="token_major", copy_fraction=share)
    (at,) = perf_targets.prefill_targets(row)
    (below,) = perf_targets.prefill_targets(dict(row, copy_fraction=past(share, at_most=False)))
    assert (at.limit, at.missed, below.missed) == (share, False, True)


def test_not_measured_is_missed_and_the_summary_counts_it():
    row = dict(kernel="partial_rope", direction="forward", B=1, H=64, S=4096, layout="head_major")
    targets = perf_targets.prefill_targets(dict(row, copy_fraction=float("nan")))
    targets += perf_targets.prefill_targets(dict(row, copy_fraction=0.97))
    assert [t.missed for t in targets] == [True, False]
    lines = perf_targets.table(targets)
    assert lines[2].endswith("| not measured | MISSED |") and lines[3].endswith("| 0.970 |  |")
    assert perf_targets.summary(targets).splitlines()[0] == "targets: 1 of 2 met, 1 MISSED"


def test_no_compile_target_where_torch_compile_was_not_timed():
    row = decode_row("qnorm_rope", 1, 64)
    del row["compile_us"]
    assert [t.what.split(" ")[2] for t in perf_targets.decode_targets(row)] == ["copy_,"]


@pytest.mark.parametrize(("bound", "limit"), [(0.944, 0.98 * 0.944), (0.97, 0.95), (0.999, 0.95)])
def test_qnorm_prefill_limit_is_the_share_or_its_bound(bound, limit):
    """0.95 of copy, or 0.98 of the row's bound where that is lower (the head-major row: a copy in the forward's
    addressing at 0.944 of copy on an H100); at the limit met, one float step below MISSED."""
    assert perf_targets.qnorm_prefill_limit(bound) == limit
    row = dict(kernel="qnorm_rope", direction="forward", B=1, H=64, S=4096, layout="head_major")
    row |= dict(copy_fraction=limit, rows_copy_fraction=bound)
    (at,) = perf_targets.prefill_targets(row)
    (below,) = perf_targets.prefill_targets(dict(row, copy_fraction=past(limit, at_most=False)))
    assert (at.limit, at.missed, below.missed) == (limit, False, True)
    assert ("of a copy in its addressing" in at.what) == (limit < 0.95)


def test_qnorm_prefill_without_its_bound_holds_the_share():
    """An unmeasured bound (NaN, or a row without one) leaves the 0.95 target: it never loosens it."""
    assert perf_targets.qnorm_prefill_limit(float("nan")) == 0.95
    row = dict(kernel="qnorm_rope", direction="forward", B=1, H=64, S=4096, layout="head_major", copy_fraction=0.94)
    for extra in ({}, {"rows_copy_fraction": float("nan")}):
        (target,) = perf_targets.prefill_targets(row | extra)
        assert (target.limit, target.missed) == (0.95, True)


@pytest.mark.parametrize("layout", ["token_major", "head_major"])
def test_rows_copy_stores_x_rows_token_major(layout):
    """The bench's yardstick for the QNorm forward's prefill rows copies x's rows, in token-major order, at the
    forward's tile (on the device the suite runs on: a Triton launch on CPU tensors fails outside the interpreter)."""
    import torch

    from dsrope_dev.timing import rows_copy
    from dsrope_gate.inputs import DEVICE

    b, h, s, d = 2, 3, 5, 16
    if layout == "token_major":
        x = torch.randn(b, s, h, d, dtype=torch.bfloat16).transpose(1, 2)
    else:
        x = torch.randn(b, h, s, d, dtype=torch.bfloat16)
    x_dev = x.to(DEVICE)
    if layout == "token_major":  # .to keeps the strides of a dense permuted tensor; the test needs them kept
        assert x_dev.stride() == x.stride()
    out = torch.full((x.numel(),), float("nan"), dtype=x.dtype, device=DEVICE)
    rows_copy(x_dev, out)
    assert torch.equal(out.cpu().view(torch.int16), x.transpose(1, 2).reshape(-1).view(torch.int16))
