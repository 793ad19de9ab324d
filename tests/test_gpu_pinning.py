"""The per-GPU worker pinning, with faked device counts (runs everywhere)."""

from __future__ import annotations

import pytest

from tests.gpu_pinning import gpu_for_worker, pin_worker_to_gpu


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_workers_spread_over_every_gpu(count):
    gpus = [str(i) for i in range(count)]
    workers = [f"gw{i}" for i in range(2 * count)]
    assigned = [gpu_for_worker(w, gpus) for w in workers]
    assert assigned[:count] == gpus, "the first `count` workers take distinct GPUs"
    assert sorted(set(assigned)) == sorted(gpus)
    assert assigned[count:] == gpus, "more workers than GPUs wrap around evenly"


def test_outside_xdist_or_without_gpus_nothing_is_pinned():
    assert gpu_for_worker(None, ["0", "1"]) is None
    assert gpu_for_worker("gw3", []) is None


def test_existing_visible_list_is_respected():
    env = {"PYTEST_XDIST_WORKER": "gw1", "CUDA_VISIBLE_DEVICES": "4,6"}
    assert pin_worker_to_gpu(env) == "6"
    assert env["CUDA_VISIBLE_DEVICES"] == "6" and env["DSROPE_PINNED_GPU"] == "6"


def test_bad_worker_id_is_refused():
    with pytest.raises(ValueError, match="PYTEST_XDIST_WORKER"):
        gpu_for_worker("worker-1", ["0"])
