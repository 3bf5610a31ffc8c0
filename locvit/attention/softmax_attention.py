"""Scaled dot-product attention kernels: ``softmax(q k^T / sqrt(Dh) + bias) v`` (Vaswani et al.).

Every attention variant in locvit ends in this product. Two backends:

- ``jax.nn.dot_product_attention`` ('xla', 'cudnn'): JAX's kernel, differentiated by JAX. On GPU
  'cudnn' is the fused (flash) kernel for bf16/fp16.
- 'cpu_kernels': the explicit form, laid out as ``(B, H, N, Dh)`` so every batched matmul has its
  batch axes leading, with a hand-written backward pass that reuses the saved probabilities:
  ``dV = P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - rowsum(dP * P))``, ``dQ = dS K / sqrt(Dh)``,
  ``dK = dS^T Q / sqrt(Dh)``. On XLA:CPU this is 1.3-2.9x faster than JAX's kernel for the
  forward + backward pass of the attention core (``benchmarks/attention_kernels.py``), because
  XLA's autodiff of the ``(B, N, H, Dh)`` form inserts layout copies and a slow batch reduction.

``implementation=None`` lets JAX choose (XLA in every JAX locvit supports: JAX never picks cuDNN
itself); a model resolves None to 'cpu_kernels' on CPU once, when it is built
(``locvit.platform.ops.resolve_implementation``). 'cudnn' takes only some shapes
(``cudnn_refusal``): this module refuses the others with a ValueError naming the shape, the rule and
the other choices before JAX's kernel is called (JAX would raise NotImplementedError from deep
inside its rules). The 'cpu_kernels' backend supports reverse-mode differentiation only
(``jax.grad``, ``jax.vjp``); use 'xla' for forward-mode (``jax.jvp``, ``jax.hessian``).
"""

from __future__ import annotations

import contextlib
import contextvars
from functools import partial

import jax
import jax.numpy as jnp

from locvit.platform.ops import (
  IMPLEMENTATIONS,
  check_implementation,
  cpu_kernels,
  resolve_implementation,
)

Array = jax.Array
__all__ = [
  "IMPLEMENTATIONS",
  "cudnn_refusal",
  "cudnn_rules_only",
  "dot_product_attention",
  "gated_positional_attention",
  "resolve_implementation",
]


def dot_product_attention(
  q: Array,
  k: Array,
  v: Array,
  bias: Array | None = None,
  implementation: str | None = None,
  scale: float | None = None,
  training: bool = True,
) -> Array:
  """``softmax(q k^T / sqrt(Dh) + bias) v`` on ``(B, N, H, Dh)`` inputs (Vaswani et al., Eq. 1).

  Args:
    q, k, v: ``(B, N, H, Dh)`` queries, keys and values.
    bias: optional logits added before the softmax, ``(B, H, N, N)`` or ``(1, H, N, N)``.
    implementation: None (JAX's choice), 'xla' or 'cudnn' (``jax.nn.dot_product_attention``) or
      'cpu_kernels' (explicit float32 softmax, hand-written backward pass).
    scale: logit scale; None means ``1 / sqrt(Dh)``.
    training: whether the call is differentiated (the training step): 'cudnn' has stricter rules
      there (``cudnn_refusal``).

  Returns:
    ``(B, N, H, Dv)`` in ``v``'s dtype.

  Raises:
    ValueError: 'cudnn' with shapes cuDNN's fused attention cannot take (``cudnn_refusal``).
  """
  check_implementation(implementation)
  if implementation == "cudnn":
    refusal = cudnn_refusal(
      q.shape[1], k.shape[1], q.shape[-1], q.dtype, training=training, bias=bias is not None
    )
    if refusal:
      raise ValueError(refusal)
    if _RULES_ONLY.get():
      implementation = "xla"  # the same shapes, traceable on any host
    if training and (q.shape[1] % 2 or k.shape[1] % 2):
      return _at_even_lengths(q, k, v, scale, implementation)
  if not cpu_kernels(implementation):
    return jax.nn.dot_product_attention(
      q, k, v, bias=bias, scale=scale, implementation=implementation
    )
  if bias is not None and (bias.ndim != 4 or bias.shape[0] not in (1, q.shape[0])):
    raise ValueError(
      f"bias must be (B, H, N, N) or (1, H, N, N) for q of shape {q.shape}, got {bias.shape}."
    )
  return _attention(q, k, v, bias, q.shape[-1] ** -0.5 if scale is None else float(scale))


