"""Mutants of src/dsrope/qnorm_rope.py: _row_tile, the kernels _qnorm_rope and _qnorm_rope_backward, their
launchers, ops and autograd.Function. Each is a realistic fault the suite must kill."""

from __future__ import annotations

from dsrope_dev.mutation import QNORM, mutant

# The QNorm backward's partner and table lines (register swap and one table load per pair, as on the
# forward's rotary tile).
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
FORWARD, BACKWARD, TILE = "_qnorm_rope", "_qnorm_rope_backward", "_row_tile"
SUM_SQUARES = "tl.sum(tl.reshape(v * v, (M, BLOCK)), axis=1)"
RSQRT = f"r = tl.rsqrt({SUM_SQUARES} / D + EPS)"
# the forward's rotary tile: boundary 1 on the lane, its partner from registers, the rotation
Q_OWN_ROUNDED = "own = (own * r[:, None]).to(dtype).to(tl.float32)"
Q_SIGNED_PARTNER = "tl.where((j & 1) == 1, partner, negated(partner))"
Q_ROTATION = f"rotated = rotate_lane(own, cs, {Q_SIGNED_PARTNER} * sn)"
Q_COS = "cs = pair_table(cos, b * CB + s * CS, CD, row_ok, 0, R // 2, M, RBLOCK)"
Q_SIN = "sn = pair_table(sin, b * SB + s * SS, SD, row_ok, 0, R // 2, M, RBLOCK)"

