"""--mode=analyze's figures tell the truth for each paper's model: one colour scale shared by the
panels a figure compares, labelled axes, and each model's own mechanism (Cordonnier's Gaussian
centres, GMM masks); models it cannot draw get the curves and a warning that says so."""

from __future__ import annotations

import os

import flax
import jax
import ml_collections
import numpy as np
import pytest
from matplotlib import colors

from locvit import metrics as metrics_lib
from locvit.analysis import analyze as analyze_lib
from locvit.analysis import centers, masks, plots
from locvit.attention import TokenGrid
from locvit.models import create_model
from tests.train_utils import tiny_config

BAR = "<colorbar>"  # matplotlib's label of a colour bar's axes


def _local_and_uniform_maps() -> dict[int, np.ndarray]:
  """Layer 0: a local head (0.9 on one patch) and a nearly uniform one (1/16 within 1%)."""
  local = np.full((4, 4), 0.1 / 15)
  local[1, 2] = 0.9
  uniform = np.full((4, 4), 1 / 16) * np.linspace(0.995, 1.005, 16).reshape(4, 4)
  return {0: np.stack([local, uniform / uniform.sum()])}


def _panels(fig):
  """The images of ``fig``'s panels, colour bars left out."""
  return [ax.get_images()[0] for ax in fig.axes if ax.get_images() and ax.get_label() != BAR]


def _colour_bar(fig):
  [bar] = [ax for ax in fig.axes if ax.get_label() == BAR]
  return bar


def test_attention_maps_share_one_log_scale_with_its_colour_bar():
  maps = _local_and_uniform_maps()
  image = np.zeros((8, 8, 1))
  fig = plots.attention_maps_figure(image, TokenGrid(4, 4), (1, 2), maps, {}, patch_size=2)
  _, local, uniform = _panels(fig)  # the input image, then the heads
  assert isinstance(local.norm, colors.LogNorm)
  assert (local.norm.vmin, local.norm.vmax) == (uniform.norm.vmin, uniform.norm.vmax)
  assert (local.norm.vmin, local.norm.vmax) == (0.1 / 15, 0.9)  # the smallest and largest weight
  # The nearly uniform head spans a sliver of the colours (each panel's own scale: all of them).
  shown = uniform.norm(maps[0][1])
  assert shown.max() - shown.min() < 0.02
  assert _colour_bar(fig).get_ylabel() == plots.MAP_COLOURBAR_LABEL
  # Weights more than MAP_DECADES below the largest are clipped, and the colour bar says so.
  maps[0][0][0, 0] = 1e-9
  fig = plots.attention_maps_figure(image, TokenGrid(4, 4), (1, 2), maps, {}, patch_size=2)
  assert _colour_bar(fig).get_ylabel().endswith("\n(below 9.0e-05: lowest colour)")
  assert _panels(fig)[1].norm.vmin == 0.9 * 10.0**-plots.MAP_DECADES


def test_mask_figure_shares_one_scale_and_attention_centres_label_their_axes():
  flat, local = np.full((16, 16), 0.5), np.eye(16)
  fig = masks.mask_table_figure(np.stack([flat, local]), TokenGrid(4, 4), title="t")
  norms = {(image.norm.vmin, image.norm.vmax) for image in _panels(fig)}
  assert norms == {(0.0, 1.0)}  # the flat mask is drawn flat, not stretched over the colours
  assert _colour_bar(fig).get_ylabel() == "mask value (shared by all panels)"

  model = create_model(
    "cordonnier_sa", num_classes=10, hidden_dim=16, mlp_dim=24, depth=1, num_heads=4
  )
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 3)))["params"]
  fig = centers.attention_centers_figure(params, title="cordonnier_sa, step 0")
  [ax] = fig.axes
  assert (ax.get_xlabel(), ax.get_ylabel()) == ("column offset (tokens)", "row offset (tokens)")
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"head {h}" for h in range(4)]
  assert fig.get_suptitle().startswith("cordonnier_sa, step 0\n")


