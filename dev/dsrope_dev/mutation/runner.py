"""The mutation gate's runner (the catalog: dsrope_dev.mutation.catalog_*).

For each mutant the runner copies the tree (git's tracked and untracked-not-ignored files; in a tree
that is no git checkout, every file but what .gitignore and DEFAULT_IGNORED list) into a scratch
directory, applies the edit there and runs the suite on that copy, with the copy's src/, reference/,
dev/ and root first on the path and every path into the real checkout (an editable install's .pth, for
one) removed, so the copy's code is what runs; a canary planted in a copy proves it before any
mutant runs, and the unmutated copy must pass the whole suite first (the baseline).

A run has two stages, the second only if the first passed. On CPU, with a map (dsrope_dev.mutation.reach:
which test reaches which function, recorded by tracing the baseline and kept in out/mutants/reach-KEY.json
while the tree's contents are unchanged): first the tests that reach the mutant's edits (the guards' first,
then the quickest), by node id; then every other test of the suite. A mutant whose edit runs at import (a
module-level record, a class body, a function called at collection) runs the way without a map. Without a
map (`--no-map`, `--tests`, `--gpu`, `--no-baseline` with none kept, or a traced baseline whose map lacks a
test that ran): tests/test_bounds_and_table_strides.py
and the mutated file's HOME modules, then every other test module (tests/test_properties.py last). Either
way the two stages together are the whole suite, so the kills are a full run's. Before them, on CPU, the test
that killed the mutant in an earlier run (out/mutants/killers.json), alone: a stage that decides only by a kill.
Killed: a test failed (the table says in which stage). Survived: the whole suite passed. Broken (a collection or
import error) and crashed (pytest died of a signal, e.g. after a write past a buffer) are not kills. On CPU each
pytest run is a child forked from a parent that imported torch and triton once (`--no-fork` starts fresh
interpreters instead); on CUDA every run starts fresh.

    python -m tools.mutants              # CPU: every CPU mutant against the whole CPU suite
    python -m tools.mutants --gpu        # CUDA: the GPU-only mutants against the gpu-marked tests
    python -m tools.mutants --gpu --all  # CUDA: every mutant against the whole suite
    python -m tools.mutants --list | --check | --only NAME,NAME [--tests MODULE,MODULE]

Kinds of entry: a CPU mutant must be killed by the CPU suite; a GPU-only mutant (marked gpu) is a
fault only a GPU can reveal (32-bit offsets past 2**31 elements) and must be killed by the
gpu-marked tests; an equivalent mutant carries the argument why it does not change the function,
is listed, and is neither run nor counted (`--equivalent` runs them, to show they survive).

Exit status: 0 when every counted mutant is killed; 1 when one survived, broke or crashed,
when the unmutated copy fails, or when an edit is stale. The checkout mutated is the current folder
(--root names another); the table and a JSON record go to its out/mutants/ (--report names another).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from dsrope_dev.mutation import (
    CALLING,
    CHECKS,
    CLI,
    CONFORMANCE,
    DIAGNOSES,
    ISOLATION,
    JUDGING,
    OPS,
    PAIR_ROTATION,
    PARITY,
    PIPELINES,
    PLUGIN,
    QNORM,
    REF_CONTRACTS,
    REF_EVERY_OP,
    REF_FLOATS,
    REF_QNORM,
    REF_ROPE,
    REF_TABLES,
    REF_UTILS,
    RENDER,
    ROPE,
    SEMANTICS,
    STRATEGIES,
    TABLE_OP,
    TABLES,
    TESTING,
    TILES,
    UTILS,
    VIOLATIONS,
    Mutant,
    catalog_checks,
    catalog_conformance,
    catalog_pair_rotation,
    catalog_qnorm_rope,
    catalog_reference,
    catalog_rope,
    catalog_rope_utils,
    catalog_semantics,
    catalog_tiles,
    reach,
)

CATALOG = (
    catalog_rope.MUTANTS
    + catalog_qnorm_rope.MUTANTS
    + catalog_pair_rotation.MUTANTS
    + catalog_tiles.MUTANTS
    + catalog_checks.MUTANTS
    + catalog_rope_utils.MUTANTS
)
JUDGE_CATALOG = catalog_reference.MUTANTS + catalog_semantics.MUTANTS + catalog_conformance.MUTANTS

# Test files that exercise each source file: run first, so a mutant dies early.
HOME = {
    ROPE: ("test_rope.py", "test_rope_inplace.py", "test_custom_ops.py", "test_rotation_ptx.py"),
    QNORM: ("test_qnorm_rope.py", "test_custom_ops.py", "test_rotation_ptx.py"),
    UTILS: ("test_rope_utils.py", "test_yarn_edge_cases.py", "test_vs_transformers_tables.py"),
    PAIR_ROTATION: ("test_qnorm_rope.py", "test_rope_inplace.py", "test_rotation_ptx.py"),  # their callers; rotate_lane
    TILES: ("test_rope.py", "test_qnorm_rope.py"),
    CHECKS: ("test_custom_ops.py",),  # wants_autograd: forward-mode AD
    REF_FLOATS: ("test_error_model.py", "test_golden.py"),
    REF_ROPE: ("test_error_model.py", "test_golden.py", "test_contracts.py"),
    REF_QNORM: ("test_error_model.py", "test_golden.py", "test_qnorm_rope.py", "test_contracts.py"),
    REF_CONTRACTS: ("test_contracts.py",),
    REF_EVERY_OP: ("test_contracts.py",),
    REF_UTILS: ("test_yarn_edge_cases.py", "test_golden.py", "test_rope_utils.py"),
    SEMANTICS: ("test_semantics.py", "test_contracts.py", "test_conformance.py"),
    REF_TABLES: ("test_tables.py", "test_table_builders.py"),
    TABLES: ("test_tables.py", "test_table_builders.py"),
    JUDGING: ("test_conformance.py", "test_table_op.py", "test_isolation.py"),
    CALLING: ("test_conformance.py", "test_isolation.py"),  # writes watched: the writers judged in children
    RENDER: ("test_conformance.py", "test_violations.py"),
    VIOLATIONS: ("test_violations.py", "test_conformance.py"),
    DIAGNOSES: ("test_violations.py",),
    ISOLATION: ("test_isolation.py", "test_cli.py"),
    TESTING: ("test_testing.py", "test_entry_points.py"),
    PLUGIN: ("test_testing.py",),
    PARITY: ("test_parity.py", "test_table_op.py"),
    OPS: ("test_conformance.py", "test_testing.py"),
    STRATEGIES: ("test_strategies.py",),
    CLI: ("test_cli.py", "test_isolation.py"),
    TABLE_OP: ("test_table_op.py", "test_table_builders.py"),
    PIPELINES: ("test_pipelines.py",),
    CONFORMANCE: ("test_testing.py", "test_presets.py", "test_cli.py"),
}
FIRST = ("test_bounds_and_table_strides",)  # small and fast, runs before everything
LAST = ("test_properties",)  # hypothesis over many shapes: the slowest module, runs after everything


def catalog() -> list[Mutant]:
    """Both catalogs: the kernels' and the judge's."""
    everything = CATALOG + JUDGE_CATALOG
    names = [m.name for m in everything]
    assert len(set(names)) == len(names), "duplicate mutant names"
    return everything


# ---- applying ---------------------------------------------------------------------------------


class Stale(Exception):
    pass


def function_spans(text: str) -> dict[str, tuple[int, int] | None]:
    """Qualified name ("_PartialRoPE.backward") -> (first, last) line, 1-based, of every function and
    class in `text`, from its `def` or `class` line (decorators excluded) to its end, and of every
    module-level assignment to one name (a record such as `QNORM_ROPE = Op(...)`); None for a name defined
    twice."""
    spans: dict[str, tuple[int, int] | None] = {}

    def add(name: str, node) -> None:
        spans[name] = None if name in spans else (node.lineno, node.end_lineno)

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                add(prefix + child.name, child)
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    tree = ast.parse(text)
    walk(tree, "")
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and [type(t) for t in statement.targets] == [ast.Name]:
            add(statement.targets[0].id, statement)
    return spans


def mutated_text(m: Mutant, text: str) -> str:
    """`text` with each of m's edits applied inside its function; Stale unless the function exists once
    and its `old` text occurs exactly once inside it."""
    for function, old, new in m.edits:
        try:
            spans = function_spans(text)
        except SyntaxError as e:
            raise Stale(f"{m.name}: {m.file} does not parse after the edits before {old!r}: {e}") from e
        if spans.get(function) is None:
            found = "is defined twice" if function in spans else "does not exist"
            raise Stale(f"{m.name}: {function} {found} in {m.file}")
        first, last = spans[function]
        lines = text.splitlines(keepends=True)
        body = "".join(lines[first - 1 : last])
        n = body.count(old)
        if n != 1:
            raise Stale(f"{m.name}: {old!r} occurs {n} times in {function} ({m.file}; expected exactly once)")
        text = "".join(lines[: first - 1]) + body.replace(old, new) + "".join(lines[last:])
    return text


def edit_spans(m: Mutant, text: str) -> list[tuple[int, int]] | None:
    """The line ranges in which m's edits can run, in the unmutated `text`: for each edit, the innermost
    def or lambda that holds its whole old text (only calling it runs the edit: a default argument too is
    used only by a call); None when an edit lies outside every def and lambda (a module-level record, a
    class body), which importing the module runs."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode()))
    offset = lambda lineno, col: starts[lineno - 1] + col  # ast's columns count UTF-8 bytes
    functions = [
        (offset(n.lineno, n.col_offset), offset(n.end_lineno, n.end_col_offset), n.lineno, n.end_lineno)
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    ]
    spans = function_spans(text)
    found = []
    for function, old, _ in m.edits:
        first, last = spans[function]
        body = "".join(lines[first - 1 : last])
        if body.count(old) != 1:  # an edit of the text an earlier edit made: the whole function, if a def
            if not any(f[2:] == (first, last) for f in functions):
                return None
            found.append((first, last))
            continue
        stripped = old.strip()  # a replaced last line's newline lies past its function's end
        start = starts[first - 1] + len(body[: body.index(old) + old.index(stripped)].encode())
        end = start + len(stripped.encode())
        holding = [f for f in functions if f[0] <= start and end <= f[1]]
        if not holding:
            return None
        inner = min(holding, key=lambda f: f[1] - f[0])
        found.append((inner[2], inner[3]))
    return found


