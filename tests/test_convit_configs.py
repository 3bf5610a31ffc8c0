"""The ConViT paper configs: recipe values, table rows, ablation switches and fast failure without
data. About 10-15 s on the shared 2 cores (12 abstract ImageNet models, one CLI subprocess)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import (
  convit_cifar10_small,
  convit_cifar100,
  convit_fig8,
  convit_s,
  convit_table1,
  convit_table2,
  convit_table3,
)
from locvit import optim
from locvit.attention import GPSA
from locvit.data import validate_data_config
from locvit.models.factory import build_model
from locvit.run.bundle import training_length

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGENET = 1_281_167


def _is_boxed(x):
  return hasattr(x, "unbox")


def unboxed(tree):
  return jax.tree.map(lambda a: a.unbox() if _is_boxed(a) else a, tree, is_leaf=_is_boxed)


def param_paths(config, num_classes=1000):
  model = build_model(config, num_classes)
  size = config.data.image_size
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  return model, unboxed(shapes["params"])


def count(params):
  return sum(math.prod(a.shape) for a in jax.tree.leaves(params))


def schedule_values(config, steps_per_epoch=IMAGENET // 1024):
  total, spe = training_length(config, steps_per_epoch * config.batch_size)
  schedule = optim.make_schedule(config, total, spe)
  warmup = round(config.schedule.warmup_epochs * spe)
  return float(schedule(0)), float(schedule(warmup)), float(schedule(total)), total


# ------------------------------------------------------------------------------------------------
# ConViT-S on ImageNet


def test_convit_s_is_the_deit_recipe_on_imagenet():
  c = convit_s.get_config()
  assert c.model.name == "convit_small" and c.model.overrides.drop_path_rate == 0.1
  d = c.data
  assert (d.source, d.name, d.train_split, d.eval_split) == (
    "tfds",
    "imagenet2012",
    "train",
    "validation",
  )
  assert (d.image_size, d.train_augment, d.interpolation, d.eval_crop_pct) == (
    224,
    "rrc_flip",
    "bicubic",
    0.875,
  )
  validate_data_config(d)
  o = c.optimizer
  assert (o.name, o.lr, o.lr_base_batch_size, o.eps, o.weight_decay, o.decay_mask) == (
    "adamw",
    5e-4,
    512,
    1e-8,
    0.05,
    "official_convit",
  )
  assert (c.batch_size, c.num_epochs, c.label_smoothing) == (1024, 300, 0.1)
  assert optim.peak_learning_rate(c) == pytest.approx(1e-3)
  first, peak, last, total = schedule_values(c)
  # timm's cosine counts from epoch 0: epoch 5, the warmup's end, is already past the peak.
  timm_epoch5 = 1e-5 + (1e-3 - 1e-5) * (1 + np.cos(np.pi * 5 / 300)) / 2
  assert (first, peak) == (pytest.approx(1e-6, rel=1e-4), pytest.approx(timm_epoch5))  # float32
  assert last == pytest.approx(1e-5, rel=1e-3)
  assert total == 300 * (IMAGENET // 1024)
  assert c.eval_every_steps == IMAGENET // 1024
  assert c.analysis.locality and c.analysis.locality_mode == "faithful"


def test_convit_s_without_prepared_imagenet_fails_fast_with_instructions(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TFDS_DATA_DIR=str(tmp_path / "tfds"))
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  start = time.monotonic()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "locvit.main",
      "--config=configs/convit_s.py",
      f"--workdir={tmp_path / 'work'}",
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )
  elapsed = time.monotonic() - start
  out = proc.stdout + proc.stderr
  assert proc.returncode != 0, out
  assert elapsed < 20, elapsed
  assert "TFDS dataset 'imagenet2012' is not prepared" in out, out
  assert f"tfds build imagenet2012 --data_dir={tmp_path / 'tfds'} --file_format=array_record" in out


# ------------------------------------------------------------------------------------------------
# Table 1


def test_table1_rows_models_sizes_and_recipes():
  assert len(convit_table1.ROWS) == 12
  for name, (_, size_m) in convit_table1.ROWS.items():
    c = convit_table1.get_config(name)
    assert c.model.name == name and c.data.name == "imagenet2012"
    _, params = param_paths(c)
    # Table 1 rounds loosely (27.8M is listed as 27M, 153.1M as 152M).
    assert abs(count(params) / 1e6 - size_m) < 1.2, (name, count(params))
    plus = name.endswith("_plus")
    assert (c.batch_size, c.optimizer.lr) == ((512, 4e-4) if plus else (1024, 5e-4))
    assert optim.peak_learning_rate(c) == pytest.approx(4e-4 if plus else 1e-3)
    expected_mask = (
      "intended" if name in ("deit_tiny", "deit_small", "deit_base") else "official_convit"
    )
    assert c.optimizer.decay_mask == expected_mask
  assert convit_table1.get_config().model.name == "convit_small"
  unknown_row = r"unknown Table 1 row 'convit_huge' for convit_table1.py; did you mean .*base"
  with pytest.raises(ValueError, match=unknown_row):
    convit_table1.get_config("convit_huge")


# ------------------------------------------------------------------------------------------------
# Table 2


@pytest.mark.parametrize("percent", convit_table2.PERCENTS)
def test_table2_fractions_scale_the_epochs(percent):
  for family, model in convit_table2.MODELS.items():
    c = convit_table2.get_config(f"{family}_{percent}")
    assert c.model.name == model and c.data.train_fraction == percent / 100
    assert c.optimizer.decay_mask == "official_convit"
    subset = sum(max(1, int(n * percent / 100)) for n in [1281] * 1000)
    total, _ = training_length(c, subset)
    assert total == math.ceil(300 / (percent / 100) * (subset // 1024))
    assert c.eval_every_steps == IMAGENET // 1024  # every ~1.28M images
  assert convit_table2.PAPER[("convit", 10)] == (59.6, 80.3)
  with pytest.raises(ValueError, match=r"unknown Table 2 run 'convit_20'"):
    convit_table2.get_config("convit_20")


# ------------------------------------------------------------------------------------------------
# Table 3 and Fig. 8


@pytest.fixture
def imagenet100_root(monkeypatch, tmp_path):
  monkeypatch.setenv("IMAGENET_ROOT", str(tmp_path))
  return str(tmp_path)


def test_table3_rows(imagenet100_root):
  for row, (model_name, frozen_gate, conv_init, frozen_attention, _) in convit_table3.ROWS.items():
    c = convit_table3.get_config(row)
    assert (c.model.name, c.batch_size, c.optimizer.lr) == (model_name, 512, 4e-4)
    d = c.data
    assert (d.source, d.root, d.num_classes, d.class_limit, d.eval_split) == (
      "image_folder",
      imagenet100_root,
      100,
      100,
      "val",
    )
    validate_data_config(d)
    model, params = param_paths(c, 100)
    paths = optim._paths(params)
    labels = optim._paths(optim.freeze_labels(params, tuple(c.freeze))) if c.freeze else {}
    frozen = {"/".join(k) for k, v in labels.items() if v == "frozen"}
    if model_name.startswith("deit"):
      assert not c.freeze and "attention_kwargs" not in c.model.overrides
      continue
    gpsa = model.attention_kwargs["gpsa"]
    assert gpsa["use_local_init"] is conv_init
    if frozen_gate:  # lambda = 0 at init: sigmoid = 1/2, then frozen
      layer = GPSA(num_heads=4, **gpsa)
      init = jax.jit(lambda key, layer=layer: layer.init(key, jnp.zeros((1, 16, 32))))
      np.testing.assert_array_equal(unboxed(init(jax.random.key(0)))["params"]["gating_param"], 0)
    expected = set()
    for k in paths:
      path = "/".join(k)
      layer = int(k[0].split("_")[1]) if k[0].startswith("blocks_") else None
      if frozen_gate and k[-1] == "gating_param":
        expected.add(path)
      if frozen_attention and layer is not None and layer < 10 and k[1] == "attn":
        expected.add(path)
    assert frozen == expected
    if frozen_attention:  # q, k, v, proj (kernel, bias), pos_proj (kernel, bias), gate x 10
      assert len(frozen) == 10 * 7 and not any(p.startswith("blocks_10") for p in frozen)


def test_fig8_arguments(imagenet100_root):
  c = convit_fig8.get_config("gpsa=6,alpha=2.5")
  # Fields by position as well as by name; an empty one keeps its default.
  assert convit_fig8.get_config("6,2.5") == c
  assert convit_fig8.get_config(",2.5") == convit_fig8.get_config("gpsa=10,alpha=2.5")
  model, _ = param_paths(c, 100)
  assert tuple(model.layer_attention) == ("gpsa",) * 6 + ("mhsa",) * 6
  assert model.class_token_layer == 6 and model.embed_dim == 576
  assert model.attention_kwargs["gpsa"]["locality_strength"] == 2.5
  default = build_model(convit_fig8.get_config(), 100)
  assert (
    default.class_token_layer == 10 and default.attention_kwargs["gpsa"]["locality_strength"] == 1
  )
  assert build_model(convit_fig8.get_config("gpsa=0"), 100).layer_attention == ("mhsa",) * 12
  for bad, message in [
    ("layers=3", "unknown field 'layers' in 'layers=3' for convit_fig8.py; fields: gpsa, alpha"),
    ("gpsa=x", "gpsa='x' for convit_fig8.py is not an int"),
    ("gpsa=6,gpsa=7", "field 'gpsa' given twice"),
    ("6,2.0,3", r"convit_fig8.py takes at most 2 comma-separated fields \(gpsa,alpha\)"),
    ("gpsa=13", r"gpsa=13 for convit_fig8.py must be in \[0, 12\]"),
    ("alpha=-1", "alpha=-1.0 for convit_fig8.py must be >= 0"),
  ]:
    with pytest.raises(ValueError, match=message):
      convit_fig8.get_config(bad)


# ------------------------------------------------------------------------------------------------
# Appendix C and the reduced CIFAR-10 experiment


def test_cifar100_appendix_c():
  c = convit_cifar100.get_config("deit_small_plus")
  assert c.model.name == "deit_small_plus"
  assert (c.data.source, c.data.name, c.data.image_size, c.data.eval_split) == (
    "tfds",
    "cifar100",
    224,
    "test",
  )
  assert (c.num_epochs, c.batch_size, c.optimizer.lr, c.eval_every_steps) == (3000, 512, 4e-4, 97)
  assert convit_cifar100.get_config().model.name == "convit_tiny_plus"
  with pytest.raises(ValueError, match="unknown appendix C model 'convit_small'"):
    convit_cifar100.get_config("convit_small")


def test_cifar10_small_trains_both_models_identically(monkeypatch, tmp_path):
  monkeypatch.setenv("CIFAR10_ROOT", str(tmp_path))
  convit, deit = (convit_cifar10_small.get_config(a) for a in ("convit", "deit"))
  a, b = convit.to_dict(), deit.to_dict()
  assert {k: v for k, v in a.items() if k != "model"} == {
    k: v for k, v in b.items() if k != "model"
  }
  assert convit.data.root == str(tmp_path) and convit.data.train_fraction == 0.1
  cm, cp = param_paths(convit, 10)
  dm, dp = param_paths(deit, 10)
  for field in ("embed_dim", "num_heads", "depth", "patch_size", "mlp_ratio"):
    assert getattr(cm, field) == getattr(dm, field), field
  assert (cm.embed_dim, cm.num_heads, cm.depth, cm.patch_size) == (192, 4, 6, 4)
  assert tuple(cm.layer_attention) == ("gpsa",) * 4 + ("mhsa",) * 2 and cm.class_token_layer == 4
  assert abs(count(cp) / count(dp) - 1) < 0.01
  assert convit.total_steps == convit_cifar10_small.TOTAL_STEPS
  assert convit.eval_every_steps == convit.total_steps // 2


def test_cifar10_small_needs_a_root(monkeypatch):
  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  c = convit_cifar10_small.get_config("deit")
  with pytest.raises(ValueError) as error:
    validate_data_config(c.data)
  assert str(error.value) == (
    "data.root=None must be set when source='image_folder': give --data=image_folder:DIR or "
    "export CIFAR10_ROOT=DIR; `python -m locvit.data.prepare cifar10 --out=DIR` writes DIR"
  )
  with pytest.raises(ValueError) as error:
    convit_cifar10_small.get_config("convitt")
  assert str(error.value) == (
    "unknown model 'convitt' for convit_cifar10_small.py; did you mean convit? "
    "choices: convit, deit"
  )


def test_configs_are_lockable_and_overridable():
  c = convit_s.get_config()
  c.lock()  # as the CLI does: known fields stay overridable, typos are errors
  c.analysis.locality_mode = "per_layer"
  with pytest.raises(AttributeError):
    c.analysis.no_such_field = 1
  np.testing.assert_array_equal(c.data.mean, (0.485, 0.456, 0.406))
