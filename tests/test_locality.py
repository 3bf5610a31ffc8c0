"""Locality analysis (ConViT Eq. 8, gates, attention centres) and the analyze command.

About 25-45 s on the shared 2 cores (load 2-3.5), most of it the trainer's 6-step run of a tiny
ConViT (compilation) that the analyze tests share.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import shutil
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib import image as mpimg

from locvit import metrics as metrics_lib
from locvit import train
from locvit.analysis import analyze as analyze_lib
from locvit.analysis import locality, plots
from locvit.analysis.hooks import training_hooks
from locvit.attention import GPSA, TokenGrid
from locvit.attention.gpsa import kernel_centres
from locvit.configs import defaults
from locvit.models import apply_with_intermediates, convit_overrides, create_model
from locvit.models.factory import build_model
from locvit.platform import sharding
from locvit.run import evaluation
from tests.train_utils import tiny_config

DIGITS_STEPS_PER_EPOCH = 1437 // 32
NUM_IMAGES = 16


def tiny_convit_config():
  """tiny_config() with a depth-2 ConViT: block 0 GPSA, block 1 MHSA after the class token."""
  c = tiny_config()
  c.model.name = "convit_tiny_patch2_32"
  c.model.overrides.update(dict(num_heads=4, head_dim=8, **convit_overrides(1, 2)))
  c.analysis = defaults.analysis_config()
  c.analysis.map_layers = (0, 1)
  return c


def perturb(params, seed=1, scale=0.3):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda a: a + scale * rng.normal(size=a.shape).astype(np.float32), params)


@pytest.fixture(scope="module")
def initial():
  """(config, model, initial params) of the tiny ConViT on 8x8x1 digits (4x4 patch grid)."""
  config = tiny_convit_config()
  model = build_model(config, 10)
  init = functools.partial(sharding.init_model_variables, model, (8, 8, 1))
  return config, model, nn.meta.unbox(jax.jit(init)(jax.random.key(config.seed + 1))[0])


@pytest.fixture(scope="module")
def convit(initial):
  """(model, perturbed params, images): no init symmetry (gates, v = I) can hide a bug."""
  config, model, params = initial
  return model, perturb(params), locality.fixed_eval_images(config, NUM_IMAGES)


# ------------------------------------------------------------------------------------------------
# Float64 NumPy references


def softmax(a):
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def layer_norm(x, p, eps=1e-6):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def patch_embed(images, p, patch):
  b, h, w, ch = images.shape
  x = images.reshape(b, h // patch, patch, w // patch, patch, ch).transpose(0, 1, 3, 2, 4, 5)
  x = x.reshape(b, (h // patch) * (w // patch), patch * patch * ch)
  return x @ p["kernel"].reshape(-1, p["kernel"].shape[-1]) + p["bias"]


def gpsa_attention(x, p, grid):
  qk = np.einsum("bnc,cthd->bnthd", x, p["qk"]["kernel"])
  q, k = qk[:, :, 0], qk[:, :, 1]
  rows, cols = np.divmod(np.arange(grid.num_tokens), grid.width)
  dx, dy = cols[None] - cols[:, None], rows[None] - rows[:, None]
  rel = np.stack([dx, dy, dx**2 + dy**2], axis=-1)
  pos = softmax(
    np.einsum("nmc,ch->hnm", rel, p["pos_proj"]["kernel"]) + p["pos_proj"]["bias"][:, None, None]
  )
  content = softmax(np.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5)
  g = 1 / (1 + np.exp(-p["gating_param"]))[:, None, None]
  attn = (1 - g) * content + g * pos
  return attn / attn.sum(-1, keepdims=True)


def mhsa_attention(x, p):
  qkv = np.einsum("bnc,cthd->bnthd", x, p["qkv"]["kernel"])
  if "bias" in p["qkv"]:
    qkv = qkv + p["qkv"]["bias"]
  q, k = qkv[:, :, 0], qkv[:, :, 1]
  return softmax(np.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5)


def eq8(attn, grid, prefix=0):
  """Eq. 8 in float64, loops written out: (1/N) sum_ij A_ij ||delta_ij||, head by head."""
  a = attn[..., prefix:, prefix:]
  a = a / a.sum(-1, keepdims=True)
  a = a.mean(0)
  n = grid.num_tokens
  out = np.zeros(a.shape[0])
  for h, i, j in itertools.product(range(a.shape[0]), range(n), range(n)):
    (ri, ci), (rj, cj) = divmod(i, grid.width), divmod(j, grid.width)
    out[h] += a[h, i, j] * math.hypot(ri - rj, ci - cj) / n
  return out


def locvit_intermediates(model, params, images):
  fn = jax.jit(functools.partial(apply_with_intermediates, model))
  return fn({"params": params}, images)


def f64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


# ------------------------------------------------------------------------------------------------
# Eq. 8 and the pos_proj geometry


def test_nonlocality_of_uniform_and_identity_attention():
  grid = TokenGrid(2, 2)
  uniform = jnp.full((1, 4, 4), 0.25)
  # Every query sees distances 0, 1, 1, sqrt(2).
  np.testing.assert_allclose(locality.nonlocality(uniform, grid), [(2 + math.sqrt(2)) / 4], 1e-6)
  identity = jnp.eye(4)[None, None].repeat(3, axis=1)
  np.testing.assert_array_equal(locality.nonlocality(identity, grid), np.zeros(3))


@pytest.mark.parametrize("prefix", [0, 1])
def test_nonlocality_matches_float64_reference(prefix):
  grid = TokenGrid(3, 4)
  logits = np.random.default_rng(0).normal(size=(5, 2, 12 + prefix, 12 + prefix)) * 2
  attn = softmax(logits)
  got = locality.nonlocality(jnp.asarray(attn, jnp.float32), grid, prefix)
  np.testing.assert_allclose(got, eq8(attn, grid, prefix), rtol=1e-5)
  with pytest.raises(ValueError, match="does not match a 3x4 grid plus 0 prefix"):
    locality.nonlocality(jnp.ones((2, 13, 13)), grid, 0)


def test_attention_centres_and_span_of_the_local_init():
  alpha = 2.0
  x = jnp.zeros((1, 25, 36))
  params = jax.jit(GPSA(num_heads=9, locality_strength=alpha).init)(jax.random.key(0), x)["params"]
  stats = locality.parameter_statistics(nn.meta.unbox(params))
  expected = np.zeros((9, 2))
  for p, dx, dy in kernel_centres(9):
    expected[p] = (dx, dy)
  np.testing.assert_allclose(stats["center"], expected, atol=1e-6)
  np.testing.assert_allclose(stats["span"], np.full(9, 1 / alpha), rtol=1e-6)
  np.testing.assert_allclose(stats["center_distance"], np.hypot(*expected.T), atol=1e-6)
  np.testing.assert_allclose(stats["gate"], np.full(9, 1 / (1 + math.exp(-1))), rtol=1e-6)


def test_centres_recover_an_arbitrary_quadratic():
  # w . (dx, dy, d2) = -a ((dx - 1.5)^2 + (dy + 0.25)^2) + const, a = 0.8
  a, cx, cy = 0.8, 1.5, -0.25
  kernel = np.asarray([[2 * a * cx], [2 * a * cy], [-a]], np.float32)
  centre, span = locality.attention_centres(kernel)
  np.testing.assert_allclose(centre, [[cx, cy]], rtol=1e-6)
  np.testing.assert_allclose(span, [1 / a], rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Both modes on a model, against hand-written forward passes


def test_per_layer_mode_uses_each_layers_real_input(convit):
  model, params, images = convit
  grid = TokenGrid(4, 4)
  got = jax.device_get(jax.jit(functools.partial(locality.layer_statistics, model))(params, images))
  p, x = f64(params), np.asarray(images, np.float64)
  tokens = patch_embed(x, p["patch_embed"]["proj"], 2) + p["pos_embed"][0]
  attn0 = gpsa_attention(layer_norm(tokens, p["blocks_0"]["norm1"]), p["blocks_0"]["attn"], grid)
  _, inter = locvit_intermediates(model, params, images)
  cls = np.broadcast_to(p["cls_token"], (x.shape[0], 1, tokens.shape[-1]))
  stream = np.concatenate([cls, np.asarray(inter["block_0"], np.float64)], axis=1)
  attn1 = mhsa_attention(layer_norm(stream, p["blocks_1"]["norm1"]), p["blocks_1"]["attn"])
  np.testing.assert_allclose(got[0]["nonlocality"], eq8(attn0, grid), rtol=2e-4)
  np.testing.assert_allclose(got[1]["nonlocality"], eq8(attn1, grid, prefix=1), rtol=2e-4)
  gate = 1 / (1 + np.exp(-p["blocks_0"]["attn"]["gating_param"]))
  np.testing.assert_allclose(got[0]["gate"], gate, rtol=1e-6)
  assert set(got[1]) == {"nonlocality"}  # MHSA: no gate, no centre


def test_faithful_mode_feeds_patch_embeddings_to_every_layer(convit):
  model, params, images = convit
  grid = TokenGrid(4, 4)
  fn = jax.jit(lambda p, x: locality.layer_statistics(model, p, x, mode="faithful"))
  got = jax.device_get(fn(params, images))
  p = f64(params)
  tokens = patch_embed(np.asarray(images, np.float64), p["patch_embed"]["proj"], 2)
  attn0 = gpsa_attention(tokens, p["blocks_0"]["attn"], grid)
  attn1 = mhsa_attention(tokens, p["blocks_1"]["attn"])  # no class token, no norm
  np.testing.assert_allclose(got[0]["nonlocality"], eq8(attn0, grid), rtol=2e-4)
  np.testing.assert_allclose(got[1]["nonlocality"], eq8(attn1, grid), rtol=2e-4)


def test_flat_metric_keys_and_values(convit):
  model, params, images = convit
  metrics = locality.make_locality_fn(model)(params, images)
  stats = jax.device_get(
    jax.jit(functools.partial(locality.layer_statistics, model))(params, images)
  )
  heads = range(4)
  expected = {
    "locality/nonlocality/layer_0",
    "locality/nonlocality/layer_1",
    "locality/gate/layer_0",
  }
  expected |= {"locality/center_distance/layer_0", "locality/span/layer_0"}
  for name, layer in [("nonlocality", 0), ("nonlocality", 1), ("gate", 0)]:
    expected |= {f"locality/{name}/layer_{layer}/head_{h}" for h in heads}
  for name in ("center_distance", "span", "center_dx", "center_dy"):
    expected |= {f"locality/{name}/layer_0/head_{h}" for h in heads}
  assert set(metrics) == expected
  assert all(isinstance(v, float) for v in metrics.values())
  np.testing.assert_allclose(metrics["locality/gate/layer_0/head_2"], stats[0]["gate"][2], 1e-6)
  np.testing.assert_allclose(
    metrics["locality/nonlocality/layer_1"], np.mean(stats[1]["nonlocality"]), rtol=1e-6
  )
  np.testing.assert_allclose(metrics["locality/center_dy/layer_0/head_3"], stats[0]["center"][3, 1])
  # One-off helper: same numbers.
  assert locality.locality_metrics(model, params, images) == pytest.approx(metrics, rel=1e-6)


def test_trainer_hook_on_a_sharded_mesh(initial):
  config, model, params = initial
  assert locality.make_locality_logger(config, model) is None  # analysis.locality is off
  config = tiny_convit_config()
  config.analysis.locality, config.analysis.locality_num_images = True, NUM_IMAGES
  mesh = sharding.make_mesh(config.mesh)  # the 8 fake devices
  with jax.set_mesh(mesh):
    logger = locality.make_locality_logger(config, model, mesh)
    got = logger(jax.device_put(params, sharding.replicated(mesh)))
  expected = locality.make_locality_fn(model)(params, locality.fixed_eval_images(config, 16))
  assert mesh.size == 8 and got == pytest.approx(expected, rel=1e-5)


def test_the_trainer_logs_locality_through_the_hook_it_is_given(tmp_path):
  config = tiny_convit_config()
  config.total_steps, config.mesh.num_devices = 1, 1
  config.analysis.locality, config.analysis.locality_num_images = True, NUM_IMAGES
  with pytest.raises(ValueError, match=r"locality=True, but train_and_evaluate got no make_locali"):
    train.train_and_evaluate(config, str(tmp_path / "without"))
  assert not os.path.exists(tmp_path / "without")  # refused before anything was written
  train.train_and_evaluate(config, str(tmp_path), **training_hooks())
  records = metrics_lib.read_metrics(str(tmp_path))
  logged = [r["step"] for r in records if "locality/gate/layer_0/head_0" in r]
  assert logged == [0, 1]  # at initialisation and at the (final) evaluation


def test_deit_has_nonlocality_only_and_drops_the_class_token():
  model = create_model("deit_tiny_patch2_32", num_classes=10, embed_dim=16, num_heads=2, depth=1)
  images = jax.random.normal(jax.random.key(0), (3, 8, 8, 1))
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(1), images)["params"])
  params = perturb(params, scale=0.5)
  metrics = locality.locality_metrics(model, params, images)
  assert set(metrics) == {"locality/nonlocality/layer_0"} | {
    f"locality/nonlocality/layer_0/head_{h}" for h in range(2)
  }
  # DeiT: class token at the input, pos_embed over 1 + 16 tokens.
  p, x = f64(params), np.asarray(images, np.float64)
  tokens = patch_embed(x, p["patch_embed"]["proj"], 2)
  cls = np.broadcast_to(p["cls_token"], (3, 1, 16))
  stream = np.concatenate([cls, tokens], axis=1) + p["pos_embed"][0]
  attn = mhsa_attention(layer_norm(stream, p["blocks_0"]["norm1"]), p["blocks_0"]["attn"])
  got = [metrics[f"locality/nonlocality/layer_0/head_{h}"] for h in range(2)]
  np.testing.assert_allclose(got, eq8(attn, TokenGrid(4, 4), prefix=1), rtol=2e-4)


def test_bad_mode_and_model():
  model = create_model("convit_tiny_patch2_32", num_classes=10)
  with pytest.raises(ValueError, match=r"mode='both' is not one of \('per_layer', 'faithful'\)"):
    locality.make_locality_fn(model, mode="both")
  with pytest.raises(ValueError, match=r"needs a VisionTransformer.*got GPSA"):
    locality.make_locality_fn(GPSA(num_heads=4))
  with pytest.raises(ValueError, match="num_images=0 must be >= 1"):
    locality.fixed_eval_images(tiny_config(), 0)


# ------------------------------------------------------------------------------------------------
# The analyze command on a tiny ConViT trained for a few steps


@pytest.fixture(scope="module")
def trained(initial, tmp_path_factory):
  """A tiny ConViT trained 6 steps by the trainer (checkpoints at 3 and 6), plus the locality
  records the trainer will log at each evaluation, here for the init and both checkpoints."""
  _, model, init_params = initial
  config = tiny_convit_config()
  config.checkpoint_every_steps = 3
  config.mesh.num_devices = 1
  config.analysis.locality_num_images = NUM_IMAGES
  workdir = str(tmp_path_factory.mktemp("convit_run"))
  train.train_and_evaluate(config, workdir)
  locality_fn = locality.make_locality_fn(model, config.analysis.locality_mode)
  images = locality.fixed_eval_images(config, NUM_IMAGES)
  writer = metrics_lib.MetricWriter(workdir)
  writer.write(0, locality_fn(init_params, images))
  for step in (3, 6):
    params, _ = analyze_lib.restore_params(config, workdir, model, (8, 8, 1), step)
    writer.write(step, locality_fn(params, images))
  writer.close()
  return config, workdir


def test_analyze_writes_the_figures(trained, tmp_path):
  config, workdir = trained
  paths = analyze_lib.analyze(config, workdir, str(tmp_path))
  names = ["training_curves.png", "nonlocality.png", "gates.png", "attention_maps.png"]
  names.append("attention_centers.png")  # GPSA's positional term as Cordonnier's Gaussians
  assert paths == [str(tmp_path / n) for n in names]
  for path in paths:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert mpimg.imread(path).shape[2] == 4
  # Default output directory.
  assert analyze_lib.analyze(config, workdir, layers=(1,))[-2] == os.path.join(
    workdir, "analysis", "attention_maps.png"
  )


def test_training_curves_draw_loss_and_accuracy_of_the_run(trained, tmp_path):
  _, workdir = trained
  records = metrics_lib.read_metrics(workdir)
  series = analyze_lib.training_series(records)
  assert set(series) == {"train/loss", "eval/loss", "eval/top1", "eval/top5"}
  eval_rows = [r for r in records if "eval/top1" in r]
  np.testing.assert_array_equal(series["eval/top1"][0], [r["step"] for r in eval_rows])
  np.testing.assert_array_equal(series["eval/top5"][1], [r["eval/top5"] for r in eval_rows])
  # With EMA records (as a run with config.ema.decay > 0 logs them), those are drawn too.
  rows = [{**r, "eval_ema/top1": r["eval/top1"] / 2} if "eval/top1" in r else r for r in records]
  fig = plots.training_curves_figure(analyze_lib.training_series(rows), title="run")
  loss_ax, accuracy_ax = fig.axes
  assert [line.get_label() for line in loss_ax.get_lines()] == ["eval/loss", "train/loss"]
  assert [line.get_label() for line in accuracy_ax.get_lines()] == [
    "eval/top1",
    "eval/top5",
    "eval_ema/top1",
  ]
  np.testing.assert_allclose(accuracy_ax.get_lines()[0].get_ydata(), 100 * series["eval/top1"][1])
  [path] = analyze_lib.training_curves(workdir, str(tmp_path))
  assert mpimg.imread(path).shape[2] == 4


def test_training_curves_of_one_logged_point_show_every_series():
  """Was: one point of eval/loss drew a dot a third the size of train/loss's, and top-5 at 0
  (or 100%) drew its dot over top-1's, which no longer showed."""
  one = lambda value: (np.array([1]), np.array([value]))
  series = {"train/loss": one(2.3), "eval/loss": one(2.2), "eval/top1": one(0.0)}
  fig = plots.training_curves_figure({**series, "eval/top5": one(0.0)})
  loss_ax, accuracy_ax = fig.axes
  markers = lambda ax: [(ln.get_marker(), ln.get_markersize()) for ln in ax.get_lines()]
  assert len(set(markers(loss_ax))) == 1 and markers(loss_ax)[0][0] == "o"
  top1, top5 = accuracy_ax.get_lines()
  assert (top1.get_marker(), top5.get_marker(), top5.get_markerfacecolor()) == ("o", "o", "none")
  assert top5.get_markersize() > top1.get_markersize()  # a ring around top-1's dot


