"""dsrope: the DeepSeek RoPE kernel set in Triton."""

from dsrope.interpreter import INTERPRET, install_interpreter_rounding

if INTERPRET:
    install_interpreter_rounding()

from dsrope import rope_utils  # noqa: E402, F401
from dsrope.qnorm_rope import qnorm_rope_triton  # noqa: E402
from dsrope.rope import apply_partial_rope_triton, apply_partial_rope_triton_  # noqa: E402

__all__ = ["apply_partial_rope_triton", "apply_partial_rope_triton_", "qnorm_rope_triton"]
