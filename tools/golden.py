"""Golden tensors: the reference's outputs on fixed inputs, stored and hashed; and per-platform bit
snapshots of what the kernels computed on those inputs.

    python -m tools.golden                    regenerate from the reference in memory, diff vs golden/
    python -m tools.golden --update           ... and write golden/reference/ and golden/manifest.json
    python -m tools.golden --update-snapshot  run the kernels on the stored inputs and record
                                              golden/snapshots/<key>.safetensors (+ .json sidecar)
    `nox -s golden -- <flags>` runs the same in a fresh CPU venv (kernels interpreted).

The reference goldens are computed from `reference/` only, never from the kernels: fixed seeds,
FP64 reference, deterministic serialization (safetensors with one metadata entry, JSON with
sorted keys), so regenerating gives the same bytes. One input is FP32 on purpose: the V3 cases'
cos/sin are the table DeepSeek-V3 was trained with (upstream's FP32 pow and cosf/sinf on CPU, as
reference/rope_utils.py transcribes it): regenerating gives the same bytes where torch's CPU pow
and the C library's cosf/sinf give the bits they gave when recorded (torch 2.13, glibc 2.36, AVX-512).

golden/reference/<case>.safetensors holds, per case:
  input.<name>     the logical values (contiguous) in the dtype the kernel gets; the layout the kernel
                   is run with (tests.layouts.Layout fields, and the strides and storage offset they
                   give) is in the manifest; `laid_out_inputs` rebuilds the strided view.
  <stage>.ref      the reference value of a stage (correctly rounded in the case dtype; the exact
                   rstd is FP64), in the narrowest of (case dtype, float32, float64) that holds it.
  <stage>.lo_steps, <stage>.hi_steps   for stages a kernel outputs: the error model's interval
                   [lo, hi], as the number of representable values (case dtype) from ref down to lo
                   and up to hi, int8 where it fits (almost always 0 or 1); floats would triple the
                   folder. Where ref, lo, hi are not all in the case dtype: <stage>.lo, <stage>.hi.
golden/manifest.json: versions, error model, cases (seeds, shapes, layouts, dtypes), and the sha256
  of every file and every tensor's bytes, and of itself (`manifest_sha256`).
golden/snapshots/<key>.safetensors: kernel outputs `<case>/<kernel>.<output>` on one platform; the
  sidecar <key>.json holds their hashes and the hashes of the inputs they were computed from.
Nothing is pickled.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
FORMAT = 1
# Bump when reference/*.py changes an interval on purpose (the regenerated lo/hi then differ and
# `--update` stores them): it names the error model the stored intervals come from.
ERROR_MODEL_VERSION = (
    "1: rope = reference/rope.py rotation_interval (2u(|p|+|q|) + FP32 flush slack, exact when FP32-exact); "
    "qnorm_rope = reference/qnorm_rope.py (rstd gamma(D+4) + rsqrt 2^-22, boundary-1 box, backward bound B)"
)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class GoldenError(Exception):
    """A golden file is missing, corrupted, or does not match its manifest."""


# --- cases -------------------------------------------------------------------------------------


def _layout_type():
    from tests.layouts import Layout

    return Layout


def _layouts():
    Layout = _layout_type()
    return dict(
        token_major=Layout(order=(0, 2, 1, 3)),
        contiguous=Layout(),
        padded=Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3)),
        stepped=Layout(step=(2, 1, 3, 1)),
        channel_outer=Layout(order=(3, 0, 1, 2)),
        offset=Layout(order=(0, 2, 1, 3), offset=7),
        stepped_channels_offset=Layout(order=(2, 0, 1, 3), step=(1, 2, 1, 2), pad=(0, 1, 0, 0), offset=5),
        sum_gradient=Layout(broadcast=(0, 1, 2, 3)),  # the upstream gradient of out.sum()
        batch_broadcast=Layout(broadcast=(0,)),  # cos/sin expanded over the batch: stride 0
        table_padded=Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11),
        v3_seq_major=Layout(order=(1, 0, 2, 3)),
        thd_head_major=Layout(order=(1, 0, 2)),  # [T, H, d] view of a contiguous [H, T, d]
        thd_stepped=Layout(step=(1, 2, 1), offset=3),
        bsd_seq_major=Layout(order=(1, 0, 2)),
    )


@dataclass(frozen=True)
class Case:
    """One input set (x, an upstream gradient, cos/sin tables) and the kernels run on it.

    DeepSeek-V4 cases (qkv_format ""): x [B, H, S, D], cos/sin FP32 [B, S, R], kernels qnorm_rope and
    partial_rope. DeepSeek-V3 cases (qkv_format "bshd" or "thd"): x [B, S, H, d] or [T, H, d] (without
    H with unsqueeze_dim=2: a shared key), cos/sin FP32 [*tokens, d/2] (the complex table's real and
    imaginary parts), kernels v3_interleaved (apply_rotary_emb) and v3_half_split on the same input.
    """

    name: str
    seed: int
    dtype: str
    shape: tuple[int, ...]
    rotary: int
    eps: float = 0.0
    values: str = "randn"  # randn | zero_rows | tiny | subnormal | huge | nan  (see make_inputs)
    x_layout: str = "token_major"
    grad_layout: str = "token_major"
    table_layout: str = "batch_broadcast"
    kernels: tuple[str, ...] = ("qnorm_rope", "partial_rope")
    qkv_format: str = ""
    unsqueeze_dim: int | None = None


V3 = ("v3_interleaved", "v3_half_split")


def build_cases() -> list[Case]:
    cases = []
    edge = (2, 2, 3, 512)  # edge values on the DSV4 head geometry, few rows, non-production layouts
    for i, dtype in enumerate(DTYPES):
        short = SHORT[dtype]
        # DeepSeek-V4 heads: D=512, R=64; Flash 64 heads, Pro 128 heads; production layouts.
        v4 = dict(dtype=dtype, rotary=64, eps=1e-6)
        cases += [
            Case(f"flash-{short}", 100 + i, shape=(1, 64, 2, 512), **v4),
            Case(f"pro-{short}", 110 + i, shape=(1, 128, 1, 512), grad_layout="contiguous", **v4),
            Case(
                f"zero-rows-{short}",
                120 + i,
                shape=edge,
                values="zero_rows",
                x_layout="padded",
                grad_layout="stepped",
                table_layout="contiguous",
                **v4,
            ),
            Case(f"tiny-{short}", 130 + i, shape=edge, values="tiny", x_layout="stepped", **v4),
            Case(
                f"huge-{short}",
                140 + i,
                shape=edge,
                values="huge",
                x_layout="channel_outer",
                grad_layout="sum_gradient",
                table_layout="table_padded",
                **v4,
            ),
            Case(
                f"nan-{short}",
                150 + i,
                shape=edge,
                values="nan",
                x_layout="offset",
                grad_layout="stepped_channels_offset",
                **(v4 | dict(eps=1e-1)),
            ),
            # DeepSeek-V3 rope slice: d = 64, both pairings on the same input and table.
            Case(
                f"v3-bshd-{short}",
                200 + i,
                dtype,
                (2, 4, 16, 64),
                64,
                x_layout="contiguous",
                grad_layout="contiguous",
                table_layout="contiguous",
                kernels=V3,
                qkv_format="bshd",
            ),
        ]
    cases += [
        Case("subnormal-bf16", 160, "bfloat16", edge, 64, 1e-6, "subnormal"),
        Case(
            "v3-thd-bf16",
            210,
            "bfloat16",
            (12, 16, 64),
            64,
            x_layout="thd_head_major",
            grad_layout="thd_stepped",
            table_layout="contiguous",
            kernels=V3,
            qkv_format="thd",
        ),
        Case(
            "v3-shared-key-bf16",
            220,
            "bfloat16",
            (2, 4, 64),
            64,
            x_layout="bsd_seq_major",
            grad_layout="contiguous",
            table_layout="contiguous",
            kernels=V3,
            qkv_format="bshd",
            unsqueeze_dim=2,
        ),
    ]
    return cases


CASES = build_cases()


def layout_of_case(case: Case) -> dict:
    layouts = _layouts()
    return {
        "x": layouts[case.x_layout],
        "grad": layouts[case.grad_layout],
        "cos": layouts[case.table_layout],
        "sin": layouts[case.table_layout],
    }


# The Layout fields a case uses (Layout may grow others, with defaults: they are not recorded).
LAYOUT_FIELDS = ("order", "pad", "step", "offset", "broadcast")


def case_record(case: Case, inputs: dict[str, torch.Tensor]) -> dict:
    """The manifest's description of a case: seeds, shapes, dtypes, and each input's layout."""
    from tests.layouts import materialize

    record = asdict(case)
    record["shape"] = list(case.shape)
    record["kernels"] = list(case.kernels)
    record["file"] = f"reference/{case.name}.safetensors"
    record["layouts"] = {}
    for name, layout in layout_of_case(case).items():
        view = materialize(inputs[name], layout)
        fields = {k: getattr(layout, k) for k in LAYOUT_FIELDS}
        fields = {k: (list(v) if isinstance(v, tuple) else v) for k, v in fields.items()}
        record["layouts"][name] = dict(
            fields, shape=list(view.shape), strides=list(view.stride()), storage_offset=view.storage_offset()
        )
    return record


# --- inputs --------------------------------------------------------------------------------------

# tiny: FP32 squares underflow; fp16 and fp32 inputs partly subnormal. bf16 subnormal inputs are the
# separate case subnormal-bf16 (Triton 3.9's interpreter widened them to FP32 wrongly until the patch
# in dsrope._common; compiled kernels widen them exactly).
TINY = {"bfloat16": 2.0**-100, "float16": 2.0**-20, "float32": 2.0**-120, "subnormal": 2.0**-130}
HUGE = {"bfloat16": 2.0**40, "float16": 2.0**13, "float32": 2.0**40}


def make_tables(batch: int, seq: int, rotary: int, g: torch.Generator, per_batch: bool):
    """cos, sin FP32 [B, S, R]: entries k < R/2 are pair k's (theta 10000, positions < 2**16), the rest
    NaN, which the kernels must not read."""
    half = rotary // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2 / rotary)
    pos = torch.randint(0, 1 << 16, (batch if per_batch else 1, seq, 1), generator=g).double()
    ang = pos * inv
    nan = torch.full(ang.shape, float("nan"), dtype=torch.float64)
    cos = torch.cat((torch.cos(ang), nan), -1).float().expand(batch, seq, rotary).contiguous()
    sin = torch.cat((torch.sin(ang), nan), -1).float().expand(batch, seq, rotary).contiguous()
    return cos, sin


def v3_tokens(case: Case) -> tuple[int, ...]:
    return case.shape[:2] if case.qkv_format == "bshd" else case.shape[:1]


# DeepSeek-V3's rope: theta 10000 and its YaRN scaling, for max_seq_len 163840
V3_ROPE = dict(
    theta=10000.0,
    max_seq_len=163840,
    rope_scaling=dict(factor=40, beta_fast=32, beta_slow=1, original_max_position_embeddings=4096),
)


def make_v3_tables(tokens: tuple[int, ...], half: int, g: torch.Generator):
    """cos, sin FP32 [*tokens, d/2] of the complex table DeepSeek-V3 models were trained with (its
    rope config, positions < 163840): upstream's FP32 computation as reference/rope_utils.py
    transcribes it, on CPU."""
    from reference.rope_utils import upstream_frequencies, upstream_table

    freqs = upstream_frequencies(2 * half, V3_ROPE["max_seq_len"], V3_ROPE["theta"], V3_ROPE["rope_scaling"])
    positions = torch.randint(0, V3_ROPE["max_seq_len"], tokens, generator=g)
    table = upstream_table(positions.reshape(1, -1), freqs).reshape(*tokens, half)
    return table.real.contiguous(), table.imag.contiguous()


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    """Logical (contiguous) inputs of a case, from its seed alone."""
    g = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    x = torch.randn(case.shape, generator=g, dtype=torch.float64)
    grad = torch.randn(case.shape, generator=g, dtype=torch.float64)
    if case.qkv_format:
        cos, sin = make_v3_tables(v3_tokens(case), case.shape[-1] // 2, g)
        return {"x": x.to(dtype), "grad": grad.to(dtype), "cos": cos, "sin": sin}
    b, h, s, d = case.shape
    rotary = case.rotary
    if case.values == "zero_rows":
        x[0, 0] = 0  # every token of one head
        x[-1, -1, -1] = 0
        grad[0, 1, 0] = 0
    elif case.values in ("tiny", "subnormal"):
        scale = TINY[case.dtype if case.values == "tiny" else "subnormal"]
        x *= scale
        grad[:, :, 0] *= scale
    elif case.values == "huge":
        x *= HUGE[case.dtype]
        if dtype != torch.float16:
            x[0, 1, 2] = 1e30 * torch.sign(x[0, 1, 2])  # the FP32 sum of squares overflows: rstd 0
        x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
    elif case.values == "nan":
        x[0, 1, 1, d - rotary + 5] = float("nan")  # one rotary channel of one row
        grad[-1, 0, 2, 3] = float("nan")  # one pass-through channel of another row
    elif case.values != "randn":
        raise ValueError(f"values: unknown edge kind {case.values!r}")
    if layout_of_case(case)["grad"].broadcast == (0, 1, 2, 3):
        grad = torch.ones(case.shape, dtype=torch.float64)
    per_batch = layout_of_case(case)["cos"].broadcast != (0,)
    cos, sin = make_tables(b, s, rotary, g, per_batch)
    return {"x": x.to(dtype), "grad": grad.to(dtype), "cos": cos, "sin": sin}


def laid_out_inputs(record: dict, inputs: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The inputs as the kernels get them: each logical tensor in its recorded layout on `device`."""
    from tests.layouts import materialize

    Layout = _layout_type()
    laid = {}
    for name, rec in record["layouts"].items():
        fields = {k: rec[k] for k in LAYOUT_FIELDS}
        layout = Layout(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in fields.items()})
        view = materialize(inputs[name].to(device), layout)
        got = (list(view.shape), list(view.stride()), view.storage_offset())
        want = (rec["shape"], rec["strides"], rec["storage_offset"])
        if got != want:
            raise GoldenError(
                f"case {record['name']}: input {name} rebuilt as (shape, strides, offset) {got}, "
                f"the manifest records {want}"
            )
        if not same_values(view.cpu().double(), inputs[name].double()):
            raise GoldenError(f"case {record['name']}: input {name} differs from its stored values in its layout")
        laid[name] = view
    return laid


