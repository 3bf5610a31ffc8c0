"""Training throughput and MFU on whatever accelerator JAX sees, with timm's models beside locvit's.

  python benchmarks/accelerator.py [--data_root=CIFAR10_ROOT] [--steps=20] [--rounds=3]
  python benchmarks/accelerator.py --smoke        # the same code on CPU at toy sizes (CI)

Three tables, one run, one device (``jax.devices()[0]``):

1. Synthetic batch, resident on the device. For ConViT-Ti/S and DeiT-Ti/S at 224 (bf16 compute,
   fp32 parameters: ``config.mixed_precision``, the DeiT recipe, batch ``--batch_size``) and the
   CIFAR small-data models at 32 (their paper configs, batch ``--small_batch_size``): step time,
   images/s and MFU. MFU = the compiled step's FLOPs (XLA's ``cost_analysis()``: forward,
   backward and optimizer) / step time / the chip's dense bf16 peak (the table printed first;
   ``--peak_tflops`` overrides it). Where ``torch`` and ``timm`` import, timm's same model
   (``timm.create_model``, bf16 autocast on CUDA, AdamW, label smoothing 0.1) is timed in the
   same run, interleaved with locvit's round by round, and the ratio printed.
2. Real pipeline: each CIFAR model trains from the CIFAR-10 JPEG folders (``--data_root`` or
   ``$CIFAR10_ROOT``, ``ROOT/train/<class>/*.jpg``) through ``locvit.data`` with its recipe's
   augmentation, for ``--pipeline_steps`` steps after compilation. It reports whole-run images/s
   and how often the step waited for data: a step waited when its batch arrived after the
   previous step had already finished on the device (the device sat idle).
3. DeiT-Ti with the DeiT recipe at 224 (random-resized crop, flip, RandAugment, repeated
   augmentation) from ``--jpeg_images`` CIFAR-10 images stored as 341x256 JPEGs, each read
   decoded again (the first epoch's cost), from one process's threads (one per core) and from
   grain worker processes (``data.num_workers``): whole-run images/s and waits, with the
   augmentation on the host and on the device (``--augment_on``).

``--only=FRAGMENT,...`` keeps the rows whose label contains a fragment (e.g. ``ViT d9``).

``--smoke``: CPU, image 32 for the 224 models, two blocks per model, batch 2, two steps, one
round, ConViT-Ti and one CIFAR model; ``--data_root`` may be any tiny image folder. Without timm
the torch side uses ``tests/torch_reference.py`` (the official ConViT/DeiT, timm's names).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib.util
import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from device_augment import deit_jpeg_folder

from locvit import data as data_lib
from locvit import optim, sharding, train
from locvit.configs import convit_cifar10_small, gmm_cifar10_small, structinit_cifar10_small
from locvit.configs.common import base_config
from locvit.configs.recipes import deit_recipe
from locvit.models.convit import convit_overrides

# Dense bf16 peak TFLOP/s by device kind (vendor data sheets, without sparsity); the first
# fragment contained in ``device.device_kind`` wins, so more specific names come first.
PEAK_BF16_TFLOPS = (
  ("H100 PCIe", 756.0),
  ("H100 NVL", 835.0),
  ("H100", 989.4),  # SXM5 ("NVIDIA H100 80GB HBM3")
  ("H200", 989.4),
  ("GH200", 989.4),
  ("A100", 312.0),
  ("L40S", 362.0),
  ("L4", 121.0),
  ("A10G", 70.0),
  ("TPU v4", 275.0),
  ("TPU v5 lite", 197.0),  # v5e
  ("TPU v5p", 459.0),
  ("TPU v5", 459.0),
  ("TPU v6 lite", 918.0),  # v6e (Trillium)
)

# locvit name -> timm name, the models at 224.
MODELS_224 = {
  "convit_tiny": "convit_tiny",
  "convit_small": "convit_small",
  "deit_tiny": "deit_tiny_patch16_224",
  "deit_small": "deit_small_patch16_224",
}
# label -> config of a CIFAR small-data model (32x32), from the papers' configs.
MODELS_32 = {
  "ConViT-Ti CIFAR (ConViT)": lambda: convit_cifar10_small.get_config("convit"),
  "GMM-ViT (GMM masks)": lambda: gmm_cifar10_small.get_config("gmm"),
  "ViT d9 (structured init)": lambda: structinit_cifar10_small.get_config(None),
}
SMOKE_MODELS_32 = ("GMM-ViT (GMM masks)",)
# --smoke: two blocks per model (one GPSA, one MHSA for ConViT), so compilation stays short.
SMOKE_DEPTH = 2
NUM_CLASSES = 1000
FAILURES: list[str] = []  # rows that raised; the script exits 1 if any


def peak_tflops(device_kind: str) -> float | None:
  for fragment, peak in PEAK_BF16_TFLOPS:
    if fragment.lower() in device_kind.lower():
      return peak
  return None


def print_peaks(device, override: float | None) -> float | None:
  print("Dense bf16 peaks used for MFU (TFLOP/s):")
  for fragment, peak in PEAK_BF16_TFLOPS:
    print(f"  {fragment:<14} {peak:7.1f}")
  peak = override or peak_tflops(device.device_kind)
  shown = f"{peak:.1f} TFLOP/s" if peak else "unknown (MFU not computed; --peak_tflops sets it)"
  print(f"device: {device.platform} {device.device_kind!r}; peak {shown}\n")
  return peak


# ------------------------------------------------------------------------------------------------
# The two steps


def _config_224(name: str, batch_size: int, smoke: bool):
  config = deit_recipe(base_config())
  config.model.name = name
  config.batch_size = batch_size
  config.mixed_precision = not smoke
  if smoke:
    _shrink(config)
  return config


def _config_32(label: str, args):
  config = MODELS_32[label]()
  config.batch_size = args.small_batch_size
  config.mixed_precision = not args.smoke
  if args.smoke:
    _shrink(config)
  return config


def _shrink(config) -> None:
  """Cuts the model to ``SMOKE_DEPTH`` blocks, keeping its first layer kind (GPSA, GMM...)."""
  overrides = config.model.overrides
  if config.model.name.startswith("convit"):
    overrides.update(convit_overrides(1, SMOKE_DEPTH))
    return
  overrides.depth = SMOKE_DEPTH
  if "layer_attention" in overrides:
    layers = tuple(overrides.layer_attention)
    overrides.layer_attention = layers[: SMOKE_DEPTH - 1] + layers[-1:]


def _torch_sizes(name: str, smoke: bool) -> dict:
  """The torch model's keyword arguments matching ``_shrink``."""
  if not smoke:
    return {}
  return {"depth": SMOKE_DEPTH, **({"local_up_to_layer": 1} if name.startswith("convit") else {})}


