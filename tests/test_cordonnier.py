"""Cordonnier et al.: the network, the ResNet18 baseline, head pruning, plots, paper configs."""

from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from torch import nn as tnn

from configs import cordonnier_cifar10
from locvit.analysis.centers import (
  attention_maps,
  gaussian_mass_levels,
  gaussian_on_mesh,
  mass_contour_levels,
  plot_attention_centers,
  plot_attention_probabilities,
)
from locvit.analysis.pruning import prune_checkpoint
from locvit.attention import TokenGrid
from locvit.models import apply_with_intermediates, create_model, list_models
from locvit.models.cordonnier import space_to_depth
from locvit.models.surgery import (
  PruneThresholds,
  attention_layers,
  cost,
  count_params,
  degenerate_heads,
  prune_degenerate_heads,
  prune_heads,
)

SMALL = dict(hidden_dim=16, mlp_dim=24, depth=2, num_heads=4)
IMAGES = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))


def small_model(name, **overrides):
  return create_model(name, num_classes=3, **{**SMALL, **overrides})


def init(model, images=IMAGES, seed=0):
  """Random variables with the model's shapes, drawn in NumPy.

  Much faster than ``model.init`` on CPU (eager or jitted, JAX's PRNG compiles per shape); the
  values are generic (kernels ~ N(0, 1/fan_in), spreads near 1 or I, BatchNorm variances > 0).
  ``test_model_structure_dropout_and_intermediates`` checks the real init once.
  """
  shapes = flax.linen.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), images))
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = path[-1].key
    noise = rng.normal(size=leaf.shape).astype(np.float32)
    if name == "attention_spreads":
      base = np.eye(2, dtype=np.float32) if len(leaf.shape) == 3 else 1.0
      return base + 0.2 * noise
    if name == "attention_centers":
      return 1.5 * noise
    if name in ("scale", "var"):
      return 1.0 + 0.2 * np.abs(noise)
    if name in ("bias", "mean"):
      return 0.1 * noise
    if name == "kernel":
      return noise / np.sqrt(np.prod(leaf.shape[:-1]))
    return noise  # embedding tables

  return jax.tree_util.tree_map_with_path(draw, shapes)


def numpy_tree(tree):
  return jax.tree.map(lambda a: np.array(a, np.float32), tree)


def read_magic(path):
  with open(path, "rb") as f:
    return f.read(8)


def num_params(tree):
  return sum(np.size(x) for x in jax.tree.leaves(tree))


# ---------------------------------------------------------------------------------------------
# PyTorch reference (epfml/attention-cnn models/bert.py, forward passes as in the shared notes)


class BertLayerNorm(tnn.Module):
  def __init__(self, size, eps=1e-12):
    super().__init__()
    self.weight = tnn.Parameter(torch.ones(size))
    self.bias = tnn.Parameter(torch.zeros(size))
    self.eps = eps

  def forward(self, x):
    u = x.mean(-1, keepdim=True)
    s = (x - u).pow(2).mean(-1, keepdim=True)
    return self.weight * (x - u) / torch.sqrt(s + self.eps) + self.bias


