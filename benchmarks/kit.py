"""What the benchmarks share: the model tables, their configs, the training state and step built
by the library (``locvit.run.state``, ``locvit.run.step``), interleaved timing, and the count of
a compiled step's kernels read from its optimised HLO.

A script imports this module (``import kit``: its own folder is on ``sys.path``) and no other
benchmark's private names; nothing here imports a script or anything under ``tests/``
(``tests/test_benchmark_imports.py``).

The step is the library's: ``state_and_step`` jits ``locvit.run.step.train_step`` (or, with
``loop=True``, ``guarded_steps``, the training loop's step with the non-finite guard and
``config.steps_per_dispatch`` batches a call) over the state ``locvit.run.state.state_layout``
initialises, on one device; ``sharded_step`` does the same over the config's mesh, with the
shardings the training loop gives its step.

Kernel counts (``kernel_counts``, ``listed_kernels``): the top-level instructions of the optimised
HLO's entry computation that run as kernels (XLA:CPU: thunks), by the part of the step their
source stack (the HLO's ``StackFrames``) names; see ``benchmarks/step_kernels.py``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import linecache
import math
import os
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from PIL import Image

from locvit import optim
from locvit.configs import (
  convit_cifar10_small,
  gmm_cifar10_small,
  gmm_table1,
  structinit_cifar10_small,
  structinit_table1,
)
from locvit.configs.common import base_config, complete_config
from locvit.configs.recipes import deit_recipe
from locvit.data import device_augment
from locvit.models.convit import convit_overrides
from locvit.models.factory import build_model
from locvit.platform import ops, sharding, xla_options
from locvit.run import state as state_lib
from locvit.run import step as step_lib

# ------------------------------------------------------------------------------------------------
# The models

# locvit name -> timm name, the models at 224.
MODELS_224 = {
  "convit_tiny": "convit_tiny",
  "convit_small": "convit_small",
  "deit_tiny": "deit_tiny_patch16_224",
  "deit_small": "deit_small_patch16_224",
}
# label -> config of a CIFAR small-data model (32x32), from the papers' configs.
MODELS_32 = {
  "ConViT-Ti CIFAR": lambda: convit_cifar10_small.get_config("convit"),
  "GMM-ViT d9": lambda: gmm_table1.get_config("vit,cifar10,gmm"),
  "ViT d9": lambda: gmm_table1.get_config("vit,cifar10,base"),
  "StructInit ViT-T/2": lambda: structinit_table1.get_config(None),
  "GMM-ViT d6 (GMM masks)": lambda: gmm_cifar10_small.get_config("gmm"),
  "StructViT d8 (struct. init)": lambda: structinit_cifar10_small.get_config(None),
}
NUM_CLASSES = 1000  # the models at 224
# --smoke: two blocks per model (one GPSA, one MHSA for ConViT), so compilation stays short.
SMOKE_DEPTH = 2


def config_224(name: str, batch_size: int, smoke: bool):
  """The DeiT recipe for the 224 model ``name`` (bf16 compute; fp32 and two blocks if smoke)."""
  config = deit_recipe(base_config())
  config.model.name = name
  config.batch_size = batch_size
  config.mixed_precision = not smoke
  if smoke:
    shrink(config)
  return config


def config_32(label: str, batch_size: int, smoke: bool):
  """The paper config of ``MODELS_32[label]`` (bf16 compute; fp32 and two blocks if smoke)."""
  config = MODELS_32[label]()
  config.batch_size = batch_size
  config.mixed_precision = not smoke
  if smoke:
    shrink(config)
  return config


def shrink(config) -> None:
  """Cuts the model to ``SMOKE_DEPTH`` blocks, keeping its first layer kind (GPSA, GMM...)."""
  overrides = config.model.overrides
  if config.model.name.startswith("convit"):
    overrides.update(convit_overrides(1, SMOKE_DEPTH))
    return
  layers = getattr(build_model(config, 10), "layer_attention", None)  # the registered kinds
  overrides.depth = SMOKE_DEPTH
  if layers:
    overrides.layer_attention = tuple(layers[: SMOKE_DEPTH - 1]) + tuple(layers[-1:])


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, channels: int = 3) -> dict:
  """A float batch of normal noise and uniform labels, the same for every call (seed 0)."""
  rng = np.random.default_rng(0)
  shape = (batch_size, image_size, image_size, channels)
  return {
    "image": jax.numpy.asarray(rng.normal(size=shape), jax.numpy.float32),
    "label": jax.numpy.asarray(rng.integers(0, num_classes, batch_size), jax.numpy.int32),
  }


def deit_jpeg_folder(cifar_root: str, count: int, out: Path, size=(341, 256)) -> Path:
  """``count`` CIFAR-10 training images (spread over the classes) as ``size`` (width, height)
  quality-90 JPEGs under ``out/train``, written by a thread pool: a resized-ImageNet-like
  decode."""
  files = sorted(Path(cifar_root, "train").glob("*/*.*"))

  def write(file: Path) -> None:
    folder = out / "train" / file.parent.name
    folder.mkdir(parents=True, exist_ok=True)
    image = Image.open(file).convert("RGB").resize(size, Image.Resampling.BICUBIC)
    image.save(folder / f"{file.stem}.jpg", quality=90)

  with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
    list(pool.map(write, files[:: max(1, len(files) // count)][:count]))
  return out


# ------------------------------------------------------------------------------------------------
# The state and the step, built by the library


@dataclasses.dataclass(frozen=True)
class Parts:
  """What a training step of ``config`` needs, built as ``locvit.run.bundle`` builds it for a run,
  without data: the model, the schedule and optimizer, and the state's layout over ``mesh``."""

  config: Any
  num_classes: int
  image_shape: tuple[int, int, int]
  model: nn.Module
  schedule: Callable
  tx: Any
  mesh: jax.sharding.Mesh
  rules: Any
  layout: state_lib.StateLayout

  def step_kwargs(self, platform: str | None = None) -> dict:
    """The keyword arguments of ``train_step`` / ``guarded_steps`` for these parts; ``platform``:
    a compile-only device's, else the default backend's."""
    return step_lib.step_arguments(self, platform=platform or jax.default_backend())

  def init(self, seed: int = 0):
    """A fresh state (``layout.init``), laid out as the training loop lays it out."""
    init = jax.jit(self.layout.init, out_shardings=self.layout.shardings)
    return init(jax.random.key(seed))

  @property
  def batch_sharding(self) -> jax.sharding.NamedSharding:
    return sharding.batch_sharding(self.mesh, self.rules)