def test_curves_are_the_logged_records(trained):
  _, workdir = trained
  records = metrics_lib.read_metrics(workdir)
  steps, series = analyze_lib.locality_series(records)
  np.testing.assert_array_equal(steps, [0, 3, 6])
  assert set(series) == {"nonlocality", "gate", "center_distance", "span", "center_dx", "center_dy"}
  assert series["nonlocality"][1].shape == (3, 4) and set(series["gate"]) == {0}
  by_step = {r["step"]: r for r in records}
  for t, step in enumerate(steps):
    for h in range(4):
      key = f"locality/gate/layer_0/head_{h}"
      assert series["gate"][0][t, h] == by_step[int(step)][key]
  assert analyze_lib.epochs_per_step(records) == pytest.approx(1 / DIGITS_STEPS_PER_EPOCH)


def test_attention_maps_show_each_heads_gate(trained):
  config, workdir = trained
  model = build_model(config, 10)
  image = locality.fixed_eval_images(config, 1)[0]
  restored, step = analyze_lib.restore_params(config, workdir, model, image.shape)
  assert step == 6  # the latest
  maps, gates = analyze_lib.query_maps(model, restored, image, (0, 1), (1, 2))
  np.testing.assert_allclose([m.sum((1, 2)) for m in maps.values()], np.ones((2, 4)), rtol=1e-5)
  _, inter = locvit_intermediates(model, restored, image[None])
  row = np.asarray(inter["blocks_1/attn/attention"][0, :, 1 + 6, 1:])  # query (1, 2) = patch 6
  np.testing.assert_allclose(maps[1], (row / row.sum(-1, keepdims=True)).reshape(4, 4, 4), 1e-5)
  fig = plots.attention_maps_figure(
    image, TokenGrid(4, 4), (1, 2), maps, gates, patch_size=model.patch_size
  )
  axes = fig.axes
  expected_gates = 1 / (1 + np.exp(-np.asarray(restored["blocks_0"]["attn"]["gating_param"])))
  assert [ax.get_title() for ax in axes[1:5]] == [
    f"head {h}  g={expected_gates[h]:.2f}" for h in range(4)
  ]
  assert [ax.get_title() for ax in axes[6:10]] == [f"head {h}" for h in range(4)]
  assert gates[1] is None


