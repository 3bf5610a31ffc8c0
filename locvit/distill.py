"""DeiT-style knowledge distillation (Touvron et al. 2021, "Distillation through attention"), as in
ConViT appendix B.

The student is a ``VisionTransformer`` with ``distilled=True``: a distillation token beside the
class token and a second head, both heads' logits returned in training (``distilled_training``).
The teacher is any registered locvit model restored from a training run's checkpoint; it runs
frozen (``train=False``, no gradient) inside the same jitted step, on the same augmented images
the student sees. Losses (``distillation.type``):

- 'hard' (DeiT Eq. 3): ``(1 - alpha) CE(class head, targets) + alpha CE(dist head, argmax teacher)``
  with ``alpha = 1/2``;
- 'soft' (DeiT Eq. 2): ``(1 - alpha) CE(class head, targets)
  + alpha tau^2 KL(softmax(teacher / tau) || softmax(dist / tau))``, the KL summed over classes and
  divided by ``batch x classes`` as DeiT's code does (``reduction='sum' / numel``).

``targets`` are the (mixed, smoothed) soft targets of the class head. At evaluation the student
returns the two heads' averaged logits, as DeiT's code does, or the log of their averaged softmaxes,
as the DeiT paper's text says (``VisionTransformer.distilled_inference``).

Config (``config.distillation``)::

  type            'none' | 'hard' | 'soft'
  teacher_workdir the teacher run's --workdir (its latest checkpoint, or teacher_step)
  teacher_step    -1: latest
  teacher_model   '' : the model the teacher run was trained with (from its checkpoint metadata)
  alpha, tau      loss weight of the distillation head and the soft-distillation temperature
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging

# Plain data beside the shipped configs (which must not import JAX); the library names stay.
from locvit.models import create_model
from locvit.models.factory import distillation_enabled
from locvit.platform import sharding
from locvit.workdir import restore

Array = jax.Array
TYPES = ("none", "hard", "soft")


# Whether distillation is on; defined beside ``build_model``, which adds the distillation token.
enabled = distillation_enabled


def check_distillation_config(config: ml_collections.ConfigDict) -> None:
  """Checks the distillation block before anything is built; errors name the field."""
  dist = config.distillation
  if dist is None:
    return
  if dist.type not in TYPES:
    raise ValueError(f"distillation.type={dist.type!r} is not one of {TYPES}")
  if dist.type == "none":
    return
  if not dist.teacher_workdir:
    raise ValueError(
      f"distillation.type={dist.type!r} needs distillation.teacher_workdir: the --workdir of a "
      "finished locvit training run of the teacher (any registered model)."
    )
  if not 0 <= dist.alpha <= 1:
    raise ValueError(f"distillation.alpha={dist.alpha!r} must be in [0, 1]")
  if not dist.tau > 0:
    raise ValueError(f"distillation.tau={dist.tau!r} must be > 0")


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A frozen teacher: the module, its variables ``(params, model_state)`` and their shardings."""

  model: nn.Module
  variables: tuple[Any, Any]
  shardings: tuple[Any, Any]
  step: int


def load_teacher(
  config: ml_collections.ConfigDict,
  num_classes: int,
  image_shape: tuple[int, ...],
  mesh: jax.sharding.Mesh,
  rules: Any,
) -> Teacher:
  """Rebuilds the teacher from its run's checkpoint metadata and restores it, sharded."""
  dist = config.distillation
  workdir = dist.teacher_workdir
  step = None if dist.teacher_step < 0 else dist.teacher_step
  saved = restore.saved_model_config(workdir, step)
  name = dist.teacher_model or saved["name"]
  overrides = dict(saved.get("overrides") or {}) if not dist.teacher_model else {}
  overrides.update(dict(dist.teacher_overrides or {}))
  if config.mixed_precision:
    overrides["dtype"] = jnp.bfloat16
  model = create_model(name, num_classes=num_classes, **overrides)
  boxed = sharding.model_variable_shapes(model, image_shape)
  shardings = tuple(sharding.tree_shardings(b, mesh, rules) for b in boxed)
  try:
    params, model_state, step = restore.restore_model_variables(
      workdir, model, image_shape, step=step, shardings=shardings
    )
  except ValueError as e:  # orbax: the saved tree does not fit the rebuilt model
    raise ValueError(
      f"The teacher checkpoint in {workdir} does not fit model {name!r} with {num_classes} "
      f"classes at image shape {image_shape}: {e}"
    ) from e
  logging.info("Teacher %s restored from %s (step %d).", name, workdir, step)
  return Teacher(model, (params, model_state), shardings, step)


def teacher_logits(teacher: Teacher | None, variables: Any, images: Array) -> Array | None:
  """Frozen teacher logits for the (augmented) batch; no gradient flows into the teacher."""
  if teacher is None:
    return None
  params, model_state = variables
  logits = teacher.model.apply({"params": params, **model_state}, images, train=False)
  return jax.lax.stop_gradient(logits.astype(jnp.float32))


def distillation_loss(
  student_logits: Array, dist_logits: Array, targets: Array, teacher: Array, dist: Any
) -> Array:
  """The DeiT objective for one batch, a scalar: ``(1 - alpha) CE(student_logits, targets)
  + alpha KD`` with KD the hard-label CE of ``dist_logits`` against the teacher's argmax ('hard')
  or the ``tau^2``-scaled KL ('soft'); see the module docstring."""
  base = jnp.mean(optax.softmax_cross_entropy(student_logits, targets))
  if dist.type == "hard":
    kd = jnp.mean(
      optax.softmax_cross_entropy_with_integer_labels(dist_logits, jnp.argmax(teacher, -1))
    )
  else:
    tau = dist.tau
    log_p_student = jax.nn.log_softmax(dist_logits / tau)
    log_p_teacher = jax.nn.log_softmax(teacher / tau)
    kl = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student))
    kd = kl * tau * tau / dist_logits.size
  return (1.0 - dist.alpha) * base + dist.alpha * kd
