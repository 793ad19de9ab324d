"""Where torch's own autograd of F.rms_norm leaves the contract's backward on huge rows, on this machine.

F.rms_norm is a composite of stock ops on CPU (pow, mean, add, rsqrt, mul): autograd differentiates the
rsqrt as -0.5 * grad * r^3, with r = rstd the FP32 result, so its input gradient is
r * g - x * r^3 * mean(g * x): the contract's r * (g' - xhat * mean(g' * xhat)) with r^3 formed in FP32.
r^3 leaves FP32's normal range (2^-126) when r < 2^-42, i.e. rows of rms above 2^42, and is 0 from
rms 2^(149/3) ~ 2^49.7 on: the projection term loses its bits, then all of them.

For rows of rms in [2^k, 2^(k+1)) (k from --lo to --hi) this measures, per dtype (fp32 and bf16; fp16 cannot hold such
rows): torch's FP32 r^3 for that row (normal, subnormal, zero), and how many of the eager chain's
(dsrope_gate.differential.eager_qnorm_rope: F.rms_norm, then the FP32 rotation) input-gradient elements
lie outside the contract's backward model (dsrope_reference.qnorm_rope.backward), on --rows rows of D
channels of N(0, 1) values scaled to an rms drawn in that binade, the gradient N(0, 1); "(diagnosed)" where
the gate's diagnosis (dsrope_gate.diagnoses.RSTD_CUBED_UNDERFLOW) explains every one of them.

    python -m tools.rms_norm_underflow [--lo 36] [--hi 62] [--rows 64] [--dim 512]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from dsrope_reference import qnorm_rope
from dsrope_reference.floats import inside

from dsrope_gate.cases import Case, Inputs
from dsrope_gate.diagnoses import rstd_cubed_underflows
from dsrope_gate.differential import eager_qnorm_rope
from dsrope_gate.inputs import tables

TINY = 2.0**-126  # FP32's smallest normal number
EPS = 1e-6


def rstd_cubed_class(r3: float) -> str:
    if r3 == 0:
        return "zero"
    return "subnormal" if abs(r3) < TINY else "normal"


def measure(k: int, dtype: torch.dtype, rows: int, dim: int, rotary: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed + k)
    x64 = torch.randn(1, rows, 1, dim, generator=g, dtype=torch.float64)
    # each row's rms drawn in [2^k, 2^(k+1)): at exactly 2^k, r and r^3 would be powers of two, exact even
    # as FP32 subnormals
    rms = 2.0**k * (1 + torch.rand(1, rows, 1, 1, generator=g, dtype=torch.float64))
    x64 = x64 / x64.pow(2).mean(-1, keepdim=True).sqrt() * rms
    x, grad = x64.to(dtype), torch.randn(1, rows, 1, dim, generator=g).to(dtype)
    cos, sin = tables(1, 1, rotary, g, False, device="cpu")
    leaf = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(eager_qnorm_rope(leaf, cos, sin, rotary, EPS), leaf, grad)
    model = qnorm_rope.backward(x, grad, cos, sin, rotary, EPS).dx
    mask = ~inside(dx.double(), model.ref, model.lo, model.hi)
    outside = int(mask.sum())
    case = Case("rows", tuple(x.shape), rotary, str(dtype).removeprefix("torch."), None, eps=EPS)
    named = bool(mask.any()) and rstd_cubed_underflows(case, Inputs(x, cos, sin, grad), dx.double(), model, mask)
    # torch's own r and r^3 for these rows, as the composite forms them (FP32)
    r = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    r3 = r.pow(3)
    classes = sorted({rstd_cubed_class(float(v)) for v in r3.flatten()})
    return {"r3": classes, "r3_min": float(r3.min()), "outside": outside, "elements": dx.numel(), "named": named}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.rms_norm_underflow", description=__doc__.split("\n")[0])
    ap.add_argument("--lo", type=int, default=36, help="smallest log2 of the row rms (default 36)")
    ap.add_argument("--hi", type=int, default=62, help="largest log2 of the row rms (default 62)")
    ap.add_argument("--rows", type=int, default=64, help="rows per magnitude (default 64)")
    ap.add_argument("--dim", type=int, default=512, help="channels per row, D (default 512)")
    ap.add_argument("--rotary", type=int, default=64, help="rotary channels, R (default 64)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}; F.rms_norm's autograd graph: {_graph()}")
    print(f"{args.rows} rows of D = {args.dim} (R = {args.rotary}) per magnitude; eps {EPS}")
    print("| row rms in | torch's FP32 r^3 | smallest r^3 | fp32 outside the model | bf16 outside the model |")
    print("|---|---|---|---|---|")
    mark = lambda m: f"{m['outside']}/{m['elements']}" + (" (diagnosed)" if m["named"] else "")
    for k in range(args.lo, args.hi + 1):
        fp32 = measure(k, torch.float32, args.rows, args.dim, args.rotary, args.seed)
        bf16 = measure(k, torch.bfloat16, args.rows, args.dim, args.rotary, args.seed)
        print(f"| [2^{k}, 2^{k + 1}) | {', '.join(fp32['r3'])} | {fp32['r3_min']:.3g} | {mark(fp32)} | {mark(bf16)} |")
    print(f"r^3 leaves FP32's normal range above rms 2^42 and is 0 above rms 2^{149 / 3:.2f} (2^-149 = r^3)")
    return 0


def _graph() -> str:
    """The backward nodes autograd records for F.rms_norm on this torch (CPU)."""
    x = torch.ones(1, 4, requires_grad=True)
    names, node = [], F.rms_norm(x, (4,), eps=EPS).grad_fn
    while node is not None:
        names.append(type(node).__name__)
        node = next((n for n, _ in node.next_functions if n is not None and type(n).__name__ != "AccumulateGrad"), None)
    return " <- ".join(names)


if __name__ == "__main__":
    raise SystemExit(main())