def _at_even_lengths(q: Array, k: Array, v: Array, scale, implementation: str) -> Array:
  """Attention of odd-length tokens (DeiT's 197, ViT d9's 65) by a kernel that trains only even
  lengths (cuDNN's): queries and keys padded by one token, the padded key masked by the true
  lengths (``key_value_seq_lengths``, cuDNN's padding mask), the padded query's row dropped. The
  padded token gets no weight and no gradient, so the result is the unpadded attention's."""
  batch, queries, keys = q.shape[0], q.shape[1], k.shape[1]
  pad = lambda x: jnp.pad(x, ((0, 0), (0, x.shape[1] % 2), (0, 0), (0, 0)))
  lengths = lambda n: jnp.full((batch,), n, jnp.int32)
  out = jax.nn.dot_product_attention(
    pad(q),
    pad(k),
    pad(v),
    scale=scale,
    query_seq_lengths=lengths(queries),
    key_value_seq_lengths=lengths(keys),
    implementation=implementation,
  )
  return out[:, :queries]


# cuDNN's fused attention, as JAX 0.7.1-0.11.2 call it (``jax.nn.dot_product_attention``, the
# checks of ``jax/_src/cudnn/fused_attention_stablehlo.py``; the versions and sources are in
# docs/architecture.md, "cuDNN attention").
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256  # Hopper and later; 128 before (JAX asks the GPU when it traces)
CUDNN_OTHER_CHOICES = "use attention_implementation='xla' or None (JAX's choice: XLA)"
_RULES_ONLY = contextvars.ContextVar("cudnn_rules_only", default=False)


def cudnn_refusal(
  q_len: int, kv_len: int, head_dim: int, dtype, *, training: bool = True, bias: bool = True
) -> str | None:
  """Why cuDNN's fused attention cannot take these shapes, as one line, or None.

  Shape logic only, so a config is checked on any host: bf16 or fp16 inputs; a head dim that is a
  multiple of 8 and at most 256 (128 before Hopper, which only the GPU tells); in training (the
  backward pass) with a ``bias``, even query and key lengths. JAX 0.7.1-0.11.0 check the lengths
  only with a bias, and 0.11.2 refused 65 tokens without one too (``NotImplementedError:
  Unsupported sequence length Q 65, KV 65``): without a bias ``dot_product_attention`` pads odd
  lengths to even ones (``_at_even_lengths``), so only a bias's odd lengths are refused.
  """
  problems = []
  if jnp.dtype(dtype).name not in CUDNN_DTYPES:
    problems.append(
      f"{jnp.dtype(dtype).name} inputs (it needs bfloat16 or float16: mixed precision)"
    )
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    problems.append(
      f"head dim {head_dim} (it needs a multiple of 8, at most {CUDNN_MAX_HEAD_DIM}; "
      "128 before Hopper)"
    )
  if training and bias and (q_len % 2 or kv_len % 2):
    lengths = f"{q_len}" if q_len == kv_len else f"{q_len} (queries) x {kv_len} (keys)"
    problems.append(f"sequence length {lengths} with a bias in training (it needs even lengths)")
  if not problems:
    return None
  refused = "; nor ".join(problems)
  return (
    f"attention_implementation='cudnn': cuDNN's fused attention cannot take {refused}; "
    f"{CUDNN_OTHER_CHOICES}"
  )


@contextlib.contextmanager
def cudnn_rules_only():
  """Within it, 'cudnn' checks its rules and then computes with XLA's kernel (same shapes), so that
  tracing a model abstractly checks every attention call on any host, GPU or not."""
  token = _RULES_ONLY.set(True)
  try:
    yield
  finally:
    _RULES_ONLY.reset(token)


def _to_heads_first(x: Array) -> Array:
  return jnp.swapaxes(x, 1, 2)  # (B, N, H, D) <-> (B, H, N, D)


def _probabilities(q: Array, k: Array, bias: Array | None, scale: float) -> Array:
  """``(B, H, N, M)`` float32 softmax of the scaled logits; inputs heads-first."""
  logits = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  return jax.nn.softmax(logits, axis=-1)


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q: Array, k: Array, v: Array, bias: Array | None, scale: float) -> Array:
  return _attention_fwd(q, k, v, bias, scale)[0]


def _attention_fwd(q, k, v, bias, scale):
  qh, kh, vh = _to_heads_first(q), _to_heads_first(k), _to_heads_first(v)
  probs = _probabilities(qh, kh, bias, scale)
  out = jnp.einsum("bhnm,bhmd->bhnd", probs.astype(v.dtype), vh)
  # A zero-size stand-in records the bias's batch size and dtype without keeping it alive.
  bias_meta = None if bias is None else jnp.zeros((bias.shape[0], 0), bias.dtype)
  return _to_heads_first(out), (qh, kh, vh, probs, bias_meta)


