"""Forward + backward time of the attention core and the token projections, per implementation.

  python benchmarks/attention_kernels.py [--tokens=196] [--heads=4,9] [--head_dim=48] \\
      [--batch_size=8] [--threads=1] [--rounds=7] [--reps=5] [--no_torch] [--sections=...]

One run, one machine, interleaved rounds (median reported), gradients of a scalar loss with
respect to every input and weight, ``jax.jit``-compiled, pinned to the first ``threads`` cores:

1. attention core ``softmax(q k^T / sqrt(Dh)) v`` on ``(B, N, H, Dh)``:
   ``jax.nn.dot_product_attention(implementation='xla')`` against locvit's 'einsum' kernel
   (heads-first layout, hand-written backward pass) and the PyTorch form of timm/ConViT
   (``permute``, ``q @ k^T``, ``softmax``, ``@ v``);
2. fused qkv projection ``(B, N, C) -> 3 x (B, N, H, Dh)`` with a ``(C, 3, H, Dh)`` kernel:
   ``jnp.tensordot`` on the full-rank kernel against ``locvit.platform.ops.contract(flatten=True)``
   (the 2-D matmul of the CPU code paths)
   and ``torch.nn.Linear`` + reshape;
3. MLP ``fc2(tanh(fc1(x)))`` at 4x width: ``x @ W`` on the 3-D tokens against the flattened
   matmul of ``locvit.platform.ops.dense_dot_general('einsum')``;
4. GPSA's gated mix ``((1 - g) softmax(q k^T / sqrt(Dh)) + g P) v`` with ``P`` shared by the
   batch: the decomposition ``(1 - g) SDPA + g P v`` (SDPA in the einsum kernel) against the fused
   ``gated_positional_attention`` kernel and the reference's PyTorch form (per-example mixed map,
   renormalised, ``@ v``);
5. the 16x16 patch embedding of ``(B, 16 sqrt(N), 16 sqrt(N), 3)`` images to ``C`` channels:
   ``lax.conv_general_dilated`` (stride 16) against ``PatchProjection``'s patchify + matmul (its
   CPU path) and ``torch.nn.Conv2d``; gradients for the kernel and bias only, as in training.

Ratios are ``time(baseline) / time(candidate)``: above 1 means the candidate is faster.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)


def jax_runner(fn, args):
  """A zero-argument callable running the jitted gradient of ``sum(fn(*args) ** 2)``."""
  import jax
  import jax.numpy as jnp

  def loss(*a):
    out = fn(*a)
    return sum(jnp.sum(o**2) for o in (out if isinstance(out, tuple) else (out,)))

  grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))

  def run():
    jax.block_until_ready(grad(*args))

  run()
  return run


def torch_runner(fn, tensors, modules=()):
  """A zero-argument callable running ``sum(fn() ** 2).backward()`` with fresh gradients."""
  params = [p for m in modules for p in m.parameters()]

  def run():
    for t in (*tensors, *params):
      t.grad = None
    out = fn()
    sum((o**2).sum() for o in (out if isinstance(out, tuple) else (out,))).backward()

  run()
  return run


def time_interleaved(runs: dict, rounds: int, reps: int) -> dict[str, float]:
  """Median over rounds of the mean time (ms) per call, all runs interleaved in each round."""
  times = {name: [] for name in runs}
  for _ in range(rounds):
    for name, run in runs.items():
      start = time.perf_counter()
      for _ in range(reps):
        run()
      times[name].append((time.perf_counter() - start) / reps * 1e3)
  return {name: statistics.median(t) for name, t in times.items()}


def core_runs(b, n, h, d, use_torch):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from locvit.attention.softmax_attention import dot_product_attention

  rng = np.random.default_rng(0)
  qkv = [rng.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3)]
  jargs = [jnp.asarray(t) for t in qkv]
  runs = {
    "jax.nn.dot_product_attention (xla)": jax_runner(
      lambda q, k, v: dot_product_attention(q, k, v, implementation="xla"), jargs
    ),
    "locvit einsum kernel": jax_runner(
      lambda q, k, v: dot_product_attention(q, k, v, implementation="cpu_kernels"), jargs
    ),
  }
  del jax
  if use_torch:
    import torch

    q, k, v = (torch.tensor(t, requires_grad=True) for t in qkv)

    def forward():
      qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
      probs = ((qh @ kh.transpose(-2, -1)) * d**-0.5).softmax(dim=-1)
      return (probs @ vh).transpose(1, 2)

    runs["PyTorch"] = torch_runner(forward, (q, k, v))
  return runs


def qkv_runs(b, n, h, d, use_torch):
  import jax.numpy as jnp
  import numpy as np

  from locvit.platform import ops

  c = h * d
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(b, n, c)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(c, 3, h, d)) * 0.02, jnp.float32)

  def split(y):
    return y[:, :, 0], y[:, :, 1], y[:, :, 2]

  runs = {
    "tensordot, (C, 3, H, Dh) kernel": jax_runner(
      lambda x, w: split(jnp.tensordot(x, w, axes=1)), [x, kernel]
    ),
    "locvit.platform.ops.contract": jax_runner(
      lambda x, w: split(ops.contract(x, w, flatten=True)), [x, kernel]
    ),
  }
  if use_torch:
    import torch

    xt = torch.tensor(np.asarray(x), requires_grad=True)
    linear = torch.nn.Linear(c, 3 * c, bias=False)

    def forward():
      qkv = linear(xt).reshape(b, n, 3, h, d).permute(2, 0, 1, 3, 4)
      return qkv[0], qkv[1], qkv[2]

    runs["PyTorch"] = torch_runner(forward, (xt,), (linear,))
  return runs


def mlp_runs(b, n, h, d, use_torch):
  import jax.numpy as jnp
  import numpy as np
  from jax import lax

  from locvit.platform import ops

  c = h * d
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(b, n, c)), jnp.float32)
  w1 = jnp.asarray(rng.normal(size=(c, 4 * c)) * 0.02, jnp.float32)
  w2 = jnp.asarray(rng.normal(size=(4 * c, c)) * 0.02, jnp.float32)
  numbers = lambda a: (((a.ndim - 1,), (0,)), ((), ()))

  def mlp(dot):
    return lambda x, w1, w2: dot(jnp.tanh(dot(x, w1, numbers(x))), w2, numbers(x))

  runs = {
    "lax.dot_general on (B, N, C)": jax_runner(mlp(lax.dot_general), [x, w1, w2]),
    "locvit.platform.ops.dense_dot_general": jax_runner(
      mlp(ops.dense_dot_general("cpu_kernels")), [x, w1, w2]
    ),
  }
  if use_torch:
    import torch

    xt = torch.tensor(np.asarray(x), requires_grad=True)
    fc1, fc2 = torch.nn.Linear(c, 4 * c, bias=False), torch.nn.Linear(4 * c, c, bias=False)
    runs["PyTorch"] = torch_runner(lambda: fc2(torch.tanh(fc1(xt))), (xt,), (fc1, fc2))
  return runs


def gpsa_runs(b, n, h, d, use_torch):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from locvit.attention.softmax_attention import dot_product_attention, gated_positional_attention

  rng = np.random.default_rng(0)
  qkv = [rng.normal(size=(b, n, h, d)).astype(np.float32) for _ in range(3)]
  pos_logits = rng.normal(size=(h, n, n)).astype(np.float32)
  gating = np.ones(h, np.float32)

  def decomposed(q, k, v, pos_logits, gating):
    pos, g = jax.nn.softmax(pos_logits, -1), jax.nn.sigmoid(gating)[:, None]
    content = dot_product_attention(q, k, v, implementation="cpu_kernels")
    return (1 - g) * content + g * jnp.einsum("hnm,bmhd->bnhd", pos, v)

  def fused(q, k, v, pos_logits, gating):
    pos, g = jax.nn.softmax(pos_logits, -1), jax.nn.sigmoid(gating)
    return gated_positional_attention(q, k, v, pos, g)

  jargs = [jnp.asarray(t) for t in (*qkv, pos_logits, gating)]
  runs = {
    "(1 - g) SDPA + g P v": jax_runner(decomposed, jargs),
    "locvit gated_positional_attention": jax_runner(fused, jargs),
  }
  if use_torch:
    import torch

    q, k, v, pos_t, gate_t = (
      torch.tensor(t, requires_grad=True) for t in (*qkv, pos_logits, gating)
    )

    def forward():
      qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
      content = ((qh @ kh.transpose(-2, -1)) * d**-0.5).softmax(dim=-1)
      pos = pos_t.expand(b, -1, -1, -1).softmax(dim=-1)
      g = torch.sigmoid(gate_t).view(1, -1, 1, 1)
      mixed = (1.0 - g) * content + g * pos
      mixed = mixed / mixed.sum(dim=-1, keepdim=True)
      return (mixed @ vh).transpose(1, 2)

    runs["PyTorch"] = torch_runner(forward, (q, k, v, pos_t, gate_t))
  return runs


def patch_runs(b, n, h, d, use_torch):
  import jax
  import jax.numpy as jnp
  import numpy as np

  from locvit.models.layers import patchify
  from locvit.platform import ops

  c, side = h * d, 16 * math.isqrt(n)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(b, side, side, 3)).astype(np.float32)
  kernel = (rng.normal(size=(16, 16, 3, c)) * 0.02).astype(np.float32)
  bias = np.zeros(c, np.float32)

  def conv(kernel, bias):
    y = jax.lax.conv_general_dilated(
      jnp.asarray(images), kernel, (16, 16), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return y.reshape(b, -1, c) + bias

  def patch_matmul(kernel, bias):
    tokens = patchify(jnp.asarray(images), 16)
    return ops.contract(tokens, kernel.reshape(-1, c), flatten=True) + bias

  jargs = [jnp.asarray(kernel), jnp.asarray(bias)]
  runs = {
    "lax.conv_general_dilated": jax_runner(conv, jargs),
    "locvit patchify + matmul": jax_runner(patch_matmul, jargs),
  }
  if use_torch:
    import torch

    conv_t = torch.nn.Conv2d(3, c, 16, 16)
    images_t = torch.tensor(images.transpose(0, 3, 1, 2).copy())
    runs["PyTorch"] = torch_runner(lambda: conv_t(images_t).flatten(2), (), (conv_t,))
  return runs


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tokens", type=int, default=196)
  parser.add_argument("--heads", default="4,9")
  parser.add_argument("--head_dim", type=int, default=48)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--no_torch", action="store_true")
  parser.add_argument("--sections", default="core,qkv,mlp,gpsa,patch")
  args = parser.parse_args()

  os.sched_setaffinity(0, set(range(args.threads)))
  use_torch = not args.no_torch
  if use_torch:
    import torch

    torch.set_num_threads(args.threads)
  import jax

  print(f"JAX {jax.__version__} on {jax.default_backend()}, {args.threads} thread(s), ", end="")
  print(f"batch {args.batch_size}, {args.tokens} tokens, head_dim {args.head_dim}")
  print(f"load average before: {os.getloadavg()[0]:.2f}")
  for heads in (int(h) for h in args.heads.split(",")):
    shape = (args.batch_size, args.tokens, heads, args.head_dim)
    builders = {
      "core": ("attention core", core_runs),
      "qkv": ("qkv projection", qkv_runs),
      "mlp": ("MLP (4x)", mlp_runs),
      "gpsa": ("GPSA gated mix", gpsa_runs),
      "patch": ("16x16 patch embedding", patch_runs),
    }
    for title, build in (builders[name] for name in args.sections.split(",")):
      runs = build(*shape, use_torch)
      times = time_interleaved(runs, args.rounds, args.reps)
      baseline = next(iter(times.values()))
      print(f"\n{title}, {heads} heads x {args.head_dim} (C = {heads * args.head_dim}):")
      for name, ms in times.items():
        print(f"  {name:36s} {ms:9.2f} ms   speed vs first row {baseline / ms:5.2f}x")
  print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  main()
