"""Each implementation judged in a child process of its own, started with spawn: its crashes, exits, hangs and
CUDA faults end that child, never the judge.

The parent builds the cases and computes the reference once (on the CPU: it never touches CUDA, so no
child's fault can poison it); a child loads one implementation (a `Target`), receives each case's inputs
(CPU tensors in their layouts, pickled), runs its calls on fresh copies on the device and sends back its
outputs and what it wrote. Before each call the child says which one starts, so the parent holds every call
to `timeout` seconds. A child that dies (an exit status, a signal: SIGSEGV, SIGKILL of an out-of-memory
kill), a CUDA fault (the child's context is poisoned; it reports and stops) or a call past its time limit
becomes the implementation's outcome, `Death`, with the case and the call it was in; the cases it finished
are kept. What the child prints goes to stderr: the judge's stdout stays the verdict's.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

TIMEOUT = 600.0  # seconds per call: far beyond any sane implementation on these cases, CPU interpreter included
LOAD_TIMEOUT = 600.0  # seconds for a child to start and load its implementation (torch, triton, a peer's package)


@dataclass(frozen=True)
class Target:
    """One implementation to judge, as a child process can load it: `spec` (module.path:callable or
    path/to/file.py:callable), a preset's implementation (`preset`, its name, `name` the implementation's),
    or `fn`, a callable that pickles by reference (a module-level function). `in_place`: it rotates x itself
    and what it writes into x is its output."""

    name: str
    spec: str = ""
    preset: str = ""
    fn: Callable | None = None
    in_place: bool = False

    def load(self, op_name: str, device: str) -> Callable:
        if self.spec:
            from dsrope_gate.targets import load_target

            return load_target(self.spec)
        if self.preset:
            from dsrope_gate import presets

            found = [i for i in presets.load([self.preset], device, [op_name], _raise) if i.name == self.name]
            if not found:
                raise LookupError(f"preset {self.preset} has no implementation {self.name!r} of {op_name}")
            return found[0].fn
        return self.fn


def _raise(message: str):
    raise LookupError(message)


@dataclass
class Death:
    """How a child ended before its work was done: `reason` ("SIGSEGV", "exit status 3", "timed out after 600 s",
    "CUDA fault: ..."), in `case` (None: while loading) and `direction` (the call running)."""

    reason: str
    case: str | None = None
    direction: str | None = None

    @property
    def verdict(self) -> str:
        return "timed out" if self.reason.startswith("timed out") else "crashed"

    def __str__(self) -> str:
        where = f" in {self.case}" + (f" ({self.direction})" if self.direction else "") if self.case else " loading"
        return f"{self.reason}{where}"


def exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return name + (" (killed: out of memory?)" if -code == signal.SIGKILL else "")
    return f"exit status {code}"


class LoadError(Exception):
    """The child could not load the implementation (an import error, a missing callable): a usage error."""


class Child:
    """One spawned child judging one Target's calls; `call` returns a Call or raises ChildDied."""

    def __init__(self, target: Target, op_name: str, device: str, timeout: float = TIMEOUT):
        self.timeout, self.target = timeout, target
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        self.process = context.Process(
            target=serve, args=(child_end, target, op_name, device), name=f"dsrope-judge {target.name}", daemon=True
        )
        self.process.start()
        child_end.close()
        kind, payload = self._receive(None, None, max(self.timeout, LOAD_TIMEOUT))
        if kind == "load error":
            self.stop()
            raise LoadError(payload)
        self.device_name, self.signature_problem = payload

    def _receive(self, case, direction, limit):
        """The child's next message; ChildDied when it ends or outlives `limit` seconds."""
        deadline = time.monotonic() + limit
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.process.kill()
                self.process.join()
                raise ChildDied(Death(f"timed out after {limit:g} s", case, direction))
            try:
                if self.conn.poll(min(left, 0.5)):
                    return pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):  # the child's end closed: it died
                self.process.join(10)
                raise ChildDied(Death(exit_reason(self.process.exitcode), case, direction)) from None

    def _send(self, message) -> None:
        # plain pickle: tensors travel as copies (multiprocessing's own pickler would share their memory)
        self.conn.send_bytes(pickle.dumps(message))

    def call(self, case, inputs):
        self._send(("call", case, tuple(inputs)))
        direction = None
        while True:
            kind, payload = self._receive(case.name, direction, self.timeout)
            if kind == "started":
                direction = payload
            elif kind == "fault":
                self.stop()
                raise ChildDied(Death(payload, case.name, direction))
            else:
                return payload

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self._send(("stop", None, None))
            except OSError:
                pass
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        self.conn.close()


class ChildDied(Exception):
    def __init__(self, death: Death):
        super().__init__(str(death))
        self.death = death


def _cuda_poisoned() -> str:
    """The error a poisoned CUDA context gives, or "" (no CUDA used, or still usable)."""
    import torch

    if not torch.cuda.is_initialized():
        return ""
    try:
        torch.cuda.synchronize()
    except Exception as e:  # an illegal memory access, a device-side assert: every later call would fail
        return f"CUDA fault: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return ""


def serve(conn, target: Target, op_name: str, device: str) -> None:
    """The child: load the target, then run each case's calls until told to stop."""
    os.dup2(2, 1)  # what the implementation prints goes to stderr: the parent's stdout holds the verdict
    import faulthandler

    faulthandler.enable()
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from dsrope_gate.conformance.calling import call, error_line, signature_problem
    from dsrope_gate.ops import op_named

    def send(message):
        conn.send_bytes(pickle.dumps(message))

    op = op_named(op_name)
    try:
        if device == "cpu":
            from dsrope.interpreter import install_interpreter_rounding

            install_interpreter_rounding()  # a GPU's round-to-nearest-even bf16 store; the interpreter truncates
        fn = target.load(op_name, device)
    except BaseException as e:
        send(("load error", error_line(e)))
        return
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    send(("ready", (name, signature_problem(op, fn))))
    while True:
        kind, case, inputs = pickle.loads(conn.recv_bytes())
        if kind == "stop":
            return
        from dsrope_gate.cases import Inputs

        result = call(op, fn, case, Inputs(*inputs), target.in_place, device, lambda d: send(("started", d)))
        fault = _cuda_poisoned() if device == "cuda" else ""
        if fault:
            send(("fault", fault))
            sys.exit(1)
        for name in ("out", "dx"):
            value = getattr(result, name)
            if value is not None:
                setattr(result, name, value.cpu())
        send(("done", result))
