"""Two bench runs side by side, target by target (dsrope_dev.bench_compare).

python -m tools.bench_compare BEFORE_DIR AFTER_DIR
"""

from dsrope_dev.bench_compare import main

if __name__ == "__main__":
    raise SystemExit(main())