def parts(config, image_shape, num_classes: int, devices=None, model=None) -> Parts:
  """``Parts`` of ``config`` (completed with the defaults) over the mesh of ``config.mesh`` on
  ``devices`` (all by default); ``model`` replaces the config's. The schedule spans 1,000 steps
  of 100 per epoch."""
  config = complete_config(config)
  mesh = sharding.make_mesh(config.mesh, devices)
  rules = sharding.logical_rules(config.mesh)
  model = model or build_model(config, num_classes)
  boxed_params, _ = sharding.model_variable_shapes(model, image_shape)
  schedule = optim.make_schedule(config, 1000, 100)
  tx = optim.make_optimizer(config, nn.meta.unbox(boxed_params), schedule)
  ema = state_lib.ema_enabled(config)
  layout = state_lib.state_layout(model, image_shape, tx, mesh, rules, ema=ema)
  return Parts(config, num_classes, tuple(image_shape), model, schedule, tx, mesh, rules, layout)


def state_and_step(
  config, image_shape: tuple, num_classes: int, state=None, loop=False, platform=None, donate=True
):
  """``(state, jitted step)`` for ``config`` on one device: ``train_step(state, batch)``, or
  with ``loop`` the training loop's step (``guarded_steps(state, batches, (), health)``: the
  non-finite guard, ``config.steps_per_dispatch`` batches per call); a given ``state`` (of the
  same model) is reused rather than initialised. ``platform``: a compile-only device's.
  ``donate``: the state (and the health) donated, as the training loop does."""
  built = parts(config, image_shape, num_classes, devices=jax.devices()[:1])
  state = built.init() if state is None else state
  kwargs = built.step_kwargs(platform)
  if loop:
    step = functools.partial(step_lib.guarded_steps, **kwargs)
    return state, jax.jit(step, donate_argnums=(0, 3) if donate else ())
  step = functools.partial(step_lib.train_step, **kwargs)
  return state, jax.jit(step, donate_argnums=0 if donate else ())


