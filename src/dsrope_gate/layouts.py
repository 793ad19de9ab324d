"""Build tensors with a given logical shape and any physical layout, gaps filled with NaN.

A layout is: the storage order of the logical dims (outermost first), padding added to each
storage dim, a step on each logical dim, and a storage offset. Every element the view skips
holds NaN, so a kernel that reads through a wrong stride produces NaN where it should not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Layout:
    order: tuple[int, ...] | None = None  # logical dims, outermost first; None = row-major
    pad: tuple[int, ...] | None = None  # extra elements per storage dim (same order as `order`)
    step: tuple[int, ...] | None = None  # step per logical dim
    offset: int = 0
    broadcast: tuple[int, ...] = field(default=())  # logical dims given stride 0 (size kept)
    guard: int = 0  # NaN elements after the storage: a read past the view's extent meets NaN, not memory
    name: str = field(default="", compare=False, repr=False)  # a named layout's name (the golden manifest's)

    def describe(self, shape) -> str:
        guard = f" guard={self.guard}" if self.guard else ""
        return (
            f"shape={list(shape)} order={self.order} pad={self.pad} step={self.step} offset={self.offset} "
            f"broadcast={self.broadcast}{guard}"
        )


TOKEN_MAJOR = Layout(order=(0, 2, 1, 3), name="token_major")  # [B, H, S, D] view of a contiguous [B, S, H, D]
CONTIGUOUS = Layout(name="contiguous")
BATCH_BROADCAST = Layout(broadcast=(0,), name="batch_broadcast")  # cos/sin expanded over the batch: stride 0


def materialize(values: torch.Tensor, layout: Layout, device=None) -> torch.Tensor:
    """A tensor equal to `values` with `layout`'s strides and offset."""
    device = values.device if device is None else device
    shape = tuple(values.shape)
    n = len(shape)
    order = layout.order or tuple(range(n))
    pad = layout.pad or (0,) * n
    step = layout.step or (1,) * n
    sizes = [shape[d] * step[d] if d not in layout.broadcast else 1 for d in range(n)]
    extent = {d: sizes[d] + pad[i] for i, d in enumerate(order)}
    strides = [0] * n
    acc = 1
    for d in reversed(order):
        strides[d] = acc * (step[d] if d not in layout.broadcast else 0)
        acc *= max(extent[d], 1)
    size = acc + layout.offset + layout.guard
    storage = torch.full((size,), float("nan"), dtype=values.dtype, device=device)
    view = storage.as_strided(shape, strides, layout.offset)
    # a broadcast dim keeps the first slice of `values`: compare against the returned tensor
    src, dst = values, view
    for d in layout.broadcast:
        src, dst = src.narrow(d, 0, min(1, shape[d])), dst.narrow(d, 0, min(1, shape[d]))
    dst.copy_(src)
    return view


def layout_of(t: torch.Tensor) -> str:
    return f"shape={list(t.shape)} strides={list(t.stride())} offset={t.storage_offset()} dtype={t.dtype}"
