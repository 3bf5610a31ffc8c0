"""Training throughput and memory of locvit's ConViT: against DeiT, and against a PyTorch ConViT.

  python benchmarks/convit_throughput.py [--image_size=224] [--batch_size=8] [--steps=2] \\
      [--rounds=3] [--threads=2] [--torch_image_size=112] [--torch_batch_size=8]

Three tables, one run, one machine, the same resident batch for every model of a table:

1. locvit ConViT-Ti/S vs DeiT-Ti/S: images/s of the library's jitted training step
   (``locvit.run.step.train_step``: forward, backward, AdamW with the DeiT recipe, label smoothing).
   Goal: ConViT >= 0.85x its DeiT (the paper's implementation runs at ~0.5x, Table 1).
2. locvit ConViT-Ti/S vs the PyTorch ConViT of ``benchmarks/torch_reference.py`` (the official
   forward pass, timm names): forward, backward (cross entropy with label smoothing 0.1) and
   ``torch.optim.AdamW``, ``torch.set_num_threads(threads)``. Goal: locvit >= 1.0x on CPU. By
   default at 112x112 (7x7 patches), batch 8, so that it runs in a few minutes on 2 cores.
3. (``--tables=kernels``) locvit with its CPU code paths (the default on CPU: the einsum attention
   kernels with hand-written backward passes, projections and patch embedding as 2-D matmuls)
   against the same models with them off (``attention_implementation='xla'``, the one kernel
   setting, ``locvit.platform.ops``: ``jax.nn.dot_product_attention``, the ``(1 - g) SDPA + g P v``
   GPSA decomposition, full-rank ``dot_general`` and ``lax.conv``), at ``--torch_image_size``.

Both frameworks are pinned to the first ``threads`` cores (``sched_setaffinity``). On a machine
shared with other work, PyTorch's OpenMP threads slow down far more than XLA's when the load
exceeds the cores; ``--threads=1`` gives a contention-robust comparison.

Stochastic depth is off in every model (the PyTorch reference has none). Every model runs in its
own process (as in real training), and the models are timed in interleaved rounds (``steps``
steps per model per round, after ``--warmup`` untimed steps, with a 0.2 s pause between models)
so load from other processes hits them alike; the median round is reported, with the 1-minute
load average before and after.

4. (``--tables=malloc``) the same step under each ``locvit.platform.cpu_malloc`` mode, per model and
   framework, at ``--torch_image_size``: ``default``; ``tcmalloc`` (TCMalloc preloaded, if
   installed); ``retain`` (glibc: one arena, no ``mmap``, no trimming). XLA:CPU allocates its
   temporaries afresh at every execution, so with glibc's defaults a ConViT-Ti step at 224x224
   first-touches about 512 MB (131,000 minor page faults per step, against 1,600 for PyTorch's
   step). Each process gets its mode at start (the loader reads ``LD_PRELOAD`` and
   ``GLIBC_TUNABLES`` then); the table prints the faults per step too.

5. (``--tables=checkouts --baseline=PATH``) the same locvit step from this checkout and from
   another one (e.g. a checkout of main before a refactoring), interleaved in one run, at
   ``--torch_image_size``: each process imports ``locvit`` and ``configs`` from its checkout.

``--cpu_malloc=MODE`` re-runs the whole script under one mode (both frameworks and the memory
subprocesses get it).

Memory, two methods:
- ``xla MiB``: XLA's accounting of the compiled step (``memory_analysis()``): arguments (params,
  optimizer state, batch) + outputs - donated aliases + temporaries. Exact for the buffers XLA
  owns; excludes the runtime itself.
- ``rss MiB`` / ``torch rss`` (table 2): for both frameworks, in a fresh subprocess per model:
  peak resident memory (``VmHWM``) after six training steps minus the resident memory before
  the model was built (after imports). Includes parameters, gradients, optimizer state,
  activations and allocator caches; for JAX it also includes compilation.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from locvit.platform import cpu_malloc  # noqa: E402  (imports no JAX)
from locvit.platform.flops import xla_flops  # noqa: E402  (imports no JAX)

LOCVIT_PAIRS = (("convit_tiny", "deit_tiny"), ("convit_small", "deit_small"))
TORCH_MODELS = ("convit_tiny", "convit_small")
NUM_CLASSES = 1000
MALLOC_TABLE_MODES = {"jax": ("default", "tcmalloc", "retain"), "torch": ("default", "tcmalloc")}


# ------------------------------------------------------------------------------------------------
# Steps


@functools.cache
def compiled_step(name: str, image_size: int, batch_size: int, cpu_kernels: bool = True):
  """``(compiled step, state, batch)``: locvit's training step compiled for a resident batch.

  ``cpu_kernels=False`` traces the step with locvit's CPU code paths off (table 3).
  """
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  import numpy as np

  from configs.common import base_config
  from configs.recipes import deit_recipe
  from locvit import optim
  from locvit.models.factory import build_model
  from locvit.run.state import TrainState
  from locvit.run.step import train_step

  config = deit_recipe(base_config())
  # The model step only: the PyTorch reference has no on-device Mixup/CutMix/erasing either.
  config.mixup.mixup_alpha = config.mixup.cutmix_alpha = config.random_erasing.prob = 0.0
  config.batch_size = batch_size
  config.model.name = name
  config.model.overrides.drop_path_rate = 0.0
  if not cpu_kernels:
    config.model.overrides.attention_implementation = "xla"
  model = build_model(config, NUM_CLASSES)
  # plain flax (model.init), so that the step also runs from an older checkout (--baseline)
  images = jnp.zeros((1, image_size, image_size, 3), jnp.float32)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), images)["params"])
  schedule = optim.make_schedule(config, 1000, 100)
  tx = optim.make_optimizer(config, params, schedule)
  state = TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  rng = np.random.default_rng(0)
  batch = {
    "image": jnp.asarray(rng.normal(size=(batch_size, image_size, image_size, 3)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, NUM_CLASSES, batch_size), jnp.int32),
  }
  step = functools.partial(
    train_step,
    model=model,
    tx=tx,
    schedule=schedule,
    config=config,
    num_classes=1000,
    platform=jax.default_backend(),
  )
  return jax.jit(step, donate_argnums=0).lower(state, batch).compile(), state, batch


def jax_step(name: str, image_size: int, batch_size: int, cpu_kernels: bool = True):
  """``(run, xla_mb, gflops)``: ``run()`` performs one jitted training step on a resident batch.

  ``gflops``: XLA's cost analysis of the compiled step (forward, backward and optimizer).
  """
  import jax

  compiled, state, batch = compiled_step(name, image_size, batch_size, cpu_kernels)
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

  return run, xla_bytes / 2**20, xla_flops(compiled) / 1e9


def torch_step(name: str, image_size: int, batch_size: int, threads: int):
  """``run()`` performs one training step of the PyTorch reference ConViT on a resident batch."""
  import torch
  import torch.nn.functional as F
  import torch_reference

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


def _minor_faults() -> int:
  import resource

  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def use_checkout(root: str) -> None:
  """Makes this process import ``locvit`` and ``configs`` from the checkout at ``root``."""
  for module in [m for m in sys.modules if m.split(".")[0] in ("locvit", "configs", "tests")]:
    del sys.modules[module]
  sys.path.insert(0, os.path.abspath(root))


def _step_server(conn, spec: tuple, warmup: int) -> None:
  """Child process: builds one model's step, warms it up, then times ``n`` steps on request.

  Answers each request with ``(seconds per step, minor page faults per step)``.
  """
  framework, name, image_size, batch_size, threads, cpu_kernels = spec[:6]
  if len(spec) > 7 and spec[7]:
    use_checkout(spec[7])
  if framework == "jax":
    run, xla_mb, gflops = jax_step(name, image_size, batch_size, cpu_kernels)
  else:
    run, xla_mb, gflops = torch_step(name, image_size, batch_size, threads), 0.0, float("nan")
  for _ in range(warmup):
    run()
  conn.send((xla_mb, gflops))
  while (steps := conn.recv()) is not None:
    faults, start = _minor_faults(), time.perf_counter()
    for _ in range(steps):
      run()
    conn.send(((time.perf_counter() - start) / steps, (_minor_faults() - faults) / steps))


def _without_malloc_settings(env: dict) -> dict:
  return {k: v for k, v in env.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}


def time_interleaved(
  specs: dict,
  steps: int,
  rounds: int,
  warmup: int = 3,
  pause_s: float = 0.2,
  faults: dict | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
  """``(step seconds, xla MiB, GFLOPs)`` per model: median over rounds, models interleaved.

  ``specs`` maps a label to ``(framework, name, image_size, batch_size, threads, cpu_kernels)``,
  optionally with a 7th entry: the ``locvit.platform.cpu_malloc`` mode that process starts under,
  and an 8th: the checkout that process imports ``locvit`` from (None: this one).
  ``faults``, if given, receives the median minor page faults per step of each label.
  Every model runs in its own process, as in real training: a model's heap, allocator state and
  thread pools are not disturbed by the others (measured in one process, a JAX step that
  followed a PyTorch step ran up to 50% slower than alone). Only one process works at a time;
  ``pause_s`` before each timed block lets the previous model's worker threads go idle.
  ``warmup`` untimed steps first: the first steps of a donated JAX step are 15-60% slower (first
  touch of new buffers); PyTorch's first step creates the optimizer state.
  """
  import multiprocessing

  context = multiprocessing.get_context("spawn")  # JAX is not fork-safe
  servers, xla_mb, gflops = {}, {}, {}
  for label, spec in specs.items():
    parent, child = context.Pipe()
    process = context.Process(target=_step_server, args=(child, spec, warmup), daemon=True)
    mode = spec[6] if len(spec) > 6 else None
    saved = dict(os.environ)
    if mode is not None:  # the child's loader reads these from the inherited environment
      os.environ.clear()
      os.environ.update(cpu_malloc.environment(mode, env=_without_malloc_settings(saved)))
    try:
      process.start()
    finally:
      os.environ.clear()
      os.environ.update(saved)
    xla_mb[label], gflops[label] = parent.recv()  # built and warm; then the next model builds
    servers[label] = (parent, process)
  times = {label: [] for label in specs}
  page_faults = {label: [] for label in specs}
  try:
    for _ in range(rounds):
      for label, (conn, _) in servers.items():
        time.sleep(pause_s)
        conn.send(steps)
        seconds, step_faults = conn.recv()
        times[label].append(seconds)
        page_faults[label].append(step_faults)
  finally:
    for conn, process in servers.values():
      conn.send(None)
      process.join(timeout=60)
  if faults is not None:
    faults.update({label: statistics.median(f) for label, f in page_faults.items()})
  return {label: statistics.median(t) for label, t in times.items()}, xla_mb, gflops


def proc_status_mb(field: str) -> float:
  """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, in MiB."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(f"{field}:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError(f"{field} not found in /proc/self/status")


