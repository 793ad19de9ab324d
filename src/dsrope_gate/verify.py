"""The accuracy report: every kernel on the canonical DSV4 (and V3, where present) cases and on the
golden inputs, against the reference and the goldens; and, on the canonical cases, against
implementations this project did not write (dsrope_gate.differential, the rows "... vs ...").

    python -m tools.verify [--out DIR]          (nox -s verify; the same: python -m dsrope_gate.verify)

Compiled kernels on CUDA when a GPU is visible, Triton's interpreter on CPU otherwise. Prints one
table row per kernel x dtype x direction: elements checked, max error in ULP against the correctly
rounded reference, share bit-identical to it, error-model violations, golden status. Writes
report.json, report.md and errors.png (ULP error distributions per rounding stage) to DIR. Exits
non-zero on any violation or golden mismatch, with the reason in the last line.

Differential rows (direction "forward vs ..." / "backward vs ..."; tests/test_vs_*.py run the same
checks): the DSV4 kernels against the eager chain of stock torch ops ("vs eager chain": F.rms_norm,
then the FP32 rotation), the V3 rotations against transformers' DeepSeek-V3 functions run in FP32
and rounded once ("vs transformers", skipped with a note when transformers is not installed). In
those rows max ulp and bit-exact compare ours with the other implementation, and a violation is an
element where the other implementation lies outside our error model, or where the model allows one
value and the two differ.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from dsrope_gate import case_sets, golden, snapshots
from dsrope_gate.cases import DTYPES, SHORT
from dsrope_gate.differential import forward_backward
from dsrope_gate.ops import OPS
from dsrope_gate.report import DIRECTION, Table, chart, render


def run_canonical(table: Table, progress):
    """DSV4 head geometry (D=512, R=64) in the production layout, every dtype, both ops: dsrope against the
    reference and against the eager chain of stock torch ops."""
    for case in case_sets.canonical(("dsv4",)):
        progress(f"canonical {case.name}")
        inputs = case.build(snapshots.kernel_device())
        outputs = snapshots.dsrope_outputs(case, inputs)
        for name in case.ops:
            op = OPS[name]
            models = op.reference(case, inputs)
            for stage in op.stages:
                model = models[stage]
                table.add(name, case.dtype, stage, outputs[f"{name}.{stage}"], model.ref, model.lo, model.hi)
            eager = lambda x, op=op, case=case, inputs=inputs: op.call(op.eager, case, x, inputs)
            for stage, theirs in zip(("out", "dx"), forward_backward(eager, inputs.x, inputs.grad), strict=True):
                direction = f"{DIRECTION[stage]} vs eager chain"
                table.add_versus(name, case.dtype, direction, outputs[f"{name}.{stage}"], theirs, models[stage])
    try:
        import dsrope_reference.rope_utils  # noqa: F401

        import dsrope.rope_utils  # noqa: F401
    except ImportError:
        progress("V3 rope_utils not present: skipped")
        return
    run_v3(table, progress)


def run_v3(table: Table, progress):
    """The V3 utilities on a bshd query rope slice (d = 64), both pairings, every dtype; forward and
    backward against transformers' DeepSeek-V3 functions where transformers is installed."""
    from dsrope_reference import rope_utils as v3

    from dsrope.rope_utils import (
        apply_rotary_emb,
        apply_rotary_emb_half_split,
        freqs_cis_from_position_ids,
        precompute_freqs_cis,
    )
    from dsrope_gate.differential import TRANSFORMERS_MISSING, transformers_deepseek_v3, transformers_rotation_bshd

    hf = transformers_deepseek_v3()
    if hf is None:
        table.notes.append(f"vs transformers rows skipped: {TRANSFORMERS_MISSING}")
        progress(table.notes[-1])
    device = snapshots.kernel_device()
    freqs = precompute_freqs_cis(64, 4096, 10000.0, None)
    g = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 4096, (2, 16), generator=g).to(device)
    table64 = freqs_cis_from_position_ids(positions, freqs)
    g_grad = torch.Generator().manual_seed(10)  # its own: the inputs above stay those of every run
    for dtype in ("bfloat16", "float16", "float32"):
        progress(f"canonical v3 {SHORT[dtype]}")
        x = torch.randn(2, 16, 8, 64, generator=g, dtype=torch.float64).to(DTYPES[dtype]).to(device)
        for kernel, fn, pairing in (
            ("v3_interleaved", apply_rotary_emb, "interleaved"),
            ("v3_half_split", apply_rotary_emb_half_split, "half_split"),
        ):
            m = v3.rotation(x, table64, pairing)
            out = fn(x, table64)
            table.add(kernel, dtype, "out", out, m.ref, m.lo, m.hi)
            if hf is None:
                continue
            grad = torch.randn(x.shape, generator=g_grad, dtype=torch.float64).to(x.dtype).to(device)
            xg = x.detach().requires_grad_()
            (dx,) = torch.autograd.grad(fn(xg, table64), xg, grad)
            theirs_out, theirs_dx = transformers_rotation_bshd(hf, pairing, x, table64, grad)
            table.add_versus(kernel, dtype, "forward vs transformers", out, theirs_out, m)
            dm = v3.rotation(grad, table64.conj(), pairing)
            table.add_versus(kernel, dtype, "backward vs transformers", dx, theirs_dx, dm)


