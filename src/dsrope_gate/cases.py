"""The one Case type: an input set (x, cos/sin tables, an upstream gradient), each tensor in its own
layout, with rotary, eps and dtype, and how its values are made. Every consumer takes it: the golden
store and its cases, the hypothesis strategies, verify and the conformance command.

A Case is plain data whose repr is a Python expression: `Case(...).build(device)` rebuilds the exact
tensors anywhere (a failing property prints its case as a one-line command). Its values come from
one of two recipes:

- `Drawn`: x, the tables and the gradient each from its own seed and kind (what hypothesis draws);
- `Seeded`: x, then the gradient, then the tables drawn in turn from one torch generator, with edge
  values written into chosen elements (the golden, canonical and layout-probe cases).

Layouts (dsrope_gate.layouts): every element a view skips holds NaN, so a read through a wrong stride,
a wrong offset or past a missing mask turns into NaN in the output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from dsrope_gate.inputs import angles, tables
from dsrope_gate.layouts import BATCH_BROADCAST, TOKEN_MAJOR, Layout, materialize

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


class Inputs(NamedTuple):
    """A case's tensors as an implementation gets them (x [B, H, S, D], cos/sin FP32 [B, S, R], grad)."""

    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    grad: torch.Tensor


# --- values -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Values:
    """Tensor contents: a kind of values and the seed of the torch generator that draws them.

    normal: N(0, 1). tiny: N(0, 1) * 2**-e, e up to 70 (squares below FP32's normal range;
    fp16: its subnormals). huge: N(0, 1) * 2**e with the FP32 sum of squares of a row still
    finite. mixed: each element scaled by its own 2**e, |e| <= 20 (fp16: 6). zero_rows: normal
    with about half the rows all zero. midpoint: few-bit values; with `dyadic` tables the
    rotation is exact in FP32 and lands on rounding midpoints of x.dtype (float32: the values
    themselves are bf16 midpoints). overflow: the FP32 sum of squares of a row overflows
    (bf16/fp32; fp16 cannot overflow it and draws huge instead).
    """

    kind: str
    seed: int

    def make(self, shape, dtype: torch.dtype) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        n = torch.randn(shape, generator=g, dtype=torch.float64)
        d = max(shape[-1], 1) if len(shape) else 1
        fp16 = dtype == torch.float16
        kind = "huge" if (self.kind == "overflow" and fp16) else self.kind
        randint = lambda lo, hi, size=(): torch.randint(lo, hi + 1, size, generator=g)
        if kind == "normal":
            v = n
        elif kind == "tiny":
            v = n * 2.0 ** -int(randint(6, 16) if fp16 else randint(30, 70))
        elif kind == "huge":
            if fp16:
                v = (n * 2.0 ** int(randint(10, 13))).clamp(-65000, 65000)
            else:
                # |n| < 2**2.5 in practice; D * (2**e * |n|)**2 < 2**127 keeps the FP32 sum finite
                top = math.floor((120 - math.log2(d)) / 2)
                v = n.clamp(-5, 5) * 2.0 ** int(randint(top - 10, top))
        elif kind == "overflow":
            v = n.sign() * (1 + n.abs()) * 2.0 ** int(randint(62, 66))
        elif kind == "mixed":
            k = 6 if fp16 else 20
            v = n * torch.exp2(randint(-k, k, tuple(shape)).double())
        elif kind == "zero_rows":
            keep = torch.rand(tuple(shape[:-1]) + (1,), generator=g) < 0.5
            v = n * keep
        elif kind == "midpoint":
            if dtype == torch.float32:
                # odd 9-bit significands: each value is halfway between two bf16 neighbours
                m = randint(128, 255, tuple(shape)).double() * 2 + 1
                v = torch.where(n < 0, -m, m) * torch.exp2(randint(-11, -6, tuple(shape)).double())
            else:
                v = randint(-64, 64, tuple(shape)).double() / 16
        else:
            raise ValueError(f"unknown value kind {self.kind!r}")
        return v.to(torch.float32).to(dtype)


