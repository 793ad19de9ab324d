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
@pytest.mark.parametrize("batch,dim", [(1, 512), (4, 512), (16, 512), (1, 320)])
def test_qnorm_contiguous_tile_keeps_the_bits(batch, dim, dtype, monkeypatch):
    """A channel-contiguous x runs the QNorm forward at half the rows per program of a channel-strided
    one (dsrope.qnorm_rope.forward_config); every bit (out and the saved rstd) must stay what the
    channel-strided tile computes, on rows spanning the dtype's range. (A channel-strided x keeps its
    tile: there M changes the row sum's order; the snapshot's huge goldens hold it.)"""
    import dsrope.qnorm_rope as module

    x = decode_rows(batch, dim, dtype, seed=8)
    cos, sin = tables(batch, 1, ROTARY, seed=9)
    monkeypatch.setattr(module, "ROWS_ON_WARPS", ())  # the one-warp tiles (rows on warps: the test above)
    assert module.forward_config(x)["M"] < module.tile_config(dim, module.FORWARD_ELEMENTS)["M"]
    contiguous_tile = torch.ops.dsrope.qnorm_rope(x, cos, sin, ROTARY, 1e-6)  # out and the saved rstd
    monkeypatch.setattr(module, "CONTIGUOUS_ELEMENTS", module.FORWARD_ELEMENTS)
    monkeypatch.setattr(module, "_forward_config", module._forward_config.__wrapped__)  # not its cache
    for a, b in zip(contiguous_tile, torch.ops.dsrope.qnorm_rope(x, cos, sin, ROTARY, 1e-6), strict=True):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows_per_program,warps", [(2, 2), (4, 2), (8, 4), (8, 8)])
def test_qnorm_rows_on_warps_keep_the_bits(rows_per_program, warps, dtype, monkeypatch):
    """The QNorm forward with whole rows on each of several warps (CHUNK = one warp's pass over a row,
    dsrope.qnorm_rope.warp_pass) must store every bit (out and the saved rstd) that the one-warp tile
    stores: each row's sum of squares is the same PTX at both (docs/records/*-probes-removed.md);
    this holds it on the device, on decode rows spanning the dtype's range, on a head-major prefill x and on
    one of 123 rows (the last program holds fewer rows than M)."""
    import dsrope.qnorm_rope as module

    decode = decode_rows(64, 512, dtype, seed=11)
    g = torch.Generator(device=DEVICE).manual_seed(12)
    prefill = (torch.randn(2, 8, 40, 512, device=DEVICE, generator=g) * 3).to(dtype)  # head-major, 640 rows
    ragged = (torch.randn(1, 3, 41, 512, device=DEVICE, generator=g) * 3).to(dtype)  # 123 rows: last program part-full
    inputs = [(decode, *tables(64, 1, ROTARY, seed=13)), (prefill, *tables(2, 40, ROTARY, seed=14))]
    inputs.append((ragged, *tables(1, 41, ROTARY, seed=15)))
    monkeypatch.setattr(module, "ROWS_ON_WARPS", ())  # every launch on one warp
    one_warp = [torch.ops.dsrope.qnorm_rope(x, cos, sin, ROTARY, 1e-6) for x, cos, sin in inputs]
    assert all(module.forward_config(x)["num_warps"] == 1 for x, _, _ in inputs)
    assert all(module.rows_fit_warps(x) for x, _, _ in inputs)
    chunk = module.row_chunk(512, decode.element_size(), warps)
    tile = dict(M=rows_per_program, BLOCK=512, num_warps=warps, CHUNK=chunk)
    monkeypatch.setattr(module, "forward_config", lambda x: tile)
    for (x, cos, sin), expected in zip(inputs, one_warp, strict=True):
        for a, b in zip(expected, torch.ops.dsrope.qnorm_rope(x, cos, sin, ROTARY, 1e-6), strict=True):
            assert torch.equal(bits(a), bits(b))


def decode_rows(batch, dim, dtype, seed, heads=64):
    """x [batch, heads, 1, dim] in token-major storage, rows spanning the dtype's range."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    top = {torch.float32: 60, torch.float16: 12, torch.bfloat16: 60}[dtype]  # 2**top * 5 sigma stays finite
    rows = batch * heads
    scale = 2.0 ** torch.linspace(-top, top, rows, device=DEVICE).round()
    x = torch.randn(batch, 1, heads, dim, device=DEVICE, generator=g) * scale.view(batch, 1, heads, 1)
    return x.to(dtype).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch,dim,channel_outer", [(1, 512, False), (8, 512, False), (4, 320, False), (2, 512, True)])
def test_partial_rope_forms_keep_the_bits(batch, dim, channel_outer, dtype, monkeypatch):
    """A decode launch (few rows) runs partial RoPE's split kernel, a prefill launch the whole-row one
    (dsrope.rope.rotate_config); both must store the same bits, forward and inverse, compiled (the
    interpreter's case: tests/test_rope.py runs every test on both)."""
    import dsrope.rope

    x = decode_rows(batch, dim, dtype, seed=10)
    if channel_outer:  # channels outermost in memory: every load strided
        x = x.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0)
    cos, sin = tables(batch, 1, ROTARY, seed=11)
    assert dsrope.rope.rotate_config(dim, ROTARY, batch * 64)[0] is dsrope.rope._rotate_split

    def run():  # forward, and the backward op: the conjugate rotation of x as an upstream gradient
        return apply_partial_rope_triton(x, cos, sin, ROTARY), torch.ops.dsrope.partial_rope_backward(
            x, cos, sin, ROTARY
        )

    split = run()
    monkeypatch.setattr(dsrope.rope, "SPLIT_ROWS", -1)
    for a, b in zip(split, run(), strict=True):
        assert torch.equal(bits(a), bits(b))


@pytest.mark.slow
def test_partial_rope_decode_past_2_31_elements():
    """A decode launch (the split kernel: few rows) whose last batch lies past 2**31 elements of x's
    storage (batch stride below 2**31, so the kernel gets it as a 32-bit int and must widen b first)."""
    import dsrope.rope

    batch_stride = 2**30 + 2**20
    shape = (3, 64, 1, 512)
    storage = torch.zeros(2 * batch_stride + 64 * 512, device=DEVICE, dtype=torch.bfloat16)
    x = storage.as_strided(shape, (batch_stride, 512, 512, 1))
    x.copy_(torch.randn(shape, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(12)))
    assert x[2].storage_offset() >= 2**31
    assert dsrope.rope.rotate_config(512, ROTARY, 3 * 64)[0] is dsrope.rope._rotate_split
    cos, sin = tables(3, 1, ROTARY, seed=13)
    out = apply_partial_rope_triton(x, cos, sin, ROTARY)
    back = torch.ops.dsrope.partial_rope_backward(x, cos, sin, ROTARY)
    small = x.contiguous()
    del storage, x
    fwd = partial_rope(small, cos, sin, ROTARY).judge(out)
    bwd = partial_rope(small, cos, sin, ROTARY, inverse=True).judge(back)
    assert fwd.violations == 0 and bwd.violations == 0, f"{fwd}\n{bwd}"
    assert torch.equal(bits(apply_partial_rope_triton(small, cos, sin, ROTARY)), bits(out))
