"""Suite-wide setup: device selection, hypothesis profiles, markers.

CUDA when a device is visible (compiled kernels); otherwise the real Triton kernels run in
Triton's interpreter on CPU (dsrope_gate.startup: before dsrope is imported, hence here).
"""

from __future__ import annotations

import os

# The checkout's src/ and reference/ are on the path through pyproject's [tool.pytest.ini_options]
# pythonpath, ahead of any installed copy.
# One pytest-xdist worker per GPU (gpu-tests -n k); must run before anything initialises CUDA.
from dsrope_dev.gpu_pinning import pin_worker_to_gpu  # noqa: E402

pin_worker_to_gpu()

import torch  # noqa: E402

# One share of the host's cores per xdist worker. torch's default is every core in every process, and
# the FP64 reference is CPU work in every worker (docs/records/2026-12-03-h200-gpu-runs.md).
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))

from dsrope_gate.startup import interpret_without_gpu  # noqa: E402

interpret_without_gpu()

if torch.cuda.is_available() and os.environ.get("DSROPE_RECORD_SPECIALIZATIONS"):
    # what this run compiles, for the list gpu-tests warms Triton's cache with (dsrope_dev.compile_cache)
    from pathlib import Path  # noqa: E402

    from dsrope_dev import compile_cache  # noqa: E402

    if compile_cache.hooks_available():
        compile_cache.record(Path(os.environ["DSROPE_RECORD_SPECIALIZATIONS"]))

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

# Profiles (tests/test_properties.py): ci is derandomized (the same examples every run) and sized
# to keep the property suite under 5 minutes on 2 cores; nightly searches (target phase on the
# error in ULP) with 10,000 examples per property; gpu draws larger shapes (dsrope_gate.strategies).
# `--hypothesis-profile NAME` (pytest, or `nox -s tests -- --hypothesis-profile NAME`) overrides
# the default chosen here: the hypothesis plugin loads it after this file is imported.
_slow_ok = [HealthCheck.too_slow, HealthCheck.data_too_large]
_common = dict(deadline=None, print_blob=True, suppress_health_check=_slow_ok)
_no_target = (Phase.explicit, Phase.generate, Phase.shrink, Phase.explain)
_fixed = dict(derandomize=True, database=None, phases=_no_target)
settings.register_profile("ci", max_examples=50, **_fixed, **_common)
settings.register_profile("dev", max_examples=100, **_common)
settings.register_profile("nightly", max_examples=10_000, **_common)
# gpu: every new (H, D, R, dtype) compiles kernels (~1 s each on the H200 host); at 100 examples
# the whole gpu-tests run went past 330 s inside test_properties.py (docs/records/2026-12-02-h200-gpu-runs.md).
# No shrinking: on the GPU each shrink step recompiles and re-runs the FP64 model, and a failure
# being shrunk ran the 16:19 gate past its timeout before it was reported. The first failing
# example is reported as drawn, with its replay line (`note`), for shrinking elsewhere.
_gpu_phases = (Phase.explicit, Phase.generate)
settings.register_profile("gpu", max_examples=20, **dict(_fixed, phases=_gpu_phases), **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gpu" if torch.cuda.is_available() else "ci"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (compiled kernels)")
    config.addinivalue_line("markers", "slow: long-running; a smaller CPU test covers the same property")
    config.addinivalue_line("markers", "long: seconds on any device (Python subprocesses): started early on CUDA")


def _cost_rank(item) -> int:
    """On CUDA, the long tests first (the >2**31-element tests, then the property module, whose every
    example launches kernels, and the tests that start Python processes:
    docs/records/2026-12-04-h200-gpu-runs.md), so that no
    worker starts one when the others are done (on CPU the order is kept: the mutation gate runs the
    slow property module last on purpose)."""
    if item.get_closest_marker("slow"):
        return 0
    if item.nodeid.startswith("tests/test_properties.py") or item.get_closest_marker("long"):
        return 1
    return 2


def pytest_collection_modifyitems(config, items):
    import pytest

    if torch.cuda.is_available():
        items.sort(key=_cost_rank)  # stable: the same order in every xdist worker
        return
    skip = pytest.mark.skip(reason="GPU-only: needs a CUDA device; run `nox -s gpu-tests` on a CUDA host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU (Triton interpreter)"
    return f"dsrope: device {device}; torch {torch.__version__}; triton {triton.__version__}"
