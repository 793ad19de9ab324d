"""Mutants of the reference (reference/dsrope_reference): the rounding helpers, the interval check, the
NaN/inf/signed-zero rules, the ulp distance, each error bound and slack, the exact-operand exemption, the
two rounding boundaries in the models and the table transcriptions. A lenient judge is the worst fault the
project can ship: each of these is a realistic slip the suite must catch."""

from __future__ import annotations

from dsrope_dev.mutation import (
    REF_CONTRACTS,
    REF_EVERY_OP,
    REF_FLOATS,
    REF_QNORM,
    REF_ROPE,
    REF_TABLES,
    REF_UTILS,
    mutant,
)

FLOATS = [
    mutant(
        "floats.nan_output_accepted_anywhere",
        REF_FLOATS,
        "inside",
        "a NaN output is accepted wherever it appears, not only where the reference is NaN",
        ("        torch.isnan(ref),\n", "        torch.isnan(ref) | torch.isnan(out64),\n"),
    ),
    mutant(
        "floats.anything_accepted_where_nan",
        REF_FLOATS,
        "inside",
        "where the reference is NaN any output is accepted",
        ("        torch.isnan(out64),\n", "        torch.ones_like(out64, dtype=torch.bool),\n"),
    ),
    mutant(
        "floats.infinity_of_either_sign",
        REF_FLOATS,
        "inside",
        "an infinite reference accepts the infinity of either sign",
        ("out64 == ref)", "out64.abs() == ref.abs())"),
    ),
    mutant(
        "floats.lower_bound_ignored",
        REF_FLOATS,
        "inside",
        "the interval check ignores the lower bound",
        ("(out64 >= lo) & (out64 <= hi)", "(out64 <= hi)"),
    ),
    mutant(
        "floats.upper_bound_ignored",
        REF_FLOATS,
        "inside",
        "the interval check ignores the upper bound",
        ("(out64 >= lo) & (out64 <= hi)", "(out64 >= lo)"),
    ),
    mutant(
        "floats.ties_away_from_zero",
        REF_FLOATS,
        "round_nearest",
        "round to nearest with ties away from zero instead of to even",
        ("return _round(v, dtype, torch.round)", "return _round(v, dtype, lambda t: torch.trunc(t + 0.5 * t.sign()))"),
    ),
    mutant(
        "floats.one_bit_too_many",
        REF_FLOATS,
        "_spacing",
        "the spacing of the format off by one bit (a significand one bit too long)",
        ("e - (f.precision - 1)", "e - f.precision"),
    ),
    mutant(
        "floats.no_subnormal_range",
        REF_FLOATS,
        "_spacing",
        "no subnormal range: values below the smallest normal keep the full precision",
        ("min=f.emin)", "min=f.emin - 40)"),
    ),
    mutant(
        "floats.no_overflow_to_inf",
        REF_FLOATS,
        "_round",
        "rounding past the largest finite value stays finite instead of giving inf",
        ("over = finite & (r.abs() > f.max)", "over = finite & (r.abs() > 2 * f.max)"),
    ),
    mutant(
        "floats.round_down_overflows",
        REF_FLOATS,
        "round_down",
        "round_down of a value past the largest finite gives inf",
        ('return torch.where(r == float("inf"), torch.full_like(r, f.max), r)', "return r"),
    ),
    mutant(
        "floats.signed_zeros_apart",
        REF_FLOATS,
        "ulp_distance",
        "the ulp distance counts -0 and +0 as two values",
        ("oa, ob = torch.where(oa < 0, oa + 1, oa), torch.where(ob < 0, ob + 1, ob)", "oa, ob = oa, ob"),
    ),
    mutant(
        "floats.nan_as_near_as_a_number",
        REF_FLOATS,
        "ulp_distance",
        "a NaN against a number is as far as their bit patterns (no NaN rule)",
        ("return torch.where(one_nan, torch.full_like(d, NAN_VS_NUMBER), d)", "return d"),
    ),
    mutant(
        "floats.same_values_ignores_sign",
        REF_FLOATS,
        "same_values",
        "same_values lets -0 equal +0",
        ("(a == b) & (a.signbit() == b.signbit())", "(a == b)"),
    ),
    mutant(
        "floats.budget_on_the_wrong_side",
        REF_FLOATS,
        "budget_used",
        "the budget divides an error by the room on the other side of the reference",
        ("room = torch.where(err > 0, hi - ref, ref - lo)", "room = torch.where(err > 0, ref - lo, hi - ref)"),
    ),
    mutant(
        "floats.plain_sum",
        REF_FLOATS,
        "exact_sum.one",
        "the reference's row sums are plain FP64 sums, not correctly rounded (order-dependent bits)",
        ("return math.fsum(row)", "return sum(row)"),
    ),
]

