"""The mutation gate (nox -s mutants; nox -s gpu-mutants on CUDA): every seeded kernel fault must fail the
suite. The catalog and the runner: dsrope_dev.mutation.

    python -m tools.mutants              # CPU: every CPU mutant against the whole CPU suite
    python -m tools.mutants --gpu        # CUDA: the GPU-only mutants against the gpu-marked tests
    python -m tools.mutants --list | --check | --only NAME,NAME [--tests MODULE,MODULE]
"""

from dsrope_dev.mutation.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
