"""Known semantics of a Q-norm + RoPE or a partial RoPE implementation, each as an eager emulation, and
the classifier the conformance command names an implementation's semantics with.

Every emulation takes (x, cos, sin, rotary, eps, grad) on the CPU (x [B, H, S, D] any strides, cos/sin
FP32 [B, S, >= R/2]) and returns the output (forward) or the input gradient for `grad` (backward), in
x.dtype. Labels (docs/contract.md names the contract's):

Norm (qnorm_rope forward)
  two-boundaries   the contract: F.rms_norm(x, (D,), eps) in x.dtype (boundary 1), then the rotation
  fp32-through     boundary 1 missing: the FP32 normalized row goes into the rotation unrounded; the
                   unrotated channels are rounded once
  rounded-rstd     1/sqrt(mean(x^2) + eps) rounded to x.dtype, then x times it in x.dtype
  every-op-rounded the official eager q norm `x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)` on
                   x.dtype tensors: the square, the mean, the sum with eps, the rsqrt and the product each
                   rounded to x.dtype (bf16: every op of the chain a bf16 op)
Rotation (both ops; pairs of the trailing R channels unless said)
  interleaved      the contract: pairs (D-R+2k, D-R+2k+1), a*c - b*s and a*s + b*c in FP32 (each product
                   and the sum rounded to FP32), one round-to-nearest-even store
  half-split       rotate_half pairing inside the trailing R channels: channel D-R+k with D-R/2+k
  leading-channels interleaved pairs in the leading R channels (2k, 2k+1)
  truncating-store the contract's FP32 values stored with truncation toward zero
  fma-rotation     each lane's own product fused into the add, as a compiler contracts x*cos + rotate(x)*sin:
                   fma(a, c, -rn(b*s)) and fma(b, c, rn(a*s)), each rounded once to FP32 (inside the
                   error model, other bits; the H200's contraction of dsrope's and the peers' kernels)
  bf16-tables      the contract's rotation with cos and sin rounded to bf16 first, whatever x.dtype (a
                   trainer's rope cache kept in the model's bf16: prime-rl PR 3584, vllm-project/vllm#48304)
  dtype-math       the rotation computed in x.dtype, as a hand-written rope on x.dtype tensors runs: cos and
                   sin cast to x.dtype, each product and the sum computed in FP32 and rounded to x.dtype
                   (fp32 inputs: the contract's rotation; after fp32-through each product of the FP32 row
                   is computed in FP32 and stored in x.dtype). Named for the dtype, not bf16: fp16 inputs
                   compute in fp16
  rotary-factor-twice  the partial rotary factor R/D applied to the rope slice again (Megatron-Bridge PR
                   4271): R' = R*R/D channels (even, rounded down; DSV4: 8 of 64) rotated, the leading R'
                   of the trailing R, as interleaved pairs with the table's first R'/2 entries; the other
                   R - R' rope channels pass through unrotated. (The real bug's short cache holds the
                   frequencies of an R'-channel rope, entries k*D/R of ours for plain angle tables; the
                   label names which channels turn, the bits of those channels may differ.)
Backward (qnorm_rope)
  two-boundaries   autograd through the contract's eager chain: the de-rotated gradient is rounded to
                   x.dtype (boundary 2) before the RMSNorm backward
  no-boundary-2    the de-rotated gradient stays FP32 into the RMSNorm backward; dx rounded once
  every-op-rounded autograd through the official eager q norm on x.dtype tensors: torch's derivative
                   formulas (mul, rsqrt's -0.5 * grad * result.pow(3), mean's grad / D, pow's grad * 2x, the
                   two gradients of x summed), every op's FP32 result rounded to x.dtype
  bf16-tables      the contract's backward (two-boundaries) with cos and sin rounded to bf16 first
The backward of partial_rope is the rotation by the conjugate table (sine negated): the rotation labels.

A qnorm_rope forward emulation is a norm label with a rotation label, named "norm+rotation"; the
classifier reports the parts of the best ones. Where a rounding is a no-op (fp32 outputs: truncating-store
equals interleaved, fp32-through equals two-boundaries) the emulations give the same bits: a tie, and the
conformance command uses bf16 and fp16 cases for the semantics.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dsrope_reference.floats import bits
from dsrope_reference.rope import round_nearest_exact, two_sum

ROTATIONS = (
    "interleaved",
    "half-split",
    "leading-channels",
    "truncating-store",
    "fma-rotation",
    "bf16-tables",
    "rotary-factor-twice",
    "dtype-math",
)
NORMS = ("two-boundaries", "fp32-through", "rounded-rstd", "every-op-rounded")
BACKWARDS = ("two-boundaries", "no-boundary-2", "every-op-rounded", "bf16-tables")
# One line per label: the report's and --help's definitions (the module docstring says more).
LABELS = {
    "two-boundaries": "the contract: the normalized row rounded to x.dtype before the rotation (forward); the "
    "de-rotated gradient rounded before the RMSNorm backward (backward)",
    "fp32-through": "boundary 1 missing: the FP32 normalized row goes into the rotation unrounded",
    "rounded-rstd": "1/sqrt(mean(x^2)+eps) rounded to x.dtype, then x times it in x.dtype",
    "every-op-rounded": "the official eager q norm on x.dtype tensors: every op's result rounded to x.dtype "
    "(backward: autograd through it)",
    "no-boundary-2": "backward: the de-rotated gradient stays FP32 into the RMSNorm backward",
    "interleaved": "the contract: pairs (D-R+2k, D-R+2k+1), FP32 math, one round-to-nearest-even store",
    "half-split": "rotate_half pairing inside the trailing R channels (D-R+k with D-R/2+k)",
    "leading-channels": "interleaved pairs in the leading R channels instead of the trailing ones",
    "truncating-store": "the contract's FP32 values stored with truncation toward zero",
    "fma-rotation": "each lane's product fused into the add (a GPU compiler's contraction; inside the model)",
    "bf16-tables": "cos and sin rounded to bf16 before the rotation (backward: the de-rotation's tables too)",
    "rotary-factor-twice": "the partial rotary factor applied twice: only the leading R*R/D channels of the rope "
    "slice turn",
    "dtype-math": "the rotation in x.dtype: cos and sin cast to it, each product and the sum rounded to it",
}


# --- stores ------------------------------------------------------------------------------------------


def truncate(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FP32 values into dtype, rounded toward zero."""
    r = v.to(dtype)
    if dtype == torch.float32:
        return r
    too_far = r.float().abs() > v.abs()  # round-to-nearest went away from zero: one step back
    return torch.where(too_far & v.isfinite(), torch.nextafter(r, torch.zeros_like(r)), r)


