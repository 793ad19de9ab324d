"""The gate in another project's pytest: registered through the `pytest11` entry point (pyproject.toml), so an
environment with dsrope[gate] installed has it on every pytest run. Nothing heavy is imported until a test
uses it (torch and Triton load on the first judgement, never at start-up).

    @pytest.mark.conforms("qnorm_rope", semantics="two-boundaries")
    def test_my_kernel():
        return my_qnorm_rope            # the test returns the implementation; the gate judges it

    def test_trainer_matches_inference(judge):
        judge(my_qnorm_rope, "qnorm_rope")      # the `judge` fixture is dsrope_gate.testing.assert_conforms

The marker takes assert_conforms's arguments (op first). A failure is pytest's own report of the assertion's
message; the gate's frames are hidden (__tracebackhide__).
"""

from __future__ import annotations

import pytest

MARKER = "conforms(op, *, semantics=None, dtypes=None, backward=True, examples=24, golden=True, seed=0, "
MARKER += "in_place=False, isolate=False, accept=(), contract='two-boundaries'): the test returns an implementation "
MARKER += "of op; dsrope_gate.testing.assert_conforms judges it"


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """For a test marked `conforms`: call it, judge what it returns. Returns True (the call is done) or None
    (an unmarked test: pytest calls it)."""
    marker = pyfuncitem.get_closest_marker("conforms")
    if marker is None:
        return None
    __tracebackhide__ = True
    from dsrope_gate.testing import assert_conforms

    names = pyfuncitem._fixtureinfo.argnames
    fn = pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names})
    if not callable(fn):
        raise TypeError(f"a test marked conforms returns the implementation to judge; it returned {fn!r}")
    assert_conforms(fn, *marker.args, **marker.kwargs)
    return True


@pytest.fixture
def judge():
    """dsrope_gate.testing.assert_conforms: judge(fn, op, **options)."""
    from dsrope_gate.testing import assert_conforms

    return assert_conforms
