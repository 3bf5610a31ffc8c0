"""Training recipes end to end: presets, on-device augmentation + EMA with exact resume,
hard distillation from a checkpointed teacher, and starting from (pruned) checkpoints."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import recipes
from configs.common import base_config
from locvit import distill, train
from locvit.analysis.hooks import training_hooks
from locvit.configs import defaults
from locvit.convert import load_pretrained
from locvit.convert.checkpoint import export_run
from locvit.data import validate_data_config
from locvit.metrics import read_metrics
from locvit.models import create_model, surgery
from locvit.models.factory import build_model
from locvit.platform import sharding
from locvit.run import evaluation
from locvit.run.checks import check_recipe
from locvit.run.step import ema_update, loss_and_metrics
from locvit.workdir import restore
from tests.train_utils import sigterm_after_step, tiny_config

IMAGE_SHAPE = (8, 8, 1)


def recipe_config(**top_level):
  """The tiny digits run with DeiT's augmentation on the device (random-resized crop, flip and
  RandAugment), Mixup/CutMix, random erasing and a weight EMA on one device."""
  c = tiny_config(**top_level)
  c.data.train_augment, c.data.augment_on = "rrc_flip", "device"
  c.data.auto_augment = "rand-m9-mstd0.5-inc1"
  c.mesh.num_devices, c.mesh.shape = 1, (1, 1)
  c.label_smoothing = 0.1
  c.mixup.mixup_alpha, c.mixup.cutmix_alpha, c.mixup.prob = 0.8, 1.0, 1.0
  c.random_erasing.prob = 0.25
  c.ema.decay = 0.5
  return c


def losses(workdir):
  return [r["train/loss"] for r in read_metrics(workdir) if "train/loss" in r]


# ----------------------------------------------------------------------------- presets


def test_presets_hold_the_papers_hyperparameters():
  deit = recipes.apply(base_config(), "deit")
  assert (deit.optimizer.lr, deit.optimizer.lr_base_batch_size, deit.optimizer.weight_decay) == (
    5e-4,
    512,
    0.05,
  )
  assert (deit.schedule.warmup_epochs, deit.schedule.min_lr, deit.label_smoothing) == (5, 1e-5, 0.1)
  assert deit.data.auto_augment == "rand-m9-mstd0.5-inc1" and deit.data.repeated_augmentations == 3
  assert (deit.mixup.mixup_alpha, deit.mixup.cutmix_alpha, deit.random_erasing.prob) == (
    0.8,
    1.0,
    0.25,
  )
  assert deit.model.overrides.drop_path_rate == 0.1 and deit.recipe == "deit"
  small = recipes.apply(base_config(), "cifar_small")
  assert (small.optimizer.lr, small.optimizer.weight_decay, small.optimizer.eps) == (
    1e-3,
    0.01,
    1e-3,
  )
  assert small.grad_clip_norm == 3.0 and small.data.auto_augment == "rand-m9-mstd0.5-inc1"
  assert small.mixup.mixup_alpha == small.mixup.cutmix_alpha == small.random_erasing.prob == 0
  vit = recipes.apply(base_config(), "small_vit")
  assert vit.data.auto_augment == "autoaug-cifar10" and vit.optimizer.weight_decay == 0.05
  assert (vit.mixup.mixup_alpha, vit.mixup.cutmix_alpha, vit.mixup.prob) == (1.0, 1.0, 0.5)
  assert vit.random_erasing.prob == 0.25 and vit.model.overrides.drop_path_rate == 0.1
  # The official sampler makes each "epoch" 3 fresh passes (no copies in one batch).
  assert (vit.num_epochs, vit.schedule.warmup_epochs, vit.data.repeated_augmentations) == (
    300,
    30,
    1,
  )
  sgd = recipes.apply(base_config(), "sgd_cifar")
  assert (sgd.optimizer.name, sgd.optimizer.lr, sgd.optimizer.momentum) == ("sgd", 0.1, 0.9)
  assert sgd.optimizer.weight_decay == 1e-4 and sgd.data.train_augment == "crop_flip"
  for c in (deit, small, vit, sgd):
    validate_data_config(c.data)
    check_recipe(c, 10)


def test_unknown_preset_lists_valid_ones():
  with pytest.raises(ValueError, match=r"Unknown recipe 'mae'. Valid recipes: \['cifar_small'"):
    recipes.apply(base_config(), "mae")


def test_paper_configs_use_their_presets():
  from configs import convit_s, cordonnier_cifar10, gmm_table1, structinit_table1

  assert convit_s.get_config().recipe == "deit"
  assert cordonnier_cifar10.get_config("quadratic").recipe == "sgd_cifar"
  assert structinit_table1.get_config().recipe == "cifar_small"
  gmm = gmm_table1.get_config()
  assert gmm.recipe == "small_vit"


# ----------------------------------------------------------------------------- EMA + resume


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("recipe")
  config = recipe_config(checkpoint_every_steps=1, keep_checkpoints=10)
  return str(workdir), config, train.train_and_evaluate(config, str(workdir))


def test_recipe_run_evaluates_model_and_ema(recipe_run):
  workdir, config, final = recipe_run
  assert {"eval/top1", "eval_ema/top1", "eval_ema/loss"} <= set(final)
  assert np.all(np.isfinite(losses(workdir)))
  # ema_t = d ema_{t-1} + (1 - d) params_t, with the EMA starting at the initial parameters.
  model = build_model(config, 10)
  boxed = sharding.model_variable_shapes(model, IMAGE_SHAPE)[0]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  shardings = jax.tree.map(lambda _: device, nn.meta.unbox(boxed))
  ema = {s: restore.restore_ema_params(workdir, s, shardings, boxed) for s in (2, 3)}
  params3, _, _ = restore.restore_model_variables(workdir, model, IMAGE_SHAPE, step=3)
  jax.tree.map(
    lambda e3, e2, p3: np.testing.assert_allclose(e3, 0.5 * e2 + 0.5 * p3, rtol=1e-5, atol=1e-7),
    ema[3],
    ema[2],
    params3,
  )
  # Eval-only mode restores the EMA too and reproduces the final numbers.
  again = evaluation.evaluate_checkpoint(config, workdir)
  assert again["eval_ema/top1"] == final["eval_ema/top1"]
  assert again["eval/loss"] == final["eval/loss"]


def test_recipe_run_resumes_bitwise(tmp_path, recipe_run):
  """The device random-resized crop, flip and RandAugment, Mixup/CutMix and erasing keys and the
  EMA survive SIGTERM + resume exactly."""
  full_dir, _, full = recipe_run
  config = recipe_config()
  workdir = str(tmp_path)
  with sigterm_after_step(2):
    assert train.train_and_evaluate(config, workdir)["preempted"]
  second = train.train_and_evaluate(config, workdir)
  assert losses(workdir) == losses(full_dir)
  assert second["eval_ema/loss"] == full["eval_ema/loss"]


def test_turning_ema_on_for_an_existing_run_is_refused(tmp_path):
  workdir = str(tmp_path)
  plain = tiny_config()
  plain.mesh.num_devices, plain.mesh.shape = 1, (1, 1)
  plain.total_steps = 2
  train.train_and_evaluate(plain, workdir)
  plain.ema.decay = 0.9
  plain.total_steps = 4
  with pytest.raises(ValueError, match=r"ema.enabled: checkpoint has False, config has True"):
    train.train_and_evaluate(plain, workdir)


def test_bad_recipe_values_fail_before_training(tmp_path):
  for field, value, match in [
    ("ema", {"decay": 1.0, "warmup": False}, r"ema.decay=1.0 must be in \[0, 1\)"),
    ("mixup", {"mode": "half"}, r"mixup.mode='half' is not one of"),
    ("distillation", {"type": "feature"}, r"distillation.type='feature' is not one of"),
    ("distillation", {"type": "hard"}, r"needs distillation.teacher_workdir"),
  ]:
    c = tiny_config()
    c[field].update(value)
    with pytest.raises(ValueError, match=match):
      train.train_and_evaluate(c, str(tmp_path / field))


# ----------------------------------------------------------------------------- distillation


def test_distillation_losses_match_their_formulas():
  rng = np.random.default_rng(0)
  s, d, t = (rng.normal(size=(4, 6)).astype(np.float32) for _ in range(3))
  targets = jax.nn.softmax(rng.normal(size=(4, 6)).astype(np.float32))
  cfg = defaults.distillation_config()
  cfg.type = "hard"
  base = -np.mean(np.sum(targets * jax.nn.log_softmax(s), -1))
  hard = -np.mean(jax.nn.log_softmax(d)[np.arange(4), t.argmax(-1)])
  np.testing.assert_allclose(
    distill.distillation_loss(s, d, targets, t, cfg), 0.5 * base + 0.5 * hard, rtol=1e-5
  )
  cfg.type, cfg.tau, cfg.alpha = "soft", 3.0, 0.3
  pt, ps = jax.nn.softmax(t / 3.0), jax.nn.log_softmax(d / 3.0)
  kl = np.sum(pt * (np.log(pt) - ps)) * 9.0 / d.size  # DeiT: reduction='sum' / numel
  np.testing.assert_allclose(
    distill.distillation_loss(s, d, targets, t, cfg), 0.7 * base + 0.3 * kl, rtol=1e-5
  )


def test_distilled_student_averages_the_two_heads_at_eval():
  model = create_model("deit_tiny_patch4_32", num_classes=10, depth=1, embed_dim=32, num_heads=2)
  model = model.clone(distilled=True)
  x = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  variables = model.init(jax.random.key(1), x)
  assert variables["params"]["pos_embed"].value.shape == (1, 64 + 2, 32)
  cls_logits, dist_logits = model.clone(distilled_training=True).apply(
    variables, x, train=True, rngs={"dropout": jax.random.key(2)}
  )
  # DeiT's code and timm average the logits (the default); the paper's text, the softmaxes.
  np.testing.assert_allclose(
    model.apply(variables, x), (cls_logits + dist_logits) / 2, rtol=1e-5, atol=1e-6
  )
  out = model.clone(distilled_inference="softmax").apply(variables, x)
  average = (jax.nn.softmax(cls_logits) + jax.nn.softmax(dist_logits)) / 2
  np.testing.assert_allclose(jnp.exp(out), average, rtol=1e-5, atol=1e-7)


def test_a_distilled_model_without_a_teacher_trains_on_the_averaged_heads():
  """Fine-tuning a distilled DeiT without distillation, as timm does (distilled_training off):
  the training loss is the cross-entropy of the two heads' averaged logits, and both heads learn."""
  model = create_model(
    "deit_tiny_patch4_32", num_classes=10, depth=1, embed_dim=32, num_heads=2, distilled=True
  )
  x = jax.random.normal(jax.random.key(0), (2, 32, 32, 3))
  params = nn.meta.unbox(model.init(jax.random.key(1), x)["params"])
  labels, rng = jnp.array([3, 7]), jax.random.key(2)
  targets = jax.nn.one_hot(labels, 10)
  cls_logits, dist_logits = model.clone(distilled_training=True).apply(
    {"params": params}, x, train=True, rngs={"dropout": rng}
  )
  expected = jnp.mean(optax.softmax_cross_entropy((cls_logits + dist_logits) / 2, targets))
  loss, grads = jax.value_and_grad(
    lambda p: loss_and_metrics(p, model, x, targets, labels, rng)[0]
  )(params)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)
  assert (
    np.abs(grads["head"]["kernel"]).sum() > 0 and np.abs(grads["head_dist"]["kernel"]).sum() > 0
  )


