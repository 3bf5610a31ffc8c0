"""Relative positional attention of Cordonnier et al. (ICLR 2020): terms, layers, Theorem 1."""

from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from locvit.analysis.conv_equivalence import (
  conv_to_quadratic_attention,
  interior_mask,
  kernel_shifts,
)
from locvit.attention import Attention, TokenGrid, get_attention, list_attention
from locvit.attention.relative import (
  KINDS,
  LearnedRelativePositional,
  QuadraticPositional,
  RelativeAttention,
  quadratic_features,
  quadratic_target_vectors,
)
from locvit.models import VisionTransformer

GRID = TokenGrid(5, 5)


def unbox(tree):
  return flax.linen.meta.unbox(tree)


def init(module, *args, **kwargs):
  return unbox(module.init(jax.random.key(0), *args, **kwargs))


def apply(module, variables, *args, **kwargs):
  return module.apply(variables, *args, **kwargs)


def perturb(tree, seed=1, scale=0.3):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: a + scale * rng.normal(size=a.shape).astype(np.float32), tree)


def softmax(a):
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def offsets(grid):
  rows, cols = np.divmod(np.arange(grid.num_tokens), grid.width)
  return rows[None, :] - rows[:, None], cols[None, :] - cols[:, None]  # key minus query


def gaussian_logits(centers, inv_cov, grid):
  """-1/2 (delta - Delta)^T Sigma^-1 (delta - Delta), written directly (float64)."""
  d1, d2 = offsets(grid)
  e1 = d1[None] - centers[:, 0, None, None]
  e2 = d2[None] - centers[:, 1, None, None]
  a, b, c = (inv_cov[:, i, j, None, None] for i, j in ((0, 0), (0, 1), (1, 1)))
  return -0.5 * (a * e1 * e1 + 2 * b * e1 * e2 + c * e2 * e2)


# ---------------------------------------------------------------------------------------------
# Positional terms


def test_quadratic_features_order_and_sign():
  grid = TokenGrid(3, 4)
  r = quadratic_features(grid)
  assert r.shape == (12, 12, 5)
  # query (0, 1) = token 1, key (2, 3) = token 11: delta = (2, 2) rows/cols, key minus query.
  np.testing.assert_array_equal(r[1, 11], [2, 2, 4, 4, 4])
  np.testing.assert_array_equal(r[11, 1], [-2, -2, 4, 4, 4])
  # query (1, 0) = token 4, key (0, 2) = token 2: (d1, d2) = (-1, 2).
  np.testing.assert_array_equal(r[4, 2], [-1, 2, 1, 4, -2])


@pytest.mark.parametrize("generalized", [False, True])
def test_quadratic_logits_are_the_gaussian(generalized):
  """u . r(delta) = -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta) + const per head (Eq. 19)."""
  grid = TokenGrid(4, 6)  # non-square works for the quadratic encoding
  term = QuadraticPositional(5, generalized=generalized)
  params = perturb(init(term, grid))
  table = np.asarray(apply(term, params, grid), np.float64)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params["params"])
  s = p["attention_spreads"]
  inv = s[:, None, None] ** 2 * np.eye(2) if s.ndim == 1 else np.einsum("hij,hkj->hik", s, s)
  expected = gaussian_logits(p["attention_centers"], inv, grid)
  diff = table - expected  # constant per head (the dropped Delta^T Sigma^-1 Delta term)
  np.testing.assert_allclose(diff, diff[:, :1, :1] * np.ones_like(diff), atol=1e-4)
  np.testing.assert_allclose(softmax(table), softmax(expected), atol=1e-6)


def test_generalized_with_scaled_identity_equals_isotropic():
  centers = jnp.asarray([[0.5, -1.0], [2.0, 0.0]])
  s = jnp.asarray([0.7, 1.3])
  u_iso = quadratic_target_vectors(centers, s)
  u_gen = quadratic_target_vectors(centers, s[:, None, None] * jnp.eye(2))
  np.testing.assert_allclose(u_iso, u_gen, rtol=1e-6)
  # alpha = s^2 / 2: the quadratic coefficients are -alpha.
  np.testing.assert_allclose(u_iso[:, 2], -(s**2) / 2, rtol=1e-6)


@pytest.mark.parametrize("generalized", [False, True])
def test_quadratic_init_matches_reference(generalized):
  """centres ~ N(0, 2.0^2) (2.0 is the reference's std), spreads = 1 (or I) + N(0, 0.01^2)."""
  heads = 4000
  term = QuadraticPositional(heads, generalized=generalized)
  params = init(term, TokenGrid(2, 2))["params"]
  centers = np.asarray(params["attention_centers"])
  spreads = np.asarray(params["attention_spreads"])
  assert centers.shape == (heads, 2)
  assert abs(centers.std() - 2.0) < 0.05 and abs(centers.mean()) < 0.05
  if generalized:
    assert spreads.shape == (heads, 2, 2)
    noise = spreads - np.eye(2)
  else:
    assert spreads.shape == (heads,)
    noise = spreads - 1.0
  assert abs(noise.std() - 0.01) < 5e-4 and abs(noise.mean()) < 5e-4


