"""What a new `eps` costs: the QNorm kernels take eps as a constexpr, so each distinct value compiles
its own forward kernel. Times, on CUDA, the first call with each new eps (compile, or a load from
Triton's disk cache) and the warm calls after it.

    python -m bench.eps_compile [--cache DIR]     # a fresh TRITON_CACHE_DIR by default: cold compiles
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=None, help="TRITON_CACHE_DIR (default: a fresh folder)")
    args = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = args.cache or tempfile.mkdtemp(prefix="eps-cache-")
    import torch
    from triton.testing import do_bench

    from dsrope import qnorm_rope_triton
    from dsrope_gate.inputs import tables
    from dsrope_gate.layouts import TOKEN_MAJOR, materialize

    x = materialize(torch.randn(4, 128, 512, 512, dtype=torch.bfloat16, device="cuda"), TOKEN_MAJOR)
    cos, sin = tables(4, 512, 64, seed=1)
    print(f"TRITON_CACHE_DIR {os.environ['TRITON_CACHE_DIR']}")
    for eps in (1e-6, 1e-5, 1e-6, 1e-12, 1e-3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        qnorm_rope_triton(x, cos, sin, 64, eps)
        torch.cuda.synchronize()
        first = time.perf_counter() - t0
        warm = statistics.median(do_bench(lambda e=eps: qnorm_rope_triton(x, cos, sin, 64, e), return_mode="all"))
        print(f"eps {eps:g}: first call {first * 1e3:.1f} ms, warm median {warm * 1e3:.1f} us")


if __name__ == "__main__":
    main()