def sharded_step(built: Parts):
  """``train_step(state, batch)`` jitted over ``built``'s mesh, with the state's and the batch's
  shardings, the state donated; call it (and ``built.init``) inside the mesh and its rules."""
  shardings = built.layout.shardings
  return jax.jit(
    functools.partial(step_lib.train_step, **built.step_kwargs()),
    in_shardings=(shardings, built.batch_sharding),
    out_shardings=(shardings, None),
    donate_argnums=0,
  )


# ------------------------------------------------------------------------------------------------
# The training loop's step under a benchmark's settings

# locvit's settings, timed side by side (``accelerator.py --variants``): name -> config fields,
# with ``xla_options`` (``locvit.platform.xla_options``) going to the step's compilation.
VARIANTS = {
  "default": {},
  "cudnn": {"attention_implementation": "cudnn"},
  "gpu_tuned": {"xla_options": "gpu_tuned"},
  "graphs": {"xla_options": "gpu_graphs"},  # gpu_tuned with loops and conditionals in the graphs
  "tuned+cudnn": {"xla_options": "gpu_tuned", "attention_implementation": "cudnn"},
  "fp32": {"mixed_precision": False},
  "k4": {"steps_per_dispatch": 4},  # four optimizer steps per dispatch (a lax.scan)
  "flat_opt": {"optimizer": {"flatten": True}},  # the update on one flat vector (optax.flatten)
  # Mixup/CutMix's lam drawn as before, by jax.random.beta: rejection loops whose every test of
  # their condition the GPU answers to the host (locvit draws it with no loop: symmetric_beta).
  "beta_loops": {},
  # The step compiled for XLA:GPU with its dense layers' biases added after the matmuls (and
  # stochastic depth after them), as before ops.bias_in_matmul: what the ones columns gain.
  "bias_add": {},
  # The work timm's side does (model, label-smoothed loss, AdamW): the recipe's Mixup/CutMix and
  # random erasing off, which the default step runs on the device and timm's side leaves out.
  "model_only": {
    "mixup": {"mixup_alpha": 0.0, "cutmix_alpha": 0.0},
    "random_erasing": {"prob": 0.0},
  },
}
# Compiling for a GPU that is not attached, XLA cannot autotune its Triton GEMMs, and for some
# shapes finds no tiling at all (ViT d9's 8320x192 projection): cuBLAS takes every GEMM.
DEVICELESS_GPU_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


@dataclasses.dataclass
class CompiledStep:
  """The training loop's step compiled for one row and variant, with its arguments."""

  compiled: Any  # jax.stages.Compiled: (state, batches, (), health) -> (state, metrics, health)
  state: Any
  batches: list
  health: dict
  steps_per_call: int


def compile_loop_step(
  config, image_size: int, num_classes: int, variant: str, device=None
) -> CompiledStep:
  """The training loop's step for ``config`` changed by ``VARIANTS[variant]``, compiled with the
  variant's XLA options, and its arguments: a resident synthetic batch (``steps_per_dispatch``
  times over for K steps a call).

  ``device``: a compile-only device (``jax.experimental.topologies``: XLA's compilation for a
  chip that is not attached), for which the step is compiled from its arguments' shapes alone
  with the kernel setting JAX would choose there (``set_for_device``). Such a step can be read
  (``compiled.as_text()``), not run."""
  fields = dict(VARIANTS[variant])
  setting = fields.pop("xla_options", "none")
  config = complete_config(config)  # a copy, with every field (steps_per_dispatch...)
  config.update(fields)
  platform = set_for_device(config, device)
  state, step = state_and_step(
    config, (image_size, image_size, 3), num_classes, loop=True, platform=platform
  )
  k = config.steps_per_dispatch
  batches = [synthetic_batch(config.batch_size, image_size, num_classes)] * k
  health = step_lib.initial_health()
  args = (state, batches, (), health)
  with tracing(variant):
    compiled = compile_on(step, args, setting, device)
  return CompiledStep(compiled, state, batches, health, k)