class GaussianSelfAttention(tnn.Module):
  def __init__(self, hidden, heads, isotropic, max_side=8):
    super().__init__()
    self.heads, self.isotropic = heads, isotropic
    self.attention_centers = tnn.Parameter(torch.zeros(heads, 2))
    self.attention_spreads = tnn.Parameter(
      torch.zeros(heads) if isotropic else torch.zeros(heads, 2, 2)
    )
    self.value = tnn.Linear(heads * hidden, hidden)
    range_ = torch.arange(max_side)
    grid = torch.cat([t.unsqueeze(-1) for t in torch.meshgrid([range_, range_], indexing="ij")], -1)
    rel = grid.unsqueeze(0).unsqueeze(0) - grid.unsqueeze(-2).unsqueeze(-2)
    R = torch.cat([rel, rel**2, (rel[..., 0] * rel[..., 1]).unsqueeze(-1)], dim=-1)
    self.register_buffer("R", R.double())

  def get_heads_target_vectors(self):
    if self.isotropic:
      a = c = self.attention_spreads**2
      b = torch.zeros_like(self.attention_spreads)
    else:
      inv = torch.einsum("hij,hkj->hik", [self.attention_spreads, self.attention_spreads])
      a, b, c = inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]
    mu_1, mu_2 = self.attention_centers[:, 0], self.attention_centers[:, 1]
    u = [-2 * (a * mu_1 + b * mu_2), -2 * (c * mu_2 + b * mu_1), a, c, 2 * b]
    return -1 / 2 * torch.stack(u, -1)

  def forward(self, hidden_states):
    b, w, h, _ = hidden_states.shape
    u = self.get_heads_target_vectors()
    scores = torch.einsum("ijkld,hd->ijhkl", [self.R[:w, :h, :w, :h, :], u])
    probs = torch.softmax(scores.reshape(w, h, self.heads, -1), dim=-1).view(w, h, self.heads, w, h)
    values = torch.einsum("ijhkl,bkld->bijhd", probs, hidden_states).contiguous().view(b, w, h, -1)
    return self.value(values)


class Learned2DRelativeSelfAttention(tnn.Module):
  def __init__(self, hidden, heads, use_attention_data, max_pos):
    super().__init__()
    self.heads, self.hidden, self.use_attention_data = heads, hidden, use_attention_data
    self.row_embeddings = tnn.Embedding(2 * max_pos - 1, hidden)
    self.col_embeddings = tnn.Embedding(2 * max_pos - 1, hidden)
    self.head_keys_row = tnn.Linear(hidden, heads, bias=False)
    self.head_keys_col = tnn.Linear(hidden, heads, bias=False)
    if use_attention_data:
      self.query = tnn.Linear(hidden, heads * hidden)
      self.key = tnn.Linear(hidden, heads * hidden)
    self.value = tnn.Linear(heads * hidden, hidden)
    deltas = torch.arange(max_pos).view(1, -1) - torch.arange(max_pos).view(-1, 1)
    self.register_buffer("relative_indices", deltas + max_pos - 1)

  def forward(self, hidden_states):
    b, w, h, _ = hidden_states.shape
    data_scores = None
    if self.use_attention_data:
      q = self.query(hidden_states).view(b, w, h, self.heads, self.hidden)
      k = self.key(hidden_states).view(b, w, h, self.heads, self.hidden)
      data_scores = torch.einsum("bijhd,bklhd->bijhkl", q, k) / math.sqrt(self.hidden)
    width, height = w, h
    idx = self.relative_indices[:width, :width].reshape(-1)
    row = self.head_keys_row(self.row_embeddings(idx)).view(1, width, 1, width, self.heads)
    idx = self.relative_indices[:height, :height].reshape(-1)
    col = self.head_keys_col(self.col_embeddings(idx)).view(height, 1, height, 1, self.heads)
    scores = (row + col).permute(0, 1, 4, 2, 3)
    batch_dim = []
    if data_scores is not None:
      scores = scores.unsqueeze(0) + data_scores
      batch_dim = [b]
    flat = [*batch_dim, height, width, self.heads, height * width]
    probs = torch.softmax(scores.reshape(flat), dim=-1).view(*flat[:-1], height, width)
    spec = ("b" if self.use_attention_data else "") + "ijhkl,bkld->bijhd"
    values = torch.einsum(spec, probs, hidden_states).contiguous().view(b, w, h, -1)
    return self.value(values)


