"""Sessions: tests (CPU, own venv), gpu-tests (CUDA, the environment it finds), bits (the kernels' bits
against a baseline's, the environment found), lint, and the others (golden, verify, mutants, bench)."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

# The CPU wheel of torch lies on local disk on our machines; an unpinned torch may pull a
# multi-GB CUDA build.
CPU_TORCH = "torch==2.13.0"
# The triton releases the CPU suite runs the kernels' interpreter with: the oldest that pyproject.toml
# claims and the newest on the package index when this was written (the H200 compiles with 3.6.0).
TRITONS = ["3.9.0", "3.2.0"]
# The Triton specializations gpu-tests compiles before its workers start (dsrope_dev.compile_cache)
SPECIALIZATIONS = ROOT / "tests" / "triton_specializations.jsonl.gz"
RECORD = "DSROPE_RECORD_SPECIALIZATIONS"
# The peers' pinned releases (src/dsrope_gate/pins.py, their one home), read without importing the gate (no torch)
PINS = runpy.run_path(str(ROOT / "src" / "dsrope_gate" / "pins.py"))["PINS"]


def checkout_path() -> str:
    """PYTHONPATH for the sessions that run in the environment they find (no install): the checkout's
    packages (src/: dsrope, dsrope_gate; reference/: dsrope_reference; dev/: dsrope_dev) and its root (tests,
    tools)."""
    paths = [str(ROOT / "src"), str(ROOT / "reference"), str(ROOT / "dev"), str(ROOT), os.environ.get("PYTHONPATH")]
    return os.pathsep.join(filter(None, paths))


# Whether every named module can be found, asked without importing them: a missing one is an answer,
# not a traceback (a fresh machine's first `nox -s verify` has no torch yet).
FIND = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))"


def has_modules(session: nox.Session, *modules: str) -> bool:
    """Whether the session's python finds all `modules` (asked directly: nox would log a failed probe as
    a failed command); says which install follows when not."""
    python = str(Path(session.bin) / "python")
    if subprocess.run([python, "-c", FIND, *modules], capture_output=True).returncode == 0:
        return True
    session.log("torch or the test packages are not installed here: installing them into this session's venv")
    return False


def install_cpu(session: nox.Session, *extras: str) -> None:
    session.install(CPU_TORCH)  # before the project: its torch requirement is then met by this wheel
    session.install("-e", f".[{','.join(('test', *extras))}]")


def check_ran(session: nox.Session, junit: Path) -> None:
    """Fail when pytest ran no test (every test skipped or deselected counts as none)."""
    suites = ET.parse(junit).getroot().iter("testsuite")
    tests = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        skipped += int(s.get("skipped", 0))
    ran = tests - skipped
    session.log(f"pytest: {tests} collected, {ran} ran, {skipped} skipped")
    if ran <= 0:
        session.error("no test ran")


def pytest_args(session: nox.Session, junit: Path, default_workers: str) -> list[str]:
    args = list(session.posargs)
    if not any(a == "-n" or a.startswith("-n") or a.startswith("--numprocesses") for a in args):
        args = ["-n", default_workers, *args]
    if not any(a.startswith("--dist") for a in args):
        # One test at a time to whichever worker is free: with the long tests first (conftest.py) that
        # is longest-first list scheduling, and no worker holds a queue of long tests while others idle.
        args = ["--dist", "load", "--maxschedchunk", "1", *args]
    return ["-m", "pytest", f"--junitxml={junit}", *args]


def gpu_workers() -> str:
    """xdist workers for gpu-tests: Triton compiles and the FP64 reference are CPU work, so half the
    host's cores (2 threads each, conftest.py), at most 8 (8 on the H200's 16 cores:
    docs/records/2026-12-03-h200-gpu-runs.md)."""
    return str(max(1, min(8, (os.cpu_count() or 2) // 2)))


@nox.session
@nox.parametrize("triton", TRITONS)
def tests(session: nox.Session, triton: str) -> None:
    """The CPU suite: the real Triton kernels in Triton's interpreter against the reference, once with
    each triton of TRITONS (`nox -s tests` runs both; `nox -s "tests(triton='3.9.0')"` one)."""
    install_cpu(session)
    session.install(f"triton=={triton}")
    # the peers whose pinned releases run on CPU (tests/test_presets.py; transformers is in the test extra)
    session.install("--no-deps", PINS["sglang"], PINS["nemo-automodel"], PINS["veomni"])
    junit = Path(session.create_tmp()) / "junit.xml"
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    session.run("python", *pytest_args(session, junit, "auto"), env=env)
    check_ran(session, junit)


@nox.session(name="gpu-tests", venv_backend="none")
def gpu_tests(session: nox.Session) -> None:
    """The whole suite on CUDA, compiled kernels, in the environment found (no installs)."""
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    try:
        session.run("python", "-c", probe, silent=True)
    except nox.command.CommandFailed:
        session.error(
            "gpu-tests needs a visible CUDA device (torch.cuda.is_available() is False); "
            "on a CPU machine run `nox -s tests`"
        )
    junit = ROOT / "out" / "gpu-junit.xml"
    junit.parent.mkdir(exist_ok=True)
    env = {
        "TRITON_INTERPRET": "0",
        "PYTHONPATH": checkout_path(),
        "HYPOTHESIS_PROFILE": "gpu",
        # Triton's MLIR contexts are multithreaded by default; the xdist workers already keep every
        # core busy, so each compile runs single-threaded (the generated code is the same either way).
        "MLIR_DISABLE_MULTITHREADING": "1",
    }
    # The kernel bits: compared with this card's committed snapshot (tests/test_golden.py), or, where none is
    # committed, the one line saying how to check them against a baseline instead (those tests skip with it).
    status = session.run("python", "-m", "dsrope_dev.bits", "--snapshot-status", env=env, silent=True)
    session.log(status.strip().splitlines()[-1])
    # Every specialization the suite compiles, compiled once on every core before the workers start
    # (dsrope_dev.compile_cache; DSROPE_WARM=0 skips it); what the tests compile is recorded, and
    # the session says how much of it the list lacks.
    recorded = ROOT / "out" / "specializations"
    shutil.rmtree(recorded, ignore_errors=True)
    cache = ["python", "-m", "dsrope_dev.compile_cache"]
    if os.environ.get("DSROPE_WARM", "1") != "0":
        session.run(*cache, "warm", str(SPECIALIZATIONS), env=env)
    session.run("python", *pytest_args(session, junit, gpu_workers()), env=env | {RECORD: str(recorded)})
    check_ran(session, junit)
    session.run(*cache, "missing", str(recorded), str(SPECIALIZATIONS), env=env)


@nox.session(venv_backend="none")
def bits(session: nox.Session) -> None:
    """The bit-level regression check (dsrope_dev.bits), in the environment found (as gpu-tests): this tree's
    kernels against a baseline's on this device, compiled on CUDA, interpreted on CPU.

    `nox -s bits -- --baseline REF` (default: the merge base with main; `--baseline-src DIR` for an extracted
    src/dsrope; `--cases NAME ...`); `nox -s bits -- --record` records this device's snapshot and its record.
    Exit 0 no change, 1 changed bits, 2 a usage error, 3 no baseline (docs/regression-gate.md)."""
    session.run("python", "-m", "dsrope_dev.bits", *session.posargs, env={"PYTHONPATH": checkout_path()})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format, all Python) and import-linter (the folders' import boundaries, pyproject.toml)."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", "--diff", ".")
    session.run("lint-imports", env={"PYTHONPATH": checkout_path()})


def cuda_session_env() -> dict:
    return {"TRITON_INTERPRET": "0", "PYTHONPATH": checkout_path()}


@nox.session(venv_backend="none")
def sanitize(session: nox.Session) -> None:
    """compute-sanitizer memcheck over representative launches (CUDA host; zero errors to pass)."""
    env = cuda_session_env() | {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    session.run(
        "compute-sanitizer",
        "--tool",
        "memcheck",
        "--error-exitcode",
        "1",
        "--leak-check",
        "no",
        "python",
        "-m",
        "tools.sanitize_launches",
        external=True,
        env=env,
    )


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Benchmark on CUDA: CSV, markdown table and chart under out/bench (see bench/bench.py)."""
    session.run("python", "-m", "bench.bench", *session.posargs, env=cuda_session_env())


