"""How the compiled training step's kernels split between the model and the optimizer.

  python benchmarks/step_kernels.py [--rows="GMM-ViT d9,ViT d9"] [--batch=128]
      [--variants=default,flat_opt] [--fp32] [--time=5] [--dump=DIR]
  python benchmarks/step_kernels.py --gpu=h200 [--rows=...] [--variants=...]   # no GPU needed
  python benchmarks/step_kernels.py --smoke     # two blocks, batch 2, fp32: under a minute

Compiles the step ``benchmarks/accelerator.py`` times (``kit.compile_loop_step``: the training
loop's step with the non-finite guard, bf16 compute unless ``--fp32``; a CIFAR row of
``kit.MODELS_32``, or a model of ``kit.MODELS_224`` with the DeiT recipe at 224)
under each ``--variants`` setting (``kit.VARIANTS``) for this host's backend, and counts
the top-level instructions of the optimised HLO's entry computation that run as kernels
(XLA:CPU: thunks): everything but parameters, constants, tuples, get-tuple-element and bitcasts;
the kernels of a ``call`` (XLA:GPU's command buffers) count where they run; a ``while`` counts
once, and its body's kernels (run once per iteration) are printed on their own line.
Each is put in a category by its source stack (the HLO's ``StackFrames``): its innermost frame
in ``locvit/run/step.py`` says whether it came from the model (forward; backward when its
``op_name`` holds ``transpose(``), the optimizer (``tx.update``, ``apply_updates``), the weight
EMA, the metrics, the input augmentation and random keys, or the non-finite guard; XLA's own
instructions carry no source (on XLA:CPU: copies of constants, and under bf16 compute the
float32 converts around its float32-only kernels). A fusion carries its root's source.

``--gpu=h100|h200``: XLA:GPU's own kernels, on any host, with no GPU: the step is compiled for a
compile-only NVIDIA device (XLA's deviceless compilation, ``jax.experimental.topologies``) whose
description is ``benchmarks/gpu_targets/NAME.txtpb``. It needs jax's CUDA plugin at jax's
version (``pip install jax-cuda12-plugin==V jax-cuda12-pjrt==V``; no driver or CUDA libraries).
Without the chip XLA cannot autotune, so every GEMM goes to cuBLAS
(``kit.DEVICELESS_GPU_OPTIONS``): on a GPU the autotuner may pick a Triton GEMM instead
for some. XLA:CPU fuses differently from XLA:GPU: the CPU's counts indicate, ``--gpu``'s are the
GPU compiler's.

``--time=N``: also N rounds of 3 steps of each variant, interleaved (``kit.time_interleaved``):
the median step time, side by side (not with ``--gpu``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import jax
import kit
from kit import CATEGORIES, LOOP_BODIES, gigabytes, kernel_counts


def parse_args() -> argparse.Namespace:
  """The command line, checked: known rows and variants, ``--time`` not with ``--gpu``."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--rows", default="GMM-ViT d9,ViT d9", help="kit.MODELS_32 labels, kit.MODELS_224 names"
  )
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--variants", default="default,flat_opt", help="kit.VARIANTS")
  parser.add_argument("--time", type=int, default=0, help="rounds of 3 timed steps per variant")
  parser.add_argument("--smoke", action="store_true", help="two blocks, batch 2, fp32")
  parser.add_argument("--fp32", action="store_true", help="float32 compute (no bf16 converts)")
  targets = sorted(path.stem for path in kit.GPU_TARGETS.glob("*.txtpb"))
  parser.add_argument(
    "--gpu", choices=targets, help="compile for this NVIDIA GPU, without one (XLA:GPU's kernels)"
  )
  parser.add_argument("--dump", help="also write each step's optimised HLO text to this folder")
  args = parser.parse_args()
  if args.gpu and args.time:
    parser.error("--time runs the steps: it needs the chip they are compiled for, not --gpu")
  rows = (*kit.MODELS_32, *kit.MODELS_224)
  bad = [v for v in args.variants.split(",") if v not in kit.VARIANTS]
  bad += [r for r in args.rows.split(",") if r not in rows]
  if bad:
    parser.error(f"unknown {bad}; rows: {rows}, variants: {tuple(kit.VARIANTS)}")
  return args


