"""How the compiled training step's kernels split between the model and the optimizer.

  python benchmarks/step_kernels.py [--rows="GMM-ViT d9,ViT d9"] [--batch=128]
      [--variants=default,flat_opt] [--fp32] [--time=5] [--dump=DIR]
  python benchmarks/step_kernels.py --gpu=h200 [--rows=...] [--variants=...]   # no GPU needed
  python benchmarks/step_kernels.py --smoke     # two blocks, batch 2, fp32: under a minute

Compiles the step ``benchmarks/accelerator.py`` times (``compile_loop_step``: the training loop's
step with the non-finite guard, bf16 compute unless ``--fp32``; a CIFAR row of
``accelerator.MODELS_32``, or a model of ``accelerator.MODELS_224`` with the DeiT recipe at 224)
under each ``--variants`` setting (``accelerator.VARIANTS``) for this host's backend, and counts
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
(``accelerator.DEVICELESS_GPU_OPTIONS``): on a GPU the autotuner may pick a Triton GEMM instead
for some. XLA:CPU fuses differently from XLA:GPU: the CPU's counts indicate, ``--gpu``'s are the
GPU compiler's.

``--time=N``: also N rounds of 3 steps of each variant, interleaved (``accelerator``'s timing):
the median step time, side by side (not with ``--gpu``).
"""

from __future__ import annotations

import argparse
import collections
import linecache
import math
import os
import re
import sys
from pathlib import Path

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
_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT )?%(?P<name>\S+) = (?P<result>.*?) (?P<opcode>[a-z][\w-]*)\((?P<operands>[^)]*)\)"
)
_OPERAND = re.compile(r"%([\w.-]+)")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*)\[([\d,]*)\]")
LOOP_BODIES = "in loop bodies (per iteration)"
GPU_TARGETS = Path(__file__).resolve().parent / "gpu_targets"


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


def gigabytes(counts: collections.Counter) -> float:
  """The bytes ``kernel_counts`` found the step's kernels to move (its loops' bodies once)."""
  return sum(n for k, n in counts.items() if isinstance(k, tuple) and k[0] == "bytes") / 1e9


def listed_kernels(hlo: str) -> str:
  """The kernels an optimised HLO lists, ``'N'``, or ``'N+M'`` with M in a pass of its loops'
  bodies: what a profile's count of kernels per step is compared with."""
  counts = kernel_counts(hlo)
  outside = sum(counts[name] for name in CATEGORIES)
  return f"{outside}+{counts[LOOP_BODIES]}" if counts[LOOP_BODIES] else str(outside)


