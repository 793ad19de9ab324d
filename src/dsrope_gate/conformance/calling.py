"""Calling one implementation on one case: its output, its input gradient, what it wrote into its inputs,
whether its output is token-major, and how it failed (refused, crashed, a wrong output)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from dsrope_gate.cases import Inputs

# Errors that say no: an implementation refusing an input. Any other exception is a crash.
REFUSALS = (ValueError, TypeError, NotImplementedError, AssertionError)


@dataclass
class Call:
    status: str  # ok | refused | crashed | wrong output | wrong signature
    out: torch.Tensor | None = None
    dx: torch.Tensor | None = None
    error: str = ""
    wrote: list = field(default_factory=list)  # inputs whose storage changed
    has_backward: bool = False
    token_major: bool = False


def storage_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """A copy of every byte of t's storage (gaps included), to see whether a call wrote into it."""
    storage = t.untyped_storage()
    if not storage.nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).clone()


def same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """t's values, strides and storage offset in a copy of its whole storage (gaps included)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), t.shape, t.stride()
    )


def error_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def output_problem(out, x: torch.Tensor) -> str:
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, expected a tensor"
    if tuple(out.shape) != tuple(x.shape) or out.dtype != x.dtype:
        return f"returned {list(out.shape)} {out.dtype}, expected {list(x.shape)} {x.dtype}"
    return ""


def signature_problem(op, fn) -> str:
    """Why fn cannot be called with op's arguments (the TypeError a call would raise before fn runs), or ""
    (also where Python cannot read fn's signature: a builtin, a C extension)."""
    arguments = op.signature[op.signature.index("(") + 1 : -1].split(", ")
    try:
        parameters = inspect.signature(fn)
    except (TypeError, ValueError):
        return ""
    try:
        parameters.bind(*arguments)
    except TypeError as e:
        return f"takes {parameters}, called as {op.signature}: {e}"
    return ""


def call(op, fn, case, inputs: Inputs) -> Call:
    """The forward on copies of the case's inputs in their layouts (nothing requires grad; a write into
    any of them is seen, and the case's own tensors stay as they were for the next implementation),
    then the backward on a fresh x that requires grad, when the output carries a grad_fn."""
    import numpy

    wrong = signature_problem(op, fn)
    if wrong:  # a TypeError that says nothing of the input: not a refusal
        return Call("wrong signature", error=wrong)
    copies = Inputs(*(same_layout_copy(t) for t in inputs))
    watched = {"x": copies.x, "cos": copies.cos, "sin": copies.sin}
    before = {k: storage_bytes(v) for k, v in watched.items()}
    try:
        with numpy.errstate(all="ignore"), torch.no_grad():
            out = op.call(fn, case, copies.x, copies)
    except REFUSALS as e:
        return Call("refused", error=error_line(e))
    except Exception as e:  # an implementation's crash is a finding, never the command's
        return Call("crashed", error=error_line(e))
    wrote = [k for k, v in watched.items() if before[k] is not None and not torch.equal(before[k], storage_bytes(v))]
    problem = output_problem(out, inputs.x)
    if problem:
        return Call("wrong output", error=problem, wrote=wrote)
    result = Call("ok", out=out.detach().clone(), wrote=wrote, token_major=out.transpose(1, 2).is_contiguous())
    x = same_layout_copy(inputs.x).requires_grad_(True)
    try:
        with numpy.errstate(all="ignore"), torch.enable_grad():
            y = op.call(fn, case, x, inputs)
            if isinstance(y, torch.Tensor) and y.grad_fn is not None:
                result.has_backward = True
                (dx,) = torch.autograd.grad(y, x, inputs.grad) if x.numel() else (torch.empty_like(x),)
                result.dx = dx.detach()
    except Exception as e:
        result.error = "backward: " + error_line(e)
    return result
