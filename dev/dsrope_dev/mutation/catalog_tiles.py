"""Mutants of src/dsrope/tiles.py: token_major_empty, the output storage of every kernel. Each is a
realistic fault the suite must kill."""

from __future__ import annotations

from dsrope_dev.mutation import TILES, mutant

MUTANTS = [
    mutant(
        "tiles.token_major_empty_head_major",
        TILES,
        "token_major_empty",
        "token_major_empty gives contiguous head-major [B, H, S, D] strides (same storage size; the kernels "
        "write token-major rows)",
        (
            "(max(s, 1) * stride_s, stride_h, stride_s, 1)",
            "(max(s, 1) * stride_s, max(s, 1) * stride_h, stride_h, 1)",
        ),
    ),
]
