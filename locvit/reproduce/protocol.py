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
import os
import time
from typing import Any

import ml_collections

from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import KIT_H200
from locvit.platform.flops import xla_flops
from locvit.reproduce.budget import RowCost, measure
from locvit.reproduce.data_checks import check_protocol_data, describe_data
from locvit.reproduce.plans import ReproduceError, fraction_words
from locvit.run.bundle import training_length
from locvit.workdir.provenance import locvit_commit

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


def protocol_estimate(
  plan, configs, seeds, minutes, fraction, costs=None, spent=0.0
) -> tuple[dict[str, dict[str, Any]], float, float, str]:
  """Per row (model, batch, epochs, steps, images, images/s, seconds per run) at ``fraction``
  ('fit': the largest that fits ``minutes``), the fraction, the total seconds and the source of
  the rates: ``costs`` (a probe here, ``RowCost`` per row) or the kit's H200 figures."""
  import jax

  rows, per_run = {}, {}
  for row, config in configs.items():
    spec, full = plan["rows"][row], complete_config(config)
    n = spec["paper_train_examples"]
    full_steps, _ = protocol_steps(full, n, 1.0)
    info = {"model": full.model.name, "batch_size": full.batch_size, "full_steps": full_steps}
    info["paper_epochs"], info["full_epochs"] = spec["paper_epochs"], full.num_epochs
    if costs is not None:
      step_seconds, overhead = 1 / costs[row].steps_per_sec, costs[row].overhead_sec
      info["basis"] = "probe"
    elif "kit" not in spec:
      raise ReproduceError(
        f"row {row!r} has no accelerator-kit figures: estimate it with --estimate=probe"
      )
    else:
      flops, params = forward_flops(full)
      kit = kit_estimate(spec["kit"], full.batch_size, flops)
      step_seconds = full.batch_size / kit.images_per_sec
      overhead = KIT_H200["models"][spec["kit"]]["compile_s"]
      info.update(basis=kit.basis, params=params, gflops=flops / 1e9)
    info["images_per_sec"] = full.batch_size / step_seconds
    info["overhead_sec"], info["full_training_sec"] = overhead, full_steps * step_seconds
    per_run[row] = (overhead, full_steps * step_seconds)
    rows[row] = info
  if fraction == "fit":
    fraction = fit_fraction(per_run, seeds, (minutes or 0) * 60 - spent)
    if fraction <= 0:
      overhead = seeds * sum(o for o, _ in per_run.values())
      raise ReproduceError(
        f"--minutes={minutes:g} leaves no time to train: the runs' compilation and evaluation "
        f"alone take an estimated {overhead / 60:.1f} minutes"
        + (f", after {spent / 60:.1f} minutes of probing" if spent else "")
      )
  total = 0.0
  for row, info in rows.items():
    steps, _ = protocol_steps(configs[row], plan["rows"][row]["paper_train_examples"], fraction)
    info.update(
      steps=steps, epochs=info["full_epochs"] * fraction, images=steps * info["batch_size"]
    )
    info["seconds_per_run"] = (
      info["overhead_sec"] + info["full_training_sec"] * steps / info["full_steps"]
    )
    total += seeds * info["seconds_per_run"]
  source = (
    f"a probe on this machine ({jax.devices()[0].device_kind})"
    if costs is not None
    else f"the accelerator kit's {KIT_H200['device']} figures of {KIT_H200['date']} "
    f"({KIT_H200['source']})"
  )
  return rows, fraction, total, source


def describe_protocol(title, rows, fraction, seeds, total, source) -> str:
  """The protocol plan as printed: per row the model, batch, epochs, images and the estimate."""
  lines = [f"{title}, at {fraction_words(fraction)}", ""]
  lines.append(
    f"{'row':<14} {'model':<32} {'seeds':>5} {'batch':>5} {'epochs':>7} {'paper epochs':>12} "
    f"{'steps':>7} {'images per run':>14} {'img/s':>7} {'min/run':>7}"
  )
  for row, r in rows.items():
    lines.append(
      f"{row:<14} {r['model']:<32} {seeds:>5} {r['batch_size']:>5} {r['epochs']:>7.4g} "
      f"{r['paper_epochs']:>12} {r['steps']:>7} {r['images']:>14,} {r['images_per_sec']:>7,.0f} "
      f"{r['seconds_per_run'] / 60:>7.1f}"
    )
  lines.append("")
  for row, r in rows.items():
    if r.get("basis") not in (None, "probe"):
      lines.append(
        f"{row}: {r['params'] / 1e6:.2f}M parameters, {r['gflops']:.2f} GFLOP forward per image; "
        f"rate set by {r['basis']}"
      )
  lines.append(
    f"Estimated wall time {total / 60:.1f} minutes for {_runs(seeds * len(rows))} (seed"
    f"{'s' if seeds > 1 else ''} {', '.join(map(str, range(seeds)))}), compilation included, "
    f"from {source}."
  )
  return "\n".join(lines)


def _runs(count: int) -> str:
  return f"{count} run{'s' if count != 1 else ''}"


def check_fits(name: str, total: float, minutes: float | None, spent: float, rows, seeds) -> None:
  """Refuses a protocol plan whose estimate (``total`` seconds) does not fit ``minutes``."""
  available = (minutes or 0) * 60 - spent
  if minutes is None or total <= available:
    return
  per_run = {row: (r["overhead_sec"], r["full_training_sec"]) for row, r in rows.items()}
  fits = fit_fraction(per_run, seeds, available)
  raise ReproduceError(
    f"plan {name!r} needs an estimated {total / 60:.1f} minutes for {_runs(seeds * len(rows))} "
    f"but --minutes={minutes:g}"
    + (f" leaves {available / 60:.1f} after probing" if spent else "")
    + f"; give more --minutes, fewer --seeds, or --fraction (at most {fits:.3f} of this length "
    "fits; --fraction=fit picks it)"
  )


def make_protocol_plan(
  name, plan, configs, workdir, seeds, minutes, fraction, started, probe_here=True
):
  """Probes each row here (or takes the kit's H200 figures), fits ``fraction`` and refuses a plan
  that does not fit ``minutes`` or a dataset of another size than the paper's."""
  check_protocol_data(plan, configs)
  costs = measure(configs, os.path.join(workdir, "_probe")) if probe_here else None
  spent = time.time() - started if probe_here else 0.0  # the budget counts the probe's minutes
  rows, fraction, total, source = protocol_estimate(
    plan, configs, seeds, minutes, fraction, costs, spent
  )
  print(describe_protocol(plan["title"], rows, fraction, seeds, total, source), flush=True)
  check_fits(name, total, minutes, spent, rows, seeds)
  if costs is None:
    costs = {
      row: RowCost(
        steps_per_sec=r["images_per_sec"] / r["batch_size"],
        overhead_sec=r["overhead_sec"],
        steps_per_epoch=round(r["full_steps"] / r["full_epochs"]),
        batch_size=r["batch_size"],
      )
      for row, r in rows.items()
    }
  return {
    "plan": name,
    "protocol": True,
    "fraction": fraction,
    "seeds": seeds,
    "row_names": list(configs),
    "minutes": minutes,
    "started": started,
    "estimate_source": source,
    "load_at_probe": os.getloadavg(),
    "locvit_commit": locvit_commit(),
    "estimated_minutes": total / 60,
    "data": describe_data(next(iter(configs.values()))),
    "rows": {
      row: {**dataclasses.asdict(costs[row]), "steps": rows[row]["steps"]} for row in configs
    },
  }
