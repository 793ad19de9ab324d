"""The mutation runner's own machinery (dsrope_dev.mutation.runner): which files a scratch copy gets, in
a git checkout or not, and edits located by function. The catalog itself is checked against the kernels
by `python -m tools.mutants --check` (a test here would run on every mutated copy, where the mutant's
own edit no longer applies)."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from dsrope_dev.mutation import mutant, runner

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


def test_home_first_and_last_name_files_that_exist():
    """Every source file of the HOME table exists and its test modules too, as do the FIRST and LAST modules:
    a renamed test module would otherwise drop out of its mutants' first stage without a word."""
    modules = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert all((ROOT / source).is_file() for source in runner.HOME)
    assert {name for homes in runner.HOME.values() for name in homes} <= modules
    assert all(any(m.startswith(prefix) for m in modules) for prefix in runner.FIRST + runner.LAST)
