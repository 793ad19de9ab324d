"""Triton's interpreter as dsrope meets it: whether kernels are interpreted, and its bf16 rounding fixed.

`interpreting()` is the one answer to "are Triton kernels interpreted here?" for the whole project (the
kernels, the gate, the entry points). Triton decides it when `@triton.jit` decorates a function, from
TRITON_INTERPRET: set the variable before anything imports Triton code.

`install_interpreter_rounding()` makes the interpreter's fp32 -> bf16 conversion round to nearest even,
as compiled kernels do. `import dsrope` installs it in interpreter mode; the conformance command
installs it for any implementation it judges on the CPU. Measured (docs/contract.md; triton 3.6 and
3.9): the interpreter converts fp32 -> bf16 by dropping the low 16 bits (truncation), and even its
"rtne" path rounds ties away from zero. Without the fix, every bf16 result computed on CPU would differ
from the GPU's in about half of the elements, and the CPU suite could not check bf16 rounding at all.
Only the default/"rtne" fp32 -> bf16 conversion is replaced; an explicit "rtz" keeps truncating, so a
kernel that asks for truncation still truncates. The interpreter also widens bf16 subnormals to fp32
wrongly (-1.3775e-39 became -1.0286e-38); widening is exact (the bf16 bits are the high half of the
fp32 bits), so that conversion is replaced too.
"""

from __future__ import annotations

import os

import numpy as np
import triton


def interpreting() -> bool:
    """Whether `@triton.jit` builds interpreted functions here, asked as Triton asks it at decoration time:
    its runtime knob where it has one (`triton.knobs`, in 3.6 and 3.9: TRITON_INTERPRET read as a boolean,
    1, true, on, yes), else the variable equal to "1" (triton 3.2 has no knobs)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Read once at import, the answer the kernels were built with (they are decorated at import too).
INTERPRET = interpreting()


def fp32_to_bf16_rne(values: np.ndarray) -> np.ndarray:
    """The bf16 bits (uint16) of FP32 `values` rounded to nearest even; NaN stays a quiet NaN."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    quiet_nan = (bits >> 16) | 0x40
    out = np.where(np.isnan(values), quiet_nan, rounded)
    return out.astype(np.uint16)


def install_interpreter_rounding() -> bool:
    """Make the interpreter's fp32 -> bf16 conversion round to nearest even, and its bf16 -> fp32
    widening exact. Idempotent; returns True."""
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter._convert_float, "_dsrope_rne", False):
        return True
    truncating = interpreter._convert_float
    rtz = interpreter._ir.ROUNDING_MODE.RTZ

    def convert_float(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode != rtz:
            return fp32_to_bf16_rne(input)
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            return np.ascontiguousarray(input).view(np.uint16).astype(np.uint32) << 16
        return truncating(input, input_dtype, output_dtype, rounding_mode)

    convert_float._dsrope_rne = True
    convert_float._dsrope_truncating = truncating
    interpreter._convert_float = convert_float
    return True
