"""Mutants of src/dsrope/checks.py: wants_autograd (every kernel's eager dispatch). Each is a realistic
fault the suite must kill. The argument checks' faults are the refused-input tests' business; the in-place
overlap check has its mutant in catalog_rope (rope.inplace_overlap_not_checked)."""

from __future__ import annotations

from dsrope_dev.mutation import CHECKS, mutant

MUTANTS = [
    mutant(
        "checks.forward_ad_ignored",
        CHECKS,
        "wants_autograd",
        "the eager fast path takes a dual tensor (forward-mode AD): its tangent is silently dropped",
        (
            "return (x.requires_grad and torch.is_grad_enabled()) or torch.autograd.forward_ad._current_level >= 0",
            "return x.requires_grad and torch.is_grad_enabled()",
        ),
    ),
]
