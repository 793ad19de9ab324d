"""The bit-level regression check: this tree's kernels against a baseline's, on the device at hand.

    python -m dsrope_dev.bits [--baseline REF | --baseline-src DIR] [--cases NAME ...]
    python -m dsrope_dev.bits --record [--commit TEXT] [--note TEXT]
    python -m dsrope_dev.bits --snapshot-status
    nox -s bits -- <the same options>

The check. REF's kernels come from git, without network and without a worktree: `git archive REF src/dsrope`
into a temporary folder (REF by default: the merge base of HEAD and main, which on main is HEAD itself, so the
working tree is compared with its last commit). `--baseline-src DIR` takes an extracted src/dsrope instead,
for a copy of the tree that has no git history (a device; a `--baseline REF` beside it only names them). Two
child processes run REF's `dsrope` and this tree's (the working tree, uncommitted changes included) on the
golden inputs in their stored layouts (every case of the golden store, or those `--cases` names), each with
this tree's gate, reference and golden store:
only the `dsrope` package differs, first on the child's path. With CUDA the kernels are compiled; without, they
run in Triton's interpreter (TRITON_INTERPRET=1, CUDA hidden). Per case: bit-identical, or changed: per output,
the elements whose bits differ, the largest difference in ulp (dsrope_reference.floats.ulp_distance), whether
every changed element of this tree's output lies inside the error model the golden store keeps, and the first
changed element with the Python that reproduces it.

Exit status: 0 no element changed; 1 an element changed, or this tree's kernels failed to run; 2 a usage error
(an unknown REF, case or option); 3 the baseline cannot be built or run (nor the check: a damaged golden store).

The intentional change. `--record` runs this tree's kernels on every golden case, writes this platform's
committed snapshot (golden/snapshots/<device>-triton-<version>.safetensors and .json, which tests/test_golden.py
holds the kernels to bit for bit), and appends a dated entry to docs/records/snapshots.md: the commit, the card,
torch and triton, and per case what changed against the previous snapshot of that platform.

`--snapshot-status` prints one line: the committed snapshot this device and Triton are compared with, or, where
there is none, how to run the check instead (what `nox -s gpu-tests` logs, and the reason its snapshot tests
skip with).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from dsrope_reference.floats import NAN_VS_NUMBER, inside, ordered, ulp_distance

from dsrope_gate import golden

ROOT = Path(__file__).resolve().parents[2]  # the checkout: dev/dsrope_dev/bits.py
RECORDS = ROOT / "docs" / "records" / "snapshots.md"
SAME, CHANGED, USAGE, NO_BASELINE = 0, 1, 2, 3
CHECK_COMMAND = "nox -s bits -- --baseline main"


class Usage(Exception):
    """A bad option, REF or case name: exit 2."""


class NoBaseline(Exception):
    """The baseline's kernels cannot be built or run, or the golden store cannot be read: exit 3."""


# --- the snapshot a device is compared with -------------------------------------------------------------


def no_snapshot_line(key: dict) -> str:
    """What a device without a committed snapshot is told, in one line."""
    device = "Triton's interpreter" if key["device"] == "interpreter" else key["device"]
    return (
        f"no committed kernel snapshot for {device} with triton {key['triton']}: check this tree's kernel "
        f"bits against main's on this device with `{CHECK_COMMAND}` (docs/regression-gate.md)"
    )


def snapshot_status(root: Path | None = None) -> str:
    from dsrope_gate.snapshots import platform_key

    root = root or golden.golden_root()
    key = platform_key()
    data, sidecar = golden.snapshot_paths(root, key)
    if sidecar.is_file():
        return f"kernel bits: tests/test_golden.py compares them with the committed snapshot {golden.relname(data)}"
    return no_snapshot_line(key)


# --- the baseline's kernels -----------------------------------------------------------------------------


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def is_checkout() -> bool:
    top = git("rev-parse", "--show-toplevel")
    return top.returncode == 0 and Path(top.stdout.decode().strip()).resolve() == ROOT