def set_for_device(config, device=None) -> str | None:
  """Sets in ``config`` (completed) the kernel setting JAX would choose on a compile-only
  ``device`` (``attention_implementation=None`` is 'xla' off the CPU; the host's backend would
  resolve None to the CPU's) and returns the step's platform: the device's, or None (the host's)
  without one."""
  if device is None:
    return None
  if config.attention_implementation is None:
    config.attention_implementation = "xla"
  return device.platform


def compile_on(step, args: tuple, setting: str, device=None):
  """The jitted ``step`` lowered for ``args`` and compiled with the XLA options of ``setting``
  (``locvit.platform.xla_options``) for this host's backend, or for a compile-only ``device``
  from the arguments' shapes alone (on a GPU with ``DEVICELESS_GPU_OPTIONS``)."""
  if device is None:
    return step.lower(*args).compile(xla_options.compiler_options(setting, jax.default_backend()))
  place = jax.sharding.SingleDeviceSharding(device)
  args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=place), args)
  options = xla_options.compiler_options(setting, device.platform)
  if device.platform == "gpu":
    options |= DEVICELESS_GPU_OPTIONS
  return step.lower(*args).compile(options)


_TRACING = threading.Lock()  # sides compile in threads; one traces at a time (see tracing)


@contextlib.contextmanager
def tracing(variant: str):
  """One side's tracing at a time; for 'beta_loops' with the mixing's lam drawn by
  ``jax.random.beta``, as locvit drew it before ``device_augment.symmetric_beta``; for
  'bias_add' with the biases outside the matmuls (``ops.bias_in_matmul()`` False)."""
  with _TRACING:
    patches = []
    if variant == "beta_loops":
      beta = lambda key, alpha, shape: jax.random.beta(key, alpha, alpha, shape)
      patches.append((device_augment, "symmetric_beta", beta))
    if variant == "bias_add":
      fusions = ops.training_step_fusions
      plain = lambda **options: fusions(**{**options, "bias_in_matmul": False})
      patches.append((ops, "training_step_fusions", plain))
    originals = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, replacement in patches:
      setattr(module, name, replacement)
    try:
      yield
    finally:
      for module, name, original in originals:
        setattr(module, name, original)


# ------------------------------------------------------------------------------------------------
# Timing


@dataclasses.dataclass
class Runner:
  """One side of a comparison: ``run()`` dispatches, ``wait()`` blocks until the last is done."""

  run: Callable[[], None]
  wait: Callable[[], None]
  compile_s: float | None = None
  profile: bool = False  # locvit's steps are profiled under accelerator.py --profile
  steps_per_call: int = 1  # optimizer steps one run() dispatches
  listed_kernels: str = "-"  # the compiled step's kernels (listed_kernels)


def step_runner(step: CompiledStep, compile_s: float | None = None) -> Runner:
  """Dispatches ``step`` on its resident batch, calls back to back, as the training loop does
  (no per-step transfer)."""
  compiled, batches, k = step.compiled, step.batches, step.steps_per_call
  holder = {"state": step.state, "metrics": None, "health": step.health}

  def run():
    holder["state"], holder["metrics"], holder["health"] = compiled(
      holder["state"], batches, (), holder["health"]
    )

  def wait():
    jax.block_until_ready((holder["state"], holder["metrics"]))

  listed = listed_kernels(compiled.as_text())
  return Runner(run, wait, compile_s, profile=True, steps_per_call=k, listed_kernels=listed)


def time_interleaved(runners: dict, steps: int, rounds: int, warmup: int) -> dict:
  """Median seconds per step of each runner; runners alternate round by round. A round
  dispatches ``steps`` calls back to back and waits for the last."""
  for runner in runners.values():
    for _ in range(warmup):
      runner.run()
    runner.wait()
  per_round = {name: [] for name in runners}
  for _ in range(rounds):
    for name, runner in runners.items():
      t0 = time.perf_counter()
      for _ in range(steps):
        runner.run()
      runner.wait()
      per_round[name].append((time.perf_counter() - t0) / (steps * runner.steps_per_call))
  return {name: statistics.median(times) for name, times in per_round.items()}


