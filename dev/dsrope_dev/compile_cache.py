"""Compile every Triton specialization of the GPU suite once, before its xdist workers start.

Why: on the H200 host most of `nox -s gpu-tests` is Triton compiling (375 of 662 worker-seconds:
docs/records/2026-12-04-h200-gpu-runs.md), and the 8 workers start the same tests at once, so they compile the same
specializations side by side. Compiled once each, in a process pool on every core, into Triton's
disk cache, the workers then find every kernel there.

How: Triton (3.4 and later) calls `knobs.runtime.jit_post_compile_hook` after each JIT compile with the
specialization serialized (`specialization_data`: signature, constexprs, attributes, options), and
`JITFunction.preload(specialization_data)` compiles exactly that specialization again (its own API for
warming a cache). The suite records what it compiled (`record`, installed by conftest.py when
`DSROPE_RECORD_SPECIALIZATIONS` names a folder); `merge` writes the union to a list that is
committed (tests/triton_specializations.jsonl.gz, gzipped JSON lines: 1,036 specializations are 2.2 MB
of text, mostly the same options; recorded on the H200 with the triton it runs); `warm` preloads that list
when the installed triton is the one that recorded it. A stale list costs time, never correctness: a
specialization it lacks is compiled by the test that needs it, one it has in excess is compiled for
nothing, and the kernels' source is part of Triton's cache key, so an edited kernel is compiled from its
new source.

    python -m dsrope_dev.compile_cache warm tests/triton_specializations.jsonl.gz
    python -m dsrope_dev.compile_cache merge out/specializations tests/triton_specializations.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

RECORD_ENV = "DSROPE_RECORD_SPECIALIZATIONS"


def hooks_available() -> bool:
    """Whether this triton has the JIT hooks and preload (3.4 and later; not 3.2)."""
    import triton

    knobs = getattr(triton, "knobs", None)
    return knobs is not None and hasattr(knobs.runtime, "jit_post_compile_hook")


def record(folder: Path) -> None:
    """Append every specialization this process compiles to folder/<xdist worker>.jsonl.

    Chains onto a hook someone else installed (torch may), and records nothing Triton cannot preload
    by name (kernels defined inside functions)."""
    import triton

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}.jsonl"
    previous = triton.knobs.runtime.jit_post_compile_hook

    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if "<locals>" not in fn.name:
            with open(path, "a") as f:
                f.write(compile["specialization_data"] + "\n")
        if previous is not None:
            return previous(
                key=key,
                repr=repr,
                fn=fn,
                compile=compile,
                is_manual_warmup=is_manual_warmup,
                already_compiled=already_compiled,
            )
        return None

    triton.knobs.runtime.jit_post_compile_hook = hook


def specialization_key(line: str) -> str:
    """One specialization's identity: its serialized data without `key`, the launching process's own
    cache key (the same specialization serializes with equal fields in every process)."""
    data = json.loads(line)
    data.pop("key", None)
    return json.dumps(data, sort_keys=True)


def _open(path: Path, mode: str):
    return gzip.open(path, mode + "t") if path.suffix == ".gz" else open(path, mode)


def read(path: Path) -> list[str]:
    """The list's specializations, one JSON object a line (the first line says which triton recorded them)."""
    with _open(path, "r") as f:
        return [line for line in f.read().splitlines()[1:] if line.strip()]


def recorded_with(path: Path) -> str:
    """The triton version that recorded the list."""
    with _open(path, "r") as f:
        return json.loads(f.readline())["recorded_with_triton"]


def merge(folder: Path, path: Path) -> tuple[int, int]:
    """Write to `path` every distinct specialization recorded under `folder`, sorted (a stable diff).
    Returns (distinct recorded, of them not in the list before)."""
    import triton

    before = {specialization_key(line) for line in read(path)} if path.exists() else set()
    recorded = {}
    for part in sorted(folder.glob("*.jsonl")):
        for line in part.read_text().splitlines():
            recorded.setdefault(specialization_key(line), line)
    header = json.dumps({"recorded_with_triton": triton.__version__, "by": "python -m dsrope_dev.compile_cache"})
    with _open(path, "w") as f:
        f.write(header + "\n" + "".join(recorded[k] + "\n" for k in sorted(recorded)))
    return len(recorded), len(set(recorded) - before)


