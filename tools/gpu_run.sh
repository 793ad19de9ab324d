#!/usr/bin/env bash
# The project's GPU steps for a CUDA host without network, one device call at a time. Run on the device, from
# the repository root:
#
#   bash tools/gpu_run.sh PHASE [PHASE ...]         e.g. bash tools/gpu_run.sh gate bench
#
# Phases (each prints into $OUT/run.log, and its status and wall time into $OUT/phases.txt):
#   gate    the regression gate: gpu-tests alone (its wall time is the gate's; the per-test profile in
#           gate-profile.md; what it compiled as triton_specializations.jsonl.gz, to refresh tests/'s list),
#           then in parallel memcheck (nox -s sanitize), the accuracy report (verify/report.md) and the
#           GPU-only mutants against tests/test_gpu.py
#   bench   the benchmark of ours against eager and torch.compile with its targets (bench/*.md);
#           BENCH_ARGS adds options (e.g. "--impls triton"), BENCH_LIMIT the seconds (default 360)
#   parity  the parity matrix of every preset on CUDA (the conformance command's --parity --preset all)
#   bits    this tree's kernel bits against a baseline's on this device: python -m dsrope_dev.bits
#           --baseline "$REF" [--baseline-src "$BASELINE_SRC"]; REF (a commit or ref) is required, and on a
#           host without the git history BASELINE_SRC names a folder carried with the tree that holds REF's
#           tree (e.g. git worktree add baseline REF, before the call)
#   sweep   the kernels' tiles (python -m tools.sweep --decode; SWEEP_ARGS replaces --decode, e.g.
#           SWEEP_ARGS="--kernels qnorm_fwd --decode-only" for the QNorm forward's decode tiles alone)
#   fma     the unfused rotation's GPU tests and the bench before and after it (tools/gpu_fma.sh)
#   releases  the vllm preset judged on CUDA (the conformance command), then transformers 5.17.0 and 5.23.0
#           each in its own process on the same inputs, their bits compared (python -m tools.release_bits)
#   tables  every table builder's verdicts and semantics on CUDA (python -m tools.table_verdicts; tables.md with
#           FP32 matmuls, tables-tf32.md with TF32 ones), then the tables' GPU tests; the peers' pinned
#           releases as for `parity`, with megatron-core's embedding modules in .whl/peers
#           (`python -m dsrope_gate.table_builders fetch` writes them)
#   pipelines  the pipelines' matrix on CUDA (python -m dsrope_gate.conformance --pipeline ...): the trainers
#           (transformers 5.17.0 and 5.23.0, megatron-core, nemo-automodel) against the engines (vLLM, sglang), with
#           dsrope and veomni, from the same positions; pipelines.md/json with FP32 matmuls, pipelines-tf32.md/json
#           with cuBLAS in TF32 (TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, as trainers often set it); the peers as for
#           `tables`
#
# Packages: the device's own torch and triton; the wheels in the ignored .whl/ folder (carried with the tree:
# the test dependencies the host lacks, such as nox, hypothesis, pytest-xdist, ml_dtypes, mpmath, safetensors)
# are installed without network into /tmp/site, and for `parity` and `releases` the peers' pinned releases in .whl/peers
# (`python -m dsrope_gate.presets fetch` writes them). The checkout's packages (src/, reference/, dev/) are
# used in place, without an install.
#
# At most 8 files come back from $OUT (default out/): phases drop their CSV and PNG files and fold their logs
# into run.log; run fewer phases in one call when their reports are wanted back.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src:$PWD/reference:$PWD/dev${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  python3 -m pip list 2>/dev/null | grep -i -E '^(hypothesis|pytest|pytest-xdist|numpy|ml.dtypes|mpmath|safetensors|matplotlib|transformers) '
} 2>&1 | tee -a "$OUT/run.log"

# The peers' pinned releases carried in .whl/peers, for the presets
install_peers() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
  export DSROPE_PEERS_CACHE=$PWD/.whl/peers
}

