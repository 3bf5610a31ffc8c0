"""N seeds of one config: N lone steps against one N-seed step, side by side in one run.

  python benchmarks/seeds_side_by_side.py [--recipes="GMM-ViT d9,StructInit ViT-T/2"]
      [--seeds=1,2,4,8] [--steps=5] [--rounds=3]
  python benchmarks/seeds_side_by_side.py --smoke     # CPU, two blocks, small batches, fp32
  python benchmarks/seeds_side_by_side.py --gpu=h200   # kernel counts only: no GPU needed

Per recipe (a paper config of ``kit.MODELS_32`` at its paper's batch: GMM-ViT d9 at 128, the
structured-init ViT-T/2 at 512) and per N of ``--seeds``, two ways of training N seeds one step
each, timed in interleaved rounds (``kit.time_interleaved``; a round: every seed one step):

- lone: the training loop's step of one seed (``guarded_steps`` with the non-finite guard,
  ``kit.state_and_step``), dispatched N times a round, once on each seed's own state, as N runs
  of the config would train one after another;
- side by side: the N-seed step the training loop runs under ``config.num_seeds=N``
  (``locvit.run.seeds.make_step``: the same step vmapped over the seeds' states, batches,
  non-finite records and seeds, each stacked on a leading seed axis), dispatched once a round.

Printed per row: the round's time, images/s per seed and for all seeds, the side-by-side speedup
(the lone round's time over the side-by-side round's), the kernels a round runs (N times the lone
step's; the N-seed step's: ``kit.kernel_counts`` of the compiled HLO, outside loop bodies) and the
N-seed step's memory (XLA's memory analysis: arguments, outputs and temporaries, donated buffers
once). Every seed steps on the same resident synthetic batch, and the lone side's seeds share one
compiled step (its keys from the config's seed): the work does not depend on the values.

``--smoke``: CPU, two blocks per model, batches scaled down 64 times (at least 2), fp32, by
default two steps, one round; the same code as the full run.

``--gpu=h100|h200``: no timing, XLA:GPU's kernel counts on any host: the lone step and each
N-seed step compiled for a compile-only NVIDIA device (``kit.compile_only_gpu``, as
``benchmarks/step_kernels.py --gpu``; it needs jax's CUDA plugin at jax's version), from their
arguments' shapes alone. Without the chip XLA cannot autotune: every GEMM is a cuBLAS call.
"""

from __future__ import annotations

import argparse
import time

import jax
import kit

from locvit.configs.common import complete_config
from locvit.run import seeds as seeds_lib
from locvit.run import step as step_lib

RECIPES = {"GMM-ViT d9": 128, "StructInit ViT-T/2": 512}  # label of kit.MODELS_32 -> paper batch


def seeds_step(built: kit.Parts, seeds: list[int], platform: str | None = None):
  """The library's N-seed step of ``built`` for ``seeds`` (``locvit.run.seeds.make_step``),
  jitted on one device with the state and the non-finite records donated, as the training loop
  jits it: ``step(state, batches, (), health)``; ``platform``: a compile-only device's."""
  kwargs = built.step_kwargs(platform)
  return jax.jit(seeds_lib.make_step(seeds, **kwargs), donate_argnums=(0, 3))


def megabytes(compiled) -> float:
  """What XLA's memory analysis of ``compiled`` says it holds at once: arguments, outputs and
  temporaries, donated buffers counted once."""
  m = compiled.memory_analysis()
  held = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
  return (held + m.temp_size_in_bytes) / 2**20


def lone_runner(compiled, states: list, batches: list) -> kit.Runner:
  """Each of the seeds' states one step of the compiled lone step, one dispatch each."""
  health = [step_lib.initial_health() for _ in states]
  holder = {"metrics": None}

  def run():
    for k, state in enumerate(states):
      states[k], holder["metrics"], health[k] = compiled(state, batches, (), health[k])

  wait = lambda: jax.block_until_ready((states, holder["metrics"]))
  return kit.Runner(run, wait)


def side_by_side_runner(compiled, state, batches, health) -> kit.Runner:
  """The stacked state one step of the compiled N-seed step, one dispatch."""
  holder = {"state": state, "metrics": None, "health": health}

  def run():
    holder["state"], holder["metrics"], holder["health"] = compiled(
      holder["state"], batches, (), holder["health"]
    )

  wait = lambda: jax.block_until_ready((holder["state"], holder["metrics"]))
  return kit.Runner(run, wait)


