"""Mutants of src/dsrope_gate/semantics.py: every emulation, the agreement and the classifier. An emulation
that computes another semantics than its label names, or a classifier that names a semantics the bits do
not carry, tells a project the wrong thing about its code."""

from __future__ import annotations

from dsrope_gate.mutation import SEMANTICS, mutant

MUTANTS = [
    mutant(
        "semantics.truncation_rounds_to_nearest",
        SEMANTICS,
        "truncate",
        "the truncating store rounds to nearest (truncating-store becomes interleaved)",
        ("too_far = r.float().abs() > v.abs()", "too_far = torch.zeros_like(v, dtype=torch.bool)"),
    ),
    mutant(
        "semantics.fma_rounds_the_product",
        SEMANTICS,
        "fma32",
        "the fused multiply-add rounds its product first (fma-rotation becomes interleaved)",
        ("hi, lo = two_sum(a.double() * b.double(), c.double())", "hi, lo = two_sum((a * b).double(), c.double())"),
    ),
    mutant(
        "semantics.fma_fuses_the_other_product",
        SEMANTICS,
        "rotate_fp32",
        "fma-rotation fuses the partner's product, not each lane's own",
        (
            "first, second = fma32(a, c, -(b * s)), fma32(b, c, a * s)",
            "first, second = fma32(-b, s, a * c), fma32(a, s, b * c)",
        ),
    ),
    mutant(
        "semantics.half_split_halves_swapped",
        SEMANTICS,
        "rotate_fp32",
        "half-split pairs the second half with the first (a and b swapped)",
        (
            "a, b = y[..., start : start + half], y[..., start + half : start + rotary]",
            "b, a = y[..., start : start + half], y[..., start + half : start + rotary]",
        ),
    ),
    mutant(
        "semantics.leading_channels_rotate_the_trailing",
        SEMANTICS,
        "rotate_fp32",
        "the leading-channels emulation rotates the trailing channels",
        ('start = 0 if label == "leading-channels" else d - rotary', "start = d - rotary"),
    ),
    mutant(
        "semantics.interleaved_sign_slip",
        SEMANTICS,
        "rotate_fp32",
        "every rotation's first output is a*c + b*s",
        ("first, second = a * c - b * s, a * s + b * c", "first, second = a * c + b * s, a * s + b * c"),
    ),
    mutant(
        "semantics.truncating_store_truncates_the_leading_channels",
        SEMANTICS,
        "rotate",
        "the truncating store leaves the rotary channels rounded to nearest",
        ("truncate(out[..., start:], dtype)", "out[..., start:].to(dtype)"),
    ),
    mutant(
        "semantics.fp32_through_rounds_the_norm",
        SEMANTICS,
        "normalized",
        "fp32-through rounds the normalized row (it becomes two-boundaries)",
        (
            "return F.rms_norm(x.float(), (d,), eps=eps)\n",
            "return F.rms_norm(x.float(), (d,), eps=eps).to(x.dtype).float()\n",
        ),
    ),
    mutant(
        "semantics.rounded_rstd_kept_fp32",
        SEMANTICS,
        "normalized",
        "rounded-rstd keeps 1/sqrt(mean + eps) in FP32",
        (
            "torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)",
            "torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)",
        ),
    ),
    mutant(
        "semantics.every_op_rounded_keeps_rstd_fp32",
        SEMANTICS,
        "normalized",
        "every-op-rounded keeps 1/sqrt(mean + eps) in FP32 (one op of the official chain not rounded)",
        (
            "r = torch.rsqrt((mean.float() + eps).to(x.dtype).float()).to(x.dtype)",
            "r = torch.rsqrt((mean.float() + eps).to(x.dtype).float())",
        ),
    ),
    mutant(
        "semantics.bf16_tables_round_cos_only",
        SEMANTICS,
        "rotate_fp32",
        "bf16-tables rounds the cosine table only",
        ("c, s = c.bfloat16().float(), s.bfloat16().float()", "c = c.bfloat16().float()"),
    ),
    mutant(
        "semantics.rotary_factor_twice_turns_the_trailing_channels",
        SEMANTICS,
        "rotate_fp32",
        "rotary-factor-twice rotates the trailing R*R/D channels of the rope slice, not its leading ones",
        (
            "rotary = 2 * (rotary * rotary // (2 * d))",
            "rotary = 2 * (rotary * rotary // (2 * d))\n        start = d - rotary",
        ),
    ),
    mutant(
        "semantics.dtype_math_tables_kept_fp32",
        SEMANTICS,
        "rotate_fp32",
        "dtype-math keeps the FP32 tables (only the products and the sum are rounded)",
        ("c, s = c.to(dtype).float(), s.to(dtype).float()", "c, s = c, s"),
    ),
    mutant(
        "semantics.dtype_math_products_unrounded",
        SEMANTICS,
        "rotate_fp32",
        "dtype-math rounds the sum only, not each product",
        ("(stored(p * q, dtype) for p, q in", "(p * q for p, q in"),
    ),
    mutant(
        "semantics.every_op_rounded_backward_cube_rounded_once",
        SEMANTICS,
        "every_op_rounded_backward",
        "the every-op-rounded backward's rs^3 is rounded once (torch's pow by 3 stores each product)",
        ("cube = stored(stored(rs * rs, dtype) * rs, dtype)", "cube = stored(rs**3, dtype)"),
    ),
    mutant(
        "semantics.every_op_rounded_backward_sums_unrounded_products",
        SEMANTICS,
        "every_op_rounded_backward",
        "the every-op-rounded backward sums gy * x unrounded for the gradient of rs",
        (
            "stored(stored(gy * xf, dtype).sum(-1, keepdim=True), dtype)",
            "stored((gy * xf).sum(-1, keepdim=True), dtype)",
        ),
    ),
    mutant(
        "semantics.bf16_tables_backward_keeps_fp32_tables",
        SEMANTICS,
        "qnorm_backward.emulate",
        "the bf16-tables backward de-rotates with the FP32 tables (it becomes two-boundaries)",
        ("cos, sin = cos.bfloat16().float(), sin.bfloat16().float()", "cos, sin = cos, sin"),
    ),
    mutant(
        "semantics.no_boundary_2_rounds_the_gradient",
        SEMANTICS,
        "qnorm_backward.emulate",
        "the no-boundary-2 backward rounds the de-rotated gradient like the contract's",
        (
            "            y = F.rms_norm(xg.float(), (d,), eps=eps)\n",
            "            y = F.rms_norm(xg, (d,), eps=eps).float()\n",
        ),
    ),
    mutant(
        "semantics.backward_rotates_forward",
        SEMANTICS,
        "rope_backward.emulate",
        "the partial RoPE backward emulation applies the forward rotation",
        (
            "return rotate(grad.float(), cos, -sin, rotary, rotation, grad.dtype)",
            "return rotate(grad.float(), cos, sin, rotary, rotation, grad.dtype)",
        ),
    ),
    mutant(
        "semantics.nan_never_agrees",
        SEMANTICS,
        "agreement",
        "agreement compares NaN by bits (payloads differ: a NaN meets no NaN)",
        ("    same |= got.isnan() & emulated.isnan()\n", ""),
    ),
    mutant(
        "semantics.empty_agrees_not_at_all",
        SEMANTICS,
        "agreement",
        "an empty output agrees with nothing",
        ("        return 1.0\n", "        return 0.0\n"),
    ),
    mutant(
        "semantics.threshold_ignored",
        SEMANTICS,
        "classify",
        "the best labels are named even where they miss the threshold (a 1%-off kernel gets a label)",
        ("    if not all(case[label] >= threshold for label in chosen for case in evidence):\n        return []\n", ""),
    ),
    mutant(
        "semantics.threshold_on_the_mean",
        SEMANTICS,
        "classify",
        "the threshold is checked on the mean over the cases, not on every case",
        (
            "if not all(case[label] >= threshold for label in chosen for case in evidence):",
            "if not all(mean[label] >= threshold for label in chosen):",
        ),
    ),
    mutant(
        "semantics.ties_dropped",
        SEMANTICS,
        "classify",
        "of labels that agree equally, only the first is named",
        ("chosen = [label for label in evidence[0] if mean[label] == best]", "chosen = [max(mean, key=mean.get)]"),
    ),
]
