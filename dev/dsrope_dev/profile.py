"""Where the gate's time goes: a pytest plugin that splits each test's wall time.

    python -m pytest -p dsrope_dev.profile ...          # writes out/gate-profile/<worker>.csv
    python -m dsrope_dev.profile out/gate-profile       # the summary of those files

Per test (setup + call + teardown) it records the wall time, the number of Triton kernel compiles
and the seconds spent in them (Triton's `compile`, a disk-cache hit included), and the seconds spent
inside the reference (any function of the `dsrope_reference` package, outermost call only). The rest is
the test's own work: hypothesis drawing examples, building inputs, kernel launches and syncs.
"""

from __future__ import annotations

import csv
import functools
import inspect
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

_clock = {"compile_s": 0.0, "compiles": 0, "reference_s": 0.0}
_compiles: list[dict] = []  # one entry per Triton compile: kernel, seconds, its specialization
_depth = {"reference": 0}


def out_folder() -> Path:
    """Where the per-worker files go: $GATE_PROFILE_OUT, default out/gate-profile."""
    return Path(os.environ.get("GATE_PROFILE_OUT", "out/gate-profile"))


def _timed_compile(compile_fn):
    @functools.wraps(compile_fn)
    def compile(*args, **kwargs):
        start = time.perf_counter()
        try:
            return compile_fn(*args, **kwargs)
        finally:
            seconds = time.perf_counter() - start
            _clock["compile_s"] += seconds
            _clock["compiles"] += 1
            src = args[0] if args else kwargs.get("src")
            fn = getattr(src, "fn", None)
            _compiles.append(
                dict(
                    kernel=getattr(fn, "__name__", type(src).__name__),
                    seconds=round(seconds, 4),
                    constants=repr(sorted(getattr(src, "constants", {}).items(), key=repr)),
                    attrs=repr(getattr(src, "attrs", None)),
                    signature=repr(getattr(src, "signature", None)),
                )
            )

    compile._gate_profile = True
    return compile


def _timed_reference(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _depth["reference"] += 1
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _depth["reference"] -= 1
            if _depth["reference"] == 0:
                _clock["reference_s"] += time.perf_counter() - start

    return wrapper


def _install() -> None:
    import triton.compiler
    import triton.compiler.compiler

    if not getattr(triton.compiler.compile, "_gate_profile", False):
        wrapped = _timed_compile(triton.compiler.compiler.compile)
        # JITFunction imports `compile` from triton.compiler when it first compiles
        triton.compiler.compile = wrapped
        triton.compiler.compiler.compile = wrapped
    import dsrope_reference.floats
    import dsrope_reference.qnorm_rope
    import dsrope_reference.rope
    import dsrope_reference.rope_utils

    for module in (
        dsrope_reference.floats,
        dsrope_reference.rope,
        dsrope_reference.qnorm_rope,
        dsrope_reference.rope_utils,
    ):
        for name, fn in list(vars(module).items()):
            if inspect.isfunction(fn) and fn.__module__ == module.__name__:
                setattr(module, name, _timed_reference(fn))
        # functions other reference modules imported by name before the wrapping
        for other in (
            dsrope_reference.floats,
            dsrope_reference.rope,
            dsrope_reference.qnorm_rope,
            dsrope_reference.rope_utils,
        ):
            for name, fn in list(vars(other).items()):
                if inspect.isfunction(fn) and fn.__module__ == module.__name__ and other is not module:
                    setattr(other, name, getattr(module, name))
    # the model classes' methods (Model.judge, ...) are reference time too
    for module in (dsrope_reference.rope, dsrope_reference.qnorm_rope):
        for cls in vars(module).values():
            if inspect.isclass(cls) and cls.__module__ == module.__name__:
                for name, fn in list(vars(cls).items()):
                    if inspect.isfunction(fn) and not name.startswith("__"):
                        setattr(cls, name, _timed_reference(fn))


_rows: list[dict] = []


def pytest_configure(config):
    _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _clock.update(compile_s=0.0, compiles=0, reference_s=0.0)
    start = time.perf_counter()
    yield
    wall = time.perf_counter() - start
    for c in _compiles[len(_compiles) - _clock["compiles"] :]:
        c["test"] = item.nodeid
    _rows.append(
        dict(
            test=item.nodeid,
            wall_s=round(wall, 4),
            compiles=_clock["compiles"],
            compile_s=round(_clock["compile_s"], 4),
            reference_s=round(_clock["reference_s"], 4),
        )
    )


def pytest_unconfigure(config):
    if not _rows:
        return
    out = out_folder()
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(out / f"{worker}.compiles.jsonl", "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in _compiles)
    with open(out / f"{worker}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(_rows[0]))
        writer.writeheader()
        writer.writerows(_rows)


def summarize(folder: Path, top: int = 25) -> str:
    rows = []
    for path in sorted(folder.glob("*.csv")):
        with open(path) as f:
            rows += [dict(r, worker=path.stem) for r in csv.DictReader(f)]
    for r in rows:
        for k in ("wall_s", "compile_s", "reference_s"):
            r[k] = float(r[k])
        r["compiles"] = int(r["compiles"])
        r["other_s"] = r["wall_s"] - r["compile_s"] - r["reference_s"]
    total = {k: sum(r[k] for r in rows) for k in ("wall_s", "compiles", "compile_s", "reference_s", "other_s")}
    lines = [
        f"{len(rows)} tests; summed over workers: wall {total['wall_s']:.1f} s = Triton compile "
        f"{total['compile_s']:.1f} s ({total['compiles']} compiles) + reference {total['reference_s']:.1f} s "
        f"+ other {total['other_s']:.1f} s",
        "",
        "| module | tests | wall s | compiles | compile s | reference s | other s |",
        "|---|---|---|---|---|---|---|",
    ]
    by_module = defaultdict(lambda: defaultdict(float))
    for r in rows:
        m = by_module[r["test"].split("::")[0]]
        m["tests"] += 1
        for k in ("wall_s", "compiles", "compile_s", "reference_s", "other_s"):
            m[k] += r[k]
    for name, m in sorted(by_module.items(), key=lambda kv: -kv[1]["wall_s"]):
        lines.append(
            f"| {name} | {int(m['tests'])} | {m['wall_s']:.1f} | {int(m['compiles'])} | {m['compile_s']:.1f} "
            f"| {m['reference_s']:.1f} | {m['other_s']:.1f} |"
        )
    lines += [
        "",
        "| slowest tests | wall s | compiles | compile s | reference s | other s |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -r["wall_s"])[:top]:
        lines.append(
            f"| {r['test']} | {r['wall_s']:.2f} | {r['compiles']} | {r['compile_s']:.2f} | {r['reference_s']:.2f} "
            f"| {r['other_s']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarize(Path(sys.argv[1]) if len(sys.argv) > 1 else out_folder()))
