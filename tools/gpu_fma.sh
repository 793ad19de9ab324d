#!/usr/bin/env bash
# The rotation without fused multiply-adds on a CUDA host, in one device call: (a) the GPU tests of the bitwise
# equality with the eager chain, the classifier's label and the unfused PTX; (b) every bench row (forward,
# backward, forward+backward, decode; ours only) with the kernels before the change and with this tree's, one run
# after the other; (c) both runs side by side, target by target (python -m tools.bench_compare).
#
#   here, in the checkout (needs git):    bash tools/gpu_fma.sh prepare [REV]  # REV's src/dsrope: .device/before
#   on the device (carry .device/before): bash tools/gpu_fma.sh run    # (a), then (b) and (c); or gpu_run.sh fma
#                                         bash tools/gpu_fma.sh tests  # (a) alone;  ... bench: (b) and (c) alone
# Time limits: (a) 150 s, each bench run 210 s (tools/gpu_run.sh's bench-triton phase gives that bench 200 s).
#
# REV: the kernels to compare against (default: the parent of the commit that brought enable_fp_fusion into
# src/dsrope/pair_rotation.py, on this branch or after its merge). Output under $OUT (default out/): fma-tests.log,
# bench-before.log, bench-after.log (each ends with its targets), bench-compare.md.
set -u
BEFORE=.device/before
OUT=${OUT:-out}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/reference:$PWD/dev:$PWD${PYTHONPATH:+:$PYTHONPATH}
# (a) the GPU tests; the specializations list predates the option (its entries compile fused): no warm-up
gpu_tests() {
  DSROPE_WARM=0 timeout 150 python3 -m nox -s gpu-tests -- -q -rfE --durations=10 \
    tests/test_vs_eager.py tests/test_conformance.py tests/test_rotation_ptx.py > "$OUT/fma-tests.log" 2>&1
  echo "gpu tests rc $?"; grep -E "elements that differ|passed|failed|error" "$OUT/fma-tests.log" | tail -4
}
# (b) the same bench twice, the earlier kernels first on the path, then this tree's (--no-fail: both tables);
# (c) side by side, then the csv and png files dropped (few files come back from a device call)
bench_before_after() {
  if [ ! -d "$BEFORE/src/dsrope" ]; then
    echo "no $BEFORE/src/dsrope: run 'bash tools/gpu_fma.sh prepare' in the checkout and carry it"; return 2
  fi
  cat "$BEFORE/REV"
  PYTHONPATH=$PWD/$BEFORE/src:$PYTHONPATH timeout 210 python3 -m bench.bench --impls triton --no-fail \
    --out "$OUT/bench-before" > "$OUT/bench-before.log" 2>&1; echo "bench before rc $?"
  timeout 210 python3 -m bench.bench --impls triton --no-fail --out "$OUT/bench-after" > "$OUT/bench-after.log" 2>&1
  echo "bench after rc $?"
  python3 -m tools.bench_compare "$OUT/bench-before" "$OUT/bench-after" | tee "$OUT/bench-compare.md" | tail -1
  rm -rf "$OUT/bench-before" "$OUT/bench-after"
}
case "${1:-}" in
  prepare)
    rev=${2:-$(git log --reverse --format=%H -S enable_fp_fusion -- src/dsrope/pair_rotation.py | head -1)^}
    rm -rf "$BEFORE" && mkdir -p "$BEFORE"
    git archive "$rev" src/dsrope | tar -x -C "$BEFORE"
    echo "$BEFORE/src/dsrope: the kernels of $(git rev-parse --short "$rev")" | tee "$BEFORE/REV" ;;
  tests) mkdir -p "$OUT" && gpu_tests ;;
  bench) mkdir -p "$OUT" && bench_before_after ;;
  run) mkdir -p "$OUT" && gpu_tests && bench_before_after ;;
  *) echo "usage: bash tools/gpu_fma.sh prepare [REV] | tests | bench | run"; exit 2 ;;
esac