def _state_and_step(config, image_shape: tuple, num_classes: int, state=None):
  """``(state, jitted step)``: ``locvit.train.train_step`` for ``config`` on one device; a given
  ``state`` (of the same model) is reused rather than initialised."""
  model = train.build_model(config, num_classes)
  if state is None:
    init = functools.partial(sharding.init_model_variables, model, image_shape)
    params, model_state = nn.meta.unbox(jax.jit(init)(jax.random.key(0)))
  else:
    params, model_state = state.params, state.model_state
  schedule = optim.make_schedule(config, 1000, 100)
  tx = optim.make_optimizer(config, params, schedule)
  if state is None:
    state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), model_state)
  step = functools.partial(
    train.train_step, model=model, tx=tx, schedule=schedule, config=config, num_classes=num_classes
  )
  return state, jax.jit(step, donate_argnums=0)


def model_flops(config, state, batch, num_classes: int) -> float:
  """FLOPs of one training step (forward, backward, optimizer): XLA's count of the lowered,
  unoptimised step with attention written out (``attention_implementation='xla'``). The compiled
  step's own count leaves out what runs as library calls (cuBLAS GEMMs, cuDNN attention on GPU:
  about a quarter of the FLOPs counted for DeiT-Ti on an H200)."""
  written_out = config.copy_and_resolve_references()
  written_out.attention_implementation = "xla"
  image_shape = batch["image"].shape[1:]
  _, step = _state_and_step(written_out, image_shape, num_classes, state)
  lowered = step.lower(state, batch)
  cost = lowered.cost_analysis()
  if cost is None:  # XLA:GPU counted nothing for the ViT d9 step's lowering: count it compiled.
    cost = lowered.compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return float((cost or {}).get("flops", float("nan")))


