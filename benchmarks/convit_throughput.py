"""Training throughput and memory of locvit's ConViT: against DeiT, and against a PyTorch ConViT.

  python benchmarks/convit_throughput.py [--image_size=224] [--batch_size=8] [--steps=2] \\
      [--rounds=3] [--threads=2] [--torch_image_size=112] [--torch_batch_size=8]

Three tables, one run, one machine, the same resident batch for every model of a table:

1. locvit ConViT-Ti/S vs DeiT-Ti/S: images/s of the library's jitted training step
   (``locvit.train.train_step``: forward, backward, AdamW with the DeiT recipe, label smoothing).
   Goal: ConViT >= 0.85x its DeiT (the paper's implementation runs at ~0.5x, Table 1).
2. locvit ConViT-Ti/S vs the PyTorch ConViT of ``tests/torch_reference.py`` (the official forward
   pass, timm names): forward, backward (cross entropy with label smoothing 0.1) and
   ``torch.optim.AdamW``, ``torch.set_num_threads(threads)``. Goal: locvit >= 1.0x on CPU. By
   default at 112x112 (7x7 patches), batch 8, so that it runs in a few minutes on 2 cores.
3. (``--tables=kernels``) locvit with its CPU code paths (the default on CPU: the einsum attention
   kernels with hand-written backward passes, projections and patch embedding as 2-D matmuls)
   against the same models with them off (``attention_implementation='xla'``,
   ``locvit.ops.FLATTEN_MATMULS = False``: ``jax.nn.dot_product_attention``, the ``(1 - g) SDPA +
   g P v`` GPSA decomposition, full-rank ``dot_general`` and ``lax.conv``), at
   ``--torch_image_size``.

Both frameworks are pinned to the first ``threads`` cores (``sched_setaffinity``). On a machine
shared with other work, PyTorch's OpenMP threads slow down far more than XLA's when the load
exceeds the cores; ``--threads=1`` gives a contention-robust comparison.

Stochastic depth is off in every model (the PyTorch reference has none). Every model runs in its
own process (as in real training), and the models are timed in interleaved rounds (``steps``
steps per model per round, after ``--warmup`` untimed steps, with a 0.2 s pause between models)
so load from other processes hits them alike; the median round is reported, with the 1-minute
load average before and after.

``--glibc_hugetlb`` re-runs the script with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (both
frameworks, and the memory subprocesses, get it): glibc then backs large ``malloc`` blocks with
transparent huge pages. XLA:CPU allocates its temporaries afresh at every execution, so by default
a ConViT-Ti step at 224x224 first-touches about 512 MB (131,000 minor page faults per step,
against 1,600 for PyTorch's step); with the tunable, 350.

Memory, two methods:
- ``xla MiB``: XLA's accounting of the compiled step (``memory_analysis()``): arguments (params,
  optimizer state, batch) + outputs - donated aliases + temporaries. Exact for the buffers XLA
  owns; excludes the runtime itself.
- ``rss MiB`` / ``torch rss`` (table 2): for both frameworks, in a fresh subprocess per model:
  peak resident memory (``VmHWM``) after two training steps minus the resident memory before
  the model was built (after imports). Includes parameters, gradients, optimizer state,
  activations and allocator caches; for JAX it also includes compilation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

LOCVIT_PAIRS = (("convit_tiny", "deit_tiny"), ("convit_small", "deit_small"))
TORCH_MODELS = ("convit_tiny", "convit_small")
NUM_CLASSES = 1000
HUGETLB = "glibc.malloc.hugetlb=1"


# ------------------------------------------------------------------------------------------------
# Steps


@functools.cache
def jax_step(name: str, image_size: int, batch_size: int, cpu_kernels: bool = True):
  """``(run, xla_mb)``: ``run()`` performs one jitted training step on a resident batch.

  ``cpu_kernels=False`` traces the step with locvit's CPU code paths off (table 3).
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np

  from configs.common import base_config
  from configs.recipes import deit_recipe
  from locvit import ops, optim, train

  config = deit_recipe(base_config())
  # The model step only: the PyTorch reference has no on-device Mixup/CutMix/erasing either.
  config.mixup.mixup_alpha = config.mixup.cutmix_alpha = config.random_erasing.prob = 0.0
  config.batch_size = batch_size
  config.model.name = name
  config.model.overrides.drop_path_rate = 0.0
  if not cpu_kernels:
    config.model.overrides.attention_implementation = "xla"
  model = train.build_model(config, NUM_CLASSES)
  _, init = train.abstract_train_state(model, None, (image_size, image_size, 3))
  params = nn.meta.unbox(jax.jit(init)(jax.random.key(0)))
  schedule = optim.make_schedule(config, 1000, 100)
  tx = optim.make_optimizer(config, params, schedule)
  state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  rng = np.random.default_rng(0)
  batch = {
    "image": jnp.asarray(rng.normal(size=(batch_size, image_size, image_size, 3)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, NUM_CLASSES, batch_size), jnp.int32),
  }
  step = functools.partial(
    train.train_step, model=model, tx=tx, schedule=schedule, config=config, num_classes=1000
  )
  ops.FLATTEN_MATMULS = None if cpu_kernels else False  # read while tracing
  try:
    compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  finally:
    ops.FLATTEN_MATMULS = None
  mem = compiled.memory_analysis()
  xla_bytes = (
    mem.argument_size_in_bytes
    + mem.output_size_in_bytes
    - mem.alias_size_in_bytes
    + mem.temp_size_in_bytes
  )
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready(metrics["train/loss"])

  return run, xla_bytes / 2**20


