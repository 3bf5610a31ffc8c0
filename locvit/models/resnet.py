"""ResNets: the CIFAR ResNet18 baseline of Cordonnier et al. (Table 1), and ImageNet ResNet-18/50
(He et al. 2016), the registry's CNN teachers for DeiT-style distillation (ConViT Table 4).

ImageNet variants (``resnet18``, ``resnet50``): 7x7 stride-2 stem + 3x3 stride-2 max-pool,
BasicBlocks (18) or Bottleneck blocks with expansion 4 and the stride on the 3x3 convolution
(torchvision's "ResNet v1.5"); 11.7M / 25.6M parameters for 1000 classes.

CIFAR variant (``resnet18_cifar``):

The kuangliu/pytorch-cifar ResNet that epfml/attention-cnn ships (``models/resnet.py``): a 3x3
stride-1 stem with 64 channels and no max-pool, four stages of two BasicBlocks (64, 128, 256, 512
channels; strides 1, 2, 2, 2), 1x1 projection shortcuts where the shape changes, global average
pooling and a linear classifier. Convolutions have no bias and symmetric padding 1 (PyTorch's
``padding=1``, also for the stride-2 convolutions, where ``'SAME'`` would pad asymmetrically).
Init is PyTorch's default (kaiming-uniform with a = sqrt(5) for convolutions and the Linear layer;
BatchNorm scale 1, bias 0). 11,173,962 parameters for 10 classes (the paper's 11.2M).

BatchNorm keeps running statistics in the ``batch_stats`` collection (PyTorch momentum 0.1 = Flax
momentum 0.9, eps 1e-5)::

  variables = model.init(rng, images)                   # {'params': ..., 'batch_stats': ...}
  logits, updates = model.apply(variables, images, train=True, mutable=['batch_stats'])
  variables = {'params': new_params, 'batch_stats': updates['batch_stats']}
  logits = model.apply(variables, images, train=False)  # uses the running averages
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention.projections import (
  partitioned,
  torch_linear_bias_init,
  torch_linear_kernel_init,
)
from locvit.models.layers import classify
from locvit.platform.ops import promote_parameters

Array = jax.Array


def _conv_and_norm(block: nn.Module, train: bool) -> tuple[Any, Any]:
  """Bias-free convolution (PyTorch default init) and BatchNorm factories for a residual block."""
  conv = functools.partial(
    nn.Conv,
    use_bias=False,
    dtype=block.dtype,
    param_dtype=block.param_dtype,
    promote_dtype=promote_parameters,
    kernel_init=partitioned(torch_linear_kernel_init, (None, None, None, "mlp")),
  )
  norm = functools.partial(
    nn.BatchNorm,
    use_running_average=not train,
    momentum=block.bn_momentum,
    epsilon=block.bn_eps,
    dtype=block.dtype,
    param_dtype=block.param_dtype,
  )
  return conv, norm


class _ResidualBlock(nn.Module):
  """Fields of a ResNet block: ``features`` (the block's width), ``strides`` of its first
  spatial convolution, BatchNorm settings and dtypes."""

  features: int
  strides: int = 1
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32


class BasicBlock(_ResidualBlock):
  """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``."""

  @nn.compact
  def __call__(self, x: Array, *, train: bool = False) -> Array:
    conv, norm = _conv_and_norm(self, train)
    pad = ((1, 1), (1, 1))
    y = conv(self.features, (3, 3), self.strides, padding=pad, name="conv1")(x)
    y = nn.relu(norm(name="bn1")(y))
    y = conv(self.features, (3, 3), 1, padding=pad, name="conv2")(y)
    y = norm(name="bn2")(y)
    shortcut = x
    if self.strides != 1 or x.shape[-1] != self.features:
      shortcut = conv(self.features, (1, 1), self.strides, padding="VALID", name="shortcut_conv")(x)
      shortcut = norm(name="shortcut_bn")(shortcut)
    return nn.relu(y + shortcut)


class Bottleneck(_ResidualBlock):
  """``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x))))))) + shortcut(x))``, 4x expansion."""

  @nn.compact
  def __call__(self, x: Array, *, train: bool = False) -> Array:
    conv, norm = _conv_and_norm(self, train)
    out = 4 * self.features
    y = nn.relu(norm(name="bn1")(conv(self.features, (1, 1), name="conv1")(x)))
    y = conv(self.features, (3, 3), self.strides, padding=((1, 1), (1, 1)), name="conv2")(y)
    y = nn.relu(norm(name="bn2")(y))
    y = norm(name="bn3")(conv(out, (1, 1), name="conv3")(y))
    shortcut = x
    if self.strides != 1 or x.shape[-1] != out:
      shortcut = conv(out, (1, 1), self.strides, padding="VALID", name="shortcut_conv")(x)
      shortcut = norm(name="shortcut_bn")(shortcut)
    return nn.relu(y + shortcut)


class ResNetCifar(nn.Module):
  """ResNet; NHWC images -> logits. The defaults are the CIFAR ResNet18 (3x3 stem, no max-pool).

  Attributes:
    num_classes: classifier width (0 returns the pooled features).
    stage_sizes: blocks per stage ((2, 2, 2, 2) is ResNet18, (3, 4, 6, 3) ResNet-50).
    width: channels of the first stage (doubled at every later stage).
    imagenet_stem: 7x7 stride-2 stem convolution + 3x3 stride-2 max-pool (ImageNet ResNets).
    bottleneck: Bottleneck blocks (4x expansion) instead of BasicBlocks.
    bn_momentum, bn_eps: BatchNorm running-average momentum (Flax convention) and epsilon.
  """

  num_classes: int
  stage_sizes: Sequence[int] = (2, 2, 2, 2)
  width: int = 64
  imagenet_stem: bool = False
  bottleneck: bool = False
  bn_momentum: float = 0.9
  bn_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    x = images.astype(self.dtype)
    kernel, stride, pad = (7, 2, 3) if self.imagenet_stem else (3, 1, 1)
    x = nn.Conv(
      self.width,
      (kernel, kernel),
      stride,
      padding=((pad, pad), (pad, pad)),
      use_bias=False,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      promote_dtype=promote_parameters,
      kernel_init=partitioned(torch_linear_kernel_init, (None, None, None, "mlp")),
      name="stem_conv",
    )(x)
    x = nn.BatchNorm(
      use_running_average=not train,
      momentum=self.bn_momentum,
      epsilon=self.bn_eps,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="stem_bn",
    )(x)
    x = nn.relu(x)
    if self.imagenet_stem:
      x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    block_cls = Bottleneck if self.bottleneck else BasicBlock
    for stage, num_blocks in enumerate(self.stage_sizes):
      for block in range(num_blocks):
        x = block_cls(
          self.width * 2**stage,
          strides=2 if stage > 0 and block == 0 else 1,
          bn_momentum=self.bn_momentum,
          bn_eps=self.bn_eps,
          dtype=self.dtype,
          param_dtype=self.param_dtype,
          name=f"stage{stage + 1}_block{block + 1}",
        )(x, train=train)
    x = jnp.mean(x, axis=(1, 2))
    inits = dict(
      kernel_init=torch_linear_kernel_init, bias_init=torch_linear_bias_init(x.shape[-1])
    )
    return classify(self, x, **inits)


def resnet18_cifar(num_classes: int) -> ResNetCifar:
  """CIFAR ResNet18 (3x3 stem, no max-pool, stages (2, 2, 2, 2) of 64-512 channels): the
  Cordonnier et al. Table 1 baseline, 11.2M parameters for 10 classes."""
  return ResNetCifar(num_classes=num_classes, stage_sizes=(2, 2, 2, 2))


def resnet18(num_classes: int) -> ResNetCifar:
  """ImageNet ResNet-18 (He et al. 2016): 7x7 stem + max-pool, BasicBlocks (2, 2, 2, 2);
  11.7M parameters for 1000 classes."""
  return ResNetCifar(num_classes=num_classes, stage_sizes=(2, 2, 2, 2), imagenet_stem=True)


def resnet50(num_classes: int) -> ResNetCifar:
  """ImageNet ResNet-50 v1.5 (He et al. 2016): 7x7 stem + max-pool, Bottleneck blocks
  (3, 4, 6, 3); 25.6M parameters for 1000 classes; a CNN teacher for DeiT-style distillation."""
  return ResNetCifar(
    num_classes=num_classes, stage_sizes=(3, 4, 6, 3), imagenet_stem=True, bottleneck=True
  )


# name -> (build(num_classes), image size)
MODELS = {
  "resnet18_cifar": (resnet18_cifar, 32),
  "resnet18": (resnet18, 224),
  "resnet50": (resnet50, 224),
}