@dataclass(frozen=True)
class Tables:
    """cos/sin FP32 [B, S, R]; entries k >= R/2 hold NaN (never read).

    angles: cos/sin of position * 10000**(-2k/R), positions < 2**16. identity: cos 1, sin 0.
    quarter: cos 0, sin +-1. dyadic: cos in {1, 3/4, 1/2, 1 - 2**-(p+1)}, sin = +-odd * 2**-e
    with e around x.dtype's precision p: with midpoint values the rotation is exact in FP32 and
    many results sit exactly on rounding midpoints (the error model then allows one value).
    """

    kind: str
    seed: int

    def make(self, batch: int, seq: int, rotary: int, dtype: torch.dtype):
        g = torch.Generator().manual_seed(self.seed)
        half = rotary // 2
        shape = (batch, seq, half)
        if self.kind == "angles":
            c, s = angles(torch.randint(0, 1 << 16, (batch, seq, 1), generator=g), rotary)
        elif self.kind == "identity":
            c, s = torch.ones(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
        elif self.kind == "quarter":
            c = torch.zeros(shape, dtype=torch.float64)
            s = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
        elif self.kind == "dyadic":
            p = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
            near_one = 1 - 2.0 ** -(p + 1) if p < 24 else 1 - 2.0**-12
            choices = torch.tensor([1.0, 0.75, 0.5, near_one], dtype=torch.float64)
            c = choices[torch.randint(0, 4, shape, generator=g)]
            odd = (2 * torch.randint(0, 3, shape, generator=g) + 1).double()
            sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).double()
            s = sign * odd * torch.exp2(-torch.randint(p - 2, p + 4, shape, generator=g).double())
        else:
            raise ValueError(f"unknown table kind {self.kind!r}")
        nan = torch.full((batch, seq, rotary - half), float("nan"), dtype=torch.float64)
        return torch.cat((c, nan), -1).float(), torch.cat((s, nan), -1).float()


@dataclass(frozen=True)
class Drawn:
    """x, the tables and the gradient, each from its own kind and seed."""

    x: Values
    tables: Tables
    grad: Values

    def make(self, case: Case) -> dict[str, torch.Tensor]:
        b, _, s, _ = case.shape
        dtype = case.torch_dtype
        cos, sin = self.tables.make(b, s, case.rotary, dtype)
        return {"x": self.x.make(case.shape, dtype), "cos": cos, "sin": sin, "grad": self.grad.make(case.shape, dtype)}


# tiny: FP32 squares underflow; fp16 and fp32 inputs partly subnormal. bf16 subnormal inputs are the
# kind "subnormal" (the interpreter's widening of bf16 subnormals is fixed by dsrope.interpreter).
TINY = {"bfloat16": 2.0**-100, "float16": 2.0**-20, "float32": 2.0**-120, "subnormal": 2.0**-130}
HUGE = {"bfloat16": 2.0**40, "float16": 2.0**13, "float32": 2.0**40}
# DeepSeek-V3's rope: theta 10000 and its YaRN scaling, for max_seq_len 163840
V3_ROPE = dict(
    theta=10000.0,
    max_seq_len=163840,
    rope_scaling=dict(factor=40, beta_fast=32, beta_slow=1, original_max_position_embeddings=4096),
)


@dataclass(frozen=True)
class Seeded:
    """x, the gradient and (without table_seed) the tables drawn in turn from one generator seeded with
    `seed`; with table_seed the tables come from their own generator. `values` writes edge values into
    chosen elements: zero_rows, tiny, subnormal, huge, nan (golden cases), nonfinite (a layout probe).
    A gradient laid out with every dim broadcast is all ones (the gradient of `.sum()`); cos/sin are
    one table for the batch unless their layout keeps the batch dim (per-batch positions)."""

    seed: int
    values: str = "randn"
    table_seed: int | None = None

    def make(self, case: Case) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        dtype = case.torch_dtype
        x = torch.randn(case.shape, generator=g, dtype=torch.float64)
        grad = torch.randn(case.shape, generator=g, dtype=torch.float64)
        if case.qkv_format:
            cos, sin = v3_tables(case.v3_tokens, case.shape[-1] // 2, g)
            return {"x": x.to(dtype), "grad": grad.to(dtype), "cos": cos, "sin": sin}
        x, grad = self.edges(case, x, grad)
        if case.grad_layout.broadcast == (0, 1, 2, 3):
            grad = torch.ones(case.shape, dtype=torch.float64)
        per_batch = case.cos_layout.broadcast != (0,)
        table_seed = g if self.table_seed is None else self.table_seed
        cos, sin = tables(case.shape[0], case.shape[2], case.rotary, table_seed, per_batch, device="cpu")
        return {"x": x.to(dtype), "grad": grad.to(dtype), "cos": cos.contiguous(), "sin": sin.contiguous()}

    def edges(self, case: Case, x: torch.Tensor, grad: torch.Tensor):
        d, rotary, dtype = case.shape[-1], case.rotary, case.torch_dtype
        kind = self.values
        if kind == "zero_rows":
            x[0, 0] = 0  # every token of one head
            x[-1, -1, -1] = 0
            grad[0, 1, 0] = 0
        elif kind in ("tiny", "subnormal"):
            scale = TINY[case.dtype if kind == "tiny" else "subnormal"]
            x *= scale
            grad[:, :, 0] *= scale
        elif kind == "huge":
            x *= HUGE[case.dtype]
            if dtype != torch.float16:
                x[0, 1, 2] = 1e30 * torch.sign(x[0, 1, 2])  # the FP32 sum of squares overflows: rstd 0
            x = x.clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max)
        elif kind == "nan":
            x[0, 1, 1, d - rotary + 5] = float("nan")  # one rotary channel of one row
            grad[-1, 0, 2, 3] = float("nan")  # one pass-through channel of another row
        elif kind == "nonfinite":
            if x.numel():
                x[0, 1, 2, 7], x[1, 0, 3, d - 3], x[1, 2, 0, :] = float("nan"), float("inf"), float("-inf")
        elif kind != "randn":
            raise ValueError(f"values: unknown edge kind {kind!r}")
        return x, grad