def reference_learned_probs(row_emb, col_emb, w_row, w_col, side, max_pos):
  """The reference's Learned2DRelativeSelfAttention.get_attention_probs (torch, verbatim layout)."""
  heads = w_row.shape[0]
  deltas = torch.arange(max_pos).view(1, -1) - torch.arange(max_pos).view(-1, 1)
  relative_indices = deltas + max_pos - 1
  width = height = side
  idx = relative_indices[:width, :width].reshape(-1)
  row_scores = (row_emb[idx] @ w_row.T).view(1, width, 1, width, heads)
  idx = relative_indices[:height, :height].reshape(-1)
  col_scores = (col_emb[idx] @ w_col.T).view(height, 1, height, 1, heads)
  scores = (row_scores + col_scores).permute(0, 1, 4, 2, 3)
  probs = torch.softmax(scores.reshape(height, width, heads, height * width), dim=-1)
  # (query row, query col, head, key) -> (head, query, key); the einsum with the NHWC hidden
  # states ('ijhkl,bkld->bijhd') reads i, k as rows and j, l as columns.
  return probs.permute(2, 0, 1, 3).reshape(heads, side * side, side * side)


@pytest.mark.parametrize("side, max_position", [(4, None), (3, 5)])
def test_learned_relative_matches_reference(side, max_position):
  grid = TokenGrid(side, side)
  term = LearnedRelativePositional(3, embed_dim=6, max_position=max_position)
  params = init(term, grid)
  table = apply(term, params, grid)
  assert table.shape == (3, side * side, side * side)
  p = params["params"]
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)
  expected = reference_learned_probs(
    t(p["row_embeddings"]),
    t(p["col_embeddings"]),
    t(p["head_keys_row"]["kernel"]).T,
    t(p["head_keys_col"]["kernel"]).T,
    side,
    max_position or side,
  ).numpy()
  np.testing.assert_allclose(softmax(np.asarray(table, np.float64)), expected, atol=1e-6)
  # Init: nn.Embedding N(0, 1) tables of 2M - 1 rows.
  assert p["row_embeddings"].shape == (2 * (max_position or side) - 1, 6)


def test_learned_relative_errors():
  term = LearnedRelativePositional(2, embed_dim=4)
  with pytest.raises(ValueError, match="square token grid"):
    term.init(jax.random.key(0), TokenGrid(3, 4))
  small = LearnedRelativePositional(2, embed_dim=4, max_position=3)
  with pytest.raises(ValueError, match="max_position"):
    small.init(jax.random.key(0), TokenGrid(4, 4))


# ---------------------------------------------------------------------------------------------
# Through the Attention seam ('standard' layout) and as registered kinds


def attention_numpy(params, x, num_heads, table, content):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  qkv = np.einsum("bnc,cthd->bnthd", x, p["qkv"]["kernel"]) + p["qkv"]["bias"]
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = np.broadcast_to(np.asarray(table, np.float64), (x.shape[0], *table.shape))
  if content:
    logits = logits + np.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(q.shape[-1])
  y = np.einsum("bhnm,bmhd->bnhd", softmax(logits), v)
  return np.einsum("bnhd,hdc->bnc", y, p["proj"]["kernel"]) + p["proj"]["bias"]


@pytest.mark.parametrize(
  "kind, content",
  [("quadratic", False), ("quadratic_generalized", True), ("learned_relative", True)],
)
def test_terms_through_attention_seam(kind, content):
  x = jax.random.normal(jax.random.key(0), (2, GRID.num_tokens, 12))
  attn = get_attention(kind)(num_heads=3, head_dim=12, content=content, embed_dim=8)
  assert isinstance(attn, Attention)
  assert attn.combine == ("add" if content else "replace")
  variables = perturb(init(attn, x, grid=GRID), scale=0.1)
  assert "positional" in variables["params"]
  table = apply(attn.positional, {"params": variables["params"]["positional"]}, GRID)
  expected = attention_numpy(variables["params"], x, 3, table, content)
  out = apply(attn, variables, x, grid=GRID)
  np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
  out_explicit, _ = apply(attn, variables, x, grid=GRID, mutable=("intermediates",))
  np.testing.assert_allclose(out_explicit, expected, atol=1e-4, rtol=1e-4)