class TorchBertImage(tnn.Module):
  def __init__(self, kind, content, hidden, mlp, depth, heads, classes, side):
    super().__init__()
    self.features_upscale = tnn.Linear(12, hidden)
    self.layers = tnn.ModuleList()
    for _ in range(depth):
      if kind == "learned_relative":
        attn = Learned2DRelativeSelfAttention(hidden, heads, content, side)
      else:
        attn = GaussianSelfAttention(hidden, heads, kind == "quadratic", side)
      layer = tnn.ModuleDict(
        dict(
          attn=attn,
          attn_dense=tnn.Linear(hidden, hidden),
          attn_norm=BertLayerNorm(hidden),
          mlp_dense1=tnn.Linear(hidden, mlp),
          mlp_dense2=tnn.Linear(mlp, hidden),
          mlp_norm=BertLayerNorm(hidden),
        )
      )
      self.layers.append(layer)
    self.classifier = tnn.Linear(hidden, classes)

  def forward(self, images):  # NHWC
    b, hh, ww, c = images.shape
    x = images.view(b, hh // 2, 2, ww // 2, 2, c).permute(0, 1, 3, 2, 4, 5)
    x = self.features_upscale(x.reshape(b, hh // 2, ww // 2, 4 * c))
    for layer in self.layers:
      a = layer["attn_norm"](layer["attn_dense"](layer["attn"](x)) + x)
      i = tnn.functional.gelu(layer["mlp_dense1"](a))
      x = layer["mlp_norm"](layer["mlp_dense2"](i) + a)
    return self.classifier(x.mean(dim=(1, 2)))


def load_into_torch(torch_model, params, heads):
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)

  def linear(module, p):
    module.weight.data = t(p["kernel"]).reshape(-1, p["kernel"].shape[-1]).T.contiguous()
    if "bias" in p:
      module.bias.data = t(p["bias"]).reshape(-1)

  def norm(module, p):
    module.weight.data, module.bias.data = t(p["scale"]), t(p["bias"])

  linear(torch_model.features_upscale, params["embed"])
  linear(torch_model.classifier, params["head"])
  for i, layer in enumerate(torch_model.layers):
    p = params[f"layers_{i}"]
    attn, pa = layer["attn"], p["attn"]
    # value: (H, D, D) -> torch (D, H * D) with input index h * D + d.
    linear(attn.value, {"kernel": pa["value"]["kernel"], "bias": pa["value"]["bias"]})
    pos = pa["positional"]
    if "attention_centers" in pos:
      attn.attention_centers.data = t(pos["attention_centers"])
      attn.attention_spreads.data = t(pos["attention_spreads"])
    else:
      attn.row_embeddings.weight.data = t(pos["row_embeddings"])
      attn.col_embeddings.weight.data = t(pos["col_embeddings"])
      linear(attn.head_keys_row, pos["head_keys_row"])
      linear(attn.head_keys_col, pos["head_keys_col"])
      for name in ("query", "key") if "query" in pa else ():
        kernel = pa[name]["kernel"]  # (D, H, Dh) -> torch (H * Dh, D), output index h * Dh + d
        getattr(attn, name).weight.data = t(kernel).reshape(kernel.shape[0], -1).T.contiguous()
        getattr(attn, name).bias.data = t(pa[name]["bias"]).reshape(-1)
    linear(layer["attn_dense"], p["attn_dense"])
    norm(layer["attn_norm"], p["attn_norm"])
    linear(layer["mlp_dense1"], p["mlp_dense1"])
    linear(layer["mlp_dense2"], p["mlp_dense2"])
    norm(layer["mlp_norm"], p["mlp_norm"])
  return torch_model.double().eval()


# ---------------------------------------------------------------------------------------------
# The model


def test_space_to_depth_channel_order():
  images = np.arange(2 * 4 * 6 * 3, dtype=np.float32).reshape(2, 4, 6, 3)
  out = np.asarray(space_to_depth(jnp.asarray(images), 2))
  assert out.shape == (2, 2, 3, 12)
  for r, c, dr, dc, ch in np.ndindex(2, 3, 2, 2, 3):
    assert out[1, r, c, dr * (2 * 3) + dc * 3 + ch] == images[1, 2 * r + dr, 2 * c + dc, ch]
  with pytest.raises(ValueError, match="divisible by 2"):
    space_to_depth(jnp.zeros((1, 5, 6, 3)))


@pytest.mark.parametrize(
  "name",
  [
    "cordonnier_sa",
    "cordonnier_sa_generalized",
    "cordonnier_sa_learned",
    "cordonnier_sa_learned_content",
  ],
)
def test_matches_pytorch_reference(name):
  model = small_model(name)
  variables = init(model)
  params = variables["params"]
  torch_model = TorchBertImage(model.attention, model.content, 16, 24, 2, 4, 3, side=4)
  torch_model = load_into_torch(torch_model, params, 4)
  with torch.no_grad():
    expected = torch_model(torch.tensor(np.asarray(IMAGES), dtype=torch.float64)).numpy()
  logits = model.apply(variables, IMAGES)
  np.testing.assert_allclose(logits, expected, atol=2e-4, rtol=1e-4)


def test_model_structure_dropout_and_intermediates():
  model = small_model("cordonnier_sa")
  # The real (PyTorch-default) init; the rbg PRNG compiles much faster than threefry on CPU.
  variables = flax.linen.meta.unbox(model.init(jax.random.key(1, impl="unsafe_rbg"), IMAGES))
  params = variables["params"]
  assert set(params) == {"embed", "layers_0", "layers_1", "head"}
  layer = params["layers_0"]
  assert set(layer) == {"attn", "attn_dense", "attn_norm", "mlp_dense1", "mlp_dense2", "mlp_norm"}
  assert set(layer["attn"]) == {"positional", "value"}  # no q/k/v projections: Dh = Dout
  assert layer["attn"]["value"]["kernel"].shape == (4, 16, 16)
  assert params["embed"]["kernel"].shape == (12, 16)
  # PyTorch default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
  bound = 1 / math.sqrt(12)
  assert 0.8 * bound < np.abs(params["embed"]["kernel"]).max() <= bound
  assert 0.5 * bound < np.abs(params["embed"]["bias"]).max() <= bound
  eval_out = model.apply(variables, IMAGES)
  np.testing.assert_allclose(eval_out, model.apply(variables, IMAGES), rtol=0)
  train_out = model.apply(variables, IMAGES, train=True, rngs={"dropout": jax.random.key(3)})
  assert not np.allclose(train_out, eval_out)
  logits, inter = apply_with_intermediates(model, variables, IMAGES)
  assert inter["layers_1/attn/attention"].shape == (2, 4, 16, 16)
  np.testing.assert_allclose(inter["layers_1/attn/attention"].sum(-1), 1.0, rtol=1e-5)
  assert inter["pre_logits"].shape == (2, 16)
  np.testing.assert_allclose(logits, eval_out, atol=1e-5)


def test_standard_layout_and_overrides():
  model = small_model("cordonnier_sa_learned_content", layout="standard", layer_heads=(2, 3))
  params = init(model)["params"]
  assert params["layers_0"]["attn"]["qkv"]["kernel"].shape == (16, 3, 2, 16)  # Dh = hidden
  assert params["layers_1"]["attn"]["proj"]["kernel"].shape == (3, 16, 16)
  mixed = small_model("cordonnier_sa", layer_attention=("quadratic", "mhsa"))
  assert "qkv" in init(mixed)["params"]["layers_1"]["attn"]
  with pytest.raises(ValueError, match="layer_heads has 3 entries"):
    small_model("cordonnier_sa", layer_heads=(1, 2, 3))
  with pytest.raises(ValueError, match="Unknown attention kinds"):
    small_model("cordonnier_sa", attention="bogus")
  with pytest.raises(ValueError, match="divisible by 2"):
    small_model("cordonnier_sa").init(jax.random.key(0), jnp.zeros((1, 7, 8, 3)))


def test_registered_sizes_match_the_paper():
  """Parameters (Tables 1 and 4) from abstract shapes; FLOPs with the paper's convention."""
  grid = TokenGrid(16, 16)
  expected = {
    "cordonnier_sa": (12.1e6, 6.2e9),
    "cordonnier_sa_generalized": (12.1e6, 6.2e9),
    "cordonnier_sa_learned": (12.3e6, 6.2e9),
    "cordonnier_sa_learned_content": (29.6e6, 15.0e9),  # the paper prints 29.5M
  }
  assert set(expected) | {"cordonnier_sa_16heads"} == set(list_models("cordonnier"))
  for name, (params, flops) in expected.items():
    model = create_model(name, num_classes=10)
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    tree = jax.tree.map(lambda s: np.zeros(s.shape, np.float32), flax.linen.meta.unbox(shapes))
    size = cost(tree, grid)
    assert abs(size["params"] - params) < 0.05e6, (name, size)
    assert abs(size["flops_dense"] - flops) < 0.05e9, (name, size)


# ---------------------------------------------------------------------------------------------
# ResNet18


class TorchBasicBlock(tnn.Module):
  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = tnn.BatchNorm2d(cout)
    self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = tnn.BatchNorm2d(cout)
    self.shortcut = tnn.Sequential()
    if stride != 1 or cin != cout:
      self.shortcut = tnn.Sequential(
        tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
      )

  def forward(self, x):
    out = tnn.functional.relu(self.bn1(self.conv1(x)))
    return tnn.functional.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


def test_resnet18_cifar():
  model = create_model("resnet18_cifar", num_classes=10)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  assert set(shapes) == {"params", "batch_stats"}
  assert num_params(flax.linen.meta.unbox(shapes["params"])) == 11_173_962  # paper: 11.2M
  # A narrow one-block-per-stage copy, checked against PyTorch (padding, strides, shortcuts, BN).
  small = model.clone(stage_sizes=(1, 1, 1, 1), width=4)
  images = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  variables = init(small, images)
  stats = variables["batch_stats"]
  logits = small.apply(variables, images, train=False)
  assert logits.shape == (2, 10)

  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)
  conv = lambda m, k: setattr(m.weight, "data", t(k).permute(3, 2, 0, 1).contiguous())

  def bn(m, p, s):
    m.weight.data, m.bias.data = t(p["scale"]), t(p["bias"])
    m.running_mean.data, m.running_var.data = t(s["mean"]), t(s["var"])

  p, s = variables["params"], variables["batch_stats"]
  stem = tnn.Conv2d(3, 4, 3, 1, 1, bias=False)
  stem_bn = tnn.BatchNorm2d(4)
  conv(stem, p["stem_conv"]["kernel"])
  bn(stem_bn, p["stem_bn"], s["stem_bn"])
  blocks = []
  for stage in range(4):
    name = f"stage{stage + 1}_block1"
    cin, cout = 4 * 2 ** max(stage - 1, 0), 4 * 2**stage
    block = TorchBasicBlock(cin, cout, 2 if stage else 1)
    conv(block.conv1, p[name]["conv1"]["kernel"])
    conv(block.conv2, p[name]["conv2"]["kernel"])
    bn(block.bn1, p[name]["bn1"], s[name]["bn1"])
    bn(block.bn2, p[name]["bn2"], s[name]["bn2"])
    if "shortcut_conv" in p[name]:
      conv(block.shortcut[0], p[name]["shortcut_conv"]["kernel"])
      bn(block.shortcut[1], p[name]["shortcut_bn"], s[name]["shortcut_bn"])
    blocks.append(block)
  head = tnn.Linear(32, 10)
  head.weight.data, head.bias.data = t(p["head"]["kernel"]).T.contiguous(), t(p["head"]["bias"])
  net = tnn.Sequential(stem, stem_bn, tnn.ReLU(), *blocks).double().eval()
  with torch.no_grad():
    x = torch.tensor(np.asarray(images), dtype=torch.float64).permute(0, 3, 1, 2)
    expected = head(net(x).mean(dim=(2, 3)).double()).numpy()
  np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)

  # Train mode: batch statistics, and the running averages move (mutable 'batch_stats').
  train_logits, updates = small.apply(variables, images, train=True, mutable=["batch_stats"])
  assert not np.allclose(train_logits, logits)
  stem_mean = np.asarray(updates["batch_stats"]["stem_bn"]["mean"])
  assert not np.allclose(stem_mean, stats["stem_bn"]["mean"])
  with pytest.raises(flax.errors.ScopeCollectionNotFound):
    small.apply({"params": variables["params"]}, images, train=False)


