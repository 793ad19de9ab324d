"""Input checks of every kernel family (the one place they live), and the interpreter's rounding fix.

Every check runs before any launch and names the argument and what was expected.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np
import torch
import triton
import triton.language as tl


def _triton_interprets() -> bool:
    """Whether `@triton.jit` builds interpreted functions here, asked as Triton asks it at decoration time:
    its runtime knob where it has one (`triton.knobs`, in 3.6 and 3.9: TRITON_INTERPRET read as a boolean,
    1, true, on, yes), else the variable equal to "1" (triton 3.2 has no knobs)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Read once at import, the answer the kernels were built with (they are decorated at import too).
INTERPRET = _triton_interprets()

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QKV_FORMATS = ("bshd", "thd")  # rope_utils: [batch, sequence, heads, channels] or packed [tokens, heads, channels]


def check_device(name: str, t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and INTERPRET:
        return
    expected = "a CUDA tensor (or a CPU tensor with TRITON_INTERPRET=1)"
    raise ValueError(f"{name}: expected {expected}, got a tensor on {t.device}")


DSV4_RANKS = {4: "[batch, heads, sequence, channels]"}


def check_tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def check_x(x, name: str = "x", ranks: dict[int, str] = DSV4_RANKS, even_channels=False, device=True):
    """x: a bf16/fp16/fp32 tensor of one of `ranks` (rank -> layout words); with even_channels an even
    channel count; with device on CUDA (or the CPU in interpreter mode)."""
    check_tensor(name, x)
    if x.dim() not in ranks:
        expected = " or ".join(f"rank {r} {words}" for r, words in ranks.items())
        raise ValueError(f"{name}: expected {expected}, got shape {list(x.shape)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype bfloat16, float16 or float32, got {x.dtype}")
    if even_channels and x.shape[-1] % 2:
        raise ValueError(f"{name}: expected an even channel count, got {x.shape[-1]}")
    if device:
        check_device(name, x)
    return x


def check_writable(x: torch.Tensor, name: str = "x") -> None:
    """x can be written in place: no two of its elements share memory. Sufficient check: with the dims
    of size > 1 sorted by stride, each stride is at least the extent of the dims inside it (a stride 0,
    an expanded view, or an overlapping as_strided view fails it)."""
    dims = sorted((stride, size) for stride, size in zip(x.stride(), x.shape, strict=True) if size > 1)
    extent = 1
    for stride, size in dims:
        if stride < extent:
            raise ValueError(
                f"{name}: expected a tensor whose elements do not share memory (to be written in place), "
                f"got shape {list(x.shape)} with strides {list(x.stride())}"
            )
        extent = stride * size
    return None


def check_rotary(rotary, channels: int) -> None:
    if isinstance(rotary, bool) or not isinstance(rotary, int):
        raise TypeError(f"rotary: expected an int, got {type(rotary).__name__}")
    if rotary <= 0 or rotary % 2 or rotary > channels:
        raise ValueError(f"rotary: expected a positive even int <= channels ({channels}), got {rotary}")


def check_table(name: str, t, x: torch.Tensor, rotary: int) -> None:
    """cos/sin: FP32 [B, S, rotary] on x's device, not requiring grad."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    expected = (x.shape[0], x.shape[2], rotary)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name}: expected shape [batch, sequence, rotary] = {list(expected)}, got {list(t.shape)}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected dtype float32, got {t.dtype}")
    if t.requires_grad:
        raise ValueError(f"{name}: expected a fixed table (requires_grad=False); the kernels give it no gradient")
    if t.device != x.device:
        raise ValueError(f"{name}: expected a tensor on x's device {x.device}, got {t.device}")


def check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return value


def check_real(name: str, value, above: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= above:
        raise ValueError(f"{name}: expected a finite number > {above}, got {value}")
    return float(value)


def check_format(name: str, value) -> str:
    if value not in QKV_FORMATS:
        raise ValueError(f"{name}: expected 'bshd' or 'thd', got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value


def check_complex_table(freqs_cis, x: torch.Tensor, tokens: tuple[int, ...], qkv_format: str) -> None:
    """The complex format: complex64 [*tokens, channels/2] on x's device."""
    check_tensor("freqs_cis", freqs_cis)
    if freqs_cis.dtype != torch.complex64:
        raise TypeError(f"freqs_cis: expected dtype complex64, got {freqs_cis.dtype}")
    expected = [*tokens, x.shape[-1] // 2]
    if list(freqs_cis.shape) != expected:
        words = "[batch, sequence, channels/2]" if qkv_format == "bshd" else "[tokens, channels/2]"
        raise ValueError(f"freqs_cis: expected shape {words} = {expected}, got {list(freqs_cis.shape)}")
    if freqs_cis.device != x.device:
        raise ValueError(f"freqs_cis: expected a tensor on x's device {x.device}, got {freqs_cis.device}")


def check_eps(eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    if not 0 < eps < math.inf:  # also NaN; comparisons, unlike math.isfinite, trace under torch.compile
        raise ValueError(f"eps: expected a finite float > 0, got {eps}")


def wants_autograd(x: torch.Tensor) -> bool:
    """Whether a call must go through the autograd.Function: a gradient is wanted, or forward-mode AD
    is active (a dual tensor does not require grad; the Function then refuses it, having no jvp,
    where the bare launcher would silently drop the tangent)."""
    return (x.requires_grad and torch.is_grad_enabled()) or torch.autograd.forward_ad._current_level >= 0


def token_major_empty(x: torch.Tensor) -> torch.Tensor:
    """A fresh [B, H, S, D] tensor in contiguous [B, S, H, D] storage (torch's contiguous strides of
    [B, S, H, D], transposed). One allocation call: torch.empty(...).transpose(1, 2) took 3x the
    host time (docs/perf.md, decode)."""
    b, h, s, d = x.shape
    stride_h = max(d, 1)
    stride_s = max(h, 1) * stride_h
    return x.new_empty_strided((b, h, s, d), (max(s, 1) * stride_s, stride_h, stride_s, 1))


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.cache  # once per geometry: a decode call is dominated by host time (docs/perf.md)
def tile_config(dim: int, elements: int, warps: int = 1) -> dict:
    """Rows per program (M), channel tile (BLOCK) and warps for a kernel walking rows of `dim`.

    The interpreter pays per program: big blocks on CPU. On the H200 small programs won
    (tools/sweep.py, docs/perf.md): `elements` per program and `warps`, 1024 x 1 warp for partial
    RoPE, 2048 x 1 for the QNorm forward, 1024 x 2 for its backward. The dict is shared between
    calls: read it, never change it.
    """
    block = next_pow2(dim)
    if INTERPRET:
        return dict(M=max(1, min(64, (1 << 16) // block)), BLOCK=block)
    return dict(M=max(1, elements // block), BLOCK=block, num_warps=warps if block <= 1024 else max(warps, 4))


@functools.cache
def _programs_wanted(device_index: int) -> int:
    return 2 * torch.cuda.get_device_properties(device_index).multi_processor_count


def spread_rows(config: dict, rows: int, device: torch.device) -> dict:
    """`config` with fewer rows per program where there are too few rows to give every SM two
    programs (decode: S = 1, B * H rows), for partial RoPE: the smallest launches are latency-bound.
    Each output element is computed by the same instructions for any M (no reduction), so the bits
    do not change. Not for the QNorm kernels: there M changes a row's sum of squares in the last bit
    on some rows (H200, 2026-12-03: one row per program gave rstd 1 ulp apart on rows of the
    huge-fp16 and huge-fp32 goldens), and a row's result must not depend on how many rows share its
    launch. BLOCK >= 256 only (the decode geometry, D = 512), where it was measured."""
    m = config["M"]
    if INTERPRET or config["BLOCK"] < 256 or rows >= m * _programs_wanted(device.index):
        return config
    per_program = max(1, rows // _programs_wanted(device.index))
    while m > per_program:
        m //= 2
    return {**config, "M": m}


COMPILED = tl.constexpr(not INTERPRET)


@triton.jit
def rotate_lane(own, cos, signed_mate_times_sin):
    """own * cos + signed_mate_times_sin, one lane of the partial RoPE rotation (first of a pair:
    a*c + (-b*s); second: b*c + a*s), in both partial RoPE kernels (out of place and in place).

    Compiled: fma(own, cos, rn(signed mate * sin)), the fused product written out. Left to the compiler,
    which product of `own * cos + mate * sin` is fused is a choice made per specialization: on the H200
    (triton 3.6, 2026-12-04) the in-place kernel fused the other product of a second lane on an fp16 x
    with channel stride 2 and stored 1 ulp away from the out-of-place kernel where the two forms straddle
    a rounding midpoint (tests/test_rope_inplace.py::test_layouts_property, the same element on 300 of
    300 runs). The out-of-place kernel's PTX for sm_90 is the same with this function as with the
    compiler's choice on all 288 specializations of tools/rotation_ptx.py (triton 3.6), so its bits do
    not change; the in-place kernel's differs on 68 of 192. Triton 3.9 warns that 3.10 stops fusing by
    default; written out, the rotation keeps its one fused product there too. The interpreter rounds both
    products and the sum to FP32 (docs/contract.md), as before.
    """
    if COMPILED:
        return tl.fma(own, cos, signed_mate_times_sin)
    else:
        return own * cos + signed_mate_times_sin


@triton.jit
def swap_pairs(t, M: tl.constexpr, BLOCK: tl.constexpr):
    """t [M, BLOCK] with the two lanes of every pair (2i, 2i+1) exchanged, in registers.

    A pair partner loaded a second time from memory is a gather: one scalar load and one 64-bit
    address per lane, which cost the backward most of its issue slots and registers (SASS for
    sm_90: 64 of its 98 loads per thread at 8 rows). A split and a join stay in registers.
    """
    first, second = tl.split(tl.reshape(t, (M, BLOCK // 2, 2)))
    return tl.reshape(tl.join(second, first), (M, BLOCK))


@triton.jit
def pair_table(
    table, row_offset, stride, row_ok, FIRST: tl.constexpr, PAIRS: tl.constexpr, M: tl.constexpr, BLOCK: tl.constexpr
):
    """table[row_offset + k * stride] for the pair k = i - FIRST of lanes (2i, 2i+1), as [M, BLOCK].

    One contiguous load per pair, then the entry given to both of its lanes; 0 outside 0 <= k < PAIRS.
    """
    k = tl.arange(0, BLOCK // 2).to(tl.int64)[None, :] - FIRST
    entry = tl.load(table + row_offset[:, None] + k * stride, mask=row_ok[:, None] & (k >= 0) & (k < PAIRS), other=0.0)
    return tl.reshape(tl.join(entry, entry), (M, BLOCK))


# --- Triton interpreter: round fp32 -> bf16 to nearest even, as the GPU does -------------------
# Measured (docs/contract.md; triton 3.6 and 3.9): the interpreter converts fp32 -> bf16 by dropping the low
# 16 bits (truncation), and even its "rtne" path rounds ties away from zero. Compiled kernels round
# to nearest even. Without this fix, every bf16 result computed on CPU would differ from the GPU's
# in about half of the elements, and the CPU suite could not check bf16 rounding at all. Only the
# default/"rtne" fp32 -> bf16 conversion is replaced; an explicit "rtz" keeps truncating, so a
# kernel that asks for truncation still truncates. The interpreter also widens bf16 subnormals to
# fp32 wrongly (-1.3775e-39 became -1.0286e-38); widening is exact (the bf16 bits are the high half
# of the fp32 bits), so that conversion is replaced too.


def _fp32_to_bf16_rne(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x40
    out = np.where(np.isnan(values), quiet_nan, rounded)
    return out.astype(np.uint16)


def install_interpreter_rounding() -> bool:
    """Make the interpreter's fp32 -> bf16 conversion round to nearest even. Idempotent."""
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._convert_float, "_dsrope_rne", False):
        return True
    truncating = interpreter._convert_float
    rtz = interpreter._ir.ROUNDING_MODE.RTZ

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode != rtz:
            return _fp32_to_bf16_rne(input)
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            return np.ascontiguousarray(input).view(np.uint16).astype(np.uint32) << 16
        return truncating(input, input_dtype, output_dtype, rounding_mode)

    convert_float._dsrope_rne = True
    convert_float._dsrope_truncating = truncating
    interpreter._convert_float = convert_float
    return True