def v3_tables(tokens: tuple[int, ...], half: int, g: torch.Generator):
    """cos, sin FP32 [*tokens, d/2] of the complex table DeepSeek-V3 models were trained with (its
    rope config, positions < 163840): upstream's FP32 computation as the reference transcribes it."""
    from dsrope_reference.rope_utils import upstream_frequencies, upstream_table

    freqs = upstream_frequencies(2 * half, V3_ROPE["max_seq_len"], V3_ROPE["theta"], V3_ROPE["rope_scaling"])
    positions = torch.randint(0, V3_ROPE["max_seq_len"], tokens, generator=g)
    table = upstream_table(positions.reshape(1, -1), freqs).reshape(*tokens, half)
    return table.real.contiguous(), table.imag.contiguous()


# --- the case --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One input set and the ops it is for.

    DeepSeek-V4 ops (qkv_format ""): x [B, H, S, D], cos/sin FP32 [B, S, R]. DeepSeek-V3 rotations
    (qkv_format "bshd" or "thd"): x [B, S, H, d] or [T, H, d] (without H with unsqueeze_dim=2: a
    shared key), cos/sin FP32 [*tokens, d/2] (the complex table's real and imaginary parts).
    `kind` says where the case comes from: canonical, golden, probe (one per layout class) or drawn.
    """

    name: str
    shape: tuple
    rotary: int
    dtype: str
    values: Drawn | Seeded
    x_layout: Layout = TOKEN_MAJOR
    grad_layout: Layout = TOKEN_MAJOR
    cos_layout: Layout = BATCH_BROADCAST
    sin_layout: Layout = BATCH_BROADCAST
    eps: float = 1e-6
    ops: tuple[str, ...] = ("qnorm_rope", "partial_rope")
    kind: str = "drawn"
    qkv_format: str = ""
    unsqueeze_dim: int | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def v3_tokens(self) -> tuple[int, ...]:
        return self.shape[:2] if self.qkv_format == "bshd" else self.shape[:1]

    @property
    def evidence(self) -> bool:
        """Whether the case's bits are evidence of an implementation's semantics: normal values only.
        At edge values (huge, tiny, subnormal, zero rows, non-finite, the drawn kinds) any reduction order
        of a correct kernel moves the last bits of many elements: they judge the verdict only."""
        return isinstance(self.values, Seeded) and self.values.values == "randn"

    def layouts(self) -> dict[str, Layout]:
        return {"x": self.x_layout, "grad": self.grad_layout, "cos": self.cos_layout, "sin": self.sin_layout}

    def logical(self) -> dict[str, torch.Tensor]:
        """The values of every input, contiguous, on the CPU, from the recipe alone."""
        return self.values.make(self)

    def lay_out(self, logical: dict[str, torch.Tensor], device) -> Inputs:
        """The logical values in the case's layouts on `device` (gaps NaN)."""
        laid = {k: materialize(logical[k].to(device), layout) for k, layout in self.layouts().items()}
        return Inputs(laid["x"], laid["cos"], laid["sin"], laid["grad"])

    def build(self, device) -> Inputs:
        return self.lay_out(self.logical(), device)
