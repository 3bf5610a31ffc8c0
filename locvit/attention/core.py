"""The attention core: content logits, positional terms, softmax, value mix. Written once.

Every attention layer of locvit (``Attention``, which also serves the GMM / ELM kinds, Swin's
window attention, CaiT's talking heads and T2T's token transformer; ``GPSA``;
``RelativeAttention``) projects its queries, keys and values, then calls ``attend``. A positional
term enters through a combine rule:

================  =======================================================  ================
``combine``       attention                                                fused kernel
================  =======================================================  ================
(no term)         ``softmax(q k^T s) v``                                   yes
``'add'``         ``softmax(q k^T s + P) v``                               yes (``bias``)
``'multiply'``    ``softmax((q k^T s) * P) v``                             no
``'gate'``        ``((1 - g) softmax(q k^T s) + g P) v``                   yes (content)
``'replace'``     ``softmax(P) v``                                         no (none needed)
================  =======================================================  ================

``s`` is ``1 / sqrt(Dh)`` unless the layer passes ``scale``. Several terms apply in order (Swin:
mask, then relative bias, then shift mask). ``P`` of shape ``(H, N, M)`` covers patch tokens and
is shared by the batch; prefix tokens (class / distillation tokens) get neutral rows and columns
(0 for 'add', 1 for 'multiply'). A 4-D ``(B, H or 1, n, m)`` table is a per-example term that
already covers every token (Swin's shifted-window mask).

Fused or explicit: with attention maps requested (``mutable=['intermediates']``), attention
dropout active, a 'multiply' term or a ``LogitsHook`` (CaiT's talking heads), the probabilities
are materialised; otherwise the layer's ``implementation`` runs: ``jax.nn.dot_product_attention``
('xla', 'cudnn', None) or the explicit kernels with hand-written backward passes ('cpu_kernels', the
CPU code path); see ``softmax_attention.py``. 'gate' splits into ``(1 - g) SDPA + g (P v)`` under
JAX's kernel and runs ``gated_positional_attention`` under 'cpu_kernels'.

Tables shared by the batch enter the explicit logits through ``batch_broadcast``, whose gradient
sums the batch as a matmul (XLA:CPU's column reduction is ~20x slower).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention.softmax_attention import (
  dot_product_attention,
  gated_positional_attention,
  sum_batch,
)
from locvit.platform.ops import check_implementation, cpu_kernels

Array = jax.Array
COMBINE_RULES = ("add", "multiply", "gate", "replace")
NEUTRAL = {"add": 0.0, "multiply": 1.0}  # the prefix tokens' entry of a table


@dataclasses.dataclass(frozen=True)
class Term:
  """A positional term: ``table`` entering the attention by ``combine`` (module docstring).

  ``gate`` (H,) holds ``g = sigmoid(lambda)`` for 'gate', where ``table`` is the positional
  attention (rows sum to 1); for the other rules ``table`` holds logits or a mask.
  """

  table: Array
  combine: str
  gate: Array | None = None

  def __post_init__(self):
    if self.combine not in COMBINE_RULES:
      raise ValueError(f"combine={self.combine!r} is not one of {COMBINE_RULES}.")
    if (self.combine == "gate") != (self.gate is not None):
      raise ValueError("A positional term has a gate exactly when combine='gate'.")


@dataclasses.dataclass(frozen=True)
class LogitsHook:
  """The one hook for special cases: ``before_softmax`` maps the ``(B, H, N, M)`` float32 logits
  (after every positional term) and ``after_softmax`` the probabilities. CaiT's talking heads
  mix heads with both. A hook forces the explicit path."""

  before_softmax: Callable[[Array], Array] = lambda logits: logits
  after_softmax: Callable[[Array], Array] = lambda probs: probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def batch_broadcast(table: Array, batch: int) -> Array:
  """``broadcast_to(table, (batch, *table.shape))`` whose gradient sums the batch as a matmul.

  The gradient of a table shared by the batch sums a ``(B, H, N, N)`` cotangent over ``B``, with
  the kernels' ``sum_batch``. The forward broadcast fuses into its consumer.
  """
  return jnp.broadcast_to(table, (batch, *table.shape))


def _batch_broadcast_fwd(table: Array, batch: int) -> tuple[Array, None]:
  return batch_broadcast(table, batch), None


def _batch_broadcast_bwd(batch: int, _: None, g: Array) -> tuple[Array]:
  del batch
  return (sum_batch(g)[0],)


batch_broadcast.defvjp(_batch_broadcast_fwd, _batch_broadcast_bwd)


def embed_prefix(table: Array, num_prefix_tokens: int, fill: float) -> Array:
  """Pads an ``(H, N, M)`` patch-token table with ``fill`` rows/columns for prefix tokens."""
  if not num_prefix_tokens:
    return table
  pad = ((0, 0), (num_prefix_tokens, 0), (num_prefix_tokens, 0))
  return jnp.pad(table, pad, constant_values=fill)


def wants_attention_maps(module: nn.Module) -> bool:
  """True when the caller collects intermediates, so attention maps must be materialised."""
  return module.is_mutable_collection("intermediates")


def can_fuse(terms: Sequence[Term], hook: LogitsHook | None = None) -> bool:
  """Whether the math allows ``jax.nn.dot_product_attention`` (module docstring's table)."""
  return hook is None and not any(t.combine in ("multiply", "replace") for t in terms)


def _mix_values(probs: Array, v: Array) -> Array:
  """``probs @ v`` per head. ``probs`` ``(B, H, N, M)`` or batch-shared ``(H, N, M)``; ``v``
  ``(B, M, H, Dv)`` or ``(B, M, C)`` (raw values shared by the heads). Returns ``(B, N, H, D)``."""
  batch = "b" if probs.ndim == 4 else ""
  values = "bmhd" if v.ndim == 4 else "bmd"
  return jnp.einsum(f"{batch}hnm,{values}->bnhd", probs, v)


def _additive_bias(terms: Sequence[Term], num_prefix_tokens: int, batch: int) -> Array | None:
  """The sum of the 'add' terms as one ``(B or 1, H, N, M)`` float32 bias (fused path)."""
  shared = [
    embed_prefix(t.table.astype(jnp.float32), num_prefix_tokens, 0.0)
    for t in terms
    if t.combine == "add" and t.table.ndim == 3
  ]
  per_example = [t.table for t in terms if t.combine == "add" and t.table.ndim == 4]
  bias = functools.reduce(jnp.add, shared) if shared else None
  if not per_example:
    return None if bias is None else bias[None]
  total = functools.reduce(jnp.add, per_example).astype(jnp.float32)
  return total if bias is None else batch_broadcast(bias, batch) + total


def _apply_terms(logits: Array, terms: Sequence[Term], num_prefix_tokens: int) -> Array:
  """Explicit path: applies the 'add' / 'multiply' terms in order to float32 logits."""
  for term in terms:
    if term.combine not in NEUTRAL:
      continue
    table = term.table.astype(jnp.float32)
    if table.ndim == 3:
      table = embed_prefix(table, num_prefix_tokens, NEUTRAL[term.combine])
      table = batch_broadcast(table, logits.shape[0])
    logits = logits * table if term.combine == "multiply" else logits + table
  return logits


def check_term_shapes(
  terms: Sequence[Term], num_heads: int | None, queries: int, keys: int, num_prefix_tokens: int
) -> None:
  """One clear line for a batch-shared ``(H, n, m)`` table that does not fit the layer's heads or
  patch tokens (a layer of one's own given another grid, a class token without
  ``num_prefix_tokens``, a term built for another head count), instead of a broadcasting error."""
  patches = (queries - num_prefix_tokens, keys - num_prefix_tokens)
  for term in terms:
    if term.table.ndim != 3:
      continue
    heads, *covered = term.table.shape
    if tuple(covered) != patches:
      raise ValueError(
        f"The positional term's table covers {covered[0]} patch tokens, but the layer got "
        f"{queries} tokens with num_prefix_tokens={num_prefix_tokens}: pass "
        "grid=TokenGrid(HEIGHT, WIDTH) of the patch tokens, and num_prefix_tokens=K for K class "
        "tokens placed first."
      )
    if num_heads is not None and heads not in (1, num_heads):
      raise ValueError(
        f"The positional term's table has {heads} heads, the layer {num_heads}: build the term "
        f"with num_heads={num_heads}."
      )


def attend(
  module: nn.Module,
  q: Array,
  k: Array,
  v: Array,
  *,
  terms: Sequence[Term] = (),
  num_prefix_tokens: int = 0,
  scale: float | None = None,
  hook: LogitsHook | None = None,
  attn_drop: float = 0.0,
  train: bool = False,
  implementation: str | None = None,
  fused: bool = True,
) -> Array:
  """Attention of queries ``q`` ``(B, N, H, Dh)`` over keys ``k`` ``(B, M, H, Dh)`` and values
  ``v`` ``(B, M, H, Dv)`` or ``(B, M, C)``, with positional ``terms`` (module docstring).

  Called from a layer's compact method: the attention probabilities are sown there as the
  ``'attention'`` intermediate, and attention dropout is a child of the layer. ``fused=False``
  always materialises the probabilities (the reference form). Returns ``(B, N, H, Dv)``.
  """
  check_implementation(implementation)
  check_combination(terms, v, num_prefix_tokens)
  heads = q.shape[2] if q.ndim == 4 else None  # 3-D: positional-only layers pass raw tokens
  check_term_shapes(terms, heads, q.shape[1], k.shape[1], num_prefix_tokens)
  dropout = lambda p: nn.Dropout(attn_drop, name="attention_dropout")(p, deterministic=not train)
  rules = [t.combine for t in terms]

  if rules == ["replace"]:  # positional only: softmax(P) once, shared by the batch
    probs = jax.nn.softmax(terms[0].table.astype(jnp.float32), axis=-1)
    if wants_attention_maps(module):
      module.sow("intermediates", "attention", jnp.broadcast_to(probs, (q.shape[0], *probs.shape)))
    return _mix_values(dropout(probs).astype(v.dtype), v)

  explicit = (
    not fused
    or not can_fuse(terms, hook)
    or wants_attention_maps(module)
    or (train and attn_drop > 0.0)
    or v.shape[-1] != q.shape[-1]  # JAX's kernel needs values as wide as queries and keys
  )
  if not explicit:
    return _fused_attention(q, k, v, terms, num_prefix_tokens, scale, train, implementation)
  probs = explicit_probabilities(q, k, terms, num_prefix_tokens, scale, hook)
  module.sow("intermediates", "attention", probs)
  return _mix_values(dropout(probs).astype(v.dtype), v)


def check_combination(terms: Sequence[Term], v: Array, num_prefix_tokens: int) -> None:
  """Raises ValueError for terms whose rules do not combine: 'replace' and 'gate' take one term,
  on patch tokens only, and 'gate' per-head values."""
  rules = [t.combine for t in terms]
  if ("replace" in rules or "gate" in rules) and len(terms) != 1:
    raise ValueError(f"combine 'replace' and 'gate' take a single positional term, got {rules}.")
  if "gate" in rules and v.ndim != 4:
    raise ValueError("combine='gate' needs per-head values (B, M, H, Dv).")
  if ("replace" in rules or "gate" in rules) and num_prefix_tokens:
    raise ValueError(
      f"combine={rules[0]!r} attention has no prefix tokens (it is defined on patch tokens "
      f"only), got num_prefix_tokens={num_prefix_tokens}."
    )


def _fused_attention(q, k, v, terms, num_prefix_tokens, scale, train, implementation) -> Array:
  """The fused forms (module docstring): SDPA with the terms as its additive bias, or for the
  gate ``(1 - g) SDPA(q, k, v) + g (P v)``."""
  dtype = v.dtype
  if [t.combine for t in terms] == ["gate"]:
    pos, gate = terms[0].table, terms[0].gate
    if cpu_kernels(implementation):
      return gated_positional_attention(q, k, v, pos, gate, scale)
    content = dot_product_attention(
      q, k, v, implementation=implementation, scale=scale, training=train
    )
    g = gate[:, None].astype(dtype)  # broadcasts over (B, N, H, Dh)
    return (1 - g) * content + g * _mix_values(pos.astype(dtype), v)
  bias = _additive_bias(terms, num_prefix_tokens, q.shape[0])
  if v.ndim == 3:  # raw values shared by the heads
    v = jnp.broadcast_to(v[:, :, None, :], (*v.shape[:2], q.shape[2], v.shape[-1]))
  bias = None if bias is None else bias.astype(q.dtype)
  return dot_product_attention(
    q, k, v, bias=bias, implementation=implementation, scale=scale, training=train
  )


def explicit_probabilities(q, k, terms, num_prefix_tokens, scale, hook) -> Array:
  """The attention probabilities ``(B, H, N, M)``, float32, written out: content logits
  ``q k^T s``, the terms combined by their rules, the hook around the softmax."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  logits = jnp.einsum("bnhd,bmhd->bhnm", q, k).astype(jnp.float32) * scale
  logits = _apply_terms(logits, terms, num_prefix_tokens)
  if hook is not None:
    logits = hook.before_softmax(logits)
  probs = jax.nn.softmax(logits, axis=-1)
  if [t.combine for t in terms] == ["gate"]:
    g = terms[0].gate.astype(jnp.float32)[:, None, None]
    probs = (1 - g) * probs + g * terms[0].table.astype(jnp.float32)
    # Exact no-op in exact arithmetic; kept because ConViT's reference renormalises (Eq. 6).
    probs = probs / jnp.sum(probs, axis=-1, keepdims=True)
  if hook is not None:
    probs = hook.after_softmax(probs)
  return probs
