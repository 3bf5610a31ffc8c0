"""GPSA / PSA layer (ConViT Eqs. 4-7) and the ConViT models built from it."""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from locvit.attention import GPSA, TokenGrid, get_attention, list_attention
from locvit.configs.defaults import convit_layers
from locvit.models import create_model
from locvit.models.convit import convit_overrides

GRID = TokenGrid(5, 5)


def init(module, x, seed=0):
  variables = module.init(jax.random.key(seed), x, grid=GRID)
  return flax.linen.meta.unbox(variables)


def perturb(variables, seed=1, scale=0.3):
  """Random offsets on every parameter (gates, pos_proj, biases) so no init symmetry hides bugs."""
  rng = np.random.default_rng(seed)  # NumPy: one eager jax.random call per shape is slow
  return jax.tree.map(lambda a: a + scale * rng.normal(size=a.shape).astype(np.float32), variables)


def tokens(batch=2, dim=36, seed=0):
  return jax.random.normal(jax.random.key(seed), (batch, GRID.num_tokens, dim))


def numpy_reference(params, x, num_heads, variant):
  """Hand-written GPSA (Eqs. 6-7, as the reference code computes it) or PSA (Eq. 4), float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x, np.float64)
  B, N, C = x.shape
  Dh = C // num_heads
  qk = np.einsum("bnc,cthd->bnthd", x, p["qk"]["kernel"])
  q, k = qk[:, :, 0], qk[:, :, 1]
  v = np.einsum("bnc,chd->bnhd", x, p["v"]["kernel"])
  rows, cols = np.divmod(np.arange(N), GRID.width)
  dx = cols[None, :] - cols[:, None]
  dy = rows[None, :] - rows[:, None]
  rel = np.stack([dx, dy, dx**2 + dy**2], axis=-1)
  pos_logits = np.einsum("nmc,ch->hnm", rel, p["pos_proj"]["kernel"])
  pos_logits = pos_logits + p["pos_proj"]["bias"][:, None, None]
  content = np.einsum("bnhd,bmhd->bhnm", q, k) * Dh**-0.5

  def softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)

  if variant == "gpsa":
    g = 1 / (1 + np.exp(-p["gating_param"]))[:, None, None]
    attn = (1 - g) * softmax(content) + g * softmax(pos_logits)
    attn = attn / attn.sum(-1, keepdims=True)
  else:
    attn = softmax(content + pos_logits)
  y = np.einsum("bhnm,bmhd->bnhd", attn, v).reshape(B, N, C)
  return y @ p["proj"]["kernel"].reshape(C, C) + p["proj"]["bias"]


def test_registered_kinds():
  assert {"gpsa", "psa"} <= set(list_attention())
  assert get_attention("gpsa") is GPSA
  assert get_attention("psa")(num_heads=4).variant == "psa"


@pytest.mark.parametrize("variant", ["gpsa", "psa"])
@pytest.mark.parametrize("num_heads", [4, 9])
def test_matches_numpy_reference(variant, num_heads):
  x = tokens()
  module = GPSA(num_heads=num_heads, variant=variant)
  variables = perturb(init(module, x))
  expected = numpy_reference(variables["params"], x, num_heads, variant)
  for fast, implementation in ((True, None), (True, "xla"), (True, "cpu_kernels"), (False, None)):
    out = module.clone(fused=fast, implementation=implementation).apply(variables, x, grid=GRID)
    np.testing.assert_allclose(out, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", ["gpsa", "psa"])
@pytest.mark.parametrize("implementation", ["cpu_kernels", "xla"])  # fused kernel / SDPA + P v
def test_fused_form_equals_explicit_form_with_gradients(variant, implementation):
  x = tokens()
  module = GPSA(num_heads=9, variant=variant, implementation=implementation)
  variables = perturb(init(module, x))
  cotangent = jax.random.normal(jax.random.key(3), x.shape)

  def loss(fast):
    f = lambda v, x: jnp.sum(module.clone(fused=fast).apply(v, x, grid=GRID) * cotangent)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(variables, x)

  (fast_value, fast_grads), (slow_value, slow_grads) = loss(True), loss(False)
  np.testing.assert_allclose(fast_value, slow_value, rtol=5e-5)  # a sum over 9 heads x 16 x 48
  for a, b in zip(jax.tree.leaves(fast_grads), jax.tree.leaves(slow_grads)):
    # atol: pos_proj's bias gradient is exactly 0 (a softmax ignores a shift), so both paths give
    # float noise of ~1e-5 there.
    np.testing.assert_allclose(a, b, atol=3e-5, rtol=1e-4)
  # The gate really receives gradient on both paths.
  if variant == "gpsa":
    assert np.abs(fast_grads[0]["params"]["gating_param"]).min() > 0


def test_local_init_nine_heads():
  x = tokens(dim=36)
  params = init(GPSA(num_heads=9, locality_strength=1.0), x)["params"]
  np.testing.assert_array_equal(params["v"]["kernel"].reshape(36, 36), np.eye(36))
  np.testing.assert_array_equal(params["gating_param"], np.ones(9))
  np.testing.assert_array_equal(params["pos_proj"]["bias"], np.zeros(9))
  w = np.asarray(params["pos_proj"]["kernel"])  # (3, H): columns are timm's rows
  np.testing.assert_array_equal(w[2], -np.ones(9))
  centres = {(w[0, h] / 2, w[1, h] / 2) for h in range(9)}
  assert centres == set(itertools.product((-1.0, 0.0, 1.0), repeat=2))
  # timm's order: head p = h1 + 3 h2 is centred at (dx, dy) = (h2 - 1, h1 - 1).
  for p in range(9):
    assert (w[0, p] / 2, w[1, p] / 2) == (p // 3 - 1, p % 3 - 1)
  # q/k stay trunc-normal(0.02), not zeroed.
  qk = np.asarray(params["qk"]["kernel"])
  assert 0.01 < qk.std() < 0.03 and np.abs(qk).max() <= 0.04 + 1e-6


@pytest.mark.parametrize("num_heads, offsets", [(4, (-0.5, 0.5)), (16, (-1.5, -0.5, 0.5, 1.5))])
def test_local_init_half_integer_centres(num_heads, offsets):
  x = tokens(dim=64)
  alpha = 2.0
  w = np.asarray(
    init(GPSA(num_heads=num_heads, locality_strength=alpha), x)["params"]["pos_proj"]["kernel"]
  )
  np.testing.assert_array_equal(w[2], -alpha * np.ones(num_heads))
  centres = {(w[0, h] / (2 * alpha), w[1, h] / (2 * alpha)) for h in range(num_heads)}
  assert centres == set(itertools.product(offsets, repeat=2))


def test_without_local_init_everything_is_trunc_normal():
  params = init(GPSA(num_heads=9, use_local_init=False), tokens())["params"]
  assert np.abs(params["v"]["kernel"].reshape(36, 36) - np.eye(36)).max() > 0.5
  assert np.abs(params["pos_proj"]["kernel"]).max() <= 0.04 + 1e-6
  np.testing.assert_array_equal(params["gating_param"], np.ones(9))


def test_positional_attention_peaks_at_kernel_offsets():
  grid = TokenGrid(7, 7)
  x = jax.random.normal(jax.random.key(0), (1, 49, 36))
  module = GPSA(num_heads=9)
  variables = module.init(jax.random.key(0), x, grid=grid)
  _, state = module.apply(variables, x, grid=grid, mutable=["intermediates"])
  pos = np.asarray(state["intermediates"]["pos_attention"][0])
  assert pos.shape == (9, 49, 49)
  query_row, query_col = 3, 3
  query = query_row * 7 + query_col
  for p in range(9):
    dx, dy = p // 3 - 1, p % 3 - 1
    assert np.argmax(pos[p, query]) == (query_row + dy) * 7 + (query_col + dx)
  # alpha = 1: the peak holds exp(0) against 4 neighbours at exp(-1) and a tail.
  assert pos[:, query].max(-1).min() > 0.3


def test_intermediates_gate_and_normalised_attention():
  x = tokens()
  module = GPSA(num_heads=4)
  variables = init(module, x)
  out, state = module.apply(variables, x, grid=GRID, mutable=["intermediates"])
  inter = state["intermediates"]
  attn = np.asarray(inter["attention"][0])
  assert attn.shape == (2, 4, 25, 25)
  np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(inter["gate"][0], jax.nn.sigmoid(1.0) * np.ones(4), rtol=1e-6)
  np.testing.assert_allclose(out, module.apply(variables, x, grid=GRID), atol=1e-6)


def test_attention_dropout_uses_explicit_path():
  x = tokens()
  module = GPSA(num_heads=4, attn_drop=0.5)
  variables = init(module, x)
  eval_out = module.apply(variables, x, grid=GRID)
  train_out = module.apply(variables, x, grid=GRID, train=True, rngs={"dropout": jax.random.key(1)})
  assert np.abs(train_out - eval_out).max() > 1e-3
  # No attention dropout: training runs the fast path and needs no rng.
  module = GPSA(num_heads=4)
  np.testing.assert_allclose(module.apply(variables, x, grid=GRID, train=True), eval_out, atol=1e-6)


def test_non_square_heads_warn_and_keep_random_rows():
  x = tokens(dim=36)
  with pytest.warns(UserWarning, match=r"num_heads=6 is not a perfect square.*4 = 2\^2"):
    params = init(GPSA(num_heads=6), x)["params"]
  w = np.asarray(params["pos_proj"]["kernel"])
  np.testing.assert_array_equal(w[2, :4], -1.0)
  assert np.abs(w[:, 4:]).max() <= 0.04 + 1e-6  # trunc-normal(0.02), untouched
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # square head counts and apply() never warn
    init(GPSA(num_heads=9), x)
    GPSA(num_heads=6).apply({"params": params}, x, grid=GRID)


def test_prefix_tokens_are_rejected():
  x = tokens()
  module = GPSA(num_heads=4)
  variables = init(module, x)
  x_cls = jnp.concatenate([x[:, :1], x], axis=1)
  with pytest.raises(ValueError, match=r"patch tokens only, .*: apply it to the patch tokens x\[:"):
    module.apply(variables, x_cls, grid=GRID, num_prefix_tokens=1)


def test_grid_mismatch_and_bad_variant():
  x = tokens()
  with pytest.raises(ValueError, match="does not match"):
    GPSA(num_heads=4).init(jax.random.key(0), x, grid=TokenGrid(4, 4))
  with pytest.raises(ValueError, match="variant"):
    GPSA(num_heads=4, variant="gated").init(jax.random.key(0), x, grid=GRID)


@pytest.mark.parametrize("variant", ["gpsa", "psa"])
def test_bfloat16(variant):
  x = tokens()
  module = GPSA(num_heads=4, variant=variant)
  variables = init(module, x)
  expected = module.apply(variables, x, grid=GRID)
  for fast in (True, False):
    out = module.clone(dtype=jnp.bfloat16, fused=fast).apply(variables, x, grid=GRID)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=5e-2, rtol=5e-2)


# ---------------------------------------------------------------------------------------------
# ConViT models

PAPER_PARAMS_M = {  # ConViT Table 1
  "convit_tiny": 6,
  "convit_small": 27,
  "convit_base": 86,
  "convit_tiny_plus": 10,
  "convit_small_plus": 48,
  "convit_base_plus": 152,
}


def count_params(model, size=224):
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  return sum(math.prod(a.shape) for a in jax.tree.leaves(flax.linen.meta.unbox(shapes)))


def analytic_params(C, H, gpsa=10, depth=12, patches=196, patch=16, classes=1000):
  block = 4 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)  # two norms + MLP
  gpsa_attn = 3 * C * C + C * C + C + 4 * H + H  # qk, v, proj, pos_proj, gating_param
  mhsa_attn = 3 * C * C + C * C + C
  embed = patch * patch * 3 * C + C + patches * C + C  # patch conv, pos_embed, cls_token
  return (
    embed
    + depth * block
    + gpsa * gpsa_attn
    + (depth - gpsa) * mhsa_attn
    + 2 * C
    + (C * classes + classes)
  )


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS_M))
def test_convit_param_counts(name):
  model = create_model(name)
  count = count_params(model)
  assert count == analytic_params(model.embed_dim, model.num_heads)
  # Table 1 rounds loosely (27.8M is listed as 27M, 153.1M as 152M): check to about 1M.
  assert abs(count / 1e6 - PAPER_PARAMS_M[name]) < 1.2, count


def test_convit_configuration():
  model = create_model("convit_small")
  assert (model.embed_dim, model.num_heads, model.depth) == (432, 9, 12)
  assert tuple(model.layer_attention) == ("gpsa",) * 10 + ("mhsa",) * 2
  assert model.class_token_layer == 10 and not model.qkv_bias and model.drop_path_rate == 0.1
  assert create_model("convit_base_plus").embed_dim == 1024
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))
  params = flax.linen.meta.unbox(shapes)["params"]
  assert params["pos_embed"].shape == (1, 196, 432)  # no class-token entry
  assert "gating_param" in params["blocks_9"]["attn"] and "qkv" in params["blocks_10"]["attn"]


def test_convit_overrides_layers_and_locality():
  assert convit_layers(3, 5) == ("gpsa",) * 3 + ("mhsa",) * 2
  with pytest.raises(ValueError, match="local_up_to_layer"):
    convit_layers(7, 6)
  with pytest.raises(ValueError) as depth_alone:  # was one line, then the next at the next try
    create_model("convit_tiny_patch4_32", depth=4)
  assert str(depth_alone.value).splitlines() == [
    "class_token_layer=10 must be in [0, 4].",
    "layer_attention has 12 entries for depth=4.",
    "depth, layer_attention (a kind per block) and class_token_layer go together: give all three "
    "for depth=4 (for a ConViT, locvit.models.convit_overrides(local_up_to_layer, 4) returns the "
    "other two).",
  ]
  with pytest.raises(ValueError) as one_kind:  # was 'give all three', with nothing to type
    create_model("gmm_vit_smalldata_d9_patch4_32", depth=3)
  assert str(one_kind.value).splitlines()[-1] == (
    "depth, layer_attention (a kind per block) and class_token_layer go together: give all three "
    "for depth=3, e.g. layer_attention=\"('gmm', 'gmm', 'gmm')\" class_token_layer=0 (as "
    "--config.model.overrides.FIELD=VALUE)."
  )
  create_model("gmm_vit_smalldata_d9_patch4_32", depth=3, layer_attention=("gmm",) * 3)
  with pytest.raises(ValueError) as no_kinds:  # a model without per-block kinds
    create_model("deit_tiny_patch16_224", class_token_layer=20)
  assert str(no_kinds.value).splitlines() == [
    "class_token_layer=20 must be in [0, 12].",
    "depth and class_token_layer go together: give class_token_layer in [0, 12].",
  ]
  model = create_model(
    "convit_tiny_patch4_32",
    num_classes=10,
    attention_kwargs={"gpsa": {"locality_strength": 2.0}},
    **convit_overrides(local_up_to_layer=2, depth=3),
  )
  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  variables = jax.jit(model.init)(jax.random.key(0), images)
  params = flax.linen.meta.unbox(variables)["params"]
  assert set(params["blocks_1"]["attn"]) >= {"qk", "v", "pos_proj", "gating_param"}
  assert set(params["blocks_2"]["attn"]) == {"qkv", "proj"}
  np.testing.assert_array_equal(params["blocks_0"]["attn"]["pos_proj"]["kernel"][2], -2.0)
  logits, state = jax.jit(functools.partial(model.apply, mutable=["intermediates"]))(
    variables, images
  )
  assert logits.shape == (2, 10)
  inter = state["intermediates"]
  assert inter["blocks_0"]["attn"]["attention"][0].shape == (2, 4, 64, 64)
  assert inter["blocks_2"]["attn"]["attention"][0].shape == (2, 4, 65, 65)  # with class token
  np.testing.assert_allclose(logits, jax.jit(model.apply)(variables, images), atol=1e-5)


def test_attention_implementations_agree_and_bad_name_is_rejected():
  from locvit.attention import dot_product_attention

  q, k, v = (jax.random.normal(jax.random.key(i), (2, 7, 3, 4)) for i in range(3))
  bias = jax.random.normal(jax.random.key(4), (1, 3, 7, 7))
  np.testing.assert_allclose(
    dot_product_attention(q, k, v, bias, "cpu_kernels"),
    dot_product_attention(q, k, v, bias, "xla"),
    atol=1e-6,
  )
  with pytest.raises(ValueError, match=r"implementation='flash' is not one of"):
    dot_product_attention(q, k, v, implementation="flash")


def test_gpsa_geometry_is_built_in_the_graph_not_baked_in_per_layer():
  """ConViT's GPSA layers share the relative features as a few iota instructions: the lowered
  gradient step holds no dense constant over 1 KB (it held one (N, N, 3) table per GPSA layer),
  and the in-graph features equal the NumPy table."""
  import re

  from locvit.attention.geometry import gpsa_relative_features

  grid = TokenGrid(4, 5)
  traced = jax.jit(lambda: gpsa_relative_features(grid, in_graph=True))()
  np.testing.assert_array_equal(traced, gpsa_relative_features(grid))
  model = create_model("convit_tiny", num_classes=10).clone(attention_implementation="xla")
  images = jnp.zeros((2, 64, 64, 3))
  params = jax.eval_shape(model.init, jax.random.key(0), images)["params"]
  grad = jax.jit(jax.grad(lambda p, x: jnp.mean(model.apply({"params": p}, x))))
  text = grad.trace(params, images).lower(lowering_platforms=("tpu",)).as_text()
  sizes = [len(h) // 2 for h in re.findall(r'dense<"0x([0-9A-F]+)"', text)]
  assert max(sizes, default=0) <= 1024, sorted(sizes)[-3:]
