"""The project installs as a library for other projects: a copy of the checkout (git's tracked and
untracked-not-ignored files, as a fresh clone has them), made read-only, installed with the `gate` extra into
a fresh virtual environment outside the repository gives exactly three top-level packages, each named for
this project, writes nothing into the copy, and a dozen lines written in that environment judge a kernel
against the reference. Then the README's "Use it in your CI" example, as written there: a foreign project
(its own correct, fp32-through, bf16-math and half-split functions) runs pytest with assert_conforms and the
plugin (switched on by the install's entry point), and the conformance command judges its function with the
golden inputs the install shipped, exit status 0.

Needs the package index (the venv installs torch 2.13.0, triton and the gate's dependencies): it runs
in the CPU suite, where CI has the index, and is skipped on a GPU host without one.
"""

from __future__ import annotations

import os
import re
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
    subprocess.run(["chmod", "-R", "a-w", str(checkout)], check=True)  # a read-only source tree builds too
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
    assert not list(checkout.rglob("*.egg-info")), "the build wrote into the source tree"

    project = tmp_path / "foreign"
    project.mkdir()
    # its own pytest configuration, as a project has: under nox the temporary folder lies inside this checkout,
    # whose pyproject.toml pytest would otherwise take for the foreign project's (its addopts and markers)
    (project / "pytest.ini").write_text("[pytest]\n")
    for name, code in readme_example().items():
        (project / name).write_text(code)
    env = env | {"CUDA_VISIBLE_DEVICES": ""}
    tests = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_rope.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    out = tests.stdout
    assert tests.returncode == 1 and "3 failed, 2 passed" in out, out[-5000:] + tests.stderr[-2000:]
    failed = set(re.findall(r"^FAILED test_my_rope.py::(\w+)", out, re.M))
    assert failed == {"test_qnorm_rope_fp32_through", "test_rope_bf16_math", "test_rope_half_split"}, out[-5000:]
    for words in (
        "AssertionError: qnorm_rope_fp32_through does not conform to qnorm_rope on cpu:",
        "Semantics: expected 'two-boundaries' in the forward; Semantics read off the bits: fp32-through",
        "AssertionError: rope_bf16_math does not conform to partial_rope on cpu:",
        "AssertionError: rope_half_split does not conform to partial_rope on cpu:",
        "Semantics read off the bits: half-split (the two-boundaries contract: interleaved).",
        "First element outside the model: case 'dsv4-bfloat16'",
        "Reproduce (paste into Python, with fn your implementation):",
    ):
        assert words in out, (words, out[-5000:])
    assert "site-packages/dsrope_gate/" not in out, out  # pytest shows the message, not the gate's frames

    # the entry point and an explicit -p (this repository's own usage) register the plugin once
    both = [str(python), "-m", "pytest", "-p", "dsrope_gate.pytest_plugin", "--co", "-q", "test_my_rope.py"]
    collected = subprocess.run(both, cwd=project, env=env, capture_output=True, text=True)
    assert collected.returncode == 0 and "5 tests collected" in collected.stdout, collected.stdout + collected.stderr

    command = [str(python), "-m", "dsrope_gate.conformance", "--op", "partial_rope", "--examples", "2"]
    judged = subprocess.run([*command, "--impl", "my_rope:rope"], cwd=project, env=env, capture_output=True, text=True)
    assert judged.returncode == 0, judged.stdout[-3000:] + judged.stderr[-3000:]
    golden = re.search(r"golden inputs: (\d+) cases from (\S+)", judged.stdout)
    assert golden and int(golden[1]) > 0 and golden[2].startswith(str(venv)), judged.stdout[:2000]
    wrong = subprocess.run(
        [*command, "--impl", "my_rope:rope_half_split"], cwd=project, env=env, capture_output=True, text=True
    )
    assert wrong.returncode == 1 and "**does not conform** | half-split" in wrong.stdout, wrong.stdout[:3000]


def readme_example() -> dict[str, str]:
    """The README's "Use it in your CI" python blocks, by the file name each one's first line gives."""
    section = (ROOT / "README.md").read_text().split("## Use it in your CI", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    files = {block.split("\n", 1)[0].removeprefix("# "): block for block in blocks}
    assert set(files) == {"my_rope.py", "test_my_rope.py"}, files.keys()
    return files
