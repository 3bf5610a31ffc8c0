"""Paper-protocol plans: every row at its paper's own length (or a stated fraction of it).

A budget plan (the reduced ones) splits ``--minutes`` into equal steps per row. A protocol plan
instead trains each row's shipped table config as the paper did -- model, data, recipe, batch,
schedule and epochs -- and ``--minutes`` only decides whether it may start: a plan whose estimate
does not fit is refused with the estimate. ``--fraction=F`` trains every row for F of its
epochs with its schedule (warmup, cosine or step boundaries) shrunk by the same F, so the run
is a complete, shorter run rather than the first F of a long one.

The estimate comes from a short probe on this machine's device, or (``--dry_run`` alone) from
what the accelerator kit measured on an H200 (``locvit.configs.reproduce_plans.KIT_H200``): a
row's step takes the longer of the kit model's step (the kit found these small steps latency-
bound), the row's training FLOPs (3 x XLA's count of its forward pass) at the best rate the
kit achieved and, where a paper-protocol run trained on the GPU, that whole loop's step; and a
row trains no faster than the kit fed its recipe from the JPEG folders.
"""

from __future__ import annotations

import dataclasses
import math

import ml_collections

from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import KIT_H200
from locvit.platform.flops import xla_flops
from locvit.run.bundle import training_length


class ReproduceError(ValueError):
  """A problem the user fixes (unknown plan, missing data, budget too small): one clear line."""


EVALUATIONS_PER_RUN = 10  # the run's own curve, to read an ordering against
CHECKPOINTS_PER_RUN = 50  # a run moved to another machine loses at most 2% of itself...
MIN_CHECKPOINT_STEPS = 1000  # ...or 1,000 steps: 15 s of an H200's 15 ms CIFAR step, as a save
# every 128 steps took a tenth of the time there (a stop signal saves at once in any case)


def scale_length(config: ml_collections.ConfigDict, fraction: float) -> None:
  """Shrinks the epochs, the warmup and any step-schedule boundaries by ``fraction``."""
  if fraction == 1:
    return
  config.num_epochs = config.num_epochs * fraction
  schedule = config.schedule
  schedule.warmup_epochs = schedule.warmup_epochs * fraction
  if schedule.get("warmup_steps"):
    schedule.warmup_steps = max(1, round(schedule.warmup_steps * fraction))
  if schedule.get("boundaries_epochs"):
    schedule.boundaries_epochs = tuple(e * fraction for e in schedule.boundaries_epochs)


def protocol_steps(
  config: ml_collections.ConfigDict, train_examples: int, fraction: float
) -> tuple[int, int]:
  """(steps, steps per epoch) of ``config`` at ``fraction`` of its protocol."""
  config = complete_config(config)
  scale_length(config, fraction)
  return training_length(config, train_examples)


