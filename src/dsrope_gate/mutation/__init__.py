"""The mutation gate: a catalog of realistic kernel faults, each of which the suite must kill.

Each mutant is a named set of exact text replacements in one source file. Every `old` text must
occur exactly once in the file, so a refactor that moves the code makes the mutant fail loudly
(STALE) instead of silently testing nothing. The catalog is data, one module per kernel file
(catalog_rope, catalog_qnorm_rope, catalog_common, catalog_rope_utils); the runner
(dsrope_gate.mutation.runner, `python -m tools.mutants`) copies the checkout, applies one mutant and
runs the suite on the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE = "src/dsrope/rope.py"
QNORM = "src/dsrope/qnorm_rope.py"
UTILS = "src/dsrope/rope_utils.py"
COMMON = "src/dsrope/_common.py"


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