# What a copy leaves out where git cannot say (beside the tree's own .gitignore): git's directory, build
# outputs and caches. Patterns as .gitignore writes them.
DEFAULT_IGNORED = (
    ".git",
    ".nox/",
    "/out/",
    "/.whl/",
    "/build/",
    "/dist/",
    "__pycache__/",
    "*.egg-info/",
    "*.pyc",
    ".pytest_cache/",
    ".hypothesis/",
    ".ruff_cache/",
    ".import_linter_cache/",
)


def tree_files(root: Path) -> list[str]:
    """The files a copy of the tree at `root` needs, relative to it: in a git checkout (root its top
    level), git's tracked and untracked-not-ignored files; in any other tree (an exported release, a
    copied checkout, no git installed), every file but what DEFAULT_IGNORED and root/.gitignore list."""
    git = ["git", "-C", str(root)]
    try:
        top = subprocess.run([*git, "rev-parse", "--show-toplevel"], check=True, capture_output=True, text=True)
        checkout = Path(top.stdout.strip()).resolve() == Path(root).resolve()
    except (OSError, subprocess.CalledProcessError):
        checkout = False
    if not checkout:
        return walked_files(Path(root))
    out = subprocess.run(
        [*git, "ls-files", "-z", "--cached", "--others", "--exclude-standard"], check=True, capture_output=True
    ).stdout.decode()
    files = [f for f in out.split("\0") if f and not f.startswith(".nox/")]
    return sorted({f for f in files if (Path(root) / f).is_file()})


