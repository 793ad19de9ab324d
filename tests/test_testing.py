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
    xf = x.float()  # one cast: its backward rounds the gradient once (two casts would round two and add in bf16)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
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
    result = assert_conforms(fn, op, device=DEVICE, semantics=labels, examples=4)
    assert result["forward"]["verdict"] == "conforms" and result["backward"]["verdict"] == "conforms"


def test_bf16_math_fails_with_the_element_and_a_reproduction():
    text = failure(bf16_math, "partial_rope", examples=0, golden=False)
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


def refuses_fp16(x, cos, sin, rotary):
    if x.dtype == torch.float16:
        raise TypeError("x: float16 is not supported")
    return eager_partial_rope(x, cos, sin, rotary)


def refuses_everything(x, cos, sin, rotary):
    raise NotImplementedError("no kernel for this input")


class _DoubledGradient(torch.autograd.Function):
    """The contract's forward; its backward is the contract's times two."""

    @staticmethod
    def forward(ctx, x, cos, sin, rotary):
        ctx.save_for_backward(cos, sin)
        ctx.rotary = rotary
        return eager_partial_rope(x.detach(), cos, sin, rotary)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return 2 * eager_partial_rope(grad, cos, -sin, ctx.rotary), None, None, None


def doubled_gradient(x, cos, sin, rotary):
    return _DoubledGradient.apply(x, cos, sin, rotary)


SMALL = dict(examples=0, golden=False, dtypes=["bfloat16", "float16"], device=DEVICE)


def test_a_partial_result_fails_the_assertion():
    with pytest.raises(AssertionError) as error:
        assert_conforms(refuses_fp16, "partial_rope", **SMALL)
    text = str(error.value)
    assert "partial_rope forward: partial:" in text and "refused (TypeError: x: float16 is not supported)" in text


def test_a_result_with_nothing_run_fails_the_assertion():
    with pytest.raises(AssertionError, match="partial_rope forward: not run: 0 of 0 elements"):
        assert_conforms(refuses_everything, "partial_rope", **SMALL)


def test_an_unknown_label_is_a_usage_error_that_lists_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown label\(s\) \['interleave'\] for partial_rope; known: .*'interleaved'"
    ):
        assert_conforms(eager_partial_rope, "partial_rope", semantics="interleave", **SMALL)


def test_bitwise_equal_with_its_defaults_compares_the_backward_too():
    """Equal forwards, backwards apart by a factor of two: the default arguments judge the backward."""
    with pytest.raises(AssertionError) as error:
        assert_bitwise_equal(eager_partial_rope, doubled_gradient, "partial_rope", device=DEVICE)
    text = str(error.value)
    assert "backward: " in text and "forward: " not in text, text


def exits(x, cos, sin, rotary):
    os._exit(3)


@pytest.mark.long
def test_isolated_a_process_exit_fails_the_assertion_not_the_run():
    with pytest.raises(AssertionError, match=r"crashed: exit status 3 in dsv4-bfloat16 \(forward\)"):
        assert_conforms(exits, "partial_rope", isolate=True, **SMALL)


