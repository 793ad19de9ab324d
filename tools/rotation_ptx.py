"""Does writing out the rotation's fused product (dsrope._common.rotate_lane) change the compiled kernels?

Compiles both partial RoPE kernels for sm_90 (no GPU needed: Triton's ptxas ships in its wheel) twice over
a grid of specializations (dtypes, geometries, channel stride 1 or not, strides and pointers 16-divisible or
not): as committed, and with `rotate_lane(own, cs, t)` replaced by `own * cs + t`, the compiler's choice
of which product to fuse. Prints, per kernel, how many specializations give the same PTX (debug sections
and comments removed): the same PTX is the same machine code, hence the same bits on the device.

Run it with the device's Triton (the H200 has triton 3.6.0), e.g. in a venv over this machine's packages:

    python -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    PYTHONPATH=src:reference /tmp/t36/bin/python -m tools.rotation_ptx
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsrope import rope

TARGET = GPUTarget("cuda", 90, 32)
ROPE_PY = Path(rope.__file__)
DTYPES = ("fp16", "bf16", "fp32")
# (HEADS, DIM, ROTARY, M, BLOCK, warps) of _rotate; (HEADS, DIM, ROTARY, M, GROUP, BLOCK, warps) of the in-place
ROTATE = [(8, 512, 64, 2, 512, 1), (3, 96, 32, 8, 128, 1), (1, 34, 34, 16, 64, 1)]
INPLACE = [(64, 512, 64, 16, 2, 64, 4), (64, 512, 64, 4, 4, 64, 4), (1, 34, 34, 4, 1, 64, 4), (3, 96, 32, 32, 2, 32, 4)]


def compilers_choice() -> object:
    """rope.py with every rotate_lane(own, cs, t) written as own * cs + t, imported from a temporary file."""
    text = re.sub(r"rotate_lane\((\w+), cs, (.*)\)\n", r"\1 * cs + \2\n", ROPE_PY.read_text())
    path = Path(tempfile.mkdtemp()) / "rope_compilers_choice.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("rope_compilers_choice", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ptx(kernel, dtype: str, const: dict, channel_stride_one: bool, strides16: bool, x16: bool, tables16: bool, warps):
    names = kernel.arg_names
    const = dict(const, **({"XD": 1} if channel_stride_one else {}))
    signature, attrs = {}, {}
    for i, name in enumerate(names):
        if name in const:
            signature[name] = "constexpr"
        elif name in ("x", "out"):
            signature[name] = f"*{dtype}"
        elif name in ("cos", "sin"):
            signature[name] = "*fp32"
        else:
            signature[name] = "i32"
        sixteen = (
            name == "out"
            or (name == "x" and x16)
            or (name in ("cos", "sin") and tables16)
            or (signature[name] == "i32" and strides16)
        )
        if sixteen:
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=kernel, signature=signature, constexprs=const, attrs=attrs)
    text = triton.compile(source, target=TARGET, options={"num_warps": warps}).asm["ptx"]
    text = text.split("\t.section\t.debug")[0]
    lines = (re.sub(r"//.*", "", line).rstrip() for line in text.splitlines())
    return "\n".join(line for line in lines if line.strip() and not line.strip().startswith((".loc", ".file", "$L__")))


def compare(name, committed, choice, geometries, keys):
    same, differ = 0, []
    flags = list(itertools.product((True, False), repeat=4))
    for dtype, geometry, (stride_one, strides16, x16, tables16) in itertools.product(DTYPES, geometries, flags):
        *values, warps = geometry
        const = dict(zip(keys, values, strict=True))
        for extra in ({"INVERSE": False}, {"INVERSE": True}) if name == "_rotate" else ({},):
            args = (dtype, dict(const, **extra), stride_one, strides16, x16, tables16, warps)
            if ptx(committed, *args) == ptx(choice, *args):
                same += 1
            else:
                differ.append((dtype, geometry, extra, stride_one, strides16, x16, tables16))
    print(f"{name}: {same} specializations give the same PTX, {len(differ)} differ (triton {triton.__version__})")
    for d in differ:
        print("  differs:", d)


def main():
    choice = compilers_choice()
    compare("_rotate", rope._rotate, choice._rotate, ROTATE, ("HEADS", "DIM", "ROTARY", "M", "BLOCK"))
    compare(
        "_rotate_inplace",
        rope._rotate_inplace,
        choice._rotate_inplace,
        INPLACE,
        ("HEADS", "DIM", "ROTARY", "M", "GROUP", "BLOCK"),
    )


if __name__ == "__main__":
    main()
