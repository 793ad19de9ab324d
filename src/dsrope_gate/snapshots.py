"""dsrope's kernels on the golden inputs, and their per-platform bit snapshots: a kernel edit that changes
what the kernels compute on this platform changes these bits (tests/test_golden.py, tools/golden.py
--update-snapshot, verify). The files themselves are the golden store's (dsrope_gate.golden).

dsrope's implementation of each op is named in its record (dsrope_gate.ops) and called as any other
implementation is; the QNorm forward's saved rstd, which no public call returns, comes from dsrope's
custom op `dsrope::qnorm_rope` (its documented forward: out and rstd).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dsrope.interpreter import interpreting
from dsrope_gate import golden
from dsrope_gate.cases import Case, Inputs
from dsrope_gate.differential import forward_backward
from dsrope_gate.ops import OPS
from dsrope_gate.targets import load_target


def kernel_device() -> torch.device:
    return torch.device("cpu" if interpreting() or not torch.cuda.is_available() else "cuda")


def platform_key() -> dict:
    import triton

    device = "interpreter" if kernel_device().type == "cpu" else torch.cuda.get_device_name()
    return {"device": device, "triton": triton.__version__}


def dsrope_outputs(case: Case, inputs: Inputs) -> dict[str, torch.Tensor]:
    """`op.stage` -> dsrope's output for every stage of the case's ops, on the CPU, contiguous."""
    import numpy

    outputs = {}
    # the interpreter's FP32 overflow in the huge cases is intended
    with numpy.errstate(over="ignore"):
        for name in case.ops:
            op = OPS[name]
            fn = load_target(op.dsrope)
            out, dx = forward_backward(lambda x, fn=fn, op=op: op.call(fn, case, x, inputs), inputs.x, inputs.grad)
            outputs |= {f"{name}.out": out, f"{name}.dx": dx}
            if "rstd" in op.stages:
                from dsrope.qnorm_rope import qnorm_rope

                outputs[f"{name}.rstd"] = qnorm_rope(inputs.x, inputs.cos, inputs.sin, case.rotary, case.eps)[1]
    return {k: v.detach().cpu().contiguous() for k, v in outputs.items()}


def run_kernels(record: dict, tensors: dict[str, torch.Tensor], device=None) -> dict[str, torch.Tensor]:
    """dsrope's outputs on a stored case's inputs in their recorded layouts: `op.stage` -> output (CPU)."""
    case, inputs = golden.laid_out_inputs(record, tensors, kernel_device() if device is None else device)
    return dsrope_outputs(case, inputs)


def kernel_snapshot(root: Path | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """dsrope's outputs on every stored case (`case/op.stage` -> tensor) and the hash of each case's inputs:
    what a snapshot stores."""
    root = root or golden.golden_root()
    manifest = golden.verify_all(root)
    outputs, inputs = {}, {}
    for c in manifest["cases"]:
        record, tensors = golden.load_case(root, manifest, c["name"])
        inputs[record["name"]] = golden.input_hashes(tensors)
        for name, t in run_kernels(record, tensors).items():
            outputs[f"{record['name']}/{name}"] = t
    return outputs, inputs


def record_snapshot(root: Path | None = None) -> str:
    """Run the kernels on every stored case and write the snapshot for this platform's key."""
    root = root or golden.golden_root()
    key = platform_key()
    outputs, inputs = kernel_snapshot(root)
    report = snapshot_report(root, key, outputs)
    data_path = golden.write_snapshot(root, key, outputs, inputs)
    _, sidecar = golden.snapshot_paths(root, key)
    size = data_path.stat().st_size
    return f"{report}\nrecorded {golden.relname(data_path)} ({size} bytes) and {golden.relname(sidecar)}"


def snapshot_report(root: Path, key: dict, outputs: dict[str, torch.Tensor]) -> str:
    _, sidecar = golden.snapshot_paths(root, key)
    if not sidecar.is_file():
        return f"no earlier snapshot for {key}"
    try:
        _, stored = golden.read_snapshot(sidecar)
    except golden.GoldenError as e:
        return f"earlier snapshot unusable: {e}"
    changes = []
    for case in sorted({k.split("/")[0] for k in set(stored) | set(outputs)}):
        old = {k.split("/", 1)[1]: v for k, v in stored.items() if k.startswith(case + "/")}
        new = {k.split("/", 1)[1]: v for k, v in outputs.items() if k.startswith(case + "/")}
        changes += golden.diff_tensors(case, old, new)
    return golden.summary(changes, f"kernel bits vs the earlier snapshot for {key}")