# ---------------------------------------------------------------------------------------------
# Pruning (appendix E)


def degenerate_generalized(params, layer, head, kind):
  """Makes one head degenerate and zeroes its value slice (so pruning cannot change outputs)."""
  attn = params[f"layers_{layer}"]["attn"]
  spreads = attn["positional"]["attention_spreads"]
  if spreads.ndim == 1:
    spreads[head] = 1e-3  # s^2 = 1e-6 < 1e-5
  elif kind == "stripe":
    spreads[head] = np.diag([1.0, 1e-3])  # condition number 1e6
  elif kind == "flat":
    spreads[head] = 1e-4 * np.eye(2)  # largest eigenvalue 1e-8
  elif kind == "mild":
    spreads[head] = np.diag([1.0, 1e-2])  # condition number 1e4: 1e3 prunes it, 1e5 does not
  attn["value"]["kernel"][head] = 0.0


def test_degenerate_heads_and_exact_pruning():
  model = small_model("cordonnier_sa_generalized")
  params = numpy_tree(init(model)["params"])
  degenerate_generalized(params, 0, 1, "stripe")
  degenerate_generalized(params, 0, 3, "flat")
  degenerate_generalized(params, 1, 2, "mild")
  assert degenerate_heads(params) == {"layers_0/attn": [1, 3], "layers_1/attn": [2]}
  paper_text = PruneThresholds(max_condition=1e5)
  assert degenerate_heads(params, paper_text) == {"layers_0/attn": [1, 3], "layers_1/attn": []}

  pruned, report = prune_degenerate_heads({"params": params}, grid=TokenGrid(4, 4))
  assert report.layer_heads() == (2, 3)
  assert report.pruned == {"layers_0/attn": (1, 3), "layers_1/attn": (2,)}
  assert report.before["params"] - report.after["params"] == 3 * (16 * 16 + 2 + 4)
  assert report.after["flops_dense"] < report.before["flops_dense"]
  assert "pruned 3 of 8 heads" in report.summary()
  attn0 = pruned["params"]["layers_0"]["attn"]
  np.testing.assert_array_equal(
    attn0["value"]["kernel"], params["layers_0"]["attn"]["value"]["kernel"][[0, 2]]
  )
  np.testing.assert_array_equal(
    attn0["positional"]["attention_centers"],
    params["layers_0"]["attn"]["positional"]["attention_centers"][[0, 2]],
  )
  pruned_model = model.clone(layer_heads=report.layer_heads())
  np.testing.assert_allclose(
    pruned_model.apply(pruned, IMAGES), model.apply({"params": params}, IMAGES), atol=1e-5
  )


