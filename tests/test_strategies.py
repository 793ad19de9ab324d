"""The strategies draw every class of case they promise (dsrope_gate.strategies' docstring): each storage order,
padding, step, offset and guard of x; the token-major view of a wider buffer; stride-0 tables over the batch and
the sequence; the gradient of `.sum()` (every dim stride 0); rotary widths R = D, R = 2 and R/2 odd; odd D where
the op allows it; every value kind, table kind, dtype and eps. `hypothesis.find` must reach an example of each:
a strategy that stopped drawing one would leave the properties and the sweep blind to it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from dsrope_gate.layouts import TOKEN_MAJOR
from dsrope_gate.ops import PARTIAL_ROPE, QNORM_ROPE, ROWS
from dsrope_gate.strategies import DTYPES, EPS, TABLE_KINDS, cases

SEARCH = settings(
    max_examples=3000, database=None, phases=(Phase.generate,), suppress_health_check=list(HealthCheck), deadline=None
)


def reaches(op, predicate, search=SEARCH) -> bool:
    try:
        find(cases(op), predicate, settings=search)
    except Exception:  # hypothesis.errors.NoSuchExample
        return False
    return True


def padded(i):
    return lambda c: c.x_layout.pad is not None and c.x_layout.pad[i] > 0


def stepped(d):
    return lambda c: c.x_layout.step is not None and c.x_layout.step[d] > 1


X_CLASSES = {
    "another storage order": lambda c: c.x_layout.order not in (None, TOKEN_MAJOR.order, (0, 1, 2, 3)),
    "channels not innermost": lambda c: c.x_layout.order is not None and c.x_layout.order[-1] != 3,
    **{f"padding in storage dim {i}": padded(i) for i in range(4)},
    **{f"a step on dim {d}": stepped(d) for d in range(4)},
    "a storage offset": lambda c: c.x_layout.offset > 0,
    "a guard after the storage": lambda c: c.x_layout.guard > 0,
    "a token-major view of a wider buffer": lambda c: (
        c.x_layout.order == TOKEN_MAJOR.order
        and c.x_layout.step is None
        and (c.x_layout.pad or (0,) * 4)[2] > 0
        and (c.x_layout.pad or (0,) * 4)[3] > 0
    ),
}
TABLE_CLASSES = {
    "one table for the batch (stride 0)": lambda c: c.cos_layout.broadcast == (0,),
    "one row for the sequence (stride 0)": lambda c: c.cos_layout.broadcast == (1,),
    "both": lambda c: c.sin_layout.broadcast == (0, 1),
    "per-batch strided": lambda c: c.cos_layout.broadcast == () and c.cos_layout.step not in (None, (1, 1, 1)),
}
GRAD_CLASSES = {
    "the gradient of .sum() (every dim stride 0)": lambda c: c.grad_layout.broadcast == (0, 1, 2, 3),
    "some dims stride 0": lambda c: 0 < len(c.grad_layout.broadcast) < 4,
    "no stride 0": lambda c: c.grad_layout.broadcast == () and c.grad_layout.order != TOKEN_MAJOR.order,
}
GEOMETRY = {
    "R = D": lambda c: c.rotary == c.shape[-1],
    "R = 2": lambda c: c.rotary == 2,
    "R/2 odd and R < D": lambda c: (c.rotary // 2) % 2 == 1 and c.rotary < c.shape[-1],
    "D not a power of two": lambda c: c.shape[-1] & (c.shape[-1] - 1) != 0,
    "several batches, heads and tokens": lambda c: min(c.shape[:3]) > 1,
}


@pytest.mark.parametrize("op", [QNORM_ROPE, PARTIAL_ROPE], ids=str)
@pytest.mark.parametrize(
    "name", [*X_CLASSES, *TABLE_CLASSES, *GRAD_CLASSES, *GEOMETRY], ids=lambda n: n.replace(" ", "-")
)
def test_every_layout_and_geometry_class_is_drawn(op, name):
    predicate = (X_CLASSES | TABLE_CLASSES | GRAD_CLASSES | GEOMETRY)[name]
    assert reaches(op, predicate), f"{op}: the strategies never drew {name}"


def test_odd_channels_only_where_the_op_allows_them():
    assert not QNORM_ROPE.even_channels and reaches(QNORM_ROPE, lambda c: c.shape[-1] % 2 == 1)
    short = settings(SEARCH, max_examples=300)  # a search that finds nothing runs to its end
    assert PARTIAL_ROPE.even_channels and not reaches(PARTIAL_ROPE, lambda c: c.shape[-1] % 2 == 1, short)
    assert not reaches(QNORM_ROPE, lambda c: c.rotary % 2 == 1 or c.rotary > c.shape[-1], short)


@pytest.mark.parametrize("op", list(ROWS.values()), ids=str)
def test_every_value_kind_table_kind_dtype_and_eps_is_drawn(op):
    missing = [k for k in op.value_kinds if not reaches(op, lambda c, k=k: c.values.x.kind == k)]
    missing += [k for k in TABLE_KINDS if not reaches(op, lambda c, k=k: c.values.tables.kind == k)]
    missing += [d for d in DTYPES if not reaches(op, lambda c, d=d: c.dtype == d)]
    missing += [e for e in EPS if not reaches(op, lambda c, e=e: c.eps == e)]
    assert not missing, missing
    assert reaches(op, lambda c: c.eps not in EPS)  # and floats off the list