def worker(framework: str, name: str, image_size: int, batch_size: int, threads: int) -> None:
  """Subprocess: peak RSS of six training steps above the RSS before the model is built."""
  # The framework is imported before the baseline: its import cost is not the model's.
  importlib.import_module(framework)
  baseline = proc_status_mb("VmRSS")
  if framework == "jax":
    run, _, _ = jax_step(name, image_size, batch_size)
  else:
    run = torch_step(name, image_size, batch_size, threads)
  for _ in range(6):  # under cpu_malloc=retain the heap settles after a few steps
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
  step_s, xla, gflops = time_interleaved(specs, args.steps, args.rounds, args.warmup)
  print(
    f"\n[1] locvit ConViT vs DeiT: train step at {args.image_size}x{args.image_size}, batch "
    f"{args.batch_size}, {args.threads} cores, {args.rounds} rounds x {args.steps} steps, "
    f"load {before} -> {load()}"
  )
  # FLOPs bound: the speed ratio if both models ran their FLOPs at the same rate.
  print(f"{'model':<14}{'img/s':>9}{'vs DeiT':>9}{'GFLOP':>9}{'bound':>9}{'xla MiB':>9}")
  for convit, deit in LOCVIT_PAIRS:
    for name in (convit, deit):
      ratio, bound = step_s[deit] / step_s[name], gflops[deit] / gflops[name]
      print(
        f"{name:<14}{args.batch_size / step_s[name]:>9.2f}{ratio:>8.2f}x{gflops[name]:>9.1f}"
        f"{bound:>8.2f}x{xla[name]:>9.0f}"
      )