@nox.session
def golden(session: nox.Session) -> None:
    """Regenerate the reference goldens from the reference and diff them against golden/ (tools/golden.py).
    Writes only with `-- --update`; `-- --update-snapshot` records this platform's kernel bits (here:
    the interpreter). An intended change of the kernels' bits is recorded with `nox -s bits -- --record` on each
    platform (docs/regression-gate.md), which also writes the record."""
    install_cpu(session)
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    session.run("python", "-m", "tools.golden", *session.posargs, env=env | {"PYTHONPATH": checkout_path()})


@nox.session(venv_params=["--system-site-packages"])
def verify(session: nox.Session) -> None:
    """The accuracy report (tools/verify.py): compiled kernels on CUDA, the interpreter on CPU.

    The venv sees the system's packages, so a GPU host's torch (and its offline packages) is used
    as found; on a fresh CPU machine the CPU wheel and the test deps are installed.
    """
    if not has_modules(session, "torch", "triton", "numpy", "ml_dtypes", "mpmath", "safetensors", "matplotlib"):
        install_cpu(session, "report")
    session.run("python", "-m", "tools.verify", *session.posargs, env={"PYTHONPATH": checkout_path()})


@nox.session(venv_params=["--system-site-packages"])
def conformance(session: nox.Session) -> None:
    """Judge any implementation (or the presets) against the contract: dsrope_gate.conformance.

    `nox -s conformance -- --op qnorm_rope --impl module.path:callable [--device cpu|cuda] [--json PATH]`.
    Packages as for verify: a GPU host's torch as found, else the CPU wheel and the gate extra."""
    if not has_modules(session, "torch", "triton", "numpy", "ml_dtypes", "mpmath", "hypothesis", "safetensors"):
        install_cpu(session)
    if any(a.startswith("--preset") for a in session.posargs):
        # the peers' pinned releases (transformers comes with the test extra, and flash-attn's and megatron-core's
        # one module each is fetched at first use), without their dependency trees
        session.install("--no-deps", PINS["veomni"], PINS["sglang"], PINS["nemo-automodel"])
    session.run("python", "-m", "dsrope_gate.conformance", *session.posargs, env={"PYTHONPATH": checkout_path()})


