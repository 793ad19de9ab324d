"""The mutation gate (nox -s mutants; nox -s gpu-mutants on CUDA): every seeded fault of the kernels and of the
judge must fail the suite. Use it after a kernel or judge edit (--only the mutants of the functions changed,
--check after any refactor of them), and over the whole catalog before a merge. The catalog and the runner:
dsrope_dev.mutation.

    python -m tools.mutants              # CPU: every CPU mutant against the whole CPU suite
    python -m tools.mutants --gpu        # CUDA: the GPU-only mutants against the gpu-marked tests
    python -m tools.mutants --list | --check | --only NAME,NAME [--tests MODULE,MODULE]
"""

from dsrope_dev.mutation.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