def torch_step(name: str, image_size: int, batch_size: int, threads: int):
  """``run()`` performs one training step of the PyTorch reference ConViT on a resident batch."""
  import torch
  import torch.nn.functional as F

  from tests import torch_reference

  torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = torch_reference.build(name, img_size=image_size, num_classes=NUM_CLASSES).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.05)
  images = torch.randn(batch_size, 3, image_size, image_size)
  labels = torch.randint(0, NUM_CLASSES, (batch_size,))

  def run():
    optimizer.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
    loss.backward()
    optimizer.step()

  return run


# ------------------------------------------------------------------------------------------------
# Timing and memory


def _step_server(conn, spec: tuple, warmup: int) -> None:
  """Child process: builds one model's step, warms it up, then times ``n`` steps on request."""
  framework, name, image_size, batch_size, threads, cpu_kernels = spec
  if framework == "jax":
    run, xla_mb = jax_step(name, image_size, batch_size, cpu_kernels)
  else:
    run, xla_mb = torch_step(name, image_size, batch_size, threads), 0.0
  for _ in range(warmup):
    run()
  conn.send(xla_mb)
  while (steps := conn.recv()) is not None:
    start = time.perf_counter()
    for _ in range(steps):
      run()
    conn.send((time.perf_counter() - start) / steps)


def time_interleaved(
  specs: dict, steps: int, rounds: int, warmup: int = 3, pause_s: float = 0.2
) -> tuple[dict[str, float], dict[str, float]]:
  """``(step seconds, xla MiB)`` per model: median over rounds, models interleaved per round.

  ``specs`` maps a label to ``(framework, name, image_size, batch_size, threads, cpu_kernels)``.
  Every model runs in its own process, as in real training: a model's heap, allocator state and
  thread pools are not disturbed by the others (measured in one process, a JAX step that
  followed a PyTorch step ran up to 50% slower than alone). Only one process works at a time;
  ``pause_s`` before each timed block lets the previous model's worker threads go idle.
  ``warmup`` untimed steps first: the first steps of a donated JAX step are 15-60% slower (first
  touch of new buffers); PyTorch's first step creates the optimizer state.
  """
  import multiprocessing

  context = multiprocessing.get_context("spawn")  # JAX is not fork-safe
  servers, xla_mb = {}, {}
  for label, spec in specs.items():
    parent, child = context.Pipe()
    process = context.Process(target=_step_server, args=(child, spec, warmup), daemon=True)
    process.start()
    xla_mb[label] = parent.recv()  # built and warm; the next model builds after it
    servers[label] = (parent, process)
  times = {label: [] for label in specs}
  try:
    for _ in range(rounds):
      for label, (conn, _) in servers.items():
        time.sleep(pause_s)
        conn.send(steps)
        times[label].append(conn.recv())
  finally:
    for conn, process in servers.values():
      conn.send(None)
      process.join(timeout=60)
  return {label: statistics.median(t) for label, t in times.items()}, xla_mb


