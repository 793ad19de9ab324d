"""GPU-only checks (compiled kernels): 64-bit offsets past 2**31 elements, run-to-run determinism.

The CPU suite covers the same properties at small sizes (every kernel test checks offsets
through strides and storage offsets; the interpreter is deterministic by construction).
Large tensors are judged on the rows at both ends of the buffer, where 32-bit offsets would
wrap: those rows go through the FP64 model, and through the kernel again as a small tensor,
which must give the same bits.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference import qnorm_rope as qnorm_model
from dsrope_reference.floats import bits
from dsrope_reference.rope import partial_rope

from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, qnorm_rope_triton
from dsrope_gate.inputs import DEVICE, tables

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def release_cached_memory():
    """The >2**31 tests allocate about 20 GB; under gpu-tests -n k several workers share one GPU, so
    each hands its cached blocks back when the test is done."""
    yield
    torch.cuda.empty_cache()


# B=1, H=128, D=512: 65536 elements per position; S=32800 puts 2**31 + 2**21 elements in x.
LARGE = (1, 128, 32800, 512)
ROTARY = 64


def large_inputs(seed, layout):
    """x past 2**31 elements: a view of token-major storage (the production layout, rows walked
    in token-major order) or a contiguous head-major tensor (rows walked in head-major order)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    b, h, s, d = LARGE
    if layout == "head_major":
        return torch.randn(b, h, s, d, device=DEVICE, dtype=torch.bfloat16, generator=g)
    return torch.randn(b, s, h, d, device=DEVICE, dtype=torch.bfloat16, generator=g).transpose(1, 2)


def ends(t, n=8):
    """The first and last n positions of the sequence dim (the last ones lie past 2**31)."""
    return torch.cat((t[:, :, :n], t[:, :, -n:]), dim=2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["token_major", "head_major"])
def test_qnorm_rope_past_2_31_elements(layout):
    x = large_inputs(0, layout)
    assert x.numel() > 2**31
    cos, sin = tables(1, LARGE[2], ROTARY, seed=1)
    x.requires_grad_()
    out = qnorm_rope_triton(x, cos, sin, ROTARY, 1e-6)
    g = torch.ones_like(out)  # a dense gradient; the stride-0 case is covered at small size
    g = g.normal_(generator=torch.Generator(device=DEVICE).manual_seed(2))
    (dx,) = torch.autograd.grad(out, x, g)
    xs, gs = ends(x.detach()), ends(g)
    cs, ss = ends(cos[:, None]).squeeze(1), ends(sin[:, None]).squeeze(1)
    fwd = qnorm_model.forward(xs, cs, ss, ROTARY, 1e-6).out.judge(ends(out))
    bwd = qnorm_model.backward(xs, gs, cs, ss, ROTARY, 1e-6).dx.judge(ends(dx))
    assert fwd.violations == 0 and bwd.violations == 0, f"{fwd}\n{bwd}"
    small = xs.contiguous().requires_grad_()
    out_small = qnorm_rope_triton(small, cs.contiguous(), ss.contiguous(), ROTARY, 1e-6)
    (dx_small,) = torch.autograd.grad(out_small, small, gs.contiguous())
    assert torch.equal(out_small, ends(out)) and torch.equal(dx_small, ends(dx))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["token_major", "head_major"])
def test_partial_rope_past_2_31_elements(layout):
    x = large_inputs(3, layout)
    cos, sin = tables(1, LARGE[2], ROTARY, seed=4)
    x.requires_grad_()
    out = apply_partial_rope_triton(x, cos, sin, ROTARY)
    g = torch.empty_like(out).normal_(generator=torch.Generator(device=DEVICE).manual_seed(5))
    (dx,) = torch.autograd.grad(out, x, g)
    cs, ss = ends(cos[:, None]).squeeze(1), ends(sin[:, None]).squeeze(1)
    fwd = partial_rope(ends(x.detach()), cs, ss, ROTARY).judge(ends(out))
    bwd = partial_rope(ends(g), cs, ss, ROTARY, inverse=True).judge(ends(dx))
    assert fwd.violations == 0 and bwd.violations == 0, f"{fwd}\n{bwd}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["token_major", "head_major"])
def test_partial_rope_in_place_past_2_31_elements(layout):
    """In place: the rows past 2**31 elements hold the out-of-place kernel's bits, the leading channels
    their own."""
    x = large_inputs(6, layout)
    cos, sin = tables(1, LARGE[2], ROTARY, seed=7)
    before = ends(x).clone()
    want = partial_rope(before, ends(cos[:, None]).squeeze(1), ends(sin[:, None]).squeeze(1), ROTARY)
    apply_partial_rope_triton_(x, cos, sin, ROTARY)
    check = want.judge(ends(x))
    assert check.violations == 0, check
    assert torch.equal(bits(ends(x)[..., :-ROTARY]), bits(before[..., :-ROTARY]))


