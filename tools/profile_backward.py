"""One QNorm+RoPE backward of ours and one of torch.compile's eager chain, for Nsight Compute.

Both run on the same bf16 input (bench.py's, D=512, R=64; default 1 x 128 x 16384, head-major)
after warm-up; only the timed backward of each sits between cudaProfilerStart and cudaProfilerStop, so

    ncu --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum,... \
        python -m tools.profile_backward [B H S [token_major|head_major]]

profiles exactly those kernels: the bytes each backward really moves and its DRAM throughput.
This is what limits the head-major backward against torch.compile (docs/perf.md).
"""

from __future__ import annotations

import sys

import torch

from bench import bench  # noqa: E402  (the same eager chain, torch.compile settings and inputs as the benchmark)


def main():
    b, h, s = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (1, 128, 16384)
    layout = sys.argv[4] if len(sys.argv) > 4 else "head_major"
    x, cos, sin = bench.make_inputs(b, h, s, layout)
    g = torch.randn_like(x)
    for name in ("compile", "triton"):
        fn = bench.IMPLS["qnorm_rope"][name]
        xg = x.detach().requires_grad_()
        out = fn(xg, cos, sin)
        for _ in range(3):
            torch.autograd.grad(out, xg, g, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        torch.autograd.grad(out, xg, g, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(
            f"profiled: {name} backward, {b}x{h}x{s} {layout}; bytes that must move "
            f"{bench.bytes_moved('qnorm_rope', 'backward', b, h, s)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
