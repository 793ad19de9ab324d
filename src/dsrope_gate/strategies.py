"""Hypothesis strategies for the property suite and the conformance sweep: a logical shape, a physical
layout for every tensor, the values in them, rotary, eps and dtype.

A drawn example is a `dsrope_gate.cases.Case` whose values are `Drawn`: plain data whose repr is a
Python expression, rebuilt anywhere by `case.build(device)`; a failing property prints its case as a
one-line command (see tests/test_properties.py).

Layouts (dsrope_gate.layouts): any storage order of the logical dims, padding in any storage dim,
a step on any logical dim, a storage offset, and NaN guard elements after the storage. Every
element a view skips holds NaN, so a read through a wrong stride, a wrong offset or past a
missing mask turns into NaN in the output. Stride-0 (broadcast) dims are drawn only where the
contract allows them: the batch (and sequence) dim of cos/sin, and any dim of an upstream
gradient (all four for the gradient of `.sum()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st

from dsrope_gate.cases import Case, Drawn, Tables, Values
from dsrope_gate.layouts import TOKEN_MAJOR, Layout, materialize
from dsrope_gate.ops import Op

DTYPES = ("bfloat16", "float16", "float32")

# The `gpu` profile (compiled kernels) draws larger shapes; every other profile stays small
# enough for Triton's interpreter. The profile is loaded (conftest.py, or --hypothesis-profile)
# before test modules are imported, so it is known here.
LARGE = settings.get_current_profile_name() == "gpu"


def storage_span(shape, layout: Layout) -> int:
    """Elements the layout's storage spans (without offset and guard)."""
    n = len(shape)
    order = layout.order or tuple(range(n))
    pad = layout.pad or (0,) * n
    step = layout.step or (1,) * n
    span = 1
    for i, d in enumerate(order):
        size = 1 if d in layout.broadcast else shape[d] * step[d]
        span *= max(size + pad[i], 1)
    return span


