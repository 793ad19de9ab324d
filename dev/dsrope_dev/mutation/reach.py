"""Which tests reach which code: the mutation gate's map, and the pytest plugin that records it.

    DSROPE_REACH_MAP=FOLDER python -m pytest -p dsrope_dev.mutation.reach ...   # one part file per process

With DSROPE_REACH_MAP set, every pytest process that loads the plugin (the xdist controller and each worker:
they all get the command line's -p) traces calls from the moment it is imported: sys.settrace with a global
function that returns None, so no frame is traced line by line and only 'call' events cost anything. Each
call's code object goes to a bucket: the running test's node id (its setup, call and teardown), the
module-, class- or session-scoped fixture being set up (added to every test that uses it), or "collection"
for calls outside any test (conftest, imports, collection). Triton's interpreter compiles each kernel's
rewritten AST with the kernel's file name and line numbers, so a launch shows up as a call of the kernel's
own lines. What runs in a child process (a spawned judge, a CLI subprocess) is not seen.

A code object is kept as a unit (file relative to the root, first line, last line) over the lines its own
instructions come from, without its first line (a decorated function's RESUME sits on its first decorator);
tests/ is left out. `merge` joins the part files into one map; `reaching` answers, from the map, which tests
reach a mutant.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

ENV = "DSROPE_REACH_MAP"
COLLECTION = "collection"

# bucket: id(code) -> code (a code object's own hash hashes its bytecode and constants on every call)
_buckets: dict[str, dict] = defaultdict(dict)
_fixtures: dict[object, dict] = {}  # a wider-than-function fixture definition -> what its setup called
_put = _buckets[COLLECTION].__setitem__
_seconds: dict[str, float] = defaultdict(float)
_order: list[str] = []


def _trace(frame, event, arg):
    code = frame.f_code
    _put(id(code), code)
    # returns None: no line events for this frame


def _into(bucket: dict) -> dict:
    """Send calls to `bucket` from now on; returns the bucket that was receiving them."""
    global _put
    previous = _put.__self__
    _put = bucket.__setitem__
    return previous


def start() -> None:
    sys.settrace(_trace)
    threading.settrace(_trace)


def stop() -> None:
    sys.settrace(None)
    threading.settrace(None)


if os.environ.get(ENV):
    start()  # at import: -p loads this before conftest.py, so its imports count as collection


def pytest_collection_finish(session):
    _order[:] = [item.nodeid for item in session.items]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get(ENV):
        return (yield)
    bucket = _buckets[item.nodeid]
    _into(bucket)
    start = time.perf_counter()
    try:
        return (yield)
    finally:
        _into(_buckets[COLLECTION])
        _seconds[item.nodeid] += time.perf_counter() - start
        info = getattr(item, "_fixtureinfo", None)
        for definitions in info.name2fixturedefs.values() if info else ():
            for definition in definitions:
                bucket.update(_fixtures.get(definition, {}))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    # a wider fixture is set up once, in the first test that uses it: its calls belong to every test using it
    if not os.environ.get(ENV) or fixturedef.scope == "function":
        return (yield)
    previous = _into(_fixtures.setdefault(fixturedef, {}))
    try:
        return (yield)
    finally:
        _into(previous)


def pytest_sessionfinish(session):
    folder = os.environ.get(ENV)
    if not folder:
        return
    stop()
    root = Path(session.config.rootpath).resolve()
    units: dict[object, tuple | None] = {}
    reached = {
        n: sorted({u for u in (unit(c, root, units) for c in codes.values()) if u}) for n, codes in _buckets.items()
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    part = dict(order=_order, seconds=dict(_seconds), reached=reached)
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"part-{worker}-{os.getpid()}.json").write_text(json.dumps(part))


def unit(code, root: Path, cache: dict) -> tuple | None:
    """(file relative to root, first line, last line) of a code object's own instructions, without its
    first line unless that is all it has; None outside root or under tests/."""
    if id(code) in cache:
        return cache[id(code)]
    found = relative = None
    if os.path.isabs(code.co_filename):  # not "<frozen abc>", "<string>"
        try:
            relative = Path(code.co_filename).resolve().relative_to(root).as_posix()
        except (ValueError, OSError):
            pass
    if relative and not relative.startswith("tests/"):
        lines = {line for _, _, line in code.co_lines() if line}  # 0: a module's RESUME
        body = lines - {code.co_firstlineno} or lines
        if body:
            found = (relative, min(body), max(body))
    cache[id(code)] = found
    return found


# ---- the map -----------------------------------------------------------------------------------


def merge(folder: Path) -> dict:
    """The part files of one run joined: units (file, first, last), per test the indices of the units it
    reached, the collection bucket's units, each test's seconds, and the collection order."""
    index: dict[tuple, int] = {}
    tests: dict[str, set] = defaultdict(set)
    seconds: dict[str, float] = defaultdict(float)
    order: list[str] = []
    for path in sorted(Path(folder).glob("part-*.json")):
        part = json.loads(path.read_text())
        for name, found in part["reached"].items():
            tests[name] |= {index.setdefault(tuple(u), len(index)) for u in found}
        for name, s in part["seconds"].items():
            seconds[name] += s
        known = set(order)
        order += [n for n in part["order"] if n not in known]
    collection = tests.pop(COLLECTION, set())
    return dict(
        units=[list(u) for u in index],
        collection=sorted(collection),
        tests={n: sorted(tests.get(n, ())) for n in order},
        seconds={n: round(seconds.get(n, 0.0), 3) for n in order},
    )


def reaching(reach: dict, file: str, spans: list[tuple[int, int]] | None) -> list[str] | None:
    """The tests (node ids, in collection order) that called code of `file` lying inside one of `spans`;
    None when every test may reach it: spans is None, or such code ran at collection."""
    if spans is None:
        return None
    inside = {
        i
        for i, (f, lo, hi) in enumerate(reach["units"])
        if f == file and any(first <= lo and hi <= last for first, last in spans)
    }
    if inside.intersection(reach["collection"]):
        return None
    if "by_unit" not in reach:
        by_unit = reach["by_unit"] = defaultdict(set)
        for n, found in enumerate(reach["tests"].values()):
            for u in found:
                by_unit[u].add(n)
    chosen = set().union(*(reach["by_unit"].get(u, ()) for u in inside))
    return [name for n, name in enumerate(reach["tests"]) if n in chosen]


# The catalogs are data only the runner reads: an edit there changes no test's calls, so it keeps the map.
CATALOG_FILES = "dev/dsrope_dev/mutation/catalog_*.py"
VERSIONED = ("torch", "triton", "pytest", "xdist", "hypothesis", "numpy", "ml_dtypes", "mpmath")


def tree_keys(root: Path, files: list[str], extra: str = "") -> tuple[str, str]:
    """(the map's key, the whole tree's hash): sha256 over each copied file's path and content, the first
    without the catalogs, both with the Python and package versions and `extra` (the run's --deselect)."""
    import importlib.metadata

    versions = [sys.version]
    for name in VERSIONED:
        try:
            versions.append(f"{name} {importlib.metadata.version(name if name != 'xdist' else 'pytest-xdist')}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{name} absent")
    key, whole = hashlib.sha256(), hashlib.sha256()
    for f in files:
        entry = f"{f}\0{hashlib.sha256((root / f).read_bytes()).hexdigest()}\n".encode()
        whole.update(entry)
        if not fnmatch.fnmatchcase(f, CATALOG_FILES):
            key.update(entry)
    for h in (key, whole):
        h.update("\n".join([*versions, extra]).encode())
    return key.hexdigest()[:16], whole.hexdigest()[:16]
