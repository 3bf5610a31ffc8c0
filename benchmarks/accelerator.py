"""Training throughput and MFU on whatever accelerator JAX sees, with timm's models beside locvit's.

  python benchmarks/accelerator.py [--data_root=CIFAR10_ROOT] [--steps=20] [--rounds=3]
  python benchmarks/accelerator.py --tables=1 --variants=default,gpu_tuned,cudnn --profile=5
  python benchmarks/accelerator.py --smoke        # the same code on CPU at toy sizes (CI)
  bash benchmarks/kit_gpu.sh                      # issue 29's GPU run, about 10 minutes

Three tables, one run, one device (``jax.devices()[0]``):

1. Synthetic batch, resident on the device, ``ROWS_224`` and ``ROWS_32``: ConViT-Ti/S and
   DeiT-Ti/S at 224 (bf16 compute, fp32 parameters: ``config.mixed_precision``, the DeiT recipe)
   at batch 128, DeiT-S and ConViT-S also at 256 and 512, and the CIFAR small-data models at 32
   at their papers' batch sizes. Per row, side by side and interleaved round by round: locvit's
   step under each ``--variants`` setting (``VARIANTS``: the default, XLA's ``gpu_tuned`` and
   ``gpu_graphs`` compiler options of ``locvit.platform.xla_options``, cuDNN attention, fp32, K
   steps per dispatch, the flat optimizer, the old lam draw, ``model_only``: the work timm's side
   does) and, where ``torch`` imports and timm has the model, timm's same model
   (``timm.create_model``, bf16 autocast on CUDA, AdamW, label smoothing 0.1) eager and under
   ``torch.compile`` (``--torch``). Each side
   dispatches ``--steps`` steps back to back and waits for the last (as a training loop does):
   step time, images/s, MFU and the step time against locvit's default. MFU = model FLOPs
   (XLA's count of the lowered step, ``model_flops``) / step time / the chip's dense bf16 peak
   (the table printed first; ``--peak_tflops`` overrides it). ``--profile=N`` then traces N
   steps of each locvit side with ``jax.profiler`` (Table 1p, ``step_profile``): device ops per
   step, busy time against wall time, the time between ops, host dispatch, the top ops.
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

``--only=FRAGMENT,...`` keeps the rows whose label and batch (``deit_small b256``) contain a
fragment (e.g. ``ViT d9``, ``b512``).

``--smoke``: CPU, image 32 for the 224 models, two blocks per model, batches scaled down 64
times (at least 2), two steps, one round, ConViT-Ti and GMM-ViT d9; ``--data_root`` may be any
tiny image folder. Without timm the torch side uses ``benchmarks/torch_reference.py`` (the official
ConViT/DeiT, timm's names), and ``torch.compile`` uses the 'aot_eager' backend (inductor's C++
code generation takes minutes on a small CPU). cuDNN attention needs a CUDA GPU: elsewhere its
sides print why they were skipped; so do they on a GPU for a row whose shapes cuDNN's fused
attention cannot train (``locvit.models.factory.check_attention_kernels``: e.g. ViT d9's 65
tokens), with locvit's one-line reason instead of JAX's traceback.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import flax
import jax
import jaxlib
import numpy as np
import step_profile
from kit import (
  MODELS_224,
  NUM_CLASSES,
  SMOKE_DEPTH,
  VARIANTS,
  Runner,
  compile_loop_step,
  config_32,
  config_224,
  deit_jpeg_folder,
  state_and_step,
  step_runner,
  synthetic_batch,
  time_interleaved,
  tracing,
)

from locvit import data as data_lib
from locvit.configs.common import complete_config
from locvit.models.factory import build_model, check_attention_kernels
from locvit.platform.flops import xla_flops

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

# Table 1's rows, (model, batch): the 224 models at 128 (the kit's first H200 table) and DeiT-S /
# ConViT-S at 256 and 512; the CIFAR models at their papers' batches (GMM: 128, structured init:
# 512, ConViT-Ti CIFAR at both) and the two reduced configs of the first table at 512.
ROWS_224 = (
  ("convit_tiny", 128),
  ("convit_small", 128),
  ("deit_tiny", 128),
  ("deit_small", 128),
  ("deit_small", 256),
  ("convit_small", 256),
  ("deit_small", 512),
  ("convit_small", 512),
)
ROWS_32 = (
  ("ConViT-Ti CIFAR", 512),
  ("ConViT-Ti CIFAR", 128),
  ("GMM-ViT d9", 128),
  ("ViT d9", 128),
  ("StructInit ViT-T/2", 512),
  ("GMM-ViT d6 (GMM masks)", 512),
  ("StructViT d8 (struct. init)", 512),
)
SMOKE_ROWS_224 = (("convit_tiny", 128),)
SMOKE_ROWS_32 = (("GMM-ViT d9", 128),)
PIPELINE_32 = ("ConViT-Ti CIFAR", "GMM-ViT d6 (GMM masks)", "StructViT d8 (struct. init)")
SMOKE_PIPELINE_32 = ("GMM-ViT d6 (GMM masks)",)
TORCH_SIDES = ("eager", "compile")
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
  print(f"device: {device.platform} {device.device_kind!r}; peak {shown}")
  versions = [f"jax {jax.__version__}", f"jaxlib {jaxlib.__version__}", f"flax {flax.__version__}"]
  for name in ("torch", "timm"):
    try:
      versions.append(f"{name} {importlib.import_module(name).__version__}")
    except ImportError:
      versions.append(f"{name} absent")
  print(", ".join(versions) + "\n")
  return peak


# ------------------------------------------------------------------------------------------------
# The steps


def _torch_sizes(name: str, smoke: bool) -> dict:
  """The torch model's keyword arguments matching ``_shrink``."""
  if not smoke:
    return {}
  return {"depth": SMOKE_DEPTH, **({"local_up_to_layer": 1} if name.startswith("convit") else {})}


