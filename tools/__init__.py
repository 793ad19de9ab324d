"""Command-line entry points, run from the repository root: `python -m tools.<name>`.

Importing this package puts the checkout's packages first on sys.path (src/: dsrope, dsrope_gate;
reference/: dsrope_reference; dev/: dsrope_dev), ahead of any installed copy, as pyproject's pytest
`pythonpath` does for the suite: a tool always runs the code of the checkout it is started from.
"""

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(_ROOT / d) for d in ("src", "reference", "dev")) if p not in sys.path]
