"""Gaussian mixture masks (GMM) and element-wise learnable masks (ELM), Li & Zhang.

Checks the mask against a hand-written NumPy transcription of the official formula, the float32
underflow of the faithful kernel, the multiply / add combine rules against explicit formulas,
the ELM's uniform attention at init, errors, and the mask plots. About 15 s on 2 CPU cores.
"""

from __future__ import annotations

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.analysis.masks import collect_mask_tables, plot_mask_tables, unfold_mask
from locvit.attention import Attention, TokenGrid, get_attention, squared_distances
from locvit.attention.masks import (
  KERNELS,
  ElementwiseMask,
  GaussianMixtureMask,
  gaussian_base_table,
  gaussian_mixture,
  mask_attention_kwargs,
  split_mask_options,
)
from locvit.models import create_model

# Tests compile many small programs: XLA's backend optimisations cost more than they save here.
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def official_gmm(alpha: np.ndarray, sigma: np.ndarray, num_patches: int) -> np.ndarray:
  """NumPy transcription of the official ``On_attention_gaussian_mask`` + ``Gaussian_Mixture_Mask``.

  ``mask[i, j] = -(dx^2 + dy^2)``, ``B = exp(mask) ** 0.5``, ``M = sum_k alpha * B ** (1 /
  (sigma^2 + 1e-5))`` in float32, with ``img_size = num_patches ** 0.5`` as the reference.
  """
  img_size = num_patches**0.5
  mask = np.zeros((num_patches, num_patches), np.float32)
  for i in range(num_patches):
    for j in range(num_patches):
      x_change = i % img_size - j % img_size
      y_change = i // img_size - j // img_size
      mask[i, j] = -(x_change**2 + y_change**2)
  base = np.exp(mask) ** np.float32(0.5)
  alpha = np.asarray(alpha, np.float32)[:, :, None, None]
  sigma = np.asarray(sigma, np.float32)[:, :, None, None]
  return np.sum(alpha * base ** (np.float32(1) / (sigma**2 + np.float32(1e-5))), axis=0)


# Fixed (K, H) = (3, 2) parameters with moderate spreads, for exact-zero comparisons.
ALPHA = np.array([[1.5, -2.0], [0.7, 0.3], [-0.4, 1.1]], np.float32)
SIGMA = np.array([[2.0, 9.0], [14.0, -3.0], [25.0, 6.0]], np.float32)


def gmm_table(grid: TokenGrid, kernel: str, alpha=ALPHA, sigma=SIGMA) -> np.ndarray:
  module = GaussianMixtureMask(alpha.shape[1], alpha.shape[0], kernel)
  return np.asarray(module.apply({"params": {"alpha": alpha, "sigma": sigma}}, grid))


@pytest.mark.parametrize("side", [4, 8, 16])
def test_gmm_matches_official_formula_at_init(side):
  module = GaussianMixtureMask(num_heads=3, num_kernels=5)
  grid = TokenGrid(side, side)
  variables = module.init(jax.random.key(side), grid)
  params = jax.tree.map(np.asarray, nn.meta.unbox(variables["params"]))
  assert params["alpha"].shape == params["sigma"].shape == (5, 3)
  table = np.asarray(module.apply(variables, grid))
  expected = official_gmm(params["alpha"], params["sigma"], side * side)
  np.testing.assert_allclose(table, expected, rtol=2e-5, atol=1e-30)


def test_gmm_init_statistics():
  """alpha ~ N(0, 2^2), sigma ~ N(10, 10^2) (Sec. 4.2)."""
  module = GaussianMixtureMask(num_heads=100, num_kernels=100)
  params = nn.meta.unbox(module.init(jax.random.key(0), TokenGrid(2, 2))["params"])
  alpha, sigma = np.asarray(params["alpha"]), np.asarray(params["sigma"])
  assert abs(alpha.mean()) < 0.06 and abs(alpha.std() - 2.0) < 0.06
  assert abs(sigma.mean() - 10.0) < 0.3 and abs(sigma.std() - 10.0) < 0.3


def test_faithful_base_table_underflows_to_exact_zeros():
  # exp(-d^2) is 0 in float32 once d^2 >= 104 (below half the smallest subnormal).
  base16 = gaussian_base_table(TokenGrid(16, 16))
  assert base16.dtype == np.float32
  assert int((base16 == 0).sum()) == 21_792
  np.testing.assert_array_equal(base16 == 0, squared_distances(TokenGrid(16, 16)) >= 104)
  assert int((gaussian_base_table(TokenGrid(9, 9)) == 0).sum()) == 20
  assert int((gaussian_base_table(TokenGrid(8, 8)) == 0).sum()) == 0  # CIFAR at patch 4


