"""Pin each pytest-xdist worker to its own GPU.

xdist names workers gw0, gw1, ...; with k workers on a host with n visible GPUs, worker i gets
the (i mod n)-th of them. Setting CUDA_VISIBLE_DEVICES to that one GPU before CUDA initialises
makes it the worker's cuda:0, so tests need not know. CUDA reads the variable once, at its
first call (torch.cuda.is_available() is one), so this runs first in conftest.py and counts
GPUs without touching CUDA: from an existing CUDA_VISIBLE_DEVICES list, else `nvidia-smi -L`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess


def gpu_for_worker(worker: str | None, gpus: list[str]) -> str | None:
    """The GPU (an entry of `gpus`) for an xdist worker id ('gw3'); None outside xdist or without GPUs."""
    if not worker or not gpus:
        return None
    m = re.fullmatch(r"gw(\d+)", worker)
    if m is None:
        raise ValueError(f"PYTEST_XDIST_WORKER: expected 'gw<N>', got {worker!r}")
    return gpus[int(m.group(1)) % len(gpus)]


def visible_gpus(environ) -> list[str]:
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        lines = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(entry for entry in lines.splitlines() if entry.startswith("GPU "))]


def pin_worker_to_gpu(environ=os.environ) -> str | None:
    gpus = visible_gpus(environ)
    gpu = gpu_for_worker(environ.get("PYTEST_XDIST_WORKER"), gpus)
    if gpu is not None:
        environ["CUDA_VISIBLE_DEVICES"] = gpu
        environ["DSROPE_PINNED_GPU"] = gpu
        environ["DSROPE_GPUS_BEFORE_PINNING"] = ",".join(gpus)  # for the live check in the tests
    return gpu
