"""The contracts an implementation can be judged against, by name: each an FP64 reference with a
per-element error model (docs/contract.md derives each), for both ops and both directions.

    forward(x, cos, sin, rotary, eps, contract=...)        -> qnorm_rope.Forward (out, normalized, rstd)
    backward(x, grad, cos, sin, rotary, eps, contract=...) -> qnorm_rope.Backward (dx, derotated)
    partial_rope(x, cos, sin, rotary, inverse=False, contract=...) -> rope.Model

two-boundaries is the default and the functions it names are qnorm_rope.forward, qnorm_rope.backward and
rope.partial_rope themselves. A contract that says nothing about a stage keeps the two-boundaries one:
partial RoPE has no norm, so its fp32-through and every-op-rounded contracts are the contract's rotation
itself (one FP32 rotation, one rounding); every-op-rounded's backward de-rotates as two-boundaries does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsrope_reference import every_op_rounded, qnorm_rope, rope
from dsrope_reference.floats import round_nearest

DEFAULT = "two-boundaries"


@dataclass(frozen=True)
class Contract:
    name: str
    description: str  # one line: the report's and --help's definition
    forward: Callable  # (x, cos, sin, rotary, eps) -> qnorm_rope.Forward
    backward: Callable  # (x, grad, cos, sin, rotary, eps) -> qnorm_rope.Backward
    partial_rope: Callable  # (x, cos, sin, rotary, inverse=False) -> rope.Model


def bf16_tables(cos: torch.Tensor, sin: torch.Tensor):
    """cos and sin rounded to nearest even into bf16 (their values, FP32)."""
    return (round_nearest(t.detach().to("cpu", torch.float64), torch.bfloat16).float() for t in (cos, sin))


def forward_bf16_tables(x, cos, sin, rotary, eps):
    return qnorm_rope.forward(x, *bf16_tables(cos, sin), rotary, eps)


def backward_bf16_tables(x, grad, cos, sin, rotary, eps):
    return qnorm_rope.backward(x, grad, *bf16_tables(cos, sin), rotary, eps)


def partial_rope_bf16_tables(x, cos, sin, rotary, inverse=False):
    return rope.partial_rope(x, *bf16_tables(cos, sin), rotary, inverse=inverse)


CONTRACTS = {
    c.name: c
    for c in (
        Contract(
            "two-boundaries",
            "the training chain: the normalized row rounded to x.dtype before the FP32 rotation (forward), the "
            "de-rotated gradient rounded before the RMSNorm backward (backward)",
            qnorm_rope.forward,
            qnorm_rope.backward,
            rope.partial_rope,
        ),
        Contract(
            "fp32-through",
            "the normalized row stays FP32 into the rotation, one rounding at the end; backward: the de-rotated "
            "gradient stays FP32 into the RMSNorm backward, dx rounded once (partial RoPE: the contract's rotation)",
            qnorm_rope.forward_fp32_through,
            qnorm_rope.backward_fp32_through,
            rope.partial_rope,
        ),
        Contract(
            "every-op-rounded",
            "the official eager q norm x * rsqrt(mean(x^2) + eps) on x.dtype tensors, every op's FP32 result "
            "rounded to x.dtype, then the FP32 rotation; backward: autograd through that chain (partial RoPE: "
            "the contract's rotation)",
            every_op_rounded.forward,
            every_op_rounded.backward,
            rope.partial_rope,
        ),
        Contract(
            "bf16-tables",
            "the two-boundaries contract with cos and sin rounded to bf16 first, whatever x.dtype",
            forward_bf16_tables,
            backward_bf16_tables,
            partial_rope_bf16_tables,
        ),
    )
}


def contract_named(name: str) -> Contract:
    """The contract called `name`; a ValueError naming the known ones for any other name."""
    if name not in CONTRACTS:
        raise ValueError(f"contract: expected one of {', '.join(CONTRACTS)}, got {name!r}")
    return CONTRACTS[name]


def forward(x, cos, sin, rotary: int, eps: float, contract: str = DEFAULT) -> qnorm_rope.Forward:
    """The model of Q RMSNorm + partial RoPE's forward under `contract`."""
    return contract_named(contract).forward(x, cos, sin, rotary, eps)


def backward(x, grad, cos, sin, rotary: int, eps: float, contract: str = DEFAULT) -> qnorm_rope.Backward:
    """The model of Q RMSNorm + partial RoPE's input gradient for `grad` under `contract`."""
    return contract_named(contract).backward(x, grad, cos, sin, rotary, eps)


def partial_rope(x, cos, sin, rotary: int, inverse: bool = False, contract: str = DEFAULT) -> rope.Model:
    """The model of partial RoPE (inverse: the conjugate rotation, its backward) under `contract`."""
    return contract_named(contract).partial_rope(x, cos, sin, rotary, inverse=inverse)
