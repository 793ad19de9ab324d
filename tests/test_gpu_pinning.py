"""The per-GPU worker pinning: with faked device counts (runs everywhere), and live in this process
(GPU only; under `nox -s gpu-tests -- -n k` it checks the worker's own pinning)."""

from __future__ import annotations

import os

import pytest
import torch

from dsrope_dev.gpu_pinning import gpu_for_worker, pin_worker_to_gpu


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
    assert env["DSROPE_GPUS_BEFORE_PINNING"] == "4,6"


def test_bad_worker_id_is_refused():
    with pytest.raises(ValueError, match="PYTEST_XDIST_WORKER"):
        gpu_for_worker("worker-1", ["0"])


@pytest.mark.gpu
def test_this_process_sees_the_gpu_its_worker_id_names():
    """Outside xdist nothing is pinned; in worker gwN, CUDA sees exactly one GPU, the N mod n-th of
    the n listed before pinning (so k workers on k GPUs use every GPU once)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        assert "DSROPE_PINNED_GPU" not in os.environ
        return
    before = os.environ["DSROPE_GPUS_BEFORE_PINNING"].split(",")
    expected = gpu_for_worker(worker, before)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected == os.environ["DSROPE_PINNED_GPU"]
    assert torch.cuda.device_count() == 1
