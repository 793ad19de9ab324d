"""The named sets of cases (dsrope_gate.cases.Case) the gate runs:

- GOLDEN_CASES: the golden cases, whose inputs and reference stages the golden store keeps (dsrope_gate.golden);
- canonical(): the DeepSeek-V4 (D=512, R=64) and V3 (D=192: nope 128 + rope 64) heads in the production
  layout (token-major x, one table for the batch), every dtype: verify and the conformance command;
- probes(): one small bf16 case per layout class: what an implementation accepts, refuses or gets wrong;
- sweep(op, examples, seed): cases drawn by hypothesis from a fixed seed (dsrope_gate.strategies).
"""

from __future__ import annotations

from dsrope_gate.cases import SHORT, Case, Seeded
from dsrope_gate.layouts import BATCH_BROADCAST, CONTIGUOUS, TOKEN_MAJOR, Layout

# --- golden ----------------------------------------------------------------------------------------

# The golden cases' layouts by name (the manifest records each one's name, fields, strides and offset).
LAYOUTS = {
    layout.name: layout
    for layout in (
        TOKEN_MAJOR,
        CONTIGUOUS,
        Layout(order=(0, 2, 1, 3), pad=(1, 2, 1, 3), name="padded"),
        Layout(step=(2, 1, 3, 1), name="stepped"),
        Layout(order=(3, 0, 1, 2), name="channel_outer"),
        Layout(order=(0, 2, 1, 3), offset=7, name="offset"),
        Layout(order=(2, 0, 1, 3), step=(1, 2, 1, 2), pad=(0, 1, 0, 0), offset=5, name="stepped_channels_offset"),
        Layout(broadcast=(0, 1, 2, 3), name="sum_gradient"),  # the upstream gradient of out.sum()
        BATCH_BROADCAST,
        Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11, name="table_padded"),
        Layout(order=(1, 0, 2, 3), name="v3_seq_major"),
        Layout(order=(1, 0, 2), name="thd_head_major"),  # [T, H, d] view of a contiguous [H, T, d]
        Layout(step=(1, 2, 1), offset=3, name="thd_stepped"),
        Layout(order=(1, 0, 2), name="bsd_seq_major"),
    )
}
V3 = ("v3_interleaved", "v3_half_split")


def golden_case(
    name, seed, dtype, shape, rotary, eps=0.0, values="randn", x="token_major", grad="token_major",
    table="batch_broadcast", ops=("qnorm_rope", "partial_rope"), qkv_format="", unsqueeze_dim=None,
):  # fmt: skip
    """A golden case, its layouts named as the manifest records them."""
    return Case(
        name=name,
        shape=tuple(shape),
        rotary=rotary,
        dtype=dtype,
        values=Seeded(seed, values),
        x_layout=LAYOUTS[x],
        grad_layout=LAYOUTS[grad],
        cos_layout=LAYOUTS[table],
        sin_layout=LAYOUTS[table],
        eps=eps,
        ops=tuple(ops),
        kind="golden",
        qkv_format=qkv_format,
        unsqueeze_dim=unsqueeze_dim,
    )


def golden_cases() -> list[Case]:
    cases = []
    edge = (2, 2, 3, 512)  # edge values on the DSV4 head geometry, few rows, non-production layouts
    for i, dtype in enumerate(SHORT):
        short = SHORT[dtype]
        # DeepSeek-V4 heads: D=512, R=64; Flash 64 heads, Pro 128 heads; production layouts.
        v4 = dict(dtype=dtype, rotary=64, eps=1e-6)
        cases += [
            golden_case(f"flash-{short}", 100 + i, shape=(1, 64, 2, 512), **v4),
            golden_case(f"pro-{short}", 110 + i, shape=(1, 128, 1, 512), grad="contiguous", **v4),
            golden_case(
                f"zero-rows-{short}",
                120 + i,
                shape=edge,
                values="zero_rows",
                x="padded",
                grad="stepped",
                table="contiguous",
                **v4,
            ),  # fmt: skip
            golden_case(f"tiny-{short}", 130 + i, shape=edge, values="tiny", x="stepped", **v4),
            golden_case(
                f"huge-{short}",
                140 + i,
                shape=edge,
                values="huge",
                x="channel_outer",
                grad="sum_gradient",
                table="table_padded",
                **v4,
            ),  # fmt: skip
            golden_case(
                f"nan-{short}",
                150 + i,
                shape=edge,
                values="nan",
                x="offset",
                grad="stepped_channels_offset",
                **(v4 | dict(eps=1e-1)),
            ),  # fmt: skip
            # DeepSeek-V3 rope slice: d = 64, both pairings on the same input and table.
            golden_case(
                f"v3-bshd-{short}",
                200 + i,
                dtype,
                (2, 4, 16, 64),
                64,
                x="contiguous",
                grad="contiguous",
                table="contiguous",
                ops=V3,
                qkv_format="bshd",
            ),  # fmt: skip
        ]
    cases += [
        golden_case("subnormal-bf16", 160, "bfloat16", edge, 64, 1e-6, "subnormal"),
        golden_case(
            "v3-thd-bf16",
            210,
            "bfloat16",
            (12, 16, 64),
            64,
            x="thd_head_major",
            grad="thd_stepped",
            table="contiguous",
            ops=V3,
            qkv_format="thd",
        ),  # fmt: skip
        golden_case(
            "v3-shared-key-bf16",
            220,
            "bfloat16",
            (2, 4, 64),
            64,
            x="bsd_seq_major",
            grad="contiguous",
            table="contiguous",
            ops=V3,
            qkv_format="bshd",
            unsqueeze_dim=2,
        ),  # fmt: skip
    ]
    return cases