def _no_evaluation_line(workdir):
  return (
    f"No evaluation in {workdir} yet: the figures show no accuracy, nor locality after "
    f"initialisation. `--mode=eval --workdir={workdir}` evaluates the latest checkpoint."
  )


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_analyze_without_locality_records_draws_the_maps_only(trained, tmp_path, caplog):
  config, workdir = trained
  bare = tmp_path / "bare"
  shutil.copytree(os.path.join(workdir, "checkpoints"), bare / "checkpoints")
  paths = analyze_lib.analyze(config, str(bare), str(tmp_path / "out"), query=(0, 0))
  assert paths == [
    str(tmp_path / "out" / n) for n in ("attention_maps.png", "attention_centers.png")
  ]
  assert _warnings(caplog)[0] == _no_evaluation_line(bare)  # then the locality records' warning


@pytest.fixture
def unevaluated(trained, tmp_path):
  """The trained run as a run stopped before its first evaluation: its checkpoints, the step-0
  locality record and one training row."""
  config, workdir = trained
  run = tmp_path / "unevaluated"
  shutil.copytree(os.path.join(workdir, "checkpoints"), run / "checkpoints")
  [init] = [r for r in metrics_lib.read_metrics(workdir) if r["step"] == 0]
  writer = metrics_lib.MetricWriter(run)
  writer.write(0, {k: v for k, v in init.items() if k != "step"})
  writer.write(3, {"train/loss": 2.25})
  writer.close()
  return config, str(run)


