#!/usr/bin/env bash
# The baseline check (python -m dsrope_dev.bits) measured on a GPU: its time (Triton's cache cold, then warm),
# tile changes that move no bit passing, a kernel mutant that moves bits caught, and a tile that reorders the
# QNorm forward's row sum. Each step prints its exit status (and the one expected), its wall time and the
# check's verdict lines; the whole output of every step goes to $OUT/bits-demo.log (where $OUT is set).
#
#   bash dev/dsrope_dev/bits_demo.sh prepare [REF]   here, where the git history is: REF's src/dsrope (default
#                                                    HEAD) into .device/bits-baseline/ (git-ignored: carry it)
#   bash dev/dsrope_dev/bits_demo.sh device [STEP..] on the device, from the repository root (no git history
#                                                    needed); every step, or those named
#   bash dev/dsrope_dev/bits_demo.sh record [TEXT]   on the device: record its snapshot from this tree's kernels
#                                                    (--commit TEXT names the commit), copied into $OUT
#
# The edited trees are copies (/tmp/bits-demo-tree: src, reference, dev, golden), never this checkout. The
# test dependencies a device lacks (safetensors, ml_dtypes, mpmath, ...) come from the wheels in the ignored
# .whl/ folder when it is carried, installed without network into /tmp/site (as tools/gpu_run.sh does).
set -u
PY=${PYTHON:-python3}
ROOT=$(pwd)
BASE=.device/bits-baseline
TREE=/tmp/bits-demo-tree
LOGS=/tmp/bits-demo-logs
SITE=

wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && SITE=/tmp/site
  fi
}

prepare() {
  local ref=${1:-HEAD}
  rm -rf "$BASE" && mkdir -p "$BASE"
  git archive "$ref" src/dsrope | tar -x -C "$BASE"
  git rev-parse "$ref" > "$BASE/COMMIT"
  echo "$BASE/src/dsrope: the kernels of $(git rev-parse --short=12 "$ref") ($ref)"
}

# bits DIR ARGS...: the check's command run from the checkout (or copy) in DIR, with DIR's packages
bits() {
  local dir=$1; shift
  (cd "$dir" && PYTHONPATH="$dir/src:$dir/reference:$dir/dev${SITE:+:$SITE}" timeout 400 "$PY" -m dsrope_dev.bits "$@")
}

# step NAME EXPECTED DIR ARGS...: `bits DIR ARGS...`, logged, with what it gave
step() {
  local name=$1 want=$2; shift 2
  local t0 rc t1
  t0=$(date +%s%N)
  bits "$@" > "$LOGS/$name.log" 2>&1
  rc=$?
  t1=$(date +%s%N)
  echo "== $name: exit $rc (expected $want), $(( (t1 - t0) / 1000000 )) ms"
  grep -E "^kernel bits|changed:|first changed|^no change|cases changed|usage error|cannot check|did not run" \
    "$LOGS/$name.log" | cut -c1-400 | head -24
}

# fresh_tree: a copy of this tree to edit
fresh_tree() {
  rm -rf "$TREE" && mkdir -p "$TREE" && cp -r src reference dev golden "$TREE"/
}

# edit FILE OLD NEW: OLD must occur exactly once in FILE (under the copy)
edit() {
  "$PY" - "$TREE/$1" "$2" "$3" <<'EOF'
import pathlib, sys
path, old, new = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
text = path.read_text()
assert text.count(old) == 1, f"{path}: {old!r} occurs {text.count(old)} times"
path.write_text(text.replace(old, new))
EOF
}

# mutant NAME: a kernel mutant of the catalog, applied to the copy
mutant() {
  PYTHONPATH="$ROOT/src:$ROOT/reference:$ROOT/dev${SITE:+:$SITE}" "$PY" - "$TREE" "$1" <<'EOF'
import pathlib, sys
from dsrope_dev.mutation.runner import catalog, mutated_text
m = next(m for m in catalog() if m.name == sys.argv[2])
path = pathlib.Path(sys.argv[1]) / m.file
path.write_text(mutated_text(m, path.read_text()))
print(f"{m.name}: {m.what}")
EOF
}

