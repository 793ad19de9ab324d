"""The project installs as a library for other projects: a copy of the checkout (git's tracked and
untracked-not-ignored files, as a fresh clone has them) installed with the `gate` extra into a fresh
virtual environment outside the repository gives exactly three top-level packages, each named for this
project, and a dozen lines written in that environment judge a kernel against the reference.

Needs the package index (the venv installs torch 2.13.0, triton and the gate's dependencies): it runs
in the CPU suite, where CI has the index, and is skipped on a GPU host without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

# Written as a user would, in the fresh venv, in a folder outside the checkout.
USER_SCRIPT = textwrap.dedent(
    """
    from dsrope_gate.startup import interpret_without_gpu

    interpret_without_gpu()
    import torch
    import dsrope, dsrope_gate, dsrope_reference
    from dsrope_gate.inputs import tables, values
    from dsrope_reference.rope import partial_rope

    x = values((2, 3, 4, 32), torch.bfloat16, seed=1)
    cos, sin = tables(2, 4, 16, seed=2, device="cpu")
    check = partial_rope(x, cos, sin, 16).judge(dsrope.apply_partial_rope_triton(x, cos, sin, 16))
    print("judged", check.checked, "violations", check.violations)
    print("from", *(m.__file__ for m in (dsrope, dsrope_gate, dsrope_reference)))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="GPU hosts here have no package index; CI runs it")
def test_gate_extra_installs_into_a_fresh_venv(tmp_path):
    checkout = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True
    ).stdout.decode()
    assert files, f"{ROOT} is not a git checkout: this test copies what a clone holds"
    for f in filter(None, files.split("\0")):
        if (ROOT / f).is_file():
            (checkout / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, checkout / f)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    # torch pinned to the CPU wheel (an unpinned torch pulls a multi-GB CUDA build), then the project
    install = subprocess.run([*pip, "torch==2.13.0", f"{checkout}[gate]"], env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-3000:]

    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    top_level = (next(Path(site).glob("dsrope-*.dist-info")) / "top_level.txt").read_text().split()
    assert sorted(top_level) == ["dsrope", "dsrope_gate", "dsrope_reference"], top_level

    user = tmp_path / "elsewhere"
    user.mkdir()
    run = subprocess.run(
        [str(python), "-c", USER_SCRIPT],
        cwd=user,
        env=env | {"CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "judged 768 violations 0" in run.stdout, run.stdout
    assert all(path.startswith(site) for path in run.stdout.split("from ", 1)[1].split()), run.stdout
