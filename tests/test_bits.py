"""The bit-level regression check (dsrope_dev.bits) in a clean clone, with Triton's interpreter.

A temporary clone of this checkout (`git clone --local --no-hardlinks`) with the working tree's changes
committed on top is the tree under test; there, with no network:
- a commit that only adds a comment to a kernel file: exit 0, every case bit-identical (the default
  baseline, the merge base with main);
- another rows-per-program tile (uncommitted), against main's kernels extracted beforehand (--baseline-src,
  as on a host without the history): exit 0;
- a kernel mutant from the mutation catalog that moves bits on the interpreter (uncommitted): exit 1, the
  changed cases listed with their changed elements, ulp and error-model verdict and a reproduction;
- an unknown REF, case or option: exit 2; a REF without src/dsrope: exit 3;
- `--record` writes the platform's snapshot and appends a record naming the cases the mutant changed;
- the comparison counts a NaN payload as a change and rejects elements past the model, and the reproduction
  it prints computes the element it names.
The clone's child processes run the interpreter whatever the host (CUDA hidden), on three small golden cases
(the whole set is the check's default; its time on CPU is in docs/regression-gate.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsrope_dev.bits import main as bits_main
from dsrope_dev.bits import reproduction
from dsrope_dev.mutation.runner import catalog, mutated_text
from dsrope_gate import golden, snapshots

ROOT = Path(__file__).resolve().parents[1]
# moves dx's bits on the interpreter in these cases (and in 8 more of the 24); the suite kills it elsewhere
MUTANT = "qnorm.backward_xhat_rounded"
CASES = ["nan-fp16", "huge-bf16", "v3-bshd-bf16"]
GIT = ["git", "-c", "user.name=bits test", "-c", "user.email=bits@test", "-c", "commit.gpgsign=false"]


def git(where: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(where), *args], check=True, capture_output=True, text=True).stdout


def is_checkout(path: Path) -> bool:
    top = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    return top.returncode == 0 and Path(top.stdout.strip()).resolve() == path.resolve()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clone of this checkout at HEAD plus its working tree's changes (committed there), on a branch of its own,
    with a local main at that commit."""
    if not is_checkout(ROOT):
        pytest.skip(f"{ROOT} is not a git checkout: the baseline check builds its baseline from git history")
    where = tmp_path_factory.mktemp("bits") / "clone"
    subprocess.run(["git", "clone", "--quiet", "--local", "--no-hardlinks", str(ROOT), str(where)], check=True)
    git(where, "checkout", "--quiet", "--detach", git(ROOT, "rev-parse", "HEAD").strip())
    changed = git(ROOT, "diff", "-z", "--name-only", "--no-renames", "HEAD").split("\0")
    untracked = git(ROOT, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
    for f in filter(None, changed + untracked):
        if (ROOT / f).is_file():
            (where / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, where / f)
        elif (where / f).exists():
            (where / f).unlink()
    git(where, "add", "--all")
    git(where, "commit", "--quiet", "--allow-empty", "-m", "the tree under test")
    git(where, "checkout", "--quiet", "-B", "work")
    git(where, "branch", "--force", "main", "HEAD")
    return where


def reset(clone: Path) -> None:
    git(clone, "reset", "--quiet", "--hard", "main")
    git(clone, "clean", "--quiet", "-fd")


def bits(clone: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(str(clone / p) for p in ("src", "reference", "dev"))
    return subprocess.run(
        [sys.executable, "-m", "dsrope_dev.bits", *args], cwd=clone, env=env, capture_output=True, text=True
    )


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} is not there once"
    path.write_text(text.replace(old, new))


def apply_mutant(clone: Path, name: str) -> None:
    m = next(m for m in catalog() if m.name == name)
    path = clone / m.file
    path.write_text(mutated_text(m, path.read_text()))


@pytest.mark.long
def test_a_comment_commit_is_bit_identical_to_the_merge_base(clone):
    reset(clone)
    rope = clone / "src" / "dsrope" / "rope.py"
    rope.write_text(rope.read_text() + "# a comment moves no bit\n")
    git(clone, "commit", "--quiet", "-am", "a comment")
    base = git(clone, "rev-parse", "main").strip()
    run = bits(clone, "--cases", *CASES)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"against the merge base of HEAD and main ({base[:12]})" in run.stdout, run.stdout
    lines = [line.split() for line in run.stdout.splitlines()]
    assert all([name, "bit-identical"] in lines for name in CASES), run.stdout
    assert "no change" in run.stdout


@pytest.mark.long
def test_a_tile_that_moves_no_bits_passes(clone, tmp_path):
    """Another rows-per-program choice for every interpreted launch (uncommitted): the same bits, against main's
    kernels extracted beforehand, as on a host without the git history (--baseline-src)."""
    reset(clone)
    archive = subprocess.run(
        ["git", "-C", str(clone), "archive", "main", "src/dsrope"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    edit(
        clone / "src" / "dsrope" / "tiles.py",
        "M=max(1, min(64, (1 << 16) // block))",
        "M=max(1, min(4, (1 << 16) // block))",
    )
    run = bits(clone, "--baseline", "main", "--baseline-src", str(tmp_path), "--cases", ",".join(CASES))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"against main (the kernels in {tmp_path})" in run.stdout and "no change" in run.stdout, run.stdout


@pytest.mark.long
def test_a_bit_moving_mutant_is_caught_and_its_cases_listed(clone):
    reset(clone)
    apply_mutant(clone, MUTANT)
    run = bits(clone, "--baseline", "main", "--cases", *CASES)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "2 of 3 cases changed: nan-fp16, huge-bf16" in lines[-1], run.stdout
    assert any(line.split() == ["v3-bshd-bf16", "bit-identical"] for line in lines), run.stdout
    for name in ("nan-fp16", "huge-bf16"):
        head = next(line for line in lines if line.split()[:2] == [name, "changed:"])
        assert "elements in 1 output, " in head, head
    assert any(line.strip().startswith("qnorm_rope.dx: ") and " ulp (" in line for line in lines), run.stdout
    assert any(line.strip().startswith("first changed: qnorm_rope.dx[") for line in lines), run.stdout
    assert any("x, cos, sin, grad = Case(name='nan-fp16'" in line for line in lines), run.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--baseline", "no-such-ref"],
        ["--baseline", "HEAD", "--cases", "no-such-case"],
        ["--baseline-src", "no-such-folder"],
        ["--baseline-src", "README.md"],
        ["--no-such-option"],
        ["--record", "--cases", "nan-fp16"],
    ],
)
def test_usage_errors_exit_2(args, capsys):
    assert bits_main(args) == 2
    assert capsys.readouterr().err


@pytest.mark.long
def test_a_baseline_without_kernels_exits_3(clone):
    reset(clone)
    empty_tree = git(clone, "hash-object", "-t", "tree", "/dev/null").strip()
    bare = git(clone, "commit-tree", empty_tree, "-m", "no kernels").strip()
    run = bits(clone, "--baseline", bare, "--cases", CASES[0])
    assert run.returncode == 3, run.stdout + run.stderr
    assert f"git archive {bare[:12]} src/dsrope failed" in run.stderr, run.stderr


@pytest.mark.long
def test_record_writes_the_snapshot_and_says_what_changed(clone):
    reset(clone)
    records = clone / "docs" / "records" / "snapshots.md"
    status = bits(clone, "--snapshot-status")
    assert status.returncode == 0, status.stdout + status.stderr
    if "compares them with the committed snapshot" not in status.stdout:  # this triton has none: record one first
        assert "nox -s bits -- --baseline main" in status.stdout, status.stdout
        first = bits(clone, "--record", "--note", "the tree as it is")
        assert first.returncode == 0, first.stdout + first.stderr
        assert "no previous snapshot of this platform" in records.read_text().split("\n## ")[-1]
    apply_mutant(clone, MUTANT)
    second = bits(clone, "--record", "--note", "the mutant")
    assert second.returncode == 0, second.stdout + second.stderr
    entry = records.read_text().split("\n## ")[-1]
    assert "with uncommitted changes to src/dsrope" in entry and "Why: the mutant" in entry, entry
    assert "triton " in entry and "torch " in entry and "interpreter" in entry, entry
    assert "| nan-fp16 | qnorm_rope.dx |" in entry and "| huge-bf16 | qnorm_rope.dx |" in entry, entry
    assert "| v3-bshd-bf16 |" not in entry, entry
    status = bits(clone, "--snapshot-status")
    assert "compares them with the committed snapshot" in status.stdout, status.stdout


@pytest.mark.parametrize("name", ["nan-fp16", "v3-shared-key-bf16"])
def test_the_reproduction_computes_the_element_it_names(name, capsys):
    """Each stage's reproduction, run here, prints the very element of the kernels' output it names."""
    record, tensors = golden.load_case(golden.golden_root(), golden.read_manifest(), name)
    outputs = snapshots.run_kernels(record, tensors)
    device = snapshots.kernel_device().type
    for stage, out in outputs.items():
        i = tuple(n // 2 for n in out.shape)
        lines = reproduction(record, tensors, stage, ", ".join(map(str, i)), device)
        exec("\n".join(line.strip() for line in lines[1:]), {})
        printed = capsys.readouterr().out.split()[-1]
        assert float(printed) == out[i].item(), (stage, printed, out[i].item())


def test_compare_case_counts_changes_and_rejects_elements_outside_the_model():
    """Against the stored reference of nan-fp16's QNorm output as the baseline: three elements moved, one to
    its model's upper bound (inside), one a step past it and one to NaN (both outside); a NaN payload alone is
    a change inside the model, and an unchanged output is no change."""
    from dsrope_reference.floats import from_ordered, ordered

    from dsrope_dev.bits import compare_case

    record, tensors = golden.load_case(golden.golden_root(), golden.read_manifest(), "nan-fp16")
    stage = "qnorm_rope.out"
    model = golden.decode_stage(stage, tensors)
    old = {stage: model["ref"].to(torch.float16)}
    assert not compare_case("nan-fp16", record, tensors, old, dict(old), "cpu").changed
    finite = ((model["ref"] != model["hi"]) & model["ref"].isfinite()).flatten().nonzero().flatten()
    i, j, k = (tuple(int(v) for v in torch.unravel_index(finite[n], model["ref"].shape)) for n in (0, 1, 2))
    new = old[stage].clone()
    new[i] = model["hi"][i].to(torch.float16)
    new[j] = from_ordered(ordered(model["hi"][j].to(torch.float16)) + 1, torch.float16)
    new[k] = float("nan")
    result = compare_case("nan-fp16", record, tensors, old, {stage: new}, "cpu")
    assert [(c.tensor, c.changed) for c in result.changes] == [(stage, 3)]
    assert result.outside == {stage: 2} and result.changes[0].max_ulp >= 1 << 62
    assert result.first[0].startswith(f"first changed: {stage}[{', '.join(map(str, min(i, j, k)))}]")
    nan = old[stage].flatten().isnan().nonzero().flatten()
    assert len(nan), "nan-fp16's reference has NaN rows"
    payload = old[stage].clone()
    payload.view(torch.int16).view(-1)[nan[0]] ^= 1  # another NaN
    result = compare_case("nan-fp16", record, tensors, old, {stage: payload}, "cpu")
    assert result.changed and result.outside == {stage: 0} and result.changes[0].max_ulp == 0