@nox.session(name="gpu-mutants", venv_backend="none")
def gpu_mutants(session: nox.Session) -> None:
    """The GPU-only mutants (32-bit offsets) against the gpu-marked tests, on CUDA, in the environment
    found (as gpu-tests: a CUDA host's packages need not be visible to a fresh virtualenv)."""
    session.run("python", "-m", "tools.mutants", "--gpu", *session.posargs, env={"PYTHONPATH": checkout_path()})


@nox.session(venv_params=["--system-site-packages"])
def mutants(session: nox.Session) -> None:
    """Mutation gate (dsrope_dev.mutation): every seeded kernel fault must fail the suite.

    CPU: the CPU mutants against the whole CPU suite in the interpreter, each first against the tests that reach
    its edits (the map kept in out/mutants/, docs/mutation-gate.md; `-- --no-map` runs without it). Packages as
    for verify.
    On a CUDA host use `nox -s gpu-mutants` (this session's virtualenv may not see the host's torch).
    """
    modules = ("torch", "triton", "numpy", "ml_dtypes", "mpmath", "hypothesis", "pytest", "xdist", "safetensors")
    if not has_modules(session, *modules):
        install_cpu(session)
    session.run("python", "-m", "tools.mutants", *session.posargs, env={"PYTHONPATH": checkout_path()})
