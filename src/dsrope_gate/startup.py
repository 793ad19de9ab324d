"""Start-up of every entry point (conftest.py, tools/, bench/): compiled kernels on a GPU, Triton's
interpreter on CPU.

Triton decides when `@triton.jit` decorates a kernel whether it compiles or interprets, from the
variable TRITON_INTERPRET: an entry point calls `interpret_without_gpu()` before anything imports
dsrope (or another project's Triton code). Whether kernels are interpreted is answered in one place:
`dsrope.interpreter.interpreting()`.
"""

from __future__ import annotations

import os


def interpret_without_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when no CUDA device is visible; return whether kernels are interpreted."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    from dsrope.interpreter import interpreting  # after the variable is set: dsrope's kernels decorate on import

    return interpreting()