def _compile_step(config, image_size: int, num_classes: int):
  """``(compiled step, state, model FLOPs per step)`` on a synthetic batch."""
  state, step = _state_and_step(config, (image_size, image_size, 3), num_classes)
  batch = _synthetic_batch(config.batch_size, image_size, num_classes)
  compiled = step.lower(state, batch).compile()
  return compiled, state, model_flops(config, state, batch, num_classes)


def _synthetic_batch(batch_size: int, image_size: int, num_classes: int) -> dict:
  rng = np.random.default_rng(0)
  return {
    "image": jnp.asarray(rng.normal(size=(batch_size, image_size, image_size, 3)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, num_classes, batch_size), jnp.int32),
  }


def jax_runner(config, image_size: int, num_classes: int):
  """``(run, flops)``: ``run()`` performs one step on a resident batch and waits for it."""
  compiled, state, flops = _compile_step(config, image_size, num_classes)
  batch = _synthetic_batch(config.batch_size, image_size, num_classes)
  holder = {"state": state}

  def run():
    holder["state"], metrics = compiled(holder["state"], batch)
    jax.block_until_ready(metrics["train/loss"])

  return run, flops


def _torch_model(torch_name: str, locvit_name: str, image_size: int, **sizes):
  """timm's model; without timm (CPU smoke runs) the reference of tests/torch_reference.py."""
  try:
    import timm
  except ImportError:
    path = Path(__file__).resolve().parents[1] / "tests" / "torch_reference.py"
    if not path.exists():
      return None, None
    spec = importlib.util.spec_from_file_location("torch_reference", path)
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    model = reference.build(locvit_name, img_size=image_size, num_classes=NUM_CLASSES, **sizes)
    return model, "tests/torch_reference.py"
  model = timm.create_model(torch_name, img_size=image_size, num_classes=NUM_CLASSES, **sizes)
  return model, f"timm {timm.__version__}"


def torch_runner(torch_name: str, locvit_name: str, image_size: int, batch_size: int, **sizes):
  """``(run, source)``: one timm training step (AdamW, label smoothing 0.1) on a resident batch."""
  try:
    import torch
    import torch.nn.functional as F
  except ImportError:
    return None, "torch not importable"
  model, source = _torch_model(torch_name, locvit_name, image_size, **sizes)
  if model is None:
    return None, "neither timm nor tests/torch_reference.py importable"
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  model = model.to(device).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.05)
  images = torch.randn(batch_size, 3, image_size, image_size, device=device)
  labels = torch.randint(0, NUM_CLASSES, (batch_size,), device=device)
  # bf16 autocast where the chip has bf16 units; the CPU smoke run stays in fp32.
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

  def run():
    optimizer.zero_grad(set_to_none=True)
    with autocast:
      loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    if device == "cuda":
      torch.cuda.synchronize()

  return run, f"{source} on {device}"


def time_interleaved(runners: dict, steps: int, rounds: int, warmup: int) -> dict:
  """Median seconds per step of each runner; runners alternate round by round."""
  for run in runners.values():
    for _ in range(warmup):
      run()
  per_round = {name: [] for name in runners}
  for _ in range(rounds):
    for name, run in runners.items():
      t0 = time.perf_counter()
      for _ in range(steps):
        run()
      per_round[name].append((time.perf_counter() - t0) / steps)
  return {name: statistics.median(times) for name, times in per_round.items()}