def test_hard_distillation_from_a_checkpointed_teacher(tmp_path):
  teacher_dir = str(tmp_path / "teacher")
  teacher = tiny_config(total_steps=3)
  teacher.model.overrides.depth = 1  # a different model than the student
  teacher.mesh.num_devices, teacher.mesh.shape = 1, (1, 1)
  train.train_and_evaluate(teacher, teacher_dir)

  student = recipe_config(total_steps=3)
  student.distillation.type = "hard"
  student.distillation.teacher_workdir = teacher_dir
  final = train.train_and_evaluate(student, str(tmp_path / "student"))
  assert 0 <= final["eval/top1"] <= 1 and np.all(np.isfinite(losses(str(tmp_path / "student"))))
  model = build_model(student, 10)
  assert model.distilled
  params, _, _ = restore.restore_model_variables(str(tmp_path / "student"), model, IMAGE_SHAPE)
  assert {"dist_token", "head_dist"} <= set(params)
  # python -m locvit.convert --workdir: the student's weights, its distillation token included.
  _, metadata = export_run(str(tmp_path / "student"), tmp_path / "weights")
  assert metadata["overrides"]["distilled"] == "True"
  exported = load_pretrained(str(tmp_path / "weights"))
  assert exported.overrides["distilled"] and exported.create_model().distilled
  jax.tree.map(np.testing.assert_array_equal, exported.variables["params"], nn.meta.unbox(params))
  # The teacher is restored exactly as trained (its variables are inputs, never updated).
  loaded = distill.load_teacher(
    student,
    10,
    IMAGE_SHAPE,
    jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model")),
    (),
  )
  assert loaded.model.depth == 1 and loaded.step == 3


