#!/usr/bin/env bash
# The accelerator kit's GPU run (issue 29), sized for about 10 minutes of one H100 or H200.
#
#   python benchmarks/gpu_wheels.py                          # on a machine with network, once
#   OUT=RESULTS_DIR bash benchmarks/kit_gpu.sh [WHEELS_DIR]  # on the GPU machine, in the checkout
#
# CALLS (default "A B C D E") picks the calls, run in that order, to share a GPU lease with other work.
#
# Four calls of benchmarks/accelerator.py, Table 1 only (synthetic batch resident on the GPU),
# most important first, within TOTAL_S seconds together (default 540; each call gets what the
# earlier ones left, so a slow one cannot take the others' rows with it). In each call every
# row's sides compile in 8 threads before any is timed; then 3 interleaved rounds of 10 steps
# and a profile (Table 1p) of each locvit side:
#   A. GMM-ViT d9 and ViT d9 at batch 128 (GMM's paper): locvit's default step ("before") beside
#      each candidate ("after": XLA's gpu_tuned options, cuDNN attention, both, 4 steps per
#      dispatch);
#   B. DeiT-S and ConViT-S at 224, batch 256: default and tuned+cudnn beside timm eager and timm
#      under torch.compile;
#   C. ConViT-Ti CIFAR at 512 and 128, the structured-init ViT-T/2 at 512: default, tuned+cudnn;
#   D. DeiT-S and ConViT-S at 224, batch 512, as B;
#   E. the DeiT recipe's step at 224, batch 128 (benchmarks/device_augment.py --deit_step): model
#      only, beside the device path with RandAugment per-example select and grouped by op (goal:
#      grouped <= 1.25x model only), then the augmentation alone at 32x32, batch 512.
# Results under $OUT: device.txt (nvidia-smi, versions), kit_A.log ... kit_E.log, and
# profiles.tar.gz (the .xplane.pb traces; left out, with a note in device.txt, over 15 MB).
set -uo pipefail
OUT=${OUT:-/tmp/kit_gpu}
WHEELS=${1:-gpu_wheels}
TOTAL_S=${TOTAL_S:-540}
CALLS=${CALLS:-A B C D E}
start=$SECONDS
mkdir -p "$OUT/profiles"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/locvit-site \
  "$WHEELS"/*.whl || exit 2
export PYTHONPATH=$PWD:/tmp/locvit-site PYTHONUNBUFFERED=1
# timm and locvit share the GPU: JAX takes memory as it needs it rather than 75% up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/device.txt" 2>&1
git log -1 --format='checkout %h %s' >>"$OUT/device.txt" 2>&1

kit() {  # kit NAME ARGS...: one call, limited to the time left
  local name=$1 left=$((TOTAL_S - (SECONDS - start)))
  shift
  case " $CALLS " in *" $name "*) ;; *) return ;; esac
  if [ "$left" -lt 60 ]; then
    echo "call $name not run: $left s left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/device.txt"
    return
  fi
  timeout "$left" python3 benchmarks/accelerator.py --tables=1 --steps=10 --rounds=3 --warmup=3 \
    --compile_threads=8 --profile_dir="$OUT/profiles/$name" "$@" 2>&1 | tee "$OUT/kit_$name.log"
}

kit A --only="GMM-ViT d9,ViT d9" --variants=default,gpu_tuned,cudnn,tuned+cudnn,k4,flat_opt --profile=5
kit B --only="deit_small b256,convit_small b256" --variants=default,tuned+cudnn --profile=3
kit C --only="ConViT-Ti CIFAR,StructInit" --variants=default,tuned+cudnn --profile=5
kit D --only="deit_small b512,convit_small b512" --variants=default,tuned+cudnn --profile=3

left=$((TOTAL_S - (SECONDS - start)))
if [[ " $CALLS " != *" E "* ]]; then
  :
elif [ "$left" -ge 60 ]; then
  timeout "$left" bash -c 'python3 benchmarks/device_augment.py --deit_step=deit_small_patch16_224 \
    --deit_step_batch=128 --steps=10 --rounds=3 --all_cores &&
    python3 benchmarks/device_augment.py --dispatch_only --dispatch_batch=512 --rounds=3 --all_cores' 2>&1 |
    tee "$OUT/kit_E.log"
else
  echo "call E not run: $left s left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/device.txt"
fi

tar czf "$OUT/profiles.tar.gz" -C "$OUT" profiles 2>/dev/null
rm -rf "$OUT/profiles"
if [ "$(stat -c %s "$OUT/profiles.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
  rm "$OUT/profiles.tar.gz"
  echo "profiles.tar.gz left out: over 15 MB" >>"$OUT/device.txt"
fi
echo "kit_gpu.sh: $((SECONDS - start)) s" >>"$OUT/device.txt"
