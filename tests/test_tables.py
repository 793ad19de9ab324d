"""The rope tables' reference (dsrope_reference.rope_tables) and the tables' semantics and judge
(dsrope_gate.tables), on the CPU, with no third-party builder (tests/test_table_builders.py has those).

- the reference's transcription of upstream's FP32 table lies inside the model on every case, and the model
  holds every table the contract allows: at far positions, for each FP32 frequency in its interval, cos and
  sin of the FP32 angle within one ulp; the extremes over an angle interval are its ends or its critical
  points (against dense sampling);
- the judge rejects a table one step past either bound, NaN, infinity, a nonzero sin at position 0, a table
  without its declared attention factor and the wrong label's emulation where the two differ;
- every label's emulation is classified as itself over the cases (and combined labels as their parts), the
  labels outside the model fail the verdict and those inside it pass;
- the emulations' pieces against independent anchors: upstream's frequencies, dsrope's fp64 ones, TF32
  rounding, the bf16 cast, the published attention factors.
"""

from __future__ import annotations

import functools
import math

import mpmath
import pytest
import torch
from dsrope_reference import rope_tables as ref
from dsrope_reference import rope_utils
from dsrope_reference.floats import round_nearest

from dsrope.rope_utils import precompute_freqs_cis
from dsrope_gate import tables
from dsrope_gate.tables import (
    AMPLITUDES,
    ANGLES,
    CASES,
    CONTRACT,
    FREQUENCIES,
    SLOW_CASES,
    STORES,
    TableBuilder,
    emulation_builder,
    judge,
    labels,
)

SINGLE = (CONTRACT, *FREQUENCIES, *ANGLES, *AMPLITUDES, *STORES)
COMBINED = ("yarn-untruncated+mscale-ratio", "yarn-channel-ramp+bf16-cache", "tf32-angles+mscale-factor-only")
# a rounding that hides another choice: the simpler label is named (bf16 and TF32 round a one-ulp frequency away)
HIDDEN = {"yarn-reciprocal-product+bf16-cache": ["bf16-cache"], "fp64-frequencies+tf32-angles": ["tf32-angles"]}
INSIDE = (CONTRACT, "fp64-frequencies", "yarn-reciprocal-product", "fp64-angles")  # other bits, inside the model
CASE = {case.name: case for case in CASES}
FAR = [name for name in CASE if name.endswith("/far")]
ATLAS_FACTOR = 0.1 * math.log(16) + 1  # 1.2772588722239782, atlas PR 342's number for DeepSeek-V4's compress layers


def upstream_tables(positions, rotary, theta, rope_scaling):
    """The reference's transcription of upstream's FP32 table (DeepSeek's op sequence, torch.polar)."""
    freqs = rope_utils.upstream_frequencies(rotary, ref.yarn_length(rope_scaling), theta, rope_scaling)
    table = rope_utils.upstream_table(positions, freqs)
    return tuple(torch.cat((t, t), -1) for t in (table.real, table.imag))


UPSTREAM = TableBuilder("upstream", upstream_tables)


def fixed(cos, sin, name="fixed"):
    """A builder returning the given tables."""
    return TableBuilder(name, lambda positions, rotary, theta, rope_scaling: (cos, sin))


@functools.cache
def label_verdicts(label: str):
    return judge(emulation_builder(label))


def model_tables(case, which: str = "ref"):
    """The model's ref, lo or hi as FP32 [B, S, R] tables (the second halves NaN: never judged)."""
    models = tables.reference_model(case, 1.0, ref.CPU_ULPS)
    out = []
    for model in models:
        half = getattr(model, which).float()
        out.append(torch.cat((half, torch.full_like(half, float("nan"))), -1))
    return out


# --- the reference ------------------------------------------------------------------------------------------


def test_upstream_table_is_inside_the_model_and_is_the_contract():
    """DeepSeek's FP32 op sequence (the reference's transcription) conforms on every case, positions 0 to
    2**20, and its semantics is the contract's."""
    verdicts = judge(UPSTREAM)
    assert all(v.conforms for v in verdicts), [(v.case.name, v.first_violation) for v in verdicts if not v.conforms]
    assert labels(verdicts) == [CONTRACT]


