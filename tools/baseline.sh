#!/usr/bin/env bash
# The earlier kernels that tools/sweep.py --baseline and tools/gpu_run.sh's decode-dev, bits-bisect and
# final36 phases compare against, in sweep_baseline/ (untracked: it travels to the device with the tree).
# Run here, in the checkout (it needs git): bash tools/baseline.sh [REV]   (default 3e8890d)
set -eu
rev=${1:-3e8890d}
rm -rf sweep_baseline/old_src sweep_baseline/old_rope.py sweep_baseline/old_qnorm_rope.py
mkdir -p sweep_baseline/old_src
git show "$rev:src/dsrope/rope.py" > sweep_baseline/old_rope.py
git show "$rev:src/dsrope/qnorm_rope.py" > sweep_baseline/old_qnorm_rope.py
git archive "$rev" src/dsrope | tar -x -C sweep_baseline/old_src
echo "sweep_baseline/: the kernels of $(git rev-parse --short "$rev")"
