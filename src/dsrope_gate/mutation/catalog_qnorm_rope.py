"""Mutants of src/dsrope/qnorm_rope.py: _row_tile, _qnorm_rope, _qnorm_rope_backward, launchers. Each is a
realistic fault the suite must kill."""

from __future__ import annotations

from dsrope_gate.mutation import QNORM, mutant

# The QNorm backward's partner and table lines (register swap and one table load per pair; the forward
# loads partner and table entry per lane).
Q_BACKWARD_PAIRS = (
    "    g_partner = swap_pairs(g, M, BLOCK)\n"
    "    cs = pair_table(cos, b * CB + s * CS, CD, row_ok, first_pair, R // 2, M, BLOCK)\n"
    "    sn = pair_table(sin, b * SB + s * SS, SD, row_ok, first_pair, R // 2, M, BLOCK)\n"
)
# rotate_half pairing in the backward (qnorm.half_split_pairing): channel c's partner channel, and
# per-lane table loads
Q_HALF_PARTNER = "((c - (D - R) + R // 2) % R + (D - R))"
Q_HALF_TABLES = (
    "    cs = tl.load(cos + (b * CB + s * CS)[:, None] + ((c - (D - R)) % (R // 2)) * CD, mask=rot)\n"
    "    sn = tl.load(sin + (b * SB + s * SS)[:, None] + ((c - (D - R)) % (R // 2)) * SD, mask=rot)\n"
)

