"""One default case set: the command, assert_conforms, the pytest marker and the parity matrix judge the same
cases by default, so one function gets one verdict from each. The function is right on the canonical cases
and the layout probes and one ulp off wherever the rotary width is neither 32 nor 64: only the drawn cases
of the default set show it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dsrope_gate.differential import eager_partial_rope

ROOT = Path(__file__).resolve().parents[1]


def wrong_off_the_canonical_rotaries(x, cos, sin, rotary):
    out = eager_partial_rope(x, cos, sin, rotary)
    if rotary in (32, 64):
        return out
    return torch.where(out.isfinite(), torch.nextafter(out, torch.full_like(out, float("inf"))), out)


USER = textwrap.dedent(
    """
    import json

    import pytest
    from dsrope_gate.testing import assert_conforms
    from tests.test_entry_points import wrong_off_the_canonical_rotaries


    @pytest.mark.conforms("partial_rope")
    def test_marker():
        return wrong_off_the_canonical_rotaries


    def test_record():
        try:
            assert_conforms(wrong_off_the_canonical_rotaries, "partial_rope")
        except AssertionError as e:
            open("assertion.txt", "w").write(str(e))
    """
)


def counts(result: dict) -> dict:
    return {d: (result[d]["verdict"], result[d]["outside_model"], result[d]["elements"]) for d in ("forward",)}


@pytest.mark.long
def test_one_function_gets_one_verdict_from_every_entry_point(tmp_path, capsys):
    from dsrope_gate import parity
    from dsrope_gate.cli import main
    from dsrope_gate.testing import assert_conforms

    target = "tests.test_entry_points:wrong_off_the_canonical_rotaries"
    assert main(["--op", "partial_rope", "--impl", target, "--json", str(tmp_path / "r.json")]) == 1
    (command,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert command["forward"]["verdict"] == "does not conform" and command["forward"]["outside_model"] > 0

    with pytest.raises(AssertionError) as error:
        assert_conforms(wrong_off_the_canonical_rotaries, "partial_rope")
    assert "partial_rope forward: does not conform: " in str(error.value)

    _, (in_parity,), meta = parity.parity("partial_rope", [("wrong", wrong_off_the_canonical_rotaries)])
    assert counts(in_parity) == counts(command)
    assert meta["cases"] == len({c["case"] for c in command["forward"]["cases"]} | {
        n["case"] for n in command["forward"]["not_run"]
    })  # fmt: skip

    (tmp_path / "test_user.py").write_text(USER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}:{ROOT}", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "pytest", "-p", "dsrope_gate.pytest_plugin", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run([*argv, "test_user.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-3000:]
    marker = run.stdout.split("partial_rope forward: does not conform: ", 1)[1].split(" elements", 1)[0]
    assertion = (tmp_path / "assertion.txt").read_text().split("partial_rope forward: does not conform: ", 1)[1]
    # "N of M": the same elements outside the model, of the same elements judged, in every entry point
    outside, judged = command["forward"]["outside_model"], command["forward"]["elements"]
    assert marker == f"{outside} of {judged}" and assertion.startswith(f"{outside} of {judged} elements")
    assert str(error.value).split("does not conform: ", 1)[1].startswith(f"{outside} of {judged} elements")
