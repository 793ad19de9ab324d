"""Tune rows per program (M) and warps for the DSV4 kernels on CUDA: median time per config at
one large DSV4 shape, as GB/s and fraction of the measured copy bandwidth. Prints a table; the
winners go into the kernels' _config."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from dsrope.qnorm_rope import _qnorm_rope, _qnorm_rope_backward  # noqa: E402
from dsrope.rope import _rotate  # noqa: E402

B, H, S, D, R = 1, 128, 16384, 512, 64


def copy_bandwidth() -> float:
    src = torch.empty(1 << 31, dtype=torch.bfloat16, device="cuda")
    return 4 * (1 << 31) / (do_bench(src.clone, return_mode="median") * 1e-3)


def launches(x, g, cos, sin, out, rstd, rows, grid, kw):
    """name -> (bytes that must move, launch) for one config."""
    n = x.numel() * 2
    common = (H, D, R)
    return {
        "qnorm_fwd": (2 * n + rows * 4, lambda: _qnorm_rope[grid](
            x, cos, sin, out, rstd, rows, S, *common, *x.stride(), *cos.stride(), *sin.stride(), EPS=1e-6, **kw)),
        "qnorm_bwd": (3 * n + rows * 4, lambda: _qnorm_rope_backward[grid](
            x, g, cos, sin, rstd, out, rows, S, *common, *x.stride(), *g.stride(), *cos.stride(), *sin.stride(),
            **kw)),
        "rope": (2 * n, lambda: _rotate[grid](
            x, cos, sin, out, rows, S, *common, *x.stride(), *cos.stride(), *sin.stride(), INVERSE=False, **kw)),
    }


def main():
    x = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    g = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    ang = torch.rand(1, S, R, device="cuda").expand(B, S, R)
    cos, sin = torch.cos(ang), torch.sin(ang)
    out = torch.empty(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    rows = B * S * H
    rstd = torch.empty(rows, device="cuda", dtype=torch.float32)
    copy = copy_bandwidth()
    print(f"copy {copy / 1e9:.0f} GB/s")
    for m in (2, 4, 8, 16, 32):
        for warps in (1, 2, 4, 8):
            for stages in (1,):  # no loop to pipeline: stages do not matter here
                kw = dict(M=m, BLOCK=D, num_warps=warps, num_stages=stages)
                results = launches(x, g, cos, sin, out, rstd, rows, (triton.cdiv(rows, m),), kw)
                line = [f"M={m:2d} warps={warps} stages={stages}"]
                for name, (nbytes, fn) in results.items():
                    ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
                    line.append(f"{name} {nbytes / ms / 1e6:6.0f} GB/s {nbytes / ms / 1e-3 / copy:.3f}")
                print(" | ".join(line), flush=True)


if __name__ == "__main__":
    main()
