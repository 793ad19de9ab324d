"""rope_tables through the gate's doors (dsrope_gate.conformance.rope_tables): the conformance command, each
table builder in a spawned child of its own, assert_conforms, assert_bitwise_equal, the parity matrix and the
pytest marker, on dsrope_gate.tables.CASES on the CPU. The pinned projects' builders: tests/test_table_builders.py.

- hostile builders, each in its own child beside a right one: a write into positions, an exit, bf16 tables and a
  wrong shape, a raise on every case; each gets its verdict in words, and the right one judged after them conforms;
- builders kept from the suite's other tests, as a hidden set would be (the labels' emulations, some declaring an
  attention factor): each gets its verdict and its semantics' name through the command; a table that folds in a
  factor it does not declare fails, and the verdict of one that declares it names it;
- a table whose entries k >= R/2 are NaN conforms (they are not judged), and the wrong half judged would fail it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dsrope_gate import tables
from dsrope_gate.cli import main
from dsrope_gate.conformance.judging import verdict_text
from dsrope_gate.tables import CASES, CONTRACT, TableBuilder, emulation_builder
from dsrope_gate.testing import assert_bitwise_equal, assert_conforms

ROOT = Path(__file__).resolve().parents[1]
YARN = [case.name for case in CASES if case.scaling is not None]
PLAIN = [case.name for case in CASES if case.scaling is None]
ATLAS_FACTOR = 0.1 * math.log(16) + 1  # the HF-convention mscale ratio on DeepSeek-V4's compress layers

BUILDERS = textwrap.dedent(
    """
    import math
    import os

    import torch
    from dsrope_gate.table_builders import dsrope_tables
    from dsrope_gate.tables import TableBuilder, emulation_builder, yarn_mscale


    def ratio(rope_scaling):
        if rope_scaling is None:
            return 1.0
        s = rope_scaling
        return yarn_mscale(s["factor"], s.get("mscale", 1)) / yarn_mscale(s["factor"], s.get("mscale_all_dim", 0))


    def right(positions, rotary, theta, rope_scaling):
        return dsrope_tables(positions, rotary, theta, rope_scaling)


    def nan_tail(positions, rotary, theta, rope_scaling):
        cos, sin = dsrope_tables(positions, rotary, theta, rope_scaling)
        for t in (cos, sin):
            t[..., rotary // 2 :] = float("nan")
        return cos, sin


    def writes_positions(positions, rotary, theta, rope_scaling):
        out = dsrope_tables(positions, rotary, theta, rope_scaling)
        positions.add_(1)
        return out


    def exits_on_yarn(positions, rotary, theta, rope_scaling):
        if rope_scaling is not None:
            os._exit(3)
        return dsrope_tables(positions, rotary, theta, rope_scaling)


    def bf16(positions, rotary, theta, rope_scaling):
        return tuple(t.bfloat16() for t in dsrope_tables(positions, rotary, theta, rope_scaling))


    def half_width(positions, rotary, theta, rope_scaling):
        return tuple(t[..., : rotary // 2] for t in dsrope_tables(positions, rotary, theta, rope_scaling))


    def raises(positions, rotary, theta, rope_scaling):
        raise RuntimeError("no tables today")


    # hidden-set style: the labels' emulations, as a project's builder of that semantics would compute them
    CONTRACT = emulation_builder("fp32-elementwise")
    FP64_FREQUENCIES = emulation_builder("fp64-frequencies")
    RECIPROCAL = emulation_builder("yarn-reciprocal-product")
    FP64_ANGLES = emulation_builder("fp64-angles")
    TF32 = emulation_builder("tf32-angles")
    BF16_CACHE = emulation_builder("bf16-cache")
    UNTRUNCATED = emulation_builder("yarn-untruncated")
    HALF_CLAMP = emulation_builder("yarn-half-clamp")
    MSCALE_UNDECLARED = emulation_builder("mscale-ratio")
    MSCALE_DECLARED = emulation_builder("fp32-elementwise", ratio)
    FACTOR_ONLY_DECLARED_RATIO = emulation_builder("mscale-factor-only", ratio)
    """
)
HOSTILE = ["writes_positions", "exits_on_yarn", "bf16", "half_width", "raises"]
# name -> (verdict, semantics) through the command, each in its own child
HIDDEN = {
    "right": ("conforms", [CONTRACT]),
    "nan_tail": ("conforms", [CONTRACT]),
    "CONTRACT": ("conforms", [CONTRACT]),
    "FP64_FREQUENCIES": ("conforms", ["fp64-frequencies"]),
    "RECIPROCAL": ("conforms", ["yarn-reciprocal-product"]),
    "FP64_ANGLES": ("conforms", ["fp64-angles"]),
    "TF32": ("does not conform", ["tf32-angles"]),
    "BF16_CACHE": ("does not conform", ["bf16-cache"]),
    "UNTRUNCATED": ("does not conform", ["yarn-untruncated"]),
    "HALF_CLAMP": ("does not conform", ["yarn-half-clamp"]),
    "MSCALE_UNDECLARED": ("does not conform", ["mscale-ratio"]),
    "MSCALE_DECLARED": ("conforms", [CONTRACT]),
    # the factor it folds in is 0.1 ln 16 + 1, the ratio it declares the same on V4's compress layers (no mscale
    # keys) and 1 on V3's (mscale = mscale_all_dim = 1), where it folds in 1.3689: outside there
    "FACTOR_ONLY_DECLARED_RATIO": ("does not conform", ["mscale-factor-only"]),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """(exit status, results by name, stdout) of one command over every builder of BUILDERS, each in its child."""
    folder = tmp_path_factory.mktemp("table-builders")
    (folder / "builders.py").write_text(BUILDERS)
    argv = ["--op", "rope_tables", "--out", str(folder / "out"), "--json", str(folder / "r.json")]
    for name in [*HOSTILE, *HIDDEN]:
        argv += ["--impl", f"{folder / 'builders.py'}:{name}"]
    import io
    from contextlib import redirect_stdout

    printed = io.StringIO()
    with redirect_stdout(printed):
        rc = main(argv)
    results = json.loads((folder / "r.json").read_text())["results"]
    return rc, {r["impl"].rsplit(":", 1)[1]: r for r in results}, printed.getvalue()


@pytest.mark.long
def test_hostile_builders_get_their_verdicts_in_their_own_children(judged):
    rc, results, out = judged
    assert rc == 1
    writes = results["writes_positions"]["forward"]
    assert writes["verdict"] == "does not conform" and writes["outside_model"] == 0, writes["verdict"]
    first = writes["writes"][0]
    assert (first["tensor"], first["case"], first["index"], first["after"] - first["before"]) == (
        "positions", "v4-main/start", [0, 0], 1,
    ), first  # fmt: skip
    assert "does not conform: writes into positions" in out
    exits = results["exits_on_yarn"]
    assert exits["death"] == {"verdict": "crashed", "reason": "exit status 3", "case": YARN[0], "call": "forward"}
    assert exits["forward"]["verdict"] == "crashed" and exits["forward"]["conforms"] is False
    assert [c["case"] for c in exits["forward"]["cases"]] == PLAIN  # the cases before the exit are kept
    for name, problem in (
        ("bf16", "cos: expected float32 [1, 16, 64], got torch.bfloat16 [1, 16, 64]"),
        ("half_width", "cos: expected float32 [1, 16, 64], got torch.float32 [1, 16, 32]"),
    ):
        record = results[name]["forward"]
        assert record["verdict"] == "does not conform" and record["elements"] == 0, name
        assert {n["status"] for n in record["not_run"]} == {"wrong output"} and len(record["not_run"]) == len(CASES)
        assert record["not_run"][0]["error"] == problem, record["not_run"][0]
    raises = results["raises"]["forward"]
    assert raises["verdict"] == "not run" and raises["conforms"] is None
    said = {"case": "v4-main/start", "status": "raised", "error": "RuntimeError: no tables today"}
    assert raises["not_run"][0] == said
    assert all(r["backward"] is None and r["op"] == "rope_tables" for r in results.values())


@pytest.mark.long
@pytest.mark.parametrize("name", list(HIDDEN))
def test_hidden_style_builders_get_their_verdict_and_name(judged, name):
    _, results, _ = judged
    record = results[name]["forward"]
    assert (record["verdict"], record["semantics"]) == HIDDEN[name], record["first_violation"]
    assert results[name]["contract"] == CONTRACT and record["writes"] == []
    ran = [c["case"] for c in record["cases"]]
    assert ran == [case.name for case in CASES] and record["elements"] == 9536


@pytest.mark.long
def test_a_declared_attention_factor_is_judged_and_named(judged):
    """Declared, the mscale ratio's table conforms and its verdict names the factor where it is not 1; undeclared,
    the same table lies outside the model on the compress layers (and the plain ones, factor 1, conform)."""
    _, results, out = judged
    declared = results["MSCALE_DECLARED"]
    assert declared["forward"]["attention_factors"] == {"v4-compress": ATLAS_FACTOR, "ramp-clamped": ATLAS_FACTOR}
    assert verdict_text(declared["forward"], declared) == (
        "conforms (declared attention factor 1.27726 on v4-compress, 1.27726 on ramp-clamped)"
    )
    undeclared = results["MSCALE_UNDECLARED"]["forward"]
    outside = {c["case"]: c["outside_model"] for c in undeclared["cases"]}
    assert all(outside[n] > 0.9 * c["elements"] for c in undeclared["cases"] for n in [c["case"]] if "compress" in n)
    assert all(outside[n] == 0 for n in PLAIN) and undeclared["attention_factors"] == {}
    assert "declared attention factor" not in verdict_text(undeclared, results["MSCALE_UNDECLARED"])
    assert "| conforms (declared attention factor 1.27726 on v4-compress, 1.27726 on ramp-clamped) |" in out


@pytest.mark.long
def test_the_right_builder_judged_after_the_hostile_ones_conforms_with_its_tables_as_given(judged):
    _, results, _ = judged
    assert results["right"]["forward"]["verdict"] == results["nan_tail"]["forward"]["verdict"] == "conforms"
    assert results["right"]["device_name"] == "cpu (Triton interpreter)"


# --- assert_conforms, assert_bitwise_equal, --parity: in this process ----------------------------------------------


def dsrope_fp32(positions, rotary, theta, rope_scaling):
    from dsrope_gate.table_builders import dsrope_tables

    return dsrope_tables(positions, rotary, theta, rope_scaling)


def dsrope_fp64(positions, rotary, theta, rope_scaling):
    from dsrope_gate.table_builders import dsrope_tables

    return dsrope_tables(positions, rotary, theta, rope_scaling, fp64=True)


def test_assert_conforms_judges_a_table_builder():
    result = assert_conforms(dsrope_fp32, "rope_tables", semantics=CONTRACT)
    assert result["forward"]["verdict"] == "conforms" and result["backward"] is None
    with pytest.raises(AssertionError) as failure:
        assert_conforms(emulation_builder("bf16-cache"), "rope_tables")
    text = str(failure.value)
    lines = text.splitlines()
    assert lines[0] == "emulation:bf16-cache does not conform to rope_tables on cpu:", text
    assert lines[1].startswith("rope_tables forward: does not conform: 6846 of 9536 elements"), text
    first = "First entry outside the model: case 'v4-main/start', cos, position 50, pair 0: got "
    assert lines[2].startswith(first), text
    assert "  from dsrope_gate.tables import *; case = TableCase(name='v4-main/start'" in text
    assert "print(cos[0, 1, 0])" in text
    assert lines[-1] == "Semantics read off the bits: bf16-cache (the fp32-elementwise contract: fp32-elementwise)."
    with pytest.raises(AssertionError, match="Semantics: expected 'bf16-cache' in the forward; Semantics read off"):
        assert_conforms(dsrope_fp32, "rope_tables", semantics="bf16-cache")
    with pytest.raises(ValueError, match="semantics: unknown label"):
        assert_conforms(dsrope_fp32, "rope_tables", semantics="interleaved")


def test_the_reproduction_of_a_first_entry_outside_rebuilds_it():
    """The lines assert_conforms prints, run as pasted with fn the builder, print the entry reported."""
    fn = emulation_builder("tf32-angles")
    with pytest.raises(AssertionError) as failure:
        assert_conforms(fn, "rope_tables")
    lines = str(failure.value).splitlines()
    got = float(lines[2].split(": got ")[1].split(",")[0])
    scope = {"fn": fn}
    exec(lines[4].strip(), scope)
    exec(lines[5].strip().replace("print(", "value = (", 1), scope)
    assert scope["value"].item() == got


def test_assert_bitwise_equal_on_tables():
    assert_bitwise_equal(dsrope_fp32, TableBuilder("dsrope again", dsrope_fp32), "rope_tables")
    with pytest.raises(AssertionError) as failure:
        assert_bitwise_equal(dsrope_fp32, dsrope_fp64, "rope_tables")
    text = str(failure.value)
    assert "forward: " in text and "% of elements bitwise equal, max " in text and "first differing element" in text
    assert "backward" not in text


def test_parity_matrix_of_table_builders_per_case_kind(tmp_path, capsys):
    """--parity over table builders: one row per pair and case kind (no backward), the share of the pairs' entries
    with equal bits and the reason from their labels."""
    folder = tmp_path
    (folder / "b.py").write_text(BUILDERS)
    argv = ["--op", "rope_tables", "--parity", "--in-process", "--out", str(folder / "out")]
    for name in ("right", "CONTRACT", "BF16_CACHE"):
        argv += ["--impl", f"{folder / 'b.py'}:{name}"]
    assert main(argv) == 1  # BF16_CACHE does not conform
    rows = json.loads((folder / "out" / "parity.json").read_text())["pairs"]
    kinds = ["ramp-clamped", "v3", "v4-compress", "v4-main"]
    assert [r["kind"] for r in rows] == kinds * 3 and {r["direction"] for r in rows} == {"forward"}
    by = {(r["a"].rsplit(":", 1)[1], r["b"].rsplit(":", 1)[1], r["kind"]): r for r in rows}
    # as measured: bf16 holds the FP32 entry exactly at a few positions (cos 1 at position 0); dsrope's torch.polar
    # and the correctly rounded table part on about 1% of the entries, by 1 ulp
    bf16_shares = {"ramp-clamped": 0.0, "v3": 0.0416, "v4-compress": 0.0585, "v4-main": 0.0213}
    polar_shares = {"ramp-clamped": 0.9902, "v3": 0.9887, "v4-compress": 0.9904, "v4-main": 0.9874}
    for kind in kinds:
        bf16 = by["CONTRACT", "BF16_CACHE", kind]
        assert bf16["reason"] == "fp32-elementwise vs bf16-cache", bf16
        assert round(bf16["bitwise_equal"], 4) == bf16_shares[kind], bf16
        assert bf16["outside_a"] == 0 and bf16["outside_b"] > 0
        same = by["right", "CONTRACT", kind]
        assert (same["reason"], same["max_ulp"]) == ("same semantics (fp32-elementwise)", 1), same
        assert round(same["bitwise_equal"], 4) == polar_shares[kind], same
    assert by["right", "CONTRACT", "v4-main"]["elements"] == 2 * (16 + 16 + 15) * 32
    text = (folder / "out" / "parity.md").read_text()
    assert "## rope_tables forward" in text and "| A | B | case kind |" in text and "rope_tables backward" not in text
    assert "CONTRACT` | v4-main | " in text


def test_the_verdict_names_only_factors_other_than_one():
    record = {"verdict": "conforms", "attention_factors": {}}
    assert verdict_text(record, {}) == "conforms"
    record["attention_factors"] = {"v3": 1.25}
    assert verdict_text(record, {}) == "conforms (declared attention factor 1.25 on v3)"


def test_a_builder_that_writes_into_positions_in_this_process_does_not_reach_the_next():
    """In one process (assert_conforms's default) fresh copies alone keep the case's positions as made."""
    from dsrope_gate.conformance import judge_all

    def adds_one(positions, rotary, theta, rope_scaling):
        positions.add_(1)
        return dsrope_fp32(positions - 1, rotary, theta, rope_scaling)

    impls = [("adds-one", adds_one), ("right", dsrope_fp32)]
    results, _, cases, _ = judge_all("rope_tables", impls, progress=lambda msg: None)
    assert results[0]["forward"]["verdict"] == "does not conform" and results[0]["forward"]["outside_model"] == 0
    assert results[1]["forward"]["verdict"] == "conforms"
    assert all(torch.equal(p.inputs.positions, p.case.position_ids()) for p in cases)


MARKED = textwrap.dedent(
    """
    import pytest
    from dsrope_gate.tables import emulation_builder


    @pytest.mark.conforms("rope_tables", semantics="fp32-elementwise")
    def test_contract_tables():
        return emulation_builder("fp32-elementwise")


    @pytest.mark.conforms("rope_tables")
    def test_bf16_tables():
        return emulation_builder("bf16-cache")
    """
)


@pytest.mark.long
def test_the_pytest_marker_judges_table_builders(tmp_path):
    (tmp_path / "test_user.py").write_text(MARKED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "pytest", "-p", "dsrope_gate.pytest_plugin", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run([*argv, "test_user.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    assert "emulation:bf16-cache does not conform to rope_tables on cpu" in run.stdout


def test_an_undeclared_table_factor_is_outside_even_at_one_case():
    """judge_pairs with the declared factor against the same table without it: the model moves with the factor."""
    case = next(c for c in CASES if c.name == "v4-compress/start")
    positions = case.position_ids()
    cos, sin = tables.emulated_tables(CONTRACT, positions, 64, case.theta, case.rope_scaling, ATLAS_FACTOR)
    declared = tables.judge_pairs(case, cos[..., :32], sin[..., :32], ATLAS_FACTOR)
    undeclared = tables.judge_pairs(case, cos[..., :32], sin[..., :32], 1.0)
    assert declared.outside == 0 and undeclared.outside > 0.9 * undeclared.elements
