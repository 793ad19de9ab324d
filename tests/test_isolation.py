"""A verdict no other code can corrupt (dsrope_gate.conformance.isolation, calling): implementations that
misbehave, each judged in a child process of its own, beside a right one that must still conform.

- an exit, a segfault (ctypes reading address 0) and a hang become that implementation's verdict ("crashed:
  exit status 3 in <case>", "crashed: SIGSEGV ...", "timed out after N s ..."), the cases it finished kept;
  the report and the JSON are written, and the right implementation judged after it conforms;
- a write into each input (x, cos, sin, the incoming gradient) fails the writer's verdict with the tensor,
  the case and the first changed element, and never reaches the implementation judged after it (judged in
  this process too, where only fresh copies keep the inputs clean);
- an out-of-place implementation that also writes its result into x does not conform; declared in place
  (`--in-place`), the same writes are its output and it conforms.

Each command run judges partial_rope on bf16 canonical cases and the layout probes (--examples 0, no golden
store), each implementation in its own spawned child.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from dsrope_gate.cli import main
from dsrope_gate.conformance import Target, judge_all
from dsrope_gate.conformance.calling import storage_bytes, write_record

HOSTILE = textwrap.dedent(
    """
    import ctypes
    import os
    import time

    import torch
    from dsrope_gate.differential import eager_partial_rope


    def right(x, cos, sin, rotary):
        return eager_partial_rope(x, cos, sin, rotary)


    def halves_cos(x, cos, sin, rotary):
        out = eager_partial_rope(x, cos, sin, rotary)
        torch.empty(0, dtype=cos.dtype).set_(cos.untyped_storage()).mul_(0.5)
        return out


    def scales_sin(x, cos, sin, rotary):
        out = eager_partial_rope(x, cos, sin, rotary)
        torch.empty(0, dtype=sin.dtype).set_(sin.untyped_storage()).mul_(2)
        return out


    def writes_result_into_x(x, cos, sin, rotary):
        out = eager_partial_rope(x, cos, sin, rotary)
        with torch.no_grad():
            x.copy_(out)
        return out


    class _ZeroesGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin, rotary):
            ctx.save_for_backward(cos, sin)
            ctx.rotary = rotary
            return eager_partial_rope(x, cos, sin, rotary)

        @staticmethod
        def backward(ctx, grad):
            cos, sin = ctx.saved_tensors
            dx = eager_partial_rope(grad, cos, -sin, ctx.rotary)
            torch.empty(0, dtype=grad.dtype, device=grad.device).set_(grad.untyped_storage()).zero_()
            return dx, None, None, None


    def zeroes_the_gradient(x, cos, sin, rotary):
        return _ZeroesGrad.apply(x, cos, sin, rotary)


    def exits(x, cos, sin, rotary):
        if x.shape[-1] == 192:  # the V3 cases come after the DSV4 ones: some cases are finished first
            os._exit(3)
        return eager_partial_rope(x, cos, sin, rotary)


    def segfaults(x, cos, sin, rotary):
        ctypes.string_at(0)


    def hangs(x, cos, sin, rotary):
        time.sleep(3600)


    def in_place(x, cos, sin, rotary):
        return x.copy_(eager_partial_rope(x.clone(), cos, sin, rotary))
    """
)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    (folder / "hostile.py").write_text(HOSTILE)
    (folder / "empty").mkdir()
    return folder


def command(folder, names, *options):
    """Run the command on the named implementations of hostile.py: (exit status, the JSON's results)."""
    argv = ["--op", "partial_rope", "--examples", "0", "--golden", str(folder / "empty"), "--dtype", "bfloat16"]
    argv += ["--out", str(folder / "out"), "--json", str(folder / "out" / "r.json"), *options]
    for name in names:
        argv += ["--impl", f"{folder / 'hostile.py'}:{name}"]
    rc = main(argv)
    results = json.loads((folder / "out" / "r.json").read_text())["results"]
    return rc, {r["impl"].rsplit(":", 1)[1]: r for r in results}


@pytest.mark.long
def test_exit_segfault_and_hang_are_verdicts_and_the_next_one_still_conforms(hostile, capsys):
    rc, results = command(hostile, ["exits", "segfaults", "hangs", "right"], "--timeout", "20")
    assert rc == 1
    exits = results["exits"]
    assert exits["death"]["reason"] == "exit status 3" and exits["death"]["case"] == "v3-bfloat16"
    assert exits["forward"]["verdict"] == "crashed" and exits["forward"]["conforms"] is False
    assert [c["case"] for c in exits["forward"]["cases"]] == ["dsv4-bfloat16"]  # the case it finished is kept
    segv = results["segfaults"]
    assert segv["death"]["reason"] == "SIGSEGV" and segv["death"]["call"] == "forward"
    assert segv["forward"]["verdict"] == "crashed" and segv["forward"]["elements"] == 0
    hang = results["hangs"]
    assert hang["death"]["reason"] == "timed out after 20 s" and hang["forward"]["verdict"] == "timed out"
    right = results["right"]
    assert right["forward"]["verdict"] == right["backward"]["verdict"] == "conforms"
    out = capsys.readouterr().out
    assert "**crashed: SIGSEGV in dsv4-bfloat16 (forward)**" in out, out
    assert "**timed out: timed out after 20 s in dsv4-bfloat16 (forward)**" in out, out
    assert (hostile / "out" / "report.md").is_file()


@pytest.mark.long
def test_writes_into_each_input_fail_the_writer_and_never_reach_the_next(hostile, capsys):
    names = ["halves_cos", "right", "scales_sin", "writes_result_into_x", "zeroes_the_gradient", "right"]
    rc, results = command(hostile, names)
    assert rc == 1
    for name, direction, tensor in (
        ("halves_cos", "forward", "cos"),
        ("scales_sin", "forward", "sin"),
        ("writes_result_into_x", "forward", "x"),
        ("zeroes_the_gradient", "backward", "grad"),
    ):
        record = results[name][direction]
        assert record["verdict"] == "does not conform", (name, record["verdict"])
        first = record["writes"][0]
        assert first["tensor"] == tensor and first["case"] == "dsv4-bfloat16", (name, first)
        assert first["index"] is not None and first["before"] != first["after"], first
    assert results["halves_cos"]["forward"]["outside_model"] == 0  # its output is right: the write alone fails it
    assert results["right"]["forward"]["verdict"] == results["right"]["backward"]["verdict"] == "conforms"
    out = capsys.readouterr().out
    assert "does not conform: writes into cos" in out and "writes into cos in case 'dsv4-bfloat16' (forward)" in out


def test_a_table_writer_in_this_process_does_not_reach_the_next():
    """In one process (`--in-process`, assert_conforms's default), fresh copies alone keep the cases clean:
    a writer into cos, then a right implementation on the same prepared cases."""

    def halves_cos(x, cos, sin, rotary):
        from dsrope_gate.differential import eager_partial_rope

        out = eager_partial_rope(x, cos, sin, rotary)
        torch.empty(0, dtype=cos.dtype).set_(cos.untyped_storage()).mul_(0.5)
        torch.empty(0, dtype=sin.dtype).set_(sin.untyped_storage()).mul_(0.5)
        return out

    from dsrope_gate.differential import eager_partial_rope

    impls = [("halves-cos", halves_cos), ("right", eager_partial_rope)]
    results, _, cases, _ = judge_all("partial_rope", impls, "cpu", examples=0, progress=lambda m: None)
    assert results[0]["forward"]["verdict"] == results[0]["backward"]["verdict"] == "does not conform"
    assert results[1]["forward"]["verdict"] == results[1]["backward"]["verdict"] == "conforms"
    for p in cases:  # the prepared inputs are as built
        want = p.case.build("cpu")
        for got, built in zip(p.inputs, want, strict=True):
            assert torch.equal(got.nan_to_num(7.0), built.nan_to_num(7.0)), p.case.name


@pytest.mark.long
def test_in_place_declared_is_judged_by_what_it_writes_into_x(hostile):
    rc, results = command(hostile, ["in_place"])
    assert rc == 1 and results["in_place"]["forward"]["writes"][0]["tensor"] == "x"
    rc, results = command(hostile, ["in_place"], "--in-place")
    forward = results["in_place"]["forward"]
    assert rc == 0 and forward["verdict"] == "conforms" and forward["writes"] == []
    assert results["in_place"]["backward"]["verdict"] == "conforms"


def test_a_write_is_reported_at_its_first_changed_element():
    """Of several changed elements the report names the first in storage order, with its logical index (x a
    transposed view: the two orders differ) and its values before and after."""
    x = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # x[i, j] at storage element 4 * j + i
    before = storage_bytes(x)
    x[1, 2] = -1.0  # storage element 9
    x[2, 0] = -2.0  # storage element 2: the first
    record = write_record("x", "forward", before, storage_bytes(x), x)
    assert record["storage_element"] == 2 and record["index"] == [2, 0], record
    assert (record["tensor"], record["before"], record["after"]) == ("x", 2.0, -2.0), record
    assert write_record("x", "forward", before, before.clone(), x) is None


def test_in_place_writes_into_the_gaps_of_x_are_writes():
    """Declared in place, only x's own elements may change: a byte between them is a write."""
    from dsrope_gate.differential import eager_partial_rope

    def in_place_and_a_gap(x, cos, sin, rotary):
        with torch.no_grad():
            x.copy_(eager_partial_rope(x, cos, sin, rotary))
            storage = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
            covered = torch.zeros(storage.numel(), dtype=torch.bool)
            covered.as_strided(x.shape, x.stride(), x.storage_offset()).fill_(True)
            gaps = (~covered).nonzero()
            if len(gaps):
                storage[gaps[0, 0]] = 7.0
        return x

    target = Target("gap", fn=in_place_and_a_gap, in_place=True)
    (result,), _, _, _ = judge_all("partial_rope", [target], "cpu", examples=0, progress=lambda m: None)
    writes = result["forward"]["writes"]
    assert writes and all(w["tensor"] == "x" and w["index"] is None for w in writes), writes
    assert result["forward"]["verdict"] == "does not conform"


def test_in_place_declared_is_judged_by_x_not_by_what_it_returns():
    """Declared in place, what an implementation wrote into x is its output: the right rotation in x with a
    zeroed tensor returned conforms; zeros in x with the right rotation returned does not."""
    from dsrope_gate.differential import eager_partial_rope

    def right_in_x(x, cos, sin, rotary):
        with torch.no_grad():
            x.copy_(eager_partial_rope(x, cos, sin, rotary))
        return torch.zeros_like(x)

    def right_returned(x, cos, sin, rotary):
        rotated = eager_partial_rope(x, cos, sin, rotary)
        with torch.no_grad():
            x.zero_()
        return rotated

    targets = [Target(fn.__name__, fn=fn, in_place=True) for fn in (right_in_x, right_returned)]
    results, _, _, _ = judge_all("partial_rope", targets, "cpu", examples=0, progress=lambda m: None)
    verdicts = {t.name: r["forward"]["verdict"] for t, r in zip(targets, results, strict=True)}
    assert verdicts == {"right_in_x": "conforms", "right_returned": "does not conform"}, verdicts


OUT_OF_BOUNDS = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl
    from dsrope_gate.differential import eager_partial_rope


    @triton.jit
    def _store_far_away(ptr, n, FAR: tl.constexpr):
        i = tl.arange(0, 128)
        tl.store(ptr + i + FAR, tl.zeros([128], dtype=tl.float32), mask=i < n)  # past any allocation


    def writes_out_of_bounds(x, cos, sin, rotary):
        scratch = torch.zeros(128, dtype=torch.float32, device=x.device)
        _store_far_away[(1,)](scratch, 128, FAR=1 << 40)
        torch.cuda.synchronize()
        return eager_partial_rope(x, cos, sin, rotary)


    def right(x, cos, sin, rotary):
        return eager_partial_rope(x, cos, sin, rotary)
    """
)


@pytest.mark.gpu
def test_a_cuda_fault_is_its_verdict_and_the_next_one_on_the_gpu_still_conforms(tmp_path, capsys):
    """An illegal memory access poisons its process's CUDA context: in its own child, it is that
    implementation's verdict ("crashed: CUDA fault ..."), and the right one judged next, in a fresh child with
    a fresh context, conforms."""
    (tmp_path / "oob.py").write_text(OUT_OF_BOUNDS)
    (tmp_path / "empty").mkdir()
    argv = ["--op", "partial_rope", "--examples", "0", "--golden", str(tmp_path / "empty"), "--device", "cuda"]
    argv += ["--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"), "--dtype", "bfloat16"]
    argv += ["--impl", f"{tmp_path / 'oob.py'}:writes_out_of_bounds", "--impl", f"{tmp_path / 'oob.py'}:right"]
    assert main(argv) == 1
    oob, right = json.loads((tmp_path / "r.json").read_text())["results"]
    assert oob["forward"]["verdict"] == "crashed" and oob["death"]["case"] == "dsv4-bfloat16", oob.get("death")
    assert oob["death"]["reason"].startswith("CUDA fault") or oob["death"]["reason"].startswith("SIG"), oob["death"]
    assert right["forward"]["verdict"] == right["backward"]["verdict"] == "conforms"
