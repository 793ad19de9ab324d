"""Loading an implementation to judge: `module.path:callable` or `path/to/file.py:callable` (the callable
may be an attribute path), and the one loader of a module from a file (a user's file, or the one module
of a peer's release that cannot be imported whole: dsrope_gate.presets)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path


def load_module(name: str, path: Path):
    """The module in `path`, imported under `name` (registered in sys.modules, as an import would)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_target(spec: str):
    """`module.path:callable` or `path/to/file.py:callable` -> the callable (attribute paths allowed)."""
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"--impl {spec!r}: expected module.path:callable or path/to/file.py:callable")
    if where.endswith(".py"):
        path = Path(where).resolve()
        if not path.is_file():
            raise ValueError(f"--impl {spec!r}: no file {path}")
        module = load_module(f"_conformance_{path.stem}", path)
    else:
        module = importlib.import_module(where)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"--impl {spec!r}: {attr} is not callable")
    return obj