ROPE = [
    mutant(
        "reference.rope.one_rounding_in_the_bound",
        REF_ROPE,
        "rotation_interval.interval",
        "the rotation's FP32 error bound allows one rounding (u), not two (gamma_2): an FMA kernel falls out",
        ("err = GAMMA_2 * magnitude", "err = U32 * magnitude"),
    ),
    mutant(
        "reference.rope.four_roundings_in_the_bound",
        REF_ROPE,
        "rotation_interval.interval",
        "the rotation's FP32 error bound doubled (lenient)",
        ("err = GAMMA_2 * magnitude", "err = 2 * GAMMA_2 * magnitude"),
    ),
    mutant(
        "reference.rope.no_flush_slack",
        REF_ROPE,
        "rotation_interval.interval",
        "no slack for FP32 subnormals flushed to zero",
        ("+ flush_slack(*terms, lo, hi)", ""),
    ),
    mutant(
        "reference.rope.no_exact_exemption",
        REF_ROPE,
        "rotation_interval.interval",
        "exact FP32 operands get the error bound too: ties are no longer pinned to the even value",
        ("err = torch.where(exact, torch.zeros_like(err), err)", "err = err"),
    ),
    mutant(
        "reference.rope.exemption_without_result_check",
        REF_ROPE,
        "rotation_interval.interval",
        "operands exact in FP32 exempt the rotation even when its result is not an FP32 number",
        ("& fp32_exact(q_lo) & fp32_exact(lo)", "& fp32_exact(q_lo)"),
    ),
    mutant(
        "reference.rope.midpoint_nudged_the_wrong_way",
        REF_ROPE,
        "round_nearest_exact",
        "a value on a rounding midpoint is nudged against the sign of its error term",
        ("nudged = torch.where(lo > 0, up, down)", "nudged = torch.where(lo > 0, down, up)"),
    ),
    mutant(
        "reference.rope.inverse_not_conjugate",
        REF_ROPE,
        "partial_rope",
        "the inverse rotation (the backward's model) keeps the sine's sign",
        ("    if inverse:\n        s = -s\n", ""),
    ),
    mutant(
        "reference.rope.non_finite_rounded",
        REF_ROPE,
        "exact_or_ieee",
        "inf and NaN inputs give the rounded TwoSum value instead of their IEEE result",
        ("return torch.where(torch.isfinite(value), rounded, value)", "return rounded"),
    ),
    mutant(
        "reference.rope.second_output_sign",
        REF_ROPE,
        "rotation_interval",
        "the interval of a pair's second output is that of a*s - b*c",
        (
            "second = interval(a_lo * s, a_hi * s, b_lo * c, b_hi * c, +1)",
            "second = interval(a_lo * s, a_hi * s, b_lo * c, b_hi * c, -1)",
        ),
    ),
]