def torch_table(args) -> None:
  size, batch = args.torch_image_size, args.torch_batch_size
  specs = {}
  for name in TORCH_MODELS:
    specs[f"locvit {name}"] = ("jax", name, size, batch, args.threads, True)
    specs[f"torch {name}"] = ("torch", name, size, batch, args.threads, True)
  before = load()
  step_s, xla_by_label, _ = time_interleaved(specs, args.steps, args.rounds, args.warmup)
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
  step_s, xla, _ = time_interleaved(specs, args.steps, args.rounds, args.warmup)
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


def checkouts_table(args) -> None:
  if not args.baseline:
    raise SystemExit("--tables=checkouts needs --baseline=PATH (another locvit checkout)")
  size, batch = args.torch_image_size, args.torch_batch_size
  roots = {"baseline": args.baseline, "this": ROOT}
  models = ("convit_tiny", "deit_tiny")
  specs = {
    (name, label): ("jax", name, size, batch, args.threads, True, None, root)
    for name in models
    for label, root in roots.items()
  }
  before = load()
  step_s, _, _ = time_interleaved(specs, args.steps, args.rounds, args.warmup)
  print(
    f"\n[5] this checkout vs {args.baseline}: train step at {size}x{size}, batch {batch}, "
    f"{args.threads} cores, {args.rounds} rounds x {args.steps} steps, load {before} -> {load()}"
  )
  header = ("model", "base img/s", "this img/s", "this/base")
  print(f"{header[0]:<14}" + "".join(f"{h:>12}" for h in header[1:]))
  for name in models:
    base, this = step_s[(name, "baseline")], step_s[(name, "this")]
    print(f"{name:<14}{batch / base:>12.2f}{batch / this:>12.2f}{base / this:>11.3f}x")


