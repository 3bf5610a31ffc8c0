"""Initializers and the one multi-axis dense projection of every attention layer.

``DenseGeneral`` maps the last ``num_inputs`` axes of its input to ``features`` with a kernel
stored at full rank (``(*inputs, *features)``, e.g. a fused qkv kernel ``(C, 3, H, Dh)`` or an
output kernel ``(H, Dh, C)``), so logical partitioning also works when a model is initialised
inside a mesh context. Initializers see the flat ``(prod(inputs), prod(features))`` matrix, as
``nn.DenseGeneral`` and a PyTorch Linear do, so fan-in based inits use the full input width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.platform.ops import affine, bias_in_matmul, cast_parameter, contract, cpu_kernels

Array = jax.Array

# timm's ViT uses trunc-normal(0.02) weights and zero biases.
trunc_normal = nn.initializers.truncated_normal(0.02)
zeros = nn.initializers.zeros
# PyTorch's nn.Linear default weight init, kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in),
# 1/sqrt(fan_in)): variance_scaling(1/3, fan_in, uniform) has bound sqrt(3 * (1/3) / fan_in).
torch_linear_kernel_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_linear_bias_init(fan_in: int) -> Callable:
  """PyTorch's nn.Linear bias init ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
  bound = 1.0 / math.sqrt(fan_in)

  def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def normal_init(std: float, mean: Any = 0.0) -> Callable:
  """``N(mean, std^2)`` (``torch.randn(...) * std + mean``); ``mean`` may be an array."""

  def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    return jnp.asarray(mean, dtype) + std * jax.random.normal(key, shape, dtype)

  return init


def partitioned(init: Callable, names: tuple[str | None, ...]) -> Callable:
  """Shorthand for ``nn.with_logical_partitioning``: names are logical axes, see sharding.py."""
  return nn.with_logical_partitioning(init, names)


def flat_init(init: Callable, num_in_axes: int = 1) -> Callable:
  """Runs ``init`` on the flat ``(prod(in), prod(out))`` shape, then reshapes (module docstring)."""

  def wrapped(key, shape, dtype=jnp.float32):
    flat = (math.prod(shape[:num_in_axes]), math.prod(shape[num_in_axes:]))
    return jnp.reshape(init(key, flat, dtype), shape)

  return wrapped


def head_dim(dim: int, num_heads: int, head_dim: int | None = None) -> int:
  """Per-head width: ``head_dim`` if set, else ``dim // num_heads`` (which must divide)."""
  if head_dim is not None:
    return head_dim
  if dim % num_heads:
    raise ValueError(f"dim={dim} is not divisible by num_heads={num_heads}; set head_dim.")
  return dim // num_heads


class DenseGeneral(nn.Module):
  """A projection of the last ``num_inputs`` axes to ``features`` (module docstring).

  Attributes:
    features: output shape, e.g. ``(3, H, Dh)`` for a fused qkv projection.
    kernel_axes: logical axis names of the kernel ``(*inputs, *features)``.
    num_inputs: how many trailing input axes are contracted (2 to merge heads).
    implementation: the model's kernel setting (``locvit.platform.ops``): 'cpu_kernels' computes the
    product
      as one 2-D matmul and adds the bias; the others add the bias inside the matmul
      (``ops.affine``: its gradient comes from the kernel's gradient matmul) in a training step
      compiled for XLA:GPU (``ops.bias_in_matmul``), unless the logical-axis rules partition a
      contracted axis.
    use_bias, kernel_init, bias_init: the bias and the initializers (given the full kernel shape
      ``(*inputs, *features)``).
    dtype, param_dtype: computation and parameter dtypes.
  """

  features: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  num_inputs: int = 1
  use_bias: bool = True
  kernel_init: Callable = trunc_normal
  bias_init: Callable = zeros
  implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, row_scale: Array | None = None) -> Array:
    """``x``'s projection; times ``row_scale`` (``ops.affine``) when given."""
    shape = (*x.shape[x.ndim - self.num_inputs :], *self.features)
    kernel_init = flat_init(self.kernel_init, self.num_inputs)
    kernel = self.param(
      "kernel", partitioned(kernel_init, self.kernel_axes), shape, self.param_dtype
    )
    x, kernel = x.astype(self.dtype), cast_parameter(kernel, self.dtype)
    flatten = cpu_kernels(self.implementation)
    scaled = lambda y: y if row_scale is None else y * row_scale.astype(y.dtype)
    if not self.use_bias:
      return scaled(contract(x, kernel, self.num_inputs, flatten=flatten))
    names = self.kernel_axes[self.num_inputs :]
    bias = self.param("bias", partitioned(self.bias_init, names), self.features, self.param_dtype)
    bias = cast_parameter(bias, self.dtype)
    if flatten or not bias_in_matmul() or self._partitioned_inputs():
      return scaled(contract(x, kernel, self.num_inputs, flatten=flatten) + bias)
    return affine(x, kernel, bias, self.num_inputs, row_scale)

  def _partitioned_inputs(self) -> bool:
    """Whether the logical-axis rules in force map a contracted axis to the mesh (tensor
    parallel: 'mlp', 'heads'; FSDP: 'embed'): a ones column there would reshard the inputs."""
    mapped = {name for name, mesh_axes in nn.get_logical_axis_rules() if mesh_axes}
    return any(name in mapped for name in self.kernel_axes[: self.num_inputs])


def split_projections(fused: Array, implementation: str | None) -> tuple[Array, ...]:
  """The ``(B, N, P, H, Dh)`` output of a fused projection (``qkv``, ``qk``, ``kv``) as its P
  parts, each ``(B, N, H, Dh)`` (BTNH layout): the slices ``fused[:, :, i]``.

  Under XLA's attention (implementation None or 'xla') they are taken from one transpose to
  ``(P, B, H, N, Dh)``, the layout in which its batched matmuls (batch B and H) read them: XLA:GPU
  then lays out the projection's output once for all P, where each slice otherwise costs a
  transpose kernel of its own, forward and backward (docs/benchmarks.md, "A block's small
  kernels"). Same values. The CPU code paths and cuDNN's kernel (which reads BTNH) take slices.
  """
  parts = range(fused.shape[2])
  if cpu_kernels(implementation) or implementation == "cudnn":
    return tuple(fused[:, :, i] for i in parts)
  heads_major = jnp.transpose(fused, (2, 0, 3, 1, 4))
  return tuple(jnp.swapaxes(heads_major[i], 1, 2) for i in parts)


def qkv_projection(
  num_heads: int, head_dim: int, use_bias: bool = True, name: str = "qkv", **kwargs: Any
) -> DenseGeneral:
  """Fused query/key/value projection, kernel ``(C, 3, H, Dh)`` (timm's ``qkv``, reshaped)."""
  axes = ("embed", None, "heads", "kv")
  return DenseGeneral((3, num_heads, head_dim), axes, use_bias=use_bias, name=name, **kwargs)


def output_projection(features: int, name: str = "proj", **kwargs: Any) -> DenseGeneral:
  """Merges heads: kernel ``(H, Dh, C)`` and bias ``(C,)`` (timm's ``proj``, reshaped)."""
  return DenseGeneral((features,), ("heads", "kv", "embed"), num_inputs=2, name=name, **kwargs)