def test_pruning_isotropic_learned_and_standard_layouts():
  model = small_model("cordonnier_sa")
  params = numpy_tree(init(model)["params"])
  degenerate_generalized(params, 1, 0, None)
  assert degenerate_heads(params) == {"layers_0/attn": [], "layers_1/attn": [0]}

  # Learned + content, reference layout: explicit heads (no Gaussian criterion for learned ones).
  content = small_model("cordonnier_sa_learned_content")
  params = numpy_tree(init(content)["params"])
  params["layers_0"]["attn"]["value"]["kernel"][[1, 2]] = 0.0
  assert degenerate_heads(params) == {}
  pruned, heads = prune_heads(params, {"layers_0/attn": [1, 2]})
  assert heads == {"layers_0/attn": 2, "layers_1/attn": 4}
  assert pruned["layers_0"]["attn"]["query"]["kernel"].shape == (16, 2, 16)
  assert pruned["layers_0"]["attn"]["positional"]["head_keys_row"]["kernel"].shape == (16, 2)
  np.testing.assert_allclose(
    content.clone(layer_heads=(2, 4)).apply({"params": pruned}, IMAGES),
    content.apply({"params": params}, IMAGES),
    atol=1e-5,
  )

  # The library's Attention layout: qkv and proj slices.
  standard = small_model("cordonnier_sa_generalized", layout="standard")
  params = numpy_tree(init(standard)["params"])
  params["layers_1"]["attn"]["proj"]["kernel"][3] = 0.0
  pruned, heads = prune_heads(params, {"layers_1/attn": [3]})
  assert pruned["layers_1"]["attn"]["qkv"]["kernel"].shape == (16, 3, 3, 16)
  np.testing.assert_allclose(
    standard.clone(layer_heads=(4, 3)).apply({"params": pruned}, IMAGES),
    standard.apply({"params": params}, IMAGES),
    atol=1e-5,
  )