def test_distillation_bad_input(tmp_path):
  c = tiny_config()
  c.distillation.type = "hard"
  c.distillation.teacher_workdir = str(tmp_path / "nothing")
  with pytest.raises(FileNotFoundError, match="No checkpoint found in"):
    train.train_and_evaluate(c, str(tmp_path / "run"))
  c.model.name = "resnet18_cifar"
  c.model.overrides = {}
  with pytest.raises(ValueError, match="needs a student with a distillation token"):
    build_model(c, 10)
  c = tiny_config()
  c.model.overrides.distilled_training = True
  with pytest.raises(ValueError) as raised:
    build_model(c, 10)
  assert str(raised.value).startswith(
    "model.overrides.distilled_training=True returns both heads for the distillation loss, and "
    "distillation is off: give distillation.type='hard' or 'soft'"
  )


# ----------------------------------------------------------------------------- init_from


def test_start_from_a_checkpoint_and_from_pruned_heads(tmp_path, monkeypatch):
  def generalized(**top):
    c = tiny_config(**top)
    c.mesh.num_devices, c.mesh.shape = 1, (1, 1)
    c.model.name = "cordonnier_sa_generalized"
    c.model.overrides = {"hidden_dim": 16, "mlp_dim": 24, "depth": 2, "num_heads": 4}
    return c

  source_dir = str(tmp_path / "source")
  train.train_and_evaluate(generalized(total_steps=2), source_dir)
  source_model = build_model(generalized(), 10)
  source, _, _ = restore.restore_model_variables(source_dir, source_model, IMAGE_SHAPE)

  def frozen_start(**init_from):  # lr 0: the run's parameters are its starting point
    c = generalized(total_steps=1)
    c.optimizer.lr, c.schedule.name, c.schedule.warmup_steps = 0.0, "constant", 0
    c.init_from.workdir = source_dir
    c.init_from.update(init_from)
    return c

  plain = frozen_start()
  train.train_and_evaluate(plain, str(tmp_path / "plain"))
  started, _, _ = restore.restore_model_variables(
    str(tmp_path / "plain"), build_model(plain, 10), IMAGE_SHAPE
  )
  jax.tree.map(np.testing.assert_array_equal, started, source)

  # Pruning (appendix E): heads 1 and 3 of layer 0 are found degenerate.
  monkeypatch.setattr(
    surgery, "degenerate_heads", lambda params, thresholds: {"layers_0/attn": [1, 3]}
  )
  pruned_config = frozen_start(prune_degenerate_heads=True)
  train.train_and_evaluate(pruned_config, str(tmp_path / "pruned"))
  pruned_model = build_model(pruned_config, 10).clone(layer_heads=(2, 4))
  started, _, _ = restore.restore_model_variables(
    str(tmp_path / "pruned"), pruned_model, IMAGE_SHAPE
  )
  expected, _ = surgery.prune_heads(jax.device_get(source), {"layers_0/attn": [1, 3]})
  jax.tree.map(np.testing.assert_array_equal, started, expected)

  wrong = frozen_start(prune_degenerate_heads=True)
  wrong.model.overrides["layer_heads"] = (4, 4)
  with pytest.raises(ValueError, match=r"layer_heads=\(4, 4\) differs from the heads left"):
    train.train_and_evaluate(wrong, str(tmp_path / "wrong"))