def _drawn(monkeypatch) -> dict:
  """``{file name: Figure}`` of the figures ``plots.save`` writes from now on."""
  figures, save = {}, plots.save

  def keep(fig, path, **kwargs):
    figures[os.path.basename(path)] = fig
    return save(fig, path, **kwargs)

  monkeypatch.setattr(plots, "save", keep)
  return figures


def test_analyze_before_the_first_evaluation_draws_each_point_and_says_so(
  unevaluated, tmp_path, monkeypatch, caplog
):
  config, run = unevaluated
  figures = _drawn(monkeypatch)
  analyze_lib.analyze(config, run, str(tmp_path / "out"))
  assert _warnings(caplog) == [_no_evaluation_line(run)]
  loss_ax, accuracy_ax = figures["training_curves.png"].axes
  [train_loss] = loss_ax.get_lines()
  assert list(train_loss.get_xdata()) == [3] and train_loss.get_marker() == "o"
  assert accuracy_ax.get_ylabel() == "accuracy (%)" and accuracy_ax.get_ylim() == (0, 100)
  assert [t.get_text() for t in accuracy_ax.texts] == ["no evaluation yet\n(--mode=eval adds one)"]
  note = "the initialisation only: no evaluation yet in training"
  gates = figures["gates.png"]
  assert gates.get_suptitle() == f"{analyze_lib.model_label(config)}\n{note}"  # model, note
  for line in gates.axes[0].get_lines():  # 4 heads and their mean, one point each
    assert list(line.get_xdata()) == [0] and line.get_marker() == "."
  [nonlocality_ax] = figures["nonlocality.png"].axes
  assert [t.get_text() for t in nonlocality_ax.texts] == [note]
  assert all(line.get_marker() == "." for line in nonlocality_ax.get_lines())


