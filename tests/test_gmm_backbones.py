"""The GMM paper's backbones (ViT, Swin, CaiT, PiT, T2T) with and without masks.

Parameter counts are exact: against the paper's printed counts where it prints them (Tables 3-6)
and against counts derived by hand from the official PyTorch models otherwise. Where each mask
acts is checked against explicit formulas. About 45 s on 2 CPU cores.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import gmm_table56
from locvit.attention import TokenGrid
from locvit.attention.masks import mask_attention_kwargs
from locvit.models import build_model, create_model, default_image_size, list_models
from locvit.models.cait import CaiTLayer, TalkingHeadsAttention, layer_scale_init
from locvit.models.swin import WindowAttention, relative_position_index, shift_mask
from locvit.models.t2t import soft_split
from tests.test_masks import official_gmm

# Tests compile many small programs: XLA's backend optimisations cost more than they save here.
fast_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def param_shapes(model, image_size: int | tuple[int, int]) -> dict[str, tuple[int, ...]]:
  """Parameter shapes by '/'-joined path, from tracing only (nothing is compiled)."""
  height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
  images = jnp.zeros((1, height, width, 3))
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), images))
  params = flax.core.meta.unbox(variables["params"])
  return {k: v.shape for k, v in flax.traverse_util.flatten_dict(params, sep="/").items()}


def count(model, image_size: int | tuple[int, int] = 32) -> int:
  return sum(int(np.prod(s)) for s in param_shapes(model, image_size).values())


# ---------------------------------------------------------------------------------------------
# Parameter counts


@pytest.mark.parametrize(
  "name, classes, overrides, expected",
  [
    # The paper's printed ViT counts are those of the mean-pooled model (Tables 3, 5, 6).
    ("vit_smalldata_d6_patch4_32", 10, {"pool": "gap"}, 3_091_798),
    ("vit_smalldata_d9_patch4_32", 10, {"pool": "gap"}, 2_692_042),
    ("vit_smalldata_d15_patch4_32", 10, {"pool": "gap"}, 2_523_610),
    ("vit_smalldata_d30_patch4_32", 10, {"pool": "gap"}, 2_838_790),
    ("vit_smalldata_d60_patch4_32", 10, {"pool": "gap"}, 2_531_890),
    ("vit_smalldata_d9_patch4_32", 100, {"pool": "gap"}, 2_709_412),
    ("vit_smalldata_d15_patch4_32", 100, {"pool": "gap"}, 2_536_660),
    ("vit_smalldata_d8_patch4_64", 200, {"pool": "gap"}, 2_469_128),
    # The official baseline adds a class token and its position: + 2 x 192.
    ("vit_smalldata_d9_patch4_32", 10, {}, 2_692_042 + 384),
    # ELM-ViT, Tables 5 and 6, exactly as printed.
    ("elm_vit_smalldata_d9_patch4_32", 10, {}, 2_728_906),
    ("elm_vit_smalldata_d15_patch4_32", 10, {}, 2_585_050),
    ("elm_vit_smalldata_d9_patch4_32", 100, {}, 2_746_276),
    ("elm_vit_smalldata_d15_patch4_32", 100, {}, 2_598_100),
    ("elm_vit_smalldata_d8_patch4_64", 200, {}, 2_993_416),
    # Table 4: CaiT as printed; the 30-layer ViT before its GMM parameters.
    ("cait_smalldata_patch4_32", 10, {}, 9_020_618),
    ("vit_smalldata_d30w192_patch4_32", 10, {"pool": "gap"}, 8_917_450),
    # Hand counts of the official models (paper: 7.1M, 7.0M, 6.5M); T2T without the
    # reference's unused cls_token (256) and stem norm (1,152).
    ("swin_smalldata_patch2_32", 10, {}, 7_073_188),
    ("pit_smalldata_patch2_32", 10, {}, 6_972_586),
    ("t2t_smalldata_32", 10, {}, 6_484_672),
  ],
)
def test_parameter_counts(name, classes, overrides, expected):
  model = create_model(name, classes, **overrides)
  assert count(model, default_image_size(name)) == expected


def test_table5_models_are_the_official_six_heads_of_32():
  """GMM Table 5 (Tiny-ImageNet, 64x64 at patch 4): the configs build the official d8 model, 6
  heads of 32, with the parameter counts the paper prints (the ViT's for mean pooling)."""
  _, _, printed = gmm_table56.PAPER[("tinyimagenet", "d8")]
  for variant, expected in zip(gmm_table56.VARIANTS, printed, strict=True):
    config = gmm_table56.get_config(f"tinyimagenet,d8,{variant}")
    model = build_model(config, config.data.num_classes)
    assert (model.num_heads, model.head_dim, model.embed_dim, model.depth) == (6, 32, 192, 8)
    model = model.clone(pool="gap") if variant == "vit" else model
    assert count(model, 64) == int(expected.replace(",", "")), variant
  # The 12-head model of the same size: same ViT count, GMM's 2 K H per layer doubles.
  h12 = {mask: create_model(f"{mask}vit_smalldata_d8_h12_patch4_64", 200) for mask in ("", "gmm_")}
  assert (h12["gmm_"].num_heads, h12["gmm_"].head_dim) == (12, 16)
  assert count(h12["gmm_"], 64) - count(h12[""].clone(pool="gap"), 64) == 8 * 2 * 5 * 12


def masked_layers(name: str) -> list[int]:
  """Heads of every masked attention layer of the registered GMM model."""
  return {
    "vit_smalldata_d9_patch4_32": [12] * 9,
    "swin_smalldata_patch2_32": [3] * 2 + [6] * 6 + [12] * 4,
    "cait_smalldata_patch4_32": [4] * 24,  # not the 2 class-attention layers
    "pit_smalldata_patch2_32": [2] * 2 + [4] * 6 + [8] * 4,
    "t2t_smalldata_32": [1] + [4] * 12,  # the token transformer, then the 12 blocks
  }[name]


@pytest.mark.parametrize(
  "name",
  [
    "vit_smalldata_d9_patch4_32",
    "swin_smalldata_patch2_32",
    "cait_smalldata_patch4_32",
    "pit_smalldata_patch2_32",
    "t2t_smalldata_32",
  ],
)
@pytest.mark.parametrize("num_kernels", [5, 3])
def test_gmm_adds_2_k_h_parameters_per_layer(name, num_kernels):
  overrides = {"pool": "gap"} if name.startswith("vit") else {}
  base = param_shapes(create_model(name, 10, **overrides), 32)
  gmm = param_shapes(
    create_model(
      "gmm_" + name, 10, attention_kwargs=mask_attention_kwargs("gmm", num_kernels=num_kernels)
    ),
    32,
  )
  heads = masked_layers(name)
  mask_params = {k: s for k, s in gmm.items() if k.endswith(("/mask/alpha", "/mask/sigma"))}
  assert sorted(s[1] for k, s in mask_params.items() if k.endswith("alpha")) == sorted(heads)
  assert all(s[0] == num_kernels for s in mask_params.values())
  assert {k: s for k, s in gmm.items() if k not in mask_params} == base
  total = lambda shapes: sum(int(np.prod(s)) for s in shapes.values())
  assert total(gmm) - total(base) == sum(2 * num_kernels * h for h in heads)


def test_registry_names_and_image_sizes():
  names = set(list_models("smalldata"))
  for arch in ("swin_smalldata_patch2_32", "cait_smalldata_patch4_32", "pit_smalldata_patch2_32"):
    assert {arch, "gmm_" + arch} <= names
  assert {"t2t_smalldata_64", "gmm_t2t_smalldata_64", "gmm_cait_smalldata_patch8_64"} <= names
  for size in ("d6", "d9", "d15", "d30", "d60", "d30w192"):
    for prefix in ("", "gmm_", "elm_"):
      assert f"{prefix}vit_smalldata_{size}_patch4_32" in names
  assert default_image_size("gmm_vit_smalldata_d9_patch8_64") == 64
  assert default_image_size("elm_vit_smalldata_d8_patch4_64") == 64
  assert default_image_size("gmm_vit_smalldata_d8_h12_patch4_64") == 64


# ---------------------------------------------------------------------------------------------
# Forward passes (small depths, to keep compile time low)

SMALL = {
  "vit_smalldata_d9_patch4_32": {"depth": 2},
  "swin_smalldata_patch2_32": {"depths": (2, 1, 1)},
  "cait_smalldata_patch4_32": {"depth": 2, "class_depth": 1},
  "pit_smalldata_patch2_32": {"depths": (1, 1, 1)},
  "t2t_smalldata_32": {"depth": 1},
}


def small_model(name: str, prefix: str):
  overrides = dict(SMALL[name])
  if name.startswith("vit") and prefix:
    overrides["layer_attention"] = ("gmm",) * overrides["depth"]
  return create_model(prefix + name, 7, **overrides)


@functools.cache
def run_small(name: str):
  """One jitted ``init_with_output`` of the small GMM variant: logits and all variables.

  With every collection mutable the variables include the intermediates (mask tables,
  attention maps); sharing this one compiled run keeps the file fast.
  """
  images = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  model = small_model(name, "gmm_")
  return fast_jit(lambda key, x: model.init_with_output(key, x, mutable=True))(
    jax.random.key(1), images
  )


def mask_tables(name: str) -> dict[str, np.ndarray]:
  _, variables = run_small(name)
  flat = flax.traverse_util.flatten_dict(variables["intermediates"], sep="/")
  return {k[: -len("/table")]: np.asarray(v[0]) for k, v in flat.items() if k.endswith("/table")}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_shapes_with_and_without_masks(name):
  logits, variables = run_small(name)  # the GMM model runs (compiled)
  assert logits.shape == (2, 7) and bool(jnp.all(jnp.isfinite(logits)))
  assert any("mask" in k for k in flax.traverse_util.flatten_dict(variables["params"]))
  base = small_model(name, "")  # the baseline is traced only
  out = jax.eval_shape(lambda: base.init_with_output(jax.random.key(0), jnp.zeros((2, 32, 32, 3))))
  assert out[0].shape == (2, 7)
  assert not any("mask" in k for k in flax.traverse_util.flatten_dict(out[1]["params"]))


# ---------------------------------------------------------------------------------------------
# Swin: mask inside each window, before the relative position bias and the shift mask


def official_relative_position_index(window: int) -> np.ndarray:
  coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij"))
  flat = coords.reshape(2, -1)
  rel = (flat[:, :, None] - flat[:, None, :]).transpose(1, 2, 0)
  rel[:, :, 0] += window - 1
  rel[:, :, 1] += window - 1
  rel[:, :, 0] *= 2 * window - 1
  return rel.sum(-1)


def test_swin_window_attention_order_of_mask_bias_and_shift():
  window, heads, dim = 4, 2, 16
  shift = jnp.asarray(shift_mask(TokenGrid(8, 8), window, 2))  # 4 windows
  np.testing.assert_array_equal(
    relative_position_index(window), official_relative_position_index(4)
  )
  attn = WindowAttention(heads, window, attention="gmm", attention_kwargs={"num_kernels": 2})
  x = jax.random.normal(jax.random.key(0), (4, 16, dim))  # batch 1 x 4 windows
  variables = attn.init(jax.random.key(1), x, shift)
  params = jax.tree.map(
    lambda a: np.asarray(a, np.float64), flax.core.meta.unbox(variables)["params"]
  )
  _, state = attn.apply(variables, x, shift, mutable=["intermediates"])

  qkv = np.einsum("bnc,cthd->bnthd", np.asarray(x), params["qkv"]["kernel"]) + params["qkv"]["bias"]
  q, k = qkv[:, :, 0], qkv[:, :, 1]
  logits = np.einsum("bnhd,bmhd->bhnm", q, k) * (dim // heads) ** -0.5
  mask = official_gmm(params["mask"]["alpha"], params["mask"]["sigma"], 16)
  bias = params["relative_position_bias_table"][official_relative_position_index(4)]
  logits = logits * mask + bias.transpose(2, 0, 1) + np.asarray(shift)[:, None]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  np.testing.assert_allclose(state["intermediates"]["attention"][0], probs, rtol=1e-4, atol=1e-7)


def test_swin_shift_mask_regions():
  mask = shift_mask(TokenGrid(8, 8), 4, 2)
  assert mask.shape == (4, 16, 16) and set(np.unique(mask)) == {0.0, -100.0}
  zeros = (mask == 0).sum(axis=(1, 2))
  # Windows: top-left one region; top-right / bottom-left two regions of 8; bottom-right four of 4.
  np.testing.assert_array_equal(zeros, [256, 128, 128, 64])


def test_swin_window_that_does_not_tile_is_an_error():
  model = create_model("gmm_swin_smalldata_patch2_32", 10)
  with pytest.raises(ValueError, match=r"window_size=4 does not tile the 10x10 token grid"):
    count(model, 40)  # 20x20 -> 10x10 in the second stage
  with pytest.raises(
    ValueError, match=r"window_size=3 does not tile the 16x16.*\[1, 2, 4, 8, 16\]"
  ):
    count(create_model("swin_smalldata_patch2_32", 10, window_size=3), 32)


def test_swin_masks_act_on_square_windows_of_a_non_square_image():
  model = create_model("gmm_swin_smalldata_patch2_32", 10, depths=(2, 1, 1))
  images = jnp.zeros((1, 32, 64, 3))  # 16x32, 8x16, 4x8 tokens; 4x4 windows
  logits = jax.eval_shape(lambda: model.init_with_output(jax.random.key(0), images)[0])
  assert logits.shape == (1, 10)


def test_bad_backbone_attention_is_a_clear_error():
  with pytest.raises(ValueError, match="Swin attention='gpsa' is not one of"):
    create_model("swin_smalldata_patch2_32", 10, attention="gpsa")
  with pytest.raises(ValueError, match="num_kernels >= 1"):
    create_model("gmm_cait_smalldata_patch4_32", 10, attention_kwargs={"gmm": {"num_kernels": 0}})
  with pytest.raises(ValueError, match=r"no options \['sigma'\]"):
    create_model("gmm_pit_smalldata_patch2_32", 10, attention_kwargs={"gmm": {"sigma": 1.0}})


# ---------------------------------------------------------------------------------------------
# CaiT: mask before the talking-heads mixing; LayerScale; unmasked class attention


def test_cait_mask_comes_before_talking_heads():
  heads, head_dim, dim = 3, 8, 24
  grid = TokenGrid(4, 4)
  attn = TalkingHeadsAttention(
    heads, head_dim, attention="gmm", attention_kwargs={"num_kernels": 2}
  )
  x = jax.random.normal(jax.random.key(0), (2, 16, dim))
  init = fast_jit(lambda key, x: attn.init_with_output(key, x, grid=grid, mutable=True))
  _, variables = init(jax.random.key(1), x)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), flax.core.meta.unbox(variables)["params"])
  state = variables  # init records the intermediates too
  q = np.einsum("bnc,chd->bnhd", np.asarray(x), p["q"])
  k = np.einsum("bnc,chd->bnhd", np.asarray(x), p["kv"][:, 0])
  logits = np.einsum("bnhd,bmhd->bhnm", q, k) * head_dim**-0.5
  logits = logits * official_gmm(p["mask"]["alpha"], p["mask"]["sigma"], 16)
  logits = np.einsum("bhnm,hg->bgnm", logits, p["mix_pre"])
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = np.einsum("bhnm,hg->bgnm", probs / probs.sum(-1, keepdims=True), p["mix_post"])
  np.testing.assert_allclose(state["intermediates"]["attention"][0], probs, rtol=1e-4, atol=1e-6)


