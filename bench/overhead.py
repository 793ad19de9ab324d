"""Host time per call of each layer of an eager call, with the Triton launch stubbed out.

What a decode step pays on the CPU before the GPU sees a kernel (docs/performance.md, "Host time per call"): the
argument checks, the autograd.Function, the launcher (allocation, shape and stride reads, tile
config, grid), and, when the kernels run through the custom op instead, the dispatcher. The
kernels are replaced by a no-op stub, so every number is host time alone. Runs on CPU (tensors on
CPU, TRITON_INTERPRET=1 set here; nothing is interpreted, the stub launches nothing) and on CUDA,
where `launch` also times the real Triton launch (its launcher included, the GPU work excluded
by timing only the host loop).

    python -m bench.overhead [--calls 500] [--rounds 101]

Shape: the decode row B=1, H=128, S=1, D=512, R=64, bf16, x requiring grad (training-style
calls; `no grad` rows repeat the main ones without it). Each number is the mean host time of
`calls` back-to-back calls in the fastest of `rounds` rounds (on a shared machine the least
disturbed one; the median is printed beside it); the rounds go round-robin over the rows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dsrope_gate.startup import interpret_without_gpu  # noqa: E402

interpret_without_gpu()  # dsrope accepts CPU tensors only in interpreter mode

from dsrope import apply_partial_rope_triton, qnorm_rope_triton  # noqa: E402
from dsrope import qnorm_rope as qnorm_module  # noqa: E402
from dsrope import rope as rope_module  # noqa: E402
from dsrope.checks import check_eps, check_rotary, check_table, check_x  # noqa: E402
from dsrope.tiles import token_major_empty  # noqa: E402

B, H, S, D, R, EPS = 1, 128, 1, 512, 64, 1e-6
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Stub:
    """Stands in for a @triton.jit kernel: `kernel[grid](...)` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


class NewStylePartialRoPE(torch.autograd.Function):
    """_PartialRoPE written with a separate setup_context (not used: measured here only). apply()
    then binds its arguments with inspect.signature on every call."""

    @staticmethod
    def forward(x, cos, sin, rotary):
        return rope_module._launch(x, cos, sin, rotary, inverse=False)

    setup_context = rope_module._PartialRoPE.save
    backward = rope_module._PartialRoPE.backward


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def per_call_us(rows, calls, rounds):
    """{name: (fastest, median)} mean host time per call over `rounds` rounds of `calls` calls.
    The rounds go round-robin over the rows, so a disturbance on a shared machine spreads over
    all of them instead of landing on one."""
    for _, fn in rows:
        for _ in range(min(calls, 500)):
            fn()
    means = {name: [] for name, _ in rows}
    for _ in range(rounds):
        for name, fn in rows:
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            means[name].append((time.perf_counter() - start) / calls * 1e6)
    return {name: (min(m), statistics.median(m)) for name, m in means.items()}


