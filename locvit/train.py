"""The training loop, readable top to bottom.

    mesh + rules -> data sources and iterators -> model, optimizer, sharded state
    -> resume from the workdir (or initialise) -> jitted steps -> loop: train, log, eval, save.

Per step, on device: random erasing and Mixup/CutMix of the batch (``locvit.data.device_augment``),
the frozen teacher's logits when distilling (``locvit.distill``), the loss and its gradient
(accumulated over micro-batches if asked), the optimizer update and the weight EMA.

Determinism: the dropout key of step ``s`` is ``fold_in(key(seed), s)``, the augmentation key
``fold_in(key(seed + 2), s)``, and the data iterator's position is checkpointed, so a run stopped
by SIGTERM and resumed reproduces the uninterrupted run (bitwise on CPU).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging

from locvit import checkpoint as ckpt_lib
from locvit import data as data_lib
from locvit import distill, optim, run_config, sharding
from locvit import evaluate as eval_lib
from locvit import init as init_lib
from locvit import metrics as metrics_lib
from locvit import workdir as workdir_lib
from locvit.data import device_augment
from locvit.init import from_checkpoint
from locvit.models.factory import build_model  # also importable as train.build_model
from locvit.models.layers import check_patchable


@flax.struct.dataclass
class TrainState:
  """``model_state`` holds the non-parameter collections (BatchNorm's ``batch_stats``), or {};
  ``ema_params`` the exponential moving average of ``params`` when ``config.ema.decay > 0``, or {}.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any = flax.struct.field(default_factory=dict)
  ema_params: Any = flax.struct.field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# Set-up helpers


def ema_enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.ema`` is present with ``decay > 0`` (the state then carries EMA weights)."""
  return config.get("ema") is not None and config.ema.decay > 0


def validate_recipe(config: ml_collections.ConfigDict, num_classes: Any) -> None:
  """Checks the on-device augmentation, EMA and distillation blocks; runs before compiling."""
  if config.get("mixup") is not None:
    device_augment.validate_mixup_config(config.mixup, num_classes)
  if config.get("random_erasing") is not None:
    device_augment.validate_erasing_config(config.random_erasing)
  if config.get("nonfinite", "stop") not in NONFINITE_MODES:
    raise ValueError(f"nonfinite={config.nonfinite!r} is not one of {list(NONFINITE_MODES)}")
  if config.get("ema") is not None and not 0 <= config.ema.decay < 1:
    raise ValueError(f"ema.decay={config.ema.decay!r} must be in [0, 1) (0 turns the EMA off)")
  distill.validate(config)


def check_analysis_hooks(config: ml_collections.ConfigDict, **hooks: Callable | None) -> None:
  """``config.analysis`` switches on per-evaluation analysis only the caller's hooks can do."""
  analysis = config.get("analysis") or {}
  fields = {"locality": "make_locality_logger", "center_plots": "make_center_plotter"}
  for field, hook in fields.items():
    if analysis.get(field) and hooks[hook] is None:
      raise ValueError(
        f"config.analysis.{field}=True, but train_and_evaluate got no {hook}: pass "
        f"**locvit.analysis.hooks.training_hooks() (as locvit.main does) or turn it off."
      )


def validate(config: ml_collections.ConfigDict, mesh, rules, model: nn.Module) -> None:
  """Checks that would otherwise fail deep inside JAX; runs before anything is compiled."""
  image_size = config.data.image_size
  if hasattr(model, "patch_size"):
    check_patchable(image_size, image_size, model.patch_size)
  dp = sharding.data_parallel_size(mesh, rules)
  for name in ("batch_size", "eval_batch_size"):
    size = config.get(name) or config.batch_size
    if size % dp:
      valid = [dp * k for k in range(max(size // dp, 1), max(size // dp, 1) + 3)]
      raise ValueError(
        f"{name}={size} is not divisible by the {dp} data-parallel devices of mesh "
        f"{dict(mesh.shape)}. Valid values near it: {valid}."
      )
    if size % jax.process_count():
      raise ValueError(f"{name}={size} is not divisible by {jax.process_count()} processes.")
  accum = config.get("grad_accum_steps", 1)
  if accum < 1 or config.batch_size % (accum * dp):
    raise ValueError(
      f"grad_accum_steps={accum}: batch_size={config.batch_size} must split into {accum} "
      f"micro-batches each divisible by {dp} data-parallel devices."
    )


def training_length(config, num_train_examples: int) -> tuple[int, int]:
  """(total_steps, steps_per_epoch). Epochs scale by 1/train_fraction (ConViT Table 2)."""
  steps_per_epoch = max(num_train_examples // config.batch_size, 1)
  if config.get("total_steps", -1) > 0:
    return config.total_steps, steps_per_epoch
  epochs = config.num_epochs / config.data.get("train_fraction", 1.0)
  return max(math.ceil(epochs * steps_per_epoch), 1), steps_per_epoch


def abstract_variables(model, image_shape):
  """(boxed abstract variables, init fn): shapes and logical axis names, nothing allocated."""

  def init(rng):
    return model.init({"params": rng}, jnp.zeros((1, *image_shape), jnp.float32))

  return jax.eval_shape(init, jax.random.key(0)), init


def abstract_train_state(model, tx, image_shape):
  """(boxed abstract params, init fn returning boxed params); ``tx`` is unused."""
  boxed, init = abstract_variables(model, image_shape)
  return boxed["params"], lambda rng: init(rng)["params"]


def split_variables(variables):
  """``{'params': ..., 'batch_stats': ...}`` -> (params, the other collections)."""
  return variables["params"], {k: v for k, v in variables.items() if k != "params"}


def state_shardings(
  boxed_params, tx, mesh, rules, boxed_model_state=None, ema: bool = False
) -> TrainState:
  """Shardings of the whole TrainState; the EMA weights are sharded like the parameters."""
  params = sharding.tree_shardings(boxed_params, mesh, rules)
  model_state = sharding.tree_shardings(boxed_model_state or {}, mesh, rules)
  abstract_params = nn.meta.unbox(boxed_params)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  return TrainState(
    step=sharding.replicated(mesh),
    params=params,
    opt_state=sharding.opt_state_shardings(abstract_opt, abstract_params, params, mesh),
    model_state=model_state,
    ema_params=params if ema else {},
  )


def apply_initializer(
  config, state: TrainState, model, tx, shardings: TrainState, warmstart=None
) -> TrainState:
  """Applies ``config.init`` (impulse, mimetic, ... see ``locvit.init``) or the ``init_from``
  parameters (``warmstart``) to a fresh state; optimizer state and EMA restart from them.

  Runs only when a run starts from scratch; a resumed run restores the initialised parameters.
  """
  init_cfg = config.get("init")
  if warmstart is not None:
    from_checkpoint.check_matches(warmstart.params, state.params, "parameters")
    from_checkpoint.check_matches(warmstart.model_state, state.model_state, "model state")
    params, model_state = warmstart.params, warmstart.model_state
  elif init_cfg is not None and init_cfg.name != "none":
    seed = config.seed if init_cfg.get("seed") is None else init_cfg.seed  # follows the run's seed
    params = init_lib.apply_init(
      init_cfg, jax.device_get(state.params), model, config.data.image_size, seed=seed
    )
    model_state = state.model_state
  else:
    return state
  params = jax.device_put(params, shardings.params)
  model_state = jax.device_put(model_state, shardings.model_state)
  opt_state = jax.jit(tx.init, out_shardings=shardings.opt_state)(params)
  ema_params = jax.tree.map(jnp.copy, params) if ema_enabled(config) else {}
  return state.replace(
    params=params, opt_state=opt_state, model_state=model_state, ema_params=ema_params
  )


# ------------------------------------------------------------------------------------------------
# The step


def loss_and_metrics(
  params,
  model,
  images,
  targets,
  labels,
  rng,
  model_state=None,
  teacher_logits=None,
  distillation=None,
):
  """Mean soft-target cross-entropy (plus the distillation term); aux = (accuracy, model_state).

  ``targets`` are the (mixed, smoothed) soft targets; accuracy compares the class head's argmax
  with the original ``labels``.
  """
  variables = {"params": params, **(model_state or {})}
  if model_state:  # BatchNorm: batch statistics in training, running averages updated.
    outputs, model_state = model.apply(
      variables, images, train=True, rngs={"dropout": rng}, mutable=list(model_state)
    )
  else:
    outputs = model.apply(variables, images, train=True, rngs={"dropout": rng})
  if teacher_logits is not None:
    logits, dist_logits = outputs
    loss = distill.distillation_loss(logits, dist_logits, targets, teacher_logits, distillation)
  else:
    logits = outputs
    loss = jnp.mean(optax.softmax_cross_entropy(logits, targets))
  accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
  return loss, (accuracy, model_state)


def ema_update(config, step: jax.Array, params, ema_params):
  """``ema <- decay * ema + (1 - decay) * params``; with ``ema.warmup`` the decay ramps as
  ``min(decay, (1 + t) / (10 + t))`` (TensorFlow's ExponentialMovingAverage num_updates rule)."""
  decay = jnp.asarray(config.ema.decay, jnp.float32)
  if config.ema.get("warmup"):
    t = step.astype(jnp.float32)
    decay = jnp.minimum(decay, (1.0 + t) / (10.0 + t))
  return optax.incremental_update(params, ema_params, step_size=1.0 - decay)


def train_step(
  state: TrainState,
  batch,
  teacher_variables=(),
  *,
  model,
  tx,
  schedule,
  config,
  num_classes,
  teacher: distill.Teacher | None = None,
):
  """One optimizer update on a global batch, optionally accumulated over micro-batches."""
  rng = jax.random.fold_in(jax.random.key(config.seed), state.step)
  augment_rng = jax.random.fold_in(jax.random.key(config.seed + 2), state.step)
  images, targets = device_augment.augment_batch(
    augment_rng,
    batch["image"],
    batch["label"],
    mixup=config.get("mixup"),
    erasing=config.get("random_erasing"),
    num_classes=num_classes,
    label_smoothing=config.label_smoothing,
  )
  inputs = {"image": images, "target": targets, "label": batch["label"]}
  if teacher is not None:
    inputs["teacher"] = distill.teacher_logits(teacher, teacher_variables, images)
  grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)

  def loss_grad(mb, key, model_state):
    return grad_fn(
      state.params,
      model,
      mb["image"],
      mb["target"],
      mb["label"],
      key,
      model_state=model_state,
      teacher_logits=mb.get("teacher"),
      distillation=config.get("distillation"),
    )

  accum = config.get("grad_accum_steps", 1)
  if accum == 1:
    (loss, (acc, model_state)), grads = loss_grad(inputs, rng, state.model_state)
  else:
    # Example r goes to micro-batch r % accum: keeps each device's rows local after the reshape.
    micro = jax.tree.map(lambda x: jnp.moveaxis(x.reshape(-1, accum, *x.shape[1:]), 1, 0), inputs)

    def body(carry, xs):
      i, mb = xs
      loss_sum, acc_sum, grad_sum, model_state = carry
      (loss_i, (acc_i, model_state)), g = loss_grad(mb, jax.random.fold_in(rng, i), model_state)
      grad_sum = jax.tree.map(jnp.add, grad_sum, g)
      return (loss_sum + loss_i, acc_sum + acc_i, grad_sum, model_state), None

    zeros = (0.0, 0.0, jax.tree.map(jnp.zeros_like, state.params), state.model_state)
    (loss, acc, grads, model_state), _ = jax.lax.scan(body, zeros, (jnp.arange(accum), micro))
    loss, acc, grads = jax.tree.map(lambda x: x / accum, (loss, acc, grads))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema_params = state.ema_params
  if ema_enabled(config):
    ema_params = ema_update(config, state.step, params, ema_params)
  metrics = {
    "train/loss": loss,
    "train/accuracy": acc,
    "train/lr": schedule(state.step),
    "train/grad_norm": optax.tree.norm(grads),
  }
  new_state = TrainState(
    step=state.step + 1,
    params=params,
    opt_state=opt_state,
    model_state=model_state,
    ema_params=ema_params,
  )
  return new_state, metrics


# ------------------------------------------------------------------------------------------------
# Non-finite guard: checked on device each step, read on the host only at log and save steps

NONFINITE_MODES = ("stop", "skip")


class NonFiniteError(ValueError):
  """Training produced a non-finite loss, gradient norm or state (config.nonfinite='stop')."""


def initial_health() -> dict[str, jax.Array]:
  """``first_nonfinite``: the first step with a non-finite loss or gradient norm (-1: none);
  ``skipped``: updates dropped under ``nonfinite='skip'``."""
  return {"first_nonfinite": jnp.int32(-1), "skipped": jnp.int32(0)}


def guarded_step(state: TrainState, batch, teacher_variables, health, *, config, **step_kwargs):
  """``train_step`` plus the non-finite check, in the same jitted computation (no host sync).

  With ``nonfinite='skip'`` a non-finite step keeps the previous state (only the step counter,
  hence the data and random streams, moves on), as ``optax.apply_if_finite`` does for the
  optimizer alone; here the BatchNorm statistics and EMA weights are kept too, and the optimizer
  state's structure stays that of ``config.optimizer`` (checkpoints resume in either mode).
  """
  new_state, metrics = train_step(state, batch, teacher_variables, config=config, **step_kwargs)
  finite = jnp.isfinite(metrics["train/loss"]) & jnp.isfinite(metrics["train/grad_norm"])
  first = health["first_nonfinite"]
  health = {
    "first_nonfinite": jnp.where((first < 0) & ~finite, state.step + 1, first),
    "skipped": health["skipped"] + (~finite).astype(jnp.int32),
  }
  if config.get("nonfinite", "stop") == "skip":
    kept = state.replace(step=new_state.step)
    new_state = optax.tree.where(finite, new_state, kept)
    metrics["train/skipped_steps"] = health["skipped"]
  return new_state, metrics, health


def check_health(config, health, step: int, warned: int = 0) -> int:
  """Raises NonFiniteError under ``nonfinite='stop'``; under 'skip' warns when more updates were
  skipped than ``warned``. Returns the number skipped so far."""
  first, skipped = int(health["first_nonfinite"]), int(health["skipped"])
  if first < 0 or (skipped <= warned and config.get("nonfinite", "stop") == "skip"):
    return skipped
  if config.get("nonfinite", "stop") == "stop":
    raise NonFiniteError(
      f"non-finite loss or gradient norm at step {first}; stopped at step {step} without saving "
      f"it. Lower optimizer.lr, set grad_clip_norm, or set nonfinite='skip' to drop such updates."
    )
  logging.warning(
    "%d update(s) skipped by step %d: non-finite loss or gradient norm (first at step %d).",
    skipped,
    step,
    first,
  )
  return skipped


@jax.jit
def all_finite(tree) -> jax.Array:
  """Whether every floating-point leaf of ``tree`` is finite (one reduction, one scalar)."""
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])) if leaves else True


def check_finite_state(state: TrainState, step: int) -> None:
  """Raises NonFiniteError unless parameters, optimizer state, BatchNorm statistics and EMA are
  finite; runs before each save (one host sync), so no checkpoint holds NaN or Inf."""
  if not all_finite((state.params, state.opt_state, state.model_state, state.ema_params)):
    raise NonFiniteError(
      f"non-finite parameters or optimizer state after step {step}; not saved. Lower "
      f"optimizer.lr or set grad_clip_norm."
    )


# ------------------------------------------------------------------------------------------------
# Preemption


class PreemptionWatcher:
  """Turns SIGTERM into a flag checked between steps (installed from the main thread only).

  Single-process only. With several processes, JAX's preemption sync manager (started by
  ``jax.distributed.initialize``) owns SIGTERM: a notice to any one process reaches all of them,
  and ``reached_preemption(step)`` becomes True at the same step everywhere. A Python handler
  here would replace JAX's and leave the processes saving different steps (a hang).
  """

  def __init__(self, multiprocess: bool = False, checkpointer=None):
    self.requested = False
    self._previous = None
    self._multiprocess = multiprocess
    self._checkpointer = checkpointer

  def __enter__(self):
    if not self._multiprocess and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def should_stop(self, step: int) -> bool:
    """Whether to save ``step`` and exit; the same answer on every process."""
    if self._multiprocess:
      if self._checkpointer.reached_preemption(step):
        logging.warning("Preemption notice: all processes save step %d and exit.", step)
        return True
      return False
    return self.requested

  def _handle(self, signum, frame):
    logging.warning("SIGTERM received: saving a checkpoint at the end of this step.")
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


# ------------------------------------------------------------------------------------------------
# The loop


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  make_locality_logger: Callable | None = None,
  make_center_plotter: Callable | None = None,
) -> dict[str, Any]:
  """Trains per ``config``, resuming from ``workdir`` if it holds a checkpoint.

  The optional analysis hooks (``locvit.analysis.hooks.training_hooks()``) run at each evaluation
  when ``config.analysis`` asks: ``make_locality_logger(config, model, mesh, eval_source)``
  returns ``fn(params) -> metrics`` or None, ``make_center_plotter(config, params, workdir)``
  returns ``fn(step, params)``.

  Returns the final evaluation metrics (plus ``preempted=True`` if stopped by SIGTERM).
  """
  check_analysis_hooks(
    config, make_locality_logger=make_locality_logger, make_center_plotter=make_center_plotter
  )
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  process_index, process_count = jax.process_index(), jax.process_count()

  # Data. Each process reads only its slice of every global batch.
  train_source = data_lib.make_source(config.data, config.data.train_split)
  eval_source = data_lib.make_source(config.data, config.data.eval_split)
  data_lib.check_same_classes(train_source, eval_source)
  num_classes = config.data.get("num_classes") or train_source.num_classes
  validate_recipe(config, num_classes)
  image_shape = (config.data.image_size, config.data.image_size, train_source[0]["image"].shape[-1])
  warmstart = None
  if from_checkpoint.enabled(config):  # e.g. a pruned model (Cordonnier et al., appendix E)
    config = ml_collections.ConfigDict(config.to_dict())  # don't edit the caller's config
    warmstart = from_checkpoint.load(config, num_classes, image_shape)
    from_checkpoint.apply_layer_heads(config, warmstart)
  model = build_model(config, num_classes)
  validate(config, mesh, rules, model)
  total_steps, steps_per_epoch = training_length(config, len(train_source))
  # The config is valid: only now create the workdir (writable, not in use) and keep the config.
  workdir_lib.claim(workdir)
  if process_index == 0:
    run_config.write(workdir, config)
  train_iter = data_lib.make_train_iterator(
    config.data,
    train_source,
    seed=config.seed,
    local_batch_size=config.batch_size // process_count,
    process_index=process_index,
    process_count=process_count,
  )
  eval_batch_size = config.get("eval_batch_size") or config.batch_size
  eval_batches = data_lib.make_eval_iterator(
    config.data,
    eval_source,
    local_batch_size=eval_batch_size // process_count,
    process_index=process_index,
    process_count=process_count,
  )

  # Model, optimizer and the sharded state.
  boxed_variables, init_variables = abstract_variables(model, image_shape)
  boxed_params, boxed_model_state = split_variables(boxed_variables)
  schedule = optim.make_schedule(config, total_steps, steps_per_epoch)
  tx = optim.make_optimizer(config, nn.meta.unbox(boxed_params), schedule)
  use_ema = ema_enabled(config)
  shardings = state_shardings(boxed_params, tx, mesh, rules, boxed_model_state, ema=use_ema)
  teacher = None
  if distill.enabled(config):
    teacher = distill.load_teacher(config, num_classes, image_shape, mesh, rules)

  def init_state(rng):
    params, model_state = split_variables(nn.meta.unbox(init_variables(rng)))
    return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      model_state=model_state,
      ema_params=jax.tree.map(jnp.copy, params) if use_ema else {},
    )

  # Resume from the workdir, else initialise.
  checkpointer = ckpt_lib.Checkpointer(
    os.path.join(workdir, "checkpoints"),
    keep=config.get("keep_checkpoints", 3),
    async_save=config.get("async_checkpointing", True),
  )
  writer = metrics_lib.MetricWriter(workdir)
  try:  # pending saves of earlier steps are committed even when a step or evaluation fails
    checkpointer.check_best()
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        jax.eval_shape(init_state, jax.random.key(0)),
        shardings,
      )

      def restore(step):
        restored = checkpointer.restore(step, abstract, train_iter)
        if not all_finite(restored):
          raise ckpt_lib.DamagedCheckpointError("non-finite values in the restored state")
        return restored

      start, state, meta = checkpointer.restore_newest_intact(
        restore,
        lambda meta: run_config.check_compatible(meta["config"], config, workdir, num_classes),
      )
      if start is not None:
        run_config.report_changed_hyperparameters(meta, config, workdir, start)
        writer.truncate_after(start)
        logging.info("Resumed from step %d in %s", start, workdir)
      else:
        start = 0
        writer.truncate_after(-1)  # rows of an earlier attempt killed before its first checkpoint
        init_rng = jax.random.key(config.seed + 1)  # separate stream from dropout keys
        state = jax.jit(init_state, out_shardings=shardings)(init_rng)
        state = apply_initializer(config, state, model, tx, shardings, warmstart)
      num_params = sum(x.size for x in jax.tree.leaves(state.params))
      logging.info(
        "%s: %.2fM parameters; %d steps", config.model.name, num_params / 1e6, total_steps
      )

      step_fn = jax.jit(
        functools.partial(
          guarded_step,
          model=model,
          tx=tx,
          schedule=schedule,
          config=config,
          num_classes=num_classes,
          teacher=teacher,
        ),
        in_shardings=(
          shardings,
          sharding.batch_sharding(mesh, rules),
          teacher.shardings if teacher else (),
          sharding.replicated(mesh),
        ),
        out_shardings=(shardings, sharding.replicated(mesh), sharding.replicated(mesh)),
        donate_argnums=(0, 3),
      )
      health = jax.device_put(initial_health(), sharding.replicated(mesh))
      teacher_variables = teacher.variables if teacher else ()
      eval_fn = eval_lib.make_eval_step(
        model, mesh, rules, (shardings.params, shardings.model_state)
      )
      # Locality metrics (nonlocality, gates, centres) at each evaluation, if config.analysis asks.
      locality_fn = None
      if make_locality_logger is not None:
        locality_fn = make_locality_logger(config, model, mesh, eval_source)
      if locality_fn is not None and start == 0:  # the curves (ConViT Figs. 5-6) start at init
        writer.write(0, locality_fn(state.params))
      plot_centers = lambda step, params: None
      if make_center_plotter is not None:
        plot_centers = make_center_plotter(config, state.params, workdir)
      if start == 0:
        plot_centers(0, state.params)
      batch_sharding = sharding.batch_sharding(mesh, rules)
      progress = metrics_lib.Progress(total_steps, config.batch_size, start)
      log_every = config.get("log_every_steps", 50)
      eval_every = config.get("eval_every_steps", 0)
      ckpt_every = config.get("checkpoint_every_steps", 0)
      final = {}
      if start >= total_steps:
        final = metrics_lib.last_evaluation(workdir)
        progress.finished(workdir, final)

      skipped_warned = 0
      meta = run_config.checkpoint_meta(config, num_classes)
      watcher = PreemptionWatcher(multiprocess=process_count > 1, checkpointer=checkpointer)
      with watcher as preemption:
        for step in range(start + 1, total_steps + 1):
          batch = sharding.global_batch(next(train_iter), batch_sharding)
          state, train_metrics, health = step_fn(state, batch, teacher_variables, health)
          last = step == total_steps
          preempted = preemption.should_stop(step)

          record = {}
          if step % log_every == 0 or last or step == start + 1:
            record.update(jax.device_get(train_metrics))
            skipped_warned = check_health(config, jax.device_get(health), step, skipped_warned)
            record.update(progress.update(step, float(record["train/loss"])))
            record["epoch"] = step / steps_per_epoch
          save = (ckpt_every and step % ckpt_every == 0) or last or preempted
          if save:  # before the evaluation, so that a failing evaluation loses no training
            skipped_warned = check_health(config, jax.device_get(health), step, skipped_warned)
            check_finite_state(state, step)
            save_start = time.perf_counter()
            checkpointer.save(step, state, train_iter, meta, force=True)
            progress.checkpoint(time.perf_counter() - save_start)
          if (eval_every and step % eval_every == 0) or last:
            eval_start = time.perf_counter()
            final = eval_lib.evaluate(
              eval_fn, (state.params, state.model_state), eval_batches, batch_sharding
            )
            if use_ema:  # timm evaluates both the model and its EMA
              ema_metrics = eval_lib.evaluate(
                eval_fn, (state.ema_params, state.model_state), eval_batches, batch_sharding
              )
              final.update({k.replace("eval/", "eval_ema/"): v for k, v in ema_metrics.items()})
            record.update(final)
            if locality_fn is not None:
              record.update(locality_fn(state.params))
            plot_centers(step, state.params)
            record.update(progress.evaluation(step, final, time.perf_counter() - eval_start))
            if save:
              checkpointer.save_best(step, state, meta, final)
          if record:
            writer.write(step, record)
          if preempted and not last:
            checkpointer.wait()
            logging.warning("Preempted: checkpoint saved at step %d; exiting.", step)
            final = {"preempted": True, "step": step}
            break
  finally:
    checkpointer.close()
    writer.close()
    workdir_lib.release_lock(workdir)
  return final


