"""Mutants of src/dsrope/rope.py: _rotate, _launch, _PartialRoPE. Each is a realistic fault the suite must
kill."""

from __future__ import annotations

from dsrope_gate.mutation import ROPE, mutant

MUTANTS = [
    mutant(
        "rope.half_split_pairing",
        ROPE,
        "pairs channel j with j + R/2 (rotate_half) instead of (2k, 2k+1)",
        ("second = (j & 1) == 1", "second = j >= ROTARY // 2"),
        ("partner = (j ^ 1) + (DIM - ROTARY)", "partner = (j + ROTARY // 2) % ROTARY + (DIM - ROTARY)"),
        ("    k = j // 2\n", "    k = j % (ROTARY // 2)\n"),
    ),
    mutant(
        "rope.forward_sine_sign",
        ROPE,
        "forward applies the conjugate rotation (sine negated), eager with gradient (_PartialRoPE.forward)",
        (
            "None)\n        return _launch(x, cos, sin, rotary, inverse=False)",
            "None)\n        return _launch(x, cos, sin, rotary, inverse=True)",
        ),
    ),
    mutant(
        "rope.inference_sine_sign",
        ROPE,
        "the no-gradient path (inference, decode) applies the conjugate rotation",
        (
            "    return _launch(x, cos, sin, rotary, inverse=False)\n\n\ndef apply_partial_rope_triton",
            "    return _launch(x, cos, sin, rotary, inverse=True)\n\n\ndef apply_partial_rope_triton",
        ),
    ),
    mutant(
        "rope.op_forward_sine_sign",
        ROPE,
        "the op dsrope::partial_rope (what torch.compile calls) applies the conjugate rotation",
        (
            'checked arguments."""\n    return _launch(x, cos, sin, rotary, inverse=False)',
            'checked arguments."""\n    return _launch(x, cos, sin, rotary, inverse=True)',
        ),
    ),
    mutant(
        "rope.op_backward_sine_sign",
        ROPE,
        "the backward op dsrope::partial_rope_backward applies the forward rotation",
        (
            "return _launch(grad, cos, sin, rotary, inverse=True)",
            "return _launch(grad, cos, sin, rotary, inverse=False)",
        ),
    ),
    mutant(
        "rope.backward_op_calls_forward_op",
        ROPE,
        "the op's registered backward calls the forward op on the gradient",
        (
            "return partial_rope_backward(grad_output, cos, sin, ctx.rotary), None",
            "return partial_rope(grad_output, cos, sin, ctx.rotary), None",
        ),
    ),
    mutant(
        "rope.fake_head_major",
        ROPE,
        "the fake implementation gives a contiguous head-major output (the real one is token-major)",
        (
            "def _token_major_like(x, cos, sin, rotary):\n    return token_major_empty(x)",
            "def _token_major_like(x, cos, sin, rotary):\n    return x.new_empty(x.shape)",
        ),
    ),
    mutant(
        "rope.compile_traces_function",
        ROPE,
        "under torch.compile the autograd.Function is called, not the op (dynamo meets the Triton launch)",
        (
            "if torch.compiler.is_compiling():\n        return partial_rope(x, cos, sin, rotary)",
            "if torch.compiler.is_compiling():\n        return _PartialRoPE.apply(x, cos, sin, rotary)",
        ),
    ),
    mutant(
        "rope.autograd_only_for_leaves",
        ROPE,
        "the gradient path is taken only for a leaf x: an x computed from parameters loses its gradient",
        (
            "    if wants_autograd(x):\n        return _PartialRoPE",
            "    if x.is_leaf and wants_autograd(x):\n        return _PartialRoPE",
        ),
    ),
    mutant(
        "rope.backward_sine_sign",
        ROPE,
        "backward applies the forward rotation instead of its conjugate",
        (
            "_launch(grad_output, cos, sin, ctx.rotary, inverse=True)",
            "_launch(grad_output, cos, sin, ctx.rotary, inverse=False)",
        ),
    ),
    mutant(
        "rope.sign_on_wrong_lane",
        ROPE,
        "the partner's sign on the wrong lane: a*c + b*s, b*c - a*s",
        ("tl.where(second, p, -p)", "tl.where(second, -p, p)"),
    ),
    mutant(
        "rope.one_sign_slip",
        ROPE,
        "first output of a pair a*c + b*s (sign slip in one formula)",
        ("tl.where(second, p, -p)", "tl.where(second, p, p)"),
    ),
    mutant(
        "rope.partner_next_channel",
        ROPE,
        "every lane takes the next channel as its partner (parity ignored)",
        ("partner = (j ^ 1) + (DIM - ROTARY)", "partner = (j + 1) + (DIM - ROTARY)"),
    ),
    mutant(
        "rope.leading_channels",
        ROPE,
        "rotates the leading R channels and copies the trailing D-R",
        ("j = c - (DIM - ROTARY)", "j = c"),
        ("rot = valid & (j >= 0)", "rot = valid & (j < ROTARY)"),
        ("partner = (j ^ 1) + (DIM - ROTARY)", "partner = j ^ 1"),
    ),
    mutant(
        "rope.rotary_start_off_by_one",
        ROPE,
        "rotary lanes start at D-R+1: the first rotary channel is copied",
        ("rot = valid & (j >= 0)", "rot = valid & (j > 0)"),
    ),
    mutant(
        "rope.rotation_on_pass_lanes",
        ROPE,
        "the rotation result is stored on every lane, pass-through included",
        ("result = tl.where(rot, rotated.to(out.dtype.element_ty), v)", "result = rotated.to(out.dtype.element_ty)"),
    ),
    mutant(
        "rope.head_seq_strides_swapped",
        ROPE,
        "x's head and sequence strides swapped",
        ("h * XH + s * XS", "h * XS + s * XH"),
    ),
    mutant(
        "rope.channel_stride_ignored",
        ROPE,
        "x loads assume channel stride 1",
        ("v = tl.load(x_row + c * XD, mask=valid)", "v = tl.load(x_row + c, mask=valid)"),
    ),
    mutant(
        "rope.partner_channel_stride_ignored",
        ROPE,
        "the pair partner is loaded assuming channel stride 1",
        ("p = tl.load(x_row + partner * XD, mask=rot)", "p = tl.load(x_row + partner, mask=rot)"),
    ),
    mutant(
        "rope.contiguous_strides_assumed",
        ROPE,
        "launcher passes the strides of a contiguous x (slices ignored)",
        ("*x.stride(), *cos.stride(), *sin.stride(),", "*x.contiguous().stride(), *cos.stride(), *sin.stride(),"),
    ),
    mutant(
        "rope.cos_batch_stride_ignored",
        ROPE,
        "cos read without its batch stride (assumes expand)",
        ("tl.load(cos + (b * CB + s * CS)", "tl.load(cos + (s * CS)"),
    ),
    mutant(
        "rope.sin_read_with_cos_strides",
        ROPE,
        "sin read through cos's strides",
        ("sin + (b * SB + s * SS)[:, None] + k * SD", "sin + (b * CB + s * CS)[:, None] + k * CD"),
    ),
    mutant(
        "rope.table_channel_stride_ignored",
        ROPE,
        "cos's last-dim stride assumed 1",
        ("[:, None] + k * CD, mask=rot)", "[:, None] + k, mask=rot)"),
    ),
    mutant(
        "rope.table_index_per_channel",
        ROPE,
        "lane j reads table entry j (a repeat-interleaved [R] table), not pair j // 2",
        ("    k = j // 2\n", "    k = j\n"),
    ),
    mutant(
        "rope.cos_sin_swapped",
        ROPE,
        "launcher passes sin as cos and cos as sin",
        (
            "x, cos, sin, out, rows, seq, heads, dim, rotary,\n        *x.stride(), *cos.stride(), *sin.stride(),",
            "x, sin, cos, out, rows, seq, heads, dim, rotary,\n        *x.stride(), *sin.stride(), *cos.stride(),",
        ),
    ),
    mutant(
        "rope.table_rounded_to_dtype",
        ROPE,
        "cos/sin rounded to x.dtype before the rotation (table precision)",
        ("k * CD, mask=rot)\n", "k * CD, mask=rot).to(x.dtype.element_ty).to(tl.float32)\n"),
        ("k * SD, mask=rot)\n", "k * SD, mask=rot).to(x.dtype.element_ty).to(tl.float32)\n"),
    ),
    mutant(
        "rope.storage_offset_ignored",
        ROPE,
        "x's storage offset ignored (base of its storage read)",
        (
            "x, cos, sin, out, rows, seq, heads, dim, rotary,",
            "x.as_strided(x.shape, x.stride(), 0), cos, sin, out, rows, seq, heads, dim, rotary,",
        ),
    ),
    mutant(
        "rope.table_offset_ignored",
        ROPE,
        "cos/sin storage offsets ignored",
        (
            "x, cos, sin, out, rows, seq, heads, dim, rotary,",
            "x, cos.as_strided(cos.shape, cos.stride(), 0), sin.as_strided(sin.shape, sin.stride(), 0), out, "
            "rows, seq, heads, dim, rotary,",
        ),
    ),
    mutant(
        "rope.channel_mask_short",
        ROPE,
        "channel mask c < D-1: the last channel is never written",
        ("valid = row_ok[:, None] & (c < DIM)", "valid = row_ok[:, None] & (c < DIM - 1)"),
    ),
    mutant(
        "rope.channel_mask_long",
        ROPE,
        "channel mask c <= D: one lane past the row (writes past the output)",
        ("valid = row_ok[:, None] & (c < DIM)", "valid = row_ok[:, None] & (c <= DIM)"),
    ),
    mutant(
        "rope.row_mask_missing",
        ROPE,
        "no row mask: the last block reads and writes past the tensors",
        ("valid = row_ok[:, None] & (c < DIM)", "valid = (c < DIM) & (row >= 0)[:, None]"),
    ),
    mutant(
        "rope.truncating_store",
        ROPE,
        "the rotated lanes are stored truncated (rtz), not rounded to nearest even",
        ("rotated.to(out.dtype.element_ty)", 'rotated.to(out.dtype.element_ty, fp_downcast_rounding="rtz")'),
    ),
    mutant(
        "rope.head_major_output",
        ROPE,
        "output in head-major [B, H, S, D] storage (values right, layout wrong)",
        ("out = token_major_empty(x)", "out = torch.empty(x.shape, dtype=x.dtype, device=x.device)"),
        ("out_row = out + (row * DIM)[:, None]", "out_row = out + (((b * HEADS + h) * SEQUENCE + s) * DIM)[:, None]"),
    ),
    mutant(
        "rope.grid_floor",
        ROPE,
        "grid rows // M: the last partial block is never launched",
        ('_rotate[(triton.cdiv(rows, config["M"]),)]', '_rotate[(rows // config["M"],)]'),
    ),
    mutant(
        "rope.pass_through_via_fp32",
        ROPE,
        "pass-through lanes stored from the FP32 upcast instead of the loaded value",
        (
            "result = tl.where(rot, rotated.to(out.dtype.element_ty), v)",
            "result = tl.where(rot, rotated, a).to(out.dtype.element_ty)",
        ),
        equivalent="bf16/fp16/fp32 -> fp32 is exact and the way back rounds an exactly representable value "
        "to itself (NaN stays NaN), so every pass-through lane stores the same bits; the rotary lanes "
        "are rounded once either way.",
    ),
    mutant(
        "rope.int32_offsets",
        ROPE,
        "row index (hence row*D, s*XS) in int32: wraps past 2**31 elements",
        ("row = tl.program_id(0).to(tl.int64) * M + tl.arange(0, M)", "row = tl.program_id(0) * M + tl.arange(0, M)"),
        gpu_only=True,
    ),
    # in place (issue 27): _rotate_inplace, _launch_inplace, _PartialRoPEInplace, apply_partial_rope_triton_
    mutant(
        "rope.inplace_leading_channels",
        ROPE,
        "in place: rotates the leading R channels instead of the trailing ones",
        ("own_channel = lane + (DIM - ROTARY)", "own_channel = lane"),
    ),
    mutant(
        "rope.inplace_lane_mask_dropped",
        ROPE,
        "in place: no lane < ROTARY mask: with R not a power of two the padded lanes write past the row's channels",
        ("lane_ok = row_ok[:, None] & (lane < ROTARY)", "lane_ok = row_ok[:, None] & (lane < BLOCK)"),
    ),
    mutant(
        "rope.inplace_partner_is_self",
        ROPE,
        "in place: each lane's pair partner is itself",
        ("mate = swap_pairs(own, M, BLOCK)", "mate = own"),
    ),
    mutant(
        "rope.inplace_sign_on_wrong_lane",
        ROPE,
        "in place: the partner's sign on the other lane (rotation by the conjugate angle)",
        ("tl.where(odd, mate, -mate)", "tl.where(odd, -mate, mate)"),
    ),
    mutant(
        "rope.inplace_table_batch_stride_ignored",
        ROPE,
        "in place: cos/sin read without their batch stride (right only for an expanded table)",
        ("cos, position * CS + batch * CB, CD", "cos, position * CS, CD"),
        ("sin, position * SS + batch * SB, SD", "sin, position * SS, SD"),
    ),
    mutant(
        "rope.inplace_channel_stride_ignored",
        ROPE,
        "in place: the store assumes channel stride 1",
        ("tl.store(x_row + own_channel * XD,", "tl.store(x_row + own_channel,"),
    ),
    mutant(
        "rope.inplace_not_marked_dirty",
        ROPE,
        "in place: x not marked dirty: a tensor autograd saved before the call is used changed, silently",
        ("        ctx.mark_dirty(x)\n", ""),
    ),
    mutant(
        "rope.inplace_overlap_not_checked",
        ROPE,
        "in place: stride-0 and overlapping x accepted (a write changes other elements too)",
        ("    check_x(x, even_channels=True)\n    check_writable(x)\n", "    check_x(x, even_channels=True)\n"),
    ),
    mutant(
        "rope.inplace_int32_offsets",
        ROPE,
        "in place: 32-bit row offsets (wrap past 2**31 elements)",
        ("(tile % head_blocks) * GROUP + i % GROUP).to(tl.int64)", "(tile % head_blocks) * GROUP + i % GROUP)"),
        ("token = (tile // head_blocks).to(tl.int64) * (M // GROUP)", "token = (tile // head_blocks) * (M // GROUP)"),
        ("lane = tl.arange(0, BLOCK).to(tl.int64)[None, :]", "lane = tl.arange(0, BLOCK)[None, :]"),
        gpu_only=True,
    ),
    mutant(
        "rope.inplace_head_mask_dropped",
        ROPE,
        "in place: no head < HEADS mask: a partial head block rotates the next token's first heads a second time",
        ("row_ok = (head < HEADS) & (token < tokens)", "row_ok = token < tokens"),
    ),
    mutant(
        "rope.inplace_tile_token_stride",
        ROPE,
        "in place: a tile of GROUP heads steps M tokens instead of M // GROUP (tokens skipped, rows left unrotated)",
        ("token = (tile // head_blocks).to(tl.int64) * (M // GROUP)", "token = (tile // head_blocks).to(tl.int64) * M"),
    ),
    mutant(
        "rope.inplace_partial_head_block",
        ROPE,
        "in place: head blocks counted rounding down: with H not a multiple of GROUP the last heads are not rotated",
        ("head_blocks: tl.constexpr = (HEADS + GROUP - 1) // GROUP", "head_blocks: tl.constexpr = HEADS // GROUP"),
    ),
]
