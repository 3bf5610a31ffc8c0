"""Which shapes cuDNN's fused attention takes on this GPU, against locvit's rule for them.

  python benchmarks/cudnn_shapes.py [--lengths=1,64,65,66,196,197] [--head_dims=12,16,48,64,256]

locvit refuses 'cudnn' attention for shapes it knows JAX or cuDNN will refuse, before compiling
(``locvit.attention.softmax_attention.cudnn_refusal``: shape logic, written from JAX's source and
one failure seen on an H200). This script asks the real thing: for every query/key length,
head dim, with and without a bias, each a forward pass (inference) and a gradient (training), it
compiles and runs ``jax.nn.dot_product_attention(implementation='cudnn')`` in bf16 and prints
JAX's answer beside locvit's. It exits 1 when locvit lets through a shape JAX refuses (a user
would get JAX's traceback); shapes locvit refuses that JAX takes are listed (the rule is then
stricter than this JAX needs; docs/architecture.md, "cuDNN attention", records the versions).
Needs a CUDA GPU; elsewhere it says so and exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from locvit.attention.softmax_attention import cudnn_refusal  # noqa: E402

HEADS = 2
BATCH = 2


def cudnn_version() -> str:
  """The cuDNN JAX loaded (9.10.2 as 91002), read where JAX's own attention check reads it."""
  try:
    from jax._src.lib import cuda_versions  # private: only for the record

    return str(cuda_versions.cudnn_get_version())
  except Exception as error:  # another JAX's layout: the record says so
    return f"unknown ({type(error).__name__})"


def jax_answer(length: int, head_dim: int, bias: bool, training: bool) -> str | None:
  """None when JAX compiles and runs cuDNN attention for the shape, else its error's first line."""
  shape = (BATCH, length, HEADS, head_dim)
  key = jax.random.key(0)
  q, k, v = (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.bfloat16) for i in range(3))
  b = jnp.zeros((1, HEADS, length, length), jnp.bfloat16) if bias else None

  def attention(q, k, v):
    out = jax.nn.dot_product_attention(q, k, v, bias=b, implementation="cudnn")
    return out.astype(jnp.float32).sum()

  fn = jax.grad(attention, argnums=(0, 1, 2)) if training else attention
  try:
    jax.block_until_ready(jax.jit(fn).lower(q, k, v).compile()(q, k, v))
  except Exception as error:  # NotImplementedError, ValueError, XlaRuntimeError from cuDNN
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"
  return None


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lengths", default="1,64,65,66,196,197")
  parser.add_argument("--head_dims", default="12,16,48,64,256")
  args = parser.parse_args()
  if jax.default_backend() != "gpu":
    print(f"cuDNN attention needs a CUDA GPU; this JAX's backend is {jax.default_backend()!r}.")
    return 0
  device = jax.devices()[0]
  print(f"{device.device_kind}, compute capability {device.compute_capability}")
  print(f"jax {jax.__version__}, cuDNN {cudnn_version()}")
  lengths = [int(x) for x in args.lengths.split(",")]
  head_dims = [int(x) for x in args.head_dims.split(",")]
  let_through, stricter = [], []
  print(f"{'length':>6} {'head dim':>8} {'bias':>5} {'pass':<9} {'locvit':<8} JAX")
  for length, head_dim, bias, training in itertools.product(
    lengths, head_dims, (False, True), (False, True)
  ):
    refused = cudnn_refusal(length, length, head_dim, jnp.bfloat16, training=training)
    answer = jax_answer(length, head_dim, bias, training)
    case = f"{length:>6} {head_dim:>8} {bias!s:>5} {'training' if training else 'forward':<9}"
    print(f"{case} {'refuses' if refused else 'takes':<8} {answer or 'takes'}", flush=True)
    if answer and not refused:
      let_through.append(case)
    if refused and not answer:
      stricter.append(case)
  print(
    f"\nlocvit lets through {len(let_through)} shapes JAX refuses (must be 0); refuses "
    f"{len(stricter)} that JAX takes."
  )
  return 1 if let_through else 0


if __name__ == "__main__":
  sys.exit(main())