def _mfu(flops: float, seconds: float, peak: float | None) -> str:
  if not peak or not np.isfinite(flops):
    return "n/a"
  return f"{100 * flops / seconds / (peak * 1e12):.1f}%"


def _failed(label: str, error: Exception) -> None:
  """One row's failure: named in the table, traceback on stderr; the other rows still run."""
  print(f"{label:<26} FAILED: {type(error).__name__}: {error}", flush=True)
  traceback.print_exc()
  FAILURES.append(label)


def _synthetic_row(label: str, config, image_size: int, num_classes: int, make_torch, args, peak):
  """Times locvit's step (and ``make_torch()``'s timm step, when given), prints the row."""
  t0 = time.perf_counter()
  runners = {}
  runners["locvit"], flops = jax_runner(config, image_size, num_classes)
  compile_s = time.perf_counter() - t0
  source = "no timm model"
  if make_torch:
    torch_run, source = make_torch()
    if torch_run:
      runners["torch"] = torch_run
  times = time_interleaved(runners, args.steps, args.rounds, args.warmup)
  seconds, batch = times["locvit"], config.batch_size
  torch_cols = f"{'-':>10} {'-':>11}"
  if "torch" in times:
    torch_cols = f"{batch / times['torch']:10.1f} {times['torch'] / seconds:10.2f}x"
  print(
    f"{label:<26} {image_size:>4} {batch:>5} {flops / 1e9:10.2f} {1e3 * seconds:8.2f}"
    f" {batch / seconds:9.1f} {_mfu(flops, seconds, peak):>6} {torch_cols} {compile_s:8.1f}"
    f"  {source}",
    flush=True,
  )


def _only(labels: tuple[str, ...], args) -> tuple[str, ...]:
  """The labels ``--only`` keeps (all without it)."""
  fragments = [f for f in args.only.split(",") if f]
  return tuple(x for x in labels if not fragments or any(f in x for f in fragments))


def synthetic_table(args, peak: float | None) -> None:
  precision = "fp32 (smoke)" if args.smoke else "bf16 compute"
  print(f"Table 1: synthetic resident batch, {precision}, median of {args.rounds} rounds")
  print(
    f"{'model':<26} {'size':>4} {'batch':>5} {'GFLOP/step':>10} {'step ms':>8} {'img/s':>9}"
    f" {'MFU':>6} {'timm img/s':>10} {'locvit/timm':>11} {'compile s':>8}  torch side",
    flush=True,
  )
  for name in _only(("convit_tiny",) if args.smoke else tuple(MODELS_224), args):
    config = _config_224(name, args.batch_size, args.smoke)
    make_torch = functools.partial(
      torch_runner,
      MODELS_224[name],
      name,
      args.image_size,
      args.batch_size,
      **_torch_sizes(name, args.smoke),
    )
    try:
      _synthetic_row(name, config, args.image_size, NUM_CLASSES, make_torch, args, peak)
    except Exception as error:  # one model's failure must not lose the others' rows
      _failed(name, error)
  for label in _only(SMOKE_MODELS_32 if args.smoke else tuple(MODELS_32), args):
    try:
      _synthetic_row(label, _config_32(label, args), 32, 10, None, args, peak)
    except Exception as error:
      _failed(label, error)
  print("compile s: building, lowering and compiling locvit's step (XLA), before any timing.\n")


# ------------------------------------------------------------------------------------------------
# Training from the real pipeline


