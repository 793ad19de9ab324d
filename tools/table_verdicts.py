"""The table builders' verdicts and semantics on one device, as markdown: per builder and case the declared
attention factor, the entries outside the model and the first of them, then per builder its semantics over the
cases it took (dsrope_gate.tables.judge over dsrope_gate.table_builders.BUILDERS).

    python -m tools.table_verdicts [--device cuda] [--tf32] [--slow] [--builders all|dsrope,sglang,...]

--tf32 lets CUDA matmuls run in TF32 (torch.backends.cuda.matmul.allow_tf32), as trainers often set it.
"""

from dsrope_gate.table_builders import main

if __name__ == "__main__":
    raise SystemExit(main())
