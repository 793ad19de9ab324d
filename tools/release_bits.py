"""What an upgrade moves: two releases of one preset (dsrope_gate.presets, `NAME@VERSION`) run on the same
inputs, each in a spawned process of its own (two releases of a package cannot share one), and their
outputs compared bit for bit: the share of elements with equal bits and the largest ulp distance
(dsrope_reference.floats.ulp_distance) of every implementation both give, on CPU (or --device cuda: the
q path's kernels compiled, the tables built on the GPU). Use it when a peer's new release is pinned beside
the old one (dsrope_gate.pins), to record in docs/records/ whether its bits moved.

    python -m tools.release_bits transformers@5.17.0 transformers@5.23.0 [--device cpu|cuda] [--json PATH]

Inputs: x [2, 16, 32, 512] in bf16, fp16 and fp32 (R = 64, eps 1e-6) with per-batch tables for the q path
(qnorm_rope, partial_rope); for the rope table builders, positions near 0, around DeepSeek-V4's original
length 65536 and drawn up to 2**20, for a main layer (theta 1e4), a compress layer (theta 160000, YaRN
factor 16 over 65536) and DeepSeek-V3's YaRN (theta 1e4, factor 40 over 4096, mscale 1 and 1). For
transformers also its weighted DeepseekV4RMSNorm (FP32 weight, bf16 input), whose outputs are compared in
bf16 (a release that returns FP32 is rounded once to bf16, as a bf16 consumer of it reads it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys

TABLE_CASES = {
    "main": (10000.0, None),
    "compress": (160000.0, dict(factor=16, original_max_position_embeddings=65536, beta_fast=32, beta_slow=1)),
    "deepseek-v3-yarn": (
        10000.0,
        dict(factor=40, original_max_position_embeddings=4096, beta_fast=32, beta_slow=1, mscale=1, mscale_all_dim=1),
    ),
}


def positions():
    import torch

    g = torch.Generator().manual_seed(0)
    near_zero = torch.arange(1024)
    near_original = torch.arange(65536 - 512, 65536 + 512)
    far = torch.randint(0, 1 << 20, (1024,), generator=g)
    return torch.stack((near_zero, near_original, far))  # [3, 1024]: one batch row per range


def outputs(spec: str, device: str) -> dict:
    """In a fresh process: every output of `spec`'s implementations and table builders on the inputs (on
    `device`; the outputs come back on CPU)."""
    import torch

    from dsrope_gate import presets
    from dsrope_gate.inputs import tables, values

    preset = spec.partition("@")[0]
    out, notes = {}, []
    if device == "cpu":  # Triton kernels in the interpreter store bf16 rounded to nearest even, as a GPU does
        from dsrope.interpreter import install_interpreter_rounding

        install_interpreter_rounding()
    else:
        notes.append(f"torch.backends.cuda.matmul.allow_tf32 = {torch.backends.cuda.matmul.allow_tf32}")
    impls = presets.load([spec], device, None, lambda msg: print(msg, file=sys.stderr))
    cos, sin = tables(2, 32, 64, 0, per_batch=True, device=device)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = values((2, 16, 32, 512), dtype, 1).to(device)
        for impl in impls:
            args = (x, cos, sin, 64, 1e-6) if impl.op.name == "qnorm_rope" else (x, cos, sin, 64)
            out[f"{impl.name.partition(':')[2]} {str(dtype)[6:]}"] = impl.fn(*args).detach().cpu()
    for builder in presets.table_builders([spec], lambda msg: print(msg, file=sys.stderr)):
        for case, (theta, scaling) in TABLE_CASES.items():
            c, s = builder.fn(positions().to(device), 64, theta, scaling)
            name = builder.name.partition(":")[2]
            out[f"{name} {case} cos"], out[f"{name} {case} sin"] = c[..., :32].cpu(), s[..., :32].cpu()
    if preset == "transformers":
        modeling = sys.modules["transformers.models.deepseek_v4.modeling_deepseek_v4"]
        norm = modeling.DeepseekV4RMSNorm(512, eps=1e-6).to(device)
        with torch.no_grad():
            norm.weight.copy_(1 + 0.1 * values((512,), torch.float32, 2))
            result = norm(values((2, 32, 512), torch.bfloat16, 3).to(device))
        out["DeepseekV4RMSNorm (weight fp32, x bf16) in bf16"] = result.to(torch.bfloat16).cpu()
        notes.append(f"DeepseekV4RMSNorm returns {str(result.dtype)[6:]}")
    return {"version": getattr(sys.modules.get(preset), "__version__", spec), "outputs": out, "notes": notes}


def _child(spec, device, queue):
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(outputs(spec, device), buffer)  # bytes: the child exits before the parent reads
    queue.put(buffer.getvalue())


def in_fresh_process(spec: str, device: str) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(spec, device, queue))
    process.start()
    data = queue.get()
    process.join()
    import io

    import torch

    return torch.load(io.BytesIO(data))


def compare(a: dict, b: dict) -> list[dict]:
    import torch
    from dsrope_reference.floats import ulp_distance

    rows = []
    for name in sorted(set(a) & set(b), key=lambda n: (n.split()[0], n)):
        x, y = a[name], b[name]
        integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
        same = x.contiguous().view(integer) == y.contiguous().view(integer)
        ulps = ulp_distance(x, y)
        rows.append(
            {"output": name, "elements": x.numel(), "equal": same.float().mean().item(), "max_ulp": int(ulps.max())}
        )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("releases", nargs=2, help="two releases of one preset, NAME@VERSION")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--json", help="write the rows and versions here")
    args = ap.parse_args(argv)
    found = [in_fresh_process(spec, args.device) for spec in args.releases]
    rows = compare(found[0]["outputs"], found[1]["outputs"])
    a, b = args.releases
    print(f"{a} vs {b}, device {args.device}, each in its own process")
    for spec, x in zip(args.releases, found, strict=True):
        print(f"{spec}: {x['version']} loaded; {'; '.join(x['notes']) or 'no notes'}")
    print()
    print("| output | elements | equal | max ulp |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['output']} | {r['elements']} | {r['equal']:.2%} | {r['max_ulp']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "releases": [a, b],
                    "device": args.device,
                    "versions": [x["version"] for x in found],
                    "notes": [x["notes"] for x in found],
                    "rows": rows,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