def test_attention_centres_name_the_heads_outside_the_window_or_without_a_centre():
  """Was: a head centred beyond the window kept its legend entry but had no contour or marker,
  as if it were not there (an 8x8 grid allows offsets up to 7; the window shows 5.5)."""
  model = create_model(
    "cordonnier_sa", num_classes=10, hidden_dim=16, mlp_dim=24, depth=1, num_heads=4
  )
  params = flax.linen.meta.unbox(model.init(jax.random.key(0), np.zeros((1, 8, 8, 3))))["params"]
  layer = params["layers_0"]["attn"]["positional"]
  layer["attention_centers"] = np.asarray(layer["attention_centers"]).copy()
  layer["attention_centers"][2] = (6.25, -1.0)
  [ax] = centers.attention_centers_figure(params).axes
  assert [t.get_text() for t in ax.texts] == ["head 2 outside: row +6.2, col -1.0"]

  # Was: a GPSA head preferring far keys (alpha <= 0) was left out, the next heads renumbered.
  from locvit.models.convit import convit_overrides

  shape = dict(num_heads=4, embed_dim=32, **convit_overrides(1, 1))
  model = create_model("convit_tiny_patch4_32", num_classes=10, **shape)
  params = flax.linen.meta.unbox(model.init(jax.random.key(0), np.zeros((1, 32, 32, 3))))["params"]
  before = centers.gpsa_heads(params)["blocks_0/attn"][0]
  kernel = np.asarray(params["blocks_0"]["attn"]["pos_proj"]["kernel"]).copy()
  kernel[2, 1] = 0.5  # head 1: -alpha = 0.5
  params["blocks_0"]["attn"]["pos_proj"]["kernel"] = kernel
  [ax] = centers.attention_centers_figure(params).axes
  assert [t.get_text() for t in ax.texts] == ["head 1: no centre (prefers far keys)"]
  after = centers.gpsa_heads(params)["blocks_0/attn"][0]
  np.testing.assert_array_equal(after[[0, 2, 3]], before[[0, 2, 3]])  # not renumbered
  assert np.isnan(after[1]).all()


MODELS = {
  "cordonnier": (
    "cordonnier_sa",
    {"hidden_dim": 16, "mlp_dim": 24, "depth": 2, "num_heads": 4},
    ["attention_maps.png", "attention_centers.png"],
  ),
  "gmm": (
    "gmm_vit_smalldata_d6_patch4_32",
    {"embed_dim": 16, "num_heads": 2, "depth": 2, "layer_attention": ("gmm",) * 2, "patch_size": 2},
    ["attention_maps.png", "masks_layer1.png"],
  ),
  "pit": ("pit_smalldata_patch2_32", {}, []),
}


@pytest.mark.parametrize("kind", MODELS)
def test_analyze_draws_each_models_own_mechanism(kind, tmp_path, caplog, monkeypatch):
  """Was: a Cordonnier run stopped with 'CordonnierNet object has no attribute patch_size', a GMM
  run got no mask figure, and a PiT run was said to have 'no attention layers'. The run here is
  one logged row and the model's initial parameters (restoring is tested in test_locality)."""
  name, overrides, figures = MODELS[kind]
  c = tiny_config()
  c.model.name, c.model.overrides = name, ml_collections.ConfigDict(overrides)
  c.analysis.map_layers = (1,)
  workdir = str(tmp_path / "run")
  writer = metrics_lib.MetricWriter(workdir)
  writer.write(1, {"train/loss": 2.3, "eval/top1": 0.1, "eval/top5": 0.5, "eval/loss": 2.3})
  writer.close()

  def initial_params(config, workdir, model, image_shape, step=None):
    return model.init(jax.random.key(0), np.zeros((1, *image_shape)))["params"], 0

  monkeypatch.setattr(analyze_lib, "restore_params", initial_params)
  written = analyze_lib.analyze(c, workdir, str(tmp_path / "out"))
  assert [os.path.basename(p) for p in written] == ["training_curves.png", *figures]
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  if kind == "pit":
    assert warnings == [
      "pit_smalldata_patch2_32 (PiT): the attention figures are drawn for ViT-family models (ViT, "
      "DeiT, ConViT, GMM / ELM-ViT, structured-init ViTs) and Cordonnier et al.'s networks; "
      "drawing the training curves only."
    ]
  elif kind == "cordonnier":  # no locality logging to suggest: the trainer logs it for ViTs only
    assert warnings == []