def test_faithful_and_intended_kernels_differ_exactly_where_float32_underflows():
  grid = TokenGrid(16, 16)
  d2 = squared_distances(grid)
  faithful, intended = gmm_table(grid, "faithful"), gmm_table(grid, "intended")
  np.testing.assert_allclose(faithful, official_gmm(ALPHA, SIGMA, 256), rtol=2e-5, atol=1e-30)
  # Faithful: exactly 0 at every d^2 >= 104 (21,792 entries per head), whatever sigma is.
  for h in range(2):
    np.testing.assert_array_equal(faithful[h] == 0, d2 >= 104)
  # Intended: exp(-d^2 / (2 (sigma^2 + 1e-5))) never underflows here.
  assert np.all(intended != 0)
  # Where exp(-d^2) is a normal float32 (d^2 <= 87), the two forms are the same function.
  normal = d2 <= 87
  np.testing.assert_allclose(faithful[:, normal], intended[:, normal], rtol=1e-5, atol=1e-7)
  # On an 8x8 grid nothing underflows: they agree everywhere (subnormal B costs ~1e-4 relative).
  grid8 = TokenGrid(8, 8)
  np.testing.assert_allclose(gmm_table(grid8, "faithful"), gmm_table(grid8, "intended"), rtol=1e-3)


def test_gmm_gradients_are_finite_through_exact_zeros():
  grid = TokenGrid(16, 16)
  module = GaussianMixtureMask(num_heads=2, num_kernels=3)
  weights = jax.random.normal(jax.random.key(1), (2, 256, 256))
  loss = lambda p: jnp.sum(module.apply({"params": p}, grid) * weights)
  grads = jax.grad(loss)({"alpha": jnp.asarray(ALPHA), "sigma": jnp.asarray(SIGMA)})
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


# ---------------------------------------------------------------------------------------------
# The attention kinds and the combine rules


def manual_attention(params, x, table, combine, num_prefix=0):
  """softmax((q k^T / sqrt(d)) * M) v or softmax(q k^T / sqrt(d) + M) v, then the projection."""
  qkv = np.einsum("bnc,cthd->bnthd", x, params["qkv"]["kernel"]) + params["qkv"]["bias"]
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = np.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5
  fill = 1.0 if combine == "multiply" else 0.0
  full = np.full((table.shape[0], *logits.shape[-2:]), fill, np.float32)
  full[:, num_prefix:, num_prefix:] = table
  logits = logits * full if combine == "multiply" else logits + full
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  y = np.einsum("bhnm,bmhd->bnhd", probs, v)
  return np.einsum("bnhd,hdc->bnc", y, params["proj"]["kernel"]) + params["proj"]["bias"], probs


def gmm_attention(combine: str, implementation: str | None = None, **kwargs):
  return get_attention("gmm")(
    num_heads=3,
    head_dim=8,
    qkv_bias=True,
    attn_drop=0.0,
    proj_drop=0.0,
    implementation=implementation,
    combine=combine,
    num_kernels=2,
    **kwargs,
  )