def proc_status_mb(field: str) -> float:
  """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, in MiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(f"{field}:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"{field} not found in /proc/self/status")


def worker(framework: str, name: str, image_size: int, batch_size: int, threads: int) -> None:
  """Subprocess: peak RSS of two training steps above the RSS before the model is built."""
  if framework == "jax":
    import jax  # noqa: F401  (import cost is not the model's)

    baseline = proc_status_mb("VmRSS")
    run, _ = jax_step(name, image_size, batch_size)
  else:
    import torch  # noqa: F401

    baseline = proc_status_mb("VmRSS")
    run = torch_step(name, image_size, batch_size, threads)
  run()
  run()
  # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across execve.
  print(json.dumps({"rss_mb": proc_status_mb("VmHWM") - baseline}))


def rss_mb(framework: str, name: str, image_size: int, batch_size: int, threads: int) -> float:
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", framework, name]
  cmd += [f"--image_size={image_size}", f"--batch_size={batch_size}", f"--threads={threads}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])["rss_mb"]


# ------------------------------------------------------------------------------------------------
# Tables


def load() -> str:
  return f"{os.getloadavg()[0]:.1f}"


def locvit_table(args) -> None:
  specs = {
    name: ("jax", name, args.image_size, args.batch_size, args.threads, True)
    for pair in LOCVIT_PAIRS
    for name in pair
  }
  before = load()
  step_s, xla = time_interleaved(specs, args.steps, args.rounds, args.warmup)
  print(
    f"\n[1] locvit ConViT vs DeiT: train step at {args.image_size}x{args.image_size}, batch "
    f"{args.batch_size}, {args.threads} cores, {args.rounds} rounds x {args.steps} steps, "
    f"load {before} -> {load()}"
  )
  print(f"{'model':<14}{'img/s':>9}{'vs DeiT':>9}{'xla MiB':>9}")
  for convit, deit in LOCVIT_PAIRS:
    for name in (convit, deit):
      ratio = step_s[deit] / step_s[name]
      print(f"{name:<14}{args.batch_size / step_s[name]:>9.2f}{ratio:>8.2f}x{xla[name]:>9.0f}")


def torch_table(args) -> None:
  size, batch = args.torch_image_size, args.torch_batch_size
  specs = {}
  for name in TORCH_MODELS:
    specs[f"locvit {name}"] = ("jax", name, size, batch, args.threads, True)
    specs[f"torch {name}"] = ("torch", name, size, batch, args.threads, True)
  before = load()
  step_s, xla_by_label = time_interleaved(specs, args.steps, args.rounds, args.warmup)
  xla = {name: xla_by_label[f"locvit {name}"] for name in TORCH_MODELS}
  print(
    f"\n[2] locvit vs PyTorch reference ConViT: train step at {size}x{size}, batch {batch}, "
    f"{args.threads} cores / torch threads, {args.rounds} rounds x {args.steps} steps, "
    f"load {before} -> {load()}"
  )
  header = ("model", "locvit img/s", "torch img/s", "speed-up", "xla MiB", "rss MiB", "torch rss")
  print(f"{header[0]:<14}" + "".join(f"{h:>13}" for h in header[1:]))
  for name in TORCH_MODELS:
    ours, theirs = step_s[f"locvit {name}"], step_s[f"torch {name}"]
    rss_ours = rss_mb("jax", name, size, batch, args.threads)
    rss_theirs = rss_mb("torch", name, size, batch, args.threads)
    print(
      f"{name:<14}{batch / ours:>13.2f}{batch / theirs:>13.2f}{theirs / ours:>12.2f}x"
      f"{xla[name]:>13.0f}{rss_ours:>13.0f}{rss_theirs:>13.0f}"
    )


def kernels_table(args) -> None:
  size, batch = args.torch_image_size, args.torch_batch_size
  specs = {
    (name, on): ("jax", name, size, batch, args.threads, on)
    for name in ("convit_tiny", "deit_tiny", "convit_small")
    for on in (False, True)
  }
  before = load()
  step_s, xla = time_interleaved(specs, args.steps, args.rounds, args.warmup)
  print(
    f"\n[3] locvit CPU code paths on vs off: train step at {size}x{size}, batch {batch}, "
    f"{args.threads} cores, {args.rounds} rounds x {args.steps} steps, load {before} -> {load()}"
  )
  header = ("model", "off img/s", "on img/s", "speed-up", "off MiB", "on MiB")
  print(f"{header[0]:<14}" + "".join(f"{h:>11}" for h in header[1:]))
  for name in ("convit_tiny", "deit_tiny", "convit_small"):
    off, on = step_s[(name, False)], step_s[(name, True)]
    print(
      f"{name:<14}{batch / off:>11.2f}{batch / on:>11.2f}{off / on:>10.2f}x"
      f"{xla[(name, False)]:>11.0f}{xla[(name, True)]:>11.0f}"
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--torch_image_size", type=int, default=112)
  parser.add_argument("--torch_batch_size", type=int, default=8)
  parser.add_argument("--steps", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument(
    "--tables", default="locvit,torch", help="which tables: locvit, torch, kernels"
  )
  parser.add_argument("--glibc_hugetlb", action="store_true", help="see the module docstring")
  parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "MODEL"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.glibc_hugetlb and HUGETLB not in os.environ.get("GLIBC_TUNABLES", ""):
    tunables = ":".join(filter(None, (os.environ.get("GLIBC_TUNABLES"), HUGETLB)))
    env = dict(os.environ, GLIBC_TUNABLES=tunables)  # read by the loader: needs a new process
    os.execve(sys.executable, [sys.executable, *sys.argv], env)
  # Both frameworks get the same cores.
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
  if args.worker:
    worker(*args.worker, args.image_size, args.batch_size, args.threads)
    return
  print(f"{os.cpu_count()} CPUs, {args.threads} used; load average before: {load()}")
  print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}")
  tables = set(args.tables.split(","))
  if "locvit" in tables:
    locvit_table(args)
  if "torch" in tables:
    torch_table(args)
  if "kernels" in tables:
    kernels_table(args)


if __name__ == "__main__":
  main()
