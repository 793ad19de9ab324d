"""Mutants of src/dsrope/rope_utils.py: frequencies, tables, pairings, q/k with cu_seqlens and cp. Each is
a realistic fault the suite must kill."""

from __future__ import annotations

from dsrope_dev.mutation import UTILS, mutant

MUTANTS = [
    mutant(
        "utils.half_split_halves_swapped",
        UTILS,
        "apply_rotary_emb_half_split",
        "half-split takes the second half as a and the first as b",
        ("a, b = xf[..., :half], xf[..., half:]", "b, a = xf[..., :half], xf[..., half:]"),
    ),
    mutant(
        "utils.half_split_pairs_adjacent",
        UTILS,
        "apply_rotary_emb_half_split",
        "apply_rotary_emb_half_split pairs adjacent channels (2j, 2j+1)",
        ("a, b = xf[..., :half], xf[..., half:]", "a, b = xf[..., 0::2], xf[..., 1::2]"),
    ),
    mutant(
        "utils.half_split_sine_sign",
        UTILS,
        "apply_rotary_emb_half_split",
        "half-split rotates by the conjugate angle",
        (
            "torch.cat((a * cos - b * sin, a * sin + b * cos), -1)",
            "torch.cat((a * cos + b * sin, b * cos - a * sin), -1)",
        ),
    ),
    mutant(
        "utils.eager_interleaved_pairs_halves",
        UTILS,
        "_interleaved",
        "the eager interleaved path pairs (j, j + d/2) (rotate_half)",
        (
            "x.float().reshape(*x.shape[:-1], -1, 2).contiguous()",
            "x.float().reshape(*x.shape[:-1], 2, -1).transpose(-1, -2).contiguous()",
        ),
    ),
    mutant(
        "utils.kernel_table_real_imag_swapped",
        UTILS,
        "_interleaved",
        "the cached-table path passes sin as cos (real/imag swapped)",
        (
            "cos, sin = table.real, table.imag",
            "cos, sin = table.imag, table.real",
        ),
    ),
    mutant(
        "utils.kernel_conjugate_table",
        UTILS,
        "_interleaved",
        "the cached-table path rotates by the conjugate (sine negated)",
        (
            "torch.cat((sin, sin), -1))",
            "torch.cat((-sin, -sin), -1))",
        ),
    ),
    mutant(
        "utils.trainable_table_through_kernel",
        UTILS,
        "_runs_kernel",
        "a trainable table is sent to the kernel (no gradient reaches it)",
        ("return kernels_run_on(x.device) and not table.requires_grad", "return kernels_run_on(x.device)"),
    ),
    mutant(
        "utils.frequency_index_off_by_one",
        UTILS,
        "precompute_freqs_cis",
        "inverse frequencies start at theta**(-2/d) instead of 1",
        ("torch.arange(0, dim, 2, dtype=dtype)", "torch.arange(2, dim + 2, 2, dtype=dtype)"),
    ),
    mutant(
        "utils.yarn_ramp_off_by_one",
        UTILS,
        "precompute_freqs_cis",
        "the YaRN ramp starts one channel early: (j - low + 1) / (high - low)",
        ("(torch.arange(dim // 2, dtype=dtype) - low)", "(torch.arange(dim // 2, dtype=dtype) - low + 1)"),
    ),
    mutant(
        "utils.yarn_low_rounded_up",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's low end rounded up (ceil) instead of down",
        ("low = max(math.floor(_correction_dim(", "low = max(math.ceil(_correction_dim("),
    ),
    mutant(
        "utils.yarn_high_rounded_down",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's high end rounded down (floor) instead of up",
        ("high = min(math.ceil(_correction_dim(", "high = min(math.floor(_correction_dim("),
    ),
    mutant(
        "utils.yarn_ramp_inverted",
        UTILS,
        "precompute_freqs_cis",
        "YaRN divides the high-frequency channels by factor instead of the low ones",
        (
            "freqs = freqs / factor * (1 - smooth) + freqs * smooth",
            "freqs = freqs * (1 - smooth) + freqs / factor * smooth",
        ),
    ),
    mutant(
        "utils.yarn_at_original_length",
        UTILS,
        "precompute_freqs_cis",
        "YaRN applied when max_seq_len equals the original length",
        ("max_seq_len > yarn[3]", "max_seq_len >= yarn[3]"),
    ),
    mutant(
        "utils.angle_in_fp64",
        UTILS,
        "_rotations",
        "angles p * freq computed and kept in FP64 (cos and sin of the exact product) instead of the FP32 product",
        (
            "angle = positions.to(torch.float32)[..., None] * freqs\n"
            "    angle = angle.to(torch.float64 if fp64 else torch.float32)",
            "angle = positions.to(torch.float64)[..., None] * freqs.double()",
        ),
    ),
    mutant(
        "utils.angle_position_unrounded",
        UTILS,
        "_rotations",
        "positions past 2**24 enter the angle unrounded (fl32(p * f), not fl32(fl32(p) * f))",
        (
            "angle = positions.to(torch.float32)[..., None] * freqs",
            "angle = positions.to(torch.float64)[..., None] * freqs.double()",
        ),
    ),
    mutant(
        "utils.fp64_frequencies_by_default",
        UTILS,
        "precompute_freqs_cis",
        "the default frequencies computed in FP64 and rounded once (the more accurate table, not the trained one)",
        (
            'dtype = torch.float64 if check_bool("fp64", fp64) else torch.float32',
            'dtype = torch.float64 if check_bool("fp64", fp64) or True else torch.float32',
        ),
    ),
    mutant(
        "utils.fp64_cos_sin_by_default",
        UTILS,
        "_rotations",
        "the default cos and sin evaluated in FP64 and rounded once (the more accurate table, not the trained one)",
        ("angle = angle.to(torch.float64 if fp64 else torch.float32)", "angle = angle.to(torch.float64)"),
    ),
    mutant(
        "utils.frequencies_negative_power",
        UTILS,
        "precompute_freqs_cis",
        "inverse frequencies as theta ** (-2j / d) instead of upstream's 1 / theta ** (2j / d)",
        (
            "freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))",
            "freqs = theta ** (-torch.arange(0, dim, 2, dtype=dtype) / dim)",
        ),
    ),
    mutant(
        "utils.yarn_blend_regrouped",
        UTILS,
        "precompute_freqs_cis",
        "the YaRN blend regrouped as freqs * (smooth + (1 - smooth) / factor) (equal in exact arithmetic)",
        (
            "freqs = freqs / factor * (1 - smooth) + freqs * smooth",
            "freqs = freqs * (smooth + (1 - smooth) / factor)",
        ),
    ),
    mutant(
        "utils.yarn_interpolation_as_transformers",
        UTILS,
        "precompute_freqs_cis",
        "YaRN's interpolated frequency as transformers computes it, 1 / (factor * theta ** (2j / d))",
        (
            "freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))",
            "powers = theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim)\n    freqs = 1.0 / powers",
        ),
        ("freqs = freqs / factor * (1 - smooth)", "freqs = 1.0 / (factor * powers) * (1 - smooth)"),
    ),
    mutant(
        "utils.cos_sin_through_torch_cos",
        UTILS,
        "_rotations",
        "cos and sin from torch.cos / torch.sin (torch's vectorized FP32 ones) instead of upstream's torch.polar",
        (
            "return torch.polar(torch.ones_like(angle), angle).to(torch.complex64)",
            "return torch.complex(torch.cos(angle), torch.sin(angle)).to(torch.complex64)",
        ),
    ),
    mutant(
        "utils.cp_mirror_off_by_one",
        UTILS,
        "_shard_positions",
        "context parallelism: the mirrored chunk is 2*cp - rank instead of 2*cp - 1 - rank",
        ("mirror = 2 * cp_size - 1 - cp_rank", "mirror = 2 * cp_size - 2 - cp_rank"),
    ),
    mutant(
        "utils.thd_positions_continue",
        UTILS,
        "_fused_tables",
        "packed thd sequences: positions run on across cu_seqlens instead of restarting",
        (
            "rows = torch.cat([_shard_positions(n, cp_size, cp_rank) for n in lengths]).to(q.device)",
            "rows = _shard_positions(sum(lengths), cp_size, cp_rank).to(q.device)",
        ),
    ),
    mutant(
        "utils.mscale_ignored",
        UTILS,
        "yarn_get_mscale",
        "yarn_get_mscale ignores mscale",
        ("return 0.1 * mscale * math.log(scale) + 1.0", "return 0.1 * math.log(scale) + 1.0"),
    ),
    mutant(
        "utils.mscale_boundary",
        UTILS,
        "yarn_get_mscale",
        "yarn_get_mscale returns the formula at scale == 1 too",
        ("if scale <= 1:", "if scale < 1:"),
        equivalent="at scale == 1 the formula gives 0.1 * mscale * ln(1) + 1 = 1.0 exactly (ln(1) is exactly 0 "
        "and mscale is finite), the same value as the early return.",
    ),
    # YaRN paths the usual DeepSeek-V3 configurations never reach: the edge configurations pinned in
    # tests/test_rope_utils.py and tests/test_yarn_edge_cases.py kill them
    mutant(
        "utils.yarn_skipped_at_factor_1",
        UTILS,
        "precompute_freqs_cis",
        "YaRN skipped when factor is 1 (the FP32 blend freqs / 1 * (1 - s) + freqs * s is not the identity)",
        (
            "if yarn is not None and max_seq_len > yarn[3]:",
            "if yarn is not None and max_seq_len > yarn[3] and yarn[0] != 1:",
        ),
    ),
    mutant(
        "utils.yarn_below_original_length",
        UTILS,
        "precompute_freqs_cis",
        "YaRN applied whenever max_seq_len differs from the original length (also below it)",
        ("if yarn is not None and max_seq_len > yarn[3]:", "if yarn is not None and max_seq_len != yarn[3]:"),
    ),
    mutant(
        "utils.mscale_zero_as_default",
        UTILS,
        "yarn_get_mscale",
        "yarn_get_mscale treats mscale 0 as the default 1 (`mscale or 1.0`)",
        (
            '    mscale = check_real("mscale", mscale, float("-inf"))',
            '    mscale = check_real("mscale", mscale, float("-inf")) or 1.0',
        ),
    ),
    mutant(
        "utils.yarn_zero_width_ramp_unguarded",
        UTILS,
        "precompute_freqs_cis",
        "no +0.001 when the ramp's ends meet (low == high): 0/0 and x/0 in the ramp",
        ("        if low == high:\n            high += 0.001", "        if low == high:\n            pass"),
    ),
    mutant(
        "utils.yarn_high_not_clamped",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's high end not clamped to dim - 1",
        (
            "high = min(math.ceil(_correction_dim(beta_slow, dim, theta, original)), dim - 1)",
            "high = math.ceil(_correction_dim(beta_slow, dim, theta, original))",
        ),
    ),
    mutant(
        "utils.yarn_low_not_clamped",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's low end not clamped to 0",
        (
            "low = max(math.floor(_correction_dim(beta_fast, dim, theta, original)), 0)",
            "low = math.floor(_correction_dim(beta_fast, dim, theta, original))",
        ),
    ),
    mutant(
        "utils.yarn_low_clamped_at_top",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's low bound also clamped to dim - 1 (upstream clamps it at 0 only): crossed bounds at the top "
        "keep every frequency instead of dividing all by factor",
        (
            "low = max(math.floor(_correction_dim(beta_fast, dim, theta, original)), 0)",
            "low = min(max(math.floor(_correction_dim(beta_fast, dim, theta, original)), 0), dim - 1)",
        ),
    ),
    mutant(
        "utils.yarn_high_clamped_at_zero",
        UTILS,
        "precompute_freqs_cis",
        "the ramp's high bound also clamped to 0 (upstream clamps it at dim - 1 only): crossed bounds at 0 "
        "divide pairs 1.. by factor instead of keeping every frequency",
        (
            "high = min(math.ceil(_correction_dim(beta_slow, dim, theta, original)), dim - 1)",
            "high = max(min(math.ceil(_correction_dim(beta_slow, dim, theta, original)), dim - 1), 0)",
        ),
    ),
]
