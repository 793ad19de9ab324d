"""The kernels write nothing outside their outputs and read the tables through the tables' own strides:
faults that the rest of the suite catches only by luck or only slowly (the mutation runner runs this
module first in every mutant's run).

No write outside the output (mutants rope.row_mask_missing, qnorm.row_mask_missing,
rope.channel_mask_long). Without this test those faults write past the end of the output buffer
and the CPU suite notices only when the corrupted heap happens to crash the interpreter (it did:
SIGABRT/SIGSEGV, not a failing test). Here the launchers' allocator `token_major_empty` hands out a
view into a larger buffer whose bands before and after the output hold random bits; the row count
is not a multiple of the rows per program and D is not a power of two, so a missing row mask on
the last block, or a channel mask reaching past D, writes into a band. The QNorm test runs an odd D - R
too (D = 21, R = 8), where lane 0 is the shift lane with no channel (c = -1) and must stay masked
(mutant qnorm.shift_lane_not_masked: it writes the channel before each row, before the output for the
first). Inputs are slices from the middle of larger buffers, so the reads such a fault makes, before
or past the end, stay inside memory the test owns.

Tables through their own strides (mutants rope.sin_read_with_cos_strides, qnorm.cos_batch_stride_ignored,
qnorm.forward_table_channel_stride_ignored, qnorm.backward_table_channel_stride_ignored): cos and sin
with per-batch values and two different layouts, neither with channel stride 1. Elsewhere the QNorm
tests use only broadcast contiguous tables and every sin shares cos's layout: those faults were
caught only by two golden cases and, for sin, by the property suite after minutes.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference import qnorm_rope as qmodel
from dsrope_reference.floats import bits
from dsrope_reference.rope import partial_rope

import dsrope.qnorm_rope
import dsrope.rope
from dsrope import apply_partial_rope_triton, qnorm_rope_triton
from dsrope_gate.inputs import DEVICE, DTYPES, laid_out, tables, values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, materialize

# At D = 20 a program covers at most 64 rows on either device: a band of 64 rows of twice D covers
# every write a missing row mask or a channel mask past D can make.
SHAPE, ROTARY = (1, 3, 11, 20), 8  # 33 rows; D = 20 < tile width 32
ODD_SHAPE = (1, 3, 11, 21)  # D - R = 13 odd: the QNorm kernels shift the channels by one lane


class GuardedOutputs:
    """Replaces `token_major_empty` in a kernel module; remembers each buffer and its bands."""

    def __init__(self, monkeypatch, module):
        self.made = []
        monkeypatch.setattr(module, "token_major_empty", self.alloc)

    def alloc(self, x):
        b, h, s, d = x.shape
        n, band = x.numel(), 64 * 2 * d
        buf = values((n + 2 * band,), x.dtype, seed=len(self.made) + 40).to(x.device)
        self.made.append((buf, buf.clone(), band, n))
        return buf[band : band + n].view(b, s, h, d).transpose(1, 2)

    def assert_bands_untouched(self, expected_buffers):
        assert len(self.made) == expected_buffers, "the launchers no longer allocate through token_major_empty"
        for buf, before, band, n in self.made:
            now, was = bits(buf), bits(before)
            for name, sl in (("before", slice(0, band)), ("after", slice(band + n, None))):
                changed = (now[sl] != was[sl]).nonzero().flatten()
                assert changed.numel() == 0, (
                    f"{changed.numel()} elements written {name} the output (first at band index {changed[:4].tolist()})"
                )


def assert_within(check, what):
    assert check.violations == 0, f"{what}: {check}"


def sliced_token_major(dtype, seed, shape=SHAPE):
    """x of `shape` as the middle batch of a token-major buffer with one more batch on each side."""
    b, h, s, d = shape
    full = materialize(values((b + 2, h, s, d), dtype, seed=seed).to(DEVICE), TOKEN_MAJOR)
    return full[1 : b + 1]


@pytest.mark.parametrize("form", ["split", "whole_row"])  # dsrope.rope.rotate_config's two kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_writes_nothing_outside_its_outputs(dtype, form, monkeypatch):
    if form == "whole_row":
        monkeypatch.setattr(dsrope.rope, "SPLIT_ROWS", -1)
    guard = GuardedOutputs(monkeypatch, dsrope.rope)
    x = sliced_token_major(dtype, seed=1).requires_grad_()
    g = sliced_token_major(dtype, seed=2)
    cos, sin = tables(SHAPE[0], SHAPE[2], ROTARY, seed=3)
    out = apply_partial_rope_triton(x, cos, sin, ROTARY)
    (dx,) = torch.autograd.grad(out, x, g)
    guard.assert_bands_untouched(2)
    assert_within(partial_rope(x, cos, sin, ROTARY).judge(out), "forward")
    assert_within(partial_rope(g, cos, sin, ROTARY, inverse=True).judge(dx), "backward")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_in_place_writes_nothing_outside_x(dtype):
    """In place, x is the middle batch of a token-major buffer: its 3 heads leave each token's head block
    part-full (mutant rope.inplace_head_mask_dropped rotates the next token's heads, past x for the last
    token, where a bare buffer's heap corrupts and the process dies instead of failing a test)."""
    b, h, s, d = SHAPE
    full = materialize(values((b + 2, h, s, d), dtype, seed=7).to(DEVICE), TOKEN_MAJOR)
    before = full.clone()
    cos, sin = tables(b, s, ROTARY, seed=8)
    dsrope.apply_partial_rope_triton_(full[1 : b + 1], cos, sin, ROTARY)
    for outside in (0, b + 1):
        assert torch.equal(bits(full[outside]), bits(before[outside])), f"batch {outside} of the buffer written"
    assert_within(partial_rope(before[1 : b + 1], cos, sin, ROTARY).judge(full[1 : b + 1]), "in place")


@pytest.mark.parametrize("shape", [SHAPE, ODD_SHAPE], ids=lambda s: f"D{s[-1]}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_qnorm_writes_nothing_outside_its_outputs(dtype, shape, monkeypatch):
    guard = GuardedOutputs(monkeypatch, dsrope.qnorm_rope)
    x = sliced_token_major(dtype, seed=4, shape=shape).requires_grad_()
    g = sliced_token_major(dtype, seed=5, shape=shape)
    cos, sin = tables(shape[0], shape[2], ROTARY, seed=6)
    out = qnorm_rope_triton(x, cos, sin, ROTARY, 1e-6)
    (dx,) = torch.autograd.grad(out, x, g)
    guard.assert_bands_untouched(2)
    assert_within(qmodel.forward(x, cos, sin, ROTARY, 1e-6).out.judge(out), "forward")
    assert_within(qmodel.backward(x, g, cos, sin, ROTARY, 1e-6).dx.judge(dx), "backward")


@pytest.mark.parametrize("kernel", ["rope", "qnorm"])
def test_tables_read_through_their_own_strides(kernel):
    shape, rotary = (2, 2, 3, 16), 8
    x = laid_out(shape, torch.bfloat16, TOKEN_MAJOR, seed=7).requires_grad_()
    g = laid_out(shape, torch.bfloat16, TOKEN_MAJOR, seed=8)
    c0, s0 = tables(2, 3, rotary, seed=9, per_batch=True)
    cos = materialize(c0, Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11))
    sin = materialize(s0, Layout(order=(1, 2, 0), pad=(2, 0, 5), offset=3))
    assert cos.stride() != sin.stride() and cos.stride(-1) != 1 and sin.stride(-1) != 1
    if kernel == "rope":
        out = apply_partial_rope_triton(x, cos, sin, rotary)
        (dx,) = torch.autograd.grad(out, x, g)
        assert_within(partial_rope(x, cos, sin, rotary).judge(out), "forward")
        assert_within(partial_rope(g, cos, sin, rotary, inverse=True).judge(dx), "backward")
    else:
        out = qnorm_rope_triton(x, cos, sin, rotary, 1e-6)
        (dx,) = torch.autograd.grad(out, x, g)
        assert_within(qmodel.forward(x, cos, sin, rotary, 1e-6).out.judge(out), "forward")
        assert_within(qmodel.backward(x, g, cos, sin, rotary, 1e-6).dx.judge(dx), "backward")