MARKER_OPTIONS = textwrap.dedent(
    """
    import os

    import pytest
    import torch
    from dsrope_gate.differential import eager_partial_rope
    from my_rope_helpers import doubled_gradient

    SMALL = dict(examples=0, golden=False, dtypes=["bfloat16"])
    SEED0_SHAPES = {seed0_shapes!r}


    def rope(x, cos, sin, rotary):
        return eager_partial_rope(x, cos, sin, rotary)


    def one_ulp_up(out):
        return torch.where(out.isfinite(), torch.nextafter(out, torch.full_like(out, float("inf"))), out)


    def wrong_on_float16(x, cos, sin, rotary):
        out = eager_partial_rope(x, cos, sin, rotary)
        return one_ulp_up(out) if x.dtype == torch.float16 else out


    def wrong_off_the_canonical_rotaries(x, cos, sin, rotary):  # the drawn cases draw other rotaries
        out = eager_partial_rope(x, cos, sin, rotary)
        return out if rotary in (32, 64) else one_ulp_up(out)


    def wrong_on_128_heads(x, cos, sin, rotary):  # only the golden Pro cases have 128 heads
        out = eager_partial_rope(x, cos, sin, rotary)
        return one_ulp_up(out) if x.shape[1] == 128 else out


    def wrong_on_the_seed_0_case(x, cos, sin, rotary):
        out = eager_partial_rope(x, cos, sin, rotary)
        return one_ulp_up(out) if tuple(x.shape) in SEED0_SHAPES else out


    def in_place(x, cos, sin, rotary):
        x.copy_(eager_partial_rope(x.clone(), cos, sin, rotary))


    def exits(x, cos, sin, rotary):
        os._exit(3)


    @pytest.mark.conforms("partial_rope", **SMALL)
    def test_backward_judged():
        return doubled_gradient


    @pytest.mark.conforms("partial_rope", backward=False, **SMALL)
    def test_backward_not_judged():
        return doubled_gradient


    @pytest.mark.conforms("partial_rope", examples=0, golden=False, dtypes=["float16"])
    def test_dtypes_with_float16():
        return wrong_on_float16


    @pytest.mark.conforms("partial_rope", examples=0, golden=False, dtypes=["bfloat16", "float32"])
    def test_dtypes_without_float16():
        return wrong_on_float16


    @pytest.mark.conforms("partial_rope", semantics="interleaved", **SMALL)
    def test_semantics_its_own():
        return rope


    @pytest.mark.conforms("partial_rope", semantics=["interleaved", "half-split"], **SMALL)
    def test_semantics_another():
        return rope


    @pytest.mark.conforms("partial_rope", semantics="interleave", **SMALL)
    def test_semantics_unknown():
        return rope


    @pytest.mark.conforms("partial_rope", examples=3, golden=False, dtypes=["bfloat16"])
    def test_examples_drawn():
        return wrong_off_the_canonical_rotaries


    @pytest.mark.conforms("partial_rope", **SMALL)
    def test_examples_none():
        return wrong_off_the_canonical_rotaries


    @pytest.mark.conforms("partial_rope", examples=0, golden=True, dtypes=["bfloat16"])
    def test_golden_judged():
        return wrong_on_128_heads


    @pytest.mark.conforms("partial_rope", **SMALL)
    def test_golden_not_judged():
        return wrong_on_128_heads


    @pytest.mark.conforms("partial_rope", examples=3, seed=0, golden=False, dtypes=["bfloat16"])
    def test_seed_0():
        return wrong_on_the_seed_0_case


    @pytest.mark.conforms("partial_rope", examples=3, seed=1, golden=False, dtypes=["bfloat16"])
    def test_seed_1():
        return wrong_on_the_seed_0_case


    @pytest.mark.conforms("partial_rope", in_place=True, **SMALL)
    def test_in_place_declared():
        return in_place


    @pytest.mark.conforms("partial_rope", **SMALL)
    def test_in_place_not_declared():
        return in_place


    @pytest.mark.conforms("partial_rope", isolate=True, **SMALL)
    def test_isolated_exit():
        return exits
    """
)
# test name -> whether it passes: each option of the marker, on and off, changes the verdict it should
MARKER_EXPECTED = {
    "test_backward_judged": False,
    "test_backward_not_judged": True,
    "test_dtypes_with_float16": False,
    "test_dtypes_without_float16": True,
    "test_semantics_its_own": True,
    "test_semantics_another": False,
    "test_semantics_unknown": False,
    "test_examples_drawn": False,
    "test_examples_none": True,
    "test_golden_judged": False,
    "test_golden_not_judged": True,
    "test_seed_0": False,
    "test_seed_1": True,
    "test_in_place_declared": True,
    "test_in_place_not_declared": False,
    "test_isolated_exit": False,
}