def run_goldens(table: Table, progress) -> list[str]:
    problems = []
    manifest = golden.verify_all()
    key = snapshots.platform_key()
    _, sidecar = golden.snapshot_paths(golden.golden_root(), key)
    snapshot = golden.read_snapshot(sidecar)[1] if sidecar.is_file() else None
    for i, c in enumerate(manifest["cases"], 1):
        name = c["name"]
        progress(f"golden {i}/{len(manifest['cases'])} {name}")
        record, tensors = golden.load_case(golden.golden_root(), manifest, name)
        case = golden.case_from_record(record)
        inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
        fresh = golden.encode_case(case, inputs, golden.reference_stages(case, inputs))
        stored_out = [k for k in tensors if not k.startswith("input.")]
        ref_exact = sorted(fresh) == sorted(tensors) and all(
            golden.tensor_bytes(fresh[k]) == golden.tensor_bytes(tensors[k]) for k in stored_out
        )
        if not ref_exact:
            problems.append(f"golden {name}: the reference no longer reproduces the stored outputs")
        outputs = snapshots.run_kernels(record, tensors)
        for stage, out in outputs.items():
            kernel, part = stage.split(".")
            model = golden.decode_stage(stage, tensors)
            status = ["ref bit-exact" if ref_exact else "REF CHANGED"]
            if snapshot is None:
                status.append(f"no snapshot for {key['device']} triton {key['triton']}")
            else:
                old = snapshot.get(f"{name}/{stage}")
                same = old is not None and golden.tensor_bytes(old) == golden.tensor_bytes(out)
                status.append("snapshot match" if same else "SNAPSHOT MISMATCH")
                if not same:
                    changes = golden.diff_tensors(name, {stage: old} if old is not None else {}, {stage: out})
                    problems.append(golden.summary(changes, f"golden {name} {stage}: kernel bits differ from snapshot"))
            table.add(kernel, record["dtype"], part, out, model["ref"], model["lo"], model["hi"], ", ".join(status))
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/verify", help="where the report goes (default: out/verify)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()

    def progress(msg):
        print(f"[{time.time() - start:6.1f}s] {msg}", flush=True)

    import triton

    import dsrope  # noqa: F401  (installs the interpreter's rounding fix before any launch)

    key = snapshots.platform_key()
    meta = {"device": key["device"], "torch": torch.__version__, "triton": triton.__version__}
    table = Table()
    problems = []
    try:
        run_canonical(table, progress)
        problems += run_goldens(table, progress)
    except golden.GoldenError as e:
        problems.append(f"golden files: {e}")
    text, rows = render(table, meta)
    violations = []
    for r in rows:
        if r["violations"]:
            violations.append(
                f"{r['kernel']} {r['dtype']} {r['direction']}: {r['violations']} elements outside "
                f"the error model; {r['first_violation']}"
            )
    problems = violations + problems  # a wrong value first; a changed bit (golden) after
    print(text)
    (out / "report.md").write_text(f"# dsrope accuracy report\n\n{text}\n")
    (out / "report.json").write_text(json.dumps({"meta": meta, "rows": rows, "problems": problems}, indent=1))
    drew = chart(table, out / "errors.png")
    print(f"wrote {out / 'report.md'}, {out / 'report.json'}" + (f", {out / 'errors.png'}" if drew else ""))
    print(f"{sum(r['elements'] for r in rows)} elements in {time.time() - start:.0f} s")
    if problems:
        for p in problems:
            print("FAIL:", p)
        print(f"verify FAILED ({len(problems)} problems): {problems[0].splitlines()[0]}")
        return 1
    print("verify passed: no element outside the error model, goldens match")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
