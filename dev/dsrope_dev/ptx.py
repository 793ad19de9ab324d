"""dsrope's Triton kernels compiled to PTX for sm_90 as their launchers launch them, without a GPU (Triton's
wheel ships ptxas), and the f32 fused multiply-adds in that PTX.

- `capturing(kernels)`: records every launch of the given kernels in this process (an interpreted launch
  too: the launcher passes the same arguments and options either way) as `Launch` records, plain data;
- `compile_in_child(launches)`: each launch's PTX, compiled by a child Python with the interpreter off
  (Triton decides interpretation when a kernel is decorated, so an interpreted process cannot compile);
- `f32_fmas(ptx)`: the PTX's f32 multiply-add instructions (`fma.rn.f32`, `fma.rn.ftz.f32`, `mad.*.f32`, ...).

Compiling needs `ASTSource(..., constexprs=...)` (triton 3.3 and later: the device's 3.6, the CPU's 3.9).

    python -m dsrope_dev.ptx < launches.json   # one JSON list of Launch dicts in, a JSON list of PTX texts out
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

TARGET = ("cuda", 90, 32)  # sm_90 (H100, H200), 32 threads a warp
POINTER_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int32": "i32"}
POINTER_TYPES |= {"int64": "i64", "bool": "i1", "int8": "i8", "uint8": "u8"}
# Any f32 form of a multiply-add: fma.rn.f32, fma.rn.ftz.f32, fma.rn.sat.f32, mad.rn.f32 (packed f32x2 too)
F32_FMA = re.compile(r"^\s*(?:@!?%\w+\s+)?((?:fma|mad)(?:\.\w+)*\.f32(?:x2)?)\b", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch of a kernel, as Triton's JIT would specialize it: `signature` maps every parameter to its
    type ("*bf16", "i32", "fp32") or "constexpr", `constexprs` holds the constexpr values, `aligned` names the
    parameters Triton marks divisible by 16 (a pointer 16-byte aligned, an int multiple of 16), `options` the
    launch's keyword options (num_warps, enable_fp_fusion, ...)."""

    module: str
    kernel: str
    signature: dict
    constexprs: dict
    aligned: tuple
    options: dict


def _arg_type(value) -> str:
    if hasattr(value, "data_ptr"):
        return "*" + POINTER_TYPES[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for a launch argument of type {type(value).__name__}")


def _aligned(value) -> bool:
    if hasattr(value, "data_ptr"):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def launch_record(kernel, args: tuple, kwargs: dict) -> Launch:
    """The Launch of `kernel[grid](*args, **kwargs)`: keywords that name no parameter are options."""
    fn = kernel.fn
    parameters = inspect.signature(fn).parameters
    bound = inspect.signature(fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in parameters})
    signature, constexprs, aligned = {}, {}, []
    for name, parameter in parameters.items():
        value = bound.arguments[name] if name in bound.arguments else parameter.default
        if "constexpr" in str(parameter.annotation) or value is None:  # Triton specializes a None as a constexpr
            signature[name], constexprs[name] = "constexpr", value
            continue
        signature[name] = _arg_type(value)
        if _aligned(value):
            aligned.append(name)
    options = {k: v for k, v in kwargs.items() if k not in parameters}
    return Launch(fn.__module__, fn.__name__, signature, constexprs, tuple(aligned), options)


@contextlib.contextmanager
def capturing(kernels):
    """Yields a list that receives a Launch for every launch of `kernels` (JIT or interpreted functions) while
    the context is open; each launch still runs."""
    launches = []
    originals = {}

    def wrap(kernel):
        run = kernel.run

        def recording_run(*args, grid, warmup, **kwargs):
            launches.append(launch_record(kernel, args, kwargs))
            return run(*args, grid=grid, warmup=warmup, **kwargs)

        return recording_run

    try:
        for kernel in kernels:
            originals[kernel] = kernel.__dict__.get("run")
            kernel.run = wrap(kernel)  # the instance's attribute: what kernel[grid](...) calls
        yield launches
    finally:
        for kernel, run in originals.items():
            if run is None:
                del kernel.run
            else:
                kernel.run = run


def ptx(launch: Launch) -> str:
    """The PTX Triton compiles for `launch` on sm_90 (kernels must be JIT functions here, not interpreted)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = getattr(importlib.import_module(launch.module), launch.kernel)
    names = list(launch.signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in launch.aligned}
    source = ASTSource(fn=kernel, signature=dict(launch.signature), constexprs=dict(launch.constexprs), attrs=attrs)
    return triton.compile(source, target=GPUTarget(*TARGET), options=dict(launch.options)).asm["ptx"]


def f32_fmas(text: str) -> list[str]:
    """Every f32 multiply-add instruction of a PTX text (its opcode), in order."""
    return F32_FMA.findall(text.split("\t.section\t.debug")[0])


def compile_in_child(launches: list[Launch], timeout: float = 600) -> list[str]:
    """The PTX of each launch, compiled in a child Python with TRITON_INTERPRET off, which imports the
    kernels from the same folders as this process (a mutated copy's, under the mutation runner)."""
    import dsrope
    import dsrope_dev

    folders = [str(Path(m.__file__).resolve().parents[1]) for m in (dsrope, dsrope_dev)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([*folders, env.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-m", "dsrope_dev.ptx"],
        input=json.dumps([dataclasses.asdict(launch) for launch in launches]),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if child.returncode != 0:
        raise RuntimeError(f"compiling to PTX failed (exit {child.returncode}):\n{child.stderr[-4000:]}")
    return json.loads(child.stdout)


def main() -> int:
    launches = [Launch(**{**d, "aligned": tuple(d["aligned"])}) for d in json.load(sys.stdin)]
    json.dump([ptx(launch) for launch in launches], sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