# ------------------------------------------------------------------------------------------------
# Kernels of a compiled step, from its optimised HLO text

# Entry instructions that are not kernels.
NOT_KERNELS = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")
STEP_FILE = "locvit/run/step.py"
OPTIMIZER, OTHER = "optimizer update", "other"
NO_SOURCE = "no source (XLA's own)"
# (category, fragments of the source line in STEP_FILE's train_step); the first match wins.
TRAIN_STEP_LINES = (
  (OPTIMIZER, ("tx.update", "apply_updates")),
  ("weight EMA", ("ema_update",)),
  ("metrics", ("train/", "schedule(")),
  ("input (augment, random keys)", ("device_augment", "fold_in", "teacher")),
)
CATEGORIES = (
  "model forward",
  "model backward",
  OPTIMIZER,
  "weight EMA",
  "metrics",
  "input (augment, random keys)",
  "non-finite guard, loop",
  OTHER,
  NO_SOURCE,
)
LOOP_BODIES = "in loop bodies (per iteration)"
GPU_TARGETS = Path(__file__).resolve().parent / "gpu_targets"
_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT )?%(?P<name>\S+) = (?P<result>.*?) (?P<opcode>[a-z][\w-]*)\((?P<operands>[^)]*)\)"
)
_OPERAND = re.compile(r"%([\w.-]+)")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*)\[([\d,]*)\]")


def _section(hlo: str, name: str) -> dict[int, str]:
  match = re.search(rf"^{name}\n((?:\d+ .*\n?)+)", hlo, re.M)
  lines = match.group(1).splitlines() if match else []
  return {int(line.split(" ", 1)[0]): line.split(" ", 1)[1] for line in lines}


