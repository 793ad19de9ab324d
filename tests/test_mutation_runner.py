"""The mutation runner's own machinery (dsrope_dev.mutation.runner): which files a scratch copy gets, in
a git checkout or not, and edits located by function. The catalog itself is checked against the kernels
by `python -m tools.mutants --check` (a test here would run on every mutated copy, where the mutant's
own edit no longer applies)."""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from dsrope_dev.mutation import mutant, reach, runner

ROOT = Path(__file__).resolve().parents[1]


def write(tree: Path, files) -> None:
    for name in files:
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("# " + name + "\n")


def test_files_of_a_tree_without_git(tmp_path):
    """A copied tree (no .git, or a .git that is no repository): every file but git's folder, build
    outputs, caches and what its .gitignore lists."""
    kept = ["src/dsrope/__init__.py", "tests/test_rope.py", "docs/out/kept.md", "pyproject.toml", ".gitignore"]
    left_out = [
        ".git/HEAD",
        "out/mutants/mutants-cpu.md",
        "run.log",
        "src/dsrope/__pycache__/rope.cpython-312.pyc",
        ".nox/tests/bin/python",
        "src/dsrope.egg-info/PKG-INFO",
        ".whl/torch-2.13.0.whl",
        ".pytest_cache/v/cache/lastfailed",
    ]
    write(tmp_path, kept + left_out)
    (tmp_path / ".gitignore").write_text("# the project's own\n/out/\n*.log\n")
    assert runner.tree_files(tmp_path) == sorted(kept)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_files_of_an_exported_release(tmp_path):
    """`git archive` of this checkout (no .git): the walk lists exactly the files git tracks at HEAD,
    src/dsrope/__init__.py and the tests among them, and leaves out what a run left behind."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path, filter="data")
    write(tmp_path, ["out/verify/report.md", "src/dsrope/__pycache__/rope.cpython-312.pyc", ".nox/lint/bin/ruff"])
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.split()
    files = runner.tree_files(tmp_path)
    assert "src/dsrope/__init__.py" in files and "tests/test_rope.py" in files
    assert files == sorted(tracked)


SOURCE = """\
def rotate(a, b):
    return a + b


class Kernel:
    @staticmethod
    def backward(a, b):
        return a + b

    def twice(a, b):
        return a + b, a + b
