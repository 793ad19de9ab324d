"""Mutation gate: a catalog of realistic kernel faults, each of which the suite must kill.

Each mutant is a named set of exact text replacements in one source file. Every `old` text must
occur exactly once in the file, so a refactor that moves the code makes the mutant fail loudly
(STALE) instead of silently testing nothing.

For each mutant the runner copies the tree (git's tracked and untracked-not-ignored files) into a
scratch directory, applies the edit there and runs the suite on that copy, with the copy's src/
and root first on the path and every path into the real checkout (an editable install's .pth, for
one) removed, so the copy's code is what runs; a canary planted in a copy proves it before any
mutant runs, and the unmutated copy must pass the whole suite first (the baseline). A run has two
stages: tests/test_mutant_guards.py and the mutated file's own test module, then, only if those
pass, every other test module (tests/test_properties.py last). Killed: a test failed. Survived:
the whole suite passed. Broken (a collection or import error) and crashed (pytest died of a
signal, e.g. after a write past a buffer) are not kills. On CPU each pytest run is a child
forked from a parent that imported torch and triton once (`--no-fork` starts fresh interpreters
instead); on CUDA every run starts fresh.

    python tools/mutants.py              # CPU: every CPU mutant against the whole CPU suite
    python tools/mutants.py --gpu        # CUDA: the GPU-only mutants against the gpu-marked tests
    python tools/mutants.py --gpu --all  # CUDA: every mutant against the whole suite
    python tools/mutants.py --list | --check | --only NAME,NAME [--tests MODULE,MODULE]

Kinds of entry: a CPU mutant must be killed by the CPU suite; a GPU-only mutant (marked gpu) is a
fault only a GPU can reveal (32-bit offsets past 2**31 elements) and must be killed by the
gpu-marked tests; an equivalent mutant carries the argument why it does not change the function,
is listed, and is neither run nor counted (`--equivalent` runs them, to show they survive).

Exit status: 0 when every counted mutant is killed; 1 when one survived, broke or crashed,
when the unmutated copy fails, or when an edit is stale. The table and a JSON record go to
out/mutants/.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROPE = "src/dsrope/rope.py"
QNORM = "src/dsrope/qnorm_rope.py"
UTILS = "src/dsrope/rope_utils.py"
COMMON = "src/dsrope/_common.py"


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


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    what: str
    edits: tuple[tuple[str, str], ...]
    gpu_only: bool = False
    equivalent: str = ""  # why the edit does not change the function; such mutants are not counted


def mutant(name, file, what, *edits, gpu_only=False, equivalent=""):
    return Mutant(name, file, what, tuple(edits), gpu_only, equivalent)


CATALOG = [
    # ---- src/dsrope/rope.py: _rotate, _launch, _PartialRoPE --------------------------------------
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
        ("def _token_major_like(x, cos, sin, rotary):\n    return token_major_empty(x)",
         "def _token_major_like(x, cos, sin, rotary):\n    return x.new_empty(x.shape)"),
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
    # ---- src/dsrope/qnorm_rope.py: _row_tile, _qnorm_rope, _qnorm_rope_backward, launchers ------
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
        ("return _forward(x, cos, sin, rotary, float(eps))[0]", "return _forward(x, cos, sin, rotary, 1e-6)[0]"),
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
        ("return qnorm_rope(x, cos, sin, rotary, eps)[0]", "return _QNormRoPE.apply(x, cos, sin, rotary, float(eps))"),
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
        "common.forward_ad_ignored",
        COMMON,
        "the eager fast path takes a dual tensor (forward-mode AD): its tangent is silently dropped",
        (
            "    return (x.requires_grad and torch.is_grad_enabled()) or torch.autograd.forward_ad._current_level >= 0",
            "    return x.requires_grad and torch.is_grad_enabled()",
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
    # ---- src/dsrope/_common.py: swap_pairs, pair_table (QNorm backward), token_major_empty (all) --
    mutant(
        "common.swap_pairs_unswapped",
        COMMON,
        "swap_pairs joins the halves back in order, join(first, second): the tile comes back unswapped and "
        "every lane is its own partner",
        ("tl.join(second, first)", "tl.join(first, second)"),
    ),
    mutant(
        "common.swap_pairs_second_kept",
        COMMON,
        "swap_pairs joins (second, second): the first lane gets its partner, the second lane itself",
        ("tl.join(second, first)", "tl.join(second, second)"),
    ),
    mutant(
        "common.pair_table_first_off_by_one",
        COMMON,
        "pair_table counts pairs from FIRST - 1: every rotary pair gets the next pair's entry, the last 0",
        ("[None, :] - FIRST", "[None, :] - FIRST + 1"),
    ),
    mutant(
        "common.pair_table_second_lane_next_entry",
        COMMON,
        "pair_table gives the second lane of pair k entry k + 1 (per-lane indexing slip; 0 past the last pair)",
        (
            "    return tl.reshape(tl.join(entry, entry), (M, BLOCK))",
            "    k1 = k + 1\n"
            "    nxt = tl.load(table + row_offset[:, None] + k1 * stride, "
            "mask=row_ok[:, None] & (k1 >= 0) & (k1 < PAIRS), other=0.0)\n"
            "    return tl.reshape(tl.join(entry, nxt), (M, BLOCK))",
        ),
    ),
    mutant(
        "common.pair_table_no_other",
        COMMON,
        "pair_table's masked loads without other=0.0 (masked lanes undefined)",
        ("(k < PAIRS), other=0.0)", "(k < PAIRS))"),
        equivalent="pair_table's one user is the QNorm backward. A lane where pair_table's mask is off is in a "
        "row past `rows` (every store of that row is masked and the row sums are per row) or outside "
        "0 <= k < R/2, which holds only off the rotary lanes (a rotary lane has k = (c - (D - R)) // 2 in "
        "[0, R/2)); there the backward keeps the unrotated gradient with tl.where(rot, derotated, g), a select "
        "that never reads the other operand's value, and the load itself touches no memory on a masked lane.",
    ),
    mutant(
        "common.token_major_empty_head_major",
        COMMON,
        "token_major_empty gives contiguous head-major [B, H, S, D] strides (same storage size; the kernels "
        "write token-major rows)",
        (
            "(max(s, 1) * stride_s, stride_h, stride_s, 1)",
            "(max(s, 1) * stride_s, max(s, 1) * stride_h, stride_h, 1)",
        ),
    ),
    # ---- src/dsrope/rope_utils.py: frequencies, tables, pairings, q/k with cu_seqlens and cp ------
    mutant(
        "utils.half_split_halves_swapped",
        UTILS,
        "half-split takes the second half as a and the first as b",
        ("a, b = xf[..., :half], xf[..., half:]", "b, a = xf[..., :half], xf[..., half:]"),
    ),
    mutant(
        "utils.half_split_pairs_adjacent",
        UTILS,
        "apply_rotary_emb_half_split pairs adjacent channels (2j, 2j+1)",
        ("a, b = xf[..., :half], xf[..., half:]", "a, b = xf[..., 0::2], xf[..., 1::2]"),
    ),
    mutant(
        "utils.half_split_sine_sign",
        UTILS,
        "half-split rotates by the conjugate angle",
        (
            "torch.cat((a * cos - b * sin, a * sin + b * cos), -1)",
            "torch.cat((a * cos + b * sin, b * cos - a * sin), -1)",
        ),
    ),
    mutant(
        "utils.eager_interleaved_pairs_halves",
        UTILS,
        "the eager interleaved path pairs (j, j + d/2) (rotate_half)",
        (
            "x.float().reshape(*x.shape[:-1], -1, 2).contiguous()",
            "x.float().reshape(*x.shape[:-1], 2, -1).transpose(-1, -2).contiguous()",
        ),
    ),
    mutant(
        "utils.kernel_table_real_imag_swapped",
        UTILS,
        "the cached-table path passes sin as cos (real/imag swapped)",
        (
            "cos, sin = table.real, table.imag\n        return _kernel(",
            "cos, sin = table.imag, table.real\n        return _kernel(",
        ),
    ),
    mutant(
        "utils.kernel_conjugate_table",
        UTILS,
        "the cached-table path rotates by the conjugate (sine negated)",
        (
            "torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))\n    # Eager",
            "torch.cat((cos, cos), -1), torch.cat((-sin, -sin), -1))\n    # Eager",
        ),
    ),
    mutant(
        "utils.trainable_table_through_kernel",
        UTILS,
        "a trainable table is sent to the kernel (no gradient reaches it)",
        ("return on_kernel_device and not table.requires_grad", "return on_kernel_device"),
    ),
    mutant(
        "utils.frequency_index_off_by_one",
        UTILS,
        "inverse frequencies start at theta**(-2/d) instead of 1",
        ("torch.arange(0, dim, 2, dtype=dtype)", "torch.arange(2, dim + 2, 2, dtype=dtype)"),
    ),
    mutant(
        "utils.yarn_ramp_off_by_one",
        UTILS,
        "the YaRN ramp starts one channel early: (j - low + 1) / (high - low)",
        ("(torch.arange(dim // 2, dtype=dtype) - low)", "(torch.arange(dim // 2, dtype=dtype) - low + 1)"),
    ),
    mutant(
        "utils.yarn_low_rounded_up",
        UTILS,
        "the ramp's low end rounded up (ceil) instead of down",
        ("low = max(math.floor(_correction_dim(", "low = max(math.ceil(_correction_dim("),
    ),
    mutant(
        "utils.yarn_high_rounded_down",
        UTILS,
        "the ramp's high end rounded down (floor) instead of up",
        ("high = min(math.ceil(_correction_dim(", "high = min(math.floor(_correction_dim("),
    ),
    mutant(
        "utils.yarn_ramp_inverted",
        UTILS,
        "YaRN divides the high-frequency channels by factor instead of the low ones",
        (
            "freqs = freqs / factor * (1 - smooth) + freqs * smooth",
            "freqs = freqs * (1 - smooth) + freqs / factor * smooth",
        ),
    ),
    mutant(
        "utils.yarn_at_original_length",
        UTILS,
        "YaRN applied when max_seq_len equals the original length",
        ("max_seq_len > yarn[3]", "max_seq_len >= yarn[3]"),
    ),
    mutant(
        "utils.angle_in_fp64",
        UTILS,
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
        "positions past 2**24 enter the angle unrounded (fl32(p * f), not fl32(fl32(p) * f))",
        (
            "angle = positions.to(torch.float32)[..., None] * freqs",
            "angle = positions.to(torch.float64)[..., None] * freqs.double()",
        ),
    ),
    mutant(
        "utils.fp64_frequencies_by_default",
        UTILS,
        "the default frequencies computed in FP64 and rounded once (the old, more accurate table)",
        (
            'dtype = torch.float64 if _check_bool("fp64", fp64) else torch.float32',
            'dtype = torch.float64 if _check_bool("fp64", fp64) or True else torch.float32',
        ),
    ),
    mutant(
        "utils.fp64_cos_sin_by_default",
        UTILS,
        "the default cos and sin evaluated in FP64 and rounded once (the old, more accurate table)",
        ("angle = angle.to(torch.float64 if fp64 else torch.float32)", "angle = angle.to(torch.float64)"),
    ),
    mutant(
        "utils.frequencies_negative_power",
        UTILS,
        "inverse frequencies as theta ** (-2j / d) instead of upstream's 1 / theta ** (2j / d)",
        (
            "freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=dtype) / dim))",
            "freqs = theta ** (-torch.arange(0, dim, 2, dtype=dtype) / dim)",
        ),
    ),
    mutant(
        "utils.yarn_blend_regrouped",
        UTILS,
        "the YaRN blend regrouped as freqs * (smooth + (1 - smooth) / factor) (equal in exact arithmetic)",
        (
            "freqs = freqs / factor * (1 - smooth) + freqs * smooth",
            "freqs = freqs * (smooth + (1 - smooth) / factor)",
        ),
    ),
    mutant(
        "utils.yarn_interpolation_as_transformers",
        UTILS,
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
        "cos and sin from torch.cos / torch.sin (torch's vectorized FP32 ones) instead of upstream's torch.polar",
        (
            "return torch.polar(torch.ones_like(angle), angle).to(torch.complex64)",
            "return torch.complex(torch.cos(angle), torch.sin(angle)).to(torch.complex64)",
        ),
    ),
    mutant(
        "utils.cp_mirror_off_by_one",
        UTILS,
        "context parallelism: the mirrored chunk is 2*cp - rank instead of 2*cp - 1 - rank",
        ("mirror = 2 * cp_size - 1 - cp_rank", "mirror = 2 * cp_size - 2 - cp_rank"),
    ),
    mutant(
        "utils.thd_positions_continue",
        UTILS,
        "packed thd sequences: positions run on across cu_seqlens instead of restarting",
        (
            "rows = torch.cat([_shard_positions(n, cp_size, cp_rank) for n in lengths]).to(q.device)",
            "rows = _shard_positions(sum(lengths), cp_size, cp_rank).to(q.device)",
        ),
    ),
    mutant(
        "utils.mscale_ignored",
        UTILS,
        "yarn_get_mscale ignores mscale",
        ("return 0.1 * mscale * math.log(scale) + 1.0", "return 0.1 * math.log(scale) + 1.0"),
    ),
    mutant(
        "utils.mscale_boundary",
        UTILS,
        "yarn_get_mscale returns the formula at scale == 1 too",
        ("if scale <= 1:", "if scale < 1:"),
        equivalent="at scale == 1 the formula gives 0.1 * mscale * ln(1) + 1 = 1.0 exactly (ln(1) is exactly 0 "
        "and mscale is finite), the same value as the early return.",
    ),
]

# Test files that exercise each source file: run first, so a mutant dies early.
HOME = {
    ROPE: ("test_rope.py", "test_custom_ops.py"),
    QNORM: ("test_qnorm_rope.py", "test_custom_ops.py"),
    UTILS: ("test_rope_utils.py", "test_vs_transformers_tables.py"),
    COMMON: ("test_qnorm_rope.py",),  # swap_pairs, pair_table: QNorm backward only; token_major_empty: all
}
FIRST = ("test_mutant_guards",)  # small and fast, runs before everything
LAST = ("test_properties",)  # hypothesis over many shapes: the slowest module, runs after everything


def catalog() -> list[Mutant]:
    names = [m.name for m in CATALOG]
    assert len(set(names)) == len(names), "duplicate mutant names"
    return CATALOG


# ---- applying ---------------------------------------------------------------------------------


class Stale(Exception):
    pass


def mutated_text(m: Mutant, text: str) -> str:
    for old, new in m.edits:
        n = text.count(old)
        if n != 1:
            raise Stale(f"{m.name}: {old!r} occurs {n} times in {m.file} (expected exactly once)")
        text = text.replace(old, new)
    return text


def tree_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = [f for f in out.split("\0") if f and not f.startswith(".nox/")]
    return sorted({f for f in files if (ROOT / f).is_file()})


def copy_tree(dest: Path, files: list[str]) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, target)


def test_files(scratch: Path, first: tuple[str, ...]) -> list[str]:
    """Every test module the gate collects (tests/test_*.py, tests/*_test.py), the given prefixes first."""
    names = sorted(
        {p.name for p in (scratch / "tests").glob("test_*.py")}
        | {p.name for p in (scratch / "tests").glob("*_test.py")}
    )
    rank = lambda n: next(
        (i for i, p in enumerate(first) if n.startswith(p)), len(first) + 1 if n.startswith(LAST) else len(first)
    )
    return [f"tests/{n}" for n in sorted(names, key=lambda n: (rank(n), n))]


def scratch_env(scratch: Path, gpu: bool) -> dict:
    env = dict(os.environ)
    # The scratch src first; drop any path to the real checkout's src so it cannot shadow the copy.
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT / "src"]
    env["PYTHONPATH"] = os.pathsep.join([str(scratch / "src"), str(scratch), *keep])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if gpu:
        env["TRITON_INTERPRET"] = "0"
        env.setdefault("HYPOTHESIS_PROFILE", "gpu")
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# ---- running ----------------------------------------------------------------------------------


@dataclass
class Result:
    mutant: Mutant | None
    status: str  # killed | survived | broken | crashed | stale | timeout
    seconds: float = 0.0
    killer: str = ""
    reason: str = ""
    ran: int = 0
    log: str = ""


def parse_junit(path: Path):
    """(tests ran, failures as [(nodeid, first message line, is_collection_error)])."""
    if not path.exists():
        return 0, []
    ran, failed = 0, []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is None:
            ran += 1
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            cls, name = case.get("classname", ""), case.get("name", "")
            node = f"{cls.replace('.', '/')}.py::{name}" if cls else name
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            collection = not cls or "collection failure" in (bad.get("message") or "")
            failed.append((node, message[0][:160] if message else "", collection))
    return ran, failed


# Fork mode (CPU): the parent imports these third-party modules once; each pytest run is a forked
# child that imports dsrope, reference and tests fresh from its scratch copy. Starting torch and
# triton is most of the cost of a short run, so this halves the gate's time on two cores.
PRELOAD = ("torch", "triton", "triton.language", "numpy", "ml_dtypes", "mpmath", "hypothesis", "pytest", "safetensors")
OWN = ("dsrope", "reference", "tests", "conftest", "tools", "golden")


def warm_up() -> None:
    os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(n for n in sys.modules if n.split(".")[0] in OWN)
    assert not leaked, f"project modules imported before the fork would shadow the scratch copy: {leaked}"


def outside_checkout(p: str) -> bool:
    return bool(p) and not Path(p).resolve().is_relative_to(ROOT)


def in_child(scratch: Path, gpu: bool, log_path: Path, run) -> None:
    """Forked child: the scratch copy's env, cwd and sys.path, output to the log; never returns."""
    code = 70
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(scratch_env(scratch, gpu))
        sys.path[:] = [str(scratch / "src"), str(scratch)] + [p for p in sys.path if outside_checkout(p)]
        code = int(run())
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def fork_and_wait(scratch: Path, gpu: bool, log_path: Path, run, timeout: float) -> int | None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        in_child(scratch, gpu, log_path, run)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


def run_pytest(scratch: Path, args, files: list[str], log_path: Path, junit: Path, workers, fork: bool) -> int | None:
    """One pytest run in the scratch copy; None when it hangs past the timeout."""
    argv = ["-x", "-q", "-p", "no:cacheprovider", "-n", str(workers), f"--junitxml={junit}"]
    if args.gpu and not args.all:
        argv += ["-m", "gpu"]
    for node in args.deselect:
        argv += ["--deselect", node]
    argv += files
    with open(log_path, "a") as log:
        log.write(("forked: pytest " if fork else "pytest ") + " ".join(argv) + "\n")
    if fork:
        import pytest

        return fork_and_wait(scratch, args.gpu, log_path, lambda: pytest.main(argv), args.timeout)
    with open(log_path, "a") as log:
        try:
            return subprocess.run(
                [sys.executable, "-m", "pytest", *argv],
                cwd=scratch,
                env=scratch_env(scratch, args.gpu),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=args.timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            return None


def run_suite(scratch: Path, args, home: tuple[str, ...], log_path: Path, workers=None, fork=None) -> Result:
    """The whole suite on the scratch copy, in two stages: the guards and the mutated file's own
    tests first, then every other test module, run only if the first stage passed. Survived: every
    test passed. Killed: a test failed. Not kills: `broken` (a collection or import error) and
    `crashed` (pytest died of a signal): the mutant must fail a test."""
    workers = args.workers if workers is None else workers
    fork = args.fork if fork is None else fork
    files = test_files(scratch, FIRST + home)
    if args.tests:  # a partial run: only these modules (substrings of names) and node ids (with ::)
        wanted = args.tests.split(",")
        nodes = [t for t in wanted if "::" in t]
        files = [f for f in files if any(t in Path(f).name for t in wanted if "::" not in t)] + nodes
    first = sum(any(Path(f).name.startswith(p) for p in FIRST + home) for f in files)
    stages = [files[:first], files[first:]] if 0 < first < len(files) else [files]
    result = Result(None, "survived", log=str(log_path))
    log_path.write_text("")
    for i, stage in enumerate(stages):
        junit = scratch / f"junit-{i}.xml"
        start = time.monotonic()
        rc = run_pytest(scratch, args, stage, log_path, junit, workers, fork)
        result.seconds += time.monotonic() - start
        ran, failed = parse_junit(junit)
        result.ran += ran
        if rc is None:
            result.status, result.reason = "timeout", f"no result within {args.timeout}s (the gate would hang)"
        elif rc == 0 or (rc == 5 and not failed):  # 5: this stage selected no test (e.g. -m gpu)
            continue
        elif rc < 0:
            # e.g. heap corruption from a write past a buffer: whether it crashes is luck, so a
            # crash is no kill; the suite needs a test that fails on the fault every time
            result.status, result.reason = "crashed", f"pytest died of signal {-rc}"
            result.killer = failed[0][0] if failed else ""
        elif failed and not any(collection for _, _, collection in failed):
            result.status, (result.killer, result.reason, _) = "killed", failed[0]
        else:
            result.status = "broken"
            result.reason = f"pytest exit {rc}: " + (failed[0][1] if failed else "no test failure recorded")
            result.killer = failed[0][0] if failed else ""
        return result
    if result.ran == 0:
        result.status, result.reason = "broken", "no test ran"
    return result


def canary_check(scratch: Path, args) -> str:
    """Prove that the scratch copy's dsrope is what runs, the same way the mutants run: plant a
    marker in the copy and import it."""
    marker = uuid.uuid4().hex
    init = scratch / "src" / "dsrope" / "__init__.py"
    original = init.read_text()
    init.write_text(original + f"\n_MUTANTS_CANARY = {marker!r}\n")
    probe = "import dsrope; print(dsrope.__file__); print(getattr(dsrope, '_MUTANTS_CANARY', None))"
    log = scratch / "canary.log"
    try:
        if args.fork:
            fork_and_wait(scratch, args.gpu, log, lambda: exec(probe) or 0, 300)
        else:
            with open(log, "w") as out:
                subprocess.run(
                    [sys.executable, "-c", probe],
                    cwd=scratch,
                    env=scratch_env(scratch, args.gpu),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=300,
                )
    finally:
        init.write_text(original)
    lines = log.read_text().split()
    if len(lines) < 2 or lines[-1] != marker or not Path(lines[-2]).is_relative_to(scratch):
        sys.exit(f"canary: the scratch copy's dsrope does not run: {log.read_text()[-2000:]}")
    return lines[-2]


def run_mutant(m: Mutant) -> Result:
    args, files, base = JOB["args"], JOB["files"], JOB["base"]
    scratch = base / m.name
    copy_tree(scratch, files)
    target = scratch / m.file
    try:
        target.write_text(mutated_text(m, target.read_text()))
    except Stale as e:
        return Result(m, "stale", reason=str(e))
    result = run_suite(scratch, args, HOME.get(m.file, ()), base / f"{m.name}.log")
    result.mutant = m
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


JOB: dict = {}  # the run's arguments, set before the pool forks its workers


def counted(m: Mutant, args) -> bool:
    if m.equivalent:
        return False
    return m.gpu_only == args.gpu or (args.gpu and args.all)


def table(results: list[Result], skipped: list[Mutant]) -> str:
    rows = ["| # | fault | file | result | time (s) | killing test |", "| --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(results, 1):
        note = f"`{r.killer}`" if r.killer else ""
        if r.status != "killed" or not r.reason.startswith("AssertionError"):
            note = f"{note} {r.reason[:90]}".strip().replace("|", "/")
        if r.mutant.equivalent:
            note = f"equivalent, run on request: {note}"
        rows.append(
            f"| {i} | {r.mutant.name}: {r.mutant.what} | {Path(r.mutant.file).name} | {r.status} | "
            f"{r.seconds:.1f} | {note} |"
        )
    for m in skipped:
        where = "GPU-only: `nox -s gpu-mutants` on CUDA" if m.gpu_only else "CPU mutant: `nox -s mutants`"
        why = f"equivalent: {m.equivalent}" if m.equivalent else where
        rows.append(f"| - | {m.name}: {m.what} | {Path(m.file).name} | not run | - | {why} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="CUDA mode: GPU-only mutants against the gpu-marked tests")
    p.add_argument("--all", action="store_true", help="with --gpu: every mutant against the whole suite on CUDA")
    p.add_argument("--only", help="comma-separated substrings of mutant names")
    p.add_argument(
        "--tests",
        help="comma-separated substrings of test module names, or pytest node ids (path::test): run only "
        "those (a partial run: shows that a given test kills a mutant, e.g. --only rope.forward_sine_sign "
        "--tests tests/test_vs_eager.py::test_partial_rope_matches_eager_rotation)",
    )
    p.add_argument("--equivalent", action="store_true", help="also run the equivalent mutants (not counted)")
    p.add_argument("--list", action="store_true", help="print the catalog and exit")
    p.add_argument("--check", action="store_true", help="check that every edit applies (exactly one match) and exit")
    p.add_argument("--jobs", type=int, default=None, help="mutants run at once (default: 2 on CPU, 1 on CUDA)")
    p.add_argument("--workers", default="0", help="pytest-xdist workers inside each mutant's run (default 0)")
    p.add_argument(
        "--no-fork",
        dest="fork",
        action="store_false",
        help="CPU: start every pytest run as a fresh interpreter instead of forking a warm one",
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run before it counts as a hang")
    p.add_argument("--keep", action="store_true", help="keep scratch copies")
    p.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    p.add_argument(
        "--deselect",
        action="append",
        default=[],
        metavar="NODEID",
        help="leave a test out of every run (development only: a test the unmutated tree fails)",
    )
    p.add_argument("--report", default=str(ROOT / "out" / "mutants"), help="where the table and JSON go")
    args = p.parse_args(argv)
    args.jobs = args.jobs or (1 if args.gpu else 2)
    args.fork = args.fork and not args.gpu  # CUDA runs start fresh: no CUDA state crosses a fork

    stale = []
    for m in catalog():
        try:
            mutated_text(m, (ROOT / m.file).read_text())
        except Stale as e:
            stale.append(str(e))
        except FileNotFoundError:
            stale.append(f"{m.name}: {m.file} does not exist")
    if args.list or args.check:
        for m in catalog():
            kind = "equivalent" if m.equivalent else "gpu-only" if m.gpu_only else "cpu"
            print(f"{m.name:45s} {kind:10s} {m.file}: {m.what}")
        print("\n".join(stale) or f"all {len(catalog())} mutants apply: every edit matches exactly once")
        return 1 if stale else 0
    if stale:
        print("STALE mutants (an edit no longer matches exactly once; update the catalog):\n  " + "\n  ".join(stale))
        return 1
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("--gpu needs a visible CUDA device; on a CPU machine run `nox -s mutants`")
            return 1

    wanted = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    matching = [m for m in catalog() if not wanted or any(w in m.name for w in wanted)]
    chosen = [m for m in matching if counted(m, args) or (args.equivalent and m.equivalent and not m.gpu_only)]
    skipped = [m for m in matching if m not in chosen]
    files = tree_files()
    base = Path(tempfile.mkdtemp(prefix="dsrope-mutants-"))
    mode = "CUDA" if args.gpu else "CPU (Triton interpreter)"
    print(f"mutants: {len(chosen)} to run on {mode}, {len(files)} files per copy, scratch {base}", flush=True)
    t0 = time.monotonic()
    if args.fork:
        warm_up()

    baseline_dir = base / "_baseline"
    copy_tree(baseline_dir, files)
    print(f"canary: the scratch copy's dsrope runs ({canary_check(baseline_dir, args)})", flush=True)
    if not args.no_baseline:
        # the unmutated copy as the gate runs it: a fresh interpreter, every job slot an xdist worker
        workers = 0 if args.gpu else args.jobs
        baseline = run_suite(baseline_dir, args, (), base / "_baseline.log", workers=workers, fork=False)
        print(
            f"baseline (unmutated copy): {'passes' if baseline.status == 'survived' else baseline.status}, "
            f"{baseline.ran} tests ran, {baseline.seconds:.1f}s",
            flush=True,
        )
        if baseline.status != "survived":
            print(f"the unmutated copy does not pass: {baseline.killer} {baseline.reason}; log {baseline.log}")
            print(Path(baseline.log).read_text()[-3000:])
            return 1
    shutil.rmtree(baseline_dir, ignore_errors=True)

    JOB.update(args=args, files=files, base=base)
    results: list[Result] = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run_mutant, chosen):
            results.append(r)
            by = f" by {r.killer}" if r.killer else ""
            why = f" ({r.reason})" if r.reason else ""
            print(
                f"[{len(results)}/{len(chosen)}] {r.mutant.name}: {r.status.upper()} in {r.seconds:.1f}s{by}{why}",
                flush=True,
            )
    order = {m.name: i for i, m in enumerate(chosen)}
    results.sort(key=lambda r: order[r.mutant.name])
    total = time.monotonic() - t0

    text = table(results, skipped)
    bad = [r for r in results if counted(r.mutant, args) and r.status not in ("killed", "timeout")]
    n = sum(counted(r.mutant, args) for r in results)
    killed = n - len(bad)
    summary = (
        f"{killed}/{n} counted mutants killed on {mode} in {total:.0f}s wall "
        f"(jobs={args.jobs}, fork={args.fork}, baseline {'skipped' if args.no_baseline else 'included'})"
    )
    print("\n" + text + "\n\n" + summary)
    for r in bad:
        print(f"{r.status.upper()} {r.mutant.name}: {r.mutant.what}; {r.reason} (log {r.log})")

    report = Path(args.report)
    report.mkdir(parents=True, exist_ok=True)
    # a partial run (--only, --tests, --equivalent, --deselect) must not overwrite the full run's record
    partial = wanted or args.tests or args.equivalent or args.deselect
    suffix = ("gpu" if args.gpu else "cpu") + ("-partial" if partial else "")
    (report / f"mutants-{suffix}.md").write_text(text + "\n\n" + summary + "\n")
    rows = [
        dict(
            name=r.mutant.name,
            file=r.mutant.file,
            what=r.mutant.what,
            status=r.status,
            seconds=round(r.seconds, 1),
            killer=r.killer,
            reason=r.reason,
            ran=r.ran,
        )
        for r in results
    ]
    (report / f"mutants-{suffix}.json").write_text(json.dumps(rows, indent=1))
    if not args.keep and not bad:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