@pytest.mark.parametrize("combine", ["multiply", "add"])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_gmm_attention_matches_the_formula(combine, num_prefix):
  grid = TokenGrid(4, 4)
  x = jax.random.normal(jax.random.key(0), (2, 16 + num_prefix, 24))
  attn = gmm_attention(combine)
  init = fast_jit(lambda key, x: attn.init(key, x, grid=grid, num_prefix_tokens=num_prefix))
  variables = init(jax.random.key(1), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), nn.meta.unbox(variables["params"]))
  table = official_gmm(params["mask"]["alpha"], params["mask"]["sigma"], 16)
  expected, expected_probs = manual_attention(params, np.asarray(x), table, combine, num_prefix)

  # The add rule without intermediates runs the fused kernel; with them, the explicit path.
  apply = lambda v, x, **kw: attn.apply(v, x, grid=grid, num_prefix_tokens=num_prefix, **kw)
  out = fast_jit(apply)(variables, x)
  out_maps, state = fast_jit(functools.partial(apply, mutable=["intermediates"]))(variables, x)
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out_maps, expected, rtol=1e-4, atol=1e-5)
  probs = state["intermediates"]["attention"][0]
  np.testing.assert_allclose(probs, expected_probs, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(state["intermediates"]["mask"]["table"][0], table, rtol=2e-5)


@pytest.mark.parametrize("combine", ["multiply", "add"])
def test_gmm_kind_equals_the_attention_seam_with_gradients(combine):
  """The 'gmm' kind is Attention(positional=GaussianMixtureMask, combine=...): same outputs and
  gradients (it only sums the table's gradient over the batch as a matmul)."""
  grid = TokenGrid(4, 4)
  x = jax.random.normal(jax.random.key(0), (3, 17, 24))
  kind = gmm_attention(combine)
  seam = Attention(num_heads=3, head_dim=8, positional=GaussianMixtureMask(3, 2), combine=combine)
  variables = kind.init(jax.random.key(1), x, grid=grid, num_prefix_tokens=1)
  params = dict(nn.meta.unbox(variables["params"]))
  seam_params = {**{k: v for k, v in params.items() if k != "mask"}, "positional": params["mask"]}

  def loss(module, p):
    return jnp.sum(module.apply({"params": p}, x, grid=grid, num_prefix_tokens=1) ** 2)

  (l1, g1), (l2, g2) = (
    fast_jit(jax.value_and_grad(lambda p: loss(kind, p)))(params),
    fast_jit(jax.value_and_grad(lambda p: loss(seam, p)))(seam_params),
  )
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  g2 = {**{k: v for k, v in g2.items() if k != "positional"}, "mask": g2["positional"]}
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
  "implementation, shape", [("cpu_kernels", "2,3,34,1"), (None, "2,3,64,64")]
)
def test_gmm_table_is_built_once_per_call_without_batch_dimension(implementation, shape):
  grid = TokenGrid(8, 8)
  attn = gmm_attention("multiply", implementation=implementation)
  x = jnp.zeros((7, 64, 24))
  variables = attn.init(jax.random.key(0), x, grid=grid)
  text = str(jax.make_jaxpr(lambda v: attn.apply(v, x, grid=grid))(variables))
  shapes = re.findall(r"f32\[([\d,]*)\] = pow ", text)
  # One pow over (K, H, ...), no batch dimension: on the CPU code paths over the 34 distinct
  # d^2 of 8x8 (then gathered), otherwise over the query-key pairs (fused on XLA:GPU).
  assert shapes == [shape]


def test_gmm_table_gathered_from_distinct_distances_is_the_full_table():
  alpha = jax.random.normal(jax.random.key(0), (5, 3))
  sigma = 10 + 10 * jax.random.normal(jax.random.key(1), (5, 3))
  grid = TokenGrid(5, 7)
  for kernel in KERNELS:
    full, gathered = (gaussian_mixture(alpha, sigma, grid, kernel, g) for g in (False, True))
    np.testing.assert_allclose(gathered, full, rtol=1e-6)


def test_elm_starts_as_uniform_attention():
  """The official ELM starts at zeros, so every masked logit is 0: uniform attention."""
  attn = get_attention("elm")(num_heads=3, head_dim=8)
  x = jax.random.normal(jax.random.key(0), (2, 16, 24))
  init = fast_jit(lambda key, x: attn.init_with_output(key, x, grid=TokenGrid(4, 4), mutable=True))
  _, variables = init(jax.random.key(1), x)
  np.testing.assert_array_equal(
    nn.meta.unbox(variables["params"])["mask"]["elm"], np.zeros((16, 16))
  )
  probs = variables["intermediates"]["attention"][0]
  assert probs.shape == (2, 3, 16, 16)
  np.testing.assert_allclose(probs, 1 / 16, rtol=1e-6)


def test_elm_table_is_shared_by_heads():
  module = ElementwiseMask(num_heads=4)
  grid = TokenGrid(3, 3)
  weights = jax.random.normal(jax.random.key(0), (9, 9))
  table = module.apply({"params": {"elm": weights}}, grid)
  assert table.shape == (4, 9, 9)
  np.testing.assert_array_equal(table, jnp.broadcast_to(weights, (4, 9, 9)))


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("k", [0, -1])
def test_fewer_than_one_kernel_is_an_error(k):
  with pytest.raises(ValueError, match="num_kernels >= 1"):
    GaussianMixtureMask(num_heads=2, num_kernels=k)
  with pytest.raises(ValueError, match="num_kernels >= 1"):
    get_attention("gmm")(num_heads=2, num_kernels=k)
  with pytest.raises(ValueError, match="num_kernels >= 1"):
    split_mask_options("gmm", {"num_kernels": k})
  model = create_model(
    "gmm_vit_smalldata_d9_patch4_32",
    10,
    attention_kwargs=mask_attention_kwargs("gmm", num_kernels=k),
  )
  with pytest.raises(ValueError, match="num_kernels >= 1"):  # while tracing, before compiling
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))