def test_registered_kinds_in_vision_transformer():
  assert set(KINDS) <= set(list_attention())
  model = VisionTransformer(
    num_classes=3,
    patch_size=2,
    embed_dim=16,
    depth=3,
    num_heads=2,
    pos_embed="none",
    pool="gap",
    layer_attention=("quadratic", "quadratic_generalized", "learned_relative"),
    attention_kwargs={"quadratic": {"content": True}, "learned_relative": {"embed_dim": 8}},
  )
  images = jnp.zeros((2, 8, 8, 3))
  variables = init(model, images)
  params = variables["params"]
  assert params["blocks_0"]["attn"]["positional"]["attention_spreads"].shape == (2,)
  assert params["blocks_1"]["attn"]["positional"]["attention_spreads"].shape == (2, 2, 2)
  assert params["blocks_2"]["attn"]["positional"]["row_embeddings"].shape == (7, 8)
  _, state = apply(model, variables, images, mutable=("intermediates",))
  assert state["intermediates"]["blocks_2"]["attn"]["attention"][0].shape == (2, 2, 16, 16)
  # Content + position works with a class token (neutral bias entry); positional-only does not.
  with_cls = model.clone(pool="token", layer_attention=("quadratic",) * 3)
  jax.eval_shape(with_cls.init, jax.random.key(0), images)
  with pytest.raises(ValueError, match="prefix tokens"):
    jax.eval_shape(with_cls.clone(attention_kwargs=None).init, jax.random.key(0), images)


# ---------------------------------------------------------------------------------------------
# The reference layout (RelativeAttention)


def reference_layout_numpy(params, x, table, content, head_dim):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  logits = np.broadcast_to(np.asarray(table, np.float64), (x.shape[0], *table.shape))
  if content:
    q = np.einsum("bnc,chd->bnhd", x, p["query"]["kernel"]) + p["query"]["bias"]
    k = np.einsum("bnc,chd->bnhd", x, p["key"]["kernel"]) + p["key"]["bias"]
    logits = logits + np.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(head_dim)
  y = np.einsum("bhnm,bmc->bnhc", softmax(logits), x)  # values are the raw inputs
  return np.einsum("bnhc,hco->bno", y, p["value"]["kernel"]) + p["value"]["bias"]


@pytest.mark.parametrize(
  "kind, content, head_dim",
  [
    ("quadratic", False, None),
    ("quadratic_generalized", True, None),
    ("learned_relative", False, None),
    ("learned_relative", True, 6),
  ],
)
def test_reference_layout_matches_numpy(kind, content, head_dim):
  x = jax.random.normal(jax.random.key(0), (2, GRID.num_tokens, 10))
  attn = get_attention(kind)(
    num_heads=3, layout="reference", content=content, head_dim=head_dim, out_dim=7
  )
  assert isinstance(attn, RelativeAttention)
  variables = perturb(init(attn, x, grid=GRID), scale=0.1)
  params = variables["params"]
  assert params["value"]["kernel"].shape == (3, 10, 7)
  assert ("query" in params) == content and "qkv" not in params
  term_cls = QuadraticPositional if kind != "learned_relative" else LearnedRelativePositional
  term_kwargs = (
    {"generalized": kind == "quadratic_generalized"}
    if kind != "learned_relative"
    else {"embed_dim": 10}
  )
  table = apply(term_cls(3, **term_kwargs), {"params": params["positional"]}, GRID)
  expected = reference_layout_numpy(params, x, table, content, head_dim or 10)
  for fast in (True, False):
    out = apply(attn.clone(fused=fast), variables, x, grid=GRID)
    np.testing.assert_allclose(out, expected, atol=1e-4, rtol=1e-4)
  _, state = apply(attn, variables, x, grid=GRID, mutable=("intermediates",))
  assert state["intermediates"]["attention"][0].shape == (2, 3, 25, 25)


def test_reference_layout_torch_init_and_shared_dropout():
  x = jnp.ones((4, GRID.num_tokens, 20))  # identical examples
  attn = RelativeAttention(3, kind="quadratic", attn_drop=0.5)
  params = init(attn, x, grid=GRID)["params"]
  bound = 1 / math.sqrt(3 * 20)  # PyTorch Linear(H * D -> D): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  kernel, bias = np.asarray(params["value"]["kernel"]), np.asarray(params["value"]["bias"])
  assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.9 * bound
  assert np.abs(bias).max() <= bound and np.abs(bias).max() > 0.5 * bound
  rngs = {"dropout": jax.random.key(1)}
  out = apply(attn, {"params": params}, x, grid=GRID, train=True, rngs=rngs)
  # Positional-only attention has no batch dimension: one dropout mask for the whole batch.
  np.testing.assert_allclose(out[1:], jnp.broadcast_to(out[:1], out[1:].shape), rtol=1e-6)
  assert not np.allclose(out, apply(attn, {"params": params}, x, grid=GRID))


