"""Start-up of every entry point (conftest.py, tools/, bench/): compiled kernels on a GPU, Triton's
interpreter on CPU, and the one answer to "are Triton kernels interpreted here?".

Triton decides when `@triton.jit` decorates a kernel whether it compiles or interprets, from the
variable TRITON_INTERPRET: an entry point calls `interpret_without_gpu()` before anything imports
dsrope (or another project's Triton code).
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    """Whether `@triton.jit` builds interpreted functions here, as Triton itself reads TRITON_INTERPRET."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def interpret_without_gpu() -> bool:
    """Set TRITON_INTERPRET=1 when no CUDA device is visible; return whether kernels are interpreted."""
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return interpreting()