def default_baseline() -> str:
    """The merge base of HEAD and main (a clone that has main only as origin/main: with that)."""
    for main in ("main", "origin/main"):
        if git("rev-parse", "--verify", "--quiet", f"{main}^{{commit}}").returncode == 0:
            base = git("merge-base", "HEAD", main)
            if base.returncode:
                raise Usage(f"HEAD and {main} have no merge base: name the baseline with --baseline REF")
            return base.stdout.decode().strip()
    raise Usage("no branch main (nor origin/main) to take the merge base with: name one with --baseline REF")


def resolve(ref: str) -> str:
    if ref.startswith("-"):
        raise Usage(f"--baseline {ref!r}: not a git revision")
    found = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if found.returncode:
        raise Usage(f"--baseline {ref!r}: no such commit in {ROOT}")
    return found.stdout.decode().strip()


def extract(commit: str, dest: Path) -> Path:
    """REF's src/dsrope, from `git archive` into dest (nothing checked out, nothing fetched)."""
    archive = git("archive", "--format=tar", commit, "src/dsrope")
    if archive.returncode:
        raise NoBaseline(f"git archive {commit[:12]} src/dsrope failed: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Pythons before the extraction filters (git's own archive: no links out of dest)
            tar.extractall(dest)
    return package(dest, "the archive of " + commit[:12], NoBaseline)


def package(folder: Path, what: str, error=Usage) -> Path:
    """The `dsrope` package folder in `folder`: folder itself, folder/dsrope or folder/src/dsrope."""
    for candidate in (folder, folder / "dsrope", folder / "src" / "dsrope"):
        if (candidate / "__init__.py").is_file() and candidate.name == "dsrope":
            return candidate.resolve()
    raise error(f"{what}: no dsrope package (a folder dsrope with __init__.py) in {folder}, nor under dsrope/ or src/")


# --- running one side's kernels (a child process) -----------------------------------------------------------


def gate_path() -> list[str]:
    """The folders this process found the gate, the reference and this package in (this tree's)."""
    import dsrope_reference

    import dsrope_dev
    import dsrope_gate

    return [str(Path(m.__file__).resolve().parents[1]) for m in (dsrope_gate, dsrope_reference, dsrope_dev)]


def start(side: str, dsrope_dir: Path, cases: list[str], work: Path, env: dict) -> subprocess.Popen:
    """A child that runs the `dsrope` in dsrope_dir on the cases, with this tree's gate."""
    path = work / side / "path"
    path.mkdir(parents=True)
    try:
        (path / "dsrope").symlink_to(dsrope_dir, target_is_directory=True)
    except OSError:  # no symlinks here: a copy
        import shutil

        shutil.copytree(dsrope_dir, path / "dsrope")
    paths = [str(path), *dict.fromkeys(gate_path()), env.get("PYTHONPATH", "")]
    args = [sys.executable, "-m", "dsrope_dev.bits", "--run-kernels", str(work / side), "--expect", str(dsrope_dir)]
    log = open(work / side / "log.txt", "wb")  # closed when the child is done (finish)
    child = subprocess.Popen(
        [*args, "--cases", *cases],
        cwd=work / side,
        env=env | {"PYTHONPATH": os.pathsep.join(filter(None, paths))},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    child.log = log
    return child


def finish(side: str, child: subprocess.Popen, work: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(meta, outputs) a child left; meta["failed"] says why there are none."""
    from safetensors.torch import load_file

    rc = child.wait()
    child.log.close()
    meta_path, data_path = work / side / "meta.json", work / side / "outputs.safetensors"
    if rc or not meta_path.is_file() or not data_path.is_file():
        tail = (work / side / "log.txt").read_text(errors="replace").strip().splitlines()[-12:]
        return {"failed": f"exit status {rc}:\n" + "\n".join("    " + line for line in tail)}, {}
    return json.loads(meta_path.read_text()), load_file(str(data_path))


def run_kernels_child(out: Path, expect: Path, cases: list[str]) -> int:
    """The child: this process's `dsrope` (checked to come from `expect`) on the cases; outputs and errors
    written into `out`."""
    import traceback

    from safetensors.torch import save_file

    from dsrope_gate.startup import interpret_without_gpu

    interpret_without_gpu()
    import dsrope
    from dsrope_gate.snapshots import platform_key, run_kernels

    found = Path(dsrope.__file__).resolve().parent
    if found != expect.resolve():
        print(f"dsrope imported from {found}, expected {expect}", file=sys.stderr)
        return 3
    manifest = golden.read_manifest()  # the parent verified the whole store; load_case checks each case's file
    outputs, errors = {}, {}
    for name in cases:
        record, tensors = golden.load_case(golden.golden_root(), manifest, name)
        try:
            for stage, t in run_kernels(record, tensors).items():
                outputs[f"{name}/{stage}"] = t
        except Exception as e:  # a kernel that raises on a case: that case's result
            errors[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
    save_file(outputs, str(out / "outputs.safetensors"))
    meta = {"key": platform_key(), "versions": golden.versions(), "dsrope": str(found), "errors": errors}
    (out / "meta.json").write_text(json.dumps(meta))
    return 0


def child_env() -> dict:
    """The children's environment: compiled kernels on CUDA, else Triton's interpreter with CUDA hidden."""
    from dsrope_gate.startup import interpret_without_gpu

    env = dict(os.environ)
    if interpret_without_gpu():
        env |= {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    return env


# --- comparing two sets of outputs ----------------------------------------------------------------------------


@dataclass
class CaseResult:
    name: str
    lines: list[str] = field(default_factory=list)  # one per changed output
    first: list[str] = field(default_factory=list)  # the first changed element and its reproduction
    error: str = ""  # this tree's kernels raised on the case
    changes: list = field(default_factory=list)  # golden.Change per changed output
    outside: dict = field(default_factory=dict)  # output -> changed elements outside the model (None: no model)

    @property
    def changed(self) -> bool:
        return bool(self.changes or self.error)

    def model_text(self) -> str:
        known = [v for v in self.outside.values() if v is not None]
        if not known:
            return "not judged against the error model"
        n = sum(known)
        return "all inside the error model" if n == 0 else f"{n} changed elements outside the error model"


def of_case(outputs: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """A case's outputs, `op.stage` -> tensor, from outputs keyed `case/op.stage`."""
    return {k.split("/", 1)[1]: v for k, v in outputs.items() if k.startswith(name + "/")}


def model_of(stage: str, tensors: dict) -> dict | None:
    decoded = golden.decode_stage(stage, tensors) if f"{stage}.ref" in tensors else {}
    return decoded if "lo" in decoded and "hi" in decoded else None


def compare_case(name: str, record: dict, tensors: dict, old: dict, new: dict, device: str) -> CaseResult:
    """This case's outputs, `old` (the baseline's) against `new` (this tree's), `op.stage` -> tensor."""
    result = CaseResult(name)
    result.changes = golden.diff_tensors(name, old, new)
    for change in result.changes:
        stage = change.tensor
        model = model_of(stage, tensors)
        a, b = old.get(stage), new.get(stage)
        if model is None or a is None or b is None or a.shape != b.shape:
            result.outside[stage] = None
            result.lines.append(change_text(change) + ("; no error model stored" if model is None else ""))
            continue
        if a.dtype != b.dtype:  # as golden.diff_tensors counts them: in FP64
            a, b = a.double(), b.double()
        differ = ordered(a) != ordered(b)
        ok = inside(b.double(), model["ref"], model["lo"], model["hi"])
        outside = int((differ & ~ok).sum())
        result.outside[stage] = outside
        where = "all inside the error model" if outside == 0 else f"{outside} outside the error model"
        result.lines.append(f"{change_text(change)}; {where}")
        if not result.first:
            result.first = first_change(record, tensors, stage, a, b, differ, model, device)
    return result


def ulp_text(max_ulp: int | None, unit: str) -> str:
    if max_ulp is None:
        return "added, removed or reshaped"
    return "NaN vs number" if max_ulp >= NAN_VS_NUMBER else f"{max_ulp} ulp ({unit})"


def change_text(c: golden.Change) -> str:
    return f"{c.tensor}: {c.changed} / {c.total} elements, max {ulp_text(c.max_ulp, c.unit)}"


def first_change(record: dict, tensors: dict, stage: str, a, b, differ, model: dict, device: str) -> list[str]:
    """The first changed element of an output: its values, its model, and the Python that rebuilds the case's
    inputs and computes it."""
    i = tuple(int(v) for v in differ.nonzero()[0].tolist())
    at = ", ".join(map(str, i))
    ulp = ulp_text(int(ulp_distance(a[i], b[i])), str(a.dtype).removeprefix("torch."))
    lo, hi, ref = (model[k][i].item() for k in ("lo", "hi", "ref"))
    verdict = "inside" if bool(inside(b[i].double(), model["ref"][i], model["lo"][i], model["hi"][i])) else "OUTSIDE"
    return [
        f"first changed: {stage}[{at}]: baseline {a[i].item()!r}, this tree {b[i].item()!r}, {ulp}; "
        f"{verdict} the model [{lo!r}, {hi!r}] around the reference {ref!r}",
        *reproduction(record, tensors, stage, at, device),
    ]


# what ops.py's `call` passes for each tensor a signature names (the others are the case's fields)
TENSORS = {"x": "x", "cos": "cos", "sin": "sin", "freqs_cis": "torch.complex(cos, sin)"}


def reproduction(record: dict, tensors: dict, stage: str, at: str, device: str) -> list[str]:
    from dsrope_gate.conformance.judging import Prepared
    from dsrope_gate.ops import OPS

    case, inputs = golden.laid_out_inputs(record, tensors, device)
    op_name, output = stage.split(".")
    op = OPS[op_name]
    module, attr = op.dsrope.split(":")
    names = op.signature[op.signature.index("(") + 1 : -1].split(", ")
    args = ", ".join(TENSORS[n] if n in TENSORS else repr(getattr(case, n)) for n in names)
    call = f"{module}.{attr}({args})"
    compute = {
        "out": f"print({call}[{at}].item())",
        "dx": f"x.requires_grad_(True); print(torch.autograd.grad({call}, x, grad)[0][{at}].item())",
        "rstd": f"import dsrope.qnorm_rope; print(dsrope.qnorm_rope.qnorm_rope({args})[1][{at}].item())",
    }[output]
    interpret = "TRITON_INTERPRET=1 " if device == "cpu" else ""
    return [
        f"reproduce ({interpret}python, under either tree's dsrope):",
        f"  import torch; {Prepared(case, inputs).recipe}",
        f"  import {module}; {compute}",
    ]


def case_lines(result: CaseResult, width: int) -> list[str]:
    if result.error:
        return [f"  {result.name:<{width}}  changed: this tree's kernels raised {result.error}"]
    if not result.changes:
        return [f"  {result.name:<{width}}  bit-identical"]
    elements = sum(c.changed for c in result.changes)
    outputs = f"{len(result.changes)} output{'s' if len(result.changes) > 1 else ''}"
    head = f"  {result.name:<{width}}  changed: {elements} elements in {outputs}, {result.model_text()}"
    return [head, *("      " + line.strip() for line in result.lines), *("      " + line for line in result.first)]


# --- the check ----------------------------------------------------------------------------------------------------


def select_cases(manifest: dict, wanted: list[str] | None) -> list[str]:
    names = [c["name"] for c in manifest["cases"]]
    if not wanted:
        return names
    chosen = []
    for pattern in (p for arg in wanted for p in arg.split(",") if p):
        matched = fnmatch.filter(names, pattern)
        if not matched:
            raise Usage(f"--cases: no golden case {pattern!r}; the cases: {', '.join(names)}")
        chosen += [n for n in matched if n not in chosen]
    return chosen


def check(args) -> int:
    if args.baseline_src is not None:  # with --baseline REF: REF names them (no git needed)
        baseline_dir = package(args.baseline_src, f"--baseline-src {args.baseline_src}")
        label = f"the kernels in {args.baseline_src}"
        named = args.baseline_src / "COMMIT"  # the commit they are, where whoever extracted them wrote it
        if args.baseline:
            label = f"{args.baseline} ({label})"
        elif named.is_file():
            label += f" (commit {named.read_text().strip()[:12]})"
    elif not is_checkout():
        raise Usage(
            f"{ROOT} is not a git checkout: give the baseline's kernels as a folder with --baseline-src DIR "
            "(`git archive REF src/dsrope | tar -x -C DIR` where the history is)"
        )
    else:
        commit = resolve(args.baseline) if args.baseline else default_baseline()
        ref = args.baseline or "the merge base of HEAD and main"
        label = f"{ref} ({commit[:12]})"
        baseline_dir = None
    try:
        manifest = golden.verify_all()
    except golden.GoldenError as e:
        raise NoBaseline(f"the golden store cannot be read: {e}") from None
    cases = select_cases(manifest, args.cases)
    env = child_env()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dsrope-bits-") as tmp:
        work = Path(tmp)
        if baseline_dir is None:
            baseline_dir = extract(commit, work / "archive")
        children = {
            "baseline": start("baseline", baseline_dir, cases, work, env),
            "tree": start("tree", (ROOT / "src" / "dsrope").resolve(), cases, work, env),
        }
        (base_meta, base), (tree_meta, tree) = (finish(side, child, work) for side, child in children.items())
    seconds = time.monotonic() - t0
    if "failed" in base_meta:
        raise NoBaseline(f"the baseline's kernels ({label}) did not run, {base_meta['failed']}")
    if base_meta["errors"]:
        name, error = next(iter(base_meta["errors"].items()))
        raise NoBaseline(f"the baseline's kernels ({label}) raised on case {name}: {error}")
    if "failed" in tree_meta:
        print(f"this tree's kernels did not run, {tree_meta['failed']}")
        return CHANGED
    key, versions = tree_meta["key"], tree_meta["versions"]
    device = "cpu" if key["device"] == "interpreter" else "cuda"
    cases_text = f"{len(cases)} golden case{'s' if len(cases) > 1 else ''}"
    print(
        f"kernel bits of this tree ({ROOT}) against {label}, on {key['device']} "
        f"(torch {versions['torch']}, triton {versions['triton']}), {cases_text}:"
    )
    results = []
    for name in cases:
        record, tensors = golden.load_case(golden.golden_root(), manifest, name)
        if name in tree_meta["errors"]:
            results.append(CaseResult(name, error=tree_meta["errors"][name]))
            continue
        results.append(compare_case(name, record, tensors, of_case(base, name), of_case(tree, name), device))
    return report(results, seconds)


def report(results: list[CaseResult], seconds: float) -> int:
    width = max((len(r.name) for r in results), default=0)
    for r in results:
        print("\n".join(case_lines(r, width)))
    changed = [r.name for r in results if r.changed]
    verdict = f"{len(changed)} of {len(results)} cases changed: {', '.join(changed)}" if changed else "no change"
    print(f"{verdict} ({seconds:.1f} s for both sides' kernels)")
    return CHANGED if changed else SAME


# --- the intentional change: record this platform's snapshot --------------------------------------------------


def commit_text(given: str | None) -> str:
    if given:
        return given
    if not is_checkout():
        return "unknown (not a git checkout; name it with --commit)"
    head = git("rev-parse", "--short=12", "HEAD").stdout.decode().strip()
    dirty = git("status", "--porcelain", "--", "src/dsrope").stdout.strip()
    return f"{head} with uncommitted changes to src/dsrope" if dirty else head


def record(args) -> int:
    from dsrope_gate.startup import interpret_without_gpu

    interpret_without_gpu()
    from dsrope_gate.snapshots import kernel_device, kernel_snapshot, platform_key

    root = golden.golden_root()
    key = platform_key()
    data_path, sidecar = golden.snapshot_paths(root, key)
    try:
        manifest = golden.verify_all(root)
        previous = golden.read_snapshot(sidecar) if sidecar.is_file() else None
    except golden.GoldenError as e:
        raise NoBaseline(f"the golden store cannot be read: {e}") from None
    outputs, inputs = kernel_snapshot(root)
    lines, results = [], []
    if previous is None:
        lines.append("no previous snapshot of this platform")
    else:
        meta, stored = previous
        for c in manifest["cases"]:
            name = c["name"]
            record, tensors = golden.load_case(root, manifest, name)
            if meta["inputs"].get(name) != inputs[name]:
                lines.append(f"case {name}: the previous snapshot has no outputs for these inputs")
            old, new = of_case(stored, name), of_case(outputs, name)
            results.append(compare_case(name, record, tensors, old, new, kernel_device().type))
    golden.write_snapshot(root, key, outputs, inputs)
    entry = record_entry(key, commit_text(args.commit), args.note, results, lines, data_path)
    records = args.records
    records.parent.mkdir(parents=True, exist_ok=True)
    if not records.is_file():
        records.write_text(RECORDS_HEAD)
    with records.open("a") as f:
        f.write(entry)
    print(entry.strip())
    print(f"recorded {golden.relname(data_path)} and {golden.relname(sidecar)}; appended the entry to {records}")
    return SAME


RECORDS_HEAD = """# Kernel bit snapshots: the record

One entry per snapshot recorded with `python -m dsrope_dev.bits --record` (docs/regression-gate.md), appended by
that command, never edited: when, which commit on which card with which torch and triton, and what changed
against the snapshot of that platform it replaced.
"""


def record_entry(key: dict, commit: str, note: str | None, results: list, lines: list[str], data_path: Path) -> str:
    versions = golden.versions()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cuda = f", CUDA {torch.version.cuda}" if key["device"] != "interpreter" else ""
    out = [
        f"\n## {when}: {golden.relname(data_path)}\n",
        f"Commit {commit}; {key['device']}; torch {versions['torch']}{cuda}, triton {versions['triton']}, "
        f"python {versions['python']}.",
    ]
    if note:
        out.append(f"Why: {note}")
    out += lines
    changed = [r for r in results if r.changed]
    if results and not changed:
        out.append(f"Against the previous snapshot: no change in {len(results)} cases.")
    if changed:
        out += [
            f"Against the previous snapshot: {len(changed)} of {len(results)} cases changed.",
            "",
            "| case | output | elements changed | max ulp | inside the error model |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in changed:
            for c in r.changes:
                outside = r.outside.get(c.tensor)
                model = "no model stored" if outside is None else ("all" if outside == 0 else f"{outside} outside")
                out.append(
                    f"| {r.name} | {c.tensor} | {c.changed} / {c.total} | {ulp_text(c.max_ulp, c.unit)} | {model} |"
                )
    return "\n".join(out) + "\n"


# --- the command ----------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dsrope_dev.bits", description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--baseline", metavar="REF", help="the git revision whose kernels are the baseline (default: the merge base "
        "of HEAD and main)")  # fmt: skip
    add("--baseline-src", type=Path, metavar="DIR", help="the baseline's kernels as a folder, where git history is "
        "not at hand: an extracted src/dsrope (or a folder holding dsrope/ or src/dsrope/); with --baseline REF, "
        "REF only names them")  # fmt: skip
    add("--cases", nargs="+", metavar="NAME", help="the golden cases to run (names or patterns, space- or "
        "comma-separated; default: every case)")  # fmt: skip
    add("--record", action="store_true", help="record this platform's committed snapshot from this tree's kernels "
        "and append the record to docs/records/snapshots.md")  # fmt: skip
    add("--commit", help="with --record: the commit to name in the record, where git cannot tell")
    add("--note", help="with --record: why the bits change, for the record")
    add("--records", type=Path, default=RECORDS, help=argparse.SUPPRESS)
    add("--snapshot-status", action="store_true", help="say in one line whether this device and Triton have a "
        "committed snapshot, and otherwise how to run the check")  # fmt: skip
    add("--run-kernels", type=Path, help=argparse.SUPPRESS)  # a child's output folder
    add("--expect", type=Path, help=argparse.SUPPRESS)  # the folder a child's dsrope must come from
    return p


def main(argv=None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on a bad option, 0 on --help
        return int(e.code or 0)
    try:
        if args.run_kernels:
            return run_kernels_child(args.run_kernels, args.expect, args.cases)
        modes = [args.record, args.snapshot_status, bool(args.baseline or args.baseline_src)]
        if sum(modes) > 1:
            raise Usage("--record, --snapshot-status and --baseline/--baseline-src exclude each other")
        if (args.commit or args.note) and not args.record:
            raise Usage("--commit and --note go with --record")
        if args.cases and (args.record or args.snapshot_status):
            raise Usage("--cases goes with the check: a snapshot holds every golden case")
        if args.snapshot_status:
            from dsrope_gate.startup import interpret_without_gpu

            interpret_without_gpu()
            print(snapshot_status())
            return SAME
        return record(args) if args.record else check(args)
    except Usage as e:
        print(f"usage error: {e}", file=sys.stderr)
        return USAGE
    except NoBaseline as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return NO_BASELINE


if __name__ == "__main__":
    sys.exit(main())
