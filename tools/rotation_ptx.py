"""The PTX for sm_90 of the partial RoPE kernels, compared on a grid of specializations.

Compiles `_rotate`, `_rotate_split` and `_rotate_inplace` for sm_90 (no GPU needed: Triton's ptxas ships in
its wheel) over a grid of specializations (dtypes, geometries, channel stride 1 or not, strides and pointers
16-divisible or not) and prints, per kernel, how many specializations give the same PTX (debug sections and comments
removed) on both sides of a comparison: the same PTX is the same machine code, hence the same bits on the
device. Two comparisons:

- default: the kernels as committed against the same rope.py with every `rotate_lane(own, cs, t)` written
  `own * cs + t`, the compiler's choice of which product to fuse (dsrope.pair_rotation.rotate_lane);
- `--against SRC`: the kernels as committed against those of another tree's src/ folder (an older commit,
  e.g. `git worktree add /tmp/old <rev>`, then `--against /tmp/old/src`): a refactor of the kernels
  (renamed variables) must leave every specialization's PTX as it was (same kernel signatures).
- `--form`: no comparison; every specialization's PTX must compute the rotation as rotate_lane writes it,
  fma(own, cos, rn(+-partner * sin)): each f32 fma that takes a value loaded through cos or sin has an
  addend that is an f32 `mul` (rounded: ptxas does not contract a product into another fma's addend) of
  the pair partner, the first factor of another of the kernel's fmas, or its negation; and no f32 add or
  sub takes a value derived from cos or sin (the unfused form). Exits 1 if any specialization differs. A
  kernel change that keeps this form on every specialization keeps the rotation's bits (the same
  operations on the same rounded operands). `--form` also checks the QNorm forward `_qnorm_rope` at the
  launcher's tiles (its row sum of squares is fmas and adds of x alone, which the rule leaves aside).
- `--rows-per-program`: the QNorm forward's row sum of squares (the operand of each rsqrt, x's elements
  named by their offset in the row) at M = 1, 2, 4, 8 rows a program on one warp, and rows on 2, 4 and 8
  warps, against M = 4 on one warp, the prefill tile, for a channel-contiguous and a channel-strided x;
  exits 1 unless every contiguous row agrees (what the QNorm forward's launcher relies on,
  dsrope.qnorm_rope.forward_config). Written against triton 3.6's PTX (the
  device's): triton 3.9 sums a thread's elements as a tree and contracts the division by D into an fma
  with eps, and this reader finds no agreement there (exit 1) without telling why.

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

from dsrope import qnorm_rope, rope

TARGET = GPUTarget("cuda", 90, 32)
DTYPES = ("fp16", "bf16", "fp32")
# (HEADS, DIM, ROTARY, M, BLOCK, warps) of _rotate; (HEADS, DIM, ROTARY, M, GROUP, BLOCK, warps) of the in-place
ROTATE = [(8, 512, 64, 2, 512, 1), (3, 96, 32, 8, 128, 1), (1, 34, 34, 16, 64, 1)]
# (HEADS, DIM, ROTARY, M, BLOCK, RBLOCK, warps) of _rotate_split at its launcher's tiles (rope.rotate_config)
SPLIT = [(64, 512, 64, 4, 512, 64, 2), (3, 96, 32, 16, 128, 32, 2), (1, 34, 34, 32, 64, 64, 2)]
INPLACE = [(64, 512, 64, 16, 2, 64, 4), (64, 512, 64, 4, 4, 64, 4), (1, 34, 34, 4, 1, 64, 4), (3, 96, 32, 32, 2, 32, 4)]
KERNELS = {
    "_rotate": (ROTATE, ("HEADS", "DIM", "ROTARY", "M", "BLOCK")),
    "_rotate_split": (SPLIT, ("HEADS", "DIM", "ROTARY", "M", "BLOCK", "RBLOCK")),
    "_rotate_inplace": (INPLACE, ("HEADS", "DIM", "ROTARY", "M", "GROUP", "BLOCK")),
}
# (H, D, R, M, BLOCK, RBLOCK, CHUNK, warps) of the QNorm forward at the launcher's tiles (forward_config), an odd
# D - R among them, and rows on several warps (CHUNK: one warp's pass over a bf16 row); checked by --form only
QNORM = [(8, 512, 64, 4, 512, 64, 512, 1), (3, 96, 32, 16, 128, 32, 128, 1), (1, 34, 34, 32, 64, 64, 64, 1)]
QNORM += [(4, 65, 32, 16, 128, 32, 128, 1), (8, 512, 64, 1, 512, 64, 512, 1), (8, 512, 64, 2, 512, 64, 512, 1)]
QNORM += [(8, 512, 64, 4, 512, 64, 256, 2), (8, 512, 64, 8, 512, 64, 256, 4)]
FORM_KERNELS = {**KERNELS, "_qnorm_rope": (QNORM, ("H", "D", "R", "M", "BLOCK", "RBLOCK", "CHUNK"))}


def kernel_of(name: str):
    return getattr(qnorm_rope if name == "_qnorm_rope" else rope, name)


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
        elif name in ("cos", "sin", "rstd"):
            signature[name] = "*fp32"
        else:
            signature[name] = "i32"
        sixteen = (
            name == "out"
            or (name == "x" and x16)
            or (name in ("cos", "sin", "rstd") and tables16)
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
    geometries, keys = FORM_KERNELS[name]
    flags = list(itertools.product((True, False), repeat=4))
    for dtype, geometry, (stride_one, strides16, x16, tables16) in itertools.product(DTYPES, geometries, flags):
        *values, warps = geometry
        const = dict(zip(keys, values, strict=True))
        inverse = ({"INVERSE": False}, {"INVERSE": True})
        extras = {"_rotate": inverse, "_rotate_split": inverse, "_qnorm_rope": ({"EPS": 1e-6},)}
        for extra in extras.get(name, ({},)):
            key = (dtype, geometry, extra, stride_one, strides16, x16, tables16)
            yield repr(key), (dtype, dict(const, **extra), stride_one, strides16, x16, tables16, warps)


def digests(module) -> dict[str, dict[str, str]]:
    """kernel name -> specialization key -> sha256 of its PTX, for the kernels of `module`."""
    out = {}
    for name in KERNELS:
        if not hasattr(module, name):  # another tree's rope.py (--against), from before the kernel
            continue
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


INSTRUCTION = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)\s+(.*?);?$")
REGISTER = re.compile(r"%\w+")
PARAM = re.compile(r"\[\w+_param_(\d+)\]")
X, COS, SIN = "0", "1", "2"  # the pointer parameters' positions in both kernels' signatures


def rotation_form(text: str) -> str:
    """'' if the PTX computes every rotated lane as fma(own, cos, rn(+-partner * sin)), else why not.

    Operands are told apart by the pointer parameter their values were loaded through (x, cos, sin:
    followed back through every instruction defining them), so a form with cos and sin exchanged
    (fma(partner, sin, rn(own * cos)), the other product fused) fails."""
    defined: dict[str, list[tuple[str, list[str]]]] = {}
    fmas, adds = [], []
    # Shared memory (layout conversions between tile shapes): one pseudo-register per run of stores, the
    # stores from the last load of shared memory on; a load of shared memory reads the latest run.
    shared, loaded = 0, True
    for line in text.splitlines():
        found = INSTRUCTION.match(line)
        if not found:
            continue
        op, rest = found.group(1), found.group(2)
        if op.endswith(".f32") and op.split(".")[0] in ("add", "sub"):
            adds.append((op, REGISTER.findall(rest)))
        if ".shared" in op and op.startswith("st"):  # st.shared, stmatrix
            shared, loaded = shared + loaded, False
            defined.setdefault(f"%shared{shared}", []).append((op, [rest]))
            continue
        if op.startswith(("st.", "bar.", "bra", "ret")):
            continue
        if ".shared" in op and op.startswith("ld"):  # ld.shared, ldmatrix
            rest, loaded = f"{rest.partition('}')[0]}}}, %shared{shared}", True
        head, _, tail = rest.partition("}") if rest.startswith("{") else rest.partition(",")
        for register in REGISTER.findall(head):
            defined.setdefault(register, []).append((op, [tail]))
        if op.startswith("fma.") and op.endswith(".f32"):
            fmas.append(REGISTER.findall(rest))

    def params(register: str, seen: set) -> set:
        """The pointer parameters the value of `register` derives from."""
        if register in seen:
            return set()
        seen.add(register)
        out = set()
        for op, (source,) in defined.get(register, []):
            if op.startswith("ld.param.") and op.endswith(("b64", "u64")):
                out |= set(PARAM.findall(source))
            for r in REGISTER.findall(source):
                out |= params(r, seen)
        return out

    def source(register):
        return params(register, set())

    def zero(register):  # triton 3.6 negates as 0 - x
        return any(op.startswith("mov.") and src.strip() == "0f00000000" for op, (src,) in defined.get(register, []))

    tables = {COS, SIN}
    for op, (dest, *operands) in adds:
        if op.startswith("sub.") and len(operands) == 2 and zero(operands[0]):
            continue  # a negation (up to the sign of a zero), not the unfused rotation
        if any(source(r) & tables for r in operands):
            return f"an f32 {op} of a value from cos or sin ({dest}): the unfused form"
    fmas = [f for f in fmas if any(source(r) & tables for r in f[1:])]  # not the QNorm's sum of squares
    if not fmas:
        return "no f32 fma"
    for dest, own, cos, addend in fmas:
        product = [(op, REGISTER.findall(src)) for op, (src,) in defined.get(addend, [])]
        if len(product) != 1 or not (product[0][0].startswith("mul.") and product[0][0].endswith(".f32")):
            return f"fma {dest}: its addend {addend} is not one f32 product"
        factors = sorted((source(f) for f in product[0][1]), key=sorted)
        if source(own) != {X} or source(cos) != {COS} or factors != [{X}, {SIN}]:
            return f"fma {dest}: factors from {source(own)}, {source(cos)}, addend {factors} (x 0, cos 1, sin 2)"
    return ""


LOAD = re.compile(r"(?:@!?%\w+\s+)?ld\.global(?:\.\w+)*\.b(?:16|32)\s+\{([^}]*)\}, \[ (%rd\d+) \+ (-?\d+) \]")


def row_sums(text: str) -> list[str]:
    """The operand of every rsqrt in the PTX (one per row of a program: the row's sum of squares over D,
    plus eps) as an expression, x's elements named by their byte offset from the row's address, the
    register word and the 16-bit half; equal expressions are the same additions in the same order."""
    offsets, halves, x, defined = {}, {}, {}, {}
    for line in (re.sub(r"//.*", "", line).strip() for line in text.split("\t.section\t.debug")[0].splitlines()):
        if found := re.match(r"add\.s64\s+(%rd\d+), (%rd\d+), (-?\d+);", line):
            offsets[found.group(1)] = (found.group(2), int(found.group(3)))
        if found := LOAD.match(line):
            for word, register in enumerate(REGISTER.findall(found.group(1))):
                x[register] = (found.group(2), int(found.group(3)), word, 0)
            continue
        if found := re.match(r"mov\.b32\s+\{(%\w+), (%\w+)\}, (%\w+);", line):
            halves[found.group(1)], halves[found.group(2)] = (found.group(3), 0), (found.group(3), 1)
            continue
        found = re.match(r"cvt\.f32\.b?f16\s+(%\w+), (%\w+);", line)
        if found and found.group(2) in halves and halves[found.group(2)][0] in x:
            packed, half = halves[found.group(2)]
            x[found.group(1)] = (*x[packed][:3], half)
            continue
        if (found := INSTRUCTION.match(line)) and not found.group(1).startswith(("st.", "bar.", "bra", "ret")):
            operands = re.findall(r"%\w+|0[fF][0-9A-Fa-f]+|\b\d+\b", found.group(2))
            if operands:
                defined.setdefault(operands[0], (found.group(1), operands[1:]))  # the first definition

    def base(register, offset):
        while register in offsets:
            register, step = offsets[register]
            offset += step
        return register, offset

    def expression(register, bases, seen=()):
        if register in x:
            address, offset, word, half = x[register]
            row, offset = base(address, offset)
            return f"x[{bases.setdefault(row, len(bases))}+{offset}:{word}.{half}]"
        if register in seen or register not in defined:
            return register if not register.startswith("%") else "?"
        op, operands = defined[register]
        if op.startswith("shfl."):  # the value and the lane offset; the clamp and member mask are no arithmetic
            return f"{op}[{operands[1]}]({expression(operands[0], bases, seen + (register,))})"
        return f"{op}({','.join(expression(o, bases, seen + (register,)) for o in operands)})"

    def from_row_start(sum_of_squares: str) -> str:  # offsets from the row's first element
        element = re.compile(r"x\[(\d+)\+(-?\d+):")
        first = {}
        for row, offset in element.findall(sum_of_squares):
            first[row] = min(first.get(row, int(offset)), int(offset))
        return element.sub(lambda f: f"x[{f.group(1)}+{int(f.group(2)) - first[f.group(1)]}:", sum_of_squares)

    rsqrt = re.compile(r"\s*rsqrt\.approx\.\w*\.?f32\s+%\w+, (%\w+);")
    sums = [expression(found.group(1), {}) for line in text.splitlines() if (found := rsqrt.match(line))]
    return [from_row_start(s) for s in sums]


def rows_per_program_report() -> bool:
    """Whether each row's sum of squares in the QNorm forward is the same PTX at every rows-per-program M
    and warps (D = 512) as at the prefill tile (M = 4, one warp), per dtype, for a channel-contiguous and a
    channel-strided x: one warp at M = 1, 2, 4, 8 (CHUNK = BLOCK), and, on a contiguous x, rows on 2, 4 and 8
    warps at one and two rows a warp (CHUNK = one warp's pass, qnorm_rope.warp_pass). True when the
    contiguous rows agree everywhere (what the launcher's tiles need); the strided ones are printed, not
    required."""
    ok = True
    for dtype, contiguous in itertools.product(DTYPES, (True, False)):
        sums = {}
        tiles = [(m, 1) for m in (1, 2, 4, 8)] + ([(w * k, w) for w in (2, 4, 8) for k in (1, 2)] if contiguous else [])
        for m, warps in tiles:
            chunk = qnorm_rope.row_chunk(512, 4 if dtype == "fp32" else 2, warps)
            const = dict(H=8, D=512, R=64, M=m, BLOCK=512, RBLOCK=64, CHUNK=chunk, EPS=1e-6)
            sums[m, warps] = row_sums(ptx(qnorm_rope._qnorm_rope, dtype, const, contiguous, True, True, True, warps))
        same = [tile for tile in tiles if sums[tile] and set(sums[tile]) == {sums[4, 1][0]}]
        layout = "channel-contiguous" if contiguous else "channel-strided"
        print(f"_qnorm_rope {dtype} {layout}: every row as at M = 4, one warp, for (M, warps) in {same} of {tiles}")
        ok = ok and (not contiguous or same == tiles)
    print(f"(triton {triton.__version__})")
    return ok


def form_report() -> bool:
    """Every specialization of both kernels in rotate_lane's form; prints a count per kernel."""
    ok = True
    for name in FORM_KERNELS:
        kernel = kernel_of(name)
        wrong = [(key, why) for key, args in specializations(name) if (why := rotation_form(ptx(kernel, *args)))]
        total = sum(1 for _ in specializations(name))
        form = "fma(own, cos, rn(+-partner * sin))"
        print(f"{name}: {total - len(wrong)}/{total} specializations compute {form}", end="")
        print(f" (triton {triton.__version__})")
        for key, why in wrong:
            print("  differs:", key, why)
        ok = ok and not wrong
    return ok


def report(mine: dict, theirs: dict, what: str) -> bool:
    same_everywhere = True
    for name in KERNELS:
        if name not in theirs:  # a kernel the other tree does not have
            print(f"{name}: not in {what}")
            continue
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
    ap.add_argument("--form", action="store_true", help="check that every specialization has rotate_lane's form")
    ap.add_argument("--digests", action="store_true", help="print this tree's PTX digests as JSON (for --against)")
    ap.add_argument(
        "--rows-per-program", action="store_true", help="the QNorm forward's row sums at M = 1, 2, 4, 8 against M = 4"
    )
    args = ap.parse_args(argv)
    if args.digests:
        print(json.dumps(digests(rope)))
        return 0
    print(f"committed kernels: {rope.__file__}", flush=True)
    if args.rows_per_program:
        return 0 if rows_per_program_report() else 1
    if args.form:
        return 0 if form_report() else 1
    if args.against:
        theirs = other_tree_digests(args.against)
        return 0 if report(digests(rope), theirs, f"{args.against}'s kernels") else 1
    report(digests(rope), digests(compilers_choice()), "the compiler's choice of fused product")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