def test_mode_eval_results_reach_the_curves_and_leave_metrics_jsonl_alone(
  unevaluated, tmp_path, monkeypatch
):
  config, run = unevaluated
  before = (tmp_path / "unevaluated" / "metrics.jsonl").read_text()
  result = evaluation.evaluate_checkpoint(config, run)
  metrics_lib.append_evaluation(run, {**result, "eval_split": "test"})  # as --mode=eval does
  assert metrics_lib.read_evaluations(run) == [{**result, "eval_split": "test"}]
  assert analyze_lib.evaluated(run)
  figures = _drawn(monkeypatch)
  analyze_lib.training_curves(run, str(tmp_path / "out"))
  loss_ax, accuracy_ax = figures["training_curves.png"].axes
  assert [line.get_label() for line in loss_ax.get_lines()] == [
    "eval/loss (--mode=eval on test)",
    "train/loss",
  ]
  top1, top5 = accuracy_ax.get_lines()
  assert top1.get_label() == "eval/top1 (--mode=eval on test)" and top1.get_marker() == "x"
  assert list(top1.get_xdata()) == [6] and list(top1.get_ydata()) == [100 * result["eval/top1"]]
  assert list(top5.get_ydata()) == [100 * result["eval/top5"]] and not accuracy_ax.texts
  assert (tmp_path / "unevaluated" / "metrics.jsonl").read_text() == before