device() {
  [ -d "$BASE/src/dsrope" ] || { echo "no $BASE/src/dsrope: run 'bash $0 prepare' where the history is and carry it"; exit 3; }
  mkdir -p "$LOGS"
  wheels
  echo "baseline: $BASE/src/dsrope, commit $(cat "$BASE/COMMIT" 2>/dev/null || echo unknown)"
  "$PY" -c "import torch, triton; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA: \
the interpreter', 'torch', torch.__version__, 'triton', triton.__version__)"
  local steps=${*:-status cold warm tile-rows tile-warps mutant tile-sum}
  for s in $steps; do
    case $s in
      status) step status 0 "$ROOT" --snapshot-status ;;
      # the tree against the prepared baseline: Triton's cache empty on a fresh machine, then warm
      cold) step cold 0 "$ROOT" --baseline-src "$ROOT/$BASE" ;;
      warm) step warm 0 "$ROOT" --baseline-src "$ROOT/$BASE" ;;
      # partial RoPE's tiles: other rows per program and warps (no reduction: the same bits at any tile)
      tile-rows)
        fresh_tree
        edit src/dsrope/rope.py "ROTATE_ELEMENTS = 1024" "ROTATE_ELEMENTS = 4096"
        edit src/dsrope/rope.py "SPLIT_ROWS, SPLIT_ELEMENTS, SPLIT_WARPS = 16384, 2048, 2" \
          "SPLIT_ROWS, SPLIT_ELEMENTS, SPLIT_WARPS = 16384, 512, 1"
        step tile-rows 0 "$TREE" --baseline-src "$ROOT/$BASE" ;;
      # the QNorm forward's whole rows on four warps, not two (each row's sum the same PTX as on one warp)
      tile-warps)
        fresh_tree
        edit src/dsrope/qnorm_rope.py "= ((1, 2, 2), (65536, 8, 8))" "= ((1, 4, 4), (65536, 8, 8))"
        step tile-warps 0 "$TREE" --baseline-src "$ROOT/$BASE" ;;
      # a kernel mutant that moves bits: the backward's normalized row rounded to x.dtype
      mutant)
        fresh_tree
        mutant qnorm.backward_xhat_rounded
        step mutant 1 "$TREE" --baseline-src "$ROOT/$BASE" ;;
      # the QNorm forward's rows per program on a channel-strided x (its row sum's order follows M): the
      # kind of intended change `--record` is for; 1 where it moves bits (then inside the model), else 0
      tile-sum)
        fresh_tree
        edit src/dsrope/qnorm_rope.py "FORWARD_ELEMENTS, CONTIGUOUS_ELEMENTS = 2048, 1024" \
          "FORWARD_ELEMENTS, CONTIGUOUS_ELEMENTS = 8192, 1024"
        step tile-sum "0 or 1" "$TREE" --baseline-src "$ROOT/$BASE" ;;
      *) echo "unknown step $s"; exit 2 ;;
    esac
  done
  [ -n "${OUT:-}" ] && for s in $steps; do echo "==== $s"; cat "$LOGS/$s.log"; done > "$OUT/bits-demo.log"
  return 0
}

record() {
  local mark rc
  wheels
  mark=$(mktemp)
  if [ -n "${1:-}" ]; then
    bits "$ROOT" --record --commit "$1"
  else
    bits "$ROOT" --record
  fi
  rc=$?
  [ -n "${OUT:-}" ] && find golden/snapshots docs/records -type f -newer "$mark" -exec cp {} "$OUT"/ \;
  rm -f "$mark"
  return $rc
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  device) shift; device "$@" ;;
  record) shift; record "$@" ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
