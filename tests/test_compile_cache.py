"""The warm-up of Triton's cache before gpu-tests (dsrope_dev.compile_cache): the list's bookkeeping
on CPU, and on CUDA that a warmed cache serves a fresh process's launch without a compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton

from dsrope_dev import compile_cache

ROOT = Path(__file__).resolve().parents[1]
LISTED = ROOT / "tests" / "triton_specializations.jsonl.gz"


def spec(name="dsrope.rope._rotate", warps=1, key="k1"):
    return json.dumps({"name": name, "signature": {"x": "*bf16"}, "options": {"num_warps": warps}, "key": key})


def test_merge_keeps_one_of_each_specialization_whatever_its_process_key(tmp_path):
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "gw0.jsonl").write_text(spec(key="a") + "\n" + spec(warps=2, key="b") + "\n")
    (recorded / "gw1.jsonl").write_text(spec(key="c") + "\n")
    listed = tmp_path / "list.jsonl.gz"
    assert compile_cache.merge(recorded, listed) == (2, 2)
    lines = compile_cache.read(listed)
    assert len(lines) == 2 and compile_cache.recorded_with(listed) == triton.__version__
    assert sorted(json.loads(line)["options"]["num_warps"] for line in lines) == [1, 2]
    # merging again adds nothing; a new specialization is counted as new
    (recorded / "gw2.jsonl").write_text(spec(warps=4) + "\n")
    assert compile_cache.missing(recorded, listed) == 1
    assert compile_cache.merge(recorded, listed) == (3, 1)
    assert compile_cache.missing(recorded, listed) == 0


def test_record_appends_each_compile_and_calls_the_hook_it_found(tmp_path, monkeypatch):
    if not compile_cache.hooks_available():
        pytest.skip(f"triton {triton.__version__} has no JIT hooks")
    seen = []
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["key"]))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    compile_cache.record(tmp_path)
    hook = triton.knobs.runtime.jit_post_compile_hook

    class Fn:
        name = "dsrope.rope._rotate"

    for key in ("one", "two"):
        hook(key=key, repr="", fn=Fn, compile={"specialization_data": spec(key=key)}, is_manual_warmup=False,
             already_compiled=False)  # fmt: skip
    Fn.name = "tests.x.f.<locals>.kernel"  # not importable by name: not recorded
    hook(key="three", repr="", fn=Fn, compile={"specialization_data": spec(key="three")}, is_manual_warmup=False,
         already_compiled=False)  # fmt: skip
    (path,) = tmp_path.glob("gw7-*.jsonl")
    assert [json.loads(line)["key"] for line in path.read_text().splitlines()] == ["one", "two"]
    assert seen == ["one", "two", "three"]


def test_the_committed_list_names_kernels_that_exist():
    """A renamed or deleted kernel leaves its specializations in the list, compiled for nothing."""
    if not LISTED.exists():
        pytest.skip("no list recorded yet")
    lines = compile_cache.read(LISTED)
    assert lines, "the list is empty"
    for name in sorted({json.loads(line)["name"] for line in lines}):
        kernel = compile_cache._kernel(name)  # a JITFunction, or the interpreter's stand-in on CPU
        assert f"{kernel.fn.__module__}.{kernel.fn.__qualname__}" == name


LAUNCH = """
import json, sys, torch, triton
from pathlib import Path
from dsrope_dev import compile_cache
import dsrope
if sys.argv[1] == "record":
    compile_cache.record(Path(sys.argv[2]))
else:  # warm this process's (empty) disk cache from the list, in a process of the pool
    print(json.dumps(compile_cache.warm(Path(sys.argv[2]), 1)))
hits = []
triton.knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
x = torch.randn(2, 3, 5, 40, device="cuda", dtype=torch.bfloat16)
cos, sin = torch.randn(2, 2, 5, 8, device="cuda").unbind(0)
dsrope.apply_partial_rope_triton(x, cos, sin, 8)
torch.cuda.synchronize()
print(json.dumps(hits))
"""


@pytest.mark.gpu
@pytest.mark.long
def test_a_warmed_cache_serves_a_fresh_process_without_compiling(tmp_path):
    if not compile_cache.hooks_available():
        pytest.skip(f"triton {triton.__version__} has no JIT hooks")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}

    def launch(mode, path, cache):
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(LAUNCH), mode, str(path)],
            env=dict(env, TRITON_CACHE_DIR=str(tmp_path / cache)),
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines()]

    recorded, listed = tmp_path / "recorded", tmp_path / "list.jsonl.gz"
    assert launch("record", recorded, cache="first") == [[False]]  # compiled, and recorded
    assert compile_cache.merge(recorded, listed) == (1, 1)
    warmed, hits = launch("warm", listed, cache="second")
    assert (warmed["specializations"], warmed["failed"]) == (1, 0), warmed
    assert hits == [True]  # the launch found the kernel the pool compiled
