"""dsrope_gate.testing (assert_conforms, assert_bitwise_equal) and its pytest plugin, as another project's
suite uses them: each assertion passes on dsrope's kernels and on the eager chain, and FAILS, with a message
that names the fault, on implementations that are wrong in the ways peers were: bf16 arithmetic, the
rotate_half pairing, the normalized row kept in FP32 into the rotation, one ulp off on 1% of the elements.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import dsrope
from dsrope_gate.differential import eager_partial_rope, eager_qnorm_rope
from dsrope_gate.semantics import rotate_fp32
from dsrope_gate.testing import assert_bitwise_equal, assert_conforms

ROOT = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def bf16_math(x, cos, sin, rotary):
    """The rotation computed in x.dtype (each product and the sum rounded to bf16): a different function."""
    d, lead = x.shape[-1], x.shape[-1] - rotary
    a, b = x[..., lead::2], x[..., lead + 1 :: 2]
    c, s = cos[:, None, :, : rotary // 2].to(x.dtype), sin[:, None, :, : rotary // 2].to(x.dtype)
    rotated = torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)
    return torch.cat((x[..., :lead], rotated), -1).reshape(*x.shape[:-1], d)


def half_split(x, cos, sin, rotary):
    d, half = x.shape[-1], rotary // 2
    lead, a, b = x[..., : d - rotary], x[..., d - rotary : d - half].float(), x[..., d - half :].float()
    c, s = cos[:, None, :, :half], sin[:, None, :, :half]
    return torch.cat((lead, (a * c - b * s).to(x.dtype), (a * s + b * c).to(x.dtype)), -1)


def fp32_through(x, cos, sin, rotary, eps):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return rotate_fp32(y, cos, sin, rotary).to(x.dtype)


def off_by_one_ulp(fn, share=0.01):
    def wrong(x, *args):
        out = fn(x, *args)
        g = torch.Generator().manual_seed(out.numel())
        pick = (torch.rand(out.shape, generator=g) < share).to(out.device) & out.isfinite()
        return torch.where(pick, torch.nextafter(out, torch.full_like(out, float("inf"))), out)

    return wrong


def failure(fn, op, **options) -> str:
    with pytest.raises(AssertionError) as error:
        assert_conforms(fn, op, device=DEVICE, **options)
    return str(error.value)


@pytest.mark.parametrize(
    "fn,op,labels",
    [
        (eager_qnorm_rope, "qnorm_rope", ["two-boundaries", "interleaved"]),
        (dsrope.qnorm_rope_triton, "qnorm_rope", "two-boundaries"),
        (eager_partial_rope, "partial_rope", "interleaved"),
        (dsrope.apply_partial_rope_triton, "partial_rope", None),
    ],
    ids=["eager qnorm", "dsrope qnorm", "eager rope", "dsrope rope"],
)
def test_conforming_implementations_pass(fn, op, labels):
    result = assert_conforms(fn, op, device=DEVICE, semantics=labels)
    assert result["forward"]["verdict"] == "conforms" and result["backward"]["verdict"] == "conforms"


def test_bf16_math_fails_with_the_element_and_a_reproduction():
    text = failure(bf16_math, "partial_rope")
    where = next(line for line in text.splitlines() if line.startswith("Where (case kind, dtype"))
    assert "canonical bfloat16" in where and "canonical float16" in where and "probe bfloat16" in where, where
    assert "float32" not in where, where  # in fp32, bf16 math is the contract's FP32 math
    assert "bf16_math does not conform to partial_rope" in text and "partial_rope forward: does not conform" in text
    assert "First element outside the model: case 'dsv4-bfloat16'" in text, text
    assert "x's row rms" in text and "allowed [" in text and "ulp of torch.bfloat16 from the reference" in text
    recipe = next(line.strip() for line in text.splitlines() if line.strip().startswith("import torch;"))
    scope = {}
    exec(recipe.split("  #")[0], scope)  # the reproduction runs as pasted
    assert scope["x"].shape == (2, 16, 8, 512) and scope["x"].dtype == torch.bfloat16
    call = next(line.strip() for line in text.splitlines() if line.strip().startswith("print(fn("))
    index = [int(i) for i in call.rsplit("[", 1)[1].rstrip("])").split(", ")]
    got = float(text.split("  got ", 1)[1].split(",")[0])
    out = bf16_math(scope["x"], scope["cos"], scope["sin"], 64)
    assert out[tuple(index)].item() == got  # the element shown is the one the reproduction gives


def test_half_split_fails_and_names_its_semantics():
    text = failure(half_split, "partial_rope", dtypes=["bfloat16"])
    assert "does not conform" in text and "Semantics read off the bits: half-split" in text, text


def test_fp32_through_fails_and_the_semantics_assertion_says_what_it_found():
    text = failure(fp32_through, "qnorm_rope", dtypes=["bfloat16"], semantics="two-boundaries")
    assert "qnorm_rope forward: does not conform" in text
    assert "Semantics: expected 'two-boundaries' in the forward; Semantics read off the bits: fp32-through" in text


def test_semantics_assertion_fails_alone_on_a_conforming_implementation():
    text = failure(eager_partial_rope, "partial_rope", dtypes=["bfloat16"], semantics="fma-rotation")
    assert "forward: does not conform" not in text
    assert "expected 'fma-rotation' in the forward; Semantics read off the bits: interleaved" in text, text


def test_one_ulp_off_on_one_percent_fails_with_one_ulp():
    text = failure(off_by_one_ulp(eager_partial_rope), "partial_rope", dtypes=["float32"], backward=False)
    assert "partial_rope forward: does not conform" in text and "(1 ulp of torch.float32" in text, text
    assert "backward" not in text  # not judged when backward=False


def test_bitwise_equal_passes_on_the_same_bits():
    assert_bitwise_equal(
        eager_partial_rope,
        lambda x, cos, sin, rotary: eager_partial_rope(x, cos, sin, rotary),
        "partial_rope",
        device=DEVICE,
    )


def test_bitwise_equal_fails_with_the_share_max_ulp_and_first_difference():
    with pytest.raises(AssertionError) as error:
        assert_bitwise_equal(eager_partial_rope, off_by_one_ulp(eager_partial_rope), "partial_rope", device=DEVICE)
    text = str(error.value)
    assert "are not bitwise equal" in text and "forward: 9" in text and "max 1 ulp apart" in text, text
    assert "first differing element: case 'dsv4-bfloat16'" in text, text
    assert "backward: " not in text  # torch.where passes the gradient through: the backward bits are equal


def test_bitwise_equal_fails_on_another_semantics():
    """A trainer with the contract's chain and an engine whose normalized row stays FP32: other bits."""
    with pytest.raises(AssertionError, match=r"forward: 9\d\.\d+% of elements bitwise equal, max \d+ ulp apart"):
        assert_bitwise_equal(
            eager_qnorm_rope, fp32_through, "qnorm_rope", device=DEVICE, dtypes=["bfloat16"], backward=False
        )


