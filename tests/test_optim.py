"""optax chains: decay masks, freezing, schedules, SGD, mixed precision, checkpoint retention."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from locvit import optim, train
from locvit.data import device_augment
from locvit.metrics import read_metrics
from locvit.models import create_model
from locvit.models.factory import build_model
from locvit.platform import sharding
from locvit.run.step import loss_and_metrics
from locvit.workdir import checkpoint, fingerprint
from tests.train_utils import tiny_config


def _params(name="convit_tiny_patch2_32", **overrides):
  model = create_model(name, num_classes=10, **overrides)
  boxed, _ = sharding.model_variable_shapes(model, (8, 8, 3))
  return jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.tree.map(lambda x: x, boxed))


def _flat(tree):
  import flax

  return {"/".join(k): v for k, v in flax.traverse_util.flatten_dict(tree).items()}


def test_intended_decay_mask_spares_embeddings_norms_biases_gates():
  import flax.linen as nn

  params = nn.meta.unbox(_params(qkv_bias=True, **_convit_two_layers()))
  mask = _flat(optim.decay_mask(params, "intended"))
  assert mask["pos_embed"] is False and mask["cls_token"] is False
  assert mask["blocks_0/attn/gating_param"] is False
  assert mask["blocks_0/norm1/scale"] is False and mask["blocks_1/attn/qkv/bias"] is False
  assert mask["blocks_0/attn/qk/kernel"] is True and mask["blocks_1/mlp/fc1/kernel"] is True
  assert mask["blocks_0/attn/pos_proj/kernel"] is True


def test_official_convit_mask_decays_pos_embed_cls_token_and_pos_proj():
  import flax.linen as nn

  params = nn.meta.unbox(_params(qkv_bias=True, **_convit_two_layers()))
  mask = _flat(optim.decay_mask(params, "official_convit"))
  assert mask["pos_embed"] and mask["cls_token"] and mask["blocks_0/attn/pos_proj/kernel"]
  assert not mask["blocks_0/attn/gating_param"] and not mask["blocks_1/attn/qkv/bias"]
  assert not mask["blocks_0/norm1/scale"] and not mask["blocks_0/attn/pos_proj/bias"]
  with pytest.raises(ValueError, match="not one of"):
    optim.decay_mask(params, "nope")


def test_official_cordonnier_mask_decays_all_but_gaussian_centres_and_spreads():
  import flax.linen as nn

  params = nn.meta.unbox(_params("cordonnier_sa", depth=1))
  mask = _flat(optim.decay_mask(params, "official_cordonnier"))
  spared = sorted(path for path, decays in mask.items() if not decays)
  positional = "layers_0/attn/positional"
  assert spared == [f"{positional}/attention_centers", f"{positional}/attention_spreads"]
  assert mask["layers_0/attn/value/bias"] and mask["layers_0/attn_norm/scale"]


def _convit_two_layers():
  from locvit.models.convit import convit_overrides

  return convit_overrides(local_up_to_layer=1, depth=2)


def test_cosine_schedule_warmup_peak_and_floor():
  c = tiny_config()
  c.optimizer.lr, c.schedule.warmup_steps, c.schedule.min_lr = 1e-3, 10, 1e-5
  sched = optim.make_schedule(c, total_steps=110, steps_per_epoch=10)
  assert float(sched(0)) == pytest.approx(c.schedule.warmup_init_lr, rel=1e-4)
  assert float(sched(10)) == pytest.approx(1e-3)
  assert float(sched(110)) == pytest.approx(1e-5)
  assert float(sched(60)) == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-3)


def test_epoch_updates_hold_each_epochs_first_rate_and_timm_counts_cosine_from_zero():
  """``update_every='epoch'``: a scheduler stepped once per epoch (attention-cnn's LambdaLR at
  each epoch's start); with ``warmup_prefix=False`` the rates are timm's CosineLRScheduler's at
  epoch e: ``init + e (peak - init) / W`` in the warmup, then
  ``min + (peak - min) (1 + cos(pi e / E)) / 2``."""
  c = tiny_config()
  c.optimizer.lr, c.schedule.warmup_epochs, c.schedule.warmup_steps = 1e-3, 2, 0
  c.schedule.warmup_init_lr, c.schedule.min_lr = 1e-5, 1e-6
  per_step = optim.make_schedule(c, total_steps=100, steps_per_epoch=10)
  c.schedule.update_every = "epoch"
  per_epoch = optim.make_schedule(c, total_steps=100, steps_per_epoch=10)
  for step in (0, 9, 10, 15, 19, 20, 37, 99):
    assert float(per_epoch(step)) == float(per_step(step // 10 * 10))
  assert float(per_epoch(9)) == pytest.approx(1e-5, rel=1e-5)
  assert float(per_epoch(25)) == pytest.approx(1e-3, rel=1e-5)
  c.schedule.warmup_prefix = False
  timm = optim.make_schedule(c, total_steps=100, steps_per_epoch=10)
  expected = [1e-5 + e * (1e-3 - 1e-5) / 2 for e in (0, 1)]
  expected += [1e-6 + (1e-3 - 1e-6) * (1 + np.cos(np.pi * e / 10)) / 2 for e in range(2, 10)]
  np.testing.assert_allclose([float(timm(10 * e + 3)) for e in range(10)], expected, rtol=1e-5)


def test_step_schedule_and_linear_lr_scaling():
  c = tiny_config(batch_size=256)
  c.optimizer.lr, c.optimizer.lr_base_batch_size = 0.1, 128
  c.schedule.name, c.schedule.warmup_epochs, c.schedule.warmup_steps = "step", 0, 0
  c.schedule.boundaries_epochs, c.schedule.decay_factor = (2, 4), 0.1
  sched = optim.make_schedule(c, total_steps=100, steps_per_epoch=10)
  np.testing.assert_allclose(
    [sched(s) for s in (0, 19, 20, 39, 40)], [0.2, 0.2, 0.02, 0.02, 0.002], rtol=1e-5
  )


def test_frozen_parameters_do_not_move(tmp_path):
  config = tiny_config(freeze=("blocks_0/attn/",))
  config.total_steps = 3
  model = build_model(config, 10)
  init = lambda rng: sharding.init_model_variables(model, (8, 8, 1), rng)[0]
  import flax.linen as nn

  params = nn.meta.unbox(init(jax.random.key(0)))
  sched = optim.make_schedule(config, 3, 1)
  tx = optim.make_optimizer(config, params, sched)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  flat = _flat(updates)
  assert all(not np.any(v) for k, v in flat.items() if k.startswith("blocks_0/attn/"))
  assert np.any(flat["blocks_1/mlp/fc1/kernel"])


def test_training_with_frozen_parameters_and_fsdp(tmp_path):
  """The trainer shards multi_transform optimizer state; frozen parameters stay bitwise equal."""
  config = tiny_config(freeze=("blocks_0/attn/", "cls_token"))
  config.mesh.layout = "fsdp"
  config.total_steps = 2
  config.checkpoint_every_steps = 1
  train.train_and_evaluate(config, str(tmp_path))
  ckpt = checkpoint.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  read = lambda step: ckpt.manager.restore(
    step, args=ocp.args.Composite(state=ocp.args.StandardRestore())
  )["state"]["params"]
  first, second = _flat(read(1)), _flat(read(2))
  frozen = [k for k in first if k.startswith("blocks_0/attn/") or k == "cls_token"]
  assert frozen and all(np.array_equal(first[k], second[k]) for k in frozen)
  assert not np.array_equal(first["blocks_1/mlp/fc1/kernel"], second["blocks_1/mlp/fc1/kernel"])
  ckpt.close()


def test_sgd_with_momentum_trains(tmp_path):
  config = tiny_config()
  config.optimizer.name, config.optimizer.lr, config.optimizer.weight_decay = "sgd", 0.05, 1e-4
  train.train_and_evaluate(config, str(tmp_path))
  losses = [r["train/loss"] for r in read_metrics(tmp_path)]
  assert np.all(np.isfinite(losses))
  with pytest.raises(ValueError, match="not one of"):
    config.optimizer.name = "lamb"
    optim.make_optimizer(config, {}, optax.constant_schedule(0.1))


def test_label_smoothing_loss_matches_formula():
  logits = jnp.array([[2.0, 0.0, -1.0]])
  model = type("M", (), {"apply": lambda self, v, x, train, rngs: logits})()
  labels = jnp.array([0])
  targets = device_augment.soft_targets(labels, 3, 0.3)  # what the step feeds the loss
  loss, _ = loss_and_metrics({}, model, None, targets, labels, None)
  logp = jax.nn.log_softmax(logits)[0]
  target = np.array([0.7 + 0.1, 0.1, 0.1])
  assert float(loss) == pytest.approx(float(-(target * logp).sum()), rel=1e-6)


def test_mixed_precision_keeps_fp32_params_and_tracks_fp32_loss(tmp_path):
  fp32 = train.train_and_evaluate(tiny_config(), str(tmp_path / "fp32"))
  config = tiny_config(mixed_precision=True)
  bf16 = train.train_and_evaluate(config, str(tmp_path / "bf16"))
  l32 = [r["train/loss"] for r in read_metrics(tmp_path / "fp32")]
  l16 = [r["train/loss"] for r in read_metrics(tmp_path / "bf16")]
  np.testing.assert_allclose(l16, l32, rtol=0.02)
  assert abs(bf16["eval/loss"] - fp32["eval/loss"]) < 0.05
  model = build_model(config, 10)
  assert model.dtype == jnp.bfloat16 and model.param_dtype == jnp.float32


def test_checkpoints_keep_last_n_and_best(tmp_path):
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, async_save=False)
  config = tiny_config()
  state = {"w": jnp.arange(3.0)}
  top1 = {1: 0.2, 2: 0.9, 3: 0.5, 4: 0.4, 5: 0.3}
  for step, acc in top1.items():
    ckpt.save(step, state, fingerprint.checkpoint_meta(config))
    ckpt.save_best(step, state, fingerprint.checkpoint_meta(config), {"eval/top1": acc})
  ckpt.wait()
  assert sorted(ckpt.manager.all_steps()) == [4, 5]
  assert ckpt.best_step() == 2 and ckpt.best_score() == 0.9
  ckpt.close()
  # A restarted run keeps the best across rotations of the last-N steps.
  ckpt = checkpoint.Checkpointer(str(tmp_path), keep=2, async_save=False)
  for step, acc in {6: 0.1, 7: 0.95, 8: 0.2}.items():
    state = {"w": jnp.full(3, float(step))}
    ckpt.save(step, state, fingerprint.checkpoint_meta(config))
    ckpt.save_best(step, state, fingerprint.checkpoint_meta(config), {"eval/top1": acc})
  ckpt.wait()
  assert sorted(ckpt.manager.all_steps()) == [7, 8]
  assert ckpt.best_step() == 7 and ckpt.best_score() == 0.95
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  restored = ckpt.best.restore(7, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
  np.testing.assert_array_equal(restored["state"]["w"], np.full(3, 7.0))
  ckpt.close()


def test_intended_mask_spares_gmm_and_elm_mask_parameters():
  import flax.linen as nn

  for name, mask_params in [
    ("gmm_vit_smalldata_d9_patch4_32", ("alpha", "sigma")),
    ("elm_vit_smalldata_d6_patch4_32", ("elm",)),
  ]:
    model = create_model(name, num_classes=10)
    boxed, _ = sharding.model_variable_shapes(model, (32, 32, 3))
    mask = _flat(optim.decay_mask(nn.meta.unbox(boxed), "intended"))
    masked = {k: v for k, v in mask.items() if k.split("/")[-1] in mask_params}
    assert masked and not any(masked.values()), masked  # every layer's mask parameters
    assert _flat(optim.decay_mask(nn.meta.unbox(boxed), "all"))[next(iter(masked))]


def _final_params(workdir):
  ckpt = checkpoint.Checkpointer(str(workdir / "checkpoints"), async_save=False)
  step = ckpt.manager.latest_step()
  state = ckpt.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  ckpt.close()
  moments = [x.size for x in jax.tree.leaves(state["state"]["opt_state"]) if x.ndim]
  return step, _flat(state["state"]["params"]), moments


def test_flat_optimizer_trains_as_the_per_parameter_one_and_refuses_the_others_checkpoint(
  tmp_path,
):
  """AdamW with clipping and the 'intended' decay mask on one flat vector (optax.flatten): the
  same parameters after four steps up to float rounding (the global norm sums in another order);
  a checkpoint resumes only with the setting it was written with."""
  params, norms = {}, {}
  for flatten in (False, True):
    config = tiny_config(grad_clip_norm=0.5, total_steps=4, checkpoint_every_steps=4)
    config.optimizer.decay_mask, config.optimizer.weight_decay = "intended", 0.5
    config.optimizer.flatten = flatten
    train.train_and_evaluate(config, str(tmp_path / str(flatten)))
    step, params[flatten], moments = _final_params(tmp_path / str(flatten))
    rows = read_metrics(tmp_path / str(flatten))
    norms[flatten] = [r["train/grad_norm"] for r in rows if "train/grad_norm" in r]
    assert step == 4
    if flatten:  # Adam's mu and nu: one vector each, every parameter's entries
      assert moments == [sum(x.size for x in params[flatten].values())] * 2
  assert len(norms[True]) == 4 and np.allclose(norms[True], norms[False], rtol=1e-5)
  assert params[False].keys() == params[True].keys()
  for name, value in params[False].items():
    np.testing.assert_allclose(params[True][name], value, rtol=1e-5, atol=1e-6, err_msg=name)
  config.total_steps = 6  # flatten=True, resuming the per-parameter run's checkpoint
  where = str(tmp_path / "False")
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(config, where)
  assert str(error.value) == (
    f"The checkpoint in {where} was written by an incompatible config:\n"
    "  optimizer.flatten: checkpoint has False, config has True\n"
    "Use a fresh --workdir, or restore the original config values to resume."
  )


def test_gradient_norm_sums_one_concatenation_where_parameters_are_replicated():
  """train/grad_norm: the concatenation's norm (one reduction on XLA:GPU, not one fused into
  each leaf's update) under 'dp' without clipping; per leaf under fsdp or beside clipping."""
  grads = {"a": jnp.linspace(-1.0, 2.0, 7), "b": {"c": jnp.full((3, 5), 0.3)}}
  per_leaf = optax.tree.norm(grads)
  config = tiny_config()
  for layout, clip, concatenates in [("dp", 0.0, True), ("fsdp", 0.0, False), ("dp", 1.0, False)]:
    config.mesh.layout, config.grad_clip_norm = layout, clip
    jaxpr = str(jax.make_jaxpr(lambda g: optim.gradient_norm(config, g))(grads))
    assert ("concatenate" in jaxpr) == concatenates, (layout, clip)
    np.testing.assert_allclose(optim.gradient_norm(config, grads), per_leaf, rtol=1e-6)


def test_the_learning_rate_read_from_a_vector_leaves_the_updates_bitwise_equal(monkeypatch):
  """make_optimizer hands optax the learning rate as an element of a vector behind an
  optimisation barrier (so that XLA:GPU fuses the equal-shape leaves' updates): the same
  parameters and state, bit for bit, as the plain schedule gives."""
  import flax.linen as nn

  config = tiny_config(grad_clip_norm=0.5)
  config.optimizer.weight_decay = 0.05
  model = build_model(config, 10)
  params = nn.meta.unbox(sharding.init_model_variables(model, (8, 8, 1), jax.random.key(0))[0])
  schedule = optim.make_schedule(config, 6, 1)
  txs = [optim.make_optimizer(config, params, schedule)]
  monkeypatch.setattr(optim, "_shared_learning_rate", lambda s: s)
  txs.append(optim.make_optimizer(config, params, schedule))
  results = []
  for tx in txs:
    step = jax.jit(lambda p, s, g, tx=tx: tx.update(g, s, p))
    p, s = params, tx.init(params)
    for i in range(3):
      grads = jax.tree.map(lambda x, i=i: jax.random.normal(jax.random.key(i), x.shape), p)
      updates, s = step(p, s, grads)
      p = optax.apply_updates(p, updates)
    results.append((p, s))
  jax.tree.map(np.testing.assert_array_equal, *results)