def walked_files(root: Path) -> list[str]:
    """Every file under root but what DEFAULT_IGNORED and root/.gitignore list (its patterns as git reads
    them, without negations)."""
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    patterns = [*DEFAULT_IGNORED, *(p.strip() for p in lines if p.strip() and not p.startswith(("#", "!")))]
    files = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not ignored((here / d).as_posix(), True, patterns)]
        files += [(here / n).as_posix() for n in names if not ignored((here / n).as_posix(), False, patterns)]
    return sorted(f for f in files if (root / f).is_file())


def ignored(path: str, is_dir: bool, patterns) -> bool:
    """Whether a .gitignore pattern matches `path` (relative, '/'-separated): one with a '/' before its
    end matches the path from the root, one without matches the last name; a trailing '/' only a folder."""
    name = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        pattern = pattern.rstrip("/")
        if "/" in pattern:
            if fnmatch.fnmatchcase(path, pattern.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


def copy_tree(root: Path, dest: Path, files: list[str]) -> None:
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, target)


# Test modules that judge no kernel: the packaging test builds a venv from a git checkout (74 s) and the
# baseline check's test clones the checkout (a scratch copy has no .git), so a mutant's run leaves them out.
NOT_KERNEL_TESTS = ("test_install.py", "test_bits.py")


def test_files(scratch: Path, first: tuple[str, ...]) -> list[str]:
    """Every test module the gate collects (tests/test_*.py, tests/*_test.py) but NOT_KERNEL_TESTS, the
    given prefixes first."""
    names = sorted(
        {p.name for p in (scratch / "tests").glob("test_*.py")}
        | {p.name for p in (scratch / "tests").glob("*_test.py")}
    )
    names = [n for n in names if n not in NOT_KERNEL_TESTS]
    rank = lambda n: next(
        (i for i, p in enumerate(first) if n.startswith(p)), len(first) + 1 if n.startswith(LAST) else len(first)
    )
    return [f"tests/{n}" for n in sorted(names, key=lambda n: (rank(n), n))]


def selected_tests(files: list[str], tests: str) -> list[str]:
    """A partial run's test files: `tests` is comma-separated module names or substrings of them (a path is
    taken by its file name) and node ids (with ::). A module part that selects no file is an error: pytest
    given no file would run the whole suite and the partial run would silently be a full one."""
    wanted = tests.split(",")
    nodes = [t for t in wanted if "::" in t]
    modules = [Path(t).name for t in wanted if "::" not in t]
    unmatched = [m for m in modules if not any(m in Path(f).name for f in files)]
    if unmatched:
        raise SystemExit(f"--tests: no test module matches {', '.join(unmatched)} (of {len(files)} modules)")
    return [f for f in files if any(m in Path(f).name for m in modules)] + nodes


def scratch_env(scratch: Path, gpu: bool, root: Path) -> dict:
    env = dict(os.environ)
    # The scratch packages first; drop any path into the real checkout (root) so it cannot shadow the copy.
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if outside_checkout(p, root)]
    env["PYTHONPATH"] = os.pathsep.join([*scratch_paths(scratch), *keep])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if gpu:
        env["TRITON_INTERPRET"] = "0"
        env.setdefault("HYPOTHESIS_PROFILE", "gpu")
    else:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# ---- running ----------------------------------------------------------------------------------


