"""The conformance command as a CI step runs it (dsrope_gate.cli): its exit status (0 every direction
conforms; 1 one does not, is partial, crashed or was skipped; 2 a usage or load error; 3 the judge itself
failed, never 1), its --help (each op's signature, every label and verdict, the exit status), a user's file
that does not even parse (one line, rc 2), a callable of the wrong signature (reads "wrong signature", not
"refused"), the usage errors (a negative --examples, --parity with --against), and --parity without
matplotlib (the picture skipped with one line).

Each run judges partial_rope on the canonical bf16 cases and the layout probes (no golden store, no sweep:
--golden points at an empty folder, --examples 0), each implementation in a child process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dsrope_gate.cli import EXIT_STATUS, LABELS, VERDICT_MEANING, exit_status, main
from dsrope_gate.ops import JUDGED

ROOT = Path(__file__).resolve().parents[1]

IMPLS = textwrap.dedent(
    """
    import torch
    from dsrope_gate.differential import eager_partial_rope


    def good(x, cos, sin, rotary):
        return eager_partial_rope(x, cos, sin, rotary)


    def half_split(x, cos, sin, rotary):
        d, half = x.shape[-1], rotary // 2
        lead, a, b = x[..., : d - rotary], x[..., d - rotary : d - half].float(), x[..., d - half :].float()
        c, s = cos[:, None, :, :half], sin[:, None, :, :half]
        return torch.cat((lead, (a * c - b * s).to(x.dtype), (a * s + b * c).to(x.dtype)), -1)


    def two_args(x, cos):
        return x
    """
)


@pytest.fixture
def impls(tmp_path):
    path = tmp_path / "impls.py"
    path.write_text(IMPLS)
    (tmp_path / "empty").mkdir()
    return path


def judge(impls: Path, *names: str, json_path: Path | None = None, options=()) -> int:
    argv = ["--op", "partial_rope", "--examples", "0", "--golden", str(impls.parent / "empty"), *options]
    argv += ["--dtype", "bfloat16"]
    argv += ["--out", str(impls.parent / "out")] + (["--json", str(json_path)] if json_path else [])
    for name in names:
        argv += ["--impl", f"{impls}:{name}"]
    return main(argv)


def result(verdicts: dict) -> dict:
    return {d: (None if v is None else {"verdict": v}) for d, v in verdicts.items()}


def test_exit_status_rule():
    ok = result({"forward": "conforms", "backward": "conforms"})
    forward_only = result({"forward": "conforms", "backward": None})
    assert exit_status([ok]) == 0 and exit_status([forward_only]) == 0
    for bad in ("does not conform", "partial", "not run", "crashed", "timed out"):
        assert exit_status([ok, result({"forward": "conforms", "backward": bad})]) == 1
    nothing = result({"forward": "not run", "backward": "not run"})
    assert exit_status([nothing]) == 1 and exit_status([nothing, ok]) == 1  # refused everything: it fails
    signature = {"forward": {"verdict": "not run", "not_run": [{"status": "wrong signature"}]}, "backward": None}
    assert exit_status([signature, ok]) == 2  # the callable named cannot take the op's arguments: a usage error
    assert exit_status([]) == 1  # nothing judged passes nothing


def test_conforming_implementation_exits_0(impls, capsys):
    assert judge(impls, "good") == 0


def test_half_split_exits_1(impls, capsys):
    assert judge(impls, "good", "half_split") == 1
    out = capsys.readouterr().out
    assert f"`{impls}:half_split` | partial_rope | forward | **does not conform** | half-split |" in out, out


def test_wrong_signature_reads_so_and_exits_2(impls, tmp_path, capsys):
    assert judge(impls, "two_args", json_path=tmp_path / "r.json") == 2
    forward = json.loads((tmp_path / "r.json").read_text())["results"][0]["forward"]
    assert forward["verdict"] == "not run"
    assert {n["status"] for n in forward["not_run"]} == {"wrong signature"}
    assert "called as partial_rope(x, cos, sin, rotary)" in forward["not_run"][0]["error"]
    assert set(forward["layouts"].values()) == {"wrong signature"}


def test_syntax_error_in_the_users_file_is_one_line_rc_2(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(x, cos, sin, rotary)\n    return x\n")
    assert main(["--op", "partial_rope", "--impl", f"{broken}:f", "--examples", "0", "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "cannot load" in err and "SyntaxError" in err and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "error:" in line] == err.strip().splitlines()[-1:], err


@pytest.mark.parametrize(
    "argv",
    [
        ["--impl", "dsrope:qnorm_rope_triton"],  # --impl without --op
        ["--op", "partial_rope", "--impl", "dsrope:apply_partial_rope_triton", "--examples", "-1"],
        ["--op", "partial_rope", "--impl", "dsrope:apply_partial_rope_triton", "--timeout", "0"],
        ["--preset", "dsrope", "--parity", "--against", "dsrope:apply_partial_rope_triton"],
        ["--op", "partial_rope", "--impl", "no-colon"],
        ["--op", "qnorm_rope"],  # nothing to judge
    ],
    ids=["impl-without-op", "negative-examples", "zero-timeout", "parity-against", "no-callable", "nothing"],
)
def test_usage_errors_exit_2(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    assert rc == 2, capsys.readouterr().err


def test_unknown_preset_or_release_exits_2(capsys):
    assert main(["--preset", "no-such-peer"]) == 2
    assert "unknown ['no-such-peer']" in capsys.readouterr().err
    assert main(["--preset", "transformers@5.20.0"]) == 2
    assert "transformers's pinned releases are ['5.17.0', '5.23.0']" in capsys.readouterr().err


def test_the_judges_own_failure_exits_3_never_1(impls, monkeypatch, capsys):
    import dsrope_gate.conformance as conformance

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the judge")

    monkeypatch.setattr(conformance, "collect_cases", broken)
    assert judge(impls, "good") == 3
    err = capsys.readouterr().err
    assert "the judge itself failed" in err and "a bug in the judge" in err

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'hypothesis'", name="hypothesis")

    monkeypatch.setattr(conformance, "collect_cases", missing)
    assert judge(impls, "good") == 3
    assert "a package it needs is missing" in capsys.readouterr().err


def test_help_documents_signatures_labels_verdicts_exit_status(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for op in JUDGED.values():
        assert op.signature in text
    for words in (*LABELS, *VERDICT_MEANING, *EXIT_STATUS.values()):
        assert " ".join(str(words).split()) in text, words
    assert "repeatable" in text and "default 24" in text and "default out/conformance" in text


def test_every_label_the_report_can_print_has_a_line():
    labels = {
        part
        for op in JUDGED.values()
        for emulations in op.emulations.values()
        for e in emulations
        for part in e.split("+")
    }
    assert labels <= set(LABELS), labels - set(LABELS)


@pytest.mark.long
def test_end_to_end_exit_status_in_a_subprocess(impls):
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}", "CUDA_VISIBLE_DEVICES": ""}
    argv = ["--op", "partial_rope", "--examples", "0", "--golden", str(impls.parent / "empty")]
    argv += ["--out", str(impls.parent / "out"), "--impl", f"{impls}:half_split"]
    run = subprocess.run(
        [sys.executable, "-m", "dsrope_gate.conformance", *argv], env=env, capture_output=True, text=True
    )
    assert run.returncode == 1, run.stderr[-2000:]
    assert "**does not conform** | half-split" in run.stdout


def test_against_and_the_first_element_outside_are_on_stdout(impls, capsys):
    assert judge(impls, "half_split", options=["--against", f"{impls}:good"]) == 1
    out = capsys.readouterr().out
    assert f"against `{impls}:good` forward: " in out and "of elements bitwise equal, max" in out, out
    assert "First element outside the model: case 'dsv4-bfloat16'" in out, out


def test_parity_without_matplotlib_skips_the_picture_with_one_line(impls, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ModuleNotFoundError
    out = impls.parent / "out"
    assert judge(impls, "good", "half_split", options=["--parity"]) == 1  # half_split does not conform
    err = capsys.readouterr().err
    assert "parity.png skipped: matplotlib is not installed" in err, err
    assert (out / "parity.md").is_file() and not (out / "parity.png").exists()


@pytest.mark.long
def test_the_sweep_leaves_no_hypothesis_folder_in_the_working_directory(impls, tmp_path):
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}", "CUDA_VISIBLE_DEVICES": ""}
    env |= {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = ["--op", "partial_rope", "--examples", "2", "--golden", str(impls.parent / "empty"), "--dtype", "bfloat16"]
    argv += ["--out", str(tmp_path / "out"), "--impl", f"{impls}:good", "--in-process"]
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "dsrope_gate.conformance", *argv], cwd=work, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert not (work / ".hypothesis").exists(), sorted(p.name for p in work.iterdir())


def test_the_contract_judged_is_named_in_the_json_and_the_report(impls, tmp_path, capsys):
    """The contract's rotation with FP32 tables does not conform to bf16-tables (the tables rounded first); the
    JSON's meta and results and the printed header name the contract judged."""
    assert judge(impls, "good", json_path=tmp_path / "r.json", options=["--contract", "bf16-tables"]) == 1
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["meta"][0]["contract"] == "bf16-tables" and written["results"][0]["contract"] == "bf16-tables"
    assert written["results"][0]["forward"]["verdict"] == "does not conform"
    assert "Conformance: contract bf16-tables;" in capsys.readouterr().out
