"""ConvMixer with the depthwise-filter inits of Zheng, Li, Lucey, Table 5 (runtime ~9 s).

The forward pass is compared with a PyTorch ConvMixer (the reference's layer order) carrying the
same weights, in eval mode (running statistics) and train mode (batch statistics).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

from locvit.configs.defaults import FROZEN_FILTERS
from locvit.models import create_model, list_models
from locvit.models.convmixer import ConvMixer, depthwise_filter_init
from locvit.optim import freeze_labels


class TorchConvMixer(nn.Module):
  """stem -> GELU -> BN; blocks x + BN(GELU(dwconv(x))), 1x1 conv -> GELU -> BN; pool, head."""

  def __init__(self, dim, depth, kernel_size, patch_size, num_classes, in_chans):
    super().__init__()
    self.stem = nn.Sequential(
      nn.Conv2d(in_chans, dim, patch_size, stride=patch_size), nn.GELU(), nn.BatchNorm2d(dim)
    )
    self.spatial = nn.ModuleList(
      nn.Sequential(
        nn.Conv2d(dim, dim, kernel_size, groups=dim, padding="same"), nn.GELU(), nn.BatchNorm2d(dim)
      )
      for _ in range(depth)
    )
    self.pointwise = nn.ModuleList(
      nn.Sequential(nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim)) for _ in range(depth)
    )
    self.head = nn.Linear(dim, num_classes)

  def forward(self, x):
    x = self.stem(x)
    for spatial, pointwise in zip(self.spatial, self.pointwise):
      x = pointwise(x + spatial(x))
    return self.head(x.mean(dim=(2, 3)))


def load_into_torch(tmodel: TorchConvMixer, params, stats) -> None:
  def conv(module, p):
    module.weight.data = torch.tensor(np.transpose(np.asarray(p["kernel"]), (3, 2, 0, 1)))
    module.bias.data = torch.tensor(np.asarray(p["bias"]))

  def bn(module, p, s):
    module.weight.data = torch.tensor(np.asarray(p["scale"]))
    module.bias.data = torch.tensor(np.asarray(p["bias"]))
    module.running_mean.data = torch.tensor(np.asarray(s["mean"]))
    module.running_var.data = torch.tensor(np.asarray(s["var"]))

  conv(tmodel.stem[0], params["stem"])
  bn(tmodel.stem[2], params["stem_norm"], stats["stem_norm"])
  for i, (spatial, pointwise) in enumerate(zip(tmodel.spatial, tmodel.pointwise)):
    block, block_stats = params[f"blocks_{i}"], stats[f"blocks_{i}"]
    conv(spatial[0], block["spatial"])
    bn(spatial[2], block["spatial_norm"], block_stats["spatial_norm"])
    conv(pointwise[0], block["pointwise"])
    bn(pointwise[2], block["pointwise_norm"], block_stats["pointwise_norm"])
  tmodel.head.weight.data = torch.tensor(np.asarray(params["head"]["kernel"]).T)
  tmodel.head.bias.data = torch.tensor(np.asarray(params["head"]["bias"]))


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")
def test_forward_matches_pytorch():
  kernel_size = 8  # even: 'same' pads (3, 4) in both libraries
  model = ConvMixer(5, dim=12, depth=2, kernel_size=kernel_size, patch_size=2, filter_init="random")
  images = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype(np.float32)
  shapes = flax.linen.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), images))
  rng = np.random.default_rng(1)  # random weights, norm parameters and running statistics
  draw = lambda lo, hi: lambda a: rng.uniform(lo, hi, a.shape).astype(np.float32)
  stats = jax.tree.map(draw(0.5, 1.5), shapes["batch_stats"])
  params = jax.tree.map(draw(-0.5, 0.5), shapes["params"])
  tmodel = TorchConvMixer(12, 2, kernel_size, 2, 5, 3)
  load_into_torch(tmodel, params, stats)
  x = torch.tensor(np.transpose(images, (0, 3, 1, 2)))

  apply = jax.jit(model.apply, static_argnames=("train", "mutable"))
  out = apply({"params": params, "batch_stats": stats}, images, train=False)
  np.testing.assert_allclose(np.asarray(out), tmodel.eval()(x).detach().numpy(), atol=1e-4)

  out, state = apply(
    {"params": params, "batch_stats": stats}, images, train=True, mutable=("batch_stats",)
  )
  expected = tmodel.train()(x).detach().numpy()  # batch statistics; updates running stats
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)
  np.testing.assert_allclose(
    np.asarray(state["batch_stats"]["blocks_1"]["spatial_norm"]["mean"]),
    tmodel.spatial[1][2].running_mean.numpy(),
    atol=1e-5,
  )  # momentum 0.1 in PyTorch's convention


def test_filter_inits():
  key = jax.random.key(0)
  shape = (5, 5, 1, 64)
  impulse = np.asarray(depthwise_filter_init("impulse", 5)(key, shape)).reshape(25, 64)
  np.testing.assert_array_equal((impulse != 0).sum(0), 1)
  np.testing.assert_allclose(impulse.max(0), 5**-0.5)
  assert len(set(impulse.argmax(0))) > 15  # a random tap per channel
  box = np.asarray(depthwise_filter_init("box", 5)(key, shape))
  np.testing.assert_allclose(box, 5**-1.5)  # all 25 taps, sqrt(1 / (25 * 5))
  four = np.asarray(depthwise_filter_init("box", 5, box_taps=4)(key, shape)).reshape(25, 64)
  np.testing.assert_array_equal((four != 0).sum(0), 4)
  np.testing.assert_allclose(four.max(0), (4 * 5) ** -0.5)
  random = np.asarray(depthwise_filter_init("random", 5)(key, shape))
  assert np.abs(random).max() <= 0.2 and random.std() > 0.1
  with pytest.raises(ValueError, match="filter_init='gauss' is not one of"):
    depthwise_filter_init("gauss", 3)
  with pytest.raises(ValueError, match=r"box_taps=10 must be in \[1, 9\]"):
    depthwise_filter_init("box", 3, box_taps=10)


def test_registered_models_and_freezing():
  names = list_models("convmixer_")
  assert {"convmixer_256_8_k3_patch2_32", "convmixer_512_8_k8_patch2_32"} <= set(names)
  model = create_model("convmixer_256_8_k5_patch2_32", num_classes=10, filter_init="impulse")
  assert (model.dim, model.depth, model.kernel_size, model.patch_size) == (256, 8, 5, 2)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  params = flax.linen.meta.unbox(shapes["params"])
  assert params["blocks_0"]["spatial"]["kernel"].shape == (5, 5, 1, 256)  # depthwise
  labels = flax.traverse_util.flatten_dict(freeze_labels(params, (FROZEN_FILTERS,)), sep="/")
  frozen = sorted(k for k, v in labels.items() if v == "frozen")
  assert frozen == sorted(f"blocks_{i}/spatial/{n}" for i in range(8) for n in ("bias", "kernel"))
  with pytest.raises(ValueError, match="not divisible by patch_size=2"):
    ConvMixer(10, dim=8, depth=1).init(jax.random.key(0), jnp.zeros((1, 7, 7, 3)))