def stored(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An FP32 result stored in dtype (round to nearest even), held in FP32: one op of an x.dtype chain."""
    return v.to(dtype).float()


def fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fl32(a*b + c) for FP32 a, b, c, rounded once: a*b is exact in FP64, TwoSum makes the sum exact."""
    hi, lo = two_sum(a.double() * b.double(), c.double())
    return round_nearest_exact(hi, lo, torch.float32).float()


# --- rotations ----------------------------------------------------------------------------------------


def rotate_fp32(
    y: torch.Tensor, cos, sin, rotary: int, label: str = "interleaved", dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """y FP32 [B, H, S, D] with its rotary pairs rotated per `label` in FP32, not stored (autograd flows
    through it): the one eager rotation of the gate. cos/sin FP32 [B, S, >= R/2], entry k pair k's. `dtype`
    is the input's, which dtype-math computes in (each result rounded to it, held in FP32)."""
    d = y.shape[-1]
    start = 0 if label == "leading-channels" else d - rotary
    if label == "rotary-factor-twice":  # R/D of the rope slice again: its leading R*R/D channels turn
        rotary = 2 * (rotary * rotary // (2 * d))
    half = rotary // 2
    c, s = cos[..., :half].float()[:, None], sin[..., :half].float()[:, None]
    if label == "bf16-tables":
        c, s = c.bfloat16().float(), s.bfloat16().float()
    if label == "dtype-math":  # the tables cast to x.dtype; below, every op's FP32 result rounded to it
        c, s = c.to(dtype).float(), s.to(dtype).float()
    if label == "half-split":
        a, b = y[..., start : start + half], y[..., start + half : start + rotary]
    else:
        a, b = y[..., start : start + rotary : 2], y[..., start + 1 : start + rotary : 2]
    if label == "fma-rotation":  # each lane's own value times cos fused: x*cos + rotate(x)*sin contracted
        first, second = fma32(a, c, -(b * s)), fma32(b, c, a * s)
    elif label == "dtype-math":
        ac, bs, as_, bc = (stored(p * q, dtype) for p, q in ((a, c), (b, s), (a, s), (b, c)))
        first, second = stored(ac - bs, dtype), stored(as_ + bc, dtype)
    else:
        first, second = a * c - b * s, a * s + b * c
    if label == "half-split":
        rotated = torch.cat((first, second), -1)
    else:
        rotated = torch.stack((first, second), -1).flatten(-2)
    return torch.cat((y[..., :start], rotated, y[..., start + rotary :]), -1)


def rotate(y: torch.Tensor, cos, sin, rotary: int, label: str, dtype: torch.dtype) -> torch.Tensor:
    """y FP32 [B, H, S, D] rotated per `label` and stored into dtype; the channels the label does not
    rotate are y rounded to nearest (exact where y already holds dtype values)."""
    out = rotate_fp32(y, cos, sin, rotary, label, dtype)
    if label == "truncating-store":
        start = y.shape[-1] - rotary
        return torch.cat((y[..., :start].to(dtype), truncate(out[..., start:], dtype)), -1).contiguous()
    return out.to(dtype).contiguous()


# --- the qnorm_rope norms ---------------------------------------------------------------------------------


def normalized(x: torch.Tensor, eps: float, label: str) -> torch.Tensor:
    """The row after the norm, FP32 (holding x.dtype values where the label rounds it)."""
    d = x.shape[-1]
    if label == "two-boundaries":
        return F.rms_norm(x, (d,), eps=eps).float()
    if label == "fp32-through":
        return F.rms_norm(x.float(), (d,), eps=eps)
    if label == "every-op-rounded":
        # the official eager code, each op computed in FP32 on its x.dtype operands and rounded once (torch's
        # CPU bf16 rsqrt of a short tensor rounds sqrt to bf16 before the reciprocal: not the label's bits)
        square = x.float().square().to(x.dtype)
        mean = square.float().mean(-1, keepdim=True).to(x.dtype)
        r = torch.rsqrt((mean.float() + eps).to(x.dtype).float()).to(x.dtype)
        return (x.float() * r.float()).to(x.dtype).float()
    r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    return (x * r).float()


# --- emulations ----------------------------------------------------------------------------------------


def qnorm_forward(norm: str, rotation: str):
    def emulate(x, cos, sin, rotary, eps, grad=None):
        return rotate(normalized(x, eps, norm), cos, sin, rotary, rotation, x.dtype)

    return emulate


def rope_forward(rotation: str):
    def emulate(x, cos, sin, rotary, eps=None, grad=None):
        return rotate(x.float(), cos, sin, rotary, rotation, x.dtype)

    return emulate


def rope_backward(rotation: str):
    def emulate(x, cos, sin, rotary, eps, grad):
        return rotate(grad.float(), cos, -sin, rotary, rotation, grad.dtype)

    return emulate


def every_op_rounded_backward(x, cos, sin, rotary: int, eps: float, grad) -> torch.Tensor:
    """dx of autograd through the official eager q norm on x.dtype tensors and the FP32 rotation, as a GPU
    runs it: torch's derivative formulas op by op, each op computed in FP32 and stored in x.dtype (written
    out: torch's CPU bf16 rsqrt of a short tensor rounds sqrt first, a GPU does not)."""
    dtype, xf = x.dtype, x.float()
    square = stored(xf * xf, dtype)
    mean = stored(square.mean(-1, keepdim=True), dtype)
    rs = stored(torch.rsqrt(stored(mean + eps, dtype)), dtype)
    gy = stored(rotate_fp32(grad.float(), cos, -sin, rotary), dtype)  # the cast's backward: boundary 2
    g_rs = stored(stored(gy * xf, dtype).sum(-1, keepdim=True), dtype)  # mul's gradient, summed to rs's shape
    cube = stored(stored(rs * rs, dtype) * rs, dtype)  # result.pow(3): torch's base * base * base in x.dtype
    gz = stored(stored(-0.5 * g_rs, dtype) * cube, dtype)  # rsqrt: -0.5 * grad * result.pow(3)
    gq = stored(gz / x.shape[-1], dtype)  # mean: grad.expand() / D
    dx_square = stored(gq * stored(2 * xf, dtype), dtype)  # pow(x, 2): grad * (2 * x)
    dx_mul = stored(gy * rs, dtype)
    return (dx_mul + dx_square).to(dtype).contiguous()


def qnorm_backward(label: str):
    """Autograd through F.rms_norm (in x.dtype, or FP32 for no-boundary-2), the FP32 interleaved
    rotation and the cast to x.dtype (bf16-tables: on tables rounded to bf16); every-op-rounded:
    every_op_rounded_backward."""

    def emulate(x, cos, sin, rotary, eps, grad):
        if label == "every-op-rounded":
            return every_op_rounded_backward(x, cos, sin, rotary, eps, grad.expand(x.shape))
        if label == "bf16-tables":
            cos, sin = cos.bfloat16().float(), sin.bfloat16().float()
        xg = x.detach().clone().requires_grad_()
        d = x.shape[-1]
        if label in ("two-boundaries", "bf16-tables"):
            y = F.rms_norm(xg, (d,), eps=eps).float()  # the upcast's backward rounds g' to x.dtype
        else:
            y = F.rms_norm(xg.float(), (d,), eps=eps)
        out = rotate_fp32(y, cos, sin, rotary).to(x.dtype)
        (dx,) = torch.autograd.grad(out, xg, grad.expand(out.shape))
        return dx

    return emulate


# --- evidence ----------------------------------------------------------------------------------------------


def agreement(got: torch.Tensor, emulated: torch.Tensor) -> float:
    """The share of elements whose bits are equal (NaN meets NaN whatever its payload; +0 and -0 differ;
    an empty tensor agrees fully, another shape or dtype not at all)."""
    if got.shape != emulated.shape or got.dtype != emulated.dtype:
        return 0.0
    if got.numel() == 0:
        return 1.0
    same = bits(got) == bits(emulated)
    if not bool(same.all()):
        same |= got.isnan() & emulated.isnan()
    return int(same.sum()) / same.numel()


def classify(evidence: list[dict], threshold: float = 0.999) -> list[str]:
    """The labels whose emulations agree best (the highest mean share over the cases; ties together),
    listed only where each of them reaches `threshold` on every case; [] otherwise (no known semantics).
    Combined labels ("norm+rotation") are reported as their parts, norms first, each in the order of the
    first case's labels: the contract's qnorm_rope forward reads ["two-boundaries", "interleaved"]."""
    if not evidence:
        return []
    mean = {label: sum(case[label] for case in evidence) / len(evidence) for label in evidence[0]}
    best = max(mean.values())
    chosen = [label for label in evidence[0] if mean[label] == best]
    if not all(case[label] >= threshold for label in chosen for case in evidence):
        return []
    split = [label.split("+") for label in chosen]
    parts = []
    for position in range(max(len(s) for s in split)):
        for s in split:
            if len(s) > position and s[position] not in parts:
                parts.append(s[position])
    return parts


# --- how far apart the semantics are (tests/test_semantics.py) ----------------------------------------------


def agreement_matrix(emulations: dict, x, cos, sin, rotary: int, eps=None, grad=None) -> dict:
    """label -> label -> agreement of the emulations (an op's, one direction: Op.emulations[direction])
    on one case: how far apart the semantics are there."""
    out = {label: fn(x, cos, sin, rotary, eps, grad) for label, fn in emulations.items()}
    return {p: {q: agreement(out[p], out[q]) for q in out} for p in out}
