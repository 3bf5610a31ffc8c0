#!/usr/bin/env bash
# The accelerator kit's GPU run (issue 29), sized for about 10 minutes of one H100 or H200.
#
#   python benchmarks/gpu_wheels.py                          # on a machine with network, once
#   OUT=RESULTS_DIR bash benchmarks/kit_gpu.sh [WHEELS_DIR]  # on the GPU machine, in the checkout
#
# CALLS (default "A S B E L C D") picks the calls and their order (A first: the candidates
# against the kernel-count bound that the H200's first profile found, docs/benchmarks.md; then
# S and B: cuDNN attention, padded to even lengths, against the bytes that bind the 224 steps);
# A_VARIANTS (default "default,beta_loops,flat_opt,graphs") the sides of call A; LOCVIT_COMMIT
# names the checkout in device.txt (the GPU machine's copy may carry another commit's git
# metadata).
#
# Call L is the training loop itself (benchmarks/loop_rate.py) on the rows of L_ROWS (default
# gmm_table1_cifar10's ViT row at batch 128, 2,000 steps, and structinit_table2_cifar10's
# trunc-normal row at batch 512, 600 steps) from the CIFAR-10 JPEG folders ($CIFAR10_ROOT, else
# data/cifar10-jpeg.tar.gz unpacked to /tmp/cifar: benchmarks/gpu_machine.sh), the training
# split fed by the host pipeline beside held on the device (data.train_split_on): the loop's
# steps/s against the kit's resident steps.
# The other calls are benchmarks/accelerator.py, Table 1 only (synthetic batch resident on the
# GPU), within TOTAL_S seconds together (default 540), each also within its own cap (CAP below),
# so a slow one cannot take the others' time. In each call every row's sides compile in 8 threads before any is
# timed; then 3 interleaved rounds of 10 steps and a profile (Table 1p) of 2 steps per locvit side:
#   S. benchmarks/cudnn_shapes.py: locvit's cuDNN attention (odd lengths padded to even) on a grid
#      of shapes, against XLA's kernel (exit 1 if locvit lets through one that fails or differs);
#   A. GMM-ViT d9 and ViT d9 at batch 128 (GMM's paper): locvit's default step beside the sides
#      of A_VARIANTS: beta_loops (Mixup's lam drawn by jax.random.beta's loops, as before),
#      flat_opt (the optimizer on one vector), graphs (XLA's gpu_graphs options), bias_add (the
#      biases after the matmuls, as before ops.bias_in_matmul); gpu_tuned, cudnn, tuned+cudnn
#      and k4 were measured, no gain;
#  A0. call A's rows, default side, from an earlier checkout's tree: BASELINE_TREE, e.g.
#      `mkdir baseline_tree && git archive de9e0b5 locvit configs benchmarks
#      tests/torch_reference.py | tar -x -C baseline_tree` (git-ignored: carry it), its own kit;
#      with call A's log, benchmarks/kit_compare.py prints before against after (kit_A0_vs_A.log);
#   B. DeiT-S and ConViT-S at 224, batch 256: locvit (the recipe's step, model_only: the work
#      timm's side does, and cudnn: 197 tokens padded to 198) beside timm eager and timm under
#      torch.compile;
#   C. ConViT-Ti CIFAR at 512 and 128, the structured-init ViT-T/2 at 512;
#   D. DeiT-S and ConViT-S at 224, batch 512, as B;
#   E. the DeiT recipe's step at 224, batch 128 (benchmarks/augment_placement.py --deit_step): model
#      only, beside the device path with RandAugment per-example select and grouped by op (goal:
#      grouped <= 1.25x model only), and the model only and grouped under gpu_graphs (the five
#      steps compile side by side), then the augmentation alone at 32x32, batch 512.
# Results under $OUT: device.txt (nvidia-smi, versions), kit_A.log ... kit_E.log, and
# profiles.tar.gz (the .xplane.pb traces; left out, with a note in device.txt, over 15 MB).
set -uo pipefail
OUT=${OUT:-/tmp/kit_gpu}
WHEELS=${1:-gpu_wheels}
TOTAL_S=${TOTAL_S:-540}
CALLS=${CALLS:-A S B E L C D}
A_VARIANTS=${A_VARIANTS:-default,beta_loops,flat_opt,graphs}
export L_ROWS=${L_ROWS:-gmm_table1_cifar10:vit@2000 structinit_table2_cifar10:trunc_normal@600}
start=$SECONDS
mkdir -p "$OUT/profiles"
OUT=$(cd "$OUT" && pwd)  # call A0 runs in another folder
source benchmarks/gpu_machine.sh
install_wheels "$WHEELS" || exit 2
# timm and locvit share the GPU: JAX takes memory as it needs it rather than 75% up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/device.txt" 2>&1
echo "checkout ${LOCVIT_COMMIT:-$(git describe --always --abbrev=7 --dirty=" with local changes")}" \
  >>"$OUT/device.txt" 2>&1

