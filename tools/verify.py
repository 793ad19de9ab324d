"""The accuracy report (nox -s verify): every kernel on the canonical cases and the golden inputs against
the reference, the goldens and other implementations. Use it after a kernel change and on every new device,
to read each kernel's worst error and error budget, not only a pass. The report itself: dsrope_gate.verify.

    python -m tools.verify [--out DIR]
"""

from dsrope_gate.startup import interpret_without_gpu

interpret_without_gpu()

from dsrope_gate.verify import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