def stacks(hlo: str) -> dict[int, list[tuple[str, str, int]]]:
  """``stack_frame_id`` -> its ``(file, function, line)`` frames, innermost first."""
  files = {k: v.strip('"') for k, v in _section(hlo, "FileNames").items()}
  functions = {k: v.strip('"') for k, v in _section(hlo, "FunctionNames").items()}
  fields = lambda text: {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", text)}
  locations = {}
  for key, text in _section(hlo, "FileLocations").items():
    f = fields(text)
    locations[key] = (files[f["file_name_id"]], functions[f["function_name_id"]], f["line"])
  frames = {k: fields(v) for k, v in _section(hlo, "StackFrames").items()}
  # This XLA prints a frame's parent as the parent's id + 1 (so a root's is 1, its own id); an
  # XLA that prints the id itself never names a frame as its own parent.
  shift = int(any(f["parent_frame_id"] == k for k, f in frames.items()))

  def chain(frame_id: int) -> list[tuple[str, str, int]]:
    out = []
    while frame_id > 0 and frame_id in frames and len(out) < 200:
      out.append(locations[frames[frame_id]["file_location_id"]])
      frame_id = frames[frame_id]["parent_frame_id"] - shift
    return out

  return {frame_id: chain(frame_id) for frame_id in frames}


def category(op_name: str, stack: list[tuple[str, str, int]]) -> str:
  """The part of the step an instruction came from (``CATEGORIES``)."""
  backward = "transpose(" in op_name
  step_frames = [(fn, line) for file, fn, line in stack if file.endswith(STEP_FILE)]
  if not step_frames:  # its op_name alone
    if not op_name:
      return NO_SOURCE
    return ("model backward" if backward else "model forward") if "jvp(" in op_name else OTHER
  function, line = step_frames[0]
  if function == "loss_and_metrics":
    return "model backward" if backward else "model forward"
  if function == "ema_update":
    return "weight EMA"
  if function.startswith("guarded_step"):
    return "non-finite guard, loop"
  path = next(file for file, *_ in stack if file.endswith(STEP_FILE))
  text = linecache.getline(path, line)
  return next((name for name, keys in TRAIN_STEP_LINES if any(k in text for k in keys)), OTHER)


def computations(hlo: str) -> dict[str, list[str]]:
  """The optimised HLO text's computations: name -> instruction lines; the entry's is 'ENTRY'."""
  out = {}
  for match in re.finditer(r"^(ENTRY )?%(\S+) .*\{\n((?:.*\n)*?)\}$", hlo, re.M):
    out["ENTRY" if match.group(1) else match.group(2)] = match.group(3).splitlines()
  return out


def array_bytes(shapes: str) -> int:
  """Bytes of the arrays an HLO shape text names (``bf16[128,64]{1,0}``, tuples of them)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shapes):
    bits = int(re.sub(r"\D", "", dtype) or 8)  # pred: a byte
    total += math.prod(int(d) for d in dims.split(",") if d) * bits // 8
  return total


def kernel_counts(hlo: str) -> collections.Counter:
  """Kernel-like instructions of ``hlo``'s (optimised HLO text) entry computation, by
  ``category``, the kernels of its ``call``s included; also by opcode under the key
  ``('opcode', NAME)``, the kernels of ``while`` bodies under ``LOOP_BODIES``, and the bytes of
  each kernel's operands and results (each counted once: what it moves if it reads every operand
  and writes every result once) under ``('bytes', CATEGORY)``."""
  frames = stacks(hlo)
  bodies = computations(hlo)
  counts = collections.Counter()

  def count(name: str, key: str | None) -> None:
    sizes = {}  # instruction -> its result's bytes, in this computation
    for line in bodies.get(name, ()):
      match = _INSTRUCTION.match(line)
      if not match:
        continue
      result, opcode, operands = match.group("result", "opcode", "operands")
      sizes[match.group("name")] = array_bytes(result)
      if opcode in NOT_KERNELS:
        continue
      called = re.search(r"to_apply=%([\w.-]+)", line)
      if opcode == "call" and called:
        count(called.group(1), key)
        continue
      op_name = re.search(r'op_name="([^"]*)"', line)
      frame = re.search(r"stack_frame_id=(\d+)", line)
      stack = frames.get(int(frame.group(1)), []) if frame else []
      part = key or category(op_name.group(1) if op_name else "", stack)
      counts[part] += 1
      counts[("opcode", opcode)] += key is None
      moved = sizes[match.group("name")] + sum(sizes.get(x, 0) for x in _OPERAND.findall(operands))
      counts[("bytes", part)] += moved
      if opcode == "while":
        for part in ("condition", "body"):
          count(re.search(rf"{part}=%([\w.-]+)", line).group(1), LOOP_BODIES)

  count("ENTRY", None)
  return counts


def total_kernels(counts: collections.Counter) -> int:
  """The kernels ``kernel_counts`` found outside loop bodies."""
  return sum(counts[name] for name in CATEGORIES)


def gigabytes(counts: collections.Counter) -> float:
  """The bytes ``kernel_counts`` found the step's kernels to move (its loops' bodies once)."""
  return sum(n for k, n in counts.items() if isinstance(k, tuple) and k[0] == "bytes") / 1e9


def listed_kernels(hlo: str) -> str:
  """The kernels an optimised HLO lists, ``'N'``, or ``'N+M'`` with M in a pass of its loops'
  bodies: what a profile's count of kernels per step is compared with."""
  counts = kernel_counts(hlo)
  outside = total_kernels(counts)
  return f"{outside}+{counts[LOOP_BODIES]}" if counts[LOOP_BODIES] else str(outside)


def compile_only_gpu(name: str):
  """A compile-only device for the GPU described in ``GPU_TARGETS/NAME.txtpb``; exits with the
  install line when jax's CUDA plugin is missing. Call it before the first JAX computation: the
  plugin checks the CUDA libraries it would run with, and compiling needs none of them."""
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  if not jax.config.jax_platforms:  # the host's computations stay on its CPU
    jax.config.update("jax_platforms", "cpu")
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc(
      name, "cuda", target_config=(GPU_TARGETS / f"{name}.txtpb").read_text(), topology="1x1x1"
    )
  except NotImplementedError:
    sys.exit(
      f"{Path(sys.argv[0]).name}: error: --gpu needs jax's CUDA plugin, which is not installed:"
      f" pip install jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__}"
    )
  return topology.devices[0]