QNORM = [
    mutant(
        "reference.qnorm.no_boundary_1",
        REF_QNORM,
        "forward",
        "the model rotates the unrounded normalized row (boundary 1 dropped from the contract)",
        ("    y_ref = round_nearest(xr, dtype)\n", "    y_ref = xr\n"),
    ),
    mutant(
        "reference.qnorm.no_boundary_2",
        REF_QNORM,
        "backward",
        "the backward model takes the de-rotated gradient unrounded (boundary 2 dropped)",
        ("    g = derotated.ref\n", "    g = derotated.ref + (derotated.hi - derotated.lo) / 4\n"),
    ),
    mutant(
        "reference.qnorm.exact_rsqrt",
        REF_QNORM,
        "exact_rstd",
        "no allowance for an approximate rsqrt (a GPU's rsqrt.approx falls outside)",
        ("delta = (1 - theta) ** -0.5 * (1 + RSQRT_REL) - 1", "delta = (1 - theta) ** -0.5 - 1"),
    ),
    mutant(
        "reference.qnorm.loose_rsqrt",
        REF_QNORM,
        "exact_rstd",
        "an rsqrt error allowance a thousand times too wide (lenient)",
        (
            "delta = (1 - theta) ** -0.5 * (1 + RSQRT_REL) - 1",
            "delta = (1 - theta) ** -0.5 * (1 + 1024 * RSQRT_REL) - 1",
        ),
    ),
    mutant(
        "reference.qnorm.sum_bound_without_division",
        REF_QNORM,
        "exact_rstd",
        "the sum-of-squares bound forgets the division and the +eps roundings (gamma(D) for gamma(D + 4))",
        ("theta = gamma(d + 4) + 2.0**-125 / z", "theta = gamma(d) + 2.0**-125 / z"),
    ),
    mutant(
        "reference.qnorm.eps_inside_the_mean",
        REF_QNORM,
        "exact_rstd",
        "eps added before the division by D",
        ("[s / d + eps for s in", "[(s + eps) / d for s in"),
    ),
    mutant(
        "reference.qnorm.never_overflows",
        REF_QNORM,
        "exact_rstd",
        "the FP32 sum of squares is never taken to overflow (r = 0 rows get a finite r)",
        ("overflow = squares * (1 - gamma(d)) > FLT_MAX", "overflow = squares < 0"),
    ),
    mutant(
        "reference.qnorm.no_overflow_band",
        REF_QNORM,
        "or_zero",
        "in the band where the FP32 sum may or may not overflow, y = 0 is not allowed",
        ("    lo = torch.where(maybe_overflow[..., None], torch.minimum(lo, zero), lo)\n", ""),
    ),
    mutant(
        "reference.qnorm.no_subnormal_slack",
        REF_QNORM,
        "normalized_interval",
        "no slack where x * r falls in FP32's subnormal range",
        ("    rad = rad + torch.where((xr != 0) & (xr.abs() < TINY), TINY, 0.0)\n", ""),
    ),
    mutant(
        "reference.qnorm.backward_bound_halved",
        REF_QNORM,
        "rmsnorm_backward",
        "the backward's error bound B halved",
        ("bound = r * (delta * big_d + dd * (1 + delta))", "bound = 0.5 * r * (delta * big_d + dd * (1 + delta))"),
    ),
    mutant(
        "reference.qnorm.backward_mean_over_d_minus_1",
        REF_QNORM,
        "rmsnorm_backward",
        "the RMSNorm backward's mean divides by D - 1 (the unbiased variance's count), not D",
        ("m = exact_sum(g * xhat, keepdim=True) / d", "m = exact_sum(g * xhat, keepdim=True) / (d - 1)"),
    ),
    mutant(
        "reference.qnorm.rstd_interval_not_fp32",
        REF_QNORM,
        "rstd_model",
        "the saved rstd's interval is not rounded out to FP32 values",
        ("round_nearest(r_rows - rad_r, torch.float32)", "r_rows - rad_r"),
    ),
]

UTILS = [
    mutant(
        "reference.utils.ramp_not_clamped",
        REF_UTILS,
        "upstream_frequencies",
        "the transcription of upstream's YaRN ramp is not clamped to [0, 1]",
        (
            "ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)",
            "ramp = (torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)",
        ),
    ),
    mutant(
        "reference.utils.mscale_natural_log_base_10",
        REF_UTILS,
        "upstream_mscale",
        "the transcription of yarn_get_mscale takes log10 instead of ln",
        ("return 0.1 * mscale * math.log(scale) + 1.0", "return 0.1 * mscale * math.log10(scale) + 1.0"),
    ),
    mutant(
        "reference.utils.mpmath_ramp_reversed",
        REF_UTILS,
        "inverse_frequencies",
        "the exact YaRN frequencies interpolate the wrong way (ramp 0 scaled, ramp 1 kept)",
        ("out.append(f / factor * ramp + f * (1 - ramp))", "out.append(f * ramp + f / factor * (1 - ramp))"),
    ),
    mutant(
        "reference.utils.half_split_pairs_interleaved",
        REF_UTILS,
        "split_pairs",
        "the reference's half-split pairing takes interleaved pairs",
        (
            "    half = v.shape[-1] // 2\n    return v[..., :half], v[..., half:]",
            "    return v[..., 0::2], v[..., 1::2]",
        ),
    ),
]