def test_init_maps_compare_inits_on_one_scale():
  """Was: each panel of ``python -m locvit.analysis.init_maps`` on its own scale, so a random
  init's near-uniform attention (1/N +- 2%) filled the colours like an impulse's peaks."""
  from locvit.analysis import init_maps

  rng = np.random.default_rng(0)
  impulse = np.full((1, 16, 16), 0.1 / 15) + 0.9 * np.eye(16, k=1)[None]
  random = np.full((1, 16, 16), 1 / 16) * rng.uniform(0.98, 1.02, (1, 16, 16))
  maps = {"impulse": {0: impulse}, "trunc_normal": {0: random}}
  for fig in (
    init_maps.comparison_figure(maps, [0], zoom=8),
    init_maps.init_figure(maps["trunc_normal"], [0], 8, "trunc_normal"),
  ):
    assert len({(p.norm.vmin, p.norm.vmax) for p in _panels(fig)}) == 1
    assert _colour_bar(fig).get_ylabel() == init_maps.COLOUR_BAR_LABEL
  panels = _panels(init_maps.comparison_figure(maps, [0], zoom=8))
  shown = panels[2].norm(random[0])  # trunc_normal's full map
  assert shown.max() - shown.min() < 0.01
  assert (panels[2].norm.vmin, panels[2].norm.vmax) == (0.0, impulse.max())  # linear from 0


def test_nonlocality_axis_shows_values_not_an_offset_of_a_few_ulps():
  """Was: '1e-5+4.1364' above the axis, a 2e-5 change drawn over its whole height."""
  x = np.array([0.0, 0.08, 0.16])
  series = {0: np.array([4.13644, 4.13645, 4.13646]), 1: np.array([4.13644, 4.13644, 4.13645])}
  [ax] = plots.nonlocality_figure(x, series).axes
  low, high = ax.get_ylim()
  assert high - low == pytest.approx(plots.NONLOCALITY_MIN_SPAN) and low < 4.13644 < 4.13646 < high
  assert not ax.yaxis.get_major_formatter().get_useOffset()


def test_titles_name_the_overrides_that_change_the_model():
  """Was 'structvit_d8_dim64_h4_patch2_32' over the 8x8 grid of its patch_size=4 override."""
  from locvit.configs import structinit_cifar10_small

  config = structinit_cifar10_small.get_config("impulse3")
  assert analyze_lib.model_label(config) == "structvit_d8_dim64_h4_patch2_32 (patch_size=4)"
  config.model.overrides = ml_collections.ConfigDict({"drop_path_rate": 0.1})
  assert analyze_lib.model_label(config) == "structvit_d8_dim64_h4_patch2_32"


def test_centre_plots_over_training_name_the_model_and_step(tmp_path, monkeypatch):
  """Was: only the contour legend above the panels of plots/centers_step_NNNNNN.png."""
  saved = {}
  monkeypatch.setattr(centers, "_save", lambda fig, path: saved.setdefault(path, fig))
  config = tiny_config()
  config.model.name = "cordonnier_sa"
  config.model.overrides = ml_collections.ConfigDict({"hidden_dim": 16, "mlp_dim": 24, "depth": 1})
  config.analysis.center_plots = True
  model = create_model("cordonnier_sa", num_classes=10, hidden_dim=16, mlp_dim=24, depth=1)
  params = model.init(jax.random.key(0), np.zeros((1, 8, 8, 1)))["params"]
  centers.make_center_plotter(config, params, str(tmp_path))(7, params)
  [fig] = saved.values()
  assert fig.get_suptitle().startswith("cordonnier_sa, step 7\n")