def malloc_table(args) -> None:
  size, batch = args.torch_image_size, args.torch_batch_size
  skip = set() if cpu_malloc.find_tcmalloc() else {"tcmalloc"}
  if skip:
    print("\n[4] TCMalloc is not installed: no tcmalloc rows (apt install libtcmalloc-minimal4)")
  specs = {
    (framework, name, mode): (framework, name, size, batch, args.threads, True, mode)
    for name in TORCH_MODELS
    for framework, modes in MALLOC_TABLE_MODES.items()
    for mode in modes
    if mode not in skip
  }
  before, faults = load(), {}
  step_s, _, _ = time_interleaved(specs, args.steps, args.rounds, args.warmup, faults=faults)
  print(
    f"\n[4] malloc modes: train step at {size}x{size}, batch {batch}, {args.threads} "
    f"cores / torch threads, {args.rounds} rounds x {args.steps} steps, load {before} -> {load()}"
  )
  # Against PyTorch's fastest mode for that model: no mode is given to one framework only.
  best_torch = {
    name: min(t for (framework, n, _), t in step_s.items() if framework == "torch" and n == name)
    for name in TORCH_MODELS
  }
  header = ("model", "framework", "malloc", "img/s", "vs default", "vs best torch", "faults/step")
  print(f"{header[0]:<14}{header[1]:<11}{header[2]:<10}" + "".join(f"{h:>14}" for h in header[3:]))
  for (framework, name, mode), seconds in step_s.items():
    default = step_s[(framework, name, "default")]
    print(
      f"{name:<14}{framework:<11}{mode:<10}{batch / seconds:>14.2f}{default / seconds:>13.2f}x"
      f"{best_torch[name] / seconds:>13.2f}x{faults[(framework, name, mode)]:>14.0f}"
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
    "--tables",
    default="locvit,torch",
    help="which tables: locvit, torch, kernels, malloc, checkouts",
  )
  parser.add_argument("--baseline", default="", help="another checkout, for --tables=checkouts")
  parser.add_argument(
    "--cpu_malloc", default="default", choices=cpu_malloc.FLAG_CHOICES, help="see the docstring"
  )
  parser.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "MODEL"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  cpu_malloc.reexec_with(args.cpu_malloc, [sys.executable, *sys.argv])  # read at process start
  # Both frameworks get the same cores.
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.threads]))
  if args.worker:
    worker(*args.worker, args.image_size, args.batch_size, args.threads)
    return
  print(f"{os.cpu_count()} CPUs, {args.threads} used; load average before: {load()}")
  for variable in ("GLIBC_TUNABLES", "LD_PRELOAD"):
    print(f"{variable}={os.environ.get(variable, '')!r}")
  tables = set(args.tables.split(","))
  if "locvit" in tables:
    locvit_table(args)
  if "torch" in tables:
    torch_table(args)
  if "kernels" in tables:
    kernels_table(args)
  if "malloc" in tables:
    malloc_table(args)
  if "checkouts" in tables:
    checkouts_table(args)


if __name__ == "__main__":
  main()