def model_flops(config, state, batch, num_classes: int) -> float:
  """FLOPs of one training step (forward, backward, optimizer): XLA's count of the lowered,
  unoptimised step with attention written out (``attention_implementation='xla'``), by
  ``locvit.platform.flops.xla_flops``; NaN where XLA counts nothing. The compiled step's own count
  leaves out what runs as library calls (cuBLAS GEMMs, cuDNN attention on GPU: about a quarter of
  the FLOPs counted for DeiT-Ti on an H200), yet it is the count where the lowering has none
  (XLA:GPU, for the ViT d9 step)."""
  written_out = config.copy_and_resolve_references()
  written_out.attention_implementation = "xla"
  image_shape = batch["image"].shape[1:]
  _, step = state_and_step(written_out, image_shape, num_classes, state)
  with tracing("default"):
    lowered = step.lower(state, batch)
  return xla_flops(lowered)


def jax_runner(config, image_size: int, num_classes: int, variant: str) -> Runner:
  """``compile_loop_step``'s step as a Runner; its compile s include building the state."""
  t0 = time.perf_counter()
  step = compile_loop_step(config, image_size, num_classes, variant)
  return step_runner(step, time.perf_counter() - t0)


def variant_skipped(variant: str, row) -> str | None:
  """Why ``variant`` cannot run ``row`` on this device, or None: cuDNN attention off a GPU, or
  on shapes its fused attention cannot train (``cudnn_refusal``)."""
  if "cudnn" not in variant:
    return None
  if jax.default_backend() != "gpu":
    return "cuDNN attention needs a CUDA GPU (JAX checks for cuDNN when it traces the step)"
  return cudnn_refusal(row.config, row.image_size, row.num_classes)


def cudnn_refusal(config, image_size: int, num_classes: int) -> str | None:
  """locvit's check of ``config``'s model under cuDNN attention, before compiling (any host):
  the first shape cuDNN's fused attention cannot train, as one line, or None."""
  config = complete_config(config)
  config.update(VARIANTS["cudnn"])
  model = build_model(config, num_classes)
  try:
    check_attention_kernels(model, (image_size, image_size, 3))
  except ValueError as error:
    return str(error)
  return None