# Each named log printed under a header and removed; fails when any of them has a line "<name> rc <nonzero>"
fold_logs() {
  local failed=0
  for f in "$@"; do
    [ -f "$f" ] || continue
    echo "===== ${f##*/}"; cat "$f"
    grep -q -E '^[a-z-]+ rc [1-9]' "$f" && failed=1
    rm "$f"
  done
  [ "$failed" = 0 ]
}

for phase in "$@"; do
  start=$(date +%s)
  case "$phase" in
    gate)
      rm -rf out/gate-profile
      t0=$(date +%s)
      timeout 400 python3 -m nox -s gpu-tests -- -p dsrope_dev.profile -q -rfEs --durations=15 > "$OUT/t.log" 2>&1
      echo "gpu-tests rc $? wall $(( $(date +%s) - t0 )) s" >> "$OUT/t.log"
      python3 -m dsrope_dev.profile out/gate-profile > "$OUT/gate-profile.md" 2>&1
      python3 -m dsrope_dev.compile_cache merge out/specializations "$OUT/triton_specializations.jsonl.gz" >> "$OUT/t.log" 2>&1
      (timeout 240 python3 -m nox -s sanitize > "$OUT/s.log" 2>&1; echo "sanitize rc $?" >> "$OUT/s.log") &
      (timeout 300 python3 -m tools.verify --out "$OUT/verify" > "$OUT/v.log" 2>&1; echo "verify rc $?" >> "$OUT/v.log"
       rm -f "$OUT/verify/report.json" "$OUT/verify/errors.png") &
      # the GPU-only mutants (32-bit offsets) against the module of the >2**31-element tests that kill them
      (timeout 300 python3 -m nox -s gpu-mutants -- --tests test_gpu.py > "$OUT/m.log" 2>&1; echo "gpu-mutants rc $?" >> "$OUT/m.log") &
      wait
      fold_logs "$OUT/t.log" "$OUT/s.log" "$OUT/v.log" "$OUT/m.log" ;;
    bench)
      # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
      (timeout "${BENCH_LIMIT:-360}" python3 -m nox -s bench -- --out "$OUT/bench" ${BENCH_ARGS:-} > "$OUT/b.log" 2>&1
       echo "bench rc $?" >> "$OUT/b.log")
      rm -f "$OUT"/bench/*.csv "$OUT"/bench/*.png  # the tables are in its markdown files
      grep -E "MISSED|^targets|worst fraction|bench rc" "$OUT/b.log" > "$OUT/b.tail"; rm "$OUT/b.log"
      fold_logs "$OUT/b.tail" ;;
    parity)
      install_peers
      (timeout 500 python3 -m dsrope_gate.conformance --parity --preset all --device cuda --examples 12 \
        --json "$OUT/parity.json" --out "$OUT/parity" > "$OUT/p.log" 2>&1; echo "parity rc $?" >> "$OUT/p.log")
      tail -6 "$OUT/p.log" > "$OUT/p.tail"; rm "$OUT/p.log"; fold_logs "$OUT/p.tail" ;;
    bits)
      if [ -z "${REF:-}" ]; then
        echo "bits needs the baseline: REF=<commit or ref> [BASELINE_SRC=<folder>] bash tools/gpu_run.sh bits"; false
      else
        timeout 400 python3 -m dsrope_dev.bits --baseline "$REF" ${BASELINE_SRC:+--baseline-src "$BASELINE_SRC"}
      fi ;;
    sweep)
      # shellcheck disable=SC2086  # SWEEP_ARGS is a list of options
      (timeout "${SWEEP_LIMIT:-400}" python3 -m tools.sweep --out "$OUT/sweep" ${SWEEP_ARGS:---decode} > "$OUT/w.log" 2>&1
       echo "sweep rc $?" >> "$OUT/w.log")
      grep -E "^copy|^decode|best M=|launcher|sweep rc" "$OUT/w.log" > "$OUT/w.tail"; rm "$OUT/w.log"; fold_logs "$OUT/w.tail" ;;
    # the unfused rotation's GPU tests and the bench before and after it (run `bash tools/gpu_fma.sh prepare`
    # in the checkout first and carry .device/before)
    fma) OUT="$OUT" bash tools/gpu_fma.sh run ;;
    releases)
      install_peers
      (timeout 240 python3 -m dsrope_gate.conformance --preset vllm --device cuda --examples 12 \
        --json "$OUT/vllm.json" --out "$OUT/vllm" > "$OUT/c.log" 2>&1
       rc=$?; [ $rc -le 1 ] && echo "conformance exit $rc (1: a verdict other than conforms)" >> "$OUT/c.log" \
         || echo "conformance rc $rc" >> "$OUT/c.log")
      tail -8 "$OUT/c.log" > "$OUT/c.tail"; rm "$OUT/c.log"
      (timeout 240 python3 -m tools.release_bits transformers@5.17.0 transformers@5.23.0 --device cuda \
        --json "$OUT/release_bits.json" > "$OUT/r.log" 2>&1; echo "release-bits rc $?" >> "$OUT/r.log")
      fold_logs "$OUT/c.tail" "$OUT/r.log" ;;
    tables)
      install_peers
      (timeout 240 python3 -m tools.table_verdicts --device cuda > "$OUT/tables.md" 2>&1; echo "tables rc $?" >> "$OUT/tables.md")
      (timeout 240 python3 -m tools.table_verdicts --device cuda --tf32 > "$OUT/tables-tf32.md" 2>&1
       echo "tables-tf32 rc $?" >> "$OUT/tables-tf32.md")
      tail -16 "$OUT/tables.md" "$OUT/tables-tf32.md"
      (timeout 300 python3 -m nox -s gpu-tests -- -q -rfE tests/test_table_builders.py tests/test_tables.py > "$OUT/tt.log" 2>&1
       echo "table-tests rc $?" >> "$OUT/tt.log")
      tail -8 "$OUT/tt.log" > "$OUT/tt.tail"; rm "$OUT/tt.log"; fold_logs "$OUT/tt.tail" ;;
    pipelines)
      install_peers
      names=""
      for p in transformers@5.17.0 transformers@5.23.0 megatron-core nemo-automodel vllm sglang dsrope veomni; do
        names="$names --pipeline $p"
      done
      for mode in fp32 tf32; do
        suffix=$([ "$mode" = tf32 ] && echo "-tf32")
        # shellcheck disable=SC2086  # names is a list of options
        (env $([ "$mode" = tf32 ] && echo TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1) timeout 280 \
           python3 -m dsrope_gate.conformance $names --device cuda --out "$OUT/pl$suffix" \
           --json "$OUT/pipelines$suffix.json" > "$OUT/pl$suffix.log" 2>&1
         rc=$?; [ $rc -le 1 ] && echo "pipelines$suffix exit $rc (1: a pipeline did not run every case)" >> "$OUT/pl$suffix.log" \
           || echo "pipelines$suffix rc $rc" >> "$OUT/pl$suffix.log")
        mv "$OUT/pl$suffix/pipelines.md" "$OUT/pipelines$suffix.md" 2>/dev/null; rm -rf "$OUT/pl$suffix"
        grep -E "^\[|exit|rc" "$OUT/pl$suffix.log" > "$OUT/pl$suffix.tail"; rm "$OUT/pl$suffix.log"
      done
      fold_logs "$OUT/pl.tail" "$OUT/pl-tf32.tail" ;;
    *) echo "unknown phase $phase (gate, bench, parity, bits, sweep, fma, releases, tables, pipelines)"; false ;;
  esac 2>&1 | tee -a "$OUT/run.log"
  echo "phase $phase: rc ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s" | tee -a "$OUT/phases.txt"
done