def test_analyze_rejects_bad_layers_and_queries(trained, tmp_path):
  config, workdir = trained
  with pytest.raises(ValueError, match=r"layers=\[5\]: choose layer indices in \[0, 1\]"):
    analyze_lib.analyze(config, workdir, str(tmp_path), layers=(5,))
  with pytest.raises(ValueError, match=r"query=\(4, 0\) must be a \(row, col\) patch of the 4x4"):
    analyze_lib.analyze(config, workdir, str(tmp_path), query=(4, 0))
  # From the command line (--config.analysis.*): the error names the field and its range.
  fields = config.copy_and_resolve_references()
  fields.analysis.map_layers = (5,)
  with pytest.raises(ValueError, match=r"^analysis\.map_layers=\[5\]: choose layer indices in"):
    analyze_lib.analyze(fields, workdir, str(tmp_path))
  fields.analysis.map_layers, fields.analysis.query = None, (0, 4)
  with pytest.raises(ValueError) as query:
    analyze_lib.analyze(fields, workdir, str(tmp_path))
  assert str(query.value) == (
    "analysis.query=(0, 4) must be a (row, col) patch of the 4x4 grid: rows in [0, 3], "
    "columns in [0, 3]."
  )
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError) as no_run:  # an empty or mistyped workdir
    analyze_lib.analyze(config, str(empty))
  assert str(no_run.value) == (
    f"{empty} holds no run: no metrics.jsonl, no checkpoints/ (--mode=analyze draws the "
    "figures of a training run's --workdir)"
  )
  assert os.listdir(empty) == []  # was: a warning about locality records, then an error
  (empty / "metrics.jsonl").write_text("")
  with pytest.raises(FileNotFoundError, match="No checkpoint found"):
    analyze_lib.analyze(config, str(empty), str(tmp_path))


