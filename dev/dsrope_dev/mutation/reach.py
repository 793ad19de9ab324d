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
tests/ is left out.

Each process appends to its own part file, FOLDER/part-WORKER-PID.jsonl, one JSON object a line, flushed as
written, so a process that dies keeps the lines of the tests it finished:

    {"unit": [file, first, last]}          the part's next unit (the n-th such line is unit n)
    {"order": [node id, ...], "collection": [unit, ...]}           the collected tests, in order
    {"test": node id, "seconds": s, "reached": [unit, ...], "collection": [unit, ...]}   after each test
    {"done": true, "collection": [unit, ...]}                     at the end of the session

A test's seconds are what it costs run alone (the runner runs the quickest first): its own time and the setup
of each wider fixture it uses, whichever test set it up. "collection" lists the units called outside any test
that no line before listed. `merge` joins the parts into one map; `reaching` answers, from the map, which tests
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
# read once, at import: a test may change os.environ, and the recording must not depend on it
FOLDER = os.environ.get(ENV)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")

# a bucket: id(code) -> code (a code object's own hash hashes its bytecode and constants on every call)
_collection: dict = {}
_collection_sent: set[int] = set()  # the collection units this part has listed
_put = _collection.__setitem__
_fixtures: dict[object, set] = defaultdict(set)  # a wider-than-function fixture definition -> units its setup called
_fixture_seconds: dict[object, float] = {}  # a wider fixture definition -> its last setup's own seconds
_setup_seconds = 0.0  # the own seconds of every wider fixture's setup so far
_indices: dict[int, tuple] = {}  # id(code) -> (code, its unit's index or None): the code kept alive, its id unique
_unit_index: dict[tuple, int] = {}
_relative: dict[str, str | None] = {}  # a code object's file name -> its path relative to the root
_root: Path | None = None
_part = None  # this process's part file, opened at the first line


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


if FOLDER:
    start()  # at import: -p loads this before conftest.py, so its imports count as collection


def _write(record: dict) -> None:
    global _part
    if _part is None:
        Path(FOLDER).mkdir(parents=True, exist_ok=True)
        _part = open(Path(FOLDER) / f"part-{WORKER}-{os.getpid()}.jsonl", "a")
    _part.write(json.dumps(record) + "\n")
    _part.flush()


def _units_of(codes) -> set[int]:
    """The indices of the units of `codes`; a unit seen for the first time is written as a line first."""
    found = set()
    for code in codes:
        hit = _indices.get(id(code))
        if hit is None:
            u = unit(code, _root, _relative)
            i = None
            if u is not None:
                i = _unit_index.get(u)
                if i is None:
                    i = _unit_index[u] = len(_unit_index)
                    _write({"unit": list(u)})
            hit = _indices[id(code)] = (code, i)
        if hit[1] is not None:
            found.add(hit[1])
    return found


def _new_collection() -> list[int]:
    """The units called outside any test that no line of the part has listed yet; the collection bucket
    starts empty again."""
    codes = list(_collection.values())
    _collection.clear()
    new = _units_of(codes) - _collection_sent
    _collection_sent.update(new)
    return sorted(new)


def pytest_configure(config):
    global _root
    _root = Path(config.rootpath).resolve()


def pytest_collection_finish(session):
    if FOLDER:
        _write({"order": [item.nodeid for item in session.items], "collection": _new_collection()})


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not FOLDER:
        return (yield)
    bucket = {}
    _into(bucket)
    start, setups = time.perf_counter(), _setup_seconds
    try:
        return (yield)
    finally:
        _into(_collection)
        # what the test costs run alone: its own time, and each wider fixture it uses set up (here or before)
        seconds = time.perf_counter() - start - (_setup_seconds - setups)
        reached = _units_of(list(bucket.values()))
        info = getattr(item, "_fixtureinfo", None)
        for definitions in info.name2fixturedefs.values() if info else ():
            for definition in definitions:
                reached |= _fixtures.get(definition, set())
                seconds += _fixture_seconds.get(definition, 0.0)
        record = dict(test=item.nodeid, seconds=round(seconds, 4), reached=sorted(reached))
        _write(dict(record, collection=_new_collection()))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    # a wider fixture is set up once, in the first test that uses it: its calls belong to every test using it
    global _setup_seconds
    if not FOLDER or fixturedef.scope == "function":
        return (yield)
    bucket = {}
    previous = _into(bucket)
    start, setups = time.perf_counter(), _setup_seconds
    try:
        return (yield)
    finally:
        _into(previous)
        own = time.perf_counter() - start - (_setup_seconds - setups)  # without the wider fixtures it set up
        _fixture_seconds[fixturedef] = own
        _setup_seconds += own
        _fixtures[fixturedef] |= _units_of(list(bucket.values()))


def pytest_sessionfinish(session):
    if FOLDER:
        stop()
        _write({"done": True, "collection": _new_collection()})


def unit(code, root: Path, relative: dict) -> tuple | None:
    """(file relative to root, first line, last line) of a code object's own instructions, without its
    first line unless that is all it has; None outside root or under tests/. `relative` caches each file
    name's path relative to root."""
    name = code.co_filename
    if name not in relative:
        relative[name] = None
        if os.path.isabs(name):  # not "<frozen abc>", "<string>"
            try:
                relative[name] = Path(name).resolve().relative_to(root).as_posix()
            except (ValueError, OSError):
                pass
    path = relative[name]
    if not path or path.startswith("tests/"):
        return None
    lines = {line for _, _, line in code.co_lines() if line}  # 0: a module's RESUME
    body = lines - {code.co_firstlineno} or lines
    return (path, min(body), max(body)) if body else None


# ---- the map -----------------------------------------------------------------------------------


def merge(folder: Path) -> dict:
    """The part files of one run joined: units (file, first, last), per test the indices of the units it
    reached (only the tests some part recorded, in collection order), the collection bucket's units, each
    test's seconds, and the collection order. A part cut short (its process died) gives the lines it has."""
    index: dict[tuple, int] = {}
    tests: dict[str, set] = defaultdict(set)
    seconds: dict[str, float] = defaultdict(float)
    collection: set[int] = set()
    order: list[str] = []
    for path in sorted(Path(folder).glob("part-*.jsonl")):
        here: list[int] = []  # the part's unit n -> its index in the map
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut short by the process's death: the last one
            if "unit" in record:
                here.append(index.setdefault(tuple(record["unit"]), len(index)))
                continue
            collection |= {here[u] for u in record.get("collection", ())}
            if "order" in record:
                known = set(order)
                order += [n for n in record["order"] if n not in known]
            if "test" in record:
                tests[record["test"]] |= {here[u] for u in record["reached"]}
                seconds[record["test"]] += record["seconds"]
    known = set(order)
    recorded = [n for n in order if n in tests] + [n for n in tests if n not in known]
    return dict(
        units=[list(u) for u in index],
        collection=sorted(collection),
        tests={n: sorted(tests[n]) for n in recorded},
        seconds={n: round(seconds[n], 3) for n in recorded},
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