MUTANTS = [
    mutant(
        "qnorm.half_split_pairing",
        QNORM,
        FORWARD,
        "pairs channel j with j + R/2 (rotate_half), forward and backward",
        (TILE, "second = (lane & 1) == 1", "second = c - (D - R) >= R // 2"),
        # the half-split partner is no lane neighbour: in both kernels partner and table entry by per-lane
        # loads (the forward's partner normalized and rounded as its own lane)
        (Q_SIGNED_PARTNER, "tl.where(j >= R // 2, partner, negated(partner))"),
        (
            "partner = swap_pairs(own, M, RBLOCK)",
            "partner = (tl.load(x_row + ((j + R // 2) % R + (D - R)) * XD, mask=in_slice).to(tl.float32) * r[:, None])"
            ".to(dtype).to(tl.float32)",
        ),
        (Q_COS, "cs = tl.load(cos + (b * CB + s * CS)[:, None] + (j % (R // 2)) * CD, mask=in_slice)"),
        (Q_SIN, "sn = tl.load(sin + (b * SB + s * SS)[:, None] + (j % (R // 2)) * SD, mask=in_slice)"),
        (
            BACKWARD,
            Q_BACKWARD_PAIRS,
            f"    g_partner = tl.load(grad + (b * GB + h * GH + s * GS)[:, None] + {Q_HALF_PARTNER} * GD, mask=rot)"
            ".to(tl.float32)\n" + Q_HALF_TABLES,
        ),
    ),
    mutant(
        "qnorm.partner_next_channel",
        QNORM,
        FORWARD,
        "every lane takes the next channel as its partner (parity ignored)",
        # no register swap gives c + 1 on every lane: the partner as a lane load in both kernels (the
        # forward's normalized and rounded as its own lane, read past the row as the whole-row form read
        # it; the backward's 0 past the row)
        (
            "partner = swap_pairs(own, M, RBLOCK)",
            "partner = (tl.load(x_row + (rotary_channel + 1) * XD, mask=in_slice).to(tl.float32) * r[:, None])"
            ".to(dtype).to(tl.float32)",
        ),
        (
            BACKWARD,
            "g_partner = swap_pairs(g, M, BLOCK)",
            "g_partner = tl.load(grad + (b * GB + h * GH + s * GS)[:, None] + (c + 1) * GD, mask=rot & (c + 1 < D))"
            ".to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.forward_sine_sign",
        QNORM,
        FORWARD,
        "forward rotates with the sine negated",
        (Q_SIGNED_PARTNER, "tl.where((j & 1) == 1, negated(partner), partner)"),
    ),
    mutant(
        "qnorm.backward_sine_sign",
        QNORM,
        BACKWARD,
        "backward de-rotates with the forward rotation",
        ("tl.where(second, negated(g_partner), g_partner)", "tl.where(second, g_partner, negated(g_partner))"),
    ),
    mutant(
        "qnorm.leading_channels",
        QNORM,
        TILE,
        "rotates the leading R channels, passes the trailing D-R",
        # the leading pairs start at channel 0: aligned without a shift
        ("shift = (D - R) % 2", "shift = 0"),
        ("rot = valid & (c >= D - R)", "rot = valid & (c < R)"),
        ("second, (D - R + shift) // 2", "second, 0"),
        # the forward: its rotary tile starts at channel 0 (its leading channels stored as before, the rotated
        # lanes over the first R of them; the trailing R never written)
        (FORWARD, "rotary_channel = j + (D - R)", "rotary_channel = j"),
    ),
    mutant(
        "qnorm.rotary_start_off_by_one",
        QNORM,
        TILE,
        "rotary lanes start at D-R+1: the first rotary channel is not rotated",
        ("rot = valid & (c >= D - R)", "rot = valid & (c > D - R)"),
        # the forward's rotary tile: its first lane masked (channel D - R never written)
        (FORWARD, "in_slice = row_ok[:, None] & (j < R)", "in_slice = row_ok[:, None] & (j > 0) & (j < R)"),
    ),
    mutant(
        "qnorm.shift_dropped",
        QNORM,
        TILE,
        "no lane shift for odd D - R: rotary pairs straddle the lane pairs (2i, 2i+1)",
        ("shift = (D - R) % 2", "shift = 0"),
    ),
    mutant(
        "qnorm.shift_lane_not_masked",
        QNORM,
        TILE,
        "the shift lane (c = -1, odd D - R) is not masked: it reads, sums and writes the channel before the row",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = row_ok[:, None] & (c < D)"),
    ),
    mutant(
        "qnorm.second_parity_from_channel",
        QNORM,
        TILE,
        "a lane's place in its pair from the channel's parity, not the lane's: the same for even D - R (c = lane), "
        "every rotary sign flipped for odd D - R (c = lane - 1)",
        ("second = (lane & 1) == 1", "second = (c & 1) == 1"),
        # the forward's rotary tile: lane j holds channel j + D - R
        (FORWARD, Q_SIGNED_PARTNER, "tl.where((rotary_channel & 1) == 1, partner, negated(partner))"),
    ),
    mutant(
        "qnorm.first_pair_without_shift",
        QNORM,
        TILE,
        "the first rotary lane pair (D - R) // 2 without the shift: one pair early for odd D - R",
        ("second, (D - R + shift) // 2", "second, (D - R) // 2"),
    ),
    mutant(
        "qnorm.boundary1_dropped",
        QNORM,
        FORWARD,
        "boundary 1 dropped: FP32 kept from the norm through the rotation",
        # the partner is the lane's neighbour in registers: unrounded too
        (Q_OWN_ROUNDED, "own = own * r[:, None]"),
    ),
    mutant(
        "qnorm.boundary1_dropped_on_partner",
        QNORM,
        FORWARD,
        "boundary 1 applied to the lane but not to its pair partner (swapped in from the unrounded normalized lanes)",
        (
            f"    {Q_OWN_ROUNDED}\n    partner = swap_pairs(own, M, RBLOCK)\n",
            f"    partner = swap_pairs(own * r[:, None], M, RBLOCK)\n    {Q_OWN_ROUNDED}\n",
        ),
    ),
    mutant(
        "qnorm.boundary1_moved_before_norm",
        QNORM,
        FORWARD,
        "boundary 1 moved: x rotated and rounded first, then normalized (rotate-then-normalize)",
        # the rotary lanes (and their partners) stay x; the rotation's result rounded, normalized, rounded
        (f"    {Q_OWN_ROUNDED}\n", ""),
        (Q_ROTATION, Q_ROTATION + ".to(dtype).to(tl.float32) * r[:, None]"),
    ),
    mutant(
        "qnorm.boundary1_doubled",
        QNORM,
        FORWARD,
        "an extra rounding in the rotation: each product rounded to x.dtype",
        (
            Q_ROTATION,
            f"rotated = (own * cs).to(dtype).to(tl.float32) + ({Q_SIGNED_PARTNER} * sn).to(dtype).to(tl.float32)",
        ),
    ),
    mutant(
        "qnorm.boundary1_truncates",
        QNORM,
        FORWARD,
        "boundary 1 rounds by truncation (rtz)",
        # the pass-through channels' rounding and the rotary tile's (its partners swapped in from it)
        ("(v * r[:, None, None]).to(dtype)", '(v * r[:, None, None]).to(dtype, fp_downcast_rounding="rtz")'),
        ("own = (own * r[:, None]).to(dtype)", 'own = (own * r[:, None]).to(dtype, fp_downcast_rounding="rtz")'),
    ),
    mutant(
        "qnorm.rstd_rounded_to_dtype",
        QNORM,
        FORWARD,
        "rstd rounded to x.dtype (normalizer computed in bf16)",
        (RSQRT, RSQRT + ".to(out.dtype.element_ty).to(tl.float32)"),
    ),
    mutant(
        "qnorm.truncating_store",
        QNORM,
        FORWARD,
        "the rotated lanes are stored truncated (rtz)",
        ("rotated.to(dtype)", 'rotated.to(dtype, fp_downcast_rounding="rtz")'),
    ),
    mutant(
        "qnorm.rotation_on_pass_lanes",
        QNORM,
        FORWARD,
        "the rotated lanes are stored over the leading channels (store offset without D - R); the trailing "
        "channels are never written",
        (
            "tl.store(out_row + rotary_channel, rotated.to(dtype), mask=in_slice)",
            "tl.store(out_row + j, rotated.to(dtype), mask=in_slice)",
        ),
    ),
    mutant(
        "qnorm.pass_channels_not_normalized",
        QNORM,
        FORWARD,
        "pass-through channels copied raw, not normalized",
        (
            "tl.store(out_row[:, :, None] + c, (v * r[:, None, None]).to(dtype),",
            "tl.store(out_row[:, :, None] + c, v.to(dtype),",
        ),
    ),
    mutant(
        "qnorm.boundary2_dropped",
        QNORM,
        BACKWARD,
        "boundary 2 dropped: RMSNorm backward on the FP32 de-rotated gradient",
        ("* sn).to(dtype).to(tl.float32)", "* sn)"),
    ),
    mutant(
        "qnorm.boundary2_moved_past_mean",
        QNORM,
        BACKWARD,
        "boundary 2 moved: the mean uses the FP32 de-rotated gradient, the subtraction the rounded one",
        (
            "    derotated = (g * cs + tl.where(second, negated(g_partner), g_partner) * sn).to(dtype).to(tl.float32)\n"
            "    g = tl.where(rot, derotated, g)\n\n"
            "    mean = tl.sum(g * xhat, axis=1)[:, None] / D\n",
            "    derotated = g * cs + tl.where(second, negated(g_partner), g_partner) * sn\n"
            "    mean = tl.sum(tl.where(rot, derotated, g) * xhat, axis=1)[:, None] / D\n"
            "    g = tl.where(rot, derotated.to(dtype).to(tl.float32), g)\n",
        ),
    ),
    mutant(
        "qnorm.boundary2_truncates",
        QNORM,
        BACKWARD,
        "boundary 2 rounds by truncation (rtz)",
        ("* sn).to(dtype).to(tl.float32)", '* sn).to(dtype, fp_downcast_rounding="rtz").to(tl.float32)'),
    ),
    mutant(
        "qnorm.derotation_on_pass_lanes",
        QNORM,
        BACKWARD,
        "de-rotation applied on every lane (pass-through gradient zeroed)",
        ("g = tl.where(rot, derotated, g)", "g = derotated"),
    ),
    mutant(
        "qnorm.backward_rounds_before_scaling",
        QNORM,
        BACKWARD,
        "backward rounds g' - xhat*mean to x.dtype before scaling by rstd",
        ("(r * (g - xhat * mean)).to(dtype)", "(r * (g - xhat * mean).to(dtype).to(tl.float32)).to(dtype)"),
    ),
    mutant(
        "qnorm.eps_after_sqrt",
        QNORM,
        FORWARD,
        "eps added after the square root: 1/(sqrt(mean) + eps)",
        (RSQRT, f"r = 1.0 / (tl.sqrt({SUM_SQUARES} / D) + EPS)"),
    ),
    mutant(
        "qnorm.eps_outside_mean",
        QNORM,
        FORWARD,
        "eps added to the sum before the division: rsqrt((sum + eps)/D)",
        (RSQRT, f"r = tl.rsqrt(({SUM_SQUARES} + EPS) / D)"),
    ),
    mutant(
        "qnorm.eps_ignored",
        QNORM,
        "_forward",
        "the launcher hard-codes eps=1e-6",
        ("EPS=eps,", "EPS=1e-6,"),
    ),
    mutant(
        "qnorm.mean_over_pass_channels",
        QNORM,
        FORWARD,
        "mean of squares over the D-R pass-through channels only",
        (
            RSQRT,
            "r = tl.rsqrt(tl.sum(tl.reshape(tl.where(c >= D - R, 0.0, v * v), (M, BLOCK)), axis=1) / (D - R) + EPS)",
        ),
    ),
    mutant(
        "qnorm.mean_over_block",
        QNORM,
        FORWARD,
        "sum of squares divided by the padded block width, not D",
        (RSQRT, f"r = tl.rsqrt({SUM_SQUARES} / BLOCK + EPS)"),
    ),
    mutant(
        "qnorm.rstd_head_major",
        QNORM,
        FORWARD,
        "rstd stored (and read back) in head-major row order (b*H + h)*S + s",
        ("tl.store(rstd + row, r, mask=row_ok)", "tl.store(rstd + (b * H + h) * S + s, r, mask=row_ok)"),
        (BACKWARD, "r = tl.load(rstd + row, mask=row_ok)", "r = tl.load(rstd + (b * H + h) * S + s, mask=row_ok)"),
    ),
    mutant(
        "qnorm.rstd_not_stored_for_the_backward",
        QNORM,
        "_forward",
        "the forward skips rstd's store when a backward follows too (the call without autograd's saving)",
        ("STORE_RSTD=with_rstd", "STORE_RSTD=False"),
    ),
    mutant(
        "qnorm.backward_no_mean_term",
        QNORM,
        BACKWARD,
        "backward drops the mean term: dx = r * g'",
        ("(r * (g - xhat * mean))", "(r * g)"),
    ),
    mutant(
        "qnorm.backward_missing_rstd",
        QNORM,
        BACKWARD,
        "backward forgets the outer factor r",
        ("(r * (g - xhat * mean))", "(g - xhat * mean)"),
    ),
    mutant(
        "qnorm.backward_mean_misses_pass",
        QNORM,
        BACKWARD,
        "backward mean over the rotary lanes' products only",
        (
            "mean = tl.sum(g * xhat, axis=1)[:, None] / D",
            "mean = tl.sum(tl.where(rot, g * xhat, 0.0), axis=1)[:, None] / D",
        ),
    ),
    mutant(
        "qnorm.backward_mean_over_block",
        QNORM,
        BACKWARD,
        "backward mean divided by the padded block width, not D",
        ("mean = tl.sum(g * xhat, axis=1)[:, None] / D", "mean = tl.sum(g * xhat, axis=1)[:, None] / BLOCK"),
    ),
    mutant(
        "qnorm.backward_xhat_rounded",
        QNORM,
        BACKWARD,
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
        "_QNormRoPE.save",
        "the output is saved for backward in place of x",
        ("ctx.save_for_backward(x, cos, sin, output[1])", "ctx.save_for_backward(output[0], cos, sin, output[1])"),
    ),
    mutant(
        "qnorm.gradient_read_with_x_strides",
        QNORM,
        "_backward",
        "backward launcher passes x's strides for the gradient",
        ("*x.stride(), *grad.stride(), *cos.stride()", "*x.stride(), *x.stride(), *cos.stride()"),
    ),
    mutant(
        "qnorm.gradient_channel_stride_ignored",
        QNORM,
        BACKWARD,
        "gradient loads assume channel stride 1 (the .sum() gradient has 0)",
        ("[:, None] + c * GD, mask=valid)", "[:, None] + c, mask=valid)"),
    ),
    mutant(
        "qnorm.storage_offset_ignored",
        QNORM,
        "_forward",
        "x's storage offset ignored in the forward",
        (
            "x, cos, sin, out, rstd, rows, seq, heads, dim, rotary,",
            "x.as_strided(x.shape, x.stride(), 0), cos, sin, out, rstd, rows, seq, heads, dim, rotary,",
        ),
    ),
    mutant(
        "qnorm.gradient_offset_ignored",
        QNORM,
        "_backward",
        "the gradient's storage offset ignored in the backward",
        (
            "x, grad, cos, sin, rstd, out, rows, seq,",
            "x, grad.as_strided(grad.shape, grad.stride(), 0), cos, sin, rstd, out, rows, seq,",
        ),
    ),
    mutant(
        "qnorm.head_seq_strides_swapped",
        QNORM,
        FORWARD,
        "forward reads x with head and sequence strides swapped",
        ("x_row = x + (b * XB + h * XH + s * XS)[:, None]", "x_row = x + (b * XB + h * XS + s * XH)[:, None]"),
    ),
    mutant(
        "qnorm.partner_channel_stride_ignored",
        QNORM,
        FORWARD,
        "forward loads the rotary channels (own value and, through swap_pairs, the pair partner) assuming "
        "channel stride 1",
        (
            "own = tl.load(x_row + rotary_channel * XD, mask=in_slice)",
            "own = tl.load(x_row + rotary_channel, mask=in_slice)",
        ),
    ),
    mutant(
        "qnorm.forward_table_channel_stride_ignored",
        QNORM,
        FORWARD,
        "forward reads cos/sin assuming last-dim stride 1",
        ("pair_table(cos, b * CB + s * CS, CD,", "pair_table(cos, b * CB + s * CS, 1,"),
        ("pair_table(sin, b * SB + s * SS, SD,", "pair_table(sin, b * SB + s * SS, 1,"),
    ),
    mutant(
        "qnorm.cos_batch_stride_ignored",
        QNORM,
        FORWARD,
        "forward reads cos/sin without their batch stride (assumes expand)",
        ("pair_table(cos, b * CB + s * CS,", "pair_table(cos, s * CS,"),
        ("pair_table(sin, b * SB + s * SS,", "pair_table(sin, s * SS,"),
    ),
    mutant(
        "qnorm.backward_table_channel_stride_ignored",
        QNORM,
        BACKWARD,
        "backward reads cos/sin assuming last-dim stride 1",
        (Q_BACKWARD_PAIRS, Q_BACKWARD_PAIRS.replace("CS, CD,", "CS, 1,").replace("SS, SD,", "SS, 1,")),
    ),
    mutant(
        "qnorm.channel_mask_long",
        QNORM,
        TILE,
        "channel mask c <= D: the next row's first channel joins the sum",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = row_ok[:, None] & (c >= 0) & (c <= D)"),
    ),
    mutant(
        "qnorm.row_mask_missing",
        QNORM,
        TILE,
        "no row mask on the tile: the last block reads and writes past the tensors",
        ("valid = row_ok[:, None] & (c >= 0) & (c < D)", "valid = (c >= 0) & (c < D) & (row >= 0)[:, None]"),
    ),
    mutant(
        "qnorm.head_major_output",
        QNORM,
        "_outputs",
        "forward output in head-major storage (values right, layout wrong)",
        ("return token_major_empty(x),", "return torch.empty(x.shape, dtype=x.dtype, device=x.device),"),
        (FORWARD, "out_row = out + (row * D)[:, None]", "out_row = out + (((b * H + h) * S + s) * D)[:, None]"),
    ),
    mutant(
        "qnorm.backward_output_like_x",
        QNORM,
        "_backward",
        "backward allocates dx like x (x's strides) and writes it token-major",
        ("out = token_major_empty(x)", "out = torch.empty_like(x)"),
    ),
    mutant(
        "qnorm.rsqrt_as_division",
        QNORM,
        FORWARD,
        "1/sqrt instead of rsqrt",
        (RSQRT, f"r = 1.0 / tl.sqrt({SUM_SQUARES} / D + EPS)"),
        equivalent="the same function: both compute 1/sqrt(z) in FP32; the model allows an approximate rsqrt "
        "(2**-22 relative) and correct rounding of 1/sqrt lies inside that, so no sound test tells them apart.",
    ),
    mutant(
        "qnorm.gradient_not_cast",
        QNORM,
        "_QNormRoPE.backward_inputs",
        "backward passes grad_output without casting it to x.dtype",
        ("return x, grad_output.to(x.dtype), cos,", "return x, grad_output, cos,"),
        equivalent="autograd casts the incoming gradient to the output's dtype (= x.dtype) before calling "
        "backward (the op's registered backward included; under torch.compile the traced gradient has the "
        "output's dtype), so the cast is a no-op on every gradient autograd can deliver.",
    ),
    mutant(
        "qnorm.inference_eps_ignored",
        QNORM,
        "_run",
        "the no-gradient path (inference, decode) launches with eps=1e-6, not the caller's eps",
        (
            "_forward(x, cos, sin, rotary, eps, with_rstd=False)[0]",
            "_forward(x, cos, sin, rotary, 1e-6, with_rstd=False)[0]",
        ),
    ),
    mutant(
        "qnorm.op_eps_ignored",
        QNORM,
        "qnorm_rope",
        "the op dsrope::qnorm_rope (what torch.compile calls) launches with eps=1e-6",
        ("return _forward(x, cos, sin, rotary, eps)", "return _forward(x, cos, sin, rotary, 1e-6)"),
    ),
    mutant(
        "qnorm.backward_op_launches_directly",
        QNORM,
        "_QNormRoPE.backward_op",
        "the op's registered backward calls the launcher, not the backward op (tracing meets the Triton launch)",
        ("return qnorm_rope_backward(*", "return _backward(*"),
    ),
    mutant(
        "qnorm.fake_backward_head_major",
        QNORM,
        "_qnorm_rope_backward_fake",
        "the backward op's fake implementation gives a contiguous head-major dx (the real one is token-major)",
        ("return token_major_empty(x)", "return x.new_empty(x.shape)"),
    ),
    mutant(
        "qnorm.fake_rstd_in_x_dtype",
        QNORM,
        "_qnorm_rope_fake",
        "the forward op's fake implementation gives rstd in x's dtype (the real one is FP32)",
        ("    return _outputs(x)", "    out, rstd = _outputs(x)\n    return out, rstd.to(x.dtype)"),
    ),
    mutant(
        "qnorm.compile_traces_function",
        QNORM,
        "_run",
        "under torch.compile the autograd.Function is called, not the op (dynamo meets the Triton launch)",
        ("return qnorm_rope(x, cos, sin, rotary, eps)[0]", "return _QNormRoPE.apply(x, cos, sin, rotary, eps)"),
    ),
    mutant(
        "qnorm.autograd_only_for_leaves",
        QNORM,
        "_run",
        "the gradient path is taken only for a leaf x: an x computed from parameters loses its gradient",
        ("if wants_autograd(x):", "if x.is_leaf and wants_autograd(x):"),
    ),
    mutant(
        "qnorm.int32_offsets",
        QNORM,
        FORWARD,
        "row index in int32 (forward and backward): offsets wrap past 2**31 elements",
        ("row = tl.program_id(0).to(tl.int64) * M", "row = tl.program_id(0) * M"),
        (BACKWARD, "row = tl.program_id(0).to(tl.int64) * M", "row = tl.program_id(0) * M"),
        gpu_only=True,
    ),
    # the rotation's roundings on the GPU: every launch passes UNFUSED (no multiply-add contraction)
    mutant(
        "qnorm.forward_fused_rotation",
        QNORM,
        "_forward",
        "the forward's launch without enable_fp_fusion=False: the compiler fuses the rotation's products (and the "
        "row sum's squares) into the adds",
        ("        **config, **UNFUSED,", "        **config,"),
    ),
    mutant(
        "qnorm.backward_fused_rotation",
        QNORM,
        "_backward",
        "the backward's launch without enable_fp_fusion=False: the de-rotation's products fused into the adds",
        ("*sin.stride(), **config, **UNFUSED,", "*sin.stride(), **config,"),
    ),
]