def test_eval_refuses_another_models_checkpoint_before_the_model_warns(trained):
  """A 3-head GPSA warns when it is traced (3 is not a square): the refusal comes first, alone."""
  config, workdir = trained
  other = config.copy_and_resolve_references()
  other.model.name, other.model.overrides.num_heads = "deit_tiny_patch2_32", 3
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pytest.raises(ValueError, match="written by an incompatible config"):
      evaluation.evaluate_checkpoint(other, workdir)
  assert [str(w.message) for w in caught] == []


def test_the_init_record_has_the_initial_gates(trained):
  _, workdir = trained
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  (init,) = [r for r in records if r["step"] == 0]
  gates = [init[f"locality/gate/layer_0/head_{h}"] for h in range(4)]
  np.testing.assert_allclose(gates, np.full(4, 1 / (1 + math.exp(-1))), rtol=1e-6)
  assert init["locality/span/layer_0/head_0"] == pytest.approx(1.0)  # alpha = 1


def test_gpsa_heads_are_gaussians_at_the_local_init_offsets(tmp_path):
  from locvit.analysis import centers
  from locvit.models import create_model
  from locvit.models.convit import convit_overrides

  model = create_model(
    "convit_tiny_patch4_32", num_classes=10, num_heads=9, embed_dim=144, **convit_overrides(2, 3)
  )
  params = jax.tree.map(
    np.asarray,
    nn.meta.unbox(model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))["params"]),
  )
  heads = centers.gpsa_heads(params)
  assert sorted(heads) == ["blocks_0/attn", "blocks_1/attn"]
  rows_cols, inv = heads["blocks_0/attn"]
  # Local init (ConViT Eq. 5): the 9 heads sit on the 3x3 kernel offsets, alpha = 1 -> 2 I.
  assert sorted(map(tuple, np.round(rows_cols).astype(int))) == [
    (r, c) for r in (-1, 0, 1) for c in (-1, 0, 1)
  ]
  np.testing.assert_allclose(inv, np.broadcast_to(2 * np.eye(2), (9, 2, 2)), rtol=1e-5)
  # The positional logits are that Gaussian: -alpha ||delta - Delta||^2 + const, per head.
  w = params["blocks_0"]["attn"]["pos_proj"]["kernel"][:, :, None, None]
  dy, dx = np.mgrid[-2:3, -2:3]
  logits = w[0] * dx + w[1] * dy + w[2] * (dx**2 + dy**2)
  alpha = inv[:, 0, 0, None, None] / 2
  row, col = rows_cols[:, 0, None, None], rows_cols[:, 1, None, None]
  diff = logits + alpha * ((dy - row) ** 2 + (dx - col) ** 2)
  np.testing.assert_allclose(diff - diff[:, :1, :1], 0, atol=1e-4)
  path = centers.plot_attention_centers(params, tmp_path / "gpsa.png")
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_one_collector_gives_every_layers_attention_in_layer_order():
  """``collect_attention_maps`` orders ``blocks_10`` after ``blocks_9`` (not after ``blocks_1``),
  and ``block_attention_maps`` keys them by block index; both hold the sown probabilities."""
  from locvit.models import (
    apply_with_intermediates,
    block_attention_maps,
    collect_attention_maps,
    create_model,
  )

  model = create_model("deit_tiny_patch4_32", num_classes=3, embed_dim=8, num_heads=2, depth=11)
  images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
  variables = model.init(jax.random.key(1), images)
  _, inter = apply_with_intermediates(model, variables, images)
  maps = collect_attention_maps(inter)
  assert list(maps) == [f"blocks_{i}/attn" for i in range(11)]
  blocks = block_attention_maps(inter)
  assert list(blocks) == list(range(11))
  for i, probs in blocks.items():
    assert probs.shape == (2, 2, 5, 5)  # 4 patches + the class token
    assert probs is inter[f"blocks_{i}/attn/attention"]
