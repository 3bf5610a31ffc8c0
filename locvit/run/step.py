"""The jitted training step and the non-finite guard.

Per step, on device (``locvit.data.device_augment``): the recipe's pad-crop and flip under
``data.augment_on='device'``, the normalisation of the uint8 batch, random erasing and Mixup/CutMix;
the frozen teacher's logits when distilling (``locvit.distill``), the loss and its gradient
(accumulated over micro-batches if asked), the optimizer update and the weight EMA. The guard is
checked on device each step and read on the host only at log and save steps.
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import optax
from absl import logging

from locvit import distill, optim
from locvit.data import device_augment, resident
from locvit.platform import ops
from locvit.run.state import TrainState, ema_enabled


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
  if config.ema.warmup:
    t = step.astype(jnp.float32)
    decay = jnp.minimum(decay, (1.0 + t) / (10.0 + t))
  return optax.incremental_update(params, ema_params, step_size=1.0 - decay)


def step_arguments(parts, **extra) -> dict:
  """The keyword arguments of ``train_step`` / ``guarded_steps`` (and ``locvit.run.seeds``'
  step) taken from ``parts``, anything with the run's ``model``, ``tx``, ``schedule``, ``config``
  and ``num_classes`` (a ``locvit.run.bundle.Training``, the benchmarks' parts), plus ``extra``
  (``teacher``, ``platform``)."""
  return dict(
    model=parts.model,
    tx=parts.tx,
    schedule=parts.schedule,
    config=parts.config,
    num_classes=parts.num_classes,
    **extra,
  )


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
  platform: str,
  seed: jax.Array | int | None = None,
):
  """One optimizer update on a global batch, optionally accumulated over micro-batches.
  ``platform``: the backend the step is compiled for, resolved once by the caller
  (``locvit.train.make_step_fn``: the default backend's; a compile-only device's,
  ``benchmarks/step_kernels.py --gpu``). ``seed``: the run's seed where it
  is an operand rather than ``config.seed`` (one per lane of ``locvit.run.seeds``' vmapped step);
  the keys are the same either way."""
  seed = config.seed if seed is None else seed
  rng = jax.random.fold_in(jax.random.key(seed), state.step)
  augment_rng = jax.random.fold_in(jax.random.key(seed + 2), state.step)
  recipe_rng = jax.random.fold_in(jax.random.key(seed + 3), state.step)
  images = device_augment.recipe_ops(recipe_rng, batch, config.data, platform=platform)
  images, targets = device_augment.augment_batch(
    augment_rng,
    device_augment.normalize(images, config.data),
    batch["label"],
    mixup=config.mixup,
    erasing=config.random_erasing,
    num_classes=num_classes,
    label_smoothing=config.label_smoothing,
  )
  inputs = {"image": images, "target": targets, "label": batch["label"]}
  if teacher is not None:
    inputs["teacher"] = distill.teacher_logits(teacher, teacher_variables, images)
  grad_fn = jax.value_and_grad(loss_and_metrics, has_aux=True)

  # One shared operand for the layers' parameter casts and LayerNorm's parameter sums, which
  # XLA:GPU then merges, and there the biases inside the matmuls; on the CPU code paths the step
  # would only gain kernels (docs/benchmarks.md).
  implementation = ops.model_implementation(model, platform)
  fusions = (
    contextlib.nullcontext
    if ops.cpu_kernels(implementation)
    else functools.partial(
      ops.training_step_fusions,
      per_example_sums=True,
      bias_in_matmul=platform == "gpu",
    )
  )

  def loss_grad(mb, key, model_state):
    with fusions():
      return grad_fn(
        state.params,
        model,
        mb["image"],
        mb["target"],
        mb["label"],
        key,
        model_state=model_state,
        teacher_logits=mb.get("teacher"),
        distillation=config.distillation,
      )

  loss, acc, model_state, grads = mean_loss_and_gradients(
    loss_grad, inputs, rng, state, config.grad_accum_steps
  )
  metrics = {
    "train/loss": loss,
    "train/accuracy": acc,
    "train/lr": schedule(state.step),
    "train/grad_norm": optim.gradient_norm(config, grads),
  }
  return updated_state(state, grads, model_state, tx, config), metrics


def mean_loss_and_gradients(loss_grad, inputs, rng, state: TrainState, accum: int):
  """``(loss, accuracy, model state, gradients)`` of the batch ``inputs``, each the mean over
  ``accum`` micro-batches (gradient accumulation; one pass when ``accum`` is 1). ``loss_grad(mb,
  key, model_state)`` is one micro-batch's ``((loss, (accuracy, model_state)), gradients)``."""
  if accum == 1:
    (loss, (acc, model_state)), grads = loss_grad(inputs, rng, state.model_state)
    return loss, acc, model_state, grads
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
  return loss, acc, model_state, grads


def updated_state(state: TrainState, grads, model_state, tx, config) -> TrainState:
  """The state after one optimizer update with ``grads``: parameters, optimizer state, the
  model state the forward pass returned and the weight EMA."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema_params = state.ema_params
  if ema_enabled(config):
    ema_params = ema_update(config, state.step, params, ema_params)
  return TrainState(
    step=state.step + 1,
    params=params,
    opt_state=opt_state,
    model_state=model_state,
    ema_params=ema_params,
  )


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
  if config.nonfinite == "skip":
    kept = state.replace(step=new_state.step)
    new_state = optax.tree.where(finite, new_state, kept)
    metrics["train/skipped_steps"] = health["skipped"]
  return new_state, metrics, health


def guarded_steps(
  state: TrainState, batches, teacher_variables, health, train_split=(), **step_kwargs
):
  """``guarded_step`` on each batch of the list ``batches`` in turn, as one computation (a
  ``lax.scan``: ``config.steps_per_dispatch`` steps per host dispatch); the metrics are the
  last step's. One batch is one plain step. With the training split on the device
  (``data.train_split_on='device'``) a batch is its rows' indices into ``train_split``."""
  guarded = functools.partial(guarded_step, teacher_variables=teacher_variables, **step_kwargs)

  def step(state, batch, health):
    return guarded(state, resident.gather(train_split, batch), health=health)

  if len(batches) == 1:
    return step(state, batches[0], health)

  def body(carry, batch):
    state, metrics, health = step(carry[0], batch, carry[1])
    return (state, health), metrics

  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
  (state, health), metrics = jax.lax.scan(body, (state, health), stacked)
  return state, jax.tree.map(lambda m: m[-1], metrics), health


def check_health(config, health, step: int, warned: int = 0, name: str = "") -> int:
  """Raises NonFiniteError under ``nonfinite='stop'``; under 'skip' warns when more updates were
  skipped than ``warned``. Returns the number skipped so far. ``name``: the run's, where one
  process trains several (a seed's workdir), said first."""
  first, skipped = int(health["first_nonfinite"]), int(health["skipped"])
  if first < 0 or (skipped <= warned and config.nonfinite == "skip"):
    return skipped
  who = f"{name}: " if name else ""
  if config.nonfinite == "stop":
    raise NonFiniteError(
      f"{who}non-finite loss or gradient norm at step {first}; stopped at step {step} without "
      "saving it. Lower optimizer.lr, set grad_clip_norm, or set nonfinite='skip' to drop such "
      "updates."
    )
  logging.warning(
    "%s%d update(s) skipped by step %d: non-finite loss or gradient norm (first at step %d).",
    who,
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
