#!/usr/bin/env bash
# One device call: install the carried wheels (nox), print versions, run the GPU gate, memcheck and
# the benchmark; one log, $OUT/run.log, and phases.txt (at most 8 files come back from $OUT). Usage on the device: bash tools/gpu_run.sh [phase ...]
set -u
export PYTHONUNBUFFERED=1
# the checkout's packages (dsrope, dsrope_gate, dsrope_reference), without an install
export PYTHONPATH=$PWD/src:$PWD/reference${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  python3 -m pip list 2>/dev/null | grep -i -E '^(hypothesis|pytest|pytest-xdist|numpy|ml.dtypes|mpmath|safetensors|matplotlib|transformers) '
} 2>&1 | tee -a "$OUT/run.log"
# The kernel bits of this tree against the earlier kernels of sweep_baseline/old_src (tools/baseline.sh), each
# snapshot recorded on this device into a copy of golden/, then against the committed snapshot of this device
# if there is one (the H200's, on an H200); the report in $OUT/bits.log
bits_vs_baseline() {
  rm -rf /tmp/gA /tmp/gH && cp -r golden /tmp/gA && cp -r golden /tmp/gH
  PYTHONPATH=$PWD/sweep_baseline/old_src/src:$PYTHONPATH timeout 100 python3 -m tools.golden --update-snapshot --root /tmp/gA > "$OUT/bits.log" 2>&1
  timeout 100 python3 -m tools.golden --update-snapshot --root /tmp/gA >> "$OUT/bits.log" 2>&1; echo "bits-vs-3e8890d rc $?" >> "$OUT/bits.log"
  timeout 100 python3 -m tools.golden --update-snapshot --root /tmp/gH 2>&1 | head -3 >> "$OUT/bits.log"
}
# The bench's MISSED rows and its summary line from $OUT/bench.log; its csv and png files in $1 dropped
# (at most 8 files come back from $OUT)
bench_targets() {
  grep -E "MISSED|^targets" "$OUT/bench.log"; rm -f "$1"/*.csv "$1"/*.png
}
for phase in "$@"; do
  start=$(date +%s)
  case "$phase" in
    tests-core) timeout 330 python3 -m nox -s gpu-tests -- -q -rfE --durations=10 tests/test_rope.py tests/test_qnorm_rope.py tests/test_gpu.py tests/test_gpu_pinning.py ;;
    tests) timeout 560 python3 -m nox -s gpu-tests -- -q -rfE --durations=15 ;;
    tests-n2) timeout 560 python3 -m nox -s gpu-tests -- -n 2 -q -rfE ;;
    sweep) timeout 170 python3 -m tools.sweep --out "$OUT/sweep" --baseline sweep_baseline ;;
    # Nsight Compute on one launch each: the QNorm backward (token- and head-major input), the
    # forward on a head-major input, and the earlier backward kernel (sweep_baseline/) if present
    ncu)
      sections="--section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats"
      for spec in "qnorm_bwd token_major 2 2" "qnorm_bwd head_major 2 2" "qnorm_fwd head_major 4 1" "rope head_major 2 1"; do
        echo "== ncu $spec"; timeout 120 ncu --clock-control none $sections -k regex:"qnorm_rope|_rotate" --launch-skip 1 --launch-count 1 python3 -m tools.sweep --one $spec
      done
      if [ -d sweep_baseline ]; then
        echo "== ncu baseline qnorm_bwd token_major 8 1"
        timeout 120 ncu --clock-control none $sections -k regex:qnorm_rope --launch-skip 1 --launch-count 1 python3 -m tools.sweep --one qnorm_bwd token_major 8 1 --baseline sweep_baseline
      fi ;;
    mutants-gpu) timeout 500 python3 -m nox -s gpu-mutants; cp -r out/mutants "$OUT/" 2>/dev/null ;;
    snapshot) timeout 300 python3 -m tools.golden --update-snapshot && cp golden/snapshots/nvidia-h200-* "$OUT/" ;;
    verify) timeout 300 python3 -m tools.verify --out "$OUT/verify" && rm -f "$OUT/verify/report.json" ;;
    sanitize) timeout 200 python3 -m nox -s sanitize ;;
    bench-triton) timeout 200 python3 -m nox -s bench -- --impls triton --out "$OUT/bench-triton" ;;
    bench-quick) timeout 200 python3 -m nox -s bench -- --quick --out "$OUT/bench-quick" ;;
    bench) timeout "${BENCH_LIMIT:-360}" python3 -m nox -s bench -- --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
      bench_targets "$OUT/bench" ;;
    # issue 17: the custom-op tests alone, the decode rows alone, host time per layer of a call
    ops) timeout 300 python3 -m nox -s gpu-tests -- -q -rfEs --durations=10 tests/test_custom_ops.py ;;
    bench-decode) timeout 300 python3 -m nox -s bench -- --decode --out "$OUT/bench-decode" ;;
    overhead) timeout 120 python3 -m bench.overhead ;;
    # issues 25-27: the peers' pinned releases carried in .whl/peers (python -m dsrope_gate.presets fetch),
    # the conformance command on CUDA over every preset, and the in-place and peers' rows of the bench
    peers)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      export DSROPE_PEERS_CACHE=$PWD/.whl/peers
      timeout 300 python3 -m dsrope_gate.conformance --preset all --device cuda --examples 12 --json "$OUT/conformance.json" --out "$OUT/conformance" > "$OUT/conformance.log" 2>&1; echo "conformance rc $?"
      tail -5 "$OUT/conformance.log"
      timeout 280 python3 -m bench.bench --peers --out "$OUT/bench-peers"; echo "bench-peers rc $?" ;;
    # issue 34 item 4: forward+backward rows of ours, the eager chain and every preset with a backward, then
    # the decode rows of every peer (one call each per timed call; flash-attn one launch with seqlen_offsets)
    bench-peers)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      export DSROPE_PEERS_CACHE=$PWD/.whl/peers
      timeout 130 python3 -m bench.bench --backward --peers --out "$OUT/bench-fwd-bwd" > "$OUT/fwd_bwd.log" 2>&1
      echo "bench --backward rc $?"; grep -v "^op=" "$OUT/fwd_bwd.log" | tail -8; rm -f "$OUT/bench-fwd-bwd/fwd_bwd.csv"
      timeout 160 python3 -m bench.bench --decode --peers --out "$OUT/bench-decode-peers" > "$OUT/decode_peers.log" 2>&1
      echo "bench --decode --peers rc $?"; tail -4 "$OUT/decode_peers.log"; rm -f "$OUT/bench-decode-peers/inplace_decode.csv" ;;
    # issue 34: the parity matrix of every preset on CUDA (the peers carried in .whl/peers, as for `peers`)
    parity)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      export DSROPE_PEERS_CACHE=$PWD/.whl/peers
      timeout 500 python3 -m dsrope_gate.conformance --parity --preset all --device cuda --examples 12 \
        --json "$OUT/parity.json" --out "$OUT/parity" > "$OUT/parity.log" 2>&1; echo "parity rc $?"
      tail -5 "$OUT/parity.log" ;;
    # the rope tables: every table builder's verdicts and semantics on CUDA, FP32 matmuls then TF32 ones (the
    # pinned releases carried in .whl/peers: presets fetch and table_builders fetch)
    tables)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      export DSROPE_PEERS_CACHE=$PWD/.whl/peers
      timeout 240 python3 -m tools.table_verdicts --device cuda > "$OUT/tables.md" 2>&1; echo "tables rc $?"
      timeout 240 python3 -m tools.table_verdicts --device cuda --tf32 > "$OUT/tables-tf32.md" 2>&1
      echo "tables --tf32 rc $?"; tail -16 "$OUT/tables.md" "$OUT/tables-tf32.md"
      timeout 200 python3 -m nox -s gpu-tests -- -q -rfE tests/test_table_builders.py tests/test_tables.py 2>&1 | tail -6 ;;
    # issue 27: the in-place kernel's rows per program and warps (prefill and decode under graph replay; the
    # earlier kernel from sweep_baseline/ if present), then the in-place bench rows beside flash-attn's and sglang's
    inplace-sweep)
      timeout 240 python3 -m tools.sweep --kernels rope_inplace --decode --out "$OUT/sweep-inplace" \
        $( [ -d sweep_baseline ] && echo --baseline sweep_baseline ) ;;
    inplace-ceiling) timeout 200 python3 -m tools.inplace_ceiling ;;
    # issue 27's closing run: with the GPU otherwise idle, the in-place bench rows beside flash-attn's and
    # sglang's and Nsight Compute's DRAM counters of one launch per layout; then, in parallel, memcheck,
    # the in-place and >2**31 tests, the in-place GPU-only mutant
    inplace-final)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      DSROPE_PEERS_CACHE=$PWD/.whl/peers timeout 150 python3 -m bench.bench --inplace --peers flash-attn,sglang --out "$OUT/bench-inplace" > "$OUT/b.log" 2>&1
      echo "bench-inplace rc $?" >> "$OUT/b.log"
      metrics=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum
      timeout 90 ncu --clock-control none --metrics $metrics -k regex:_rotate_inplace python3 -m tools.inplace_ceiling --ncu > "$OUT/n.log" 2>&1
      echo "ncu rc $?" >> "$OUT/n.log"
      (timeout 240 python3 -m nox -s sanitize > "$OUT/s.log" 2>&1; echo "sanitize rc $?" >> "$OUT/s.log") &
      (timeout 240 python3 -m nox -s gpu-tests -- -q -rfE tests/test_rope_inplace.py tests/test_gpu.py > "$OUT/t.log" 2>&1
       echo "gpu-tests rc $?" >> "$OUT/t.log") &
      (timeout 240 python3 -m nox -s gpu-mutants -- --only rope.inplace --tests test_gpu.py > "$OUT/m.log" 2>&1
       echo "mutants-gpu rc $?" >> "$OUT/m.log") &
      wait
      for f in b n s t m; do echo "===== $f"; tail -40 "$OUT/$f.log"; done ;;
    inplace-bench)
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/peers/*.whl
      export DSROPE_PEERS_CACHE=$PWD/.whl/peers
      timeout 280 python3 -m bench.bench --inplace --peers flash-attn,sglang --out "$OUT/bench-inplace"; echo "bench-inplace rc $?" ;;
    # issue 36: the split partial RoPE kernel at decode. In parallel (nothing timed): the H200 snapshot
    # recorded into a copy of golden/ and its tensors byte-compared with the committed one (the bits must
    # not move), and the GPU tests of rope; then, the GPU otherwise idle, the decode bench rows with their
    # targets (--no-fail: a miss is reported, not fatal) and the decode sweep of the out-of-place kernel
    # (the earlier kernel from sweep_baseline/ if present). About 250 s.
    decode-dev)
      rm -rf /tmp/golden-copy && cp -r golden /tmp/golden-copy
      (timeout 150 python3 -m tools.golden --update-snapshot --root /tmp/golden-copy > "$OUT/g.log" 2>&1
       echo "snapshot rc $?" >> "$OUT/g.log"
       for f in golden/snapshots/nvidia-h200-*.safetensors; do
         [ -f "/tmp/golden-copy/snapshots/${f##*/}" ] || continue  # not an H200: the check below stands alone
         echo "$f:"; cmp "$f" "/tmp/golden-copy/snapshots/${f##*/}"; echo "snapshot-bytes rc $?"
       done >> "$OUT/g.log" 2>&1) &
      # on any GPU: the kernels of 3e8890d (sweep_baseline/old_src, the whole-row _rotate) recorded on this
      # device beside the split kernel's record, and the two byte-compared
      if [ -d sweep_baseline/old_src/src/dsrope ]; then
        rm -rf /tmp/golden-old && cp -r golden /tmp/golden-old
        (PYTHONPATH=$PWD/sweep_baseline/old_src/src:$PYTHONPATH timeout 150 python3 -m tools.golden --update-snapshot --root /tmp/golden-old > "$OUT/o.log" 2>&1
         echo "old-snapshot rc $?" >> "$OUT/o.log") &
      fi
      (DSROPE_WARM=0 timeout 150 python3 -m nox -s gpu-tests -- -q -rfE tests/test_rope.py tests/test_gpu.py -k "rope or decode" > "$OUT/t.log" 2>&1
       echo "gpu-tests rc $?" >> "$OUT/t.log") &
      wait
      if [ -f "$OUT/o.log" ]; then
        for f in /tmp/golden-old/snapshots/*.safetensors; do
          case "$f" in *interpreter*) continue ;; esac
          echo "$f vs split:"; cmp "$f" "/tmp/golden-copy/snapshots/${f##*/}"; echo "split-vs-old-bytes rc $?"
        done >> "$OUT/o.log" 2>&1
      fi
      timeout 100 python3 -m bench.bench --decode --impls triton --no-fail --out "$OUT/bench-decode" > "$OUT/b.log" 2>&1
      echo "bench-decode rc $?" >> "$OUT/b.log"
      timeout 240 python3 -m tools.sweep --kernels rope qnorm_fwd --decode --workers 14 --out "$OUT/sweep-rope" \
        $( [ -d sweep_baseline ] && echo --baseline sweep_baseline ) > "$OUT/w.log" 2>&1
      echo "sweep rc $?" >> "$OUT/w.log"
      failed=0  # the phase's status: the snapshot, its bytes or the tests failed (bench and sweep report)
      for f in g o t b w; do
        [ -f "$OUT/$f.log" ] || continue
        echo "===== $f"; cat "$OUT/$f.log"
        [ $f = g ] || [ $f = o ] || [ $f = t ] && grep -q -E '^[a-z-]+ rc [1-9]' "$OUT/$f.log" && failed=1
        rm "$OUT/$f.log"
      done
      [ "$failed" = 0 ] ;;
    # issue 36: which change moves the kernel bits. The snapshot of 3e8890d's kernels (sweep_baseline/old_src)
    # recorded into a copy of golden/, then, each into a copy of that, the snapshots of: B = 3e8890d with the
    # split _rotate (sweep_baseline/bisect/B), C = this tree without the QNorm forward's spread_rows
    # (sweep_baseline/bisect/C), D = this tree; each report lists what changed against 3e8890d's bits.
    # B and C were copies of src/ edited by hand for the 2026-12-05 bisect (docs/decode.md), not kept.
    bits-bisect)
      rm -rf /tmp/gA && cp -r golden /tmp/gA
      PYTHONPATH=$PWD/sweep_baseline/old_src/src:$PYTHONPATH timeout 150 python3 -m tools.golden --update-snapshot --root /tmp/gA 2>&1 | tail -3
      for t in B C D; do
        rm -rf /tmp/g$t && cp -r /tmp/gA /tmp/g$t
        src=$PWD/sweep_baseline/bisect/$t/src; [ $t = D ] && src=$PWD/src
        (PYTHONPATH=$src:$PYTHONPATH timeout 150 python3 -m tools.golden --update-snapshot --root /tmp/g$t > "$OUT/bisect-$t.log" 2>&1
         echo "bisect $t rc $?" >> "$OUT/bisect-$t.log") &
      done
      wait
      for t in B C D; do echo "===== $t"; head -c 6000 "$OUT/bisect-$t.log"; echo; done
      DSROPE_WARM=0 timeout 200 python3 -m nox -s gpu-tests -- -q -rfE tests/test_gpu.py tests/test_violations.py \
        -k "decode or underflow" 2>&1 | tail -12 ;;
    # issue 36, one call: the kernel bits of this tree against 3e8890d's on the same device (and against the
    # committed H200 snapshot on an H200), the whole gpu-tests, the QNorm forward's sweep (prefill and
    # decode, the kernel of 3e8890d beside it), then the bench's rows of ours (--impls triton) with targets.
    final36)
      bits_vs_baseline; cat "$OUT/bits.log"
      timeout 170 python3 -m nox -s gpu-tests -- -q -rfE 2>&1 | tail -8
      PYTHONPATH=$PWD/src:$PWD/reference timeout 15 python3 -m dsrope_gate.compile_cache merge out/specializations "$OUT/triton_specializations.jsonl.gz" 2>&1 | tail -1
      timeout 130 python3 -m tools.sweep --kernels qnorm_fwd --decode --workers 14 --out /tmp/sweep --baseline sweep_baseline 2>&1 \
        | grep -E "best M=|^decode qnorm|^copy" > "$OUT/sweep.log"; cat "$OUT/sweep.log"
      timeout 200 python3 -m bench.bench --impls triton --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
      tail -30 "$OUT/bench.log"; rm -f "$OUT"/bench/*.csv "$OUT"/bench/*.png ;;
    # issue 36, the split partial RoPE at decode (rope.rotate_config): the kernel bits of this tree against
    # 3e8890d's on the same device (and the committed H200 snapshot on an H200) beside the GPU-only mutant of
    # the split kernel (its >2**31 test), then the whole gpu-tests, the decode sweep of both kernels (the
    # split kernel's tiles, the whole-row kernel, 3e8890d's), then the bench's rows of ours with targets.
    split36)
      bits_vs_baseline &
      (timeout 200 python3 -m nox -s gpu-mutants -- --only rope.split_int32_offsets --tests test_gpu.py > "$OUT/m.log" 2>&1
       echo "mutants-gpu rc $?" >> "$OUT/m.log") &
      wait
      cat "$OUT/bits.log"; tail -6 "$OUT/m.log"; rm -f "$OUT/m.log"
      timeout 170 python3 -m nox -s gpu-tests -- -q -rfE 2>&1 | tail -8
      PYTHONPATH=$PWD/src:$PWD/reference timeout 15 python3 -m dsrope_gate.compile_cache merge out/specializations "$OUT/triton_specializations.jsonl.gz" 2>&1 | tail -1
      timeout 110 python3 -m tools.sweep --kernels rope qnorm_fwd --decode-only --baseline sweep_baseline > "$OUT/sweep.log" 2>&1
      echo "sweep rc $?"; grep -E "launcher|^copy" "$OUT/sweep.log" ;;
    # the QNorm forward's prefill tiles (2026-12-05 13:00 also with a walk of GROUP heads of M // GROUP tokens a
    # program, since reverted: no gain), 3e8890d's beside
    qnorm-walk)
      timeout 150 python3 -m tools.sweep --kernels qnorm_fwd --workers 14 --out "$OUT/sweep-walk" --baseline sweep_baseline > "$OUT/walk.log" 2>&1
      echo "walk sweep rc $?"; grep -E "^copy|best M=" "$OUT/walk.log" ;;
    # issue 36's closing check beside the bench: the bits (as bits-bench), then the whole gpu-tests alone
    # (its wall time is the gate's), then the compile list of what it compiled
    close36)
      bits_vs_baseline
      cat "$OUT/bits.log"
      t0=$(date +%s); timeout 200 python3 -m nox -s gpu-tests -- -q -rfE > "$OUT/t.log" 2>&1
      echo "gpu-tests rc $? wall $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|ERROR|compile_cache" "$OUT/t.log" | tail -12
      PYTHONPATH=$PWD/src:$PWD/reference timeout 15 python3 -m dsrope_gate.compile_cache merge out/specializations "$OUT/triton_specializations.jsonl.gz" 2>&1 | tail -1 ;;
    # the split partial RoPE with every load before its first store: its decode sweep beside the kernel of
    # sweep_baseline/old_rope.py (the split kernel stored first, c2e2309), the decode bench, the bits
    order36)
      timeout 170 python3 -m tools.sweep --kernels rope --decode-only --baseline sweep_baseline > "$OUT/sweep.log" 2>&1
      echo "sweep rc $?"; grep -E "launcher|split M=4 warps=2 " "$OUT/sweep.log"
      timeout 150 python3 -m bench.bench --decode --impls triton --out "$OUT/bench-decode" > "$OUT/bench.log" 2>&1
      echo "bench rc $?"; bench_targets "$OUT/bench-decode"
      bits_vs_baseline
      cat "$OUT/bits.log"
      timeout 120 python3 -m nox -s gpu-tests -- -q -rfE tests/test_gpu.py tests/test_rope.py 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -8 ;;
    # the QNorm forward with whole rows on several warps (CHUNK): the bits of this tree against 3e8890d's, the
    # GPU tests that hold the tiles' bits, the decode bench, then the QNorm forward's sweep (prefill and decode)
    warps36)
      bits_vs_baseline
      cat "$OUT/bits.log"
      timeout 150 python3 -m nox -s gpu-tests -- -q -rfE tests/test_gpu.py tests/test_qnorm_rope.py 2>&1 | grep -E "passed|failed|FAILED|ERROR" | tail -8
      timeout 120 python3 -m bench.bench --decode --impls triton --out "$OUT/bench-decode" > "$OUT/bench.log" 2>&1
      echo "bench rc $?"; bench_targets "$OUT/bench-decode"; grep -E "^\| *qnorm" "$OUT/bench-decode"/*.md | head -12
      timeout 250 python3 -m tools.sweep --kernels qnorm_fwd --decode --workers 14 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
      echo "sweep rc $?"; grep -E "^copy|launcher|best M=" "$OUT/sweep.log"; rm -f "$OUT/sweep/sweep.csv" ;;
    # the closing run of the rows-on-warps tiles: close36 (bits, gpu-tests alone, compile list), then the
    # decode bench of ours (the full bench: add the phase bench)
    warps-close)
      bash "$0" close36 > /dev/null  # close36 tees into run.log itself
      timeout 120 python3 -m bench.bench --decode --impls triton --out "$OUT/bench-decode" > "$OUT/bench-decode.log" 2>&1
      echo "decode bench rc $?"; grep -E "MISSED|^targets" "$OUT/bench-decode.log"; rm -f "$OUT"/bench-decode/*.csv
      grep -E "^\| *qnorm" "$OUT/bench-decode"/decode.md ;;
    # issue 36's closing run on one call: close36, then the bench's rows of ours (prefill and decode) with targets;
    # t.log dropped (its summary is in run.log) so that the bench's files come back (at most 8 files)
    close-bench)
      bash "$0" close36 > /dev/null; rm -f "$OUT/t.log"  # close36 tees into run.log itself
      timeout "${BENCH_LIMIT:-230}" python3 -m bench.bench --impls triton --out "$OUT/bench" > "$OUT/bench.log" 2>&1
      echo "bench rc $?"; bench_targets "$OUT/bench"; grep -E "worst fraction" "$OUT/bench.log" ;;
    # issue 36: the bench's forward+backward rows at 1 x 64 x 4096 against the kernels' sum and graph replay
    fwd-bwd-probe) timeout 120 python3 -m tools.fwd_bwd_probe ;;
    # issue 36: the in-place kernel's decode tiles (M, GROUP, warps; three interleaved rounds) beside the
    # launcher's, the whole table in $OUT/inplace-decode.log, the four fastest and the launcher in run.log
    inplace-decode)
      timeout 280 python3 -m tools.sweep --kernels rope_inplace --decode --decode-only > "$OUT/inplace-decode.log" 2>&1
      echo "sweep rc $?"; grep -E "^decode B=[0-9]+ H=[0-9]+ (M=|launcher|old)" "$OUT/inplace-decode.log" | awk '/launcher|old/ || ++n[$2 $3] <= 4' ;;
    # issue 36, the in-place decode tile on a short budget: the bits (as bits-bench) beside the in-place and
    # GPU-only tests, then the decode bench of ours with its targets, then the whole bench of ours in what
    # is left (BENCH_LIMIT seconds)
    inplace-close)
      (timeout 150 python3 -m nox -s gpu-tests -- -q -rfE tests/test_rope_inplace.py tests/test_gpu.py > "$OUT/t.log" 2>&1
       echo "gpu-tests rc $?" >> "$OUT/t.log") &
      bits_vs_baseline
      wait; cat "$OUT/bits.log"; grep -E "passed|failed|FAILED|ERROR|rc " "$OUT/t.log" | tail -8; rm -f "$OUT/t.log"
      timeout 120 python3 -m bench.bench --decode --impls triton --no-fail --out "$OUT/bench-decode" > "$OUT/bench-decode.log" 2>&1
      echo "decode bench rc $?"; grep -E "MISSED|^targets" "$OUT/bench-decode.log"
      grep -E "^\| *partial_rope" "$OUT/bench-decode/decode.md"; rm -rf "$OUT/bench-decode" "$OUT/bench-decode.log"  # at most 8 files
      if [ "${BENCH_LIMIT:-200}" -gt 0 ]; then  # BENCH_LIMIT=0: no whole bench
        timeout "${BENCH_LIMIT:-200}" python3 -m bench.bench --impls triton --out "$OUT/bench" > "$OUT/bench.log" 2>&1
        echo "bench rc $?"; bench_targets "$OUT/bench"; grep -E "worst fraction" "$OUT/bench.log"
      fi ;;
    # issue 36: the prefill forward's bound per layout (a copy in the forward's tiling, tools/decode_ceiling.py)
    prefill-ceiling) timeout 150 python3 -m tools.decode_ceiling --prefill --out "$OUT/prefill" 2>&1 | tail -8; rm -rf "$OUT/prefill" ;;  # the table is in the log
    bits-tests) timeout 120 python3 -m nox -s gpu-tests -- -q -rfE tests/test_gpu.py -k keep_the_bits 2>&1 | tail -4 ;;
    # issue 36's closing run: the kernel bits against 3e8890d's on the same device (and the committed H200
    # snapshot on an H200), then the bench (IMPLS: triton by default; BENCH_LIMIT seconds) with its targets.
    bits-bench)
      # the whole gpu-tests beside the bits (neither is timed); its summary line below
      (timeout 200 python3 -m nox -s gpu-tests -- -q -rfE > "$OUT/t.log" 2>&1; echo "gpu-tests rc $?" >> "$OUT/t.log") &
      bits_vs_baseline
      wait; cat "$OUT/bits.log"; grep -E "passed|failed|FAILED|ERROR|rc " "$OUT/t.log" | tail -12; rm -f "$OUT/t.log"
      timeout "${BENCH_LIMIT:-200}" python3 -m bench.bench --impls "${IMPLS:-triton}" --out "$OUT/bench" > "$OUT/bench.log" 2>&1; echo "bench rc $?"
      bench_targets "$OUT/bench" ;;
    # issue 24: what a new eps costs (the QNorm forward's eps is a constexpr)
    eps) timeout 120 python3 -m bench.eps_compile ;;
    # The correctness phases. The H200 kernel snapshot is recorded first (a kernel change re-records
    # it; `git diff golden/snapshots` then shows what changed); then the suite alone, so its wall
    # time is the gate's time-to-verdict (with the per-test profile of dsrope_gate.profile); then
    # memcheck, verify and the GPU-only mutants in parallel (none of them times anything).
    gate)
      timeout 150 python3 -m tools.golden --update-snapshot > "$OUT/g.log" 2>&1; echo "snapshot rc $?" >> "$OUT/g.log"
      cp golden/snapshots/nvidia-h200-* "$OUT/" 2>/dev/null
      rm -rf out/gate-profile
      t0=$(date +%s)
      timeout 400 python3 -m nox -s gpu-tests -- -p dsrope_gate.profile -q -rfEs --durations=15 > "$OUT/t.log" 2>&1
      echo "gpu-tests rc $? wall $(( $(date +%s) - t0 )) s" >> "$OUT/t.log"
      python3 -m dsrope_gate.profile out/gate-profile > "$OUT/gate-profile.md" 2>&1
      (timeout 240 python3 -m nox -s sanitize > "$OUT/s.log" 2>&1; echo "sanitize rc $?" >> "$OUT/s.log") &
      (timeout 300 python3 -m tools.verify --out "$OUT/verify" > "$OUT/v.log" 2>&1; echo "verify rc $?" >> "$OUT/v.log"
       rm -f "$OUT/verify/report.json" "$OUT/verify/errors.png") &
      # the GPU-only mutants (32-bit offsets) against the module of the >2**31-element tests that kill them
      (timeout 300 python3 -m nox -s gpu-mutants -- --tests test_gpu.py > "$OUT/m.log" 2>&1; echo "mutants-gpu rc $?" >> "$OUT/m.log") &
      wait
      failed=0  # the phase's status: nonzero when any part's rc line says so
      for f in g t s v m; do
        [ -f "$OUT/$f.log" ] || continue
        echo "===== $f"; cat "$OUT/$f.log"
        grep -q -E '^[a-z-]+ rc [1-9]' "$OUT/$f.log" && failed=1
        rm "$OUT/$f.log"
      done
      [ "$failed" = 0 ] ;;
    # issue 33: gpu-tests twice on one host, each with a fresh Triton cache: without the warm-up (recording
    # what the tests compile), then warmed from that record (dsrope_gate.compile_cache); the list comes back
    cache-trial)
      for run in cold warm; do
        rm -rf out/gate-profile; t0=$(date +%s)
        if [ $run = cold ]; then warm=0; else warm=1; python3 -m dsrope_gate.compile_cache merge out/specializations tests/triton_specializations.jsonl.gz; cp tests/triton_specializations.jsonl.gz "$OUT/"; fi
        DSROPE_WARM=$warm TRITON_CACHE_DIR=/tmp/triton-$run timeout 400 python3 -m nox -s gpu-tests -- -p dsrope_gate.profile -q -rfEs --durations=10 > "$OUT/$run.log" 2>&1
        echo "gpu-tests ($run) rc $? wall $(( $(date +%s) - t0 )) s" | tee -a "$OUT/$run.log"
        python3 -m dsrope_gate.profile out/gate-profile | head -30 >> "$OUT/$run.log" 2>&1
        grep -E "compile_cache|passed|failed" "$OUT/$run.log" | tail -4
      done ;;
    # Nsight Compute on one head-major QNorm backward of torch.compile's chain and one of ours
    # (tools/profile_backward.py): the bytes each really moves and its DRAM throughput
    ncu-bwd)
      metrics=dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
      timeout 150 ncu --clock-control none --profile-from-start off --metrics $metrics python3 -m tools.profile_backward ;;
    *) echo "unknown phase $phase" ;;
  esac 2>&1 | tee -a "$OUT/run.log"
  echo "phase $phase: rc ${PIPESTATUS[0]}, $(( $(date +%s) - start )) s" | tee -a "$OUT/phases.txt"
done