def evaluate_checkpoint(
  config: ml_collections.ConfigDict, workdir: str, step: int | None = None
) -> dict[str, Any]:
  """Eval-only mode: restores parameters from ``workdir`` (latest or ``step``) and evaluates.

  With ``config.ema.decay > 0`` the EMA weights are evaluated too (``eval_ema/*``).
  """
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  eval_source = data_lib.make_source(config.data, config.data.eval_split)
  num_classes = config.data.get("num_classes") or eval_source.num_classes
  model = build_model(config, num_classes)
  validate(config, mesh, rules, model)
  image_shape = (config.data.image_size, config.data.image_size, eval_source[0]["image"].shape[-1])
  boxed_params, boxed_model_state = ckpt_lib.model_variable_shapes(model, image_shape)
  variable_shardings = (
    sharding.tree_shardings(boxed_params, mesh, rules),
    sharding.tree_shardings(boxed_model_state, mesh, rules),
  )
  params, model_state, step = ckpt_lib.restore_model_variables(
    workdir,
    model,
    image_shape,
    step=step,
    shardings=variable_shardings,
    check=lambda meta: run_config.check_compatible(meta["config"], config, workdir),
  )
  ema = None
  if ema_enabled(config):
    ema = ckpt_lib.restore_ema_params(workdir, step, variable_shardings[0], boxed_params)
  eval_batch_size = config.get("eval_batch_size") or config.batch_size
  batches = data_lib.make_eval_iterator(
    config.data,
    eval_source,
    local_batch_size=eval_batch_size // jax.process_count(),
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    eval_fn = eval_lib.make_eval_step(model, mesh, rules, variable_shardings)
    batch_sharding = sharding.batch_sharding(mesh, rules)
    result = eval_lib.evaluate(eval_fn, (params, model_state), batches, batch_sharding)
    if ema is not None:
      ema_result = eval_lib.evaluate(eval_fn, (ema, model_state), batches, batch_sharding)
      result.update({k.replace("eval/", "eval_ema/"): v for k, v in ema_result.items()})
  result["step"] = step
  return result
