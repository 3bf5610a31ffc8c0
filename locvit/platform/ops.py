"""The kernel setting, and token-wise linear maps that XLA:CPU differentiates quickly.

One setting picks every kernel of a model: ``attention_implementation``, resolved once when the
model is built (``resolve_implementation``) and passed down to every layer as ``implementation``:

- 'cpu_kernels' (what None becomes on CPU; 'einsum', its earlier name, is accepted and resolved
  to it): locvit's CPU code paths. Attention runs in the explicit kernels with hand-written
  backward passes (``locvit.attention.softmax_attention``), projections run as 2-D matmuls
  (below) and the patch embedding as patchify + matmul.
- 'xla', 'cudnn' or None (JAX's choice; what None stays on GPU and TPU): attention in
  ``jax.nn.dot_product_attention``, projections as ``dot_general`` on the full-rank kernels (which
  keeps the logical sharding of heads split over a ``model`` mesh axis) and the patch embedding
  as ``lax.conv``.

Why 2-D matmuls on CPU: a projection of ``(B, N, C)`` tokens is one matrix product, but XLA:CPU
lowers the *weight gradient* of the 3-D form (a contraction over both ``B`` and ``N``) and of
full-rank attention kernels such as ``(C, 3, H, Dh)`` far more slowly than the same product on
2-D operands (``benchmarks/attention_kernels.py``, docs/benchmarks.md). The reshapes are free.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen.dtypes
import jax
import jax.numpy as jnp
from jax import lax

from locvit.choices import check_choice

Array = jax.Array
IMPLEMENTATIONS = (None, "xla", "cudnn", "cpu_kernels", "einsum")
# The setting's earlier name, kept because configs saved by earlier runs (DIR/config.json, read by
# --mode=eval/analyze and on resume) hold it: docs/architecture.md.
ALIASES = {"einsum": "cpu_kernels"}


def check_implementation(implementation: str | None) -> None:
  """Raises ValueError naming the valid choices (and a close one) for an unknown
  ``implementation``."""
  check_choice("implementation", implementation, IMPLEMENTATIONS)


def resolve_implementation(implementation: str | None, platform: str) -> str | None:
  """The kernel setting a model is built with on ``platform`` (the backend, resolved once by the
  caller: ``locvit.models.create_model``): None becomes 'cpu_kernels' (the CPU code paths) on
  'cpu' and stays None (JAX's choice) elsewhere; the alias 'einsum' becomes 'cpu_kernels'."""
  check_implementation(implementation)
  if implementation is None and platform == "cpu":
    return "cpu_kernels"
  return ALIASES.get(implementation, implementation)


def model_implementation(model, platform: str) -> str | None:
  """The kernel setting a built model resolved (its ``attention_implementation``); for a model
  without one, what None resolves to on ``platform``."""
  return getattr(model, "attention_implementation", resolve_implementation(None, platform))


def cpu_kernels(implementation: str | None) -> bool:
  """Whether a (resolved) setting selects the CPU code paths."""
  return ALIASES.get(implementation, implementation) == "cpu_kernels"


# The step's shared ``one`` while ``training_step_fusions`` is open (``cast_parameter``).
_SHARED_ONE: contextvars.ContextVar[Array | None] = contextvars.ContextVar(
  "locvit_shared_one", default=None
)
# The same ``one`` when the context also splits parameter sums per example
# (``broadcast_per_example``).
_PER_EXAMPLE_ONE: contextvars.ContextVar[Array | None] = contextvars.ContextVar(
  "locvit_per_example_one", default=None
)
# Whether dense layers add their bias inside the matmul (``affine``), set by the training step
# compiled for XLA:GPU (``training_step_fusions(bias_in_matmul=True)``).
_BIAS_IN_MATMUL: contextvars.ContextVar[bool] = contextvars.ContextVar(
  "locvit_bias_in_matmul", default=False
)


def unfoldable_scalar(value: Any) -> Array:
  """``value`` as a float32 scalar, read out of a 2-vector behind an optimisation barrier, which
  XLA can neither fold to a constant nor slice back to a scalar. XLA:GPU's sibling multi-output
  fusion then counts it as an operand shared by the kernels that read it (an effective scalar it
  does not), and merges equal-shape siblings into one kernel per shape: this XLA has no
  horizontal fusion (docs/benchmarks.md, "The optimizer's and metrics' kernels on XLA:GPU")."""
  value = jnp.asarray(value, jnp.float32)
  return lax.optimization_barrier(jnp.stack([value, jnp.zeros_like(value)]))[0]


@contextlib.contextmanager
def training_step_fusions(
  per_example_sums: bool = False, bias_in_matmul: bool = False
) -> Iterator[None]:
  """The training step's forms that XLA fuses into fewer kernels (the same values), opened by the
  step around its loss and gradient (``run/step.py``; off the CPU code paths, whose step would
  only gain kernels):

  - always, ``cast_parameter`` casts every parameter as ``(p * one).astype(dtype)`` with one
    shared ``one``: exactly ``p``'s cast, and exactly its gradient. Each layer's cast of its
    float32 kernel and bias to the bf16 compute dtype is otherwise a kernel of its own on XLA:GPU
    (no horizontal fusion here); casts that read a common operand are merged by its sibling
    multi-output fusion, one kernel per shape for the blocks' equal-shape parameters
    (docs/benchmarks.md, "Parameter casts sharing one operand");
  - with ``per_example_sums``, ``broadcast_per_example`` reads the same ``one`` (gradients equal
    to float rounding);
  - with ``bias_in_matmul`` (the step compiled for XLA:GPU), ``bias_in_matmul()`` is True.

  ``one`` is an ``unfoldable_scalar``. Opened once per traced step, outside any ``nn.remat``;
  ``one`` is dropped on exit.
  """
  one = unfoldable_scalar(1.0)
  token = _SHARED_ONE.set(one)
  split = _PER_EXAMPLE_ONE.set(one if per_example_sums else None)
  inside = _BIAS_IN_MATMUL.set(bias_in_matmul)
  try:
    yield
  finally:
    _BIAS_IN_MATMUL.reset(inside)
    _PER_EXAMPLE_ONE.reset(split)
    _SHARED_ONE.reset(token)


def bias_in_matmul() -> bool:
  """Whether the training step being traced adds dense layers' biases inside their matmuls
  (``affine``) and folds stochastic depth into them: compiled for XLA:GPU, whose two-kernel
  column sums of the bias gradients this removes. Elsewhere (XLA:TPU's 128-wide matrix unit
  would give a contraction of 384 + 8 a whole tile more; evaluation) the plain bias add."""
  return _BIAS_IN_MATMUL.get()


def cast_parameter(param: Array, dtype: Any) -> Array:
  """``param`` in ``dtype``, through the shared ``one`` inside ``training_step_fusions``."""
  one = _SHARED_ONE.get()
  if one is None or param.dtype == dtype:
    return jnp.asarray(param, dtype)
  return jnp.asarray(param * one.astype(param.dtype), dtype)


def broadcast_per_example(value: Array, shape: tuple[int, ...]) -> Array:
  """``broadcast_to(value, (*shape, *value.shape))``; inside ``training_step_fusions(
  per_example_sums=True)`` (the training step off the CPU code paths) in two steps, over
  ``shape[0]`` (the examples), times the shared ``one``, then over the rest.

  Its transpose, the gradient of a parameter broadcast over the tokens, is then a sum over each
  example's tokens and, times ``one``, a sum over the examples, which XLA cannot merge back into
  one sum over every token (two kernels per parameter on XLA:GPU). The second sums of equal-shape
  parameters share ``one``, and XLA:GPU's sibling fusion merges some of them (docs/benchmarks.md,
  "The backward pass's kernels"). The same value; the sum is ordered otherwise (float rounding).
  """
  one = _PER_EXAMPLE_ONE.get()
  if one is None or len(shape) < 2:
    return jnp.broadcast_to(value, (*shape, *value.shape))
  rest = (1,) * (len(shape) - 1)
  per_example = jnp.broadcast_to(value, (shape[0], *rest, *value.shape)) * one.astype(value.dtype)
  return jnp.broadcast_to(per_example, (*shape, *value.shape))


def promote_parameters(inputs: Array, *params: Array | None, dtype: Any = None, inexact=True):
  """flax's ``promote_dtype`` for ``nn.Dense``/``nn.Conv(promote_dtype=...)`` (the inputs, then
  the parameters), the parameters cast by ``cast_parameter``."""
  dtype = flax.linen.dtypes.canonicalize_dtype(inputs, *params, dtype=dtype, inexact=inexact)
  return [jnp.asarray(inputs, dtype)] + [
    None if p is None else cast_parameter(p, dtype) for p in params
  ]


def contract(x: Array, kernel: Array, num_contracting: int = 1, *, flatten: bool = False) -> Array:
  """Contracts the last ``num_contracting`` axes of ``x`` with the first ones of ``kernel``.

  ``(..., *in) x (*in, *out) -> (..., *out)``, as ``jnp.tensordot(x, kernel, num_contracting)``;
  ``flatten`` computes it as one ``(prod(lead), prod(in)) @ (prod(in), prod(out))`` matmul.
  """
  if not flatten:
    return jnp.tensordot(x, kernel, axes=num_contracting)
  lead = x.shape[: x.ndim - num_contracting]
  out = kernel.shape[num_contracting:]
  fan_in = math.prod(kernel.shape[:num_contracting])
  y = jnp.reshape(x, (-1, fan_in)) @ jnp.reshape(kernel, (fan_in, math.prod(out)))
  return jnp.reshape(y, (*lead, *out))


def affine(
  x: Array, kernel: Array, bias: Array, num_contracting: int = 1, row_scale: Array | None = None
) -> Array:
  """``contract(x, kernel, num_contracting) + bias`` as one matmul, ``[x, 1, 0] @ [kernel; bias;
  0]``, so that the bias's gradient is a row of the kernel's gradient matmul.

  Autodiff of ``x @ kernel + bias`` sums the output's gradient over every token for the bias, a
  column reduction that XLA:GPU runs as two kernels (a partial sum, then the rest) per layer
  (docs/benchmarks.md, "The backward pass's kernels"); here the matmul that already forms the
  kernel's gradient, ``[x, 1, 0]^T dy``, forms the bias's too. The zero columns (none to seven)
  keep the contracted width a multiple of 8, as XLA otherwise pads a bf16 matmul's operands to
  one, in kernels of its own. Same function up to float rounding: the bias is summed in the
  matmul's accumulator, before its one rounding to the output dtype.

  ``row_scale`` (broadcastable to ``x``'s leading axes and a last axis of 1): the result times it,
  as ``[s x, s, 0] @ [kernel; bias; 0]`` (stochastic depth's per-example scale, ``Mlp``).
  """
  lead = x.shape[: x.ndim - num_contracting]
  fan_in = math.prod(kernel.shape[:num_contracting])
  out = kernel.shape[num_contracting:]
  zeros = -(fan_in + 1) % 8
  rows = jnp.reshape(x, (*lead, fan_in))
  ones = jnp.ones((*lead, 1), rows.dtype)
  if row_scale is not None:
    ones = jnp.broadcast_to(row_scale.astype(rows.dtype), ones.shape)
    rows = rows * ones
  rows = jnp.concatenate([rows, ones, jnp.zeros((*lead, zeros), rows.dtype)], axis=-1)
  # Pads and a sum, not a concatenation: XLA merges the equal-shape parameters' casts and pads
  # of the blocks into one kernel per shape (training_step_fusions), a concatenation it does not.
  weights = jnp.reshape(kernel, (fan_in, math.prod(out)))
  weights = jnp.pad(weights, ((0, 1 + zeros), (0, 0))) + jnp.pad(
    jnp.reshape(bias, (1, -1)).astype(weights.dtype), ((fan_in, zeros), (0, 0))
  )
  return jnp.reshape(rows @ weights, (*lead, *out))


def _flat_dot_general(
  lhs: Array,
  rhs: Array,
  dimension_numbers: Any,
  precision: Any = None,
  preferred_element_type: Any = None,
  **kwargs: Any,
) -> Array:
  """``lax.dot_general`` that runs ``nn.Dense``'s pattern (last axis of ``lhs`` with axis 0 of a
  2-D ``rhs``, no batch axes) as a 2-D matmul; anything else goes to ``lax.dot_general``."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  dense_pattern = (
    lhs.ndim > 2
    and rhs.ndim == 2
    and tuple(lhs_contract) == (lhs.ndim - 1,)
    and tuple(rhs_contract) == (0,)
    and not lhs_batch
    and not rhs_batch
  )
  if dense_pattern:
    lhs_flat = jnp.reshape(lhs, (-1, lhs.shape[-1]))
    dimension_numbers = (((1,), (0,)), ((), ()))
  else:
    lhs_flat = lhs
  y = lax.dot_general(
    lhs_flat,
    rhs,
    dimension_numbers,
    precision=precision,
    preferred_element_type=preferred_element_type,
    **kwargs,
  )
  return jnp.reshape(y, (*lhs.shape[:-1], rhs.shape[1])) if dense_pattern else y


def dense_dot_general(implementation: str | None) -> Callable[..., Array]:
  """The ``dot_general`` for ``nn.Dense(dot_general=...)`` under a kernel setting: flattening on
  the CPU code paths, ``lax.dot_general`` otherwise."""
  return _flat_dot_general if cpu_kernels(implementation) else lax.dot_general
