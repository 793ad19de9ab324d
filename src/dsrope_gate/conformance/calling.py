"""Calling one implementation on one case: its output, its input gradient, what it wrote into its inputs,
whether its output is token-major, and how it failed (refused, crashed, a wrong output).

Every call gets fresh copies of every input (x, cos, sin and, for the backward, the incoming gradient) in
the case's layouts, gaps included, so nothing an implementation does reaches the case, the reference or
another implementation. Each copy's storage is compared byte for byte before and after the call: a write
into an input is reported with the tensor, the direction and the first changed element. An implementation
declared in place (`in_place=True`) rotates x itself: what it wrote into x's elements is the output judged,
and only the bytes between x's elements (its gaps) must stay as they were.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from dsrope_gate.cases import Inputs

# Errors that say no: an implementation refusing an input. Any other exception: it raised (a crash of the call;
# a crash of its process is dsrope_gate.conformance.isolation's).
REFUSALS = (ValueError, TypeError, NotImplementedError, AssertionError)


@dataclass
class Call:
    status: str  # ok | refused | raised | wrong output | wrong signature
    out: torch.Tensor | None = None
    dx: torch.Tensor | None = None
    error: str = ""
    writes: list = field(default_factory=list)  # write_record()s: inputs whose storage changed
    has_backward: bool = False
    token_major: bool = False


def storage_bytes(t: torch.Tensor) -> torch.Tensor | None:
    """A copy of every byte of t's storage (gaps included), on the CPU, to see whether a call wrote into it."""
    storage = t.untyped_storage()
    if not storage.nbytes():
        return None
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage).cpu().clone()


def same_layout_copy(t: torch.Tensor, device=None) -> torch.Tensor:
    """t's values, strides and storage offset in a copy of its whole storage (gaps included), on `device`
    (default: t's)."""
    storage = t.untyped_storage()
    elsewhere = device is not None and torch.device(device) != storage.device
    copy = storage.to(device=device) if elsewhere else storage.clone()  # .to() onto its own device is no copy
    return torch.empty(0, dtype=t.dtype, device=copy.device).set_(copy, t.storage_offset(), t.shape, t.stride())


def fresh(inputs: Inputs, device=None) -> Inputs:
    return Inputs(*(same_layout_copy(t, device) for t in inputs))


def _positions(t: torch.Tensor) -> torch.Tensor:
    """The storage element of every logical element of t (CPU, t's shape)."""
    count = t.untyped_storage().nbytes() // t.element_size()
    return torch.arange(count).as_strided(t.shape, t.stride(), t.storage_offset())