PLUGIN_USER_TESTS = textwrap.dedent(
    """
    import pytest
    from dsrope_gate.differential import eager_partial_rope


    def half_split(x, cos, sin, rotary):
        import torch

        d, half = x.shape[-1], rotary // 2
        lead, a, b = x[..., : d - rotary], x[..., d - rotary : d - half].float(), x[..., d - half :].float()
        c, s = cos[:, None, :, :half], sin[:, None, :, :half]
        return torch.cat((lead, (a * c - b * s).to(x.dtype), (a * s + b * c).to(x.dtype)), -1)


    @pytest.mark.conforms("partial_rope", dtypes=["bfloat16"], semantics="interleaved")
    def test_eager_marker():
        return eager_partial_rope


    @pytest.mark.conforms("partial_rope", dtypes=["bfloat16"])
    def test_half_split_marker():
        return half_split


    def test_half_split_fixture(judge):
        judge(half_split, "partial_rope", dtypes=["bfloat16"])
    """
)


@pytest.mark.long
def test_plugin_marker_and_fixture_report_through_pytest(tmp_path):
    (tmp_path / "test_user.py").write_text(PLUGIN_USER_TESTS)
    # a configuration of the user's own: under nox the temporary folder lies inside this checkout, whose
    # pyproject.toml (addopts -ra, -p no:...) pytest would otherwise take for the user's
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "pytest", "-p", "dsrope_gate.pytest_plugin", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run(
        [*argv, "--strict-markers", "test_user.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    out = run.stdout
    assert run.returncode == 1 and "2 failed, 1 passed" in out, out[-3000:]
    for test in ("test_half_split_marker", "test_half_split_fixture"):
        assert f"FAILED test_user.py::{test} - AssertionError: half_split do" in out, out
    # one failure section each (the short summary repeats the message, in full where CI is set)
    sections = re.findall(r"^E +AssertionError: half_split does not conform to partial_rope on cpu:", out, re.M)
    assert len(sections) == 2, out
    assert "Semantics read off the bits: half-split" in out
    assert "dsrope_gate/testing.py" not in out and "dsrope_gate/conformance" not in out, out  # no gate frames


def test_plugin_imports_no_torch_at_startup():
    code = "import sys, dsrope_gate.pytest_plugin; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "[]", run.stdout + run.stderr


def test_every_reproduction_pastes_drawn_cases_too():
    """The recipe of a canonical, probe or hypothesis-drawn case, run as pasted, rebuilds its inputs bit for bit
    in their layouts (strides and storage offset)."""
    from dsrope_gate import case_sets
    from dsrope_gate.conformance.judging import Prepared
    from dsrope_gate.ops import PARTIAL_ROPE

    for case in case_sets.canonical(("v3",))[:1] + case_sets.probes() + case_sets.sweep(PARTIAL_ROPE, 3, 0):
        inputs = case.build("cpu")
        scope = {}
        exec(Prepared(case, inputs).recipe.split("  #")[0], scope)
        for name, want in zip(("x", "cos", "sin", "grad"), inputs, strict=True):
            got = scope[name]
            assert got.stride() == want.stride() and got.storage_offset() == want.storage_offset(), (case.name, name)
            assert torch.equal(got.nan_to_num(1.5), want.nan_to_num(1.5)), (case.name, name)