TABLES = [
    mutant(
        "reference.tables.extremes_at_the_ends_only",
        REF_TABLES,
        "extremes",
        "the extremes of cos and sin over an angle interval are taken at its ends only, not at pi/2 multiples",
        ("for k in range(first, min(last, first + 3) + 1):", "for k in range(first, first):"),
    ),
    mutant(
        "reference.tables.critical_points_every_pi",
        REF_TABLES,
        "extremes",
        "the critical points are sought at multiples of pi instead of pi/2",
        ("quarter = mpmath.pi / 2", "quarter = mpmath.pi"),
    ),
    mutant(
        "reference.tables.three_quarters_looked_at",
        REF_TABLES,
        "extremes",
        "only three consecutive quarter points are looked at: an interval holding four misses an extreme",
        ("min(last, first + 3)", "min(last, first + 2)"),
    ),
    mutant(
        "reference.tables.sin_extremes_swapped",
        REF_TABLES,
        "extremes",
        "sin reaches -1 at pi/2 and +1 at 3 pi/2",
        ("elif k % 4 == 1:", "elif k % 4 == 3:"),
    ),
    mutant(
        "reference.tables.no_ulp_allowance",
        REF_TABLES,
        "evaluated",
        "cos and sin are allowed no error beyond the angle interval: the platform's ulps dropped",
        ("w = ulps * ulp(max(abs(low), abs(high)))", "w = 0 * ulp(max(abs(low), abs(high)))"),
    ),
    mutant(
        "reference.tables.half_ulp_allowance",
        REF_TABLES,
        "ulp",
        "the FP32 ulp taken one bit too fine (half the allowance)",
        ("mpmath.frexp(v)[1] - 24", "mpmath.frexp(v)[1] - 25"),
    ),
    mutant(
        "reference.tables.zero_widened",
        REF_TABLES,
        "evaluated",
        "an exact zero (sin at angle 0) is widened like any other value",
        ("if low == high == 0:", "if False:"),
    ),
    mutant(
        "reference.tables.angles_at_the_reference_frequency",
        REF_TABLES,
        "angle_model",
        "the angle interval ignores the FP32 frequency's error: every bound from the correctly rounded frequency",
        ("for f in (freqs.ref, freqs.lo, freqs.hi)", "for f in (freqs.ref, freqs.ref, freqs.ref)"),
    ),
    mutant(
        "reference.tables.attention_factor_not_applied",
        REF_TABLES,
        "scaled",
        "the declared attention factor does not scale the bounds",
        ("    if factor == 1:\n        return lo, hi\n", "    return lo, hi\n"),
    ),
    mutant(
        "reference.tables.attention_factor_exact",
        REF_TABLES,
        "scaled",
        "the FP32 rounding of the attention factor is not allowed for",
        ("ends = (a * (1 - mpmath.mpf(U)), a * (1 + mpmath.mpf(U)))", "ends = (a, a)"),
    ),
    mutant(
        "reference.tables.reference_unscaled",
        REF_TABLES,
        "table_model",
        "the reference value leaves the attention factor out",
        ('_to_fp32(factor * exact[name], "n")', '_to_fp32(exact[name], "n")'),
    ),
    mutant(
        "reference.tables.yarn_never_applies",
        REF_TABLES,
        "yarn_length",
        "the exact frequencies are YaRN-corrected only past the original length, as rope_utils' max_seq_len rule",
        ('return int(rope_scaling["original_max_position_embeddings"]) + 1', "return 1"),
    ),
]

CONTRACTS = [
    mutant(
        "reference.contracts.bf16_tables_unrounded",
        REF_CONTRACTS,
        "bf16_tables",
        "the bf16-tables contract keeps the FP32 tables (it becomes two-boundaries)",
        (
            'round_nearest(t.detach().to("cpu", torch.float64), torch.bfloat16).float()',
            't.detach().to("cpu", torch.float64).float()',
        ),
    ),
    mutant(
        "reference.contracts.tables_rounded_to_fp16",
        REF_CONTRACTS,
        "bf16_tables",
        "the bf16-tables contract rounds the tables to fp16",
        ("torch.float64), torch.bfloat16)", "torch.float64), torch.float16)"),
    ),
    mutant(
        "reference.contracts.unknown_name_is_the_default",
        REF_CONTRACTS,
        "contract_named",
        "an unknown contract name judges against two-boundaries instead of being refused",
        ("        raise ValueError(", "        return CONTRACTS[DEFAULT]\n        raise ValueError("),
    ),
    mutant(
        "reference.qnorm.fp32_through_box_in_x_dtype",
        REF_QNORM,
        "forward_fp32_through",
        "fp32-through's normalized row is rounded to x.dtype before the rotation (boundary 1 back)",
        (
            "round_down(xr - rad, torch.float32), round_up(xr + rad, torch.float32)",
            "round_nearest(xr - rad, dtype), round_nearest(xr + rad, dtype)",
        ),
    ),
    mutant(
        "reference.qnorm.fp32_through_reference_sign",
        REF_QNORM,
        "forward_fp32_through",
        "fp32-through's reference takes a*c + b*s for a pair's first output",
        ("round_nearest(r_ * (a * c - b * s), dtype)", "round_nearest(r_ * (a * c + b * s), dtype)"),
    ),
    mutant(
        "reference.qnorm.fp32_through_backward_boundary_2",
        REF_QNORM,
        "backward_fp32_through",
        "fp32-through's backward takes the de-rotated gradient rounded to x.dtype (boundary 2 back)",
        (
            "    g = join(keep, ga * c + gb * s, -ga * s + gb * c)\n",
            "    g = partial_rope(grad.detach(), cos, sin, rotary, inverse=True).ref\n",
        ),
    ),
    mutant(
        "reference.qnorm.fp32_through_backward_exact_derotation",
        REF_QNORM,
        "backward_fp32_through",
        "fp32-through's backward allows no FP32 error in the de-rotation",
        (
            "dg = torch.maximum(derotated.hi - g, g - derotated.lo) + 2.0**-52 * g.abs()",
            "dg = 2.0**-52 * g.abs()",
        ),
    ),
]

