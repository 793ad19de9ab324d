"""The rope tables op: its cases, the semantics labels of a table and their emulations, and the judge of a
table builder, `rope_tables(positions, rotary, theta, rope_scaling) -> (cos, sin)`.

positions: int64 [B, S], values >= 0 (the cases reach 2**20). rope_scaling: None (a plain table), or the
DeepSeek config dict (type, factor, original_max_position_embeddings, beta_fast, beta_slow, optional mscale
and mscale_all_dim): when given, YaRN applies (the caller decides where, as DeepSeek-V4's compress layers
do). cos and sin: FP32 [B, S, R], entry k < R/2 pair k's (dsrope_gate.inputs' convention); entries
k >= R/2 are not judged. A builder that folds an attention factor into cos and sin declares it
(`TableBuilder.attention_factor`) and is judged against the reference scaled by it. The contract
(fp32-elementwise) and its per-element error model: dsrope_reference.rope_tables and
docs/tables-and-pipelines.md.

Semantics. A label fixes every step of the table but the evaluation of cos and sin, which is the platform's
(glibc's cosf, SLEEF's, CUDA's: within 1 or 2 ulp of the exact value, the allowance the contract gives too).
So a label's emulation is the interval of FP32 values a builder of that semantics gives on any platform:
the exact cos and sin (FP64) of the label's angle, widened by the platform's ulps, then the label's
amplitude and store. A label is one choice on each of four axes; the contract takes the first of each:
  frequencies  DeepSeek's FP32 op sequence (1 / theta**(2j/d); YaRN blend f / factor * (1 - smooth) + f * smooth)
               | fp64-frequencies | yarn-reciprocal-product | yarn-untruncated | yarn-channel-ramp
               | yarn-half-clamp
  angles       fl32(fl32(p) * f) | tf32-angles | fp64-angles
  amplitude    the declared attention factor | mscale-ratio | mscale-factor-only
  store        FP32 | bf16-cache
A combined label joins its non-default choices with "+" ("yarn-reciprocal-product+bf16-cache"). The
agreement of a table with a label is the share of its judged entries inside the label's interval; the
classifier names the labels of best mean agreement that reach the threshold on every case, and among
tied ones the simplest (fewest choices off the contract): on plain tables the YaRN variants, and without
YaRN the mscale ones, give the contract's bits and are not named.

Two YaRN faults of the field are not table faults and no label names them: onnxruntime/mobius PR 548 (the
softmax scale's mscale**2 missing while the table was right) and huggingface/transformers PR 47435
(mscale_all_dim missing from DeepSeek-V2's softmax scale).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from dsrope_reference.floats import describe_violation, inside
from dsrope_reference.rope_tables import CPU_ULPS, CUDA_ULPS, table_model

from dsrope_gate import semantics

CONTRACT = "fp32-elementwise"
# the non-default choices of each axis, in the order combined labels name them
FREQUENCIES = (
    "fp64-frequencies",
    "yarn-reciprocal-product",
    "yarn-untruncated",
    "yarn-channel-ramp",
    "yarn-half-clamp",
)
ANGLES = ("tf32-angles", "fp64-angles")
AMPLITUDES = ("mscale-ratio", "mscale-factor-only")
STORES = ("bf16-cache",)
# One line per label: the report's definitions (the module docstring says more).
LABELS = {
    CONTRACT: "the contract: FP32 inverse frequencies (DeepSeek's op sequence), the FP32 angle fl32(fl32(p) * f), "
    "FP32 cos and sin, times the declared attention factor",
    "fp64-frequencies": "the inverse frequencies computed in FP64 and rounded once to FP32 (dsrope's fp64=True): "
    "inside the model, other bits",
    "yarn-reciprocal-product": "the YaRN interpolated frequency as 1 / (factor * theta**(2j/d)) (transformers' "
    "_compute_yarn_parameters, megatron-core's YarnRotaryEmbedding) where DeepSeek divides 1 / theta**(2j/d) by "
    "factor: inside the model, other bits unless factor is a power of two",
    "yarn-untruncated": "the YaRN ramp's bounds not floored and ceiled (transformers' truncate=False; the mismatch "
    "of vLLM issue 27722, there for gpt-oss)",
    "yarn-channel-ramp": "the YaRN ramp indexed by the channel 2j instead of the pair j (the change proposed in "
    "jquesnelle/yarn issue 65)",
    "yarn-half-clamp": "the YaRN ramp's high bound clamped at d/2 - 1 instead of d - 1 (the two clamps of "
    "jingyaogong/minimind issue 602)",
    "tf32-angles": "the angle product with TF32 operands (p and f rounded to 10 mantissa bits, to nearest), as a "
    "matmul on a GPU may run it (transformers 5.17.0 and nemo-automodel build the angles with a matmul)",
    "fp64-angles": "frequencies, angle, cos and sin in FP64, rounded once to FP32: more accurate, other bits",
    "mscale-ratio": "YaRN's attention factor mscale(factor, mscale) / mscale(factor, mscale_all_dim) folded into the "
    "table, HF's defaults 1 and 0 for absent keys: 1.2773 on DeepSeek-V4's compress layers, which have none "
    "(atlas PR 342)",
    "mscale-factor-only": "0.1 * ln(factor) + 1 folded into the table whatever mscale and mscale_all_dim say "
    "(vLLM issue 48621, 1.2773 where transformers gives 1.0; the value exllamav3 issue 259 asks for)",
    "bf16-cache": "cos and sin rounded to bf16 (a trainer's cache in the activations' dtype: prime-rl PR 3584, "
    "vLLM issue 48304)",
}
AXES = (FREQUENCIES, ANGLES, AMPLITUDES, STORES)


def combined(choices) -> str:
    """The label of one choice per axis (None: the contract's)."""
    parts = [c for c in choices if c is not None]
    return "+".join(parts) if parts else CONTRACT


EMULATIONS = tuple(combined(c) for c in itertools.product(*((None, *axis) for axis in AXES)))


def parts(label: str) -> dict[int, str]:
    """Axis index -> the label's non-default choice on it."""
    if label == CONTRACT:
        return {}
    out = {}
    for part in label.split("+"):
        axis = next(i for i, choices in enumerate(AXES) if part in choices)
        out[axis] = part
    return out


# --- cases ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Yarn:
    """A DeepSeek YaRN configuration (config.json's rope_scaling)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32
    beta_slow: float = 1
    mscale: float | None = None
    mscale_all_dim: float | None = None

    def config(self) -> dict:
        """The rope_scaling dict as a DeepSeek config.json spells it (mscale keys only where set)."""
        out = {
            "type": "yarn",
            "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "beta_fast": self.beta_fast,
            "beta_slow": self.beta_slow,
        }
        for key in ("mscale", "mscale_all_dim"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass(frozen=True)
class Positions:
    """Positions drawn uniformly from [low, high] by a generator seeded with `seed`; the first element is low,
    the last high."""

    low: int
    high: int
    seed: int = 0

    def make(self, batch: int, seq: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed)
        p = torch.randint(self.low, self.high + 1, (batch, seq), generator=g, dtype=torch.int64)
        if p.numel():
            p[0, 0], p[-1, -1] = self.low, self.high
        return p


@dataclass(frozen=True)
class TableCase:
    """One call of rope_tables: the rope configuration, the shape and the positions. Its repr rebuilds it."""

    name: str
    rotary: int
    theta: float
    scaling: Yarn | None
    batch: int
    seq: int
    positions: Positions

    @property
    def rope_scaling(self) -> dict | None:
        return None if self.scaling is None else self.scaling.config()

    def position_ids(self, device=None) -> torch.Tensor:
        return self.positions.make(self.batch, self.seq).to(device or "cpu")


# DeepSeek-V4 (qk_rope_head_dim 64). Main (sliding-window) layers: plain rope at rope_theta 10000. Compress
# layers: YaRN at compress_rope_theta 160000 with rope_scaling {type yarn, factor 16,
# original_max_position_embeddings 65536, beta_fast 32, beta_slow 1} and no mscale: DeepSeek-V4-Flash's
# config.json (huggingface.co/deepseek-ai/DeepSeek-V4-Flash), applied this way by transformers 5.17.0's
# configuration_deepseek_v4 (YaRN on the compress layers only, attention_factor forced to 1.0: "the V4 reference
# does NOT multiply cos/sin by YaRN's computed mscale") and sglang 0.5.23's srt/models/deepseek_v4.py
# (original_seq_len only where compress_ratio is set; its precompute_freqs_cis has no mscale).
V4_MAIN = dict(rotary=64, theta=10000.0, scaling=None)
V4_COMPRESS = dict(rotary=64, theta=160000.0, scaling=Yarn(16, 65536, 32, 1))
V4_ORIGINAL = 65536
# DeepSeek-V3's config.json: rope_theta 10000, YaRN factor 40, original 4096, beta 32/1, mscale = mscale_all_dim = 1
V3 = dict(rotary=64, theta=10000.0, scaling=Yarn(40, 4096, 32, 1, mscale=1.0, mscale_all_dim=1.0))
# DeepSeek-V4's YaRN at the main layers' rope_theta 10000 (what a builder applying YaRN to every layer gives
# there): ceil(cd(beta_slow)) = 33 passes the 32 pairs, where the two clamps of the ramp's high bound part
# (yarn-half-clamp); no DeepSeek layer takes it
RAMP_CLAMPED = dict(rotary=64, theta=10000.0, scaling=Yarn(16, 65536, 32, 1))
FAR = ((1 << 20) - 4096, 1 << 20)  # the widest angle intervals; SLOW_CASES draw from 2**19 up


def _config_cases(prefix: str, config: dict, original: int, shapes, seed: int, far=FAR) -> list[TableCase]:
    """Positions near 0, near the original length and far past it (up to 2**20), one shape each."""
    regions = {"start": (0, 64), "original": (original - 64, original + 64), "far": far}
    return [
        TableCase(f"{prefix}/{region}", **config, batch=b, seq=s, positions=Positions(lo, hi, seed + i))
        for i, ((region, (lo, hi)), (b, s)) in enumerate(zip(regions.items(), shapes, strict=True))
    ]


SHAPES = ((1, 16), (2, 8), (3, 5))
CASES = (
    _config_cases("v4-main", V4_MAIN, V4_ORIGINAL, SHAPES, 10)
    + _config_cases("v4-compress", V4_COMPRESS, V4_ORIGINAL, SHAPES, 20)
    + _config_cases("v3", V3, V3["scaling"].original_max_position_embeddings, SHAPES, 30)
    + [TableCase("ramp-clamped/far", **RAMP_CLAMPED, batch=2, seq=4, positions=Positions(*FAR, 40))]
)
# the same regions with 8 times as many positions, far from 2**19 up (tests marked slow)
SLOW_SHAPES = ((4, 32), (8, 16), (2, 64))
WIDE = (1 << 19, 1 << 20)
SLOW_CASES = (
    _config_cases("v4-main", V4_MAIN, V4_ORIGINAL, SLOW_SHAPES, 50, WIDE)
    + _config_cases("v4-compress", V4_COMPRESS, V4_ORIGINAL, SLOW_SHAPES, 60, WIDE)
    + _config_cases("v3", V3, V3["scaling"].original_max_position_embeddings, SLOW_SHAPES, 70, WIDE)
)


# --- emulations ---------------------------------------------------------------------------------------------


def yarn_mscale(scale: float, mscale: float) -> float:
    """YaRN's 0.1 * mscale * ln(scale) + 1 (1 at scale <= 1), in Python floats as every project computes it."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def label_frequencies(choice: str | None, rotary: int, theta: float, rope_scaling, dtype=torch.float32):
    """[R/2] inverse frequencies of a frequencies choice, in `dtype`, with DeepSeek's ops in DeepSeek's order
    (a Python number operand is rounded to the tensor's dtype): the contract's with choice None."""
    if choice == "fp64-frequencies":
        return label_frequencies(None, rotary, theta, rope_scaling, torch.float64).to(dtype)
    exponents = torch.arange(0, rotary, 2, dtype=dtype) / rotary
    freqs = 1.0 / (theta**exponents)
    if rope_scaling is None:
        return freqs
    factor, original = rope_scaling["factor"], rope_scaling["original_max_position_embeddings"]

    def correction_dim(rotations):
        return rotary * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(rope_scaling["beta_fast"]), correction_dim(rope_scaling["beta_slow"])
    if choice != "yarn-untruncated":
        low, high = math.floor(low), math.ceil(high)
    top = rotary // 2 - 1 if choice == "yarn-half-clamp" else rotary - 1
    low, high = max(low, 0), min(high, top)
    if low == high:
        high += 0.001  # the published ramp: never a zero-width ramp
    step = 2 if choice == "yarn-channel-ramp" else 1
    ramp = torch.clamp((torch.arange(0, step * (rotary // 2), step, dtype=dtype) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    if choice == "yarn-reciprocal-product":
        interpolated = 1.0 / (factor * theta**exponents)
    else:
        interpolated = freqs / factor
    return interpolated * (1 - smooth) + freqs * smooth


def round_tf32(v: torch.Tensor) -> torch.Tensor:
    """FP64 values rounded to 11 significant bits (TF32's 10 stored), to nearest, ties to even."""
    _, e = torch.frexp(v)  # v = m * 2**e, 0.5 <= |m| < 1
    q = torch.exp2(e.double() - 11)
    return torch.round(v / q) * q


def label_amplitude(choice: str | None, rope_scaling, declared: float) -> float:
    """The factor a label folds into cos and sin."""
    if choice is None:
        return declared
    if rope_scaling is None:
        return 1.0
    factor = rope_scaling["factor"]
    if choice == "mscale-ratio":
        mscale, mscale_all_dim = rope_scaling.get("mscale", 1), rope_scaling.get("mscale_all_dim", 0)
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor, 1)


class Interval(NamedTuple):
    """An emulated entry: its correctly rounded value and the FP32 (or bf16) values a platform's cos and sin
    may give, all as FP64 tensors."""

    center: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor


def _fp32_ulp(v: torch.Tensor) -> torch.Tensor:
    _, e = torch.frexp(v)
    return torch.exp2(e.double() - 24)


def _exact(frequency: str | None, angle: str | None, positions, rotary: int, theta: float, rope_scaling):
    """The label's angle [*positions.shape, R/2] and its exact cos and sin, as FP64 tensors."""
    dtype = torch.float64 if angle == "fp64-angles" else torch.float32
    freqs = label_frequencies(frequency, rotary, theta, rope_scaling, dtype)
    p = positions.to("cpu")[..., None]
    if angle == "tf32-angles":  # an 11-bit by 11-bit product: exact in FP32
        radians = round_tf32(p.to(torch.float32).double()) * round_tf32(freqs.double())
    else:
        radians = (p.to(dtype) * freqs).double()
    return radians, torch.cos(radians), torch.sin(radians)


def _fp32(v: torch.Tensor, direction: int = 0) -> torch.Tensor:
    """FP64 values rounded into FP32, as FP64: to nearest (torch's cast), or up (direction 1) or down (-1)."""
    r = v.float()
    if direction:
        off = r.double() < v if direction > 0 else r.double() > v
        r = torch.where(off, torch.nextafter(r, torch.full_like(r, direction * float("inf"))), r)
    return r.double()


def _interval(radians, exact, fp64: bool, amplitude: float, ulps: float, store: str | None) -> Interval:
    """The values a platform gives for an exact cos (or sin) of a label's angle, with its amplitude and store."""
    if fp64:  # one rounding of an FP64 value: its own error, a few 2**-53 of the angle, and cos's
        value = amplitude * exact
        slack = 2.0**-53 * (8 * radians + 4) * amplitude
        interval = Interval(_fp32(value), _fp32(value - slack), _fp32(value + slack))
    else:  # the platform's cos within `ulps` ulp of the exact value (2**-50: FP64 cos's own error)
        reach = torch.where(exact == 0, 0.0, ulps * _fp32_ulp(exact) + 2.0**-50 * exact.abs())
        interval = Interval(_fp32(exact), _fp32(exact - reach, 1), _fp32(exact + reach, -1))
        if amplitude != 1:  # an FP32 product by the FP32 factor (exact in FP64), rounded: monotone in c
            a = float(torch.tensor(amplitude, dtype=torch.float32))
            interval = Interval(*(_fp32(v * a) for v in interval))
    if store == "bf16-cache":  # FP32 values to bf16: torch's cast rounds to nearest even
        interval = Interval(*(v.float().bfloat16().double() for v in interval))
    return interval


def _choices(label: str) -> list:
    return [parts(label).get(axis) for axis in range(len(AXES))]


def emulate(label: str, positions, rotary: int, theta: float, rope_scaling, attention_factor: float = 1.0, ulps=1):
    """(cos, sin) Intervals [*positions.shape, R/2] of a label (EMULATIONS), on the CPU."""
    frequency, angle, amplitude, store = _choices(label)
    radians, *exact = _exact(frequency, angle, positions, rotary, theta, rope_scaling)
    factor = label_amplitude(amplitude, rope_scaling, attention_factor)
    return tuple(_interval(radians, e, angle == "fp64-angles", factor, ulps, store) for e in exact)


def emulated_tables(label: str, positions, rotary: int, theta: float, rope_scaling, attention_factor: float = 1.0):
    """A label's table: FP32 cos, sin [B, S, R] of its correctly rounded entries (entries k and k + R/2 pair
    k's), what a builder of that semantics with correctly rounded cos and sin returns; on positions' device."""
    intervals = emulate(label, positions, rotary, theta, rope_scaling, attention_factor)
    return tuple(torch.cat((t.center, t.center), -1).float().to(positions.device) for t in intervals)


def agreement(got: torch.Tensor, interval: Interval) -> float:
    """The share of the judged entries of `got` (FP32 [..., R/2]) inside the label's interval (NaN never is)."""
    if got.numel() == 0:
        return 1.0
    g = got.detach().to("cpu", torch.float64)
    return float(((g >= interval.lo) & (g <= interval.hi)).double().mean())


def classify(evidence: list[dict], threshold: float = 0.999) -> list[str]:
    """The parts of the labels of best mean agreement over the cases, the simplest of them (fewest choices off
    the contract), named only where each reaches `threshold` on every case (semantics.classify); [] otherwise."""
    if not evidence:
        return []
    mean = {label: sum(case[label] for case in evidence) / len(evidence) for label in evidence[0]}
    best = max(mean.values())
    tied = [label for label in evidence[0] if mean[label] == best]
    fewest = min(len(parts(label)) for label in tied)
    simplest = [label for label in tied if len(parts(label)) == fewest]
    return semantics.classify([{label: case[label] for label in simplest} for case in evidence], threshold)


# --- the judge ----------------------------------------------------------------------------------------------


def unscaled(rope_scaling) -> float:
    """The attention factor of a builder that folds none into its table."""
    return 1.0


@dataclass(frozen=True)
class TableBuilder:
    """A table builder behind the op's signature, `fn(positions, rotary, theta, rope_scaling) -> (cos, sin)`,
    and the attention factor it folds into cos and sin for a rope_scaling (its adapter declares it). A case it
    cannot take raises NotImplementedError naming why. Calling it calls fn: a TableBuilder is an
    implementation of rope_tables that carries its declaration (`--impl module:BUILDER`, assert_conforms)."""

    name: str
    fn: Callable
    attention_factor: Callable = unscaled

    def __call__(self, positions, rotary, theta, rope_scaling):
        return self.fn(positions, rotary, theta, rope_scaling)


def declared_factor(builder, rope_scaling) -> float:
    """The attention factor an implementation declares for a rope_scaling: its `attention_factor(rope_scaling)`
    (a TableBuilder's, or any callable's attribute of that name), 1.0 where it has none."""
    return float(getattr(builder, "attention_factor", unscaled)(rope_scaling))


def kind(case: TableCase) -> str:
    """A case's configuration, the part of its name before the region: v4-main, v4-compress, v3, ramp-clamped."""
    return case.name.split("/")[0]


def emulation_builder(label: str, attention_factor: Callable = unscaled) -> TableBuilder:
    """A TableBuilder returning a label's emulated table, declaring `attention_factor` (default: none), which
    the label folds in where it takes the declared factor."""

    def fn(positions, rotary, theta, rope_scaling):
        return emulated_tables(label, positions, rotary, theta, rope_scaling, attention_factor(rope_scaling))

    return TableBuilder(f"emulation:{label}", fn, attention_factor)


@dataclass
class TableVerdict:
    """One builder on one case: the entries judged (cos and sin, k < R/2), those outside the model, the first
    of them, and the agreement with every label; `refused` holds the builder's reason where it declined."""

    builder: str
    case: TableCase
    attention_factor: float = 1.0
    elements: int = 0
    outside: int = 0
    first_violation: str = ""
    shares: dict = field(default_factory=dict)
    refused: str = ""
    first: tuple = ()  # the first entry outside: (table (0 cos, 1 sin), b, s, k)

    @property
    def conforms(self) -> bool:
        return not self.refused and self.outside == 0


@functools.lru_cache(maxsize=64)
def reference_model(case: TableCase, attention_factor: float, allowances: tuple):
    """The contract's (cos, sin) Models [B, S, R/2] for a case (mpmath: computed once per case and factor)."""
    ulps, pow_ulps = allowances
    return table_model(
        case.position_ids(), case.rotary, case.theta, case.rope_scaling, attention_factor, ulps, pow_ulps
    )


@functools.lru_cache(maxsize=64)
def label_intervals(case: TableCase, attention_factor: float, ulps: float) -> dict:
    """label -> (cos, sin) Intervals of every emulation for a case (each label's angles computed once)."""
    positions, scaling = case.position_ids(), case.rope_scaling
    angles = {}
    out = {}
    for label in EMULATIONS:
        frequency, angle, amplitude, store = _choices(label)
        if (frequency, angle) not in angles:
            angles[frequency, angle] = _exact(frequency, angle, positions, case.rotary, case.theta, scaling)
        radians, *exact = angles[frequency, angle]
        factor = label_amplitude(amplitude, scaling, attention_factor)
        out[label] = tuple(_interval(radians, e, angle == "fp64-angles", factor, ulps, store) for e in exact)
    return out


def malformed(case: TableCase, out) -> str:
    """Why a builder's output is not two FP32 [B, S, R] tensors ("" when it is)."""
    shape = (case.batch, case.seq, case.rotary)
    if not (isinstance(out, tuple | list) and len(out) == 2):
        return f"expected (cos, sin), got {type(out).__name__}"
    for name, t in zip(("cos", "sin"), out, strict=True):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != shape:
            got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            return f"{name}: expected float32 {list(shape)}, got {got}"
    return ""


def judge_pairs(case: TableCase, cos: torch.Tensor, sin: torch.Tensor, factor: float, cuda: bool = False):
    """A builder's pairs' entries (cos and sin [B, S, R/2]: entries k < R/2 of its FP32 tables) on a case judged
    against the contract's model with the declared attention factor, under the CPU's allowances or CUDA's
    (`cuda`: built on a GPU): a TableVerdict (its builder unnamed)."""
    verdict = TableVerdict("", case, factor, 2 * cos.numel())
    allowances = CUDA_ULPS if cuda else CPU_ULPS
    models = reference_model(case, factor, allowances)
    intervals = label_intervals(case, factor, allowances[0])
    positions = case.position_ids()
    got = [t.detach().to("cpu", torch.float64) for t in (cos, sin)]
    for t, (name, model, g) in enumerate(zip(("cos", "sin"), models, got, strict=True)):
        bad = (~inside(g, model.ref, model.lo, model.hi)).nonzero()
        verdict.outside += len(bad)
        if len(bad) and not verdict.first_violation:
            i = tuple(bad[0].tolist())
            where = f" (position {int(positions[i[:2]])}, pair {i[2]})"
            verdict.first_violation = describe_violation(i, g, model.ref, model.lo, model.hi, name) + where
            verdict.first = (t, *i)
    verdict.shares = {label: (agreement(got[0], c) + agreement(got[1], s)) / 2 for label, (c, s) in intervals.items()}
    return verdict


def judge_case(builder: TableBuilder, case: TableCase, device=None) -> TableVerdict:
    positions = case.position_ids(device)
    scaling = case.rope_scaling
    try:
        out = builder.fn(positions, case.rotary, case.theta, scaling)
    except NotImplementedError as e:
        return TableVerdict(builder.name, case, refused=str(e) or type(e).__name__)
    factor = declared_factor(builder, scaling)
    problem = malformed(case, out)
    if problem:
        elements = 2 * case.batch * case.seq * (case.rotary // 2)
        return TableVerdict(builder.name, case, factor, elements, elements, problem)
    half = case.rotary // 2
    verdict = judge_pairs(case, out[0][..., :half], out[1][..., :half], factor, out[0].is_cuda)
    verdict.builder = builder.name
    return verdict


def judge(builder: TableBuilder, cases=CASES, device=None) -> list[TableVerdict]:
    """The builder's verdict on each case (device: where the positions are made; default the CPU)."""
    return [judge_case(builder, case, device) for case in cases]


def labels(verdicts: list[TableVerdict], threshold: float = 0.999) -> list[str]:
    """The semantics the builder's tables carry over the cases it took (classify)."""
    return classify([v.shares for v in verdicts if not v.refused and v.shares], threshold)


def render(results: dict) -> str:
    """Markdown: per builder and case the declared factor, the entries outside the model and the first of them,
    then per builder the total outside and its semantics (results: builder name -> its verdicts)."""
    rows = [
        "| builder | case | attention factor | outside / entries | first outside |",
        "| --- | --- | --- | --- | --- |",
    ]
    summary = ["| builder | outside over the cases | semantics |", "| --- | --- | --- |"]
    for name, verdicts in results.items():
        for v in verdicts:
            if v.refused:
                rows.append(f"| {name} | {v.case.name} | | refused: {v.refused} | |")
            else:
                cells = [name, v.case.name, f"{v.attention_factor:.6g}", f"{v.outside} / {v.elements}"]
                rows.append("| " + " | ".join([*cells, v.first_violation[:160]]) + " |")
        outside = sum(v.outside for v in verdicts)
        summary.append(f"| {name} | {outside} | {', '.join(labels(verdicts)) or '(none)'} |")
    return "\n".join(rows) + "\n\n" + "\n".join(summary)