@dataclass
class Result:
    mutant: Mutant | None
    status: str  # killed | survived | broken | crashed | stale | timeout
    seconds: float = 0.0
    killer: str = ""
    reason: str = ""
    ran: int = 0
    log: str = ""
    stage: str = ""  # the stage that decided: "reach (N tests)" or "rest" with a map, "home" or "rest" without


def parse_junit(path: Path):
    """(the junit names of the tests that ran, not skipped (junit_name), failures as [(nodeid, first message
    line, is_collection_error)])."""
    if not path.exists():
        return set(), []
    ran, failed = set(), []
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        if case.find("skipped") is None:
            ran.add(f"{cls}.{name}")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            node = f"{cls.replace('.', '/')}.py::{name}" if cls else name
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            collection = not cls or "collection failure" in (bad.get("message") or "")
            failed.append((node, message[0][:160] if message else "", collection))
    return ran, failed


def junit_name(nodeid: str) -> str:
    """The name pytest's junit XML gives the test of a node id: its classname (the path's folders and module,
    and any classes, joined by dots), a dot, and its name with its parameters."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].removesuffix(".py").replace("/", ".")
    return ".".join(names) + bracket + params


def unrecorded(reach_map: dict, junits: list[Path]) -> list[str]:
    """The tests that ran in the traced baseline (its stages' junit files) with no entry in its map: a map that
    misses any would send a mutant that they reach to the rest of the suite only."""
    ran = set().union(*(parse_junit(j)[0] for j in junits))
    return sorted(ran - {junit_name(n) for n in reach_map["tests"]})


# Fork mode (CPU): the parent imports these third-party modules once; each pytest run is a forked
# child that imports dsrope, reference and tests fresh from its scratch copy. Starting torch and
# triton is most of the cost of a short run, so this halves the gate's time on two cores.
PRELOAD = ("torch", "triton", "triton.language", "numpy", "ml_dtypes", "mpmath", "hypothesis", "pytest", "safetensors")
OWN = ("dsrope", "dsrope_gate", "dsrope_reference", "dsrope_dev", "tests", "conftest", "tools", "golden")


def scratch_paths(scratch: Path) -> list[str]:
    """The copy's packages (src/: dsrope, dsrope_gate; reference/: dsrope_reference; dev/: dsrope_dev) and its
    root (tests)."""
    return [str(scratch / "src"), str(scratch / "reference"), str(scratch / "dev"), str(scratch)]


def warm_up() -> None:
    os.environ.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    for name in PRELOAD:
        importlib.import_module(name)
    # the runner itself (tools.mutants, dsrope_dev.mutation): the children forget it and import the copy's
    leaked = sorted(n for n in sys.modules if n.split(".")[0] in OWN and n.split(".")[0] not in ("dsrope_dev", "tools"))
    assert not leaked, f"project modules imported before the fork would shadow the scratch copy: {leaked}"


def outside_checkout(p: str, root: Path) -> bool:
    return bool(p) and not Path(p).resolve().is_relative_to(root)


def in_child(scratch: Path, gpu: bool, root: Path, log_path: Path, run) -> None:
    """Forked child: the scratch copy's env, cwd and sys.path, output to the log; never returns."""
    code = 70
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(scratch)
        os.environ.clear()
        os.environ.update(scratch_env(scratch, gpu, root))
        # forked from a pool's daemonic worker: without this the judge's spawned children refuse to start
        multiprocessing.current_process()._config.pop("daemon", None)
        sys.path[:] = scratch_paths(scratch) + [p for p in sys.path if outside_checkout(p, root)]
        for name in [n for n in sys.modules if n.split(".")[0] in OWN]:
            del sys.modules[name]  # the runner's own dsrope_dev: the copy's is imported fresh
        code = int(run())
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def fork_and_wait(scratch: Path, gpu: bool, root: Path, log_path: Path, run, timeout: float) -> int | None:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        in_child(scratch, gpu, root, log_path, run)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.05)