EVERY_OP = [
    mutant(
        "reference.every_op.mean_kept_fp32",
        REF_EVERY_OP,
        "fp32_mean",
        "the mean of the squares is not rounded to x.dtype",
        (
            "    return ref, round_nearest(m_lo, dtype), round_nearest(m_hi, dtype)\n",
            "    return total / d, m_lo, m_hi\n",
        ),
    ),
    mutant(
        "reference.every_op.no_reduction_error",
        REF_EVERY_OP,
        "fp32_mean",
        "the FP32 mean is taken to be exact: no allowance for the reduction order",
        ("    g = gamma(d + 2)\n", "    g = 0.0\n"),
    ),
    mutant(
        "reference.every_op.exact_rsqrt",
        REF_EVERY_OP,
        "norm_stages",
        "no allowance for a GPU's approximate rsqrt (rsqrtf, 2 ulp)",
        (
            "(1 - RHO) / torch.sqrt(z_hi), (1 + RHO) / torch.sqrt(z_lo)",
            "1 / torch.sqrt(z_hi), 1 / torch.sqrt(z_lo)",
        ),
    ),
    mutant(
        "reference.every_op.rounded_once",
        REF_EVERY_OP,
        "stored",
        "an op's result is rounded once into x.dtype, not through its FP32 result",
        ("return round_nearest(round_nearest(v, F32), dtype)", "return round_nearest(v, dtype)"),
    ),
    mutant(
        "reference.every_op.never_flushed",
        REF_EVERY_OP,
        "stored_interval",
        "an FP32 result below 2^-126 is never flushed to zero",
        ("    flushable = ((lo > 0) & (lo < TINY)) | ((hi < 0) & (hi > -TINY))\n", "    flushable = lo != lo\n"),
    ),
    mutant(
        "reference.every_op.row_sum_of_unrounded_products",
        REF_EVERY_OP,
        "backward",
        "the gradient of rs sums the products gy * x unrounded (autograd stores them in x.dtype first)",
        (
            "t = stored(gy_ref * x64, dtype), *stored_interval(*product_range(gy_lo, gy_hi, x64, x64), dtype)",
            "t = gy_ref * x64, *product_range(gy_lo, gy_hi, x64, x64)",
        ),
    ),
    mutant(
        "reference.every_op.cube_rounded_once",
        REF_EVERY_OP,
        "cube",
        "rs^3 is taken rounded once (torch's pow by 3 stores each of its two products)",
        (
            "twice = lambda r: stored(stored(r * r, dtype) * r, dtype)",
            "twice = lambda r: stored(r * r * r, dtype)",
        ),
    ),
    mutant(
        "reference.every_op.square_gradient_without_the_2",
        REF_EVERY_OP,
        "backward",
        "the gradient of x.square() is grad * x (the exponent dropped)",
        ("    two_x = stored(2 * x64, dtype)\n", "    two_x = stored(x64, dtype)\n"),
    ),
    mutant(
        "reference.every_op.mean_gradient_not_divided",
        REF_EVERY_OP,
        "backward",
        "the mean's gradient is not divided by D",
        ("    gq_ref = stored(gz_ref / d, dtype)\n", "    gq_ref = stored(gz_ref, dtype)\n"),
        ("    q_lo, q_hi = gz_lo / d, gz_hi / d\n", "    q_lo, q_hi = gz_lo, gz_hi\n"),
    ),
]

MUTANTS = FLOATS + ROPE + QNORM + UTILS + TABLES + CONTRACTS + EVERY_OP