def test_pruning_errors():
  params = numpy_tree(init(small_model("cordonnier_sa_generalized"))["params"])
  for head in range(4):
    degenerate_generalized(params, 1, head, "flat")
  with pytest.raises(ValueError, match="every head of layer layers_1/attn"):
    prune_degenerate_heads(params)
  with pytest.raises(ValueError, match="cannot prune"):
    prune_heads(params, {"layers_0/attn": [4]})
  with pytest.raises(ValueError, match="No attention layers"):
    prune_heads(params, {"layers_9/attn": [0]})
  assert list(attention_layers(params)) == ["layers_0/attn", "layers_1/attn"]


def test_paper_scale_pruning_report():
  """15 heads pruned as in appendix E ([2, 4, 1, 2, 6, 0]): 12.1M -> 9.7M, 6.2B -> 4.9B FLOPs."""
  model = create_model("cordonnier_sa_generalized", num_classes=10)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
  params = jax.tree.map(lambda s: np.ones(s.shape, np.float32), flax.linen.meta.unbox(shapes))
  for layer, count in enumerate([2, 4, 1, 2, 6, 0]):
    spreads = params["params"][f"layers_{layer}"]["attn"]["positional"]["attention_spreads"]
    spreads[:] = np.eye(2)
    spreads[:count] = np.diag([1.0, 1e-3])
  _, report = prune_degenerate_heads(params)
  assert report.layer_heads() == cordonnier_cifar10.PAPER_PRUNED_LAYER_HEADS
  assert round(report.before["params"] / 1e6, 1) == 12.1
  assert round(report.after["params"] / 1e6, 1) == 9.7
  assert round(report.before["flops_dense"] / 1e9, 1) == 6.2
  assert abs(report.after["flops_dense"] / 1e9 - 4.9) < 0.06  # 4.95B; the paper prints 4.9B


