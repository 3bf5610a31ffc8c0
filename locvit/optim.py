"""optax optimizers, per-step schedules, weight-decay and freeze masks.

Everything is driven by the config:

- ``optimizer.name``: 'adamw' or 'sgd' (momentum); ``optimizer.lr`` is scaled by
  ``batch_size / optimizer.lr_base_batch_size`` when the latter is set (DeiT's linear rule).
- ``schedule.name``: 'cosine' (linear warmup from ``warmup_init_lr``, then cosine to ``min_lr``),
  'step' (warmup, then multiply by ``decay_factor`` at each of ``boundaries_epochs``) or 'constant';
  ``schedule.update_every``: 'step' (the rate changes every step) or 'epoch' (it keeps the value
  of each epoch's first step for the whole epoch, as a PyTorch scheduler stepped once per epoch);
  ``schedule.warmup_prefix``: False counts the cosine from step 0 rather than from the warmup's
  end (timm's ``warmup_prefix``).
- ``optimizer.decay_mask``: 'intended' (no decay on biases, norms, positional embeddings, class
  token, gates and other 1-D parameters), 'official_convit' (the ConViT run's actual mask: every
  parameter with ndim >= 2 is decayed, which includes ``pos_embed``, ``cls_token`` and
  ``pos_proj`` kernels; biases, norms and gates are not), 'official_cordonnier'
  (epfml/attention-cnn's ``get_optimizer``: every parameter but the Gaussian attention centres and
  spreads, so biases and LayerNorm too), or 'all'.
- ``freeze``: regular expressions on '/'-joined parameter paths; matching parameters get zero
  updates.
- ``optimizer.flatten``: update every trainable parameter as one flat vector (``optax.flatten``:
  clipping, the optimizer and weight decay run on the concatenation of all leaves), so the step
  runs a few large kernels instead of a few per parameter. The same updates up to float rounding
  (the global norm's summation order); the optimizer state is one vector per moment, so a
  checkpoint resumes only with the setting it was saved with.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax

from locvit.choices import Errors, check_choice
from locvit.platform import ops, sharding

# Parameter-name fragments never decayed under the 'intended' mask.
NO_DECAY_NAMES = (
  "pos_embed",
  "cls_token",
  "dist_token",
  "gating_param",
  "attention_centers",
  "attention_spreads",
  "alpha",  # GMM mixture weights (K, H)
  "sigma",  # GMM widths (K, H)
  "elm",  # element-wise learnable mask (N, N)
  "scale",
  "bias",
)
DECAY_MASKS = ("intended", "official_convit", "official_cordonnier", "all")
# Never decayed under 'official_cordonnier' (the reference's SGD parameter group without decay).
GAUSSIAN_POSITION_NAMES = ("attention_centers", "attention_spreads")
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("cosine", "step", "constant")
SCHEDULE_UPDATES = ("step", "epoch")


def _paths(params: Any) -> dict[tuple[str, ...], Any]:
  return flax.traverse_util.flatten_dict(flax.core.unfreeze(params))


def _tree_of(params: Any, fn: Callable[[str, Any], Any]) -> Any:
  flat = {k: fn("/".join(k), v) for k, v in _paths(params).items()}
  return flax.traverse_util.unflatten_dict(flat)


def decay_mask(params: Any, kind: str) -> Any:
  """Boolean tree: True where weight decay applies."""
  check_choice("optimizer.decay_mask", kind, DECAY_MASKS)
  if kind == "all":
    return _tree_of(params, lambda path, p: True)
  if kind == "official_cordonnier":
    return _tree_of(
      params, lambda path, p: not any(n in path.split("/") for n in GAUSSIAN_POSITION_NAMES)
    )
  if kind == "official_convit":
    # PyTorch's ndim >= 2 rule; locvit stores some biases at rank 3, so go by name too.
    return _tree_of(
      params, lambda path, p: p.ndim >= 2 and path.split("/")[-1] not in ("bias", "scale")
    )
  return _tree_of(
    params, lambda path, p: p.ndim >= 2 and not any(n in path.split("/") for n in NO_DECAY_NAMES)
  )


def freeze_labels(params: Any, patterns: tuple[str, ...]) -> Any:
  """'frozen' / 'trainable' label tree for ``optax.multi_transform``."""
  compiled = [re.compile(p) for p in patterns]
  labels = _tree_of(
    params, lambda path, p: "frozen" if any(c.search(path) for c in compiled) else "trainable"
  )
  unmatched = [
    p.pattern for p in compiled if not any(p.search("/".join(k)) for k in _paths(params))
  ]
  if unmatched:
    paths = sorted({"/".join(k) for k in _paths(params)})
    close = sorted({m for p in unmatched for m in difflib.get_close_matches(p, paths, n=3)})
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(
      f"freeze patterns {unmatched} match no parameter; {hint}Examples of paths: {paths[:20]}"
    )
  return labels


def peak_learning_rate(config: ml_collections.ConfigDict) -> float:
  """``optimizer.lr``, scaled by ``batch_size / lr_base_batch_size`` when the latter is set
  (DeiT's linear rule, lr = 5e-4 * batch / 512)."""
  opt = config.optimizer
  if opt.lr_base_batch_size:
    return opt.lr * config.batch_size / opt.lr_base_batch_size
  return opt.lr


def check_optimizer_config(config: ml_collections.ConfigDict) -> None:
  """The optimizer, decay-mask and schedule names, checked before a run creates anything."""
  errors = Errors()
  errors.check(check_choice, "optimizer.name", config.optimizer.name, OPTIMIZERS)
  errors.check(check_choice, "optimizer.decay_mask", config.optimizer.decay_mask, DECAY_MASKS)
  errors.check(check_choice, "schedule.name", config.schedule.name, SCHEDULES)
  errors.check(
    check_choice, "schedule.update_every", config.schedule.update_every, SCHEDULE_UPDATES
  )
  errors.raise_all()


def make_schedule(
  config: ml_collections.ConfigDict, total_steps: int, steps_per_epoch: int
) -> optax.Schedule:
  """The learning rate of every step; warmup and boundaries may be given in epochs. With
  ``schedule.update_every='epoch'`` the rate of step ``s`` is the per-step schedule's at the first
  step of its epoch, ``floor(s / steps_per_epoch) * steps_per_epoch``."""
  sched = config.schedule
  check_choice("schedule.update_every", sched.update_every, SCHEDULE_UPDATES)
  per_step = _per_step_schedule(config, total_steps, steps_per_epoch)
  if sched.update_every == "step":
    return per_step
  return lambda step: per_step(step // steps_per_epoch * steps_per_epoch)


def _per_step_schedule(
  config: ml_collections.ConfigDict, total_steps: int, steps_per_epoch: int
) -> optax.Schedule:
  sched = config.schedule
  check_choice("schedule.name", sched.name, SCHEDULES)
  peak = peak_learning_rate(config)
  warmup = int(sched.get("warmup_steps") or round(sched.get("warmup_epochs", 0) * steps_per_epoch))
  warmup = min(warmup, max(total_steps - 1, 0))
  if sched.name == "constant":
    after = optax.constant_schedule(peak)
  elif sched.name == "cosine" and sched.warmup_prefix:
    decay_steps = max(total_steps - warmup, 1)
    after = optax.cosine_decay_schedule(peak, decay_steps, alpha=sched.min_lr / peak if peak else 0)
  elif sched.name == "cosine":
    whole = optax.cosine_decay_schedule(
      peak, max(total_steps, 1), alpha=sched.min_lr / peak if peak else 0
    )
    after = lambda step: whole(step + warmup)  # join_schedules counts from the warmup's end
  else:
    bounds = {
      round(e * steps_per_epoch) - warmup: sched.decay_factor for e in sched.boundaries_epochs
    }
    after = optax.piecewise_constant_schedule(peak, {b: f for b, f in bounds.items() if b > 0})
  if warmup == 0:
    return after
  ramp = optax.linear_schedule(sched.warmup_init_lr, peak, warmup)
  return optax.join_schedules([ramp, after], [warmup])


def replicated_parameters(config: ml_collections.ConfigDict) -> bool:
  """Whether every parameter is whole on each device (no mesh rule but the batch's maps an axis):
  concatenating the leaves then moves no data between devices."""
  return all(axes is None for name, axes in sharding.logical_rules(config.mesh) if name != "batch")


def gradient_norm(config: ml_collections.ConfigDict, grads: Any) -> jax.Array:
  """The global norm of ``grads`` (the step's ``train/grad_norm``).

  Computed on the concatenation of the leaves: with ``optimizer.flatten``, the one
  ``optax.flatten`` makes, which XLA then computes once for both (and with clipping, the norm
  too); without, where the parameters are replicated and nothing clips (clipping's own norm is
  then the metric's too), so that XLA:GPU does not fuse a squared-norm reduction into each
  leaf's update, which turns every update into a reduction of its own and the norm into dozens
  of partial sums (docs/benchmarks.md, "The optimizer's and metrics' kernels on XLA:GPU").
  Equal to the per-leaf norm up to float rounding (the summation order)."""
  concatenate = config.optimizer.flatten or (
    replicated_parameters(config) and not config.grad_clip_norm
  )
  if concatenate:
    return optax.tree.norm(jnp.concatenate([jnp.reshape(g, [-1]) for g in jax.tree.leaves(grads)]))
  return optax.tree.norm(grads)


def _decay_only(params: Any, mask: Any) -> Any:
  """``params`` where ``mask`` is True, zeros elsewhere."""
  return jax.tree.map(lambda p, m: p if m else jnp.zeros_like(p), params, mask)


def _with_params(inner: optax.GradientTransformation, fn: Callable[[Any], Any]):
  """``inner`` given ``fn(params)`` as its parameters."""

  def update(updates, state, params=None):
    return inner.update(updates, state, None if params is None else fn(params))

  return optax.GradientTransformation(inner.init, update)


def _shared_learning_rate(schedule: optax.Schedule) -> optax.Schedule:
  """``schedule``'s value, the same float, as an ``ops.unfoldable_scalar``: every parameter
  leaf's update reads the learning rate, and as a shared operand it lets the updates of
  equal-shape leaves (the blocks') fuse into one kernel per shape on XLA:GPU, not one per leaf."""

  def learning_rate(step):
    return ops.unfoldable_scalar(schedule(step))

  return learning_rate


def make_optimizer(
  config: ml_collections.ConfigDict, params: Any, schedule: optax.Schedule
) -> optax.GradientTransformation:
  """The full optax chain: clip -> optimizer (with decay mask) -> freeze; with
  ``optimizer.flatten`` the first two run on one flat vector of the parameters."""
  opt = config.optimizer
  check_choice("optimizer.name", opt.name, OPTIMIZERS)
  mask = decay_mask(params, opt.decay_mask)
  if not opt.flatten:  # flat, the updates already share the flat vectors
    schedule = _shared_learning_rate(schedule)
  # A flat vector has no per-leaf mask: the decay term (weight_decay * params, the only use of
  # the parameters in either chain) is given zeros for the parameters the mask spares instead.
  leaf_mask = None if opt.flatten else mask
  if opt.name == "adamw":
    core = optax.adamw(
      schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay, mask=leaf_mask
    )
  else:
    # Coupled L2 decay, as torch.optim.SGD(weight_decay=...) does.
    core = optax.chain(
      optax.add_decayed_weights(opt.weight_decay, mask=leaf_mask),
      optax.sgd(schedule, momentum=opt.momentum or None, nesterov=opt.nesterov),
    )
  parts = [optax.clip_by_global_norm(config.grad_clip_norm)] if config.grad_clip_norm else []
  tx = optax.chain(*parts, core)
  if opt.flatten:
    tx = optax.flatten(tx)
  if config.freeze:
    labels = freeze_labels(params, tuple(config.freeze))
    tx = optax.multi_transform({"trainable": tx, "frozen": optax.set_to_zero()}, labels)
  if opt.flatten:
    tx = _with_params(tx, lambda p: _decay_only(p, mask))
  return tx