@pytest.mark.long
def test_every_marker_option_changes_the_verdict_it_should(tmp_path):
    import inspect
    import xml.etree.ElementTree as ET

    from dsrope_gate import case_sets
    from dsrope_gate.ops import PARTIAL_ROPE

    seed0, seed1 = ({tuple(c.shape) for c in case_sets.sweep(PARTIAL_ROPE, 3, seed)} for seed in (0, 1))
    only0 = seed0 - seed1 - {tuple(c.shape) for c in case_sets.canonical() + case_sets.probes()}
    assert only0  # the option can only change the verdict where the cases differ
    assert any(c.rotary not in (32, 64) for c in case_sets.sweep(PARTIAL_ROPE, 3, 0))
    (tmp_path / "test_user.py").write_text(MARKER_OPTIONS.format(seed0_shapes=only0))
    helpers = "import torch\nfrom dsrope_gate.differential import eager_partial_rope\n\n\n"
    helpers += inspect.getsource(_DoubledGradient) + "\n\n" + inspect.getsource(doubled_gradient)
    (tmp_path / "my_rope_helpers.py").write_text(helpers)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'reference'}:{tmp_path}", "CUDA_VISIBLE_DEVICES": ""}
    argv = [sys.executable, "-m", "pytest", "-p", "dsrope_gate.pytest_plugin", "-p", "no:cacheprovider", "-q"]
    run = subprocess.run(
        [*argv, "--junitxml=junit.xml", "test_user.py"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    passed = {
        case.get("name"): case.find("failure") is None and case.find("error") is None
        for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")
    }
    assert passed == MARKER_EXPECTED, run.stdout[-4000:]
    assert "unknown label(s) ['interleave']" in run.stdout


def test_the_newcomers_fp32_through_passes_its_contract_and_the_contract_implementation_fails_it():
    """A team whose engine is fp32-through by design proves it is exactly that: its implementation conforms to
    the fp32-through contract (forward and the backward of that chain through autograd) and is named with its
    labels; the two-boundaries implementation fails that contract, and the fp32-through one fails the default."""
    quick = dict(device=DEVICE, examples=0, golden=False)
    result = assert_conforms(
        fp32_through, "qnorm_rope", contract="fp32-through", semantics=["fp32-through", "no-boundary-2"], **quick
    )
    assert result["contract"] == "fp32-through"
    assert result["forward"]["verdict"] == result["backward"]["verdict"] == "conforms"
    with pytest.raises(AssertionError, match="qnorm_rope forward: does not conform") as error:
        assert_conforms(eager_qnorm_rope, "qnorm_rope", contract="fp32-through", **quick)
    assert "(the fp32-through contract: fp32-through, interleaved)" in str(error.value)
    with pytest.raises(AssertionError, match="qnorm_rope forward: does not conform"):
        assert_conforms(fp32_through, "qnorm_rope", **quick)


def test_an_unknown_contract_is_a_usage_error():
    with pytest.raises(ValueError, match="contract: expected one of two-boundaries, fp32-through"):
        assert_conforms(eager_partial_rope, "partial_rope", contract="fp32", **SMALL)


def contiguous_only_rope(x, cos, sin, rotary):
    if not x.is_contiguous():
        raise NotImplementedError("x: contiguous rows only")
    return dsrope.apply_partial_rope_triton(x, cos, sin, rotary)


def test_bitwise_equal_fails_on_cases_only_one_implementation_ran():
    """Equal bits on every case both ran is not enough: a case the other refused is a failure that names it."""
    with pytest.raises(AssertionError, match="Cases run by one only: "):
        assert_bitwise_equal(
            dsrope.apply_partial_rope_triton, contiguous_only_rope, "partial_rope",
            dtypes=["bfloat16"], examples=0, backward=False,
        )  # fmt: skip


def test_golden_cases_under_another_contract_are_judged_by_that_contracts_models():
    """The golden store keeps the default contract's models; under another contract every golden case gets the
    models of that contract, computed from its stored inputs (fp32-through has no second rounding boundary:
    its bounds differ from the stored ones in every case)."""
    from dsrope_gate.conformance import golden_cases
    from dsrope_gate.ops import QNORM_ROPE

    stored, _ = golden_cases(QNORM_ROPE, "cpu", None)
    other, _ = golden_cases(QNORM_ROPE, "cpu", None, contract="fp32-through")
    assert len(other) == len(stored) > 0 and {p.contract for p in other} == {"fp32-through"}
    for a, b in zip(stored, other, strict=True):
        assert not torch.equal(a.models["forward"].lo, b.models["forward"].lo), a.case.name
