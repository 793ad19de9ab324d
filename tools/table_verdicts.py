"""The table builders' verdicts and semantics on one device (dsrope_gate.tables.judge over
dsrope_gate.table_builders), as a markdown table: per builder and case the declared attention factor, the
entries outside the model, the first of them, and the labels over the cases taken.

    python -m tools.table_verdicts [--device cuda] [--tf32] [--slow] [--builders all|dsrope,sglang,...]

--tf32 lets CUDA matmuls run in TF32 (torch.backends.cuda.matmul.allow_tf32), as trainers often set it.
"""

from __future__ import annotations

import argparse
import sys

import torch

from dsrope_gate import table_builders, tables


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tf32", action="store_true", help="CUDA matmuls in TF32")
    p.add_argument("--slow", action="store_true", help="tables.SLOW_CASES (8 times the positions)")
    p.add_argument("--builders", default="all", help="comma-separated projects of table_builders.BUILDERS")
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    cases = tables.SLOW_CASES if args.slow else tables.CASES
    device = torch.device(args.device)
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}, TF32 matmuls {'on' if args.tf32 else 'off'}, {len(cases)} cases")  # fmt: skip
    print("\n| builder | case | attention factor | outside / entries | first outside |")
    print("| --- | --- | --- | --- | --- |")
    summary = []
    for builder in table_builders.load(args.builders.split(","), progress=lambda m: print(m, file=sys.stderr)):
        verdicts = tables.judge(builder, cases, device)
        for v in verdicts:
            if v.refused:
                print(f"| {builder.name} | {v.case.name} | | refused: {v.refused} | |")
            else:
                row = [builder.name, v.case.name, f"{v.attention_factor:.6g}", f"{v.outside} / {v.elements}"]
                print("| " + " | ".join([*row, v.first_violation[:160]]) + " |")
        outside = sum(v.outside for v in verdicts)
        summary.append(f"| {builder.name} | {outside} | {', '.join(tables.labels(verdicts)) or '(none)'} |")
    print("\n| builder | outside over the cases | semantics |\n| --- | --- | --- |")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
