"""Representative launches of every kernel (the in-place partial RoPE included) for compute-sanitizer
memcheck (no reference, no asserts beyond finiteness): D not a power of two, odd D, R/2 not a power of
two, R = D, R = 2, storage offsets, padded and permuted strides, stride-0 tables and gradients.

Run through `nox -s sanitize` (tools/gpu_run.sh's gate) after any change to a kernel's addressing or masks;
the session sets PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every tensor is its own allocation and a read or
write one element past a buffer is an error memcheck sees.
"""

from __future__ import annotations

import torch  # noqa: E402

from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, qnorm_rope_triton  # noqa: E402
from dsrope_gate.inputs import tables  # noqa: E402
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, materialize  # noqa: E402

CASES = [
    # (B, H, S, D, R, layout of x, layout of the gradient)
    (2, 3, 5, 24, 12, TOKEN_MAJOR, Layout()),
    (1, 4, 7, 25, 8, Layout(), TOKEN_MAJOR),
    (2, 2, 3, 40, 40, Layout(order=(0, 2, 1, 3), offset=3), Layout(step=(1, 2, 1, 1))),
    (1, 2, 9, 96, 2, Layout(order=(3, 0, 1, 2)), Layout(pad=(0, 1, 0, 3))),
    (1, 8, 16, 512, 64, TOKEN_MAJOR, TOKEN_MAJOR),
    (3, 1, 1, 6, 6, Layout(step=(2, 1, 1, 1), offset=1), Layout()),
    # the in-place kernel's tiles (on CUDA): two heads of an odd count, the last tile's tokens partial;
    # tiles of four of a token's five heads (decode)
    (2, 3, 41, 16, 8, TOKEN_MAJOR, Layout()),
    (1, 5, 1, 16, 8, Layout(order=(0, 2, 1, 3), pad=(0, 0, 1, 0)), Layout()),
]


def main() -> int:
    device = torch.device("cuda")
    launches = 0
    for b, h, s, d, r, x_layout, g_layout in CASES:
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            cos, sin = tables(b, s, r, seed=d)
            x = materialize(torch.randn(b, h, s, d).to(dtype).to(device), x_layout)
            g = materialize(torch.randn(b, h, s, d).to(dtype).to(device), g_layout)
            for fn, args in ((qnorm_rope_triton, (1e-6,)), (apply_partial_rope_triton, ())):
                if fn is apply_partial_rope_triton and d % 2:
                    continue
                xi = x.detach().requires_grad_()
                out = fn(xi, cos, sin, r, *args)
                (dx,) = torch.autograd.grad(out, xi, g)
                xi2 = x.detach().requires_grad_()
                fn(xi2, cos, sin, r, *args).sum().backward()  # stride-0 gradient
                torch.cuda.synchronize()
                assert torch.isfinite(out).all() and torch.isfinite(dx).all() and torch.isfinite(xi2.grad).all()
                launches += 6 if fn is qnorm_rope_triton else 6
            if d % 2 == 0:  # in place: only x's rotary channels are written
                y = materialize(x.detach().clone(), x_layout)
                apply_partial_rope_triton_(y, cos, sin, r)
                torch.cuda.synchronize()
                assert torch.isfinite(y).all()
                launches += 1
    print(f"sanitize_launches: {launches} kernel launches over {len(CASES)} geometries x 3 dtypes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
