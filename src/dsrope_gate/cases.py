"""The golden cases: fixed input sets (x, an upstream gradient, cos/sin) with their layouts, the inputs
made from each case's seed alone, and the reference's value of every stage a kernel outputs.

The golden store (dsrope_gate.golden) keeps these inputs and reference stages on disk; verify and the
conformance command run kernels on them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from dsrope_reference.floats import same_values

from dsrope_gate.inputs import tables
from dsrope_gate.layouts import Layout, materialize

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class GoldenError(Exception):
    """A golden case or file is missing, corrupted, or does not match its record or manifest."""


# --- cases -------------------------------------------------------------------------------------


# The golden cases' layouts by name (the manifest records each one's fields, strides and offset).
LAYOUTS = dict(
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
    return {
        "x": LAYOUTS[case.x_layout],
        "grad": LAYOUTS[case.grad_layout],
        "cos": LAYOUTS[case.table_layout],
        "sin": LAYOUTS[case.table_layout],
    }


# The Layout fields a case uses (Layout may grow others, with defaults: they are not recorded).
LAYOUT_FIELDS = ("order", "pad", "step", "offset", "broadcast")


def case_record(case: Case, inputs: dict[str, torch.Tensor]) -> dict:
    """The manifest's description of a case: seeds, shapes, dtypes, and each input's layout."""
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
    from dsrope_reference.rope_utils import upstream_frequencies, upstream_table

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
    cos, sin = tables(b, s, rotary, g, per_batch, device="cpu")
    return {"x": x.to(dtype), "grad": grad.to(dtype), "cos": cos.contiguous(), "sin": sin.contiguous()}


def laid_out_inputs(record: dict, inputs: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The inputs as the kernels get them: each logical tensor in its recorded layout on `device`."""
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
    from dsrope_reference import qnorm_rope
    from dsrope_reference.rope import partial_rope

    x, grad, cos, sin = inputs["x"], inputs["grad"], inputs["cos"], inputs["sin"]
    stages = {}
    for pairing in ("interleaved", "half_split"):
        if f"v3_{pairing}" in case.kernels:
            from dsrope_reference import rope_utils

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