def _torch_model(torch_name: str, locvit_name: str, image_size: int, **sizes):
  """timm's model; without timm (CPU smoke runs) the reference of benchmarks/torch_reference.py."""
  try:
    import timm
  except ImportError:
    import torch_reference

    model = torch_reference.build(
      locvit_name, img_size=image_size, num_classes=NUM_CLASSES, **sizes
    )
    return model, "benchmarks/torch_reference.py"
  model = timm.create_model(torch_name, img_size=image_size, num_classes=NUM_CLASSES, **sizes)
  return model, f"timm {timm.__version__}"


def torch_runner(side: str, row, args) -> tuple[Runner | None, str]:
  """``(runner, source)``: one timm training step (AdamW, label smoothing 0.1) on a resident
  batch, eager or through ``torch.compile`` (the model's forward and backward; ``side``); the
  first step runs here (for 'compile': its compilation, reported as compile s)."""
  try:
    import torch
    import torch.nn.functional as F
  except ImportError:
    return None, "torch not importable"
  sizes = _torch_sizes(row.name, args.smoke)
  model, source = _torch_model(MODELS_224[row.name], row.name, row.image_size, **sizes)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(0)
  model = model.to(device).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-8, weight_decay=0.05)
  images = torch.randn(row.batch, 3, row.image_size, row.image_size, device=device)
  labels = torch.randint(0, NUM_CLASSES, (row.batch,), device=device)
  # bf16 autocast where the chip has bf16 units; the CPU smoke run stays in fp32.
  autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")
  forward = model
  if side == "compile":
    forward = torch.compile(model, backend=args.torch_compile_backend)
    source += f", torch.compile(backend={args.torch_compile_backend!r})"

  def run():
    optimizer.zero_grad(set_to_none=True)
    with autocast:
      loss = F.cross_entropy(forward(images), labels, label_smoothing=0.1)
    loss.backward()
    optimizer.step()

  def wait():
    if device == "cuda":
      torch.cuda.synchronize()

  t0 = time.perf_counter()
  run()
  wait()
  compile_s = time.perf_counter() - t0 if side == "compile" else None
  return Runner(run, wait, compile_s), f"{source} on {device}"


def _mfu(flops: float, seconds: float, peak: float | None) -> str:
  if not peak or not np.isfinite(flops):
    return "n/a"
  return f"{100 * flops / seconds / (peak * 1e12):.1f}%"


def _failed(label: str, error: Exception) -> None:
  """One row's failure: named in the table, traceback on stderr; the other rows still run."""
  print(f"{label:<28} FAILED: {type(error).__name__}: {error}", flush=True)
  traceback.print_exception(error)
  FAILURES.append(label)


@dataclasses.dataclass
class Row:
  """A Table 1 row: one model at one batch size, every runner of it side by side."""

  label: str
  name: str  # the locvit model (224) or the MODELS_32 label
  config: Any
  image_size: int
  batch: int
  num_classes: int
  timm: bool  # whether timm has the model

  @property
  def key(self) -> str:  # what --only matches
    return f"{self.label} b{self.batch}"


