"""The ops the gate judges, one record each: how an implementation is called on a case, the reference's
model of every stage it outputs, the known semantics' eager emulations, the contract's labels, the dtypes
whose bits carry the semantics, what hypothesis may draw for it, and dsrope's own implementation (judged
through the same door as anybody else's), and the named causes of elements outside the model its reports
can give (dsrope_gate.diagnoses).

Everything that depends on which op is judged reads it from its record; no other module branches on an
op's name. `JUDGED` holds the ops an implementation of the contract's signature can be judged on
(docs/contract.md; rope_tables: docs/tables-and-pipelines.md): the two on rows of x (`ROWS`) and
rope_tables, whose own machinery (its cases, its call, its judge: `own_judge_module`) the conformance
package dispatches to; the DeepSeek-V3 rotations are judged on their golden cases (verify, the golden store)
with their own signature; a pipeline (tables then a q path) is compared with other pipelines
(dsrope_gate.pipelines).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dsrope_gate import diagnoses, differential, semantics, tables
from dsrope_gate.cases import Case, Inputs

# the stage each direction outputs: the forward's result, the backward's input gradient
DIRECTIONS = {"forward": "out", "backward": "dx"}
DEFAULT_CONTRACT = "two-boundaries"  # the training chain's (dsrope_reference.contracts.DEFAULT)


@dataclass(frozen=True)
class Op:
    name: str
    signature: str
    # call(fn, case, x, inputs) -> fn's output for x (x: inputs.x or a copy of it that requires grad)
    call: Callable
    # reference(case, inputs, contract) -> stage -> dsrope_reference Model (FP64, CPU) under the contract named
    # (dsrope_reference.contracts); stages not in `stages` are the reference's intermediate values (stored in the
    # goldens for the default contract, judged nowhere)
    reference: Callable[..., dict]
    stages: tuple[str, ...]  # the stages judged: "out", "dx", and dsrope's saved "rstd" where its kernel has one
    dsrope: str  # dsrope's implementation, module:callable
    emulations: dict = field(default_factory=dict)  # direction -> label -> emulate(x, cos, sin, rotary, eps, grad)
    # contract name -> direction -> the label of its semantics (a "+" joins its parts); DEFAULT_CONTRACT's first
    contract: dict = field(default_factory=dict)
    semantic_dtypes: tuple[str, ...] = ()  # the dtypes whose bits carry the semantics
    even_channels: bool = True  # whether D must be even (what hypothesis draws)
    value_kinds: tuple[str, ...] = ("normal", "mixed", "tiny", "huge", "zero_rows", "midpoint")
    eager: Callable | None = None  # the eager chain of stock torch ops the contract equals (dsrope_gate.differential)
    # direction -> the named causes of elements outside the model a report can give (dsrope_gate.diagnoses)
    diagnoses: dict = field(default_factory=dict)
    # the module that judges an implementation of this op where the row ops' machinery (conformance.calling,
    # judging) does not: its collect_cases, load_preset, preset_names, call, run_impl, pairs, first_violation_lines
    own_judge_module: str = ""
    directions: tuple[str, ...] = tuple(DIRECTIONS)  # what an implementation is judged in (a table: forward only)

    def __str__(self) -> str:
        return self.name

    def labels(self, contract: str = DEFAULT_CONTRACT) -> dict:
        """direction -> the semantics label of `contract` (a "+" joins its parts)."""
        if contract not in self.contract:
            raise ValueError(f"contract: expected one of {', '.join(self.contract)} for {self.name}, got {contract!r}")
        return self.contract[contract]

    def own_judge(self):
        """The module of own_judge_module, or None for an op judged by the row ops' machinery (imported by name:
        that machinery imports this module)."""
        return importlib.import_module(self.own_judge_module) if self.own_judge_module else None


# --- DeepSeek-V4: Q RMSNorm + partial RoPE, partial RoPE ----------------------------------------------------


def _qnorm_reference(case: Case, inputs: Inputs, contract: str = DEFAULT_CONTRACT) -> dict:
    from dsrope_reference import contracts

    x, cos, sin, grad = inputs
    fwd = contracts.forward(x, cos, sin, case.rotary, case.eps, contract)
    bwd = contracts.backward(x, grad, cos, sin, case.rotary, case.eps, contract)
    return {"out": fwd.out, "rstd": fwd.rstd, "dx": bwd.dx, "normalized": fwd.normalized, "derotated": bwd.derotated}


def _rope_reference(case: Case, inputs: Inputs, contract: str = DEFAULT_CONTRACT) -> dict:
    from dsrope_reference.contracts import partial_rope

    x, cos, sin, grad = inputs
    return {
        "out": partial_rope(x, cos, sin, case.rotary, contract=contract),
        "dx": partial_rope(grad, cos, sin, case.rotary, inverse=True, contract=contract),
    }


QNORM_ROPE = Op(
    name="qnorm_rope",
    signature="qnorm_rope(x, cos, sin, rotary, eps)",
    call=lambda fn, case, x, inputs: fn(x, inputs.cos, inputs.sin, case.rotary, case.eps),
    reference=_qnorm_reference,
    stages=("out", "rstd", "dx"),
    dsrope="dsrope:qnorm_rope_triton",
    emulations={
        "forward": {
            f"{norm}+{rotation}": semantics.qnorm_forward(norm, rotation)
            for norm in semantics.NORMS
            for rotation in semantics.ROTATIONS
        },
        "backward": {label: semantics.qnorm_backward(label) for label in semantics.BACKWARDS},
    },
    contract={
        "two-boundaries": {"forward": "two-boundaries+interleaved", "backward": "two-boundaries"},
        "fp32-through": {"forward": "fp32-through+interleaved", "backward": "no-boundary-2"},
        "every-op-rounded": {"forward": "every-op-rounded+interleaved", "backward": "every-op-rounded"},
        "bf16-tables": {"forward": "two-boundaries+bf16-tables", "backward": "bf16-tables"},
    },
    # in fp32 the rounding boundaries are no-ops, and a kernel's own rstd (reduction order, approximate
    # rsqrt) moves last bits of every element of a row: fp32 judges the verdict only
    semantic_dtypes=("bfloat16", "float16"),
    even_channels=False,
    value_kinds=("normal", "mixed", "tiny", "huge", "zero_rows", "midpoint", "overflow"),
    eager=differential.eager_qnorm_rope,
    diagnoses={"backward": (diagnoses.RSTD_CUBED_UNDERFLOW,)},
)

PARTIAL_ROPE = Op(
    name="partial_rope",
    signature="partial_rope(x, cos, sin, rotary)",
    call=lambda fn, case, x, inputs: fn(x, inputs.cos, inputs.sin, case.rotary),
    reference=_rope_reference,
    stages=("out", "dx"),
    dsrope="dsrope:apply_partial_rope_triton",
    emulations={
        "forward": {label: semantics.rope_forward(label) for label in semantics.ROTATIONS},
        "backward": {label: semantics.rope_backward(label) for label in semantics.ROTATIONS},
    },
    # partial RoPE has no norm: its fp32-through and every-op-rounded contracts are the rotation itself
    contract={
        "two-boundaries": {"forward": "interleaved", "backward": "interleaved"},
        "fp32-through": {"forward": "interleaved", "backward": "interleaved"},
        "every-op-rounded": {"forward": "interleaved", "backward": "interleaved"},
        "bf16-tables": {"forward": "bf16-tables", "backward": "bf16-tables"},
    },
    semantic_dtypes=("bfloat16", "float16", "float32"),
    eager=differential.eager_partial_rope,
)


# --- DeepSeek-V3 rotations (rope_utils): complex tables, bshd/thd ---------------------------------------------


def _v3_reference(pairing: str):
    def reference(case: Case, inputs: Inputs, contract: str = DEFAULT_CONTRACT) -> dict:
        from dsrope_reference.rope_utils import rotation

        x, cos, sin, grad = inputs
        # forward: the table; backward (the conjugate rotation of the gradient): the conjugate table
        return {
            "out": rotation(x, torch.complex(cos, sin), pairing),
            "dx": rotation(grad, torch.complex(cos, -sin), pairing),
        }

    return reference


V3_INTERLEAVED = Op(
    name="v3_interleaved",
    signature="apply_rotary_emb(x, freqs_cis, qkv_format, unsqueeze_dim)",
    call=lambda fn, case, x, inputs: fn(x, torch.complex(inputs.cos, inputs.sin), case.qkv_format, case.unsqueeze_dim),
    reference=_v3_reference("interleaved"),
    stages=("out", "dx"),
    dsrope="dsrope.rope_utils:apply_rotary_emb",
)

V3_HALF_SPLIT = Op(
    name="v3_half_split",
    signature="apply_rotary_emb_half_split(x, freqs_cis, qkv_format)",
    call=lambda fn, case, x, inputs: fn(x, torch.complex(inputs.cos, inputs.sin), case.qkv_format),
    reference=_v3_reference("half_split"),
    stages=("out", "dx"),
    dsrope="dsrope.rope_utils:apply_rotary_emb_half_split",
)

# --- rope tables, and the whole q path from positions (dsrope_gate.tables, dsrope_gate.pipelines) -------------


def _tables_reference(case, positions, contract: str = DEFAULT_CONTRACT) -> dict:
    """The contract's FP32 tables (fp32-elementwise, no attention factor, the CPU's allowances): cos and sin
    Models [B, S, R/2]. A builder that declares a factor is judged against the model scaled by it."""
    from dsrope_reference.rope_tables import CPU_ULPS

    cos, sin = tables.reference_model(case, 1.0, CPU_ULPS)
    return {"cos": cos, "sin": sin}


def _row_contracts() -> tuple[str, ...]:
    from dsrope_reference.contracts import CONTRACTS

    return tuple(CONTRACTS)


ROPE_TABLES = Op(
    name="rope_tables",
    signature="rope_tables(positions, rotary, theta, rope_scaling)",
    call=lambda fn, case, positions, inputs: fn(positions, case.rotary, case.theta, case.rope_scaling),
    reference=_tables_reference,
    stages=("cos", "sin"),
    dsrope="dsrope_gate.table_builders:dsrope_tables",
    emulations={"forward": {label: tables.emulation_builder(label) for label in tables.EMULATIONS}},
    # a table has one contract (dsrope_reference.rope_tables), whichever the q path is judged under
    contract={name: {"forward": tables.CONTRACT} for name in (*_row_contracts(), tables.CONTRACT)},
    semantic_dtypes=("float32",),
    own_judge_module="dsrope_gate.conformance.rope_tables",
    directions=("forward",),
)

# A pipeline (dsrope_gate.pipelines): a project's table builder, then its q path on those tables and on the
# contract's; compared with other pipelines from the same positions, never judged against a reference alone.
PIPELINE = Op(
    name="pipeline",
    signature="pipeline(positions, x, reference_cos, reference_sin, rotary, theta, rope_scaling, eps)",
    call=lambda fn, case, x, inputs: fn(
        inputs.positions, x, inputs.cos, inputs.sin, case.rotary, case.theta, case.rope_scaling, case.eps
    ),
    reference=lambda case, inputs, contract=DEFAULT_CONTRACT: {},
    stages=(),
    dsrope="",  # dsrope's pipeline: dsrope_gate.pipelines.PIPELINES["dsrope"]
    own_judge_module="dsrope_gate.pipelines",
    directions=("forward",),
)

OPS = {op.name: op for op in (QNORM_ROPE, PARTIAL_ROPE, V3_INTERLEAVED, V3_HALF_SPLIT, ROPE_TABLES, PIPELINE)}
JUDGED = {op.name: op for op in (QNORM_ROPE, PARTIAL_ROPE, ROPE_TABLES)}
# the ops on the rows of x [B, H, S, D] (cases of dsrope_gate.cases, references of dsrope_reference per row)
ROWS = {op.name: op for op in (QNORM_ROPE, PARTIAL_ROPE)}


def op_named(name: str | Op) -> Op:
    """The record of an op given by name (or the record itself)."""
    if isinstance(name, Op):
        return name
    if name not in OPS:
        raise ValueError(f"op: expected one of {', '.join(OPS)}, got {name!r}")
    return OPS[name]
