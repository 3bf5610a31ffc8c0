#!/usr/bin/env bash
# The papers' CIFAR-10 tables on one GPU machine without network, within about 10 minutes:
# gmm_table1_cifar10 (ViT and GMM-ViT at depths 9 and 15, one seed each), then
# structinit_table2_cifar10 (trunc-normal, mimetic, impulse-3, one seed each), each at the
# largest fraction of the paper's protocol that its budget fits (--fraction=fit, estimated from
# the accelerator kit's H200 figures so that no GPU time goes to probing). Every run stops cleanly (Ctrl-C: a checkpoint,
# then the report) when its budget is spent, and the workdirs come back packed to continue.
#
# Needs, in the checkout on that machine: gpu_wheels/ (python benchmarks/gpu_wheels.py on a
# machine with network; README, "Benchmark kit for a GPU machine without network") and CIFAR-10
# as image folders (ROOT/{train,test}/<class>/*, docs/data_preparation.md): $CIFAR10_ROOT if
# set, else the tarball $CIFAR10_TARBALL (default data/cifar10-jpeg.tar.gz, git-ignored: carry
# it) unpacked to /tmp/cifar (benchmarks/gpu_machine.sh). The plans take the lossless PNG folder
# that `python -m locvit.data.prepare cifar10 --out=DIR` writes; given a JPEG folder (that
# tarball) the script passes --allow_lossy_data, and each report's title says the data was
# lossy. Runs evaluate as the official code did (every epoch, or every 3 passes for GMM), one
# seed per row here (SEEDS; the plans' own default is 3, trained side by side). Run from the
# checkout's root:
#
#   bash benchmarks/paper_tables_gpu.sh                # results under $OUT (default /tmp/out)
#
# Budgets (minutes, compilation included): GMM_MINUTES (default 5) and STRUCTINIT_MINUTES
# (default 2.5), each plan's time on this machine. A new plan takes the largest fraction of the
# paper's protocol that its budget fits; FRACTION=1 PLAN_MINUTES=M plans the whole protocol
# (refused unless its estimate fits M minutes) and trains what this machine's budget allows, to
# be continued on the next (a saved plan keeps its fraction). With setup the script takes about
# 8.5 minutes, at most 10 (a plan still running 20 s after its budget gets Ctrl-C, and is killed
# 60 s later if the step it saves is still compiling).
# A run continues across machines: each plan's workdir comes back packed for it (python -m
# locvit.reproduce PLAN --pack: each run's newest checkpoint, no best/) as parts PLAN.tgz.aa, ...
# under $OUT; put them in paper_tables_carry/ of the checkout (git-ignored: carry it) and the next
# run of this script unpacks them and continues each plan where it stopped (docs/results.md,
# "Paper protocols on one GPU"). A copy of the checkout without its git metadata names its commit
# in LOCVIT_COMMIT (each run records the commit that trained its steps: DIR/commits.json).
set -euo pipefail

OUT=${OUT:-/tmp/out}
GMM_MINUTES=${GMM_MINUTES:-5}
STRUCTINIT_MINUTES=${STRUCTINIT_MINUTES:-2.5}
WORK=/tmp/paper_tables
mkdir -p "$OUT" "$WORK"
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache

source benchmarks/gpu_machine.sh
install_wheels gpu_wheels
use_cifar10
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/device.txt"
LOSSY_FLAG=""  # the plans refuse a JPEG folder unless told so
if find "$CIFAR10_ROOT/train" -iname '*.jp*g' -print -quit | grep -q .; then
  LOSSY_FLAG=--allow_lossy_data
  echo "CIFAR-10 in $CIFAR10_ROOT is a JPEG copy: $LOSSY_FLAG" | tee -a "$OUT/device.txt"
fi
for parts in paper_tables_carry/*.tgz.aa; do  # an earlier machine's workdirs: continue them
  [ -e "$parts" ] || continue
  cat "${parts%.aa}".* | tar -xz -C "$WORK"
  echo "continuing $(basename "${parts%.tgz.aa}") from $parts" | tee -a "$OUT/device.txt"
done

# One plan within its budget; a run still going when the budget (plus 20 s of grace for the last
# evaluation and save) is spent gets Ctrl-C, saves its step and leaves the plan resumable.
run_plan() {  # a plan given 0 minutes is skipped
  local plan=$1 minutes=$2
  local seconds
  if python3 -c "import sys; sys.exit(float($minutes) > 0)"; then return; fi
  seconds=$(python3 -c "print(int($minutes * 60 + 20))")
  timeout --signal=INT --kill-after=60 "$seconds" \
    python3 -m locvit.reproduce "$plan" --workdir="$WORK/$plan" --seeds="${SEEDS:-1}" \
      --minutes="${PLAN_MINUTES:-$minutes}" --fraction="${FRACTION:-fit}" --estimate=kit \
      $LOSSY_FLAG || true
  python3 -m locvit.reproduce "$plan" --workdir="$WORK/$plan" --report || true
}

{
  run_plan gmm_table1_cifar10 "$GMM_MINUTES"
  run_plan structinit_table2_cifar10 "$STRUCTINIT_MINUTES"
} 2>&1 | tee "$OUT/log.txt"

for plan in gmm_table1_cifar10 structinit_table2_cifar10; do
  cp "$WORK/$plan/results.md" "$OUT/$plan.md" 2>/dev/null || true
done
# Each plan's workdir packed to continue elsewhere (each run's newest checkpoint, no best/), in
# parts the device tool brings back (at most 8 files of 16 MiB, 64 MiB in all).
for plan in gmm_table1_cifar10 structinit_table2_cifar10; do
  [ -f "$WORK/$plan/plan.json" ] || continue
  python3 -m locvit.reproduce "$plan" --workdir="$WORK/$plan" --pack="/tmp/$plan.tgz" \
    | tee -a "$OUT/log.txt"
  split -b 15m "/tmp/$plan.tgz" "$OUT/$plan.tgz."
done
ls -la "$OUT"
