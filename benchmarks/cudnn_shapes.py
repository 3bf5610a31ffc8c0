"""Which shapes cuDNN's fused attention takes on this GPU, against locvit's rule for them.

  python benchmarks/cudnn_shapes.py [--lengths=1,64,65,66,196,197] [--head_dims=12,16,48,64,256]

locvit refuses 'cudnn' attention for shapes it knows JAX or cuDNN will refuse, before compiling
(``locvit.attention.softmax_attention.cudnn_refusal``: shape logic, written from JAX's source and
one failure seen on an H200). This script asks the real thing: for every query/key length,
head dim, with and without a bias, each a forward pass (inference) and a gradient (training), it
compiles and runs locvit's ``dot_product_attention(implementation='cudnn')`` in bf16 (JAX's cuDNN
kernel; odd lengths without a bias padded to even ones) where locvit takes the shape, and checks
it against XLA's kernel. It exits 1 when locvit lets through a shape that fails or disagrees (a
user would get JAX's traceback, or other numbers); shapes locvit refuses that JAX's own kernel
takes are counted (the rule is then stricter than this JAX needs; docs/architecture.md, "cuDNN
attention", records the versions).
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

from locvit.attention.softmax_attention import (  # noqa: E402
  cudnn_refusal,
  dot_product_attention,
)

HEADS = 2
BATCH = 2
TOLERANCE = 0.05  # bf16 outputs and gradients of unit-normal inputs, two kernels' roundings


def cudnn_version() -> str:
  """The cuDNN JAX loaded (9.10.2 as 91002), read where JAX's own attention check reads it."""
  try:
    from jax._src.lib import cuda_versions  # private: only for the record

    return str(cuda_versions.cudnn_get_version())
  except Exception as error:  # another JAX's layout: the record says so
    return f"unknown ({type(error).__name__})"


def _inputs(length: int, head_dim: int, bias: bool) -> tuple:
  """bf16 queries, keys and values, and a zero bias or None."""
  shape = (BATCH, length, HEADS, head_dim)
  key = jax.random.key(0)
  q, k, v = (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.bfloat16) for i in range(3))
  return q, k, v, jnp.zeros((1, HEADS, length, length), jnp.bfloat16) if bias else None


def raw_jax_refuses(length: int, head_dim: int, bias: bool, training: bool) -> bool:
  """Whether JAX's own cuDNN kernel (no padding) fails to compile or run the shape."""
  q, k, v, b = _inputs(length, head_dim, bias)

  def attention(q, k, v):
    out = jax.nn.dot_product_attention(q, k, v, bias=b, implementation="cudnn")
    return out.astype(jnp.float32).sum()

  try:
    jax.block_until_ready(
      jax.jit(jax.grad(attention, (0, 1, 2)) if training else attention)(q, k, v)
    )
  except Exception:  # NotImplementedError, ValueError, XlaRuntimeError from cuDNN
    return True
  return False


def cudnn_answer(length: int, head_dim: int, bias: bool, training: bool) -> str | None:
  """None when locvit's 'cudnn' attention (``dot_product_attention``: JAX's cuDNN kernel, odd
  lengths padded to even ones without a bias) compiles, runs and agrees with XLA's kernel in bf16;
  else the error's first line, or the difference."""
  q, k, v, b = _inputs(length, head_dim, bias)

  def result(implementation):
    def attention(q, k, v):
      out = dot_product_attention(q, k, v, b, implementation=implementation, training=training)
      return out.astype(jnp.float32).sum(), out

    if not training:
      return jax.jit(attention)(q, k, v)[1]
    return jax.jit(jax.grad(attention, argnums=(0, 1, 2), has_aux=True))(q, k, v)[0]

  try:
    got, want = result("cudnn"), result("xla")
  except Exception as error:  # NotImplementedError, ValueError, XlaRuntimeError from cuDNN
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}"
  difference = max(
    float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))
  )
  return None if difference <= TOLERANCE else f"differs from XLA's kernel by {difference:.3g}"


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
    refused = cudnn_refusal(length, length, head_dim, jnp.bfloat16, training=training, bias=bias)
    answer = None if refused else cudnn_answer(length, head_dim, bias, training)
    case = f"{length:>6} {head_dim:>8} {bias!s:>5} {'training' if training else 'forward':<9}"
    print(f"{case} {'refuses' if refused else 'takes':<8} {answer or 'ran, agrees'}", flush=True)
    if answer:
      let_through.append(case)
    if refused and not raw_jax_refuses(length, head_dim, bias, training):
      stricter.append(case)
  print(
    f"\nlocvit lets through {len(let_through)} shapes that fail or disagree (must be 0); refuses "
    f"{len(stricter)} that JAX's kernel takes."
  )
  return 1 if let_through else 0


if __name__ == "__main__":
  sys.exit(main())