MUTANTS = [
    mutant(
        "qnorm.half_split_pairing",
        QNORM,
        "pairs channel j with j + R/2 (rotate_half), forward and backward",
        ("second = (lane & 1) == 1", "second = c - (D - R) >= R // 2"),
        ("partner = (j ^ 1) + (D - R)", "partner = (j + R // 2) % R + (D - R)"),
        ("(j // 2) * CD, mask=rot)", "(j % (R // 2)) * CD, mask=rot)"),
        ("(j // 2) * SD, mask=rot)", "(j % (R // 2)) * SD, mask=rot)"),
        # the backward's half-split partner is no lane neighbour: partner and table entry by per-lane loads
        (
            Q_BACKWARD_PAIRS,
            f"    g_partner = tl.load(grad + (b * GB + h * GH + s * GS)[:, None] + {Q_HALF_PARTNER} * GD, mask=rot)"
            ".to(tl.float32)\n" + Q_HALF_TABLES,
        ),
    ),
    mutant(
        "qnorm.partner_next_channel",
        QNORM,
        "every lane takes the next channel as its partner (parity ignored)",
        ("partner = (j ^ 1) + (D - R)", "partner = (j + 1) + (D - R)"),
        # no register swap gives c + 1 on every lane: the backward's partner as a lane load (0 past the row)
        (
            "g_partner = swap_pairs(g, M, BLOCK)",
            "g_partner = tl.load(grad + (b * GB + h * GH + s * GS)[:, None] + (c + 1) * GD, mask=rot & (c + 1 < D))"
            ".to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.forward_sine_sign",
        QNORM,
        "forward rotates with the sine negated",
        ("tl.where(second, y_partner, -y_partner)", "tl.where(second, -y_partner, y_partner)"),
    ),
    mutant(
        "qnorm.backward_sine_sign",
        QNORM,
        "backward de-rotates with the forward rotation",
        ("tl.where(second, -g_partner, g_partner)", "tl.where(second, g_partner, -g_partner)"),
    ),
    mutant(
        "qnorm.leading_channels",
        QNORM,
        "rotates the leading R channels, passes the trailing D-R",
        # the leading pairs start at channel 0: aligned without a shift
        ("shift = (D - R) % 2  # constexpr", "shift = 0  # constexpr"),
        ("rot = valid & (c >= D - R)", "rot = valid & (c < R)"),
        ("second, (D - R + shift) // 2", "second, 0"),
        ("j = c - (D - R)  # position in the rotary slice", "j = c  # position in the rotary slice"),
        ("partner = (j ^ 1) + (D - R)", "partner = j ^ 1"),
    ),
    mutant(
        "qnorm.rotary_start_off_by_one",
        QNORM,
        "rotary lanes start at D-R+1: the first rotary channel is not rotated",
        ("rot = valid & (c >= D - R)", "rot = valid & (c > D - R)"),
    ),
    mutant(
        "qnorm.shift_dropped",
        QNORM,
        "no lane shift for odd D - R: rotary pairs straddle the lane pairs (2i, 2i+1)",
        ("shift = (D - R) % 2  # constexpr", "shift = 0  # constexpr"),
    ),
    mutant(
        "qnorm.shift_lane_not_masked",
        QNORM,
        "the shift lane (c = -1, odd D - R) is not masked: it reads, sums and writes the channel before the row",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = row_ok[:, None] & (c < D)"),
    ),
    mutant(
        "qnorm.second_parity_from_channel",
        QNORM,
        "a lane's place in its pair from the channel's parity, not the lane's: the same for even D - R (c = lane), "
        "every rotary sign flipped for odd D - R (c = lane - 1)",
        ("second = (lane & 1) == 1", "second = (c & 1) == 1"),
    ),
    mutant(
        "qnorm.first_pair_without_shift",
        QNORM,
        "the first rotary lane pair (D - R) // 2 without the shift: one pair early for odd D - R",
        ("second, (D - R + shift) // 2", "second, (D - R) // 2"),
    ),
    mutant(
        "qnorm.boundary1_dropped",
        QNORM,
        "boundary 1 dropped: FP32 kept from the norm through the rotation",
        ("y_partner = (p * r[:, None]).to(dtype).to(tl.float32)", "y_partner = p * r[:, None]"),
        ("rotated = y.to(tl.float32) * cs", "rotated = v * r[:, None] * cs"),
    ),
    mutant(
        "qnorm.boundary1_dropped_on_partner",
        QNORM,
        "boundary 1 applied to the lane but not to its pair partner",
        ("y_partner = (p * r[:, None]).to(dtype).to(tl.float32)", "y_partner = p * r[:, None]"),
    ),
    mutant(
        "qnorm.boundary1_moved_before_norm",
        QNORM,
        "boundary 1 moved: x rotated and rounded first, then normalized (rotate-then-normalize)",
        (
            "rotated = y.to(tl.float32) * cs + tl.where(second, y_partner, -y_partner) * sn",
            "rotated = (v * cs + tl.where(second, p, -p) * sn).to(dtype).to(tl.float32) * r[:, None]",
        ),
    ),
    mutant(
        "qnorm.boundary1_doubled",
        QNORM,
        "an extra rounding in the rotation: each product rounded to x.dtype",
        (
            "rotated = y.to(tl.float32) * cs + tl.where(second, y_partner, -y_partner) * sn",
            "rotated = (y.to(tl.float32) * cs).to(dtype).to(tl.float32) + "
            "(tl.where(second, y_partner, -y_partner) * sn).to(dtype).to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.boundary1_truncates",
        QNORM,
        "boundary 1 rounds by truncation (rtz)",
        ("y = (v * r[:, None]).to(dtype)", 'y = (v * r[:, None]).to(dtype, fp_downcast_rounding="rtz")'),
        (
            "y_partner = (p * r[:, None]).to(dtype)",
            'y_partner = (p * r[:, None]).to(dtype, fp_downcast_rounding="rtz")',
        ),
    ),
    mutant(
        "qnorm.rstd_rounded_to_dtype",
        QNORM,
        "rstd rounded to x.dtype (normalizer computed in bf16)",
        (
            "r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)",
            "r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS).to(out.dtype.element_ty).to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.truncating_store",
        QNORM,
        "the rotated lanes are stored truncated (rtz)",
        ("rotated.to(dtype)", 'rotated.to(dtype, fp_downcast_rounding="rtz")'),
    ),
    mutant(
        "qnorm.rotation_on_pass_lanes",
        QNORM,
        "the rotation result is stored on every lane, pass-through included",
        ("tl.where(rot, rotated.to(dtype), y)", "rotated.to(dtype)"),
    ),
    mutant(
        "qnorm.pass_channels_not_normalized",
        QNORM,
        "pass-through channels copied raw, not normalized",
        ("tl.where(rot, rotated.to(dtype), y)", "tl.where(rot, rotated.to(dtype), v.to(dtype))"),
    ),
    mutant(
        "qnorm.boundary2_dropped",
        QNORM,
        "boundary 2 dropped: RMSNorm backward on the FP32 de-rotated gradient",
        ("* sn).to(dtype).to(tl.float32)\n    g = tl.where", "* sn)\n    g = tl.where"),
    ),
    mutant(
        "qnorm.boundary2_moved_past_mean",
        QNORM,
        "boundary 2 moved: the mean uses the FP32 de-rotated gradient, the subtraction the rounded one",
        (
            "    derotated = (g * cs + tl.where(second, -g_partner, g_partner) * sn).to(dtype).to(tl.float32)\n"
            "    g = tl.where(rot, derotated, g)\n\n"
            "    mean = tl.sum(g * xhat, axis=1)[:, None] / D\n",
            "    derotated = g * cs + tl.where(second, -g_partner, g_partner) * sn\n"
            "    mean = tl.sum(tl.where(rot, derotated, g) * xhat, axis=1)[:, None] / D\n"
            "    g = tl.where(rot, derotated.to(dtype).to(tl.float32), g)\n",
        ),
    ),
    mutant(
        "qnorm.boundary2_truncates",
        QNORM,
        "boundary 2 rounds by truncation (rtz)",
        (
            "* sn).to(dtype).to(tl.float32)\n    g = tl.where",
            '* sn).to(dtype, fp_downcast_rounding="rtz").to(tl.float32)\n    g = tl.where',
        ),
    ),
    mutant(
        "qnorm.derotation_on_pass_lanes",
        QNORM,
        "de-rotation applied on every lane (pass-through gradient zeroed)",
        ("g = tl.where(rot, derotated, g)", "g = derotated"),
    ),
    mutant(
        "qnorm.backward_rounds_before_scaling",
        QNORM,
        "backward rounds g' - xhat*mean to x.dtype before scaling by rstd",
        ("(r * (g - xhat * mean)).to(dtype)", "(r * (g - xhat * mean).to(dtype).to(tl.float32)).to(dtype)"),
    ),
    mutant(
        "qnorm.eps_after_sqrt",
        QNORM,
        "eps added after the square root: 1/(sqrt(mean) + eps)",
        ("r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)", "r = 1.0 / (tl.sqrt(tl.sum(v * v, axis=1) / D) + EPS)"),
    ),
    mutant(
        "qnorm.eps_outside_mean",
        QNORM,
        "eps added to the sum before the division: rsqrt((sum + eps)/D)",
        ("r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)", "r = tl.rsqrt((tl.sum(v * v, axis=1) + EPS) / D)"),
    ),
    mutant(
        "qnorm.eps_ignored",
        QNORM,
        "the launcher hard-codes eps=1e-6",
        ("EPS=eps, **config", "EPS=1e-6, **config"),
    ),
    mutant(
        "qnorm.mean_over_pass_channels",
        QNORM,
        "mean of squares over the D-R pass-through channels only",
        (
            "r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)",
            "r = tl.rsqrt(tl.sum(tl.where(rot, 0.0, v * v), axis=1) / (D - R) + EPS)",
        ),
    ),
    mutant(
        "qnorm.mean_over_block",
        QNORM,
        "sum of squares divided by the padded block width, not D",
        ("r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)", "r = tl.rsqrt(tl.sum(v * v, axis=1) / BLOCK + EPS)"),
    ),
    mutant(
        "qnorm.rstd_head_major",
        QNORM,
        "rstd stored (and read back) in head-major row order (b*H + h)*S + s",
        ("tl.store(rstd + row, r, mask=row_ok)", "tl.store(rstd + (b * H + h) * S + s, r, mask=row_ok)"),
        ("r = tl.load(rstd + row, mask=row_ok)", "r = tl.load(rstd + (b * H + h) * S + s, mask=row_ok)"),
    ),
    mutant(
        "qnorm.backward_no_mean_term",
        QNORM,
        "backward drops the mean term: dx = r * g'",
        ("(r * (g - xhat * mean))", "(r * g)"),
    ),
    mutant(
        "qnorm.backward_missing_rstd",
        QNORM,
        "backward forgets the outer factor r",
        ("(r * (g - xhat * mean))", "(g - xhat * mean)"),
    ),
    mutant(
        "qnorm.backward_mean_misses_pass",
        QNORM,
        "backward mean over the rotary lanes' products only",
        (
            "mean = tl.sum(g * xhat, axis=1)[:, None] / D",
            "mean = tl.sum(tl.where(rot, g * xhat, 0.0), axis=1)[:, None] / D",
        ),
    ),
    mutant(
        "qnorm.backward_mean_over_block",
        QNORM,
        "backward mean divided by the padded block width, not D",
        ("mean = tl.sum(g * xhat, axis=1)[:, None] / D", "mean = tl.sum(g * xhat, axis=1)[:, None] / BLOCK"),
    ),
    mutant(
        "qnorm.backward_xhat_rounded",
        QNORM,
        "backward uses the rounded normalized row rnd(x*r) instead of x*r",
        (
            "xhat = tl.load(x + (b * XB + h * XH + s * XS)[:, None] + c * XD, mask=valid).to(tl.float32) * r",
            "xhat = (tl.load(x + (b * XB + h * XH + s * XS)[:, None] + c * XD, mask=valid).to(tl.float32) * r)"
            ".to(out.dtype.element_ty).to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.backward_uses_output",
        QNORM,
        "the output is saved for backward in place of x",
        ("ctx.save_for_backward(x, cos, sin, output[1])", "ctx.save_for_backward(output[0], cos, sin, output[1])"),
    ),
    mutant(
        "qnorm.gradient_read_with_x_strides",
        QNORM,
        "backward launcher passes x's strides for the gradient",
        ("*x.stride(), *grad.stride(), *cos.stride()", "*x.stride(), *x.stride(), *cos.stride()"),
    ),
    mutant(
        "qnorm.gradient_channel_stride_ignored",
        QNORM,
        "gradient loads assume channel stride 1 (the .sum() gradient has 0)",
        ("[:, None] + c * GD, mask=valid)", "[:, None] + c, mask=valid)"),
    ),
    mutant(
        "qnorm.storage_offset_ignored",
        QNORM,
        "x's storage offset ignored in the forward",
        (
            "x, cos, sin, out, rstd, rows, seq, heads, dim, rotary,",
            "x.as_strided(x.shape, x.stride(), 0), cos, sin, out, rstd, rows, seq, heads, dim, rotary,",
        ),
    ),
    mutant(
        "qnorm.gradient_offset_ignored",
        QNORM,
        "the gradient's storage offset ignored in the backward",
        (
            "x, grad, cos, sin, rstd, out, rows, seq,",
            "x, grad.as_strided(grad.shape, grad.stride(), 0), cos, sin, rstd, out, rows, seq,",
        ),
    ),
    mutant(
        "qnorm.head_seq_strides_swapped",
        QNORM,
        "forward reads x with head and sequence strides swapped",
        (
            "x_row = x + (b * XB + h * XH + s * XS)[:, None]\n    # Upcast",
            "x_row = x + (b * XB + h * XS + s * XH)[:, None]\n    # Upcast",
        ),
    ),
    mutant(
        "qnorm.partner_channel_stride_ignored",
        QNORM,
        "forward loads the pair partner assuming channel stride 1",
        ("p = tl.load(x_row + partner * XD, mask=rot)", "p = tl.load(x_row + partner, mask=rot)"),
    ),
    mutant(
        "qnorm.forward_table_channel_stride_ignored",
        QNORM,
        "forward reads cos/sin assuming last-dim stride 1",
        ("(j // 2) * CD, mask=rot)", "(j // 2), mask=rot)"),
        ("(j // 2) * SD, mask=rot)", "(j // 2), mask=rot)"),
    ),
    mutant(
        "qnorm.cos_batch_stride_ignored",
        QNORM,
        "forward reads cos/sin without their batch stride (assumes expand)",
        ("tl.load(cos + (b * CB + s * CS)[:, None] + (j // 2)", "tl.load(cos + (s * CS)[:, None] + (j // 2)"),
        ("tl.load(sin + (b * SB + s * SS)[:, None] + (j // 2)", "tl.load(sin + (s * SS)[:, None] + (j // 2)"),
    ),
    mutant(
        "qnorm.backward_table_channel_stride_ignored",
        QNORM,
        "backward reads cos/sin assuming last-dim stride 1",
        (Q_BACKWARD_PAIRS, Q_BACKWARD_PAIRS.replace("CS, CD,", "CS, 1,").replace("SS, SD,", "SS, 1,")),
    ),
    mutant(
        "qnorm.channel_mask_long",
        QNORM,
        "channel mask c <= D: the next row's first channel joins the sum",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = row_ok[:, None] & (c >= 0) & (c <= D)"),
    ),
    mutant(
        "qnorm.row_mask_missing",
        QNORM,
        "no row mask on the tile: the last block reads and writes past the tensors",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = (c >= 0) & (c < D) & (row >= 0)[:, None]"),
    ),
    mutant(
        "qnorm.head_major_output",
        QNORM,
        "forward output in head-major storage (values right, layout wrong)",
        (
            "return token_major_empty(x), x.new_empty(batch * seq * heads",
            "return torch.empty(x.shape, dtype=x.dtype, device=x.device), x.new_empty(batch * seq * heads",
        ),
        (
            "tl.store(out + (row * D)[:, None] + c, tl.where(rot",
            "tl.store(out + (((b * H + h) * S + s) * D)[:, None] + c, tl.where(rot",
        ),
    ),
    mutant(
        "qnorm.backward_output_like_x",
        QNORM,
        "backward allocates dx like x (x's strides) and writes it token-major",
        (
            "    out = token_major_empty(x)\n    batch, heads, seq, dim = x.shape\n"
            "    rows = batch * seq * heads\n    if",
            "    out = torch.empty_like(x)\n    batch, heads, seq, dim = x.shape\n"
            "    rows = batch * seq * heads\n    if",
        ),
    ),
    mutant(
        "qnorm.rsqrt_as_division",
        QNORM,
        "1/sqrt instead of rsqrt",
        ("r = tl.rsqrt(tl.sum(v * v, axis=1) / D + EPS)", "r = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / D + EPS)"),
        equivalent="the same function: both compute 1/sqrt(z) in FP32; the model allows an approximate rsqrt "
        "(2**-22 relative) and correct rounding of 1/sqrt lies inside that, so no sound test tells them apart.",
    ),
    mutant(
        "qnorm.gradient_not_cast",
        QNORM,
        "backward passes grad_output without casting it to x.dtype",
        ("return x, grad_output.to(x.dtype), cos,", "return x, grad_output, cos,"),
        equivalent="autograd casts the incoming gradient to the output's dtype (= x.dtype) before calling "
        "backward (the op's registered backward included; under torch.compile the traced gradient has the "
        "output's dtype), so the cast is a no-op on every gradient autograd can deliver.",
    ),
    mutant(
        "qnorm.inference_eps_ignored",
        QNORM,
        "the no-gradient path (inference, decode) launches with eps=1e-6, not the caller's eps",
        ("    return _forward(x, cos, sin, rotary, eps)[0]", "    return _forward(x, cos, sin, rotary, 1e-6)[0]"),
    ),
    mutant(
        "qnorm.op_eps_ignored",
        QNORM,
        "the op dsrope::qnorm_rope (what torch.compile calls) launches with eps=1e-6",
        (
            '(out, rstd)."""\n    return _forward(x, cos, sin, rotary, eps)',
            '(out, rstd)."""\n    return _forward(x, cos, sin, rotary, 1e-6)',
        ),
    ),
    mutant(
        "qnorm.backward_op_launches_directly",
        QNORM,
        "the op's registered backward calls the launcher, not the backward op (tracing meets the Triton launch)",
        (
            "return qnorm_rope_backward(*_QNormRoPE.backward_inputs(ctx, grad_output))",
            "return _backward(*_QNormRoPE.backward_inputs(ctx, grad_output))",
        ),
    ),
    mutant(
        "qnorm.fake_backward_head_major",
        QNORM,
        "the backward op's fake implementation gives a contiguous head-major dx (the real one is token-major)",
        (
            "def _qnorm_rope_backward_fake(x, grad, cos, sin, rstd, rotary):\n    return token_major_empty(x)",
            "def _qnorm_rope_backward_fake(x, grad, cos, sin, rstd, rotary):\n    return x.new_empty(x.shape)",
        ),
    ),
    mutant(
        "qnorm.fake_rstd_in_x_dtype",
        QNORM,
        "the forward op's fake implementation gives rstd in x's dtype (the real one is FP32)",
        (
            "def _qnorm_rope_fake(x, cos, sin, rotary, eps):\n    return _outputs(x)",
            "def _qnorm_rope_fake(x, cos, sin, rotary, eps):\n"
            "    out, rstd = _outputs(x)\n    return out, rstd.to(x.dtype)",
        ),
    ),
    mutant(
        "qnorm.compile_traces_function",
        QNORM,
        "under torch.compile the autograd.Function is called, not the op (dynamo meets the Triton launch)",
        ("return qnorm_rope(x, cos, sin, rotary, eps)[0]", "return _QNormRoPE.apply(x, cos, sin, rotary, eps)"),
    ),
    mutant(
        "qnorm.autograd_only_for_leaves",
        QNORM,
        "the gradient path is taken only for a leaf x: an x computed from parameters loses its gradient",
        (
            "    if wants_autograd(x):\n        return _QNormRoPE",
            "    if x.is_leaf and wants_autograd(x):\n        return _QNormRoPE",
        ),
    ),
    mutant(
        "qnorm.int32_offsets",
        QNORM,
        "row index in int32 (forward and backward): offsets wrap past 2**31 elements",
        (
            "on large tensors.\n    row = tl.program_id(0).to(tl.int64) * M",
            "on large tensors.\n    row = tl.program_id(0) * M",
        ),
        (
            'RMSNorm input gradient."""\n    row = tl.program_id(0).to(tl.int64) * M',
            'RMSNorm input gradient."""\n    row = tl.program_id(0) * M',
        ),
        gpu_only=True,
    ),
]