def run_pytest(
    scratch: Path, args, files: list[str], log_path: Path, junit: Path, workers, fork: bool, trace: Path | None = None
) -> int | None:
    """One pytest run in the scratch copy; None when it hangs past the timeout. `trace`: a fresh interpreter
    records which tests reach which code (dsrope_dev.mutation.reach) into that folder."""
    argv = ["-x", "-q", "-p", "no:cacheprovider", "-n", str(workers), f"--junitxml={junit}"]
    env = scratch_env(scratch, args.gpu, args.root)
    if trace:
        assert not fork, "the map's run starts fresh interpreters: the plugin traces from its import on"
        argv += ["-p", "dsrope_dev.mutation.reach"]
        env[reach.ENV] = str(trace)
    if args.gpu and not args.all:
        argv += ["-m", "gpu"]
    for node in args.deselect:
        argv += ["--deselect", node]
    argv += files
    with open(log_path, "a") as log:
        log.write(("forked: pytest " if fork else "pytest ") + " ".join(argv) + "\n")
    if fork:
        import pytest

        return fork_and_wait(scratch, args.gpu, args.root, log_path, lambda: pytest.main(argv), args.timeout)
    with open(log_path, "a") as log:
        try:
            return subprocess.run(
                [sys.executable, "-m", "pytest", *argv],
                cwd=scratch,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=args.timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            return None


def home_stages(scratch: Path, args, home: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """The suite in two stages by module (the way without a map): the guards and the mutated file's own
    test modules (HOME), then every other module."""
    files = test_files(scratch, FIRST + home)
    if args.tests:
        files = selected_tests(files, args.tests)
    first = sum(any(Path(f).name.startswith(p) for p in FIRST + home) for f in files)
    return [("home", files[:first]), ("rest", files[first:])] if 0 < first < len(files) else [("all", files)]


def reach_stages(scratch: Path, reaching: list[str], home: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """The suite in two stages by the map: the tests that reach the mutant's edits, by node id in the given
    order, then every module of the suite with those tests deselected, the guards and the HOME modules first
    (a test that reaches the file in a child process only, which the map cannot see, comes early). The union
    is the whole suite, whatever the map says. The node ids go through pytest's @argsfile: one a line."""
    if not reaching:
        return [("rest", test_files(scratch, FIRST + home))]
    (scratch / "reach.args").write_text("".join(f"{n}\n" for n in reaching))
    (scratch / "rest.args").write_text("".join(f"--deselect={n}\n" for n in reaching))
    return [
        (f"reach ({len(reaching)} tests)", [f"@{scratch / 'reach.args'}"]),
        ("rest", [*test_files(scratch, FIRST + home), f"@{scratch / 'rest.args'}"]),
    ]


def run_suite(
    scratch: Path, args, stages, log_path: Path, workers=None, fork=None, trace: Path | None = None
) -> Result:
    """The suite on the scratch copy, in stages (home_stages, reach_stages), each run only if the ones before
    it passed. Survived: every test passed. Killed: a test failed; `stage` says in which stage. Not kills:
    `broken` (a collection or import error) and `crashed` (pytest died of a signal): the mutant must fail a
    test."""
    workers = args.workers if workers is None else workers
    fork = args.fork if fork is None else fork
    result = Result(None, "survived", log=str(log_path))
    log_path.write_text("")
    for i, (label, stage) in enumerate(stages):
        junit = scratch / f"junit-{i}.xml"
        junit.unlink(missing_ok=True)  # a pytest that stops at its arguments writes none: no earlier file may stand in
        start = time.monotonic()
        rc = run_pytest(scratch, args, stage, log_path, junit, workers, fork, trace)
        result.seconds += time.monotonic() - start
        ran, failed = parse_junit(junit)
        result.ran += len(ran)
        result.stage = label
        if rc is None and label != LAST_KILLER:
            result.status, result.reason = "timeout", f"no result within {args.timeout}s (the gate would hang)"
        elif rc is None or rc == 0 or (rc == 5 and not failed):  # 5: this stage selected no test (e.g. -m gpu)
            continue
        elif label == LAST_KILLER and not (rc > 0 and failed and not any(c for _, _, c in failed)):
            continue  # it decides by a kill only: passed, renamed, crashed or hung, the stages after it decide
        elif rc < 0:
            # e.g. heap corruption from a write past a buffer: whether it crashes is luck, so a
            # crash is no kill; the suite needs a test that fails on the fault every time
            result.status, result.reason = "crashed", f"pytest died of signal {-rc}"
            result.killer = failed[0][0] if failed else ""
        elif failed and not any(collection for _, _, collection in failed):
            result.status, (result.killer, result.reason, _) = "killed", failed[0]
        else:
            result.status = "broken"
            result.reason = f"pytest exit {rc}: " + (failed[0][1] if failed else "no test failure recorded")
            result.killer = failed[0][0] if failed else ""
        return result
    result.stage = ""
    if result.ran == 0:
        result.status, result.reason = "broken", "no test ran"
    return result


def canary_check(scratch: Path, args) -> str:
    """Prove that the scratch copy's dsrope is what runs, the same way the mutants run: plant a
    marker in the copy and import it; and that the copy's dsrope_dev is the one imported."""
    marker = uuid.uuid4().hex
    init = scratch / "src" / "dsrope" / "__init__.py"
    original = init.read_text()
    init.write_text(original + f"\n_MUTANTS_CANARY = {marker!r}\n")
    probe = "import dsrope, dsrope_dev; print(dsrope_dev.__file__, dsrope.__file__, dsrope._MUTANTS_CANARY)"
    log = scratch / "canary.log"
    try:
        if args.fork:
            fork_and_wait(scratch, args.gpu, args.root, log, lambda: exec(probe) or 0, 300)
        else:
            with open(log, "w") as out:
                subprocess.run(
                    [sys.executable, "-c", probe],
                    cwd=scratch,
                    env=scratch_env(scratch, args.gpu, args.root),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=300,
                )
    finally:
        init.write_text(original)
    words = log.read_text().split()
    if len(words) < 3 or words[-1] != marker or not all(Path(w).is_relative_to(scratch) for w in words[-3:-1]):
        sys.exit(f"canary: the scratch copy's dsrope and dsrope_dev do not run: {log.read_text()[-2000:]}")
    return words[-2]


def run_mutant(m: Mutant) -> Result:
    args, files, base = JOB["args"], JOB["files"], JOB["base"]
    scratch = base / m.name
    copy_tree(args.root, scratch, files)
    target = scratch / m.file
    try:
        target.write_text(mutated_text(m, target.read_text()))
    except Stale as e:
        return Result(m, "stale", reason=str(e))
    reaching = JOB["reaching"].get(m.name)  # absent without a map; None: every test may reach it
    killer = JOB["killers"].get(m.name)
    if killer and reaching:
        reaching = [n for n in reaching if n != killer]
    home = HOME.get(m.file, ())
    stages = home_stages(scratch, args, home) if reaching is None else reach_stages(scratch, reaching, home)
    if killer:
        stages = [(LAST_KILLER, [killer]), *stages]
    result = run_suite(scratch, args, stages, base / f"{m.name}.log")
    result.mutant = m
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


JOB: dict = {}  # the run's arguments, set before the pool forks its workers

# The test that killed each mutant in an earlier run runs first, alone: it usually kills again, in its own
# time instead of after the quicker tests of stage 1 (the judge's spawning tests: minutes). A stage of its own
# that decides only by a kill (run_suite), so the stages after it keep a mutant's verdict a full run's.
LAST_KILLER = "last killer"


def stored_killers(report: Path) -> dict[str, str]:
    """The killing test of each mutant killed in an earlier run kept under `report` (killers.json); {} when there
    is none or it is not a JSON object of names to node ids (said, not raised: it only orders the tests)."""
    path = report / "killers.json"
    try:
        killers = json.loads(path.read_text()) if path.is_file() else {}
        if isinstance(killers, dict) and all(isinstance(v, str) for v in killers.values()):
            return killers
    except (OSError, ValueError):
        pass
    print(f"killers: {path} is not a JSON object of mutant names to test node ids; not used", flush=True)
    return {}


def store_killers(report: Path, results: list[Result]) -> None:
    """Merge this run's verdicts into killers.json: a killed mutant's killing test replaces the earlier one; a
    mutant that was not killed (survived, broke, crashed, timed out) loses its entry. Written whole, then moved."""
    killers = stored_killers(report)
    for r in results:
        if r.status == "killed" and r.killer:
            killers[r.mutant.name] = r.killer
        elif r.status != "stale":
            killers.pop(r.mutant.name, None)
    report.mkdir(parents=True, exist_ok=True)
    part = report / f"killers.json.{os.getpid()}"
    part.write_text(json.dumps(dict(sorted(killers.items())), indent=1) + "\n")
    os.replace(part, report / "killers.json")


def stored_map(report: Path, key: str) -> dict | None:
    """The map kept for the tree whose key (reach.tree_keys) is `key`; None when there is none."""
    path = report / f"reach-{key}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def store_map(report: Path, key: str, reach_map: dict) -> None:
    report.mkdir(parents=True, exist_ok=True)
    (report / f"reach-{key}.json").write_text(json.dumps(reach_map))


def quickest_first(tests: list[str], seconds: dict[str, float]) -> list[str]:
    """The guards' tests first (FIRST), in the order given (the collection's), then the others by the time the
    map's run took for each. The guards keep their file's order: its band tests, which see a write past an
    output, come before the tests whose buffers have no band, where such a write corrupts the heap and the run
    dies of a signal (a crash, no kill)."""
    other = lambda n: not any(Path(n.split("::")[0]).name.startswith(p) for p in FIRST)
    return sorted(tests, key=lambda n: (other(n), seconds.get(n, 0.0) if other(n) else 0.0))


def counted(m: Mutant, args) -> bool:
    if m.equivalent:
        return False
    return m.gpu_only == args.gpu or (args.gpu and args.all)


def table(results: list[Result], skipped: list[Mutant]) -> str:
    rows = [
        "| # | fault | file | result | stage | time (s) | killing test |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(results, 1):
        note = f"`{r.killer}`" if r.killer else ""
        if r.status != "killed" or not r.reason.startswith("AssertionError"):
            note = f"{note} {r.reason[:90]}".strip().replace("|", "/")
        if r.mutant.equivalent:
            note = f"equivalent, run on request: {note}"
        rows.append(
            f"| {i} | {r.mutant.name}: {r.mutant.what} | {Path(r.mutant.file).name} | {r.status} | "
            f"{r.stage or '-'} | {r.seconds:.1f} | {note} |"
        )
    for m in skipped:
        where = "GPU-only: `nox -s gpu-mutants` on CUDA" if m.gpu_only else "CPU mutant: `nox -s mutants`"
        why = f"equivalent: {m.equivalent}" if m.equivalent else where
        rows.append(f"| - | {m.name}: {m.what} | {Path(m.file).name} | not run | - | - | {why} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu", action="store_true", help="CUDA mode: GPU-only mutants against the gpu-marked tests")
    p.add_argument("--all", action="store_true", help="with --gpu: every mutant against the whole suite on CUDA")
    p.add_argument("--only", help="comma-separated substrings of mutant names")
    p.add_argument(
        "--tests",
        help="comma-separated substrings of test module names, or pytest node ids (path::test): run only "
        "those (a partial run: shows that a given test kills a mutant, e.g. --only rope.forward_sine_sign "
        "--tests tests/test_vs_eager.py::test_partial_rope_matches_eager_rotation)",
    )
    p.add_argument("--equivalent", action="store_true", help="also run the equivalent mutants (not counted)")
    p.add_argument("--list", action="store_true", help="print the catalog and exit")
    p.add_argument("--check", action="store_true", help="check that every edit applies (exactly one match) and exit")
    p.add_argument("--jobs", type=int, default=None, help="mutants run at once (default: 2 on CPU, 1 on CUDA)")
    p.add_argument("--workers", default="0", help="pytest-xdist workers inside each mutant's run (default 0)")
    p.add_argument(
        "--no-fork",
        dest="fork",
        action="store_false",
        help="CPU: start every pytest run as a fresh interpreter instead of forking a warm one",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        help="seconds per pytest run before it counts as a hang (a survivor's last stage, and the baseline, run the "
        "rest of the suite in one process: over 20 minutes on a loaded 2-core machine)",
    )
    p.add_argument("--keep", action="store_true", help="keep scratch copies")
    p.add_argument("--no-baseline", action="store_true", help="skip the run of the unmutated copy")
    p.add_argument(
        "--no-map",
        dest="map",
        action="store_false",
        help="run each mutant against its file's HOME modules, then the rest, instead of the tests the map says "
        "reach its edits (a run with --tests never uses the map)",
    )
    p.add_argument(
        "--deselect",
        action="append",
        default=[],
        metavar="NODEID",
        help="leave a test out of every run (development only: a test the unmutated tree fails)",
    )
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout to mutate (default: this folder)")
    p.add_argument("--report", type=Path, help="where the table and JSON go (default: ROOT/out/mutants)")
    args = p.parse_args(argv)
    args.root = args.root.resolve()
    args.report = args.report or args.root / "out" / "mutants"
    args.jobs = args.jobs or (1 if args.gpu else 2)
    args.fork = args.fork and not args.gpu  # CUDA runs start fresh: no CUDA state crosses a fork
    args.map = args.map and not args.gpu and not args.tests

    stale = []
    for m in catalog():
        try:
            mutated_text(m, (args.root / m.file).read_text())
        except Stale as e:
            stale.append(str(e))
        except FileNotFoundError:
            stale.append(f"{m.name}: {m.file} does not exist")
    if args.list or args.check:
        for m in catalog():
            kind = "equivalent" if m.equivalent else "gpu-only" if m.gpu_only else "cpu"
            print(f"{m.name:45s} {kind:10s} {m.file}::{m.function}: {m.what}")
        applies = f"all {len(catalog())} mutants apply: every edit matches exactly once in its function"
        print("\n".join(stale) or applies)
        return 1 if stale else 0
    if stale:
        print("STALE mutants (an edit no longer matches exactly once in its function; update the catalog):")
        print("  " + "\n  ".join(stale))
        return 1
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("--gpu needs a visible CUDA device; on a CPU machine run `nox -s mutants`")
            return 1

    wanted = [w.strip() for w in (args.only or "").split(",") if w.strip()]
    matching = [m for m in catalog() if not wanted or any(w in m.name for w in wanted)]
    chosen = [m for m in matching if counted(m, args) or (args.equivalent and m.equivalent and not m.gpu_only)]
    skipped = [m for m in matching if m not in chosen]
    files = tree_files(args.root)
    base = Path(tempfile.mkdtemp(prefix="dsrope-mutants-"))
    mode = "CUDA" if args.gpu else "CPU (Triton interpreter)"
    print(f"mutants: {len(chosen)} to run on {mode}, {len(files)} files per copy, scratch {base}", flush=True)
    t0 = time.monotonic()
    if args.fork:
        warm_up()

    baseline_dir = base / "_baseline"
    copy_tree(args.root, baseline_dir, files)
    print(f"canary: the scratch copy's dsrope and dsrope_dev run ({canary_check(baseline_dir, args)})", flush=True)
    # the map: kept under the report folder, keyed by the tree's contents; built by a traced baseline
    reach_map, trace, baseline_needed = None, None, not args.no_baseline
    baseline_note = "skipped" if args.no_baseline else "included"
    map_note = "no map: HOME modules, then the rest"
    if args.map:
        key, whole = reach.tree_keys(args.root, files, "\n".join(sorted(args.deselect)))
        map_path = args.report / f"reach-{key}.json"
        reach_map = stored_map(args.report, key)
        if reach_map is not None:
            baseline_needed = baseline_needed and reach_map["tree"] != whole
            baseline_note = "the map's run" if reach_map["tree"] == whole else baseline_note
            why = "its run passed on this very tree" if reach_map["tree"] == whole else "the catalogs changed since"
            map_note = f"map {map_path.name} reused ({why})"
            print(f"map: {map_path} reused ({why}), {len(reach_map['tests'])} tests", flush=True)
        elif baseline_needed:
            trace, baseline_needed = base / "_reach", True
    if baseline_needed:
        # the unmutated copy as the gate runs it: a fresh interpreter, every job slot an xdist worker
        workers = 0 if args.gpu else args.jobs
        stages = home_stages(baseline_dir, args, ())
        baseline = run_suite(
            baseline_dir, args, stages, base / "_baseline.log", workers=workers, fork=False, trace=trace
        )
        traced = ", traced for the map" if trace else ""
        print(
            f"baseline (unmutated copy{traced}): {'passes' if baseline.status == 'survived' else baseline.status}, "
            f"{baseline.ran} tests ran, {baseline.seconds:.1f}s",
            flush=True,
        )
        if baseline.status != "survived":
            print(f"the unmutated copy does not pass: {baseline.killer} {baseline.reason}; log {baseline.log}")
            print(Path(baseline.log).read_text()[-3000:])
            return 1
        if trace:
            reach_map = dict(reach.merge(trace), key=key, tree=whole, seconds_traced=round(baseline.seconds, 1))
            missing = unrecorded(reach_map, sorted(baseline_dir.glob("junit-*.xml")))
            if missing:
                map_note = f"map INCOMPLETE ({len(missing)} tests without calls), not used: HOME modules, then the rest"
                print(
                    f"map: INCOMPLETE: {len(missing)} of the {baseline.ran} tests that ran in the traced baseline "
                    f"have no recorded calls (e.g. {', '.join(missing[:3])}); the map is NOT stored and NOT used: "
                    f"HOME modules, then the rest (the parts: {trace}, kept with --keep)",
                    flush=True,
                )
                reach_map = None
            else:
                store_map(args.report, key, reach_map)
                map_note = f"map {map_path.name} built by the traced baseline ({baseline.seconds:.0f}s)"
                print(f"map: {map_path} written, {len(reach_map['tests'])} tests", flush=True)
    shutil.rmtree(baseline_dir, ignore_errors=True)
    reaching = {}
    if reach_map is not None:
        for m in chosen:
            found = reach.reaching(reach_map, m.file, edit_spans(m, (args.root / m.file).read_text()))
            reaching[m.name] = None if found is None else quickest_first(found, reach_map["seconds"])
    elif args.map and not trace:
        map_note = "no map for this tree and no baseline to build it (--no-baseline): HOME modules, then the rest"
        print(f"map: {map_note}", flush=True)

    killers = {} if args.tests or args.gpu else stored_killers(args.report)  # --tests: those tests only
    JOB.update(args=args, files=files, base=base, reaching=reaching, killers=killers)
    known = sum(m.name in killers for m in chosen)
    print(f"killers: {known} of {len(chosen)} mutants' earlier killing tests run first", flush=True)
    results: list[Result] = []
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        for r in pool.imap_unordered(run_mutant, chosen):
            results.append(r)
            by = f" by {r.killer}" if r.killer else ""
            by += f" in stage {r.stage}" if r.stage else ""
            why = f" ({r.reason})" if r.reason else ""
            print(
                f"[{len(results)}/{len(chosen)}] {r.mutant.name}: {r.status.upper()} in {r.seconds:.1f}s{by}{why}",
                flush=True,
            )
    order = {m.name: i for i, m in enumerate(chosen)}
    results.sort(key=lambda r: order[r.mutant.name])
    total = time.monotonic() - t0

    text = table(results, skipped)
    bad = [r for r in results if counted(r.mutant, args) and r.status not in ("killed", "timeout")]
    n = sum(counted(r.mutant, args) for r in results)
    killed = n - len(bad)
    first = sum(r.status == "killed" and r.stage not in ("rest", "all") for r in results)
    summary = (
        f"{killed}/{n} counted mutants killed on {mode} in {total:.0f}s wall "
        f"(jobs={args.jobs}, fork={args.fork}, baseline {baseline_note}; "
        f"{map_note}; {first} killed before the rest of the suite)"
    )
    print("\n" + text + "\n\n" + summary)
    for r in bad:
        print(f"{r.status.upper()} {r.mutant.name}: {r.mutant.what}; {r.reason} (log {r.log})")

    report = args.report
    report.mkdir(parents=True, exist_ok=True)
    # a partial run (--only, --tests, --equivalent, --deselect) must not overwrite the full run's record
    partial = wanted or args.tests or args.equivalent or args.deselect
    suffix = ("gpu" if args.gpu else "cpu") + ("-partial" if partial else "")
    (report / f"mutants-{suffix}.md").write_text(text + "\n\n" + summary + "\n")
    rows = [
        dict(
            name=r.mutant.name,
            file=r.mutant.file,
            what=r.mutant.what,
            status=r.status,
            stage=r.stage,
            seconds=round(r.seconds, 1),
            killer=r.killer,
            reason=r.reason,
            ran=r.ran,
        )
        for r in results
    ]
    (report / f"mutants-{suffix}.json").write_text(json.dumps(rows, indent=1))
    if not (args.tests or args.deselect or args.gpu):  # verdicts of part of the suite keep no killer
        store_killers(report, results)
    if not args.keep and not bad:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