def protocol_config(
  config: ml_collections.ConfigDict, train_examples: int, fraction: float, seed: int
) -> ml_collections.ConfigDict:
  """``config`` from ``seed`` at ``fraction`` of its protocol: its own schedule (shrunk by
  ``fraction``), ``EVALUATIONS_PER_RUN`` evaluations and ``CHECKPOINTS_PER_RUN`` checkpoints
  (fewer for runs under 5,000 steps)."""
  config = complete_config(config)
  scale_length(config, fraction)
  steps, _ = training_length(config, train_examples)
  config.seed = seed
  config.total_steps = steps  # the plan's steps, whatever the data's length rounds to
  config.eval_every_steps = max(1, steps // EVALUATIONS_PER_RUN)
  config.checkpoint_every_steps = max(MIN_CHECKPOINT_STEPS, steps // CHECKPOINTS_PER_RUN)
  config.log_every_steps = max(1, min(config.log_every_steps, steps // 20))
  return config


def forward_flops(config: ml_collections.ConfigDict) -> tuple[float, int]:
  """(XLA's FLOP count of one image's forward pass, parameter count) of ``config``'s model, from
  its lowering (attention written out, float32; ``locvit.platform.flops.xla_flops``: compiled only
  where the backend counts nothing before compiling, as XLA:GPU)."""
  import jax
  import jax.numpy as jnp

  from locvit.models.factory import build_model

  config = complete_config(config)
  config.mixed_precision = False
  model = build_model(config, config.data.num_classes)
  if hasattr(model, "attention_implementation"):
    model = model.clone(attention_implementation="xla")
  size = config.data.image_size
  image = jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32)
  variables = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), image)
  apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
  flops = xla_flops(apply.lower(variables, image))
  if math.isnan(flops):
    raise ReproduceError(
      f"XLA counts no FLOPs for {config.model.name}'s forward pass on {jax.default_backend()}: "
      "estimate the plan with --estimate=probe"
    )
  params = sum(math.prod(x.shape) for x in jax.tree.leaves(variables.get("params", {})))
  return flops, params


@dataclasses.dataclass
class KitEstimate:
  """A row's H200 estimate from the kit's figures, and why."""

  images_per_sec: float
  step_ms: float
  basis: str  # which limit set it: the kit model's step, FLOPs, or the feed


def kit_estimate(kit: str, batch_size: int, flops_per_image: float) -> KitEstimate:
  """The H200 images/s of a row with ``flops_per_image`` (forward) at ``batch_size``, from the
  kit model ``kit`` (see the module docstring)."""
  model = KIT_H200["models"][kit]
  compute_ms = 3 * flops_per_image * batch_size / (KIT_H200["compute_tflops"] * 1e12) * 1e3
  # The kit found these steps latency-bound: a step takes at least what the model's took,
  # whatever the batch, and at least what a measured training loop's took.
  limits = [  # (step ms, why)
    (
      model["step_ms"],
      f"the kit's {model['config']} step ({model['step_ms']} ms at batch {model['batch']})",
    ),
    (
      compute_ms,
      f"3 x {flops_per_image / 1e9:.2f} GFLOP/image at {KIT_H200['compute_tflops']:.0f} TFLOP/s",
    ),
  ]
  if "loop_step_ms" in model:
    loop_ms = model["loop_step_ms"]
    limits.append(
      (
        loop_ms,
        f"a GPU training loop's step ({loop_ms:.1f} ms at batch {model['loop_batch']}, its "
        f"training split fed by the {model['loop_split_on']})",
      )
    )
  step_ms, basis = max(limits, key=lambda limit: limit[0])
  images_per_sec = batch_size / step_ms * 1e3
  if images_per_sec > model["fed_images_per_sec"]:
    images_per_sec = model["fed_images_per_sec"]
    basis = f"the kit's feed of {model['recipe']} ({model['fed_images_per_sec']:,} img/s)"
  return KitEstimate(images_per_sec, step_ms, basis)


def fit_fraction(per_run_seconds: dict[str, tuple[float, float]], seeds: int, seconds: float):
  """The largest fraction (at most 1, rounded down to 3 decimals, as stated in titles) whose runs
  fit ``seconds``: ``per_run_seconds`` maps each row to (overhead, training seconds at the full
  protocol)."""
  overhead = seeds * sum(o for o, _ in per_run_seconds.values())
  training = seeds * sum(t for _, t in per_run_seconds.values())
  return min(1.0, max(0.0, math.floor(1000 * (seconds - overhead) / training) / 1000))


def describe_data(config: ml_collections.ConfigDict) -> str:
  """What the row trains on, in words: the papers used the original CIFAR-10."""
  data = complete_config(config).data
  if data.source == "image_folder":
    return (
      f"the CIFAR-10 JPEG copy (image folder {data.root or '$CIFAR10_ROOT'}, quality 75, "
      f"{data.train_fraction:.0%} of the training set): the papers trained on the original "
      "CIFAR-10, and the JPEG copy costs some accuracy"
    )
  if data.source == "tfds":
    return f"TFDS {data.name} (the original images)"
  if data.source == "digits":
    return "scikit-learn's 8x8 digits"
  return f"{data.name} ({data.source})"
