"""No fused multiply-add in the kernels that rotate, as their launchers compile them for sm_90.

docs/contract.md: each product and each sum of the rotation is rounded to FP32, which a GPU compiler keeps only
when it is told not to contract (the launch option `enable_fp_fusion=False`, dsrope.pair_rotation.UNFUSED).
Triton's interpreter computes unfused whatever the option says, so the CPU suite checks the option where it
acts: every kernel is launched through its public function (interpreted on CPU), its launch recorded with the
arguments and options the launcher actually passed (dsrope_dev.ptx.capturing), and that launch compiled to PTX
for sm_90 (Triton's own ptxas, no GPU). The PTX must hold no f32 multiply-add: a launcher that drops the option,
or a kernel that writes tl.fma, fails here. Control: the same launch without its options compiles to f32 fmas
(the detector sees what it looks for).

The unmarked test covers every kernel in bf16 on one small geometry; the slow one every dtype on geometries with
an odd D - R, a rotary slice of the whole row and strided, unaligned layouts.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch

import dsrope
import dsrope.qnorm_rope
import dsrope.rope
from dsrope_dev.ptx import capturing, compile_in_child, f32_fmas
from dsrope_gate.inputs import DEVICE, laid_out, tables
from dsrope_gate.layouts import TOKEN_MAJOR, Layout

KERNELS = {
    "_rotate": dsrope.rope._rotate,
    "_rotate_split": dsrope.rope._rotate_split,
    "_rotate_inplace": dsrope.rope._rotate_inplace,
    "_qnorm_rope": dsrope.qnorm_rope._qnorm_rope,
    "_qnorm_rope_backward": dsrope.qnorm_rope._qnorm_rope_backward,
}


def compiles_here() -> bool:
    from triton.compiler import ASTSource

    return "constexprs" in inspect.signature(ASTSource).parameters


pytestmark = pytest.mark.skipif(
    not compiles_here(), reason="compiling to PTX needs ASTSource(constexprs=...): triton 3.3 or later"
)


PARTIAL = ("_rotate", "_rotate_split", "_rotate_inplace")
QNORM = ("_qnorm_rope", "_qnorm_rope_backward")


def launch_every_kernel(monkeypatch, dtype, shape, rotary, layout):
    """Every rotating kernel launched through the public functions, forward and backward: the partial RoPE
    out of place in both forms (split and whole-row), in place, and the QNorm forward (with rstd and, without a
    gradient, without) and backward (the partial RoPE only on an even D: it refuses an odd one). Returns the
    recorded launches, each once."""
    x = laid_out(shape, dtype, layout, seed=1)
    grad = laid_out(shape, dtype, layout, seed=2)
    cos, sin = tables(shape[0], shape[2], rotary, seed=3)
    with capturing(KERNELS.values()) as launches:
        for split_rows in (dsrope.rope.SPLIT_ROWS, -1) if shape[-1] % 2 == 0 else ():  # -1: the whole-row form
            monkeypatch.setattr(dsrope.rope, "SPLIT_ROWS", split_rows)
            xg = x.detach().clone().requires_grad_()
            torch.autograd.grad(dsrope.apply_partial_rope_triton(xg, cos, sin, rotary), xg, grad)
            xi = torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=DEVICE).copy_(x)
            dsrope.apply_partial_rope_triton_(xi, cos, sin, rotary)
        xg = x.detach().clone().requires_grad_()
        torch.autograd.grad(dsrope.qnorm_rope_triton(xg, cos, sin, rotary, 1e-6), xg, grad)
        dsrope.qnorm_rope_triton(x, cos, sin, rotary, 1e-6)  # no gradient wanted: the launch without rstd
    unique = {json.dumps(dataclasses.asdict(launch), sort_keys=True): launch for launch in launches}
    return list(unique.values())


def assert_no_f32_fma(launches, expected=tuple(KERNELS)):
    kernels = {launch.kernel for launch in launches}
    assert kernels == set(expected), f"launched {sorted(kernels)}, expected {sorted(expected)}"
    for launch, text in zip(launches, compile_in_child(launches), strict=True):
        fmas = f32_fmas(text)
        assert not fmas, (
            f"{launch.kernel} compiles to {len(fmas)} f32 multiply-adds ({sorted(set(fmas))}) with the options "
            f"its launcher passed, {launch.options}: the rotation's products are fused (expected "
            f"enable_fp_fusion=False, dsrope.pair_rotation.UNFUSED); constexprs {launch.constexprs}"
        )


def test_every_rotating_kernel_compiles_without_fma(monkeypatch):
    assert_no_f32_fma(launch_every_kernel(monkeypatch, torch.bfloat16, (1, 3, 2, 16), 8, TOKEN_MAJOR))


def test_without_the_options_every_kernel_compiles_to_fma(monkeypatch):
    """The control: one launch of each kernel, its options dropped (Triton's default contracts), has f32 fmas."""
    launches = launch_every_kernel(monkeypatch, torch.bfloat16, (1, 3, 2, 16), 8, TOKEN_MAJOR)
    one_each = {launch.kernel: dataclasses.replace(launch, options={}) for launch in launches}
    for name, text in zip(one_each, compile_in_child(list(one_each.values())), strict=True):
        assert f32_fmas(text), f"{name}: no f32 fma without enable_fp_fusion=False: the detector sees nothing"


GEOMETRIES = [
    # shape [B, H, S, D], rotary, layout of x and of the gradient
    ((1, 3, 2, 25), 8, Layout(step=(2, 1, 3, 1))),  # odd D - R (the QNorm's shifted lanes; QNorm only), stepped
    ((2, 2, 3, 18), 18, Layout(order=(0, 2, 1, 3), offset=7)),  # the whole row rotated, an unaligned offset
    ((1, 4, 2, 40), 16, Layout(order=(3, 0, 1, 2))),  # channels outer: channel stride not 1
]


@pytest.mark.slow
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"D{g[0][-1]}R{g[1]}")
def test_every_rotating_kernel_compiles_without_fma_on_more_specializations(monkeypatch, geometry):
    """Every dtype on a geometry, each dtype's launches checked as the unmarked test checks bf16's."""
    shape, rotary, layout = geometry
    launches = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        launches += launch_every_kernel(monkeypatch, dtype, shape, rotary, layout)
    assert {launch.signature["x"] for launch in launches} == {"*bf16", "*fp16", "*fp32"}
    assert_no_f32_fma(launches, QNORM if shape[-1] % 2 else PARTIAL + QNORM)