def test_bad_options_are_clear_errors():
  with pytest.raises(ValueError, match=r"no options \['num_kernals'\].*num_kernels"):
    get_attention("gmm")(num_heads=2, num_kernals=3)
  with pytest.raises(ValueError, match="kernel='exact' is not one of"):
    GaussianMixtureMask(num_heads=2, kernel="exact")
  with pytest.raises(ValueError, match="combine='replace' is not one of"):
    get_attention("elm")(num_heads=2, combine="replace")
  with pytest.raises(ValueError, match="builds its own mask"):
    get_attention("gmm")(num_heads=2, positional=ElementwiseMask(2))
  with pytest.raises(ValueError, match="Valid masks"):
    mask_attention_kwargs("gaussian")
  with pytest.raises(ValueError, match="needs the token grid"):
    attn = gmm_attention("multiply")
    attn.init(jax.random.key(0), jnp.zeros((1, 4, 24)))


def test_non_square_grid_is_an_error_unless_allowed():
  grid = TokenGrid(3, 5)
  for module in (GaussianMixtureMask(num_heads=2), ElementwiseMask(num_heads=2)):
    with pytest.raises(ValueError, match="requires a square token grid, got 3x5"):
      module.init(jax.random.key(0), grid)
  module = GaussianMixtureMask(num_heads=2, num_kernels=3, kernel="intended", allow_non_square=True)
  table = module.apply({"params": {"alpha": ALPHA, "sigma": SIGMA}}, grid)
  d2 = squared_distances(grid)
  expected = np.einsum(
    "kh,khnm->hnm", ALPHA, np.exp(-d2 / (2 * (SIGMA[..., None, None] ** 2 + 1e-5)))
  )
  np.testing.assert_allclose(table, expected, rtol=1e-5)
  # Through a backbone: the ViT on a 32x48 image has a 8x12 grid.
  model = create_model("gmm_vit_smalldata_d9_patch4_32", 10, depth=1, layer_attention=("gmm",))
  with pytest.raises(ValueError, match="requires a square token grid, got 8x12"):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 32, 48, 3)))


# ---------------------------------------------------------------------------------------------
# Plots


def test_unfold_mask_lays_each_query_row_on_the_grid():
  grid = TokenGrid(3, 4)
  table = np.arange(144, dtype=np.float32).reshape(12, 12)
  out = unfold_mask(table, grid)
  assert out.shape == (9, 16)
  for qr in range(3):
    for qc in range(4):
      for kr in range(3):
        for kc in range(4):
          assert out[qr * 3 + kr, qc * 4 + kc] == table[qr * 4 + qc, kr * 4 + kc]
  with pytest.raises(ValueError, match="does not match"):
    unfold_mask(table[:10, :10], grid)


def test_mask_plots_are_written_for_every_layer_and_head(tmp_path):
  model = create_model(
    "gmm_vit_smalldata_d9_patch4_32",
    10,
    depth=2,
    embed_dim=24,
    num_heads=3,
    head_dim=8,
    layer_attention=("gmm", "elm"),
    attention_kwargs={"gmm": {"num_kernels": 2}},
  )
  images = jax.random.normal(jax.random.key(0), (1, 32, 32, 3))
  variables = fast_jit(model.init)(jax.random.key(1), images)
  tables = collect_mask_tables(model, variables, images)
  assert sorted(tables) == ["blocks_0/attn/mask", "blocks_1/attn/mask"]
  assert all(t.shape == (3, 64, 64) for t in tables.values())
  paths = plot_mask_tables(tables, tmp_path)
  assert sorted(p.name for p in paths) == ["blocks_0_attn_mask.png", "blocks_1_attn_mask.png"]
  for path in paths:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2_000
  with pytest.raises(ValueError, match=r"expected \(H, N, N\)"):
    plot_mask_tables({"bad": np.zeros((4, 4))}, tmp_path)