def missing(folder: Path, path: Path) -> int:
    """How many distinct specializations recorded under `folder` the list at `path` lacks."""
    listed = {specialization_key(line) for line in read(path)} if path.exists() else set()
    recorded = {specialization_key(line) for part in folder.glob("*.jsonl") for line in part.read_text().splitlines()}
    return len(recorded - listed)


def _kernel(full_name: str):
    """The JITFunction named module.qualname (get_full_name in triton.runtime.jit)."""
    module_name, _, attribute = full_name.rpartition(".")
    return getattr(importlib.import_module(module_name), attribute)


def _preload(line: str) -> tuple[str, float, str | None]:
    name = json.loads(line)["name"]
    start = time.perf_counter()
    try:
        _kernel(name).preload(line)
    except Exception as e:  # a kernel renamed or gone since the list was recorded: the test compiles it
        return name, time.perf_counter() - start, f"{type(e).__name__}: {e}"[:200]
    return name, time.perf_counter() - start, None


def _worker_setup(paths: list[str]) -> None:
    sys.path[:0] = [p for p in paths if p not in sys.path]


def warm(path: Path, processes: int) -> dict:
    """Preload every specialization of the list at `path` into Triton's disk cache, `processes` at a
    time (spawned: each initialises CUDA itself). Returns counts and seconds."""
    lines = read(path)
    start = time.perf_counter()
    failures = {}  # kernel name -> its first error
    failed = 0
    compile_s = 0.0
    context = get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_worker_setup, initargs=(sys.path,)) as pool:
        for name, seconds, error in pool.map(_preload, lines, chunksize=1):
            compile_s += seconds
            if error is not None:
                failed += 1
                failures.setdefault(name, error)
    return dict(
        specializations=len(lines),
        failed=failed,
        failures=failures,
        compile_s=round(compile_s, 1),
        wall_s=round(time.perf_counter() - start, 1),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    w = sub.add_parser("warm", help="preload a list's specializations into Triton's disk cache")
    w.add_argument("list", type=Path)
    w.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    m = sub.add_parser("merge", help="write the specializations recorded in a folder to a list")
    m.add_argument("folder", type=Path)
    m.add_argument("list", type=Path)
    c = sub.add_parser("missing", help="how many specializations recorded in a folder a list lacks")
    c.add_argument("folder", type=Path)
    c.add_argument("list", type=Path)
    args = ap.parse_args(argv)
    import triton

    if not hooks_available():
        print(f"compile_cache: triton {triton.__version__} has no JIT hooks (3.4+): nothing to do")
        return 0
    if args.command == "merge":
        distinct, new = merge(args.folder, args.list)
        print(f"compile_cache: {distinct} distinct specializations written to {args.list} ({new} not listed before)")
        return 0
    if args.command == "missing":
        lacking = missing(args.folder, args.list)
        refresh = f"python -m dsrope_dev.compile_cache merge {args.folder} {args.list}"
        print(
            f"compile_cache: {lacking} specializations compiled by the tests are not in {args.list}"
            + (f" (they were compiled during the tests; to list them: {refresh})" if lacking else "")
        )
        return 0
    if not args.list.exists():
        print(f"compile_cache: no list at {args.list}: nothing to warm")
        return 0
    if recorded_with(args.list) != triton.__version__:
        print(
            f"compile_cache: {args.list} was recorded with triton {recorded_with(args.list)}, this is "
            f"{triton.__version__}: not warmed (the tests compile what they need)"
        )
        return 0
    result = warm(args.list, args.processes)
    print(
        f"compile_cache: {result['specializations']} specializations preloaded in {result['wall_s']} s "
        f"({args.processes} processes, {result['compile_s']} s of compiles); {result['failed']} failed"
    )
    for name, error in result["failures"].items():
        print(f"  {name}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
