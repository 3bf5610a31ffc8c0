"""The lowered training step's size, large constants and compile time, this checkout vs another.

  python benchmarks/lowered_step.py [--baseline=PATH] [--models=convit_small,deit_small]

For each model, in a fresh process per checkout: the training gradient of a batch of 8 at 224
(bf16 compute, the 'xla' kernel setting) lowered for 'tpu' from this CPU host, its StableHLO text
size and its dense constants over 1 KB; then the same step compiled for this CPU, timed.
A large constant per layer (ConViT's GPSA geometry, before it was built in the graph) bloats
the program that every TPU or GPU compile must parse and optimise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DENSE_HEX = re.compile(r'dense<"0x([0-9A-F]+)"')


def measure(model_name: str, image_size: int) -> dict:
  """StableHLO MB and constants over 1 KB lowered for 'tpu'; seconds to compile for the CPU."""
  import jax
  import jax.numpy as jnp

  from locvit.models import create_model

  model = create_model(model_name, num_classes=1000, dtype=jnp.bfloat16)
  model = model.clone(attention_implementation="xla")
  images = jnp.zeros((8, image_size, image_size, 3))
  variables = jax.eval_shape(model.init, jax.random.key(0), images)

  def loss(params, images):
    return jnp.mean(model.apply({"params": params}, images).astype(jnp.float32))

  traced = jax.jit(jax.grad(loss)).trace(variables["params"], images)
  text = traced.lower(lowering_platforms=("tpu",)).as_text()
  constants = [len(h) // 2 for h in _DENSE_HEX.findall(text) if len(h) // 2 > 1024]
  lowered_cpu = traced.lower()
  t0 = time.perf_counter()
  lowered_cpu.compile()
  return {
    "mb": len(text) / 1e6,
    "constants": len(constants),
    "constant_mb": sum(constants) / 1e6,
    "compile_s": time.perf_counter() - t0,
  }


def measure_checkout(root: str, model_name: str, image_size: int) -> dict:
  env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
  command = [sys.executable, __file__, f"--worker={model_name}", f"--image_size={image_size}"]
  out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=root)
  return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--baseline", help="another checkout to compare with")
  parser.add_argument("--models", default="convit_small,deit_small")
  parser.add_argument("--image_size", type=int, default=224)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print(json.dumps(measure(args.worker, args.image_size)))
    return
  checkouts = {"this": ROOT} | ({"baseline": args.baseline} if args.baseline else {})
  print(f"gradient step, batch 8, {args.image_size}x{args.image_size}, bf16, lowered for 'tpu'")
  print(
    f"{'model':14s} {'checkout':9s} {'StableHLO MB':>13s} {'consts >1KB':>12s} "
    f"{'their MB':>9s} {'CPU compile s':>14s}"
  )
  for name in args.models.split(","):
    for label, root in checkouts.items():
      m = measure_checkout(root, name, args.image_size)
      print(
        f"{name:14s} {label:9s} {m['mb']:13.2f} {m['constants']:12d} {m['constant_mb']:9.2f} "
        f"{m['compile_s']:14.1f}"
      )


if __name__ == "__main__":
  main()
