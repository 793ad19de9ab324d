"""The PTX for sm_90 of both partial RoPE kernels, compared on a grid of specializations.

Compiles `_rotate` and `_rotate_inplace` for sm_90 (no GPU needed: Triton's ptxas ships in its wheel) over
a grid of specializations (dtypes, geometries, channel stride 1 or not, strides and pointers 16-divisible
or not) and prints, per kernel, how many specializations give the same PTX (debug sections and comments
removed) on both sides of a comparison: the same PTX is the same machine code, hence the same bits on the
device. Two comparisons:

- default: the kernels as committed against the same rope.py with every `rotate_lane(own, cs, t)` written
  `own * cs + t`, the compiler's choice of which product to fuse (dsrope.pair_rotation.rotate_lane);
- `--against SRC`: the kernels as committed against those of another tree's src/ folder (an older commit,
  e.g. `git worktree add /tmp/old <rev>`, then `--against /tmp/old/src`): a refactor of the kernels
  (renamed variables) must leave every specialization's PTX as it was.

Run it with the device's Triton (the H200 has triton 3.6.0), in a venv of its own:

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install torch==2.13.0 triton==3.6.0 numpy
    PYTHONPATH=src:reference:. /tmp/t36/bin/python -m tools.rotation_ptx [--against /tmp/old/src]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsrope import rope

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = ("fp16", "bf16", "fp32")
# (HEADS, DIM, ROTARY, M, BLOCK, warps) of _rotate; (HEADS, DIM, ROTARY, M, GROUP, BLOCK, warps) of the in-place
ROTATE = [(8, 512, 64, 2, 512, 1), (3, 96, 32, 8, 128, 1), (1, 34, 34, 16, 64, 1)]
INPLACE = [(64, 512, 64, 16, 2, 64, 4), (64, 512, 64, 4, 4, 64, 4), (1, 34, 34, 4, 1, 64, 4), (3, 96, 32, 32, 2, 32, 4)]
KERNELS = {
    "_rotate": (ROTATE, ("HEADS", "DIM", "ROTARY", "M", "BLOCK")),
    "_rotate_inplace": (INPLACE, ("HEADS", "DIM", "ROTARY", "M", "GROUP", "BLOCK")),
}


def compilers_choice() -> object:
    """rope.py with every rotate_lane(own, cs, t) written as own * cs + t, imported from a temporary file."""
    text = re.sub(r"rotate_lane\((\w+), cs, (.*)\)\n", r"\1 * cs + \2\n", Path(rope.__file__).read_text())
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


def specializations(name: str):
    """(key, ptx arguments) of every specialization of kernel `name` on the grid."""
    geometries, keys = KERNELS[name]
    flags = list(itertools.product((True, False), repeat=4))
    for dtype, geometry, (stride_one, strides16, x16, tables16) in itertools.product(DTYPES, geometries, flags):
        *values, warps = geometry
        const = dict(zip(keys, values, strict=True))
        for extra in ({"INVERSE": False}, {"INVERSE": True}) if name == "_rotate" else ({},):
            key = (dtype, geometry, extra, stride_one, strides16, x16, tables16)
            yield repr(key), (dtype, dict(const, **extra), stride_one, strides16, x16, tables16, warps)


def digests(module) -> dict[str, dict[str, str]]:
    """kernel name -> specialization key -> sha256 of its PTX, for the kernels of `module`."""
    out = {}
    for name in KERNELS:
        kernel = getattr(module, name)
        texts = {key: ptx(kernel, *args) for key, args in specializations(name)}
        out[name] = {key: hashlib.sha256(text.encode()).hexdigest() for key, text in texts.items()}
    return out


def other_tree_digests(src: Path) -> dict[str, dict[str, str]]:
    """digests() of the kernels of the dsrope under `src`, in a child interpreter with that src/ first."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]))
    child = subprocess.run(
        [sys.executable, "-m", "tools.rotation_ptx", "--digests"], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(child.stdout)


def report(mine: dict, theirs: dict, what: str) -> bool:
    same_everywhere = True
    for name in KERNELS:
        differ = [key for key in mine[name] if mine[name][key] != theirs[name].get(key)]
        same = len(mine[name]) - len(differ)
        print(f"{name}: {same} specializations give the same PTX as {what}, {len(differ)} differ", end="")
        print(f" (triton {triton.__version__})")
        for key in differ:
            print("  differs:", key)
        same_everywhere = same_everywhere and not differ
    return same_everywhere


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", type=Path, help="another tree's src/ folder: compare its kernels' PTX with these")
    ap.add_argument("--digests", action="store_true", help="print this tree's PTX digests as JSON (for --against)")
    args = ap.parse_args(argv)
    if args.digests:
        print(json.dumps(digests(rope)))
        return 0
    print(f"committed kernels: {rope.__file__}", flush=True)
    if args.against:
        theirs = other_tree_digests(args.against)
        return 0 if report(digests(rope), theirs, f"{args.against}'s kernels") else 1
    report(digests(rope), digests(compilers_choice()), "the compiler's choice of fused product")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
