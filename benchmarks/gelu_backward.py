"""Exact GELU: ``locvit.models.layers.gelu`` (custom JVP, derivative saved in the forward pass)
against autodiff through ``jax.nn.gelu(approximate=False)``, in a training-style step.

  python benchmarks/gelu_backward.py [--tokens=400] [--dim=192] [--depth=12] [--rounds=5]

The model is the part of a ViT block that the activation touches: ``depth`` residual MLPs
(``LayerNorm -> fc1 (dim -> 4 dim) -> GELU -> fc2``) on ``(tokens, dim)`` activations (400 tokens
= DeiT-Ti's batch of 8 at 112x112; 1,576 = batch 8 at 224x224). Both variants are compiled from
the same Flax module, timed in interleaved rounds (forward + backward w.r.t. parameters and
input), median round reported, with the ratio. Also checks that the two give the same loss and
gradients (max abs difference printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from locvit.models.layers import gelu  # noqa: E402

ACTIVATIONS = {
  "locvit gelu (custom JVP)": gelu,
  "jax.nn.gelu exact (autodiff)": lambda x: jax.nn.gelu(x, approximate=False),
}


class MlpStack(nn.Module):
  """``depth`` pre-norm residual MLPs with the given activation."""

  depth: int
  activation: object

  @nn.compact
  def __call__(self, x):
    dim = x.shape[-1]
    for _ in range(self.depth):
      h = nn.Dense(4 * dim)(nn.LayerNorm(epsilon=1e-6)(x))
      x = x + nn.Dense(dim)(self.activation(h))
    return x


def make_step(activation, depth: int, x):
  model = MlpStack(depth, activation)
  params = model.init(jax.random.key(0), x)

  def loss(params, x):
    return jnp.mean(model.apply(params, x) ** 2)

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  return lambda: jax.block_until_ready(step(params, x))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tokens", type=int, default=400)
  parser.add_argument("--dim", type=int, default=192)
  parser.add_argument("--depth", type=int, default=12)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--rounds", type=int, default=5)
  args = parser.parse_args()
  x = jnp.asarray(np.random.default_rng(0).normal(size=(args.tokens, args.dim)), jnp.float32)
  runs = {name: make_step(fn, args.depth, x) for name, fn in ACTIVATIONS.items()}
  results = {name: run() for name, run in runs.items()}  # compile + reference values
  (loss_a, grads_a), (loss_b, grads_b) = results.values()
  diff = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True)
  )
  times = {name: [] for name in runs}
  for _ in range(args.rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      for _ in range(args.steps):
        run()
      times[name].append((time.perf_counter() - start) / args.steps)
  median = {name: statistics.median(t) for name, t in times.items()}
  base = median["jax.nn.gelu exact (autodiff)"]
  print(
    f"{jax.devices()[0].platform}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
    f"{args.depth} MLPs on ({args.tokens}, {args.dim}), forward + backward, "
    f"{args.rounds} rounds x {args.steps} steps"
  )
  for name, t in median.items():
    print(f"{name:<30}{t * 1e3:9.2f} ms  speed-up {base / t:5.2f}x")
  loss_diff = abs(float(loss_a) - float(loss_b))
  print(f"|loss difference| {loss_diff:.2e}, max |grad difference| {diff:.2e}")


if __name__ == "__main__":
  main()