# ---------------------------------------------------------------------------------------------
# Plots


def test_gaussian_mass_contours_enclose_the_stated_mass():
  cov = np.array([[2.0, 0.8], [0.8, 1.0]])
  inv = np.linalg.inv(cov)
  step = 0.02
  axis = np.arange(-12, 12 + step / 2, step)
  d1, d2 = np.meshgrid(axis, axis, indexing="ij")
  density = gaussian_on_mesh(np.array([0.3, -0.5]), inv, d1, d2)
  masses = (0.5, 0.9)
  levels = gaussian_mass_levels(masses)
  np.testing.assert_allclose(levels, [0.5, 0.1])
  for mass, level in zip(masses, levels):
    assert abs(density[density >= level].sum() / density.sum() - mass) < 2e-3
  np.testing.assert_allclose(mass_contour_levels(density, masses), levels, atol=2e-3)
  # The drawn contour is the ellipse of Mahalanobis radius r, area pi r^2 sqrt(det Sigma).
  ax = Figure().add_subplot()
  contours = ax.contour(d2, d1, density, levels=sorted(levels))
  for mass, segments in zip((0.9, 0.5), contours.allsegs):
    x, y = segments[0][:, 0], segments[0][:, 1]
    area = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
    expected = math.pi * (-2 * math.log(1 - mass)) * math.sqrt(np.linalg.det(cov))
    assert abs(area / expected - 1) < 1e-2
  with pytest.raises(ValueError, match=r"\(0, 1\)"):
    gaussian_mass_levels((0.5, 1.0))


def test_plots_are_written(tmp_path):
  png = b"\x89PNG\r\n\x1a\n"
  model = small_model("cordonnier_sa_generalized")
  variables = init(model)
  path = plot_attention_centers(variables, tmp_path / "centers.png")
  assert read_magic(path) == png
  path = plot_attention_probabilities(model, variables, tmp_path / "probs.png", image_size=8)
  assert read_magic(path) == png

  content = small_model("cordonnier_sa_learned_content")
  content_vars = init(content)
  maps, grid, query = attention_maps(content, content_vars, IMAGES, query=(1, 2))
  assert maps.shape == (2, 4, 4, 4) and grid == (4, 4) and query == (1, 2)
  np.testing.assert_allclose(maps.sum(axis=(-2, -1)), 1.0, rtol=1e-5)
  path = plot_attention_probabilities(
    content, content_vars, tmp_path / "sub" / "content.png", images=IMAGES, window=None
  )
  assert read_magic(path) == png
  with pytest.raises(ValueError, match="No Gaussian"):
    plot_attention_centers(content_vars, tmp_path / "none.png")


