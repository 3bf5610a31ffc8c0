"""Training-step cost of the Gaussian mixture mask: ViT vs GMM-ViT, side by side in one run.

  python benchmarks/gmm_vs_vit.py [--batch_size=128] [--steps=10] [--rounds=3] \\
      [--models=vit,vit_gap,gmm,gmm_add,elm]

The models are Li & Zhang's small-dataset ViT at 32x32 / patch 4 (dim 192, depth 9, 12 heads):

  vit      the baseline (class token, 65 tokens, fused attention kernel);
  vit_gap  the baseline with mean pooling (64 tokens, as the masked models);
  gmm      GMM-ViT, faithful kernel, mask multiplied into the logits (explicit softmax path);
  gmm_add  GMM-ViT with the mask added as a bias (fused kernel);
  elm      ELM-ViT (multiplied).

Each step is the library's real jitted training step (``locvit.run.step.train_step``, jitted by
``kit.sharded_step``: forward, backward and AdamW with the paper's recipe, label smoothing, drop
path) on one resident batch of the paper's config (``configs/gmm_table1.py``). Models are timed in
interleaved rounds so load from other processes hits them alike; the median round is reported. Goal:
GMM costs at most 15% more time per step than the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time

import flax.linen as nn
import jax
import kit

from locvit.configs.gmm_table1 import get_config
from locvit.models.factory import build_model
from locvit.platform import sharding

MODELS = {
  "vit": ("vit,cifar10,base", {}),
  "vit_gap": ("vit,cifar10,base", {"pool": "gap"}),
  "gmm": ("vit,cifar10,gmm", {}),
  "gmm_add": (
    "vit,cifar10,gmm",
    {"attention_kwargs": {"gmm": {"num_kernels": 5, "kernel": "faithful", "combine": "add"}}},
  ),
  "elm": ("vit,cifar10,gmm", {"layer_attention": ("elm",) * 9}),
}


def make_step(name: str, batch_size: int):
  """``(parts, jitted train step, batch)`` of ``MODELS[name]`` over the config's mesh."""
  arg, overrides = MODELS[name]
  config = get_config(arg)
  config.batch_size = batch_size
  model = build_model(config, 10).clone(**overrides)
  built = kit.parts(config, (32, 32, 3), 10, model=model)
  keys = jax.random.split(jax.random.key(1))
  batch = {
    "image": jax.random.normal(keys[0], (batch_size, 32, 32, 3)),
    "label": jax.random.randint(keys[1], (batch_size,), 0, 10),
  }
  return built, kit.sharded_step(built), sharding.global_batch(batch, built.batch_sharding)


def time_steps(step, state, batch, steps: int):
  t0 = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  return state, (time.perf_counter() - t0) / steps


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch_size", type=int, default=128)
  p.add_argument("--steps", type=int, default=10, help="timed steps per model per round")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--models", default="vit,vit_gap,gmm,gmm_add,elm")
  args = p.parse_args()
  names = [m.strip() for m in args.models.split(",") if m.strip()]
  unknown = sorted(set(names) - set(MODELS))
  if unknown:
    raise SystemExit(f"Unknown models {unknown}; valid: {sorted(MODELS)}.")

  runs, compile_s = {}, {}
  setups = {name: make_step(name, args.batch_size) for name in names}
  first = setups[names[0]][0]
  with jax.set_mesh(first.mesh), nn.logical_axis_rules(first.rules):
    for name in names:
      built, step, batch = setups[name]
      state = built.init()
      t0 = time.perf_counter()
      state, _ = time_steps(step, state, batch, 1)
      compile_s[name] = time.perf_counter() - t0
      state, _ = time_steps(step, state, batch, args.warmup)
      runs[name] = [step, state, batch, []]
    for _ in range(args.rounds):
      for name in names:
        step, state, batch, times = runs[name]
        runs[name][1], seconds = time_steps(step, state, batch, args.steps)
        times.append(seconds)

  print(
    f"devices: {jax.device_count()} x {jax.devices()[0].platform} ({jax.devices()[0].device_kind});"
    f" batch {args.batch_size}; {args.rounds} rounds x {args.steps} steps; median round"
  )
  reference = statistics.median(runs[names[0]][3])
  print(
    f"{'model':10s} {'ms/step':>9s} {'images/s':>10s} "
    f"{'time vs ' + names[0]:>14s} {'compile s':>10s}"
  )
  for name in names:
    seconds = statistics.median(runs[name][3])
    print(
      f"{name:10s} {1e3 * seconds:9.1f} {args.batch_size / seconds:10.1f} "
      f"{seconds / reference:13.3f}x {compile_s[name]:10.1f}"
    )
  if "gmm" in runs and "vit" in runs:
    ratio = statistics.median(runs["gmm"][3]) / statistics.median(runs["vit"][3])
    verdict = "meets" if ratio <= 1.15 else "misses"
    print(f"GMM-ViT / ViT time per step = {ratio:.3f}x ({verdict} the goal <= 1.15x)")


if __name__ == "__main__":
  main()