GOLDEN_CASES = golden_cases()


# --- canonical -----------------------------------------------------------------------------------------


def canonical(models=("dsv4", "v3")) -> list[Case]:
    """DeepSeek-V4 heads (D=512, R=64) and V3 heads (D=192: nope 128 + rope 64), token-major x (the
    production layout), one table for the batch (stride 0), every dtype."""
    geometry = {"dsv4": ((2, 16, 8, 512), 7), "v3": ((2, 8, 8, 192), 11)}
    return [
        Case(
            name=f"{model}-{dtype}",
            shape=geometry[model][0],
            rotary=64,
            dtype=dtype,
            values=Seeded(geometry[model][1], table_seed=geometry[model][1] + 1),
            grad_layout=CONTIGUOUS,
            kind="canonical",
        )
        for model in models
        for dtype in SHORT
    ]


# --- layout probes ---------------------------------------------------------------------------------------

# One small bf16 case per layout class (x token-major, one table for the batch, unless named).
LAYOUT_PROBES = {
    "token-major": dict(),
    "contiguous head-major": dict(x_layout=CONTIGUOUS),
    "permuted (channels outer)": dict(x_layout=Layout(order=(3, 0, 1, 2))),
    "stepped slices": dict(x_layout=Layout(step=(2, 1, 3, 1))),
    "storage offset": dict(x_layout=Layout(order=(0, 2, 1, 3), offset=7)),
    "padded token-major buffer": dict(x_layout=Layout(order=(0, 2, 1, 3), pad=(0, 0, 2, 8))),
    "per-batch tables": dict(cos_layout=CONTIGUOUS, sin_layout=CONTIGUOUS),
    "strided tables": dict(
        cos_layout=Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11),
        sin_layout=Layout(order=(2, 0, 1), pad=(3, 1, 2), offset=11),
    ),
    "stride-0 gradient": dict(grad_layout=Layout(broadcast=(0, 1, 2, 3))),
    "non-finite rows": dict(values="nonfinite"),
    "empty (S = 0)": dict(shape=(2, 3, 0, 96)),
}


def probes() -> list[Case]:
    out = []
    for i, (klass, spec) in enumerate(LAYOUT_PROBES.items()):
        spec = dict(spec)
        values = Seeded(300 + i, spec.pop("values", "randn"), table_seed=400 + i)
        fields = dict(shape=(2, 3, 5, 96), grad_layout=CONTIGUOUS) | spec
        out.append(Case(name=klass, rotary=32, dtype="bfloat16", values=values, kind="probe", **fields))
    return out


# --- the seeded sweep ------------------------------------------------------------------------------------


def sweep(op, examples: int, seed: int) -> list[Case]:
    """`examples` cases for `op` drawn by hypothesis from a fixed seed (dsrope_gate.strategies): shapes, any
    layouts (NaN in every gap), stride-0 tables and gradients, value kinds, dtypes, eps."""
    if examples <= 0:
        return []
    import os
    from dataclasses import replace
    from pathlib import Path

    # hypothesis keeps files (its constants cache) under ./.hypothesis unless told otherwise: a cache folder
    # instead, where the user has not chosen one
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dsrope" / "hypothesis"
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(cache))

    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from dsrope_gate.strategies import cases

    drawn = []

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=(Phase.generate,),
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis_seed(seed)
    @given(cases(op))
    def collect(case):
        drawn.append(case)

    collect()
    return [replace(case, name=f"sweep {i}") for i, case in enumerate(drawn[:examples])]