def _as_elements(raw: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    usable = raw[: raw.numel() // t.element_size() * t.element_size()]
    return usable.view(t.dtype)


def write_record(name: str, direction: str, before: torch.Tensor, after: torch.Tensor, t: torch.Tensor):
    """The first changed element of input `name` (storage bytes before/after a call), or None when none changed:
    its logical index (None for a byte between t's elements: a gap), its storage element, before and after."""
    changed = (before != after).nonzero()
    if not len(changed):
        return None
    element = int(changed[0]) // t.element_size()
    hits = (_positions(t) == element).nonzero()
    values = _as_elements(before, t), _as_elements(after, t)
    return {
        "tensor": name,
        "direction": direction,
        "index": [int(i) for i in hits[0]] if len(hits) else None,
        "storage_element": element,
        "before": values[0][element].item() if element < values[0].numel() else None,
        "after": values[1][element].item() if element < values[1].numel() else None,
        "changed_bytes": len(changed),
    }


def gaps_only(raw: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """raw (t's storage bytes) with every byte of t's own elements zeroed: what an in-place call must keep."""
    kept = raw.clone()
    size = t.element_size()
    covered = (_positions(t).flatten()[:, None] * size + torch.arange(size)).flatten()
    kept[covered[covered < kept.numel()]] = 0
    return kept


class Watch:
    """The storage bytes of named tensors before a call, to report writes after it. `elements_allowed`:
    names whose own elements the call may write (an in-place x): only their gaps are watched."""

    def __init__(self, tensors: dict, direction: str, elements_allowed=()):
        self.tensors, self.direction, self.allowed = tensors, direction, set(elements_allowed)
        self.before = {k: self._bytes(k, v) for k, v in tensors.items()}

    def _bytes(self, name, t):
        raw = storage_bytes(t)
        return gaps_only(raw, t) if raw is not None and name in self.allowed else raw

    def writes(self) -> list[dict]:
        found = []
        for name, t in self.tensors.items():
            after = self._bytes(name, t) if self.before[name] is not None else None
            if after is None or torch.equal(self.before[name], after):
                continue
            record = write_record(name, self.direction, self.before[name], after, t)
            if record:
                found.append(record)
        return found


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


def _forward(op, fn, case, inputs: Inputs, in_place: bool, device) -> Call:
    copies = fresh(inputs, device)
    watch = Watch({"x": copies.x, "cos": copies.cos, "sin": copies.sin}, "forward", ("x",) if in_place else ())
    try:
        import numpy

        with numpy.errstate(all="ignore"), torch.no_grad():
            out = op.call(fn, case, copies.x, copies)
    except REFUSALS as e:
        return Call("refused", error=error_line(e))
    except Exception as e:  # an implementation's crash is a finding, never the command's
        return Call("raised", error=error_line(e))
    writes = watch.writes()
    if in_place:
        out = copies.x  # what it wrote into x is its output, whatever it returned
    problem = output_problem(out, inputs.x)
    if problem:
        return Call("wrong output", error=problem, writes=writes)
    token_major = out.transpose(1, 2).is_contiguous()
    return Call("ok", out=out.detach().clone(), writes=writes, token_major=token_major)


def _backward(op, fn, case, inputs: Inputs, in_place: bool, device, result: Call) -> None:
    """The forward on a fresh x that requires grad, then autograd's input gradient for a fresh copy of the
    incoming gradient; an in-place implementation gets a non-leaf copy of x in the case's layout."""
    copies = fresh(inputs, device)
    leaf = copies.x.detach().clone().requires_grad_(True) if in_place else copies.x.requires_grad_(True)
    watched = {"x": leaf, "cos": copies.cos, "sin": copies.sin, "grad": copies.grad}
    watch = Watch(watched, "backward")
    try:
        import numpy

        with numpy.errstate(all="ignore"), torch.enable_grad():
            x = copies.x.copy_(leaf) if in_place else leaf
            copied = x.grad_fn
            y = op.call(fn, case, x, copies)
            if in_place:  # its output is x; unless its own op is on x's history, it has no backward
                y = x if x.grad_fn is not copied else None
            if isinstance(y, torch.Tensor) and y.grad_fn is not None:
                result.has_backward = True
                (dx,) = torch.autograd.grad(y, leaf, copies.grad) if leaf.numel() else (torch.empty_like(leaf),)
                result.dx = dx.detach()
    except Exception as e:
        result.error = "backward: " + error_line(e)
    result.writes += watch.writes()


def call(op, fn, case, inputs: Inputs, in_place: bool = False, device=None, started=None) -> Call:
    """The forward on fresh copies of the case's inputs in their layouts (nothing requires grad), then the
    backward on fresh copies again, x requiring grad, when the output carries a grad_fn. `device`: where the
    copies go (default: the inputs' device); `started(direction)` is told before each call (a time limit per
    call: dsrope_gate.conformance.isolation)."""
    wrong = signature_problem(op, fn)
    if wrong:  # a TypeError that says nothing of the input: not a refusal
        return Call("wrong signature", error=wrong)
    if started:
        started("forward")
    result = _forward(op, fn, case, inputs, in_place, device)
    if result.status != "ok":
        return result
    if started:
        started("backward")
    _backward(op, fn, case, inputs, in_place, device, result)
    return result
