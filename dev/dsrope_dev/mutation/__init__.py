"""The mutation gate: two catalogs of realistic faults, each of which the suite must kill: the kernels'
(dsrope) and the judge's (the reference, the semantics and the verdict: a lenient judge would pass a wrong
kernel, here or in another project).

Each mutant is a named set of exact text replacements in one source file, located by function: its
`function` is the qualified name of the function, method or class the edits are in ("_rotate",
"_PartialRoPE.backward"), and an edit that lies in another function of the same file names that
function first, (function, old, new). Every `old` text must occur exactly once inside its function
(the lines of its `def` or `class` statement through its end, decorators excluded), so a refactor that
moves or renames the code makes the mutant fail loudly (STALE) instead of silently testing nothing,
and the kernels may use the same words for the same math. The catalog is data, one module per kernel
file (catalog_rope, catalog_qnorm_rope, catalog_rope_utils, catalog_pair_rotation, catalog_tiles,
catalog_checks); the runner (dsrope_dev.mutation.runner, `python -m tools.mutants`) copies the
checkout, applies one mutant and runs the suite on the copy. The judge's catalog is catalog_reference,
catalog_semantics and catalog_conformance, built the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE = "src/dsrope/rope.py"
QNORM = "src/dsrope/qnorm_rope.py"
UTILS = "src/dsrope/rope_utils.py"
PAIR_ROTATION = "src/dsrope/pair_rotation.py"
TILES = "src/dsrope/tiles.py"
CHECKS = "src/dsrope/checks.py"
# the judge: the reference, the semantics and the verdict (catalog_reference, catalog_semantics,
# catalog_conformance)
REF_FLOATS = "reference/dsrope_reference/floats.py"
REF_ROPE = "reference/dsrope_reference/rope.py"
REF_QNORM = "reference/dsrope_reference/qnorm_rope.py"
REF_UTILS = "reference/dsrope_reference/rope_utils.py"
REF_CONTRACTS = "reference/dsrope_reference/contracts.py"
REF_EVERY_OP = "reference/dsrope_reference/every_op_rounded.py"
REF_TABLES = "reference/dsrope_reference/rope_tables.py"
SEMANTICS = "src/dsrope_gate/semantics.py"
TABLES = "src/dsrope_gate/tables.py"
JUDGING = "src/dsrope_gate/conformance/judging.py"
CALLING = "src/dsrope_gate/conformance/calling.py"
RENDER = "src/dsrope_gate/conformance/render.py"
VIOLATIONS = "src/dsrope_gate/conformance/violations.py"
DIAGNOSES = "src/dsrope_gate/diagnoses.py"
ISOLATION = "src/dsrope_gate/conformance/isolation.py"
TESTING = "src/dsrope_gate/testing.py"
PLUGIN = "src/dsrope_gate/pytest_plugin.py"
PARITY = "src/dsrope_gate/parity.py"
OPS = "src/dsrope_gate/ops.py"
STRATEGIES = "src/dsrope_gate/strategies.py"
CLI = "src/dsrope_gate/cli.py"
CONFORMANCE = "src/dsrope_gate/conformance/__init__.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    function: str  # qualified name of the function, method or class the edits are in
    what: str
    edits: tuple[tuple[str, str, str], ...]  # (function, old, new)
    gpu_only: bool = False
    equivalent: str = ""  # why the edit does not change the function; such mutants are not counted


def mutant(name, file, function, what, *edits, gpu_only=False, equivalent=""):
    """A Mutant; each edit is (old, new) inside `function`, or (other_function, old, new)."""
    located = tuple(edit if len(edit) == 3 else (function, *edit) for edit in edits)
    return Mutant(name, file, function, what, located, gpu_only, equivalent)