def recipe_rows(
  label: str, batch_size: int, seed_counts: list[int], args, device=None
) -> list[tuple]:
  """``(N, side, round seconds or None, kernels a round, MB or None)`` of ``label``, each N's two
  sides timed in interleaved rounds; compiled for a compile-only ``device`` (``--gpu``): kernel
  counts alone, no time."""
  config = complete_config(kit.config_32(label, batch_size, args.smoke))
  platform = kit.set_for_device(config, device)
  shape = (32, 32, 3)
  built = kit.parts(config, shape, 10, devices=jax.devices()[:1])
  batch = kit.synthetic_batch(batch_size, 32, 10)
  # Compiled as the training loop compiles its step: with the config's XLA options.
  state, lone = kit.state_and_step(config, shape, 10, built.init(), loop=True, platform=platform)
  health = step_lib.initial_health()
  lone = kit.compile_on(lone, (state, [batch], (), health), config.xla_options, device)
  lone_kernels = kit.total_kernels(kit.kernel_counts(lone.as_text()))
  rows = []
  seed_states = seeds_lib.SeedStates(built.layout.shardings)
  for n in seed_counts:
    config.num_seeds = n
    seeds = seeds_lib.seeds_of(config)
    # Compile-only: the seeds' states matter by their shapes alone.
    inits = [state] * n if device else [built.init(seed) for seed in seeds]
    together = seed_states.stack(inits)
    batches = [seeds_lib.stacked_batch([batch] * n, built.batch_sharding)]
    health = seeds_lib.stacked_health(n, built.mesh)
    t0 = time.perf_counter()
    step = seeds_step(built, seeds, platform)
    compiled = kit.compile_on(step, (together, batches, (), health), config.xla_options, device)
    print(f"  {label}, {n} seeds: the N-seed step compiled in {time.perf_counter() - t0:.1f} s")
    side_kernels = kit.total_kernels(kit.kernel_counts(compiled.as_text()))
    if device:
      rows.append((n, "lone", None, n * lone_kernels, None))
      rows.append((n, "side by side", None, side_kernels, megabytes(compiled)))
      continue
    runners = {
      "lone": lone_runner(lone, [built.init(seed) for seed in seeds], [batch]),
      "side by side": side_by_side_runner(compiled, together, batches, health),
    }
    times = kit.time_interleaved(runners, args.steps, args.rounds, args.warmup)
    rows.append((n, "lone", times["lone"], n * lone_kernels, None))
    rows.append((n, "side by side", times["side by side"], side_kernels, megabytes(compiled)))
    del together
  return rows


def print_rows(label: str, batch_size: int, rows: list[tuple]) -> None:
  lone = {n: seconds for n, side, seconds, *_ in rows if side == "lone"}
  lone_kernels = {n: kernels for n, side, _, kernels, _ in rows if side == "lone"}
  for n, side, seconds, kernels, mb in rows:
    per_seed = batch_size / seconds
    kernel_ratio = kernels / lone_kernels[n]
    memory = "-" if mb is None else f"{mb:.0f}"
    print(
      f"{label:<20} {batch_size:>5} {n:>5}  {side:<12} {1e3 * seconds:9.2f} {per_seed:10.1f}"
      f" {n * per_seed:10.1f} {lone[n] / seconds:7.2f}x {kernels:>8} {kernel_ratio:6.2f}x"
      f" {memory:>8}",
      flush=True,
    )


