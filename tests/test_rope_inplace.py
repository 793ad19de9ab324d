"""apply_partial_rope_triton_: partial RoPE in place.

Error model: the rotary channels hold exactly the bits apply_partial_rope_triton gives them (the same
expression, lane for lane), which the reference's model (dsrope_reference.rope) holds to its interval;
every other byte of x's storage (the leading channels, the NaN-poisoned gaps of strided layouts, a
guard past the end) is left as it was, bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from dsrope_reference.floats import bits
from dsrope_reference.rope import partial_rope
from hypothesis import assume, given, note
from hypothesis import strategies as st

from dsrope import apply_partial_rope_triton, apply_partial_rope_triton_, rope
from dsrope.rope import inplace_config, partial_rope_
from dsrope_gate.inputs import DEVICE, DTYPES, laid_out, tables, values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, layout_of, materialize
from dsrope_gate.ops import PARTIAL_ROPE
from dsrope_gate.strategies import cases

LAYOUTS = {
    "token_major": TOKEN_MAJOR,
    "contiguous": Layout(),
    "channels_outer": Layout(order=(3, 0, 1, 2)),
    "stepped_offset_guard": Layout(order=(0, 2, 1, 3), step=(1, 2, 3, 1), pad=(1, 0, 2, 3), offset=5, guard=200),
}


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).cpu().clone()


def rotary_byte_mask(x: torch.Tensor, rotary: int) -> torch.Tensor:
    """True on the bytes of x's storage that hold its rotary channels (the only bytes it may write)."""
    n = x.untyped_storage().nbytes() // x.element_size()
    index = torch.arange(n).as_strided(x.shape, x.stride(), x.storage_offset())
    mask = torch.zeros(n, dtype=torch.bool)
    mask[index[..., x.shape[-1] - rotary :].reshape(-1)] = True
    return mask.repeat_interleave(x.element_size())


def check_in_place(x: torch.Tensor, cos, sin, rotary: int) -> None:
    """Run the in-place rotation on x and hold it to the out-of-place kernel, the model and the bytes."""
    want = apply_partial_rope_triton(x, cos, sin, rotary)
    model = partial_rope(x, cos, sin, rotary)
    before = storage_bytes(x)
    returned = apply_partial_rope_triton_(x, cos, sin, rotary)
    assert returned is x
    assert torch.equal(bits(x), bits(want)), f"rotary bits differ from the out-of-place kernel: {layout_of(x)}"
    check = model.judge(x)
    assert check.violations == 0, f"{layout_of(x)}: {check}"
    untouched = ~rotary_byte_mask(x, rotary)
    assert torch.equal(storage_bytes(x)[untouched], before[untouched]), (
        f"wrote outside the rotary channels: {layout_of(x)}"
    )