# ---------------------------------------------------------------------------------------------
# Configs (Tables 1 and 4)


def test_configs_every_table_row():
  sizes = {}
  for row in cordonnier_cifar10.ROWS:
    c = cordonnier_cifar10.get_config(row)
    assert (c.optimizer.name, c.optimizer.momentum, c.optimizer.weight_decay) == ("sgd", 0.9, 1e-4)
    assert (c.batch_size, c.data.train_augment, c.data.source) == (100, "crop_flip", "tfds")
    assert c.data.mean == (0.4914, 0.4822, 0.4465) and c.data.std == (0.2023, 0.1994, 0.2010)
    overrides = dict(c.model.overrides)
    if c.init_from.prune_degenerate_heads:  # the trainer sets the heads left after pruning
      overrides["layer_heads"] = cordonnier_cifar10.PAPER_PRUNED_LAYER_HEADS
    model = create_model(c.model.name, num_classes=10, **overrides)
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    sizes[row] = num_params(flax.linen.meta.unbox(shapes["params"]))
    if c.paper.params:
      assert abs(sizes[row] / 1e6 - float(c.paper.params[:-1])) < 0.11, (row, sizes[row])
  quadratic = cordonnier_cifar10.get_config("quadratic")
  assert (quadratic.optimizer.lr, quadratic.num_epochs) == (0.1, 300)
  assert quadratic.schedule.name == "cosine"
  assert quadratic.schedule.warmup_epochs == 15 and quadratic.paper.top1 == 0.938
  pruned = cordonnier_cifar10.get_config("quadratic_generalized_pruned")
  assert (pruned.optimizer.lr, pruned.num_epochs) == (0.01, 100)
  assert pruned.init_from.prune_degenerate_heads and "layer_heads" not in pruned.model.overrides
  assert (pruned.init_from.min_eigenvalue, pruned.init_from.max_condition) == (1e-5, 1e3)
  resnet = cordonnier_cifar10.get_config("resnet18")
  assert resnet.schedule.name == "step"
  assert tuple(resnet.schedule.boundaries_epochs) == (80, 150, 250)
  assert cordonnier_cifar10.get_config().model.name == "cordonnier_sa"
  unknown_row = r"unknown row 'bogus' for cordonnier_cifar10.py; choices: resnet18, quadratic,"
  with pytest.raises(ValueError, match=unknown_row):
    cordonnier_cifar10.get_config("bogus")


@pytest.mark.slow
@pytest.mark.parametrize(
  "name, overrides",
  [
    ("cordonnier_sa_generalized", dict(hidden_dim=16, mlp_dim=16, depth=1, num_heads=4)),
    ("resnet18_cifar", dict(stage_sizes=(1, 1), width=4)),  # BatchNorm batch_stats
  ],
)
def test_trains_in_the_training_loop(tmp_path, name, overrides):
  """A few SGD steps through ``train_and_evaluate`` (digits, 8x8x1, 8 fake devices)."""
  from locvit import train
  from tests.train_utils import tiny_config

  c = tiny_config()
  c.model.name = name
  c.model.overrides = ml_collections.ConfigDict(overrides)
  c.optimizer.name = "sgd"
  c.optimizer.lr = 0.05
  c.total_steps = 2
  result = train.train_and_evaluate(c, str(tmp_path))
  assert 0.0 <= result["eval/top1"] <= 1.0
  if name.startswith("cordonnier"):
    # The pruned-row workflow: load the finished run and prune (nothing is degenerate here).
    pruned, report = prune_checkpoint(c, str(tmp_path), num_classes=10, channels=1)
    assert report.layer_heads() == (4,) and report.num_pruned() == 0
    assert count_params(pruned) == report.before["params"] == report.after["params"]