@st.composite
def layouts(draw, shape, broadcastable=(), preferred=TOKEN_MAJOR.order):
    """Any layout of `shape`. Shrinks towards `preferred` storage order, no padding, no steps."""
    n = len(shape)
    identity = tuple(range(n))
    order = tuple(draw(st.sampled_from([preferred or identity, identity]) | st.permutations(range(n))))
    pad = tuple(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    step = tuple(draw(st.lists(st.integers(1, 3), min_size=n, max_size=n)))
    offset = draw(st.integers(0, 24))
    broadcast = tuple(d for d in broadcastable if draw(st.booleans()))
    layout = Layout(order=order, pad=pad, step=step, offset=offset, broadcast=broadcast)
    # a guard as large as the storage catches reads up to one whole extent past its end
    guard = draw(st.sampled_from([0, storage_span(shape, layout) + offset]))
    return Layout(order=order, pad=pad, step=step, offset=offset, broadcast=broadcast, guard=guard)


def token_major_views():
    """x [B, H, S, D] as a slice of a wider token-major buffer (q out of a fused qkv projection):
    [B, S, H', D'] storage with extra heads and channels, the slice starting at an offset."""
    return st.builds(
        lambda pad, offset: Layout(order=TOKEN_MAJOR.order, pad=(0, 0) + pad, offset=offset),
        st.tuples(st.integers(0, 3), st.integers(0, 40)),
        st.integers(0, 64),
    )


# gpu profile: H, D and R are constexprs, so each new combination compiles the kernels (about a
# second each); drawing them from short lists lets most examples reuse a compiled kernel.
GPU_HEADS = [1, 3, 16]
GPU_GEOMETRY = [(24, 8), (34, 34), (64, 64), (96, 32), (130, 2), (192, 64), (512, 64), (25, 6), (13, 12)]


@st.composite
def geometry(draw, even_channels: bool):
    """(B, H, S, D), rotary. D mostly not a power of two; R = D, R = 2 and R/2 odd all occur."""
    if LARGE:
        b, h, s = draw(st.integers(1, 6)), draw(st.sampled_from(GPU_HEADS)), draw(st.integers(1, 64))
        fits = [(d, r) for d, r in GPU_GEOMETRY if d % 2 == 0 or not even_channels]
        d, rotary = draw(st.sampled_from(fits))
        return (b, h, s, d), rotary
    b = draw(st.integers(1, 3))
    h = draw(st.integers(1, 4))
    s = draw(st.integers(1, 5))
    d = draw(st.integers(2, 48) | st.sampled_from([64, 96, 128]))
    if even_channels and d % 2:
        d += 1
    rotary = 2 * draw(st.integers(1, d // 2) | st.just(d // 2))
    return (b, h, s, d), rotary


V3_VALUE_KINDS = ["normal", "mixed", "tiny", "huge", "zero_rows", "midpoint"]
TABLE_KINDS = ["angles", "dyadic", "identity", "quarter"]
EPS = [1e-6, 1e-5, 1e-12, 1e-3, 0.1, 1.0, 2.0**-100]
seeds = st.integers(0, 2**31 - 1)


@st.composite
def cases(draw, op: Op, value_kinds=None, eps=None):
    """A Case for `op` (its record says whether D must be even and which value kinds x may take).

    value_kinds: the kinds x may draw (default: the op's); eps: a list to draw from (default: EPS, or any
    float in [1e-30, 10]).
    """
    shape, rotary = draw(geometry(even_channels=op.even_channels))
    dtype = draw(st.sampled_from(DTYPES))
    x_values = Values(draw(st.sampled_from(value_kinds or op.value_kinds)), draw(seeds))
    x_layout = draw(layouts(shape) | token_major_views())
    b, _, s, _ = shape
    table_shape = (b, s, rotary)
    table_values = Tables(draw(st.sampled_from(TABLE_KINDS)), draw(seeds))
    cos_layout = draw(layouts(table_shape, broadcastable=(0, 1), preferred=None))
    sin_layout = draw(layouts(table_shape, broadcastable=(0, 1), preferred=None))
    grad_values = Values(draw(st.sampled_from(["normal", "mixed", "zero_rows", "midpoint"])), draw(seeds))
    grad_layout = draw(layouts(shape, broadcastable=(0, 1, 2, 3)) | token_major_views())
    eps_value = draw(st.sampled_from(eps) if eps else st.sampled_from(EPS) | st.floats(1e-30, 10.0))
    return Case(
        name="drawn",
        shape=shape,
        rotary=rotary,
        dtype=dtype,
        values=Drawn(x_values, table_values, grad_values),
        x_layout=x_layout,
        grad_layout=grad_layout,
        cos_layout=cos_layout,
        sin_layout=sin_layout,
        eps=eps_value,
    )


# --- DeepSeek-V3 rope utilities (rope_utils) ------------------------------------------------------


@dataclass(frozen=True)
class V3Case:
    """One example for apply_rotary_emb / apply_rotary_emb_half_split.

    x: [B, S, H, d] (bshd, lead = (B, S)) or [T, H, d] (thd, lead = (T,)); heads = 0 drops the
    head dim (a shared key: [B, S, d] / [T, d], unsqueeze_dim=2 for the interleaved pairing).
    The complex64 table [*lead, d/2] has the values of `table` (cos + i sin of its first d/2
    entries) and its own layout; trainable gives it requires_grad (the eager path).
    """

    lead: tuple
    heads: int
    dim: int
    pairing: str  # "interleaved" (pairs 2j, 2j+1) or "half_split" (pairs j, j + d/2)
    dtype: str
    x: Values
    x_layout: Layout
    table: Tables
    table_layout: Layout
    trainable: bool
    grad: Values
    grad_layout: Layout

    @property
    def qkv_format(self) -> str:
        return "bshd" if len(self.lead) == 2 else "thd"

    @property
    def shape(self) -> tuple:
        return (*self.lead, self.heads, self.dim) if self.heads else (*self.lead, self.dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def build(self, device):
        """x, table, grad with their drawn layouts (the table requires grad when trainable)."""
        dtype = self.torch_dtype
        x = materialize(self.x.make(self.shape, dtype).to(device), self.x_layout)
        batch, seq = self.lead if len(self.lead) == 2 else (1, self.lead[0])
        cos, sin = self.table.make(batch, seq, self.dim, dtype)
        half = self.dim // 2
        table = torch.complex(cos[..., :half], sin[..., :half]).reshape(*self.lead, half)
        table = materialize(table.to(device), self.table_layout)
        if self.trainable:
            table.requires_grad_()
        grad = materialize(self.grad.make(self.shape, dtype).to(device), self.grad_layout)
        return x, table, grad


@st.composite
def v3_cases(draw):
    if draw(st.booleans()):
        lead = (draw(st.integers(1, 6 if LARGE else 3)), draw(st.integers(1, 64 if LARGE else 5)))
    else:
        lead = (draw(st.integers(1, 256 if LARGE else 12)),)
    if LARGE:  # few head and pair counts: compiled kernels are reused (GPU_GEOMETRY)
        heads, pairs = draw(st.sampled_from([0, *GPU_HEADS])), draw(st.sampled_from([6, 17, 32, 64]))
    else:
        heads = draw(st.integers(0, 4))
        pairs = draw(st.integers(1, 24) | st.sampled_from([32, 48, 64]))
    shape = (*lead, heads, 2 * pairs) if heads else (*lead, 2 * pairs)
    return V3Case(
        lead=lead,
        heads=heads,
        dim=2 * pairs,
        pairing=draw(st.sampled_from(["interleaved", "half_split"])),
        dtype=draw(st.sampled_from(DTYPES)),
        x=Values(draw(st.sampled_from(V3_VALUE_KINDS)), draw(seeds)),
        x_layout=draw(layouts(shape, preferred=None)),
        table=Tables(draw(st.sampled_from(TABLE_KINDS)), draw(seeds)),
        table_layout=draw(layouts((*lead, pairs), broadcastable=tuple(range(len(lead))), preferred=None)),
        trainable=draw(st.booleans()),
        grad=Values(draw(st.sampled_from(["normal", "mixed", "zero_rows", "midpoint"])), draw(seeds)),
        grad_layout=draw(layouts(shape, broadcastable=tuple(range(len(shape))), preferred=None)),
    )