@pytest.mark.parametrize("kernel", ["qnorm_rope", "partial_rope"])
def test_run_to_run_determinism(kernel):
    shape = (2, 64, 512, 512)
    g0 = torch.Generator(device=DEVICE).manual_seed(6)
    x = torch.randn(shape[0], shape[2], shape[1], shape[3], device=DEVICE, generator=g0).bfloat16().transpose(1, 2)
    g = torch.randn(shape, device=DEVICE, generator=g0).bfloat16()
    cos, sin = tables(shape[0], shape[2], ROTARY, seed=7)
    results = []
    for _ in range(3):
        xi = x.detach().requires_grad_()
        if kernel == "qnorm_rope":
            out = qnorm_rope_triton(xi, cos, sin, ROTARY, 1e-6)
        else:
            out = apply_partial_rope_triton(xi, cos, sin, ROTARY)
        (dx,) = torch.autograd.grad(out, xi, g)
        results.append((out, dx))
    for out, dx in results[1:]:
        assert torch.equal(bits(out), bits(results[0][0]))
        assert torch.equal(bits(dx), bits(results[0][1]))


def test_worker_sees_its_pinned_gpu():
    """Under `gpu-tests -n k` each xdist worker is pinned to one GPU (tests/gpu_pinning.py)."""
    import os

    pinned = os.environ.get("DSROPE_PINNED_GPU")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        assert pinned is None
        return
    assert os.environ["CUDA_VISIBLE_DEVICES"] == pinned
    assert torch.cuda.device_count() == 1
    print(f"worker {os.environ['PYTEST_XDIST_WORKER']} on GPU {pinned}: {torch.cuda.get_device_name(0)}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "kernel,batch,dim",
    # batches whose rows spread (partial RoPE's prefill tile is M = 2 at D = 512, the QNorm forward's M = 4)
    [("partial_rope", 1, 512), ("partial_rope", 4, 512), ("partial_rope", 1, 320)]
    + [("qnorm_rope", 1, 512), ("qnorm_rope", 4, 512), ("qnorm_rope", 16, 512), ("qnorm_rope", 1, 320)],
)
def test_decode_rows_per_program_keep_the_bits(kernel, batch, dim, dtype, monkeypatch):
    """Decode shapes (S=1, B*H rows, channel-contiguous x) launch partial RoPE and the QNorm forward with
    fewer rows per program (dsrope.tiles.spread_rows); every bit (out, and the QNorm's saved rstd) must
    stay what the prefill tile computes, on rows spanning the dtype's range. (A channel-strided x keeps
    the QNorm's prefill tile: there M changes the row sum's order; the snapshot's huge goldens hold it.)"""
    import dsrope.qnorm_rope
    import dsrope.rope
    from dsrope.tiles import spread_rows, tile_config

    module, elements = (dsrope.rope, 1024)
    if kernel == "qnorm_rope":
        module, elements = dsrope.qnorm_rope, dsrope.qnorm_rope.FORWARD_ELEMENTS
    rows = batch * 64
    prefill_m = tile_config(dim, elements)["M"]
    assert spread_rows(tile_config(dim, elements), rows, torch.device(DEVICE))["M"] < prefill_m
    g = torch.Generator(device=DEVICE).manual_seed(8)
    top = {torch.float32: 60, torch.float16: 12, torch.bfloat16: 60}[dtype]  # 2**top * 5 sigma stays finite
    scale = 2.0 ** torch.linspace(-top, top, rows, device=DEVICE).round()
    x = torch.randn(batch, 1, 64, dim, device=DEVICE, generator=g) * scale.view(batch, 1, 64, 1)
    x = x.to(dtype).transpose(1, 2)
    cos, sin = tables(batch, 1, ROTARY, seed=9)

    def run():
        if kernel == "partial_rope":
            return (apply_partial_rope_triton(x, cos, sin, ROTARY),)
        return torch.ops.dsrope.qnorm_rope(x, cos, sin, ROTARY, 1e-6)  # out and the saved rstd

    spread = run()
    monkeypatch.setattr(module, "spread_rows", lambda config, rows, device: config)
    prefill = run()
    for a, b in zip(spread, prefill, strict=True):
        assert torch.equal(bits(a), bits(b))