# --- reference stages -------------------------------------------------------------------------------

# Stages a kernel outputs (stored with their interval) and intermediate values (reference only).
KERNEL_OUTPUTS = {
    "qnorm_rope": ("out", "rstd", "dx"),
    "partial_rope": ("out", "dx"),
    "v3_interleaved": ("out", "dx"),
    "v3_half_split": ("out", "dx"),
}


def reference_stages(case: Case, inputs: dict[str, torch.Tensor]) -> dict:
    """Stage name -> reference Model (ref, lo, hi: FP64)."""
    from reference import qnorm_rope
    from reference.rope import partial_rope

    x, grad, cos, sin = inputs["x"], inputs["grad"], inputs["cos"], inputs["sin"]
    stages = {}
    for pairing in ("interleaved", "half_split"):
        if f"v3_{pairing}" in case.kernels:
            from reference import rope_utils

            # forward: the table; backward (conjugate rotation of the gradient): the conjugate table
            table, conjugate = torch.complex(cos, sin), torch.complex(cos, -sin)
            stages[f"v3_{pairing}.out"] = rope_utils.rotation(x, table, pairing)
            stages[f"v3_{pairing}.dx"] = rope_utils.rotation(grad, conjugate, pairing)
    if "qnorm_rope" in case.kernels:
        fwd = qnorm_rope.forward(x, cos, sin, case.rotary, case.eps)
        bwd = qnorm_rope.backward(x, grad, cos, sin, case.rotary, case.eps)
        stages |= {
            "qnorm_rope.out": fwd.out,
            "qnorm_rope.rstd": fwd.rstd,
            "qnorm_rope.dx": bwd.dx,
            "qnorm_rope.normalized": fwd.normalized,
            "qnorm_rope.derotated": bwd.derotated,
        }
    if "partial_rope" in case.kernels:
        stages["partial_rope.out"] = partial_rope(x, cos, sin, case.rotary)
        stages["partial_rope.dx"] = partial_rope(grad, cos, sin, case.rotary, inverse=True)
    return stages


