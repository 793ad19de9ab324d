"""The interpreter's float conversions, as dsrope fixes them (dsrope.interpreter), against ml_dtypes.

Compiled kernels round fp32 -> bf16 to nearest even and widen bf16 -> fp32 exactly; the CPU
suite checks bf16 results bit for bit only because the interpreter does the same after the fix.
These tests run the conversion through a real Triton kernel."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import dsrope  # noqa: F401  (importing dsrope installs the fix in interpreter mode)
from dsrope_gate.inputs import DEVICE

pytestmark = pytest.mark.skipif(DEVICE.type == "cuda", reason="interpreter only: the GPU converts natively")


@triton.jit
def _narrow(src, dst, n, BLOCK: tl.constexpr, TRUNCATE: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + i, mask=i < n)
    if TRUNCATE:
        tl.store(dst + i, v.to(tl.bfloat16, fp_downcast_rounding="rtz"), mask=i < n)
    else:
        tl.store(dst + i, v.to(tl.bfloat16), mask=i < n)


@triton.jit
def _widen(src, dst, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + i, tl.load(src + i, mask=i < n).to(tl.float32), mask=i < n)


def fp32_samples():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    # every tie: low 16 bits exactly 0x8000, with even and odd high halves; and their neighbours
    high = rng.integers(0, 1 << 16, 4096, dtype=np.uint64).astype(np.uint32) << 16
    ties = np.concatenate([high | 0x8000, high | 0x7FFF, high | 0x8001])
    special = np.array(
        [0x7F7FFFFF, 0x7F7F8000, 0xFF7F8000, 0x00000001, 0x80008000, 0x7FC00001, 0x7F800000], dtype=np.uint32
    )
    return np.concatenate([bits, ties, special]).view(np.float32)


def run_narrow(values, truncate):
    src = torch.from_numpy(values.copy())
    dst = torch.empty(len(values), dtype=torch.bfloat16)
    _narrow[(triton.cdiv(len(values), 4096),)](src, dst, len(values), BLOCK=4096, TRUNCATE=truncate)
    return dst.view(torch.int16).numpy().view(np.uint16)


def test_fp32_to_bf16_rounds_to_nearest_even():
    values = fp32_samples()
    got = run_narrow(values, truncate=False)
    want = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = np.isfinite(values)
    assert np.array_equal(got[finite], want[finite]), f"{int((got != want)[finite].sum())} conversions differ"
    assert np.isnan(got[~np.isfinite(values) & np.isnan(values)].view(ml_dtypes.bfloat16).astype(np.float32)).all()


def test_explicit_rtz_still_truncates():
    values = fp32_samples()
    finite = np.isfinite(values) & (np.abs(values) >= np.float32(2.0**-126))
    got = run_narrow(values, truncate=True)[finite]
    assert np.array_equal(got, (values[finite].view(np.uint32) >> 16).astype(np.uint16))


def test_bf16_to_fp32_is_exact_for_every_bf16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    src = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
    dst = torch.empty(1 << 16, dtype=torch.float32)
    _widen[(16,)](src, dst, 1 << 16, BLOCK=4096)
    got = dst.numpy().view(np.uint32)
    want = bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    nan = np.isnan(bits.view(ml_dtypes.bfloat16).astype(np.float32))
    assert np.array_equal(got[~nan], want[~nan]), f"{int((got != want)[~nan].sum())} widenings differ"
    assert np.isnan(dst.numpy()[nan]).all()
