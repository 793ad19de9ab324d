"""Why the bench's forward+backward rows at its smallest shape (1 x 64 x 4096) sometimes read 20-30% slow
when they were timed host-driven (issue 36: 0.712 and 0.753 of copy in one run, 0.97-0.99 in the next, on
the same kernels); the bench now times them under graph replay (bench.bench._replayed_ms).

For both ops and both layouts, on CUDA, in one run:
- the host-driven forward+backward timing the bench used before (do_bench around one forward and its
  autograd.grad) six times, beside the forward and the backward timed alone by the bench: when the host
  keeps up, forward+backward is their sum;
- the host's time to enqueue one forward+backward (the autograd call returns once its kernels are queued),
  and 200 calls back to back;
- the pair captured once in a CUDA graph and replayed: the kernels' time with no host in the way.
do_bench flushes a 256 MB L2 buffer before each call it times, so the GPU has that flush plus the pair to
work through per iteration; a host slower than that leaves the GPU waiting, and the row measures the host.

    python -m tools.fwd_bwd_probe
"""

from __future__ import annotations

import time

import torch
from triton.testing import do_bench

from bench.bench import IMPLS, _replayed_ms, _time_one, make_inputs


def enqueue_times(both, calls=50):
    """Seconds the host takes to return from each of `calls` calls (the GPU may still be working)."""
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        both()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return sorted(times)


def back_to_back(both, calls=200):
    """Seconds a call over `calls` calls queued back to back, until the GPU is done."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        both()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def probe(kernel, layout, x, cos, sin, g):
    """Print the three measurements for one op on one input."""
    fn = IMPLS[kernel]["triton"]
    tag = f"{kernel} 1x64x4096 {layout}"

    def both():  # one forward and its backward, as the bench times the pair
        leaf = x.detach().requires_grad_()
        return torch.autograd.grad(fn(leaf, cos, sin), leaf, g)

    pair = [do_bench(both, warmup=25, rep=100, return_mode="median") for _ in range(6)]
    fwd, bwd = (_time_one(fn, x, cos, sin, direction) for direction in ("forward", "backward"))
    print(f"{tag}: fwd+bwd host-driven do_bench medians {[round(ms, 4) for ms in pair]} ms; "
          f"fwd {fwd:.4f} + bwd {bwd:.4f} = {fwd + bwd:.4f}", flush=True)  # fmt: skip
    enqueue = enqueue_times(both)
    print(f"{tag}: host time to enqueue one fwd+bwd median {enqueue[len(enqueue) // 2] * 1e3:.3f} ms "
          f"(min {enqueue[0] * 1e3:.3f}, max {enqueue[-1] * 1e3:.3f}); "
          f"200 back-to-back {back_to_back(both) * 1e3:.4f} ms a call", flush=True)  # fmt: skip
    replay = [_replayed_ms(both) for _ in range(3)]
    print(f"{tag}: fwd+bwd under graph replay (the bench's timing) {[round(ms, 4) for ms in replay]} ms", flush=True)


def main():
    for layout in ("token_major", "head_major"):
        x, cos, sin = make_inputs(1, 64, 4096, layout)
        g = torch.randn_like(x)
        for kernel in ("qnorm_rope", "partial_rope"):
            probe(kernel, layout, x, cos, sin, g)
        del x, g
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
