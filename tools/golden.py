"""Golden tensors from the command line (the store itself: dsrope_gate.golden). Use it after a change to the
reference or to the golden cases (regenerate and diff, then --update to store), and after an intended change
of the kernels' bits on a platform (--update-snapshot records that platform's snapshot).

python -m tools.golden                    regenerate from the reference in memory, diff vs golden/
python -m tools.golden --update           ... and write golden/reference/ and golden/manifest.json
python -m tools.golden --update-snapshot  run the kernels on the stored inputs and record
                                          golden/snapshots/<key>.safetensors (+ .json sidecar)
`nox -s golden -- <flags>` runs the same in a fresh CPU venv (kernels interpreted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsrope_gate.startup import interpret_without_gpu

interpret_without_gpu()

from dsrope_gate.golden import generate, golden_root, manifest_path, reference_report, relname, write_reference  # noqa: E402
from dsrope_gate.snapshots import record_snapshot  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.golden", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--update",
        action="store_true",
        help="write the regenerated reference goldens and manifest (default: only report)",
    )
    parser.add_argument(
        "--update-snapshot",
        action="store_true",
        help="run the kernels on the stored inputs and record this platform's bit snapshot",
    )
    parser.add_argument("--root", type=Path, default=None, help="the golden folder (default: golden/)")
    args = parser.parse_args(argv)
    root = (args.root or golden_root()).resolve()

    status = 0
    # --update-snapshot alone records the kernels' bits and nothing else (test_golden.py checks that the
    # reference still reproduces the stored goldens on that platform).
    if args.update or not args.update_snapshot:
        files, manifest_bytes = generate()
        report, changed = reference_report(root, files, manifest_bytes)
        print(report)
        if args.update:
            write_reference(root, files, manifest_bytes)
            print(f"wrote {len(files)} files under {relname(root / 'reference')} and {relname(manifest_path(root))}")
        elif changed:
            print("not written: run with --update to store the regenerated goldens")
            status = 1
    if args.update_snapshot:
        print(record_snapshot(root))
    return status


if __name__ == "__main__":
    sys.exit(main())