def _rows(args) -> list[Row]:
  rows = []
  scale = (lambda batch: max(2, batch // 64)) if args.smoke else (lambda batch: batch)
  for name, batch in SMOKE_ROWS_224 if args.smoke else ROWS_224:
    config = config_224(name, scale(batch), args.smoke)
    rows.append(Row(name, name, config, args.image_size, scale(batch), NUM_CLASSES, True))
  for label, batch in SMOKE_ROWS_32 if args.smoke else ROWS_32:
    config = config_32(label, scale(batch), args.smoke)
    rows.append(Row(label, label, config, 32, scale(batch), 10, False))
  return [row for row in rows if row.key in _only((row.key,), args)]


def _prepare(row: Row, args) -> tuple[float, dict]:
  """``(model FLOPs per step, variant -> Runner, or why it was skipped or failed)``: compiles."""
  batch = synthetic_batch(row.batch, row.image_size, row.num_classes)
  shape = (row.image_size, row.image_size, 3)
  state, _ = state_and_step(row.config, shape, row.num_classes)
  flops = model_flops(row.config, state, batch, row.num_classes)
  del state
  runners = {}
  for variant in args.variants.split(","):
    skipped = variant_skipped(variant, row)
    if skipped:
      runners[variant] = f"skipped, {skipped}"
      continue
    try:
      runners[variant] = jax_runner(row.config, row.image_size, row.num_classes, variant)
    except Exception as error:  # one setting's failure (cuDNN refusing a shape...) keeps the row
      traceback.print_exception(error)
      FAILURES.append(f"{row.key} {variant}")
      first_line = (str(error).splitlines() or [""])[0][:300]
      runners[variant] = f"FAILED: {type(error).__name__}: {first_line}"
  return flops, runners


def _prepared(rows: list[Row], args):
  """``(row, future of _prepare)`` in order. With ``--compile_threads`` above 1 every row's
  steps compile at once in a thread pool (XLA compiles without the interpreter lock) before the
  first row is timed, so no compilation runs beside a timed step."""
  if args.compile_threads <= 1:
    for row in rows:
      future = concurrent.futures.Future()
      try:
        future.set_result(_prepare(row, args))
      except Exception as error:
        future.set_exception(error)
      yield row, future
    return
  with concurrent.futures.ThreadPoolExecutor(args.compile_threads) as pool:
    futures = [pool.submit(_prepare, row, args) for row in rows]
    concurrent.futures.wait(futures)
    yield from zip(rows, futures)


def _print_line(row: Row, side: str, flops, seconds, base_seconds, peak, compile_s, note) -> None:
  compiled = "-" if compile_s is None else f"{compile_s:.1f}"
  print(
    f"{row.label:<28} {row.image_size:>4} {row.batch:>5} {side:<17} {flops / 1e9:10.2f}"
    f" {1e3 * seconds:8.2f} {row.batch / seconds:9.1f} {_mfu(flops, seconds, peak):>6}"
    f" {seconds / base_seconds:8.2f}x {compiled:>9}  {note}",
    flush=True,
  )


def _synthetic_row(row: Row, prepared, args, peak, profiles: list) -> None:
  """Times the row's runners interleaved and prints one line per runner."""
  flops, variants = prepared
  runners, notes = {}, {}
  for variant, runner in variants.items():
    if isinstance(runner, str):
      columns = f"{row.label:<28} {row.image_size:>4} {row.batch:>5}"
      print(f"{columns} locvit {variant}: {runner}", flush=True)
    else:
      runners[f"locvit {variant}"] = runner
  for side in args.torch.split(",") if row.timm and args.torch else ():
    try:
      runner, source = torch_runner(side, row, args)
    except Exception as error:  # torch.compile's failure must not lose locvit's lines
      _failed(f"{row.key} timm {side}", error)
      continue
    if runner:
      runners[f"timm {side}"], notes[f"timm {side}"] = runner, source
  if not runners:
    return
  times = time_interleaved(runners, args.steps, args.rounds, args.warmup)
  base = times.get("locvit default", next(iter(times.values())))
  for side, seconds in times.items():
    runner = runners[side]
    _print_line(row, side, flops, seconds, base, peak, runner.compile_s, notes.get(side, ""))
  for side, runner in runners.items():
    if args.profile and runner.profile:
      with tempfile.TemporaryDirectory() as tmp:
        log_dir = Path(args.profile_dir or tmp) / f"{row.key} {side}".replace(" ", "_").replace(
          "/", "-"
        )
        summary, _ = step_profile.profile_steps(
          runner.run, runner.wait, args.profile, log_dir, runner.steps_per_call
        )
      label = f"{row.key} {side.removeprefix('locvit ')}"
      profiles.append((label, summary, runner.listed_kernels))


def _only(labels: tuple[str, ...], args) -> tuple[str, ...]:
  """The labels ``--only`` keeps (all without it)."""
  fragments = [f for f in args.only.split(",") if f]
  return tuple(x for x in labels if not fragments or any(f in x for f in fragments))


def synthetic_table(args, peak: float | None) -> None:
  precision = "fp32 (smoke)" if args.smoke else "bf16 compute"
  print(
    f"Table 1: synthetic resident batch, {precision}, median of {args.rounds} rounds of"
    f" {args.steps} steps dispatched back to back"
  )
  print(
    f"{'model':<28} {'size':>4} {'batch':>5} {'side':<17} {'GFLOP/step':>10} {'step ms':>8}"
    f" {'img/s':>9} {'MFU':>6} {'t/locvit':>9} {'compile s':>9}  torch side",
    flush=True,
  )
  profiles = []
  for row, future in _prepared(_rows(args), args):
    try:
      _synthetic_row(row, future.result(), args, peak, profiles)
    except Exception as error:  # one model's failure must not lose the others' rows
      _failed(row.key, error)
  print("t/locvit: step time / locvit default's on the same row (timm's: how many times slower).")
  print("compile s: building, lowering and compiling locvit's step (XLA); timm's first step under")
  print("torch.compile. MFU of every side: the model FLOPs of locvit's step.\n")
  if profiles:
    print(f"Table 1p: profile of {args.profile} calls of each locvit side (jax.profiler), per step")
    print(step_profile.HEADER)
    for label, summary, listed in profiles:
      step_profile.print_summary(label, summary, listed)
    print(step_profile.LEGEND + "\n", flush=True)


# ------------------------------------------------------------------------------------------------
# Training from the real pipeline


def train_from_pipeline(config, source, steps: int) -> tuple[float, float, float]:
  """``(images/s, share of steps that waited for data, share of time spent fetching)``."""
  iterator = data_lib.make_train_iterator(
    config.data, source, seed=0, local_batch_size=config.batch_size
  )
  first = next(iterator)
  size = config.data.image_size  # a device random-resized crop's batch holds larger canvases
  state, step = state_and_step(config, (size, size, first["image"].shape[-1]), source.num_classes)
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
  labels = _only(SMOKE_PIPELINE_32 if args.smoke else PIPELINE_32, args)
  if not labels:
    return
  configs = {}
  for label in labels:
    configs[label] = config_32(label, args.small_batch_size, args.smoke)
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
    config = config_224("deit_tiny", args.batch_size, args.smoke)
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
  parser.add_argument("--batch_size", type=int, default=128, help="Table 3's batch")
  parser.add_argument("--small_batch_size", type=int, default=512, help="Table 2's batch")
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
  parser.add_argument(
    "--variants",
    default="default",
    help=f"Table 1: locvit's settings timed side by side on each row, of {tuple(VARIANTS)}",
  )
  parser.add_argument(
    "--torch", default="eager,compile", help=f"Table 1: timm's sides, of {TORCH_SIDES} ('' none)"
  )
  parser.add_argument("--torch_compile_backend", default="inductor")
  parser.add_argument(
    "--profile", type=int, default=0, help="Table 1p: profile this many calls of each locvit side"
  )
  parser.add_argument("--profile_dir", default="", help="keep the traces here (default: deleted)")
  parser.add_argument(
    "--compile_threads", type=int, default=1, help="compile every row's steps at once first"
  )
  parser.add_argument("--peak_tflops", type=float, default=None, help="override the peak table")
  args = parser.parse_args()
  bad = [v for v in args.variants.split(",") if v not in VARIANTS]
  bad += [t for t in filter(None, args.torch.split(",")) if t not in TORCH_SIDES]
  if bad:
    parser.error(f"unknown --variants/--torch {bad}; choose from {tuple(VARIANTS)} / {TORCH_SIDES}")
  if args.smoke:
    jax.config.update("jax_platforms", "cpu")
    args.image_size, args.batch_size, args.small_batch_size = 32, 2, 4
    args.steps, args.rounds, args.warmup, args.pipeline_steps = 2, 1, 1, 3
    args.jpeg_images = 8
    # inductor's C++ code generation took 234 s for the two-block ConViT on the 2-core test
    # machine; 'aot_eager' runs the same capture (dynamo, AOT autograd) in 11 s.
    args.torch_compile_backend = "aot_eager"
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