# Each call's cap (s), from what the calls took on an H200 (docs/benchmarks.md, "Issue 29's
# profile"): ten 32x32 sides with 5-call profiles took 294 s (A now runs eight, 2-call
# profiles); 224 sides compile in about a minute each, side by side.
# Call L, per row of L_ROWS (PLAN:ROW@STEPS): two compilations of about 35 s, a 50,000-image
# decode and 2 x STEPS steps (the host-fed structured-init row runs about 21 steps/s).
declare -A CAP=([L]=260 [S]=90 [A]=230 [A0]=120 [B]=230 [C]=150 [D]=200 [E]=220)

call() {  # call NAME: run it, limited to its cap and to the time left
  local name=$1 left=$((TOTAL_S - (SECONDS - start)))
  if [ -z "${CAP[$name]+set}" ]; then
    echo "call $name not run: no such call (L, S, A, A0, B, C, D, E)" | tee -a "$OUT/device.txt"
    return
  fi
  [ "${CAP[$name]}" -lt "$left" ] && left=${CAP[$name]}
  if [ "$left" -lt 60 ]; then
    echo "call $name not run: $left s left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/device.txt"
    return
  fi
  echo "call $name: up to $left s" >>"$OUT/device.txt"
  local kit=(timeout "$left" python3 benchmarks/accelerator.py --tables=1 --steps=10 --rounds=3
    --warmup=3 --compile_threads=8 --profile_dir="$OUT/profiles/$name")
  case $name in
    L) use_cifar10 && timeout "$left" bash -c 'for row in $L_ROWS; do
         python3 benchmarks/loop_rate.py --cifar_root="$CIFAR10_ROOT" --row="${row%@*}" \
           --steps="${row#*@}"
         done' ;;
    S) timeout "$left" python3 benchmarks/cudnn_shapes.py ;;
    A) "${kit[@]}" --only="GMM-ViT d9,ViT d9" --variants="$A_VARIANTS" --profile=2 ;;
    A0) if [ -f "${BASELINE_TREE:-}/benchmarks/accelerator.py" ]; then
          (cd "$BASELINE_TREE" && PYTHONPATH=$PWD:/tmp/locvit-site "${kit[@]}" \
            --only="GMM-ViT d9,ViT d9" --variants=default --torch="" --profile=2)
        else
          echo "call A0 not run: BASELINE_TREE (${BASELINE_TREE:-unset}) holds no kit"
        fi ;;
    B) "${kit[@]}" --only="deit_small b256,convit_small b256" --variants=default,model_only,cudnn \
         --profile=2 ;;
    C) "${kit[@]}" --only="ConViT-Ti CIFAR,StructInit" --variants=default --profile=2 ;;
    D) "${kit[@]}" --only="deit_small b512,convit_small b512" --variants=default,model_only \
         --profile=2 ;;
    E) timeout "$left" bash -c 'python3 benchmarks/augment_placement.py \
         --deit_step=deit_small_patch16_224 --deit_step_batch=128 --steps=10 --rounds=3 --all_cores &&
         python3 benchmarks/augment_placement.py --dispatch_only --dispatch_batch=512 --rounds=3 \
         --all_cores' ;;
  esac 2>&1 | tee "$OUT/kit_$name.log"
}

for name in $CALLS; do call "$name"; done
if [ -s "$OUT/kit_A0.log" ] && [ -s "$OUT/kit_A.log" ]; then
  python3 benchmarks/kit_compare.py "$OUT/kit_A0.log" "$OUT/kit_A.log" | tee "$OUT/kit_A0_vs_A.log"
fi

tar czf "$OUT/profiles.tar.gz" -C "$OUT" profiles 2>/dev/null
rm -rf "$OUT/profiles"
if [ "$(stat -c %s "$OUT/profiles.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
  rm "$OUT/profiles.tar.gz"
  echo "profiles.tar.gz left out: over 15 MB" >>"$OUT/device.txt"
fi
echo "kit_gpu.sh: $((SECONDS - start)) s" >>"$OUT/device.txt"