def train_from_pipeline(config, source, steps: int) -> tuple[float, float, float]:
  """``(images/s, share of steps that waited for data, share of time spent fetching)``."""
  iterator = data_lib.make_train_iterator(
    config.data, source, seed=0, local_batch_size=config.batch_size
  )
  first = next(iterator)
  size = config.data.image_size  # a device random-resized crop's batch holds larger canvases
  state, step = _state_and_step(config, (size, size, first["image"].shape[-1]), source.num_classes)
  state, metrics = step(state, jax.device_put(first))  # compiles
  jax.block_until_ready(metrics)

  waited = fetching = 0.0
  t0 = time.perf_counter()
  for _ in range(steps):
    f0 = time.perf_counter()
    batch = jax.device_put(next(iterator))
    fetching += time.perf_counter() - f0
    # The previous step already done when this batch arrived: the device sat idle.
    waited += metrics["train/loss"].is_ready()
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics)
  seconds = time.perf_counter() - t0
  iterator.close()  # stops data.num_workers' processes
  return steps * config.batch_size / seconds, waited / steps, fetching / seconds


def _decoded_source(config):
  """The training split, decoded once (``data.decoded_cache_mb``) before any row is timed, so
  every row measures the steady state rather than the first epoch's JPEG decoding."""
  t0 = time.perf_counter()
  source = data_lib.make_source(config.data, config.data.train_split)
  if hasattr(source, "num_cached"):  # a DecodedCache: fills on each example's first read
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
      for _ in pool.map(source.__getitem__, range(len(source)), chunksize=256):
        pass
  print(f"{len(source)} training images read and decoded in {time.perf_counter() - t0:.1f} s")
  return source


def _pipeline_rows(columns: str, label: str, config, source, args) -> None:
  """One row per ``--augment_on`` value: ``columns``, then on, batch, img/s, waited, fetching."""
  for augment_on in args.augment_on.split(","):
    config.data.augment_on = augment_on
    try:
      images_per_s, waited, fetching = train_from_pipeline(config, source, args.pipeline_steps)
    except Exception as error:  # one row's failure must not lose the others'
      _failed(f"{label} ({augment_on})", error)
      continue
    print(
      f"{columns}{augment_on:<6} {config.batch_size:>5} {images_per_s:9.1f}"
      f" {100 * waited:6.0f}% {100 * fetching:7.0f}%",
      flush=True,
    )


def pipeline_table(args) -> None:
  root = args.data_root or os.environ.get("CIFAR10_ROOT")
  if not root:
    print("Table 2 skipped: no CIFAR-10 image folder (--data_root or $CIFAR10_ROOT).")
    return
  print(f"Table 2: training from the CIFAR-10 JPEG folders at {root}, {args.pipeline_steps} steps")
  labels = _only(SMOKE_MODELS_32 if args.smoke else tuple(MODELS_32), args)
  if not labels:
    return
  configs = {}
  for label in labels:
    configs[label] = _config_32(label, args)
    configs[label].data.root = root
    configs[label].data.train_fraction = 1.0  # each row: the whole split, its recipe's image size
  source = _decoded_source(configs[labels[0]])
  header = f"{'model':<26} {'augment':<32} {'on':<6} {'batch':>5} {'img/s':>9} {'waited':>7}"
  print(f"{header} {'fetching':>8}", flush=True)
  for label, config in configs.items():
    augment = " + ".join(filter(None, (config.data.train_augment, config.data.auto_augment)))
    _pipeline_rows(f"{label:<26} {augment:<32} ", label, config, source, args)
  print("waited: steps whose batch arrived after the previous step had finished on the device;")
  print("fetching: share of the run's wall time spent in the iterator and the host-to-device copy.")