def compile_only_gpu(name: str):
  """A compile-only device for the GPU described in ``GPU_TARGETS/NAME.txtpb``; exits with the
  install line when jax's CUDA plugin is missing."""
  # The plugin checks the CUDA libraries it would run with; compiling needs none of them.
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  from jax.experimental import topologies

  try:
    topology = topologies.get_topology_desc(
      name, "cuda", target_config=(GPU_TARGETS / f"{name}.txtpb").read_text(), topology="1x1x1"
    )
  except NotImplementedError:
    sys.exit(
      "step_kernels.py: error: --gpu needs jax's CUDA plugin, which is not installed: pip install"
      f" jax-cuda12-plugin=={jax.__version__} jax-cuda12-pjrt=={jax.__version__}"
    )
  return topology.devices[0]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--rows", default="GMM-ViT d9,ViT d9", help="accelerator.MODELS_32 labels, MODELS_224 names"
  )
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--variants", default="default,flat_opt", help="accelerator.VARIANTS")
  parser.add_argument("--time", type=int, default=0, help="rounds of 3 timed steps per variant")
  parser.add_argument("--smoke", action="store_true", help="two blocks, batch 2, fp32")
  parser.add_argument("--fp32", action="store_true", help="float32 compute (no bf16 converts)")
  targets = sorted(path.stem for path in GPU_TARGETS.glob("*.txtpb"))
  parser.add_argument(
    "--gpu", choices=targets, help="compile for this NVIDIA GPU, without one (XLA:GPU's kernels)"
  )
  parser.add_argument("--dump", help="also write each step's optimised HLO text to this folder")
  args = parser.parse_args()
  if args.gpu and args.time:
    parser.error("--time runs the steps: it needs the chip they are compiled for, not --gpu")
  compile_only = compile_only_gpu(args.gpu) if args.gpu else None
  import accelerator  # after compile_only_gpu: jax's backends initialise on import
  import jax

  variants = args.variants.split(",")
  labels = args.rows.split(",")
  rows = (*accelerator.MODELS_32, *accelerator.MODELS_224)
  bad = [v for v in variants if v not in accelerator.VARIANTS]
  bad += [r for r in labels if r not in rows]
  if bad:
    parser.error(f"unknown {bad}; rows: {rows}, variants: {tuple(accelerator.VARIANTS)}")
  batch = 2 if args.smoke else args.batch
  bandwidth = None  # bytes/s: the described GPU's, for the time its kernels' bytes would take
  if args.gpu:
    text = (GPU_TARGETS / f"{args.gpu}.txtpb").read_text()
    bandwidth = float(re.search(r"memory_bandwidth: (\d+)", text).group(1))
  device = compile_only or jax.devices()[0]
  compute = "fp32" if args.smoke or args.fp32 else "bf16"
  print(
    f"Kernels of the compiled training step, batch {batch}, {compute} compute, on"
    f" {device.platform} ({device.device_kind}{', compile-only' if compile_only else ''})"
    f"{', smoke sizes' if args.smoke else ''}"
  )
  for label in labels:
    if label in accelerator.MODELS_32:
      config, size, classes = accelerator._config_32(label, batch, args.smoke), 32, 10
    else:  # the DeiT recipe at 224 (32 under --smoke), as the kit's Table 1
      config = accelerator._config_224(label, batch, args.smoke)
      size, classes = (32 if args.smoke else 224), accelerator.NUM_CLASSES
    config.mixed_precision = config.mixed_precision and not args.fp32
    steps = {
      v: accelerator.compile_loop_step(config, size, classes, v, compile_only) for v in variants
    }
    texts = {v: step.compiled.as_text() for v, step in steps.items()}
    counts = {v: kernel_counts(text) for v, text in texts.items()}
    if args.dump:
      Path(args.dump).mkdir(parents=True, exist_ok=True)
      for v, text in texts.items():
        name = f"{label}_b{batch}_{v}{'_' + args.gpu if args.gpu else ''}.hlo.txt"
        (Path(args.dump) / name.replace(" ", "_")).write_text(text)
    print(f"\n{label} b{batch}")
    print(f"  {'category':<30}" + "".join(f" {v:>10}" for v in variants))
    for name in CATEGORIES:
      if any(counts[v][name] for v in variants):
        print(f"  {name:<30}" + "".join(f" {counts[v][name]:>10}" for v in variants))
    totals = {v: sum(counts[v][name] for name in CATEGORIES) for v in variants}
    print(f"  {'total':<30}" + "".join(f" {totals[v]:>10}" for v in variants))
    if any(counts[v][LOOP_BODIES] for v in variants):
      print(f"  {LOOP_BODIES:<30}" + "".join(f" {counts[v][LOOP_BODIES]:>10}" for v in variants))
    opcodes = sorted({k for v in variants for k in counts[v] if k[0] == "opcode"})
    print(
      "  by opcode: "
      + "; ".join(
        f"{op} " + "/".join(str(counts[v][(_, op)]) for v in variants) for _, op in opcodes
      )
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
    if args.time:
      runners = {v: accelerator.step_runner(step) for v, step in steps.items()}
      times = accelerator.time_interleaved(runners, 3, args.time, warmup=1)
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