def layers(x, cos, sin):
    """(name, function) for every layer, partial RoPE and QNorm + RoPE."""

    def checks_rope():
        check_x(x)
        if x.shape[-1] % 2:
            raise ValueError
        check_rotary(R, x.shape[-1])
        check_table("cos", cos, x, R)
        check_table("sin", sin, x, R)

    def checks_qnorm():
        check_x(x)
        check_rotary(R, x.shape[-1])
        check_eps(EPS)
        check_table("cos", cos, x, R)
        check_table("sin", sin, x, R)

    xd = x.detach()
    return [
        ("torch.empty_like (reference: one allocation)", lambda: torch.empty_like(xd)),
        ("token_major_empty (the output allocation)", lambda: token_major_empty(xd)),
        (
            "empty([B, S, H, D]).transpose(1, 2) (the allocation before)",
            lambda: torch.empty((B, S, H, D), dtype=xd.dtype, device=xd.device).transpose(1, 2),
        ),
        ("x.stride() + cos.stride() + sin.stride()", lambda: (x.stride(), cos.stride(), sin.stride())),
        ("partial rope: checks", checks_rope),
        ("partial rope: launcher _launch", lambda: rope_module._launch(xd, cos, sin, R, False)),
        ("partial rope: _PartialRoPE.apply", lambda: rope_module._PartialRoPE.apply(x, cos, sin, R)),
        ("partial rope: autograd.Function with setup_context", lambda: NewStylePartialRoPE.apply(x, cos, sin, R)),
        ("partial rope: op dsrope::partial_rope", lambda: rope_module.partial_rope(x, cos, sin, R)),
        ("partial rope: public function (checks + apply)", lambda: apply_partial_rope_triton(x, cos, sin, R)),
        ("partial rope: public function, no grad", lambda: apply_partial_rope_triton(xd, cos, sin, R)),
        ("partial rope: _PartialRoPE.apply, no grad", lambda: rope_module._PartialRoPE.apply(xd, cos, sin, R)),
        ("partial rope: op, no grad", lambda: rope_module.partial_rope(xd, cos, sin, R)),
        ("qnorm rope: checks", checks_qnorm),
        ("qnorm rope: launcher _forward", lambda: qnorm_module._forward(xd, cos, sin, R, EPS)),
        ("qnorm rope: _QNormRoPE.apply", lambda: qnorm_module._QNormRoPE.apply(x, cos, sin, R, EPS)),
        ("qnorm rope: op dsrope::qnorm_rope", lambda: qnorm_module.qnorm_rope(x, cos, sin, R, EPS)),
        ("qnorm rope: public function (checks + apply)", lambda: qnorm_rope_triton(x, cos, sin, R, EPS)),
        ("qnorm rope: public function, no grad", lambda: qnorm_rope_triton(xd, cos, sin, R, EPS)),
        ("qnorm rope: _QNormRoPE.apply, no grad", lambda: qnorm_module._QNormRoPE.apply(xd, cos, sin, R, EPS)),
        ("qnorm rope: op, no grad", lambda: qnorm_module.qnorm_rope(xd, cos, sin, R, EPS)),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=101)
    args = ap.parse_args()
    x = torch.randn(B, S, H, D, device=DEVICE, dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
    ang = torch.rand(B, S, R, device=DEVICE)
    cos, sin = torch.cos(ang), torch.sin(ang)
    print(f"host time per call, us ({DEVICE}, torch {torch.__version__}; B={B} H={H} S={S} D={D} R={R} bf16)")
    print(f"{'':62s} {'min':>7s} {'median':>7s}")
    xd = x.detach()
    if DEVICE == "cuda":  # real launches; against the stubbed rows, the difference is Triton's launcher
        y = torch.empty_like(xd)
        rows = [
            ("copy_ of x (one launch of the same size: the yardstick)", lambda: y.copy_(xd)),
            ("partial rope: public function, no grad, real kernel", lambda: apply_partial_rope_triton(xd, cos, sin, R)),
            ("partial rope: launcher _launch, real kernel", lambda: rope_module._launch(xd, cos, sin, R, False)),
            ("qnorm rope: public function, no grad, real kernel", lambda: qnorm_rope_triton(xd, cos, sin, R, EPS)),
            ("qnorm rope: launcher _forward, real kernel", lambda: qnorm_module._forward(xd, cos, sin, R, EPS)),
        ]
        for name, us in per_call_us(rows, args.calls, args.rounds).items():
            print(f"{name:62s} {us[0]:7.2f} {us[1]:7.2f}", flush=True)
    rope_module._rotate = Stub()
    qnorm_module._qnorm_rope = Stub()
    for name, us in per_call_us(layers(x, cos, sin), args.calls, args.rounds).items():
        print(f"{name:62s} {us[0]:7.2f} {us[1]:7.2f}", flush=True)


if __name__ == "__main__":
    main()