def sum_batch(x: Array) -> Array:
  """Sum over the leading axis, kept as size 1, as a ``ones @ x`` matmul: XLA:CPU lowers the
  column reduction ~20x slower (docs/benchmarks.md)."""
  ones = jnp.ones((1, x.shape[0]), x.dtype)
  total = jnp.matmul(ones, x.reshape(x.shape[0], -1), precision=jax.lax.Precision.HIGHEST)
  return total.reshape((1, *x.shape[1:]))


def _attention_bwd(scale, residuals, d_out):
  qh, kh, vh, probs, bias_meta = residuals
  d_out = _to_heads_first(d_out)
  f32 = partial(jnp.einsum, preferred_element_type=jnp.float32)
  d_v = f32("bhnm,bhnd->bhmd", probs.astype(d_out.dtype), d_out)
  d_probs = f32("bhnd,bhmd->bhnm", d_out, vh)
  d_logits = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
  d_scores = (d_logits * scale).astype(qh.dtype)
  d_q = f32("bhnm,bhmd->bhnd", d_scores, kh)
  d_k = f32("bhnm,bhnd->bhmd", d_scores, qh)
  d_bias = None
  if bias_meta is not None:
    d_bias = d_logits if bias_meta.shape[0] == d_logits.shape[0] else sum_batch(d_logits)
    d_bias = d_bias.astype(bias_meta.dtype)
  grads = (d_q.astype(qh.dtype), d_k.astype(kh.dtype), d_v.astype(vh.dtype))
  return (*(_to_heads_first(g) for g in grads), d_bias)


_attention.defvjp(_attention_fwd, _attention_bwd)


def gated_positional_attention(
  q: Array, k: Array, v: Array, positional: Array, gate: Array, scale: float | None = None
) -> Array:
  """GPSA's mixed attention ``((1 - g) softmax(scale q k^T) + g P) v`` in one kernel.

  ConViT Eq. 6 without the renormalisation, which is exact no-op: both terms are row-stochastic.
  The heads-first explicit form with a hand-written backward pass: one ``(B, H, N, N)`` mixed map
  and one product with ``v`` instead of separate content and positional products, so the forward
  pass does two batched matmuls and the backward pass four (the decomposition
  ``(1 - g) SDPA + g P v`` needs three and six).

  Args:
    q, k, v: ``(B, N, H, Dh)``.
    positional: ``(H, N, N)`` positional attention ``P`` (rows sum to 1), shared by the batch.
    gate: ``(H,)`` gate values ``g = sigmoid(lambda)``.
    scale: the logits' scale; None means ``Dh ** -0.5``.

  Returns:
    ``(B, N, H, Dh)`` in ``v``'s dtype.
  """
  return _gated(q, k, v, positional, gate, q.shape[-1] ** -0.5 if scale is None else float(scale))


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _gated(q, k, v, positional, gate, scale):
  return _gated_fwd(q, k, v, positional, gate, scale)[0]


def _gated_fwd(q, k, v, positional, gate, scale):
  qh, kh, vh = _to_heads_first(q), _to_heads_first(k), _to_heads_first(v)
  probs = _probabilities(qh, kh, None, scale)
  g = gate.astype(jnp.float32)[:, None, None]
  pos = positional.astype(jnp.float32)
  mixed = (1 - g) * probs + g * pos
  out = jnp.einsum("bhnm,bhmd->bhnd", mixed.astype(v.dtype), vh)
  return _to_heads_first(out), (qh, kh, vh, probs, positional, gate)


def _gated_bwd(scale, residuals, d_out):
  qh, kh, vh, probs, positional, gate = residuals
  d_out = _to_heads_first(d_out)
  f32 = partial(jnp.einsum, preferred_element_type=jnp.float32)
  g = gate.astype(jnp.float32)[:, None, None]
  pos = positional.astype(jnp.float32)
  mixed = (1 - g) * probs + g * pos
  d_v = f32("bhnm,bhnd->bhmd", mixed.astype(d_out.dtype), d_out)
  d_mixed = f32("bhnd,bhmd->bhnm", d_out, vh)
  d_gate = jnp.sum(sum_batch(d_mixed * (pos - probs))[0], axis=(1, 2))
  d_pos = g * sum_batch(d_mixed)[0]
  d_probs = (1 - g) * d_mixed
  d_logits = probs * (d_probs - jnp.sum(d_probs * probs, axis=-1, keepdims=True))
  d_scores = (d_logits * scale).astype(qh.dtype)
  d_q = f32("bhnm,bhmd->bhnd", d_scores, kh)
  d_k = f32("bhnm,bhnd->bhmd", d_scores, qh)
  grads = (d_q.astype(qh.dtype), d_k.astype(kh.dtype), d_v.astype(vh.dtype))
  return (
    *(_to_heads_first(x) for x in grads),
    d_pos.astype(positional.dtype),
    d_gate.astype(gate.dtype),
  )


_gated.defvjp(_gated_fwd, _gated_bwd)