def print_kernel_rows(label: str, batch_size: int, rows: list[tuple]) -> None:
  """``--gpu``'s table of ``label``: per N, the lone round's kernels and the N-seed step's, against
  the lone round's and against one lone step's, and the N-seed step's memory."""
  lone_step = next(kernels // n for n, side, _, kernels, _ in rows if side == "lone")
  by_n = {}
  for n, side, _, kernels, mb in rows:
    by_n.setdefault(n, {})[side] = (kernels, mb)
  for n, sides in by_n.items():
    lone, (side, mb) = sides["lone"][0], sides["side by side"]
    print(
      f"{label:<20} {batch_size:>5} {n:>5} {lone:>12} {side:>12} {side / lone:>9.2f}x"
      f" {side / lone_step:>9.2f}x {mb:>8.0f}",
      flush=True,
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--recipes", default=",".join(RECIPES), help=f"of {tuple(RECIPES)}")
  parser.add_argument("--seeds", default="1,2,4,8", help="the seed counts N, comma-separated")
  parser.add_argument("--steps", type=int, help="steps per seed in a timed round (5; smoke 2)")
  parser.add_argument("--rounds", type=int, help="timed rounds (3; smoke 1)")
  parser.add_argument("--warmup", type=int, help="untimed steps per side first (2; smoke 1)")
  parser.add_argument("--smoke", action="store_true", help="CPU, toy sizes, about a minute")
  targets = sorted(path.stem for path in kit.GPU_TARGETS.glob("*.txtpb"))
  parser.add_argument(
    "--gpu", choices=targets, help="kernel counts compiled for this NVIDIA GPU, without one"
  )
  args = parser.parse_args()
  if args.gpu and (args.steps or args.rounds or args.warmup):
    parser.error("--steps, --rounds and --warmup time the steps: --gpu compiles them, no more")
  labels = [label for label in args.recipes.split(",") if label]
  bad = [label for label in labels if label not in RECIPES]
  if bad:
    parser.error(f"unknown --recipes {bad}; choose from {tuple(RECIPES)}")
  try:
    seed_counts = [int(n) for n in args.seeds.split(",")]
  except ValueError:
    seed_counts = [0]
  if min(seed_counts) < 1:
    parser.error(f"--seeds={args.seeds}: comma-separated seed counts, each at least 1")
  if args.smoke:
    jax.config.update("jax_platforms", "cpu")
  compile_only = kit.compile_only_gpu(args.gpu) if args.gpu else None
  defaults = (2, 1, 1) if args.smoke else (5, 3, 2)
  for name, default in zip(("steps", "rounds", "warmup"), defaults):
    setattr(args, name, getattr(args, name) or default)
  device = compile_only or jax.devices()[0]
  compute = "fp32" if args.smoke else "bf16"
  what = (
    "kernel counts, compile-only"
    if compile_only
    else f"median of {args.rounds} rounds of {args.steps} steps per seed"
  )
  print(
    f"Seeds side by side on {device.platform} ({device.device_kind}), {compute} compute"
    f"{', smoke sizes' if args.smoke else ''}; {what}",
    flush=True,
  )
  results = {}
  for label in labels:
    batch_size = max(2, RECIPES[label] // 64) if args.smoke else RECIPES[label]
    results[label] = (batch_size, recipe_rows(label, batch_size, seed_counts, args, compile_only))
  if compile_only:
    print_kernel_table(results)
    return
  print(
    f"\n{'recipe':<20} {'batch':>5} {'seeds':>5}  {'side':<12} {'round ms':>9} {'img/s/seed':>10}"
    f" {'img/s all':>10} {'speedup':>8} {'kernels':>8} {'k/lone':>7} {'MB':>8}"
  )
  for label, (batch_size, rows) in results.items():
    print_rows(label, batch_size, rows)
  print(
    "round: every seed one step; speedup: the lone round's time / this side's; kernels: those a"
    "\nround dispatches (lone: N x the lone step's); k/lone: kernels / the lone round's; MB: XLA's"
    "\nmemory analysis of the N-seed step (arguments, outputs, temporaries)."
  )


def print_kernel_table(results: dict) -> None:
  """``--gpu``'s output: the kernel counts of each recipe's rows, and what they are."""
  print(
    f"\n{'recipe':<20} {'batch':>5} {'seeds':>5} {'lone round':>12} {'N-seed step':>12}"
    f" {'/ round':>10} {'/ 1 step':>10} {'MB':>8}"
  )
  for label, (batch_size, rows) in results.items():
    print_kernel_rows(label, batch_size, rows)
  print(
    "lone round: N x the lone step's kernels; N-seed step: the compiled N-seed step's; / round,"
    "\n/ 1 step: the N-seed step's against the lone round's and against one lone step's; MB: XLA's"
    "\nmemory analysis of the N-seed step. XLA:GPU's compilation without the chip: every GEMM a"
    "\ncuBLAS call (no autotuning). Counts, not times."
  )


if __name__ == "__main__":
  main()