@pytest.mark.parametrize("name", FAR)
def test_model_holds_every_table_the_contract_allows(name):
    """Soundness at the widest intervals: for pairs 0, 1, 13, 22 and 31 at the far case's positions, every FP32
    frequency f' in the model's interval, the FP32 angle fl32(P f') and cos and sin of it within one ulp lie in
    the model's [lo, hi]. At 2**20 pair 0's angle interval spans 0.3125 rad (five FP32 angles 2**-4 apart)."""
    case = CASE[name]
    positions = case.position_ids()
    freqs = ref.frequency_model(case.rotary, case.theta, case.rope_scaling)
    cos_model, sin_model = tables.reference_model(case, 1.0, ref.CPU_ULPS)
    checked = 0
    with mpmath.workprec(ref.PREC):
        for k in (0, 1, 13, 22, 31):
            f, candidates = freqs.lo[k].float(), []
            while f <= freqs.hi[k]:
                candidates.append(f.item())
                f = torch.nextafter(f, torch.tensor(float("inf")))
            assert 2 <= len(candidates) <= 40, candidates
            for b, s in ((0, 0), (-1, -1), (0, case.seq // 2)):
                p = float(positions[b, s])
                for f in candidates:
                    angle = round_nearest(torch.tensor(p * f, dtype=torch.float64), torch.float32).item()
                    for model, exact in zip((cos_model, sin_model), mpmath.cos_sin(mpmath.mpf(angle)), strict=True):
                        low, high = ref.evaluated(exact, exact, 1)
                        assert model.lo[b, s, k] <= low and high <= model.hi[b, s, k], (name, p, k, f, angle)
                        checked += 1
    assert checked >= 100
    width = ref.angle_model(torch.tensor([1 << 20]), freqs)
    assert float(width.hi[0, 0] - width.lo[0, 0]) == 0.3125


INTERVALS = [
    # (lo, hi): which critical points it holds
    (0.1, 0.2),  # none: both extremes at the ends
    (1.5, 1.6),  # pi/2: sin reaches 1
    (3.0, 3.2),  # pi: cos reaches -1
    (4.6, 4.8),  # 3 pi/2: sin reaches -1
    (6.2, 6.3),  # 2 pi: cos reaches 1
    (1.6, 6.2),  # pi and 3 pi/2
    (1.5, 6.3),  # four consecutive quarters: every extreme
    (1048575.8125, 1048576.125),  # a far angle interval (position 2**20, pair 0)
    (10.0, 17.0),  # more than a turn
]


@pytest.mark.parametrize("lo,hi", INTERVALS)
def test_extremes_are_the_ends_or_the_critical_points(lo, hi):
    """extremes() against 200001 mpmath samples of the interval: every sample inside, and each extreme within
    the samples' reach of the sampled one (cos and sin move at most (hi - lo) / 200000 between samples)."""
    (cmin, cmax), (smin, smax) = ref.extremes(mpmath.mpf(lo), mpmath.mpf(hi))
    xs = torch.linspace(lo, hi, 200001, dtype=torch.float64)
    c, s = torch.cos(xs), torch.sin(xs)
    reach = (hi - lo) / 200000 + 1e-12
    for (m, M), v in (((cmin, cmax), c), ((smin, smax), s)):
        assert float(m) <= v.min().item() + 1e-15 and v.max().item() - 1e-15 <= float(M)
        assert float(M) - v.max().item() <= reach and v.min().item() - float(m) <= reach


def test_extremes_reach_one_exactly_at_critical_points():
    (cmin, cmax), (smin, smax) = ref.extremes(mpmath.mpf(1.5), mpmath.mpf(6.3))
    assert (cmin, cmax, smin, smax) == (-1, 1, -1, 1)
    (cmin, cmax), (smin, smax) = ref.extremes(mpmath.mpf(0.1), mpmath.mpf(0.2))
    with mpmath.workprec(ref.PREC):
        ends = mpmath.cos(mpmath.mpf(0.2)), mpmath.cos(mpmath.mpf(0.1)), mpmath.sin(mpmath.mpf(0.1)), mpmath.sin(0.2)
    assert (cmin, cmax, smin, smax) == ends


def test_position_zero_is_exact():
    """Angle 0: sin must be 0 exactly (an exact zero allows only zero), cos within one ulp of 1."""
    case = CASE["v4-main/start"]
    assert int(case.position_ids()[0, 0]) == 0
    cos_model, sin_model = tables.reference_model(case, 1.0, ref.CPU_ULPS)
    assert (sin_model.lo[0, 0] == 0).all() and (sin_model.hi[0, 0] == 0).all()
    assert (cos_model.lo[0, 0] == 1 - 2.0**-23).all() and (cos_model.hi[0, 0] == 1 + 2.0**-23).all()


@pytest.mark.parametrize("name", ["v4-compress/far", "v3/original"])
def test_judge_rejects_one_step_past_each_bound_nan_and_infinity(name):
    """The model's own bounds conform; one element one FP32 step past hi or below lo, NaN or inf does not, and
    the verdict names that element and its position."""
    case = CASE[name]
    bounds = {which: model_tables(case, which) for which in ("lo", "hi", "ref")}
    assert judge(fixed(bounds["lo"][0], bounds["hi"][1]), [case])[0].conforms
    assert judge(fixed(bounds["hi"][0], bounds["lo"][1]), [case])[0].conforms
    inf = torch.tensor(float("inf"))
    wrongs = (
        ("hi", lambda c: torch.nextafter(c, inf)),
        ("lo", lambda c: torch.nextafter(c, -inf)),
        ("ref", lambda c: torch.tensor(float("nan"))),
        ("ref", lambda c: inf),
    )
    p = int(case.position_ids()[0, 1])
    for base, wrong in wrongs:
        for which in (0, 1):
            out = [t.clone() for t in bounds[base]]
            out[which][0, 1, 3] = wrong(out[which][0, 1, 3])
            verdict = judge(fixed(*out), [case])[0]
            assert verdict.outside == 1, (base, which, verdict.first_violation)
            name_ = ("cos", "sin")[which]
            assert verdict.first_violation.startswith(f"first at index [0, 1, 3]: {name_} "), verdict.first_violation
            assert verdict.first_violation.endswith(f"(position {p}, pair 3)")


def test_judge_rejects_a_nonzero_sin_at_position_zero():
    case = CASE["v3/start"]
    cos, sin = model_tables(case)
    assert judge(fixed(cos, sin), [case])[0].conforms
    sin[0, 0, 5] = 2.0**-149
    assert judge(fixed(cos, sin), [case])[0].outside == 1


def test_attention_factor_scales_the_model():
    """A table with the factor folded in conforms where the builder declares it, and not where it does not;
    the unscaled table fails against the declared factor. The model's reference is A * cos rounded once."""
    declared = lambda rope_scaling: ATLAS_FACTOR  # noqa: E731
    cases = [CASE["v4-compress/start"], CASE["v4-compress/far"]]
    scaled = emulation_builder(CONTRACT, declared)
    assert all(v.conforms and v.attention_factor == ATLAS_FACTOR for v in judge(scaled, cases))
    undeclared = TableBuilder("undeclared", scaled.fn)
    unscaled = TableBuilder("unscaled", emulation_builder(CONTRACT).fn, declared)
    for builder in (undeclared, unscaled):
        for v in judge(builder, cases):
            assert v.outside > 0.9 * v.elements, (builder.name, v.case.name, v.outside)
    one = tables.reference_model(cases[0], 1.0, ref.CPU_ULPS)
    factor = tables.reference_model(cases[0], ATLAS_FACTOR, ref.CPU_ULPS)
    for a, b in zip(one, factor, strict=True):
        assert ((b.ref - ATLAS_FACTOR * a.ref).abs() <= 2.0**-22).all()


def test_scaled_holds_the_fp32_product_by_the_fp32_factor():
    """fl32(c * fl32(A)) lies in scaled(c, c, A) for 2000 FP32 values c in [-1, 1] and three factors whose FP32
    value differs from them."""
    c = torch.rand(2000, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 2 - 1
    c = round_nearest(c, torch.float32)
    for factor in (ATLAS_FACTOR, 0.1 * math.log(40) + 1, 0.92):
        a = float(torch.tensor(factor, dtype=torch.float32))
        assert a != factor
        products = round_nearest(c * a, torch.float32)
        for v, t in zip(c.tolist(), products.tolist(), strict=True):
            lo, hi = ref.scaled(v, v, factor)
            assert lo <= t <= hi, (v, factor, t, lo, hi)


def test_cuda_allowances_widen_the_model():
    """CUDA's powf (4 ulp) widens every frequency interval of the CPU's (1 ulp), and its cosf (2 ulp) every
    evaluated value's: the judge takes the allowances of the device the table comes from."""
    v3 = CASE["v3/far"]
    cpu, cuda = (ref.frequency_model(64, 10000.0, v3.rope_scaling, pow_ulps) for pow_ulps in (1, 4))
    assert (cuda.lo <= cpu.lo).all() and (cuda.hi >= cpu.hi).all() and (cuda.hi - cuda.lo > cpu.hi - cpu.lo).all()
    value = mpmath.mpf(0.3)
    one, two = ref.evaluated(value, value, 1), ref.evaluated(value, value, 2)
    assert two[0] < one[0] < 0.3 < one[1] < two[1]
    assert ref.CPU_ULPS == (1, 1) and ref.CUDA_ULPS == (2, 4)


def test_bad_arguments_are_refused():
    positions = torch.tensor([[0, 5]])
    with pytest.raises(ValueError, match="positions"):
        ref.table_model(torch.tensor([[-1, 5]]), 8, 10000.0)
    with pytest.raises(ValueError, match="rope_scaling"):
        ref.table_model(positions, 8, 10000.0, {"factor": 4})
    for factor in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="attention_factor"):
            ref.table_model(positions, 8, 10000.0, None, factor)


# --- the semantics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", SINGLE + COMBINED)
def test_each_emulation_is_classified_as_itself(label):
    """Over the cases each label's emulated table gets exactly its own label (a combined one: its parts), and
    conforms exactly where the label is inside the model."""
    verdicts = label_verdicts(label)
    expected = [CONTRACT] if label == CONTRACT else label.split("+")
    assert labels(verdicts) == expected
    if label in INSIDE:
        assert all(v.conforms for v in verdicts), [(v.case.name, v.first_violation) for v in verdicts]
    else:
        assert any(not v.conforms for v in verdicts)


@pytest.mark.parametrize("label", list(HIDDEN))
def test_a_rounding_that_hides_a_choice_names_the_simpler_label(label):
    """bf16 (8 bits) and TF32 (11 bits) round away the one-ulp frequency differences of yarn-reciprocal-product
    and fp64-frequencies: the combined table matches the rounding's label alone on every case."""
    verdicts = label_verdicts(label)
    assert all(v.shares[label] == 1.0 and v.shares[HIDDEN[label][0]] == 1.0 for v in verdicts)
    assert labels(verdicts) == HIDDEN[label]


@pytest.mark.parametrize("label", SINGLE[1:])
def test_every_label_differs_from_the_contract_somewhere(label):
    """Each label's table leaves the contract's interval on some case, and the contract's table leaves its."""
    assert min(v.shares[CONTRACT] for v in label_verdicts(label)) < 0.999
    assert min(v.shares[label] for v in label_verdicts(CONTRACT)) < 0.999


def test_plain_tables_name_the_contract_not_the_tied_variants():
    """On plain tables every YaRN and mscale variant gives the contract's bits: the classifier names the
    simplest of the tied labels, the contract; a table that misses the threshold on one case gets none."""
    plain = [case for case in CASES if case.scaling is None]
    verdicts = judge(emulation_builder(CONTRACT), plain)
    assert {label for v in verdicts for label, share in v.shares.items() if share == 1.0} >= {
        CONTRACT,
        "yarn-untruncated",
        "mscale-ratio",
    }
    assert labels(verdicts) == [CONTRACT]
    verdicts[1].shares = {label: min(share, 0.99) for label, share in verdicts[1].shares.items()}
    assert labels(verdicts) == []


def test_agreement_counts_entries_inside_the_interval():
    case = CASE["v3/far"]
    cos, _ = tables.emulate(CONTRACT, case.position_ids(), case.rotary, case.theta, case.rope_scaling)
    got = cos.center.float()
    assert tables.agreement(got, cos) == 1.0
    n = got.numel()
    past = got.clone()
    past[0, 0, 0] = torch.nextafter(cos.hi[0, 0, 0].float(), torch.tensor(2.0))
    assert tables.agreement(past, cos) == 1 - 1 / n
    past[1, 2, 3] = float("nan")
    assert tables.agreement(past, cos) == 1 - 2 / n


def test_contract_frequencies_are_upstream_and_fp64_ones_dsrope():
    """The contract's frequencies are the reference's transcription of upstream's op sequence bit for bit; the
    fp64-frequencies choice is dsrope's precompute_freqs_cis(fp64=True)."""
    for case in (CASE["v4-main/far"], CASE["v4-compress/far"], CASE["v3/far"], CASE["ramp-clamped/far"]):
        args = (case.rotary, case.theta, case.rope_scaling)
        upstream = rope_utils.upstream_frequencies(case.rotary, ref.yarn_length(case.rope_scaling), *args[1:])
        assert torch.equal(tables.label_frequencies(None, *args), upstream), case.name
        dsrope64 = precompute_freqs_cis(case.rotary, ref.yarn_length(case.rope_scaling), *args[1:], fp64=True)
        assert torch.equal(tables.label_frequencies("fp64-frequencies", *args), dsrope64), case.name


def test_ramp_variants_take_their_published_bounds():
    """DeepSeek-V3: ramp from pair 10 to 23 (floor and ceil); untruncated from 10.47 to 22.5; the channel ramp
    reaches 1 at pair 12 (channel 24); on the clamped configuration the half clamp ends at 31, not 33."""
    v3 = CASE["v3/far"].rope_scaling
    plain = tables.label_frequencies(None, 64, 10000.0, None)
    for choice, first_scaled, last_kept in (
        (None, 23, 10),
        ("yarn-untruncated", 23, 10),
        ("yarn-channel-ramp", 12, 5),
    ):
        freqs = tables.label_frequencies(choice, 64, 10000.0, v3)
        ratio = freqs / plain
        assert torch.equal(freqs[: last_kept + 1], plain[: last_kept + 1]), choice
        assert ((ratio[first_scaled:] - 1 / 40).abs() <= 2**-21).all() and ratio[first_scaled - 1] > 1 / 39, choice
    clamped = CASE["ramp-clamped/far"].rope_scaling
    full, half = (tables.label_frequencies(c, 64, 10000.0, clamped) for c in (None, "yarn-half-clamp"))
    plain_clamped = tables.label_frequencies(None, 64, 10000.0, None)
    assert ((half[31] / plain_clamped[31]) - 1 / 16).abs() <= 2**-21 and (full[31] / plain_clamped[31]) > 1 / 15


def test_tf32_rounding_keeps_eleven_bits_to_nearest_even():
    v = torch.tensor([2.0**20 - 1, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 1 + 2.0**-10, 2.0**20 - 3 * 2.0**8, 0.0, -3.0])
    expected = torch.tensor([2.0**20, 1.0, 1 + 2.0**-9, 1 + 2.0**-10, 2.0**20 - 2.0**10, 0.0, -3.0])
    assert torch.equal(tables.round_tf32(v.double()), expected.double())


def test_tf32_angles_round_the_position_too():
    """2**20 - 1 and 2**20 are one TF32 number: their tf32-angles tables are equal, the contract's are not."""
    for label, same in (("tf32-angles", True), (CONTRACT, False)):
        a, b = (tables.emulated_tables(label, torch.tensor([[p]]), 64, 10000.0, None) for p in (2**20 - 1, 2**20))
        assert torch.equal(a[0], b[0]) == same, label


def test_bf16_cache_is_the_fp32_table_cast_to_bf16():
    for case in (CASE["v4-compress/far"], CASE["v3/start"]):
        args = (case.position_ids(), case.rotary, case.theta, case.rope_scaling)
        fp32 = tables.emulated_tables(CONTRACT, *args)
        bf16 = tables.emulated_tables("bf16-cache", *args)
        for a, b in zip(fp32, bf16, strict=True):
            assert torch.equal(a.bfloat16().float(), b)


def test_attention_factors_of_the_mscale_labels():
    """DeepSeek-V4's compress layers (no mscale keys): both labels give 0.1 ln 16 + 1 = 1.2772588722239782
    (atlas PR 342, vLLM issue 48621); DeepSeek-V3 (mscale = mscale_all_dim = 1): the ratio is 1, the factor alone
    0.1 ln 40 + 1; plain tables: 1; the contract takes the declared factor."""
    v4, v3 = CASE["v4-compress/far"].rope_scaling, CASE["v3/far"].rope_scaling
    assert tables.label_amplitude("mscale-ratio", v4, 1.0) == ATLAS_FACTOR == 1.2772588722239782
    assert tables.label_amplitude("mscale-factor-only", v4, 1.0) == ATLAS_FACTOR
    assert tables.label_amplitude("mscale-ratio", v3, 1.0) == 1.0
    assert tables.label_amplitude("mscale-factor-only", v3, 1.0) == 0.1 * math.log(40) + 1 == 1.3688879454113936
    assert tables.label_amplitude("mscale-factor-only", None, 1.0) == 1.0
    assert tables.label_amplitude(None, v3, 0.75) == 0.75


# --- the judge -------------------------------------------------------------------------------------------------


def test_judge_refusals_and_malformed_outputs():
    """A NotImplementedError is a refusal with its reason (not a conforming verdict, left out of the labels);
    bf16 tables, a wrong shape or one table are malformed: every entry outside."""

    def plain_only(positions, rotary, theta, rope_scaling):
        if rope_scaling is not None:
            raise NotImplementedError("no YaRN here")
        return upstream_tables(positions, rotary, theta, rope_scaling)

    verdicts = judge(TableBuilder("plain-only", plain_only))
    refused = [v for v in verdicts if v.refused]
    assert {v.case.name for v in refused} == {c.name for c in CASES if c.scaling is not None}
    assert all(v.refused == "no YaRN here" and not v.conforms for v in refused)
    assert labels(verdicts) == [CONTRACT]
    case = CASE["v4-main/original"]
    cos, sin = upstream_tables(case.position_ids(), case.rotary, case.theta, None)
    for out, problem in (
        ((cos.bfloat16(), sin.bfloat16()), "cos: expected float32 [2, 8, 64], got torch.bfloat16 [2, 8, 64]"),
        ((cos, sin[..., :32]), "sin: expected float32 [2, 8, 64], got torch.float32 [2, 8, 32]"),
        ((cos,), "expected (cos, sin), got tuple"),
    ):
        verdict = judge(TableBuilder("bad", lambda *args, out=out: out), [case])[0]
        assert (verdict.outside, verdict.first_violation) == (verdict.elements, problem)


def test_judge_reads_the_first_half_of_both_tables():
    """Entries k >= R/2 are never judged (NaN there conforms); a wrong first half, of sin alone, does not."""
    case = CASE["v3/original"]
    cos, sin = upstream_tables(case.position_ids(), case.rotary, case.theta, case.rope_scaling)
    half = case.rotary // 2
    nan_tail = [t.clone() for t in (cos, sin)]
    for t in nan_tail:
        t[..., half:] = float("nan")
    assert judge(fixed(*nan_tail), [case])[0].conforms
    swapped = [torch.cat((t[..., half:].flip(-1), t[..., half:]), -1) for t in (cos, sin)]
    assert judge(fixed(cos, swapped[1]), [case])[0].outside > 0
    assert judge(fixed(cos, -sin), [case])[0].outside > 0


@pytest.mark.slow
def test_upstream_table_conforms_on_the_slow_sweep():
    """8 times as many positions, far ones from 2**19 up: the reference's transcription of upstream conforms."""
    verdicts = judge(UPSTREAM, SLOW_CASES)
    assert all(v.conforms for v in verdicts), [(v.case.name, v.first_violation) for v in verdicts if not v.conforms]
    assert labels(verdicts) == [CONTRACT]


def test_render_lists_every_case_refusals_and_the_semantics():
    plain = [case for case in CASES if case.scaling is None]
    bf16 = label_verdicts("bf16-cache")[:2]
    out = tables.render({"emulation": bf16, "upstream": judge(UPSTREAM, plain)})
    assert out.count("| emulation | ") == 3 and out.count("| upstream | ") == 4
    assert f"| emulation | {sum(v.outside for v in bf16)} | bf16-cache |" in out
    assert f"| upstream | 0 | {CONTRACT} |" in out
    refused = judge(TableBuilder("none", lambda *args: (_ for _ in ()).throw(NotImplementedError("why"))), plain[:1])
    assert "| none | v4-main/start | | refused: why | |" in tables.render({"none": refused})