"""


def test_edits_apply_inside_their_function_only():
    """The same text in two functions: each edit changes it in the function it names, and in no other."""
    edit = ("return a + b", "return a - b")
    backward = runner.mutated_text(mutant("t.backward", "x.py", "Kernel.backward", "", edit), SOURCE)
    assert backward == SOURCE.replace("        return a + b\n\n", "        return a - b\n\n")
    both = mutant("t.both", "x.py", "rotate", "", edit, ("Kernel.backward", *edit))
    assert runner.mutated_text(both, SOURCE).count("return a - b") == 2


@pytest.mark.parametrize(
    "function,old",
    [
        ("missing", "return a + b"),  # no such function
        ("Kernel.twice", "a + b"),  # twice inside the function
        ("rotate", "return a, b"),  # not inside the function
        ("Kernel.backward", "@staticmethod"),  # decorators are outside a function's span
    ],
)
def test_stale_edits_fail_loudly(function, old):
    with pytest.raises(runner.Stale):
        runner.mutated_text(mutant("t.stale", "x.py", function, "", (old, "x")), SOURCE)


def test_a_partial_run_selects_modules_by_name_or_path_and_refuses_a_miss():
    from dsrope_dev.mutation.runner import selected_tests

    files = ["tests/test_conformance.py", "tests/test_violations.py", "tests/test_rope.py"]
    assert selected_tests(files, "tests/test_violations.py") == ["tests/test_violations.py"]
    assert selected_tests(files, "test_violations") == ["tests/test_violations.py"]
    assert selected_tests(files, "test_rope,tests/test_conformance.py::test_x") == [
        "tests/test_rope.py",
        "tests/test_conformance.py::test_x",
    ]
    with pytest.raises(SystemExit, match="no test module matches test_nothing"):
        selected_tests(files, "test_nothing")


def test_stage_one_runs_the_guards_in_file_order_then_the_quickest():
    guards = "tests/test_bounds_and_table_strides.py::"
    tests = [f"{guards}test_band[a]", "tests/test_b.py::slow", f"{guards}test_no_band", "tests/test_a.py::quick"]
    seconds = {tests[0]: 0.9, tests[1]: 5.0, tests[2]: 0.1, tests[3]: 0.2}
    assert runner.quickest_first(tests, seconds) == [tests[0], tests[2], tests[3], tests[1]]


def test_the_last_killer_runs_first_alone_and_decides_only_by_a_kill(tmp_path):
    """The stage of a mutant's earlier killing test: a failure there is the kill; a killer that passes now or no
    longer exists leaves the verdict to the stages after it (a survivor's full run, or a kill there)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # its own root: under nox tmp_path lies inside the checkout
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_k.py").write_text("def test_fails():\n    assert False\n\n\ndef test_passes():\n    pass\n")
    args = argparse.Namespace(gpu=False, all=False, deselect=[], timeout=120, root=ROOT, workers="0", fork=False)
    fails, passes = "tests/test_k.py::test_fails", "tests/test_k.py::test_passes"

    def run(killer, after):
        return runner.run_suite(tmp_path, args, [(runner.LAST_KILLER, [killer]), ("rest", after)], tmp_path / "log")

    killed = run(fails, [passes])
    assert (killed.status, killed.stage, killed.killer, killed.ran) == ("killed", runner.LAST_KILLER, fails, 1)
    survived = run(passes, [passes])
    assert (survived.status, survived.stage, survived.ran) == ("survived", "", 2)
    killed_after = run("tests/test_k.py::test_renamed", ["tests/test_k.py"])
    assert (killed_after.status, killed_after.stage, killed_after.killer) == ("killed", "rest", fails)


def test_the_killers_kept_are_each_mutants_latest(tmp_path):
    a, b, c = (mutant(f"t.{n}", "x.py", "f", "", ("a", "b")) for n in "abc")
    runner.store_killers(
        tmp_path, [runner.Result(a, "killed", killer="t::one"), runner.Result(b, "killed", killer="t::two")]
    )
    assert runner.stored_killers(tmp_path) == {"t.a": "t::one", "t.b": "t::two"}
    later = [runner.Result(a, "survived"), runner.Result(b, "killed", killer="t::three"), runner.Result(c, "stale")]
    runner.store_killers(tmp_path, later)
    assert runner.stored_killers(tmp_path) == {"t.b": "t::three"}


def test_home_first_and_last_name_files_that_exist():
    """Every source file of the HOME table exists and its test modules too, as do the FIRST and LAST modules:
    a renamed test module would otherwise drop out of its mutants' first stage without a word."""
    modules = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert all((ROOT / source).is_file() for source in runner.HOME)
    assert {name for homes in runner.HOME.values() for name in homes} <= modules
    assert all(any(m.startswith(prefix) for m in modules) for prefix in runner.FIRST + runner.LAST)


# ---- the map: which tests reach which code (dsrope_dev.mutation.reach) -----------------------------------

PROJECT = {
    "mod.py": """\
import functools


def at_import():
    return 1


def first():
    return 2


def second():
    return 3


def for_the_module():
    return 4


@functools.cache
def decorated():
    return 5


RECORD = dict(scale=at_import())
""",
    "tests/test_a.py": """\
import pytest

import mod

VALUE = mod.at_import()


@pytest.fixture(scope="module")
def shared():
    return mod.for_the_module()


def test_first():
    assert mod.first() == 2


def test_second(shared):
    assert mod.second() + mod.decorated() == 8


def test_uses_the_fixture_set_up_before(shared):
    assert shared == 4
""",
}


def traced_run(tmp_path: Path, files: dict, *argv: str) -> subprocess.CompletedProcess:
    """A traced pytest run, in a fresh interpreter (Triton's interpreter on the CPU), over a project of `files`
    in tmp_path, its own rootdir (an ini file there: a tmp_path inside a checkout, as nox's, would otherwise
    take the checkout's pyproject.toml and root); its parts go to tmp_path/parts."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "dev")]))
    env.update({reach.ENV: str(tmp_path / "parts"), "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "dsrope_dev.mutation.reach", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def traced_map(tmp_path: Path, files: dict, *argv: str) -> dict:
    """The merged map of a traced pytest run (traced_run) that passed."""
    run = traced_run(tmp_path, files, *argv)
    assert run.returncode == 0, run.stdout + run.stderr
    return reach.merge(tmp_path / "parts")


def reached(reach_map: dict, test: str, file: str = "mod.py") -> set[tuple[int, int]]:
    found = reach_map["collection"] if test == "collection" else reach_map["tests"][test]
    return {(lo, hi) for f, lo, hi in (reach_map["units"][i] for i in found) if f == file}


def test_the_tracer_attributes_each_call_to_the_test_that_made_it(tmp_path):
    """Calls in a test go to its node id; a module-level call (at import, i.e. collection) to "collection";
    a module fixture's calls to every test that uses it, not only to the first; tests/ is left out; a
    decorated function counts from its body, not from its decorator."""
    reach_map = traced_map(tmp_path, PROJECT, "tests/test_a.py")
    spans = runner.function_spans(PROJECT["mod.py"])
    body = lambda name: (spans[name][1], spans[name][1])  # each function here is one line of body
    first, second, fixture = (
        f"tests/test_a.py::{t}" for t in ("test_first", "test_second", "test_uses_the_fixture_set_up_before")
    )
    assert list(reach_map["tests"]) == [first, second, fixture]
    assert reached(reach_map, first) == {body("first")}
    assert reached(reach_map, second) == {body("second"), body("for_the_module"), body("decorated")}
    assert reached(reach_map, fixture) == {body("for_the_module")}
    assert body("at_import") in reached(reach_map, "collection")
    assert body("first") not in reached(reach_map, "collection")
    assert not any(f.startswith("tests/") for f, _, _ in reach_map["units"])
    # the selection: the tests that reach a mutant's function; every test for one reached at collection
    # or for an edit at module level (a record: importing runs it)
    select = lambda function, edit: reach.reaching(
        reach_map, "mod.py", runner.edit_spans(mutant("t", "mod.py", function, "", edit), PROJECT["mod.py"])
    )
    assert select("first", ("return 2", "return -2")) == [first]
    assert select("for_the_module", ("return 4", "return -4")) == [second, fixture]
    assert select("at_import", ("return 1", "return -1")) is None
    assert select("RECORD", ("scale=", "scale=-")) is None


def one_test_a_function(names: list[str], *extra: str) -> str:
    """A test module whose test_NAME calls mod.NAME(), then runs the lines of `extra` (one per test, or none)."""
    tests = ["import os\nimport signal\n\nimport mod\n"]
    for i, name in enumerate(names):
        tests.append(f"\ndef test_{name}():\n    assert mod.{name}()\n" + (f"    {extra[i]}\n" if extra else ""))
    return "\n".join(tests)


def test_a_part_keeps_the_tests_finished_before_its_process_died(tmp_path):
    """Each test's line is written and flushed when the test ends: a process killed in its third test leaves
    the first two tests' calls in its part (a part without its final line is read), and no entry for the
    third."""
    killed = ("pass", "pass", "os.kill(os.getpid(), signal.SIGKILL)")
    test = one_test_a_function(["first", "second", "for_the_module"], *killed)
    run = traced_run(tmp_path, {"mod.py": PROJECT["mod.py"], "tests/test_k.py": test}, "tests/test_k.py")
    assert run.returncode == -signal.SIGKILL, run.stdout + run.stderr
    (part,) = (tmp_path / "parts").glob("part-*.jsonl")
    assert '"done"' not in part.read_text()
    reach_map = reach.merge(tmp_path / "parts")
    spans = runner.function_spans(PROJECT["mod.py"])
    body = lambda name: (spans[name][1], spans[name][1])
    assert list(reach_map["tests"]) == ["tests/test_k.py::test_first", "tests/test_k.py::test_second"]
    assert reached(reach_map, "tests/test_k.py::test_first") == {body("first")}
    assert reached(reach_map, "tests/test_k.py::test_second") == {body("second")}
    assert body("at_import") in reached(reach_map, "collection")


def test_a_test_that_removes_the_variable_does_not_stop_the_recording(tmp_path):
    """The plugin reads DSROPE_REACH_MAP once, at import: a test that deletes it from os.environ changes
    nothing for the tests after it, nor for the part's final line."""
    removes = (f"del os.environ[{reach.ENV!r}]", "pass")
    test = one_test_a_function(["first", "second"], *removes)
    reach_map = traced_map(tmp_path, {"mod.py": PROJECT["mod.py"], "tests/test_e.py": test}, "tests/test_e.py")
    spans = runner.function_spans(PROJECT["mod.py"])
    assert reached(reach_map, "tests/test_e.py::test_second") == {(spans["second"][1], spans["second"][1])}
    (part,) = (tmp_path / "parts").glob("part-*.jsonl")
    assert part.read_text().splitlines()[-1].startswith('{"done": true')


def test_the_parts_of_two_workers_map_every_test_and_a_missing_test_is_found(tmp_path):
    """Under pytest-xdist (-n 2) each worker writes its own part and merge maps every test that ran; the
    runner's check against the junit XML of the run finds nothing missing, and finds the tests of a worker
    whose part lost its tests' lines (such a map is not used)."""
    names = ["first", "second", "for_the_module", "decorated"] * 3
    source = PROJECT["mod.py"] + "".join(f"\n\ndef f{i}():\n    return {i + 1}\n" for i in range(len(names)))
    names = [f"f{i}" for i in range(len(names))]
    files = {"mod.py": source, "tests/test_x.py": one_test_a_function(names)}
    reach_map = traced_map(tmp_path, files, "-n", "2", "--junitxml=junit.xml", "tests/test_x.py")
    spans = runner.function_spans(source)
    for name in names:
        assert reached(reach_map, f"tests/test_x.py::test_{name}") == {(spans[name][1], spans[name][1])}
    parts = sorted((tmp_path / "parts").glob("part-gw*.jsonl"))
    with_tests = [p for p in parts if '"test"' in p.read_text()]
    assert len(with_tests) == 2, [p.name for p in parts]
    assert runner.unrecorded(reach_map, [tmp_path / "junit.xml"]) == []
    lines = with_tests[1].read_text().splitlines(keepends=True)
    lost = [json.loads(line)["test"] for line in lines if '"test"' in line]
    with_tests[1].write_text("".join(line for line in lines if '"test"' not in line))
    broken = reach.merge(tmp_path / "parts")
    assert runner.unrecorded(broken, [tmp_path / "junit.xml"]) == sorted(map(runner.junit_name, lost))
    assert runner.junit_name("tests/sub/test_m.py::TestC::test_t[a.b-1]") == "tests.sub.test_m.TestC.test_t[a.b-1]"


def test_a_test_costs_the_setup_of_the_wider_fixtures_it_uses(tmp_path):
    """A test's seconds count the setup of each module fixture it uses, also when an earlier test set it up:
    run alone (as the map's quickest-first order runs it) it pays that setup."""
    test = "import time\n\nimport pytest\n\n\n@pytest.fixture(scope='module')\ndef slow():\n    time.sleep(0.5)\n"
    test += "".join(f"\n\ndef test_{n}(slow):\n    pass\n" for n in ("sets_it_up", "uses_it_after"))
    reach_map = traced_map(tmp_path, {"tests/test_s.py": test}, "tests/test_s.py")
    assert reach_map["seconds"]["tests/test_s.py::test_sets_it_up"] >= 0.5
    assert reach_map["seconds"]["tests/test_s.py::test_uses_it_after"] >= 0.5


KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def double(X, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(X + i, tl.load(X + i) * 2)


def untouched():
    return 0
"""


def test_an_interpreted_kernel_is_reached_through_its_own_lines(tmp_path):
    """Triton's interpreter runs a kernel as a function compiled from its rewritten source, with the kernel's
    file name and line numbers: the test that launches it reaches the kernel's span."""
    test = "import torch\nimport kern\n\n\ndef test_launch():\n    x = torch.ones(4)\n    kern.double[(1,)](x, 4)\n"
    test += "    assert x.tolist() == [2.0] * 4\n"
    reach_map = traced_map(tmp_path, {"kern.py": KERNEL, "tests/test_k.py": test}, "tests/test_k.py")
    double = mutant("t", "kern.py", "double", "", ("* 2", "* 3"))
    assert reach.reaching(reach_map, "kern.py", runner.edit_spans(double, KERNEL)) == ["tests/test_k.py::test_launch"]
    untouched = mutant("t", "kern.py", "untouched", "", ("return 0", "return 1"))
    assert reach.reaching(reach_map, "kern.py", runner.edit_spans(untouched, KERNEL)) == []


def test_an_edit_runs_in_the_innermost_def_or_lambda_holding_it():
    source = "def outer(a):\n    def inner(b):\n        return b + 1\n\n    f = lambda c: c * 2\n"
    source += "    return inner(a) + f(a)\n"
    spans = lambda function, *edits: runner.edit_spans(mutant("t", "x.py", function, "", *edits), source)
    assert spans("outer", ("b + 1", "b - 1")) == [(2, 3)]
    assert spans("outer", ("c * 2", "c * 3")) == [(5, 5)]
    assert spans("outer", ("return inner(a)", "return inner(-a)")) == [(1, 6)]
    # a second edit of the text the first made: its whole function
    assert spans("outer", ("b + 1", "b - 1"), ("b - 1", "b - 2")) == [(2, 3), (1, 6)]


def test_a_map_is_kept_for_its_tree_only(tmp_path):
    """The key follows every copied file but the catalogs (data only the runner reads): a changed kernel or
    test gives a new key, so a stored map is not reused; a changed catalog keeps the key, and the whole-tree
    hash (whether the map's own run was this tree's baseline) changes."""
    files = ["src/dsrope/rope.py", "tests/test_rope.py", "dev/dsrope_dev/mutation/catalog_rope.py"]
    write(tmp_path, files)
    key, whole = reach.tree_keys(tmp_path, files)
    report = tmp_path / "out"
    runner.store_map(report, key, {"tests": {}})
    assert runner.stored_map(report, key) == {"tests": {}}
    (tmp_path / "dev/dsrope_dev/mutation/catalog_rope.py").write_text("MUTANTS = []\n")
    assert reach.tree_keys(tmp_path, files)[0] == key and reach.tree_keys(tmp_path, files)[1] != whole
    for changed in ("src/dsrope/rope.py", "tests/test_rope.py"):
        (tmp_path / changed).write_text("# changed\n")
        key, _ = reach.tree_keys(tmp_path, files)
        assert runner.stored_map(report, key) is None
    assert reach.tree_keys(tmp_path, files, "--deselect x")[0] != key