@pytest.mark.parametrize(
    "shape,rotary",
    [((2, 3, 41, 16), 8), ((1, 5, 70, 32), 32), ((1, 5, 1, 16), 8), ((2, 64, 1, 16), 8), ((2, 1, 33, 8), 2)],
    ids=["3_heads_82_tokens", "5_heads_70_tokens", "5_heads_decode", "64_heads_decode", "1_head"],
)
def test_tiles_of_heads(shape, rotary):
    """A tile is GROUP neighbouring heads at M // GROUP consecutive tokens (rope.inplace_config): head counts
    that are not a multiple of GROUP, token counts that do not fill the last tile, and tiles of one token's
    heads (GROUP == M: decode, on both platforms' tiles for 64 heads), each case on this platform's tile."""
    b, h, s, d = shape
    config = inplace_config(rotary, h, b * s, s)
    group, rows = config["GROUP"], config["M"]
    assert h % group or (b * s) % (rows // group) or group == rows, config
    cos, sin = tables(b, s, rotary, seed=h, per_batch=True)
    # guard: room past the last token for the GROUP - 1 heads a tile may hold beyond H, so that a kernel
    # without its head mask writes there (a failure here) instead of past the allocation (a crash, by luck).
    # This test comes first in the module: under `pytest -x` (the mutation runner) it fails before any
    # unguarded launch can corrupt the heap.
    layout = Layout(order=(0, 2, 1, 3), guard=8 * d)
    check_in_place(laid_out(shape, torch.bfloat16, layout, seed=s), cos, sin, rotary)


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
def test_every_group_of_a_decode_tile(group, monkeypatch):
    """Every GROUP of a 16-row tile (the decode sweep's range, tools/sweep.py; the launcher takes 8 at S = 1 on
    CUDA) on a decode shape whose 12 heads fill no group of 8 or 16 and whose 5 tokens fill no tile of
    GROUP 1 or 2: the same bits as the out-of-place kernel, nothing else written."""
    b, h, d, rotary = 5, 12, 32, 16
    tile = dict(M=16, GROUP=group, BLOCK=rotary) | ({} if DEVICE == "cpu" else dict(num_warps=4))
    monkeypatch.setattr(rope, "inplace_config", lambda *args: tile)
    cos, sin = tables(b, 1, rotary, seed=group, per_batch=True)
    x = laid_out((b, h, 1, d), torch.bfloat16, Layout(order=(0, 2, 1, 3), guard=8 * d), seed=group)
    check_in_place(x, cos, sin, rotary)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_same_bits_as_out_of_place_and_nothing_else_written(dtype, name):
    x = laid_out((2, 3, 5, 96), dtype, LAYOUTS[name], seed=1)
    cos, sin = tables(2, 5, 32, seed=2)
    check_in_place(x, cos, sin, 32)


@pytest.mark.parametrize("dim,rotary", [(64, 64), (34, 2), (96, 6), (130, 24), (512, 64)])
def test_geometry(dim, rotary):
    """R = D, R = 2, R/2 odd, R not a power of two (masked lanes), the DSV4 head."""
    x = laid_out((1, 2, 3, dim), torch.bfloat16, Layout(order=(0, 2, 1, 3), guard=dim), seed=dim)
    cos, sin = tables(1, 3, rotary, seed=rotary)
    check_in_place(x, cos, sin, rotary)


@given(cases(PARTIAL_ROPE))
def test_layouts_property(case):
    """Any drawn layout of x (no stride 0: x is written), drawn tables and values."""
    x, cos, sin, _ = case.build(DEVICE)
    note(f"x: {layout_of(x)}")
    check_in_place(x, cos, sin, case.rotary)


def test_decode_shape_and_empty():
    cos, sin = tables(64, 1, 64, seed=3)
    check_in_place(laid_out((64, 8, 1, 512), torch.bfloat16, TOKEN_MAJOR, seed=4), cos, sin, 64)
    empty = torch.empty(2, 3, 0, 96, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = tables(2, 0, 32)
    assert apply_partial_rope_triton_(empty, cos, sin, 32) is empty


def refused():
    x = laid_out((2, 3, 4, 16), torch.bfloat16, TOKEN_MAJOR)
    cos, sin = tables(2, 4, 8)
    base = torch.zeros(64, dtype=torch.bfloat16, device=DEVICE)
    yield "stride0", (x[:1].expand(2, 3, 4, 16), cos, sin, 8), ValueError, "do not share memory"
    yield "overlap", (base.as_strided((2, 3, 4, 16), (0, 8, 4, 1)), cos, sin, 8), ValueError, "do not share memory"
    yield "odd_rotary", (x, cos, sin, 7), ValueError, "rotary"
    yield "rank", (x[0], cos, sin, 8), ValueError, "rank 4"
    yield "table_shape", (x, cos[:, :2], sin, 8), ValueError, "cos"
    yield "int_dtype", (x.to(torch.int32), cos, sin, 8), TypeError, "dtype"


@pytest.mark.parametrize("name,args,error,words", list(refused()), ids=[c[0] for c in refused()])
def test_refused_before_launch(name, args, error, words):
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(error, match=words):
        apply_partial_rope_triton_(*args)
    unchanged = (
        not isinstance(a, torch.Tensor) or torch.equal(bits(a), bits(b)) for a, b in zip(args, before, strict=True)
    )
    assert all(unchanged)


def shares_memory(shape, strides) -> bool:
    """Whether two elements of a view with these sizes and strides sit at the same offset (brute force)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(shape, strides, strict=True):
        offsets = (offsets[..., None] + torch.arange(size) * stride).flatten()
    return offsets.unique().numel() < offsets.numel()


@st.composite
def overlapping_views(draw):
    """x [B, H, S, D] as an as_strided view whose elements share memory: every stride non-zero (the
    partial overlaps a stride-0 check misses), any order, sizes small enough to enumerate."""
    shape = tuple(draw(st.integers(1, 4)) for _ in range(3)) + (2 * draw(st.integers(1, 8)),)
    strides = tuple(draw(st.integers(1, 40)) for _ in range(4))
    assume(shares_memory(shape, strides))
    return shape, strides, draw(st.integers(0, 8))


@given(overlapping_views())
def test_overlapping_views_are_refused(view):
    shape, strides, offset = view
    span = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    base = values((span,), torch.bfloat16, seed=1).to(DEVICE)
    x = base.as_strided(shape, strides, offset)
    before = bits(base).clone()
    cos, sin = tables(shape[0], shape[2], shape[3])
    with pytest.raises(ValueError, match="do not share memory"):
        apply_partial_rope_triton_(x, cos, sin, shape[3])
    assert torch.equal(bits(base), before)


def test_leaf_requiring_grad_is_refused_as_torch_refuses_it():
    x = laid_out((1, 2, 3, 16), torch.float32, TOKEN_MAJOR).requires_grad_()
    cos, sin = tables(1, 3, 8)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        apply_partial_rope_triton_(x, cos, sin, 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradient_is_the_out_of_place_kernels(dtype):
    """x computed from a parameter: the gradient through the in-place call equals the out-of-place one's."""
    w = laid_out((2, 3, 4, 32), dtype, TOKEN_MAJOR, seed=5).requires_grad_()
    cos, sin = tables(2, 4, 16, seed=6)
    grad = values((2, 3, 4, 32), dtype, seed=7).to(DEVICE)
    out = apply_partial_rope_triton_(w * 1, cos, sin, 16)
    (dw,) = torch.autograd.grad(out, w, grad)
    (want,) = torch.autograd.grad(apply_partial_rope_triton(w, cos, sin, 16), w, grad)
    assert torch.equal(bits(dw), bits(want))


def test_a_tensor_saved_for_backward_cannot_be_rotated_silently():
    """mark_dirty: x's version moves on, so a backward that saved x before the rotation refuses to run
    (without it the raw Triton write would leave autograd a changed tensor and a wrong gradient)."""
    w = laid_out((1, 2, 3, 16), torch.float32, TOKEN_MAJOR, seed=8).requires_grad_()
    x = w * 1
    saved = x.sin()  # sin saves its input x
    cos, sin = tables(1, 3, 8, seed=9)
    apply_partial_rope_triton_(x, cos, sin, 8)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def test_op_and_compiled_call():
    """The op's schema, fake and mutation annotation (opcheck), and torch.compile(fullgraph=True): the
    compiled in-place call gives the eager bits (aot_eager on CPU; the real op on any device)."""
    x = laid_out((2, 3, 4, 32), torch.bfloat16, TOKEN_MAJOR, seed=10)
    cos, sin = tables(2, 4, 16, seed=11)
    torch.library.opcheck(partial_rope_, (x.clone(), cos, sin, 16))
    want = apply_partial_rope_triton_(x.clone(), cos, sin, 16)
    compiled = torch.compile(apply_partial_rope_triton_, fullgraph=True, backend="aot_eager")
    y = materialize(values((2, 3, 4, 32), torch.bfloat16, seed=10).to(DEVICE), TOKEN_MAJOR)
    compiled(y, cos, sin, 16)
    assert torch.equal(bits(y), bits(want))
