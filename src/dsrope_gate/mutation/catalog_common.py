"""Mutants of src/dsrope/_common.py: swap_pairs and pair_table (QNorm backward), token_major_empty and
wants_autograd (all kernels). Each is a realistic fault the suite must kill."""

from __future__ import annotations

from dsrope_gate.mutation import COMMON, mutant

MUTANTS = [
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
    mutant(
        "common.forward_ad_ignored",
        COMMON,
        "the eager fast path takes a dual tensor (forward-mode AD): its tangent is silently dropped",
        (
            "    return (x.requires_grad and torch.is_grad_enabled()) or torch.autograd.forward_ad._current_level >= 0",
            "    return x.requires_grad and torch.is_grad_enabled()",
        ),
    ),
]
