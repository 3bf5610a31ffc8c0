"""ConvMixer (Trockman & Kolter 2022) with the depthwise-filter inits of Zheng, Li, Lucey, Table 5.

    stem:   Conv(patch, stride patch) -> GELU -> BatchNorm
    block:  x + BN(GELU(depthwise_conv_k(x)))  ->  1x1 Conv -> GELU -> BN
    head:   global average pool -> Linear

Depthwise ("spatial mixing") filters, ``filter_init`` (the structured-init reference's
``SpatialConv2d_init``), for kernel size k:

- 'random': U(-1/k, 1/k) (paper columns "Trained" and "Random"; they differ only in freezing);
- 'impulse': a single 1 at a random tap per channel, scaled by sqrt(1/k) (reference 'box1');
- 'box': ones on ``box_taps`` random taps (default all k^2), scaled by sqrt(1/(taps * k)).

The depthwise bias is U(-1/k, 1/k). Everything else uses PyTorch's default init
(U(+-1/sqrt(fan_in)) weights and biases). Frozen filters ("Random", "Impulse", "Box") are trained
with the config's ``freeze`` patterns, e.g. ``(FROZEN_FILTERS,)`` (``locvit.configs.defaults``): the
reference freezes the filter together with its bias.

BatchNorm: PyTorch's momentum 0.1 / eps 1e-5, i.e. Flax ``momentum=0.9``; statistics live in the
``batch_stats`` collection, ``use_running_average = not train``.

Registered: ``convmixer_{256,512}_8_k{3,5,8}_patch2_32`` (depth 8, patch 2; paper Sec. 5.6).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention.projections import partitioned
from locvit.models.layers import classify, gelu
from locvit.platform.ops import promote_parameters

Array = jax.Array
FILTER_INITS = ("random", "impulse", "box")


def pytorch_uniform(fan_in: int):
  """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default Linear/Conv weight and bias init."""
  bound = 1.0 / np.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def depthwise_filter_init(kind: str, kernel_size: int, box_taps: int | None = None):
  """Initializer for a Flax depthwise kernel ``(k, k, 1, C)`` (see module docstring)."""
  if kind not in FILTER_INITS:
    raise ValueError(f"filter_init={kind!r} is not one of {FILTER_INITS}.")
  taps = kernel_size * kernel_size
  box_taps = taps if box_taps is None else box_taps
  if not 1 <= box_taps <= taps:
    raise ValueError(f"box_taps={box_taps} must be in [1, {taps}] for kernel_size={kernel_size}.")

  def init(key, shape, dtype=jnp.float32):
    channels = shape[-1]
    if kind == "random":
      bound = 1.0 / kernel_size
      return jax.random.uniform(key, shape, dtype, -bound, bound)
    count = 1 if kind == "impulse" else box_taps
    # `count` distinct random taps per channel: the first `count` of a random permutation.
    order = jnp.argsort(jax.random.uniform(key, (channels, taps)), axis=-1)
    mask = (
      jnp.zeros((channels, taps), dtype).at[jnp.arange(channels)[:, None], order[:, :count]].set(1)
    )
    scale = np.sqrt(1.0 / (count * kernel_size))
    return (scale * mask.T).reshape(kernel_size, kernel_size, 1, channels).astype(dtype)

  return init


class _Layers(nn.Module):
  """Keyword-only fields and constructors shared by the ConvMixer and its blocks: PyTorch-default
  convs and PyTorch-like BatchNorm."""

  _: dataclasses.KW_ONLY
  filter_init: str = "random"
  box_taps: int | None = None
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def _settings(self) -> dict[str, Any]:
    names = [f.name for f in dataclasses.fields(_Layers) if f.name not in ("parent", "name")]
    return {name: getattr(self, name) for name in names}

  def conv(self, features, kernel, fan_in, name, *, strides=1, groups=1, kernel_init=None):
    return nn.Conv(
      features,
      (kernel, kernel),
      strides=strides,
      padding="VALID" if strides > 1 else "SAME",  # SAME pads (k-1)//2 before, like torch
      feature_group_count=groups,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      promote_dtype=promote_parameters,
      kernel_init=partitioned(kernel_init or pytorch_uniform(fan_in), (None, None, None, "embed")),
      bias_init=partitioned(pytorch_uniform(fan_in), ("embed",)),
      name=name,
    )

  def bn(self, name: str, train: bool) -> nn.BatchNorm:
    return nn.BatchNorm(
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=self.bn_eps,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      scale_init=partitioned(nn.initializers.ones, ("embed",)),
      bias_init=partitioned(nn.initializers.zeros, ("embed",)),
      name=name,
    )


class MixerBlock(_Layers):
  """``x + BN(GELU(depthwise(x)))`` then ``BN(GELU(pointwise(.)))``."""

  dim: int
  kernel_size: int

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    k = self.kernel_size
    filters = depthwise_filter_init(self.filter_init, k, self.box_taps)
    # Depthwise: torch fan_in = k^2, so the bias is U(-1/k, 1/k) as in the reference.
    y = self.conv(self.dim, k, k * k, "spatial", groups=self.dim, kernel_init=filters)(x)
    x = x + self.bn("spatial_norm", train)(gelu(y))
    x = self.conv(self.dim, 1, self.dim, "pointwise")(x)
    return self.bn("pointwise_norm", train)(gelu(x))


class ConvMixer(_Layers):
  """ConvMixer mapping NHWC images to logits (see module docstring).

  Attributes:
    num_classes, dim, depth, kernel_size, patch_size: the usual sizes.
    filter_init: 'random', 'impulse' or 'box' depthwise filters; ``box_taps`` for 'box'.
    bn_momentum, bn_eps: BatchNorm settings (Flax convention).
  """

  num_classes: int
  dim: int = 256
  depth: int = 8
  kernel_size: int = 3
  patch_size: int = 2

  def check(self) -> None:
    """Validates ``filter_init`` and ``box_taps`` for ``kernel_size``; raises ValueError."""
    depthwise_filter_init(self.filter_init, self.kernel_size, self.box_taps)

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    _, height, width, channels = images.shape
    if height % self.patch_size or width % self.patch_size:
      raise ValueError(
        f"Image size {height}x{width} is not divisible by patch_size={self.patch_size}."
      )
    p = self.patch_size
    x = self.conv(self.dim, p, p * p * channels, "stem", strides=p)(images.astype(self.dtype))
    x = self.bn("stem_norm", train)(gelu(x))
    for i in range(self.depth):
      x = MixerBlock(self.dim, self.kernel_size, name=f"blocks_{i}", **self._settings())(x, train)
    x = jnp.mean(x, axis=(1, 2))
    return classify(
      self, x, kernel_init=pytorch_uniform(self.dim), bias_init=pytorch_uniform(self.dim)
    )


def convmixer(num_classes: int, *, dim: int, kernel_size: int) -> ConvMixer:
  """ConvMixer-``dim``/8 with ``kernel_size`` depthwise filters and patch 2 (Zheng, Li, Lucey,
  Sec. 5.6 and Table 5: dim 256 or 512, k 3, 5 or 8, on CIFAR-10).

  Registered as ``convmixer_{256,512}_8_k{3,5,8}_patch2_32``; ``filter_init`` defaults to
  'random' (override it for the Impulse / Box columns).
  """
  return ConvMixer(num_classes, dim=dim, depth=8, kernel_size=kernel_size, patch_size=2)


# name -> (build(num_classes), image size): the Table 5 ConvMixers, width 256/512, kernel 3/5/8.
MODELS = {
  f"convmixer_{dim}_8_k{k}_patch2_32": (functools.partial(convmixer, dim=dim, kernel_size=k), 32)
  for dim in (256, 512)
  for k in (3, 5, 8)
}