def row_config(label: str, batch: int, args: argparse.Namespace) -> tuple:
  """``(config, image size, class count)`` of row ``label``: a CIFAR row of ``kit.MODELS_32``,
  or the DeiT recipe at 224 (32 under ``--smoke``), as the kit's Table 1."""
  if label in kit.MODELS_32:
    config, size, classes = kit.config_32(label, batch, args.smoke), 32, 10
  else:
    config = kit.config_224(label, batch, args.smoke)
    size, classes = (32 if args.smoke else 224), kit.NUM_CLASSES
  config.mixed_precision = config.mixed_precision and not args.fp32
  return config, size, classes


def dump_texts(folder: str, label: str, batch: int, gpu: str | None, texts: dict) -> None:
  """Each variant's optimised HLO text, to ``folder/LABEL_bBATCH_VARIANT[_GPU].hlo.txt``."""
  Path(folder).mkdir(parents=True, exist_ok=True)
  for v, text in texts.items():
    name = f"{label}_b{batch}_{v}{'_' + gpu if gpu else ''}.hlo.txt"
    (Path(folder) / name.replace(" ", "_")).write_text(text)


def print_counts(variants: list[str], counts: dict, bandwidth: float | None) -> None:
  """The table of one row: kernels per category, total, loop bodies, opcodes, bytes moved (and
  the time they take at ``bandwidth`` bytes/s), one column per variant."""
  print(f"  {'category':<30}" + "".join(f" {v:>10}" for v in variants))
  for name in CATEGORIES:
    if any(counts[v][name] for v in variants):
      print(f"  {name:<30}" + "".join(f" {counts[v][name]:>10}" for v in variants))
  totals = {v: kit.total_kernels(counts[v]) for v in variants}
  print(f"  {'total':<30}" + "".join(f" {totals[v]:>10}" for v in variants))
  if any(counts[v][LOOP_BODIES] for v in variants):
    print(f"  {LOOP_BODIES:<30}" + "".join(f" {counts[v][LOOP_BODIES]:>10}" for v in variants))
  opcodes = sorted({k for v in variants for k in counts[v] if k[0] == "opcode"})
  print(
    "  by opcode: "
    + "; ".join(f"{op} " + "/".join(str(counts[v][(_, op)]) for v in variants) for _, op in opcodes)
  )
  print(
    f"  {'operands + results, GB':<30}"
    + "".join(f" {gigabytes(counts[v]):>10.2f}" for v in variants)
  )
  if bandwidth:
    print(
      f"  {'  at the memory bandwidth, ms':<30}"
      + "".join(f" {1e12 * gigabytes(counts[v]) / bandwidth:>10.2f}" for v in variants)
    )


def main() -> None:
  args = parse_args()
  compile_only = kit.compile_only_gpu(args.gpu) if args.gpu else None
  variants = args.variants.split(",")
  batch = 2 if args.smoke else args.batch
  bandwidth = None  # bytes/s: the described GPU's, for the time its kernels' bytes would take
  if args.gpu:
    text = (kit.GPU_TARGETS / f"{args.gpu}.txtpb").read_text()
    bandwidth = float(re.search(r"memory_bandwidth: (\d+)", text).group(1))
  device = compile_only or jax.devices()[0]
  compute = "fp32" if args.smoke or args.fp32 else "bf16"
  print(
    f"Kernels of the compiled training step, batch {batch}, {compute} compute, on"
    f" {device.platform} ({device.device_kind}{', compile-only' if compile_only else ''})"
    f"{', smoke sizes' if args.smoke else ''}"
  )
  for label in args.rows.split(","):
    config, size, classes = row_config(label, batch, args)
    steps = {v: kit.compile_loop_step(config, size, classes, v, compile_only) for v in variants}
    texts = {v: step.compiled.as_text() for v, step in steps.items()}
    if args.dump:
      dump_texts(args.dump, label, batch, args.gpu, texts)
    print(f"\n{label} b{batch}")
    print_counts(variants, {v: kernel_counts(text) for v, text in texts.items()}, bandwidth)
    if args.time:
      runners = {v: kit.step_runner(step) for v, step in steps.items()}
      times = kit.time_interleaved(runners, 3, args.time, warmup=1)
      base = times[variants[0]]
      print(
        "  step ms: " + ", ".join(f"{v} {1e3 * t:.1f} ({t / base:.2f}x)" for v, t in times.items())
      )
  if compile_only:
    print("\nXLA:GPU's compilation without the chip: every GEMM a cuBLAS call (no autotuning).")
  else:
    print("\nXLA:CPU's fusion is not XLA:GPU's (--gpu counts those): an indication only.")


if __name__ == "__main__":
  main()