def test_reference_layout_fused_gradients():
  x = jax.random.normal(jax.random.key(0), (2, GRID.num_tokens, 8))
  attn = RelativeAttention(2, kind="learned_relative", content=True)
  variables = perturb(init(attn, x, grid=GRID), scale=0.1)

  def grads(fast):
    f = lambda v: jnp.sum(attn.clone(fused=fast).apply(v, x, grid=GRID) ** 2)
    return jax.jit(jax.grad(f))(variables)

  for a, b in zip(jax.tree.leaves(grads(True)), jax.tree.leaves(grads(False))):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_reference_layout_errors():
  x = jnp.zeros((1, 12, 4))
  with pytest.raises(ValueError, match="square"):
    RelativeAttention(2, kind="learned_relative").init(jax.random.key(0), x, grid=TokenGrid(3, 4))
  with pytest.raises(ValueError, match="does not match"):
    RelativeAttention(2).init(jax.random.key(0), x, grid=TokenGrid(3, 3))
  with pytest.raises(ValueError, match="prefix"):
    RelativeAttention(2).init(jax.random.key(0), x, grid=TokenGrid(3, 4), num_prefix_tokens=1)
  with pytest.raises(ValueError, match="layout"):
    get_attention("quadratic")(num_heads=2, layout="bogus")


# ---------------------------------------------------------------------------------------------
# Theorem 1: a K x K convolution is a quadratic-attention layer with K^2 heads


def conv_reference(x, kernel, bias):
  out = jax.lax.conv_general_dilated(
    x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  return out + bias


@pytest.mark.parametrize(
  "kernel_size, din, dout, layout, generalized, extra_heads",
  [
    ((3, 3), 5, 4, "reference", False, 0),
    ((3, 3), 4, 4, "standard", False, 0),
    ((2, 2), 3, 6, "reference", True, 2),
    ((5, 5), 3, 3, "standard", True, 1),
  ],
)
def test_theorem1_conv_equals_quadratic_attention(
  kernel_size, din, dout, layout, generalized, extra_heads
):
  rng = np.random.default_rng(0)
  kernel = rng.normal(size=(*kernel_size, din, dout)).astype(np.float32)
  bias = rng.normal(size=(dout,)).astype(np.float32)
  x = rng.normal(size=(2, 9, 8, din)).astype(np.float32)
  heads = math.prod(kernel_size) + extra_heads
  conv = conv_to_quadratic_attention(
    kernel, bias, num_heads=heads, layout=layout, generalized=generalized
  )
  expected = conv_reference(x, kernel, bias)
  out = conv(x)
  inside = interior_mask(9, 8, kernel_size)
  np.testing.assert_allclose(np.asarray(out)[:, inside], expected[:, inside], atol=1e-4)
  # Borders differ: attention renormalises over existing pixels instead of reading zero padding.
  if (~inside).any():
    assert np.abs(np.asarray(out)[:, ~inside] - expected[:, ~inside]).max() > 1e-2
  # Zero-padding the image first (the paper's remark) makes the layer equal everywhere.
  np.testing.assert_allclose(conv(x, pad=True), expected, atol=1e-4)


def test_theorem1_head_centres_are_the_kernel_shifts():
  conv = conv_to_quadratic_attention(np.ones((3, 3, 2, 2), np.float32), alpha=30.0)
  params = conv.variables["params"]
  shifts = {tuple(c) for c in np.asarray(params["positional"]["attention_centers"]).tolist()}
  assert shifts == {(float(a), float(b)) for a in (-1, 0, 1) for b in (-1, 0, 1)}
  assert kernel_shifts((2, 2)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  np.testing.assert_allclose(params["positional"]["attention_spreads"] ** 2 / 2, 30.0, rtol=1e-6)


def test_theorem1_errors():
  kernel = np.zeros((3, 3, 4, 4), np.float32)
  with pytest.raises(ValueError, match="at least 9 attention heads"):
    conv_to_quadratic_attention(kernel, num_heads=8)
  with pytest.raises(ValueError, match="head_dim >= Dout"):
    conv_to_quadratic_attention(kernel, layout="standard", head_dim=3)
  with pytest.raises(ValueError, match="Din == Dout"):
    conv_to_quadratic_attention(np.zeros((3, 3, 4, 5), np.float32), layout="standard")
  with pytest.raises(ValueError, match="HWIO"):
    conv_to_quadratic_attention(np.zeros((3, 3, 4), np.float32))