def test_ema_update_rule():
  params, ema = {"w": jnp.ones(3)}, {"w": jnp.zeros(3)}
  c = recipe_config()
  c.ema.decay, c.ema.warmup = 0.9, True
  out = ema_update(c, jnp.asarray(0), params, ema)  # warmup: decay min(0.9, 1/10)
  np.testing.assert_allclose(out["w"], 0.9 * np.ones(3), rtol=1e-6)
  c.ema.warmup = False
  np.testing.assert_allclose(
    ema_update(c, jnp.asarray(0), params, ema)["w"],
    optax.incremental_update(params, ema, 0.1)["w"],
    rtol=1e-6,
  )


def test_center_plots_over_training(tmp_path):
  c = recipe_config(total_steps=2, eval_every_steps=1)
  c.mixup.mixup_alpha = c.mixup.cutmix_alpha = 0.0
  c.model.name = "cordonnier_sa"
  c.model.overrides = {"hidden_dim": 16, "mlp_dim": 24, "depth": 2, "num_heads": 4}
  c.analysis.center_plots = True
  with pytest.raises(
    ValueError, match=r"analysis.center_plots=True, but train_and_evaluate got no"
  ):
    train.train_and_evaluate(c, str(tmp_path))  # the loop itself imports no analysis code
  train.train_and_evaluate(c, str(tmp_path), **training_hooks())
  plots = sorted(os.listdir(tmp_path / "plots"))
  assert plots == [f"centers_step_00000{i}.png" for i in range(3)]
  assert (tmp_path / "plots" / plots[-1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  c = tiny_config()
  c.analysis.center_plots = True
  with pytest.raises(ValueError, match="center_plots=True needs Gaussian attention layers"):
    train.train_and_evaluate(c, str(tmp_path / "deit"), **training_hooks())
