#!/usr/bin/env bash
# The accelerator kit's GPU run (issue 29), sized for about 10 minutes of one H100 or H200.
#
#   python benchmarks/gpu_wheels.py                        # on a machine with network, once
#   OUT=RESULTS_DIR bash benchmarks/kit_gpu.sh [WHEELS_DIR]  # on the GPU machine, in the checkout
#
# Two calls of benchmarks/accelerator.py, Table 1 only (synthetic batch resident on the GPU), each
# row's sides compiled in 8 threads first and then timed interleaved, 3 rounds of 10 steps:
#   1. the CIFAR models at their papers' batches (ConViT-Ti CIFAR at 512 and 128, GMM-ViT d9 and
#      ViT d9 at 128, the structured-init ViT-T/2 at 512), locvit's default step ("before")
#      beside the candidate settings ("after": XLA's gpu_tuned options, cuDNN attention, both),
#      and a profile of 5 steps of each (Table 1p);
#   2. DeiT-S and ConViT-S at 224, batch 256 and 512: locvit default and tuned+cudnn beside timm
#      eager and timm under torch.compile, and a profile of 3 steps of each locvit side.
# Results under $OUT: device.txt (nvidia-smi), kit_32.log, kit_224.log, profiles.tar.gz (the
# .xplane.pb traces; left out, with a note, when over 15 MB). Each call has its own time limit,
# so one that runs long still leaves the other's rows and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/kit_gpu}
WHEELS=${1:-gpu_wheels}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/locvit-site \
  "$WHEELS"/*.whl || exit 2
export PYTHONPATH=$PWD:/tmp/locvit-site PYTHONUNBUFFERED=1
# timm and locvit share the GPU: JAX takes memory as it needs it rather than 75% up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/device.txt" 2>&1
common=(--tables=1 --steps=10 --rounds=3 --warmup=3 --compile_threads=8)

timeout 270 python3 benchmarks/accelerator.py "${common[@]}" \
  --only="ConViT-Ti CIFAR,GMM-ViT d9,ViT d9,StructInit" \
  --variants=default,gpu_tuned,cudnn,tuned+cudnn --profile=5 --profile_dir="$OUT/profiles_32" \
  2>&1 | tee "$OUT/kit_32.log"

timeout 300 python3 benchmarks/accelerator.py "${common[@]}" \
  --only="deit_small b256,convit_small b256,deit_small b512,convit_small b512" \
  --variants=default,tuned+cudnn --torch=eager,compile --profile=3 \
  --profile_dir="$OUT/profiles_224" 2>&1 | tee "$OUT/kit_224.log"

tar czf "$OUT/profiles.tar.gz" -C "$OUT" profiles_32 profiles_224 2>/dev/null
rm -rf "$OUT/profiles_32" "$OUT/profiles_224"
if [ "$(stat -c %s "$OUT/profiles.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
  rm "$OUT/profiles.tar.gz"
  echo "profiles.tar.gz left out: over 15 MB" >>"$OUT/device.txt"
fi