def judged_stages(case: Case | dict) -> list[str]:
    kernels = case.kernels if isinstance(case, Case) else case["kernels"]
    return [f"{k}.{o}" for k in kernels for o in KERNEL_OUTPUTS[k]]


# --- float bits ------------------------------------------------------------------------------------

INT_OF = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


def ordered(t: torch.Tensor) -> torch.Tensor:
    """Integers whose order and differences count the bit patterns of t's dtype between two values;
    -0 is one step below +0, so that the map is one-to-one (NaNs map to integers beyond inf)."""
    bits = t.contiguous().view(INT_OF[t.dtype]).to(torch.int64)
    magnitude = bits & ((1 << (t.element_size() * 8 - 1)) - 1)
    return torch.where(bits < 0, -magnitude - 1, bits)


def from_ordered(o: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    sign = -(1 << (torch.finfo(dtype).bits - 1))
    bits = torch.where(o < 0, (-o - 1) | sign, o)
    return bits.to(INT_OF[dtype]).view(dtype)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, zeros' signs included, NaN meeting NaN (any payload)."""
    return a.shape == b.shape and bool(((a == b) & (a.signbit() == b.signbit()) | (a.isnan() & b.isnan())).all())


def exact_in(t64: torch.Tensor, dtype: torch.dtype) -> bool:
    return same_values(t64.to(dtype).to(torch.float64), t64)


def narrowest(t64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    for candidate in (dtype, torch.float32):
        if exact_in(t64, candidate):
            return t64.to(candidate)
    return t64


def smallest_int(t: torch.Tensor) -> torch.Tensor:
    for candidate in (torch.int8, torch.int16, torch.int32):
        info = torch.iinfo(candidate)
        if t.numel() == 0 or (t.min() >= info.min and t.max() <= info.max):
            return t.to(candidate)
    return t


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Representable values of their (common) dtype between a and b; NaN vs NaN 0, NaN vs number 2**62."""
    d = (ordered(a) - ordered(b)).abs()
    d = torch.where(a.isnan() & b.isnan(), 0, d)
    return torch.where(a.isnan() ^ b.isnan(), 1 << 62, d)


# --- encoding ---------------------------------------------------------------------------------------


def encode_stage(name: str, model, dtype: torch.dtype, with_interval: bool) -> dict[str, torch.Tensor]:
    ref, lo, hi = (t.to("cpu", torch.float64).contiguous() for t in (model.ref, model.lo, model.hi))
    out = {f"{name}.ref": narrowest(ref, dtype)}
    if not with_interval:
        return out
    if exact_in(ref, dtype) and exact_in(lo, dtype) and exact_in(hi, dtype):
        r = ordered(ref.to(dtype))
        nan = ref.isnan()
        lo_steps = torch.where(nan, 0, r - ordered(lo.to(dtype)))
        hi_steps = torch.where(nan, 0, ordered(hi.to(dtype)) - r)
        encoded = {f"{name}.lo_steps": smallest_int(lo_steps), f"{name}.hi_steps": smallest_int(hi_steps)}
        decoded = decode_stage(name, out | encoded)
        if same_values(decoded["lo"], lo) and same_values(decoded["hi"], hi):
            return out | encoded
    return out | {f"{name}.lo": narrowest(lo, dtype), f"{name}.hi": narrowest(hi, dtype)}


def decode_stage(name: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{"ref", "lo", "hi"} in FP64 (lo/hi only when stored)."""
    ref = tensors[f"{name}.ref"]
    out = {"ref": ref.to(torch.float64)}
    for side, sign in (("lo", -1), ("hi", 1)):
        if f"{name}.{side}" in tensors:
            out[side] = tensors[f"{name}.{side}"].to(torch.float64)
        elif f"{name}.{side}_steps" in tensors:
            steps = tensors[f"{name}.{side}_steps"].to(torch.int64)
            moved = from_ordered(ordered(ref) + sign * steps, ref.dtype)
            out[side] = torch.where(steps == 0, ref, moved).to(torch.float64)  # keeps NaN payloads
    return out


def encode_case(case: Case, inputs: dict[str, torch.Tensor], stages: dict) -> dict[str, torch.Tensor]:
    tensors = {f"input.{k}": v.contiguous() for k, v in inputs.items()}
    judged = judged_stages(case)
    for name, model in stages.items():
        tensors |= encode_stage(name, model, DTYPES[case.dtype], with_interval=name in judged)
    return tensors


def logical(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Stored tensors -> name: values (input.x, qnorm_rope.out.ref, .lo, .hi, ...), each in the narrowest
    of (case dtype, float32, float64) that holds it, for diffs in ULPs."""
    out = {k: v for k, v in tensors.items() if k.startswith("input.")}
    stages = {k.rsplit(".", 1)[0] for k in tensors if not k.startswith("input.")}
    for stage in sorted(stages):
        for side, t in decode_stage(stage, tensors).items():
            out[f"{stage}.{side}"] = narrowest(t, dtype)
    return out


# --- serialization and hashes -------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def tensor_entries(tensors: dict[str, torch.Tensor]) -> dict:
    return {
        k: {
            "dtype": str(v.dtype).removeprefix("torch."),
            "shape": list(v.shape),
            "sha256": sha256(tensor_bytes(v)),
        }
        for k, v in sorted(tensors.items())
    }


def serialize(tensors: dict[str, torch.Tensor], description: dict) -> bytes:
    """safetensors bytes; one metadata entry (a JSON string with sorted keys) keeps the header fixed."""
    from safetensors.torch import save

    meta = {"dsrope": json.dumps(description, sort_keys=True)}
    return save({k: v.contiguous() for k, v in sorted(tensors.items())}, metadata=meta)


def canonical(obj: dict) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()


def with_self_hash(obj: dict, key: str) -> bytes:
    body = {k: v for k, v in obj.items() if k != key}
    return canonical(body | {key: sha256(canonical(body))})


def versions() -> dict:
    import numpy
    import safetensors
    import triton

    return {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }


def relname(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def read_json(path: Path, self_hash_key: str) -> dict:
    """A JSON file written by this tool: present, canonical, and matching its own hash."""
    if not path.is_file():
        raise GoldenError(f"{relname(path)}: missing")
    raw = path.read_bytes()
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise GoldenError(f"{relname(path)}: not valid JSON ({e})") from None
    if not isinstance(obj, dict) or canonical(obj) != raw:
        raise GoldenError(f"{relname(path)}: not byte-identical to its canonical form (edited or corrupted)")
    if with_self_hash(obj, self_hash_key) != raw:
        raise GoldenError(f"{relname(path)}: {self_hash_key} does not match its content (edited or corrupted)")
    return obj


def read_tensors(path: Path, entry: dict) -> dict[str, torch.Tensor]:
    """A safetensors file whose bytes and tensors match `entry` (sha256, tensors); parsed from the very
    bytes that were hashed."""
    from safetensors.torch import load

    if not path.is_file():
        raise GoldenError(f"{relname(path)}: missing (listed in its manifest)")
    raw = path.read_bytes()
    got = sha256(raw)
    if got != entry["sha256"]:
        raise GoldenError(f"{relname(path)}: sha256 {got} does not match the manifest's {entry['sha256']}")
    try:
        tensors = load(raw)
    except Exception as e:  # safetensors raises its own error types
        raise GoldenError(f"{relname(path)}: not a readable safetensors file ({e})") from None
    entries = tensor_entries(tensors)
    if entries != entry["tensors"]:
        bad = [k for k in sorted(set(entries) | set(entry["tensors"])) if entries.get(k) != entry["tensors"].get(k)]
        raise GoldenError(f"{relname(path)}: tensors differ from the manifest: {bad[:5]}")
    return tensors


# --- the stored reference goldens -------------------------------------------------------------------------


def manifest_path(root: Path) -> Path:
    return root / "manifest.json"


def read_manifest(root: Path = GOLDEN) -> dict:
    manifest = read_json(manifest_path(root), "manifest_sha256")
    if manifest.get("format") != FORMAT:
        raise GoldenError(f"{relname(manifest_path(root))}: format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def load_case(root: Path, manifest: dict, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(case record, stored tensors) of one case, after checking its file's hashes."""
    records = {c["name"]: c for c in manifest["cases"]}
    if name not in records:
        raise GoldenError(f"{relname(manifest_path(root))}: no case {name!r}")
    record = records[name]
    return record, read_tensors(root / record["file"], manifest["files"][record["file"]])


def verify_all(root: Path = GOLDEN) -> dict:
    """Check every golden file against its hashes (reference files, snapshots); return the manifest."""
    manifest = read_manifest(root)
    for rel, entry in sorted(manifest["files"].items()):
        read_tensors(root / rel, entry)
    listed = {root / rel for rel in manifest["files"]}
    for path in sorted((root / "reference").glob("*")):
        if path not in listed:
            raise GoldenError(f"{relname(path)}: not listed in {relname(manifest_path(root))}")
    snapshots = root / "snapshots"
    data_files = {path.name for path in snapshots.glob("*") if path.suffix != ".json"}
    for sidecar in sorted(snapshots.glob("*.json")):
        meta, _ = read_snapshot(sidecar)
        data_files.discard(meta["file"])
    if data_files:
        name = sorted(data_files)[0]
        raise GoldenError(f"{relname(snapshots / name)}: no sidecar .json in {relname(snapshots)} names it")
    return manifest


def generate(cases: list[Case] = CASES) -> tuple[dict[str, bytes], bytes]:
    """Reference golden files (relative path -> bytes) and the manifest bytes, from the reference."""
    files, entries, records = {}, {}, []
    for case in cases:
        inputs = make_inputs(case)
        record = case_record(case, inputs)
        tensors = encode_case(case, inputs, reference_stages(case, inputs))
        data = serialize(tensors, {"case": record, "error_model": ERROR_MODEL_VERSION, "format": FORMAT})
        files[record["file"]] = data
        entries[record["file"]] = {
            "sha256": sha256(data),
            "bytes": len(data),
            "tensors": tensor_entries(tensors),
        }
        records.append(record)
    manifest = {
        "about": "dsrope golden tensors: written by `python -m tools.golden --update`; do not edit by hand",
        "format": FORMAT,
        "error_model": ERROR_MODEL_VERSION,
        "produced_by": versions(),
        "cases": records,
        "files": entries,
    }
    return files, with_self_hash(manifest, "manifest_sha256")


def input_hashes(tensors: dict[str, torch.Tensor]) -> str:
    """One hash of a case's inputs: a snapshot recorded from other inputs is stale."""
    return sha256(canonical(tensor_entries({k: v for k, v in tensors.items() if k.startswith("input.")})))


# --- diffs ------------------------------------------------------------------------------------------------


@dataclass
class Change:
    case: str
    tensor: str
    changed: int  # elements whose bits differ
    total: int
    max_ulp: int | None  # None: the tensor is new, gone, or changed shape
    unit: str = ""  # the dtype the ULPs count in

    def __str__(self) -> str:
        if self.max_ulp is None:
            return f"  {self.case}  {self.tensor}: {self.changed} elements (added, removed or reshaped)"
        if self.max_ulp >= 1 << 62:
            ulp = "NaN vs number"
        elif self.max_ulp == 0:
            ulp = f"0 ulp ({self.unit}; only NaN bits changed)"
        else:
            ulp = f"{self.max_ulp} ulp ({self.unit})"
        return f"  {self.case}  {self.tensor}: {self.changed} / {self.total} elements, max {ulp}"


def diff_tensors(case: str, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> list[Change]:
    """Bitwise changes between two name -> float tensor maps, in ULPs of the tensors' dtype (FP64 where
    the dtype itself changed)."""
    changes = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a is None or b is None or a.shape != b.shape:
            n = (a if b is None else b).numel()
            changes.append(Change(case, name, n, n, None))
            continue
        if a.dtype != b.dtype:
            a, b = a.to(torch.float64), b.to(torch.float64)
        same = ordered(a) == ordered(b)
        if bool(same.all()):
            continue
        ulps = ulp_distance(a, b)
        unit = str(a.dtype).removeprefix("torch.")
        changes.append(Change(case, name, int((~same).sum()), a.numel(), int(ulps.max()), unit))
    return changes


def summary(changes: list[Change], what: str) -> str:
    """One line (cases, tensors, elements, largest change in ULPs), then one line per changed tensor."""
    if not changes:
        return f"{what}: no change"
    cases = sorted({c.case for c in changes})
    elements = sum(c.changed for c in changes)
    measured = [c for c in changes if c.max_ulp is not None]
    worst = max(measured, key=lambda c: c.max_ulp, default=None)
    if worst is None:
        largest = "n/a"
    elif worst.max_ulp >= 1 << 62:
        largest = "NaN vs number"
    else:
        largest = f"{worst.max_ulp} ulp ({worst.unit}, {worst.case} {worst.tensor})"
    head = (
        f"{what}: {len(cases)} cases changed ({', '.join(cases)}), {len(changes)} tensors, "
        f"{elements} elements, largest change {largest}"
    )
    return "\n".join([head] + [str(c) for c in changes])


def reference_report(root: Path, files: dict[str, bytes], manifest_bytes: bytes) -> tuple[str, bool]:
    """Diff of freshly generated reference goldens against the stored ones: (report, changed)."""
    from safetensors.torch import load

    lines = []
    new_manifest = json.loads(manifest_bytes)
    try:
        old_manifest = read_manifest(root)
    except GoldenError as e:
        old_manifest = {"cases": [], "files": {}}
        lines.append(f"stored manifest unusable: {e}")
    for key in ("error_model", "produced_by"):
        if old_manifest.get(key) != new_manifest[key]:
            lines.append(f"{key}: {old_manifest.get(key)!r} -> {new_manifest[key]!r}")
    old_records = {c["name"]: c for c in old_manifest["cases"]}
    changes = []
    for record in new_manifest["cases"]:
        name, rel = record["name"], record["file"]
        dtype = DTYPES[record["dtype"]]
        new = logical(load(files[rel]), dtype)
        old = {}
        if name in old_records:
            if old_records[name] != record:
                keys = sorted(
                    k for k in set(record) | set(old_records[name]) if record.get(k) != old_records[name].get(k)
                )
                lines.append(f"case {name}: description changed ({', '.join(keys)})")
            try:
                old = logical(read_tensors(root / rel, old_manifest["files"][rel]), dtype)
            except (GoldenError, KeyError) as e:
                lines.append(f"case {name}: stored file unusable: {e}")
        else:
            lines.append(f"case {name}: new")
        changes += diff_tensors(name, old, new)
    for name in sorted(set(old_records) - {c["name"] for c in new_manifest["cases"]}):
        lines.append(f"case {name}: removed")
    stored_bytes = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None for rel in files}
    identical = all(stored_bytes[rel] == data for rel, data in files.items())
    lines.append(summary(changes, "reference goldens"))
    lines.append(f"files: {'byte-identical to' if identical else 'differ from'} the stored ones")
    changed = bool(changes) or not identical or any(line.startswith("case ") for line in lines)
    return "\n".join(lines), changed


def write_reference(root: Path, files: dict[str, bytes], manifest_bytes: bytes) -> None:
    (root / "reference").mkdir(parents=True, exist_ok=True)
    for path in (root / "reference").glob("*"):
        if str(path.relative_to(root)) not in files:
            path.unlink()  # a case no longer in CASES
    for rel, data in files.items():
        atomic_write(root / rel, data)
    atomic_write(manifest_path(root), manifest_bytes)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


# --- kernels and their per-platform bit snapshots --------------------------------------------------------


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernel_device() -> torch.device:
    return torch.device("cpu" if interpreting() or not torch.cuda.is_available() else "cuda")


def platform_key() -> dict:
    import triton

    device = "interpreter" if kernel_device().type == "cpu" else torch.cuda.get_device_name()
    return {"device": device, "triton": triton.__version__}


def key_slug(key: dict) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", f"{key['device']}-triton-{key['triton']}".lower()).strip("-")


def run_kernels(record: dict, tensors: dict[str, torch.Tensor], device=None) -> dict[str, torch.Tensor]:
    """The kernels of a case on its stored inputs in their recorded layouts: name -> output (CPU)."""
    import numpy

    device = kernel_device() if device is None else device
    inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
    laid = laid_out_inputs(record, inputs, device)
    x, grad, cos, sin = laid["x"], laid["grad"], laid["cos"], laid["sin"]
    with numpy.errstate(over="ignore"):  # the interpreter's FP32 overflow in the huge cases is intended
        outputs = run_case_kernels(record, x, grad, cos, sin)
    return {k: v.detach().cpu().contiguous() for k, v in outputs.items()}


def run_case_kernels(record: dict, x, grad, cos, sin) -> dict[str, torch.Tensor]:
    from dsrope import apply_partial_rope_triton, qnorm_rope_triton
    from dsrope.qnorm_rope import _forward

    rotary, eps = record["rotary"], record["eps"]
    outputs = {}
    if "v3_interleaved" in record["kernels"]:
        from dsrope.rope_utils import apply_rotary_emb

        xg = x.detach().requires_grad_()
        out = apply_rotary_emb(xg, torch.complex(cos, sin), record["qkv_format"], record["unsqueeze_dim"])
        (dx,) = torch.autograd.grad(out, xg, grad)
        outputs |= {"v3_interleaved.out": out, "v3_interleaved.dx": dx}
    if "v3_half_split" in record["kernels"]:
        from dsrope.rope_utils import apply_rotary_emb_half_split

        xg = x.detach().requires_grad_()
        out = apply_rotary_emb_half_split(xg, torch.complex(cos, sin), record["qkv_format"])
        (dx,) = torch.autograd.grad(out, xg, grad)
        outputs |= {"v3_half_split.out": out, "v3_half_split.dx": dx}
    if "qnorm_rope" in record["kernels"]:
        xg = x.detach().requires_grad_()
        out = qnorm_rope_triton(xg, cos, sin, rotary, eps)
        (dx,) = torch.autograd.grad(out, xg, grad)
        _, rstd = _forward(x, cos, sin, rotary, eps)
        outputs |= {"qnorm_rope.out": out, "qnorm_rope.rstd": rstd, "qnorm_rope.dx": dx}
    if "partial_rope" in record["kernels"]:
        xg = x.detach().requires_grad_()
        out = apply_partial_rope_triton(xg, cos, sin, rotary)
        (dx,) = torch.autograd.grad(out, xg, grad)
        outputs |= {"partial_rope.out": out, "partial_rope.dx": dx}
    return outputs


def snapshot_paths(root: Path, key: dict) -> tuple[Path, Path]:
    folder, slug = root / "snapshots", key_slug(key)
    return folder / f"{slug}.safetensors", folder / f"{slug}.json"


def read_snapshot(sidecar: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(sidecar, tensors) of a snapshot, after checking both against the sidecar's hashes."""
    meta = read_json(sidecar, "sidecar_sha256")
    return meta, read_tensors(sidecar.with_name(meta["file"]), meta)


def record_snapshot(root: Path = GOLDEN) -> str:
    """Run the kernels on every stored case and write the snapshot for this platform's key."""
    manifest = verify_all(root)
    key = platform_key()
    outputs, inputs = {}, {}
    for c in manifest["cases"]:
        record, tensors = load_case(root, manifest, c["name"])
        inputs[record["name"]] = input_hashes(tensors)
        for name, t in run_kernels(record, tensors).items():
            outputs[f"{record['name']}/{name}"] = t
    data_path, sidecar = snapshot_paths(root, key)
    report = snapshot_report(root, key, outputs)
    data = serialize(outputs, {"key": key})
    meta = {
        "about": "kernel outputs on one platform: written by `python -m tools.golden --update-snapshot`",
        "key": key,
        "produced_by": versions(),
        "file": data_path.name,
        "sha256": sha256(data),
        "bytes": len(data),
        "tensors": tensor_entries(outputs),
        "inputs": inputs,
    }
    data_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(data_path, data)
    atomic_write(sidecar, with_self_hash(meta, "sidecar_sha256"))
    return f"{report}\nrecorded {relname(data_path)} ({len(data)} bytes) and {relname(sidecar)}"


def snapshot_report(root: Path, key: dict, outputs: dict[str, torch.Tensor]) -> str:
    _, sidecar = snapshot_paths(root, key)
    if not sidecar.is_file():
        return f"no earlier snapshot for {key}"
    try:
        _, stored = read_snapshot(sidecar)
    except GoldenError as e:
        return f"earlier snapshot unusable: {e}"
    changes = []
    for case in sorted({k.split("/")[0] for k in set(stored) | set(outputs)}):
        old = {k.split("/", 1)[1]: v for k, v in stored.items() if k.startswith(case + "/")}
        new = {k.split("/", 1)[1]: v for k, v in outputs.items() if k.startswith(case + "/")}
        changes += diff_tensors(case, old, new)
    return summary(changes, f"kernel bits vs the earlier snapshot for {key}")


# --- command line -------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--update",
        action="store_true",
        help="write the regenerated reference goldens and manifest (default: only report)",
    )
    parser.add_argument(
        "--update-snapshot",
        action="store_true",
        help="run the kernels on the stored inputs and record this platform's bit snapshot",
    )
    parser.add_argument("--root", type=Path, default=GOLDEN, help="the golden folder (default: golden/)")
    args = parser.parse_args(argv)
    root = args.root.resolve()

    # The checkout's kernels and reference, in the interpreter where there is no GPU (as conftest.py does);
    # TRITON_INTERPRET must be set before dsrope is imported.
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

    status = 0
    # --update-snapshot alone records the kernels' bits and nothing else (test_golden.py checks that the
    # reference still reproduces the stored goldens on that platform).
    if args.update or not args.update_snapshot:
        files, manifest_bytes = generate()
        report, changed = reference_report(root, files, manifest_bytes)
        print(report)
        if args.update:
            write_reference(root, files, manifest_bytes)
            print(f"wrote {len(files)} files under {relname(root / 'reference')} and {relname(manifest_path(root))}")
        elif changed:
            print("not written: run with --update to store the regenerated goldens")
            status = 1
    if args.update_snapshot:
        print(record_snapshot(root))
    return status


if __name__ == "__main__":
    sys.exit(main())
