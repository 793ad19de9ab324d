"""Mutants of src/dsrope/pair_rotation.py: swap_pairs and pair_table (the QNorm backward and the in-place
rotation), and rotate_lane's fused form. Each is a realistic fault the suite must kill. The rotation's
operands are the kernels' own mutants' business (catalog_rope, catalog_qnorm_rope)."""

from __future__ import annotations

from dsrope_dev.mutation import PAIR_ROTATION, mutant

MUTANTS = [
    mutant(
        "pair_rotation.swap_pairs_unswapped",
        PAIR_ROTATION,
        "swap_pairs",
        "swap_pairs joins the halves back in order, join(first, second): the tile comes back unswapped and "
        "every lane is its own partner",
        ("tl.join(second, first)", "tl.join(first, second)"),
    ),
    mutant(
        "pair_rotation.swap_pairs_second_kept",
        PAIR_ROTATION,
        "swap_pairs",
        "swap_pairs joins (second, second): the first lane gets its partner, the second lane itself",
        ("tl.join(second, first)", "tl.join(second, second)"),
    ),
    mutant(
        "pair_rotation.pair_table_first_off_by_one",
        PAIR_ROTATION,
        "pair_table",
        "pair_table counts pairs from FIRST - 1: every rotary pair gets the next pair's entry, the last 0",
        ("[None, :] - FIRST", "[None, :] - FIRST + 1"),
    ),
    mutant(
        "pair_rotation.pair_table_second_lane_next_entry",
        PAIR_ROTATION,
        "pair_table",
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
        "pair_rotation.pair_table_no_other",
        PAIR_ROTATION,
        "pair_table",
        "pair_table's masked loads without other=0.0 (masked lanes undefined)",
        ("(k < PAIRS), other=0.0)", "(k < PAIRS))"),
        equivalent="a lane where pair_table's mask is off is in a row that is not computed (row_ok false: "
        "every store of that row is masked, and the QNorm backward's sums are per row) or outside "
        "0 <= k < R/2, which holds only off the rotary lanes (a rotary lane has k in [0, R/2)). There the "
        "QNorm backward keeps the unrotated gradient with tl.where(rot, derotated, g), a select that never "
        "reads the other operand's value, and the in-place rotation stores nothing (its store mask is rot); "
        "each lane's table entry enters only that lane's result, and the load itself touches no memory on "
        "a masked lane.",
    ),
    mutant(
        "pair_rotation.rotate_lane_fma",
        PAIR_ROTATION,
        "rotate_lane",
        "rotate_lane written as tl.fma(own, cos, partner product): one product of each lane fused on the GPU "
        "whatever the launch options say (the interpreter computes it unfused: only the compiled PTX shows it)",
        ("return own * cos + signed_partner_times_sin", "return tl.fma(own, cos, signed_partner_times_sin)"),
    ),
]