def test_cait_layer_scale_and_unmasked_class_attention():
  assert [layer_scale_init(i) for i in (1, 18, 19, 24, 25)] == [0.1, 0.1, 1e-5, 1e-5, 1e-6]
  layer = CaiTLayer(num_heads=2, head_dim=4, mlp_dim=8, layer=19)
  params = fast_jit(layer.init)(jax.random.key(0), jnp.zeros((1, 4, 8)))["params"]
  np.testing.assert_array_equal(
    flax.core.meta.unbox(params)["gamma_1"], np.full(8, 1e-5, np.float32)
  )
  shapes = param_shapes(create_model("gmm_cait_smalldata_patch4_32", 10), 32)
  assert sum(k.endswith("mask/alpha") for k in shapes) == 24
  assert not any(k.startswith("class_blocks") and "mask" in k for k in shapes)


# ---------------------------------------------------------------------------------------------
# PiT and T2T: one table per grid


def test_pit_has_one_mask_grid_per_stage_and_keeps_the_class_token():
  assert {k: v.shape for k, v in mask_tables("pit_smalldata_patch2_32").items()} == {
    "stages_0_blocks_0/attn/mask": (2, 256, 256),
    "stages_1_blocks_0/attn/mask": (4, 64, 64),
    "stages_2_blocks_0/attn/mask": (8, 16, 16),
  }
  _, variables = run_small("pit_smalldata_patch2_32")
  maps = variables["intermediates"]["stages_1_blocks_0"]["attn"]["attention"][0]
  assert maps.shape == (2, 4, 65, 65)  # the class token attends and is attended to


def test_t2t_token_transformer_is_masked_on_its_16x16_grid():
  tables = mask_tables("t2t_smalldata_32")
  assert {k: v.shape for k, v in tables.items()} == {
    "t2t_0/mask": (1, 256, 256),
    "blocks_0/attn/mask": (4, 64, 64),
  }
  assert int((tables["t2t_0/mask"] == 0).sum()) == 21_792  # the faithful kernel's underflow
  model = create_model("gmm_t2t_smalldata_32", 10, depth=1)
  with pytest.raises(ValueError, match="requires a square token grid, got 16x24"):
    count(model, (32, 48))


def test_t2t_soft_split_is_torch_unfold():
  torch = pytest.importorskip("torch")
  x = np.random.default_rng(0).normal(size=(2, 8, 6, 3)).astype(np.float32)
  tokens, grid = soft_split(jnp.asarray(x))
  unfold = torch.nn.Unfold(kernel_size=3, stride=2, padding=1)
  expected = unfold(torch.from_numpy(x).permute(0, 3, 1, 2)).transpose(1, 2).numpy()
  assert grid == TokenGrid(4, 3)
  np.testing.assert_allclose(tokens, expected, rtol=1e-6)