def _jpeg_root(args, tmp: str) -> tuple[str, int]:
  """``--jpeg_images`` CIFAR-10 training images upsampled to 341x256 (at 224; scaled with
  ``--image_size``) and stored as JPEGs under ``tmp``, like a resized ImageNet copy; with the
  canvas side that carries every crop box (the longer side, rounded up to 32)."""
  scale = args.image_size / 224
  size = (round(341 * scale), round(256 * scale))
  deit_jpeg_folder(args.data_root or os.environ["CIFAR10_ROOT"], args.jpeg_images, Path(tmp), size)
  return tmp, -(-size[0] // 32) * 32


def deit_pipeline_table(args) -> None:
  if not _only(("DeiT-Ti from JPEGs",), args):
    return
  if not (args.data_root or os.environ.get("CIFAR10_ROOT")):
    print("Table 3 skipped: no CIFAR-10 image folder (--data_root or $CIFAR10_ROOT).")
    return
  cores = os.cpu_count()
  hosts = {  # name -> data fields: one process's threads, or worker processes
    f"{cores} threads": dict(num_workers=0, num_threads=cores, prefetch=cores),
    f"{max(1, cores - 1)} procs": dict(num_workers=max(1, cores - 1), num_threads=2, prefetch=2),
  }
  print(
    f"Table 3: DeiT-Ti, the DeiT recipe at {args.image_size} from {args.jpeg_images} JPEGs"
    f" (341x256 at 224), every read decoded (the first epoch's cost), {args.pipeline_steps} steps",
    flush=True,
  )
  header = f"{'host':<11} {'on':<6} {'batch':>5} {'img/s':>9} {'waited':>7} {'fetching':>8}"
  print(header, flush=True)
  with tempfile.TemporaryDirectory() as tmp:
    root, canvas = _jpeg_root(args, tmp)
    config = _config_224("deit_tiny", args.batch_size, args.smoke)
    config.data.update(
      dict(source="image_folder", root=root, image_size=args.image_size, decoded_cache_mb=0)
    )
    config.data.rrc_canvas = canvas
    source = data_lib.make_source(config.data, config.data.train_split)
    for host, fields in hosts.items():
      config.data.update(fields)
      _pipeline_rows(f"{host:<11} ", f"DeiT-Ti from JPEGs, {host}", config, source, args)
  print("procs: data.num_workers grain worker processes with 2 threads each. device: the host")
  print("decodes and cuts the crop box; resize, flip and RandAugment run in the step.\n")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--smoke", action="store_true", help="CPU, toy sizes, under a minute")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--batch_size", type=int, default=128, help="for the 224 models")
  parser.add_argument("--small_batch_size", type=int, default=512, help="for the 32 models")
  parser.add_argument("--steps", type=int, default=20, help="timed steps per model per round")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--warmup", type=int, default=3, help="untimed steps per model first")
  parser.add_argument("--pipeline_steps", type=int, default=200)
  parser.add_argument("--data_root", default="", help="CIFAR-10 image folder ($CIFAR10_ROOT)")
  parser.add_argument("--tables", default="1,2,3", help="which tables to run, e.g. 1,3")
  parser.add_argument(
    "--only", default="", help="comma-separated fragments: run only the rows whose label has one"
  )
  parser.add_argument("--jpeg_images", type=int, default=4096, help="Table 3's JPEG count")
  parser.add_argument(
    "--augment_on", default="host,device", help="Table 2's rows: data.augment_on values"
  )
  parser.add_argument("--peak_tflops", type=float, default=None, help="override the peak table")
  args = parser.parse_args()
  if args.smoke:
    jax.config.update("jax_platforms", "cpu")
    args.image_size, args.batch_size, args.small_batch_size = 32, 2, 4
    args.steps, args.rounds, args.warmup, args.pipeline_steps = 2, 1, 1, 3
    args.jpeg_images = 8
  peak = print_peaks(jax.devices()[0], args.peak_tflops)
  if "1" in args.tables.split(","):
    synthetic_table(args, peak)
  if "2" in args.tables.split(","):
    pipeline_table(args)
  if "3" in args.tables.split(","):
    deit_pipeline_table(args)
  if FAILURES:
    raise SystemExit(f"{len(FAILURES)} rows failed: {', '.join(FAILURES)}")


if __name__ == "__main__":
  main()
