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

N seeds side by side (``config.num_seeds``): no GPU has timed the N-seed step yet, so the kit
model's step grows with the N-seed step's XLA:GPU kernel count against one seed's, compiled for
an H200 without one (``KIT_SEED_KERNELS``), the arithmetic and the feed N times
(``kit_estimate``); the seeds' evaluation, one vmapped pass, grows over one seed's as their step
does (``row_rates``); a model without counts takes N times one seed's step and evaluation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any

import ml_collections

from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import KIT_H200, KIT_SEED_KERNELS
from locvit.platform.flops import xla_flops
from locvit.reproduce.budget import RowCost, measure
from locvit.reproduce.data_checks import check_protocol_data, describe_data
from locvit.reproduce.plans import (
  ReproduceError,
  cadence_words,
  fraction_words,
  official_evaluation,
)
from locvit.run.bundle import training_length
from locvit.workdir.provenance import locvit_commit

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
  config: ml_collections.ConfigDict,
  train_examples: int,
  fraction: float,
  seed: int,
  evaluate_every_epochs: float = 1,
) -> ml_collections.ConfigDict:
  """``config`` from ``seed`` at ``fraction`` of its protocol: its own schedule (shrunk by
  ``fraction``), an evaluation every ``evaluate_every_epochs`` epochs (the official code's
  cadence, whose best evaluation the paper reported) and at the end, and ``CHECKPOINTS_PER_RUN``
  checkpoints (fewer for runs under 5,000 steps)."""
  config = complete_config(config)
  scale_length(config, fraction)
  steps, steps_per_epoch = training_length(config, train_examples)
  config.seed = seed
  config.total_steps = steps  # the plan's steps, whatever the data's length rounds to
  config.eval_every_steps = evaluation_interval(steps_per_epoch, evaluate_every_epochs)
  config.checkpoint_every_steps = max(MIN_CHECKPOINT_STEPS, steps // CHECKPOINTS_PER_RUN)
  config.log_every_steps = max(1, min(config.log_every_steps, steps // 20))
  return config


def evaluation_interval(steps_per_epoch: int, every_epochs: float) -> int:
  """The steps between evaluations every ``every_epochs`` epochs."""
  return max(1, round(steps_per_epoch * every_epochs))


def evaluation_count(steps: int, interval: int) -> int:
  """The evaluations of a ``steps``-step run evaluating every ``interval`` steps and at its end
  (``locvit.run.cadence.is_evaluation_step``)."""
  return steps // interval + (1 if steps % interval else 0)


def _model_shapes(config: ml_collections.ConfigDict):
  """``config``'s model in float32 with attention written out, its variables' shapes (nothing
  allocated) and the shape of one image."""
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
  return model, variables, image


def parameter_count(variables) -> int:
  """The number of parameters in ``variables`` (shapes or arrays)."""
  import jax

  return sum(math.prod(x.shape) for x in jax.tree.leaves(variables.get("params", {})))


def forward_flops(config: ml_collections.ConfigDict) -> tuple[float, int]:
  """(XLA's FLOP count of one image's forward pass, parameter count) of ``config``'s model, from
  its lowering (attention written out, float32; ``locvit.platform.flops.xla_flops``: compiled only
  where the backend counts nothing before compiling, as XLA:GPU)."""
  import jax

  model, variables, image = _model_shapes(config)
  apply = jax.jit(lambda v, x: model.apply(v, x, train=False))
  flops = xla_flops(apply.lower(variables, image))
  if math.isnan(flops):
    raise ReproduceError(
      f"XLA counts no FLOPs for {config.model.name}'s forward pass on {jax.default_backend()}: "
      "estimate the plan with --estimate=probe"
    )
  return flops, parameter_count(variables)


MODEL_SHAPE_FIELDS = {  # what --dry_run prints -> the model fields that hold it, first found
  "depth": ("depth",),
  "width": ("embed_dim", "hidden_dim", "width"),
  "heads": ("num_heads",),
  "patch": ("patch_size", "downsample"),
}


def model_shape(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The depth, width, heads and patch (those the model has) and the parameter count of
  ``config``'s model, from its variables' shapes."""
  model, variables, _ = _model_shapes(config)
  shape = {}
  for name, fields in MODEL_SHAPE_FIELDS.items():
    found = [getattr(model, f) for f in fields if hasattr(model, f)]
    if found:
      shape[name] = found[0]
  return {**shape, "params": parameter_count(variables)}


@dataclasses.dataclass
class KitEstimate:
  """A row's H200 estimate from the kit's figures, and why."""

  images_per_sec: float  # all of its seeds' images
  step_ms: float  # one step of its seeds side by side
  basis: str  # which limit set it: the kit model's step, FLOPs, the loop's step or the feed


def seed_kernels(counts: dict[int, int], seeds: int) -> float:
  """The N-seed step's kernel count for ``seeds`` from ``counts`` (measured N -> kernels):
  measured, linear between the measured N around it, and beyond the largest measured N grown in
  proportion to the seeds (as if each further seed added the kernels the measured step has per
  seed: far more than vmap adds, so an overestimate)."""
  if seeds in counts:
    return counts[seeds]
  largest = max(counts)
  if seeds > largest:
    return counts[largest] * seeds / largest
  below = max(n for n in counts if n < seeds)
  above = min(n for n in counts if n > seeds)
  return counts[below] + (counts[above] - counts[below]) * (seeds - below) / (above - below)


def kernel_scale(kit: str, seeds: int) -> tuple[float, str] | None:
  """(how many times one seed's kernels the ``seeds``-seed step of kit model ``kit`` runs, at
  least 1; in words), from ``KIT_SEED_KERNELS``, or None where they were not counted."""
  counted = KIT_SEED_KERNELS["models"].get(kit)
  if counted is None:
    return None
  kernels, largest = seed_kernels(counted["seeds"], seeds), max(counted["seeds"])
  how = ""  # measured
  if seeds > largest:
    how = f", grown in proportion from {largest} seeds"
  elif seeds not in counted["seeds"]:
    how = ", interpolated"
  words = (
    f"the kit's steps scaled by the {seeds}-seed step's XLA:GPU kernel count against one seed's "
    f"({kernels:,.0f} / {counted['lone']:,} kernels{how}, {counted['measured']}, compiled for an "
    f"{KIT_SEED_KERNELS['device']} without one), the arithmetic and the feed {seeds} times: not a "
    "measured GPU time"
  )
  return max(1.0, kernels / counted["lone"]), words


def kit_estimate(kit: str, batch_size: int, flops_per_image: float, seeds: int = 1) -> KitEstimate:
  """The H200 images/s of a row with ``flops_per_image`` (forward) at ``batch_size``, its
  ``seeds`` seeds side by side, from the kit model ``kit`` (see the module docstring). The kit
  found these steps bound by their kernels' count: the N-seed step takes the kit model's step
  scaled by the N-seed step's kernels against one seed's (``kernel_scale``; never below one
  seed's), at least N seeds' arithmetic, and trains no faster than the kit's feed."""
  model = KIT_H200["models"][kit]
  # The kit found these steps latency-bound: a step takes at least what the model's took,
  # whatever the batch, and at least what a measured training loop's took.
  many = seeds > 1
  counted = kernel_scale(kit, seeds) if many else None  # one seed trains with the lone step
  scale = counted[0] if counted else float(seeds)
  compute_ms = seeds * 3 * flops_per_image * batch_size / (KIT_H200["compute_tflops"] * 1e12) * 1e3
  limits = [  # (step ms, why)
    (
      model["step_ms"] * scale,
      f"the kit's {model['config']} step ({model['step_ms']} ms at batch {model['batch']})"
      + (f" x {scale:.2f}" if many else ""),
    ),
    (
      compute_ms,
      (f"{seeds} seeds x " if many else "")
      + f"3 x {flops_per_image / 1e9:.2f} GFLOP/image at {KIT_H200['compute_tflops']:.0f} TFLOP/s",
    ),
    (
      seeds * batch_size / model["fed_images_per_sec"] * 1e3,
      f"the kit's feed of {model['recipe']} ({model['fed_images_per_sec']:,} img/s)"
      + (f" for {seeds} seeds' batches" if many else ""),
    ),
  ]
  if "loop_step_ms" in model:
    loop_ms, resident_ms = model["loop_step_ms"], model["loop_resident_step_ms"]
    # The loop's step above its resident step is host feeding, checkpoints and the augmentation
    # around the step: work per seed's batch and state, which the kernel count of the step does
    # not see. Each further seed adds all of it (how much is per step rather than per seed was
    # not measured); only the resident step grows with the kernels.
    side_by_side_ms = resident_ms * (scale - 1) + (loop_ms - resident_ms) * (seeds - 1)
    limits.append(
      (
        loop_ms + side_by_side_ms,
        f"a GPU training loop's step ({loop_ms:.1f} ms at batch {model['loop_batch']}, its "
        f"training split fed by the {model['loop_split_on']})"
        + (f", fed {seeds} seeds, its resident {resident_ms} ms x {scale:.2f}" if many else ""),
      )
    )
  step_ms, basis = max(limits, key=lambda limit: limit[0])
  if many:
    basis += f"; {seeds} seeds side by side: " + (
      counted[1]
      if counted
      else f"{seeds} times one seed's step (an upper bound: no kernel count of this model's "
      "N-seed step is recorded)"
    )
  return KitEstimate(seeds * batch_size / step_ms * 1e3, step_ms, basis)


def fit_fraction(per_run_seconds: dict[str, tuple[float, float]], seeds: int, seconds: float):
  """The largest fraction (at most 1, rounded down to 3 decimals, as stated in titles) whose runs
  fit ``seconds``: ``per_run_seconds`` maps each row to (overhead, training seconds at the full
  protocol)."""
  overhead = seeds * sum(o for o, _ in per_run_seconds.values())
  training = seeds * sum(t for _, t in per_run_seconds.values())
  return min(1.0, max(0.0, math.floor(1000 * (seconds - overhead) / training) / 1000))


# The kit timed bf16 steps (KIT_H200); a float32 row does the same work in slower arithmetic.
FLOAT32_UNDERESTIMATE = "; the kit timed bf16 steps and this row trains in float32: likely low"


def row_rates(
  row: str, spec: dict[str, Any], full, cost: RowCost | None, test_examples: int, seeds: int = 1
) -> dict[str, Any]:
  """A row's step seconds, seconds per run outside training and seconds per evaluation, for its
  ``seeds`` seeds side by side: measured by a probe of them here (``cost``) or from the kit's H200
  figures (``kit_estimate``), where an evaluation (the forward pass alone) is taken as a third of
  a training step's work per image, as the FLOP estimate counts a training step as 3 forward
  passes: for N seeds, of their N-seed step, since they evaluate in one vmapped pass as they
  train in one step (``locvit.run.evaluation.make_eval_step(over_seeds=True)``), so their
  evaluation grows over one seed's as their step does. Not counted on its own: the evaluation's
  kernels (the same layers, vmapped alike) and its feed, which reads a test batch once for all
  seeds where the step feeds each seed's batch (an overestimate where the feed binds)."""
  if cost is not None:
    return {
      "basis": "probe",
      "step_seconds": 1 / cost.steps_per_sec,
      "overhead_sec": cost.overhead_sec,
      "eval_sec": cost.eval_sec,
    }
  if "kit" not in spec:
    raise ReproduceError(
      f"row {row!r} has no accelerator-kit figures: estimate it with --estimate=probe"
    )
  flops, params = forward_flops(full)
  kit = kit_estimate(spec["kit"], full.batch_size, flops, seeds)
  return {
    "basis": kit.basis + ("" if full.mixed_precision else FLOAT32_UNDERESTIMATE),
    "params": params,
    "gflops": flops / 1e9,
    "step_seconds": kit.step_ms / 1e3,
    "overhead_sec": KIT_H200["models"][spec["kit"]]["compile_s"],
    "eval_sec": test_examples / full.batch_size * kit.step_ms / 1e3 / 3,
  }


def protocol_estimate(
  plan, configs, seeds, minutes, fraction, costs=None, spent=0.0
) -> tuple[dict[str, dict[str, Any]], float, float, str]:
  """Per row (model, batch, epochs, steps, evaluations, images, images/s, seconds per run) at
  ``fraction`` ('fit': the largest that fits ``minutes``), the fraction, the total seconds and the
  source of the rates: ``costs`` (a probe here, ``RowCost`` per row) or the kit's H200 figures.
  A run's seconds count its training steps, its evaluations and its compilation."""
  import jax

  every = official_evaluation(plan)["every_epochs"]
  rows = {}
  for row, config in configs.items():
    spec, full = plan["rows"][row], complete_config(config)
    full_steps, steps_per_epoch = protocol_steps(full, spec["paper_train_examples"], 1.0)
    info = {"model": full.model.name, "batch_size": full.batch_size, "full_steps": full_steps}
    info["paper_epochs"], info["full_epochs"] = spec["paper_epochs"], full.num_epochs
    cost = None if costs is None else costs[row]
    info.update(row_rates(row, spec, full, cost, plan["paper_test_examples"], seeds))
    info.update(shape=model_shape(full), data=describe_data(full), precision=precision(full))
    info["images_per_sec"] = seeds * full.batch_size / info["step_seconds"]
    info["eval_interval"] = evaluation_interval(steps_per_epoch, every)
    full_evaluations = evaluation_count(full_steps, info["eval_interval"])
    info["full_training_sec"] = (
      full_steps * info["step_seconds"] + full_evaluations * info["eval_sec"]
    )
    rows[row] = info
  if fraction == "fit":
    fraction = fitting_fraction(rows, minutes, spent)
  total = 0.0
  for row, info in rows.items():
    steps, _ = protocol_steps(configs[row], plan["rows"][row]["paper_train_examples"], fraction)
    evaluations = evaluation_count(steps, info["eval_interval"])
    info.update(
      steps=steps,
      epochs=info["full_epochs"] * fraction,
      images=steps * info["batch_size"],
      evaluations=evaluations,
    )
    info["seconds_per_run"] = (
      info["overhead_sec"] + steps * info["step_seconds"] + evaluations * info["eval_sec"]
    )
    total += info["seconds_per_run"]  # the row's seeds side by side: one run
  source = (
    f"a probe on this machine ({jax.devices()[0].device_kind})"
    if costs is not None
    else f"the accelerator kit's {KIT_H200['device']} figures of {KIT_H200['date']} "
    f"({KIT_H200['source']})"
  )
  return rows, fraction, total, source


def precision(config: ml_collections.ConfigDict) -> str:
  """The row's arithmetic, in words."""
  if config.mixed_precision:
    return "bf16 compute, fp32 parameters (mixed_precision)"
  return "fp32"


def fitting_fraction(rows: dict[str, dict[str, Any]], minutes, spent: float) -> float:
  """``--fraction=fit``: the largest fraction whose runs fit ``minutes`` after ``spent`` seconds;
  refused when the runs' fixed costs alone do not fit."""
  per_run = {row: (r["overhead_sec"], r["full_training_sec"]) for row, r in rows.items()}
  fraction = fit_fraction(per_run, 1, (minutes or 0) * 60 - spent)
  if fraction <= 0:
    overhead = sum(o for o, _ in per_run.values())
    raise ReproduceError(
      f"--minutes={minutes:g} leaves no time to train: the runs' compilation alone takes an "
      f"estimated {overhead / 60:.1f} minutes"
      + (f", after {spent / 60:.1f} minutes of probing" if spent else "")
    )
  return fraction


def describe_protocol(plan, rows, fraction, seeds, total, source) -> str:
  """The protocol plan as printed: a table of the rows (model, batch, epochs, images and the
  estimate), then each row in full: the model's shape, its data and their format, precision,
  batch, length, evaluations, the paper's number with its table, and the estimate."""
  lines = [f"{plan['title']}, at {fraction_words(fraction)}", ""]
  if plan.get("note"):
    lines += [plan["note"], ""]
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
    lines += row_details(plan, row, r)
  lines.append(
    f"Estimated wall time {total / 60:.1f} minutes for {_runs(len(rows), seeds)}, compilation and "
    f"evaluations included, from {source}."
  )
  return "\n".join(lines)


def shape_words(shape: dict[str, Any]) -> str:
  """'depth 9, width 192, 12 heads, patch 4, 2.70M parameters' (the fields the model has)."""
  words = [f"{name} {shape[name]}" for name in ("depth", "width") if name in shape]
  words += [f"{shape['heads']} heads"] if "heads" in shape else []
  words += [f"patch {shape['patch']}"] if "patch" in shape else []
  return ", ".join([*words, f"{shape['params'] / 1e6:.2f}M parameters"])


def row_details(plan: dict[str, Any], row: str, r: dict[str, Any]) -> list[str]:
  """One row of the plan in full, as ``--dry_run`` prints it before a GPU is booked."""
  spec, evaluation = plan["rows"][row], official_evaluation(plan)
  paper = spec["paper_top1"]
  table = spec.get("paper_table") or plan.get("paper_table") or "no table"
  paper_words = (
    f"{100 * paper:.2f}% top-1 ({table}; the {evaluation['paper_reports']} evaluation its code "
    "reported)"
    if paper is not None
    else "no number"
  )
  every = evaluation["every_epochs"]
  lines = [
    f"{row}: {r['model']}: {shape_words(r['shape'])}",
    f"  data: {r['data']}",
    f"  precision: {r['precision']}; batch {r['batch_size']}; {r['epochs']:.4g} epochs "
    f"({r['steps']:,} steps)",
    f"  evaluations: {r['evaluations']} ({cadence_words(every)} and at the end: the official "
    f"code's, {evaluation['code']})",
    f"  paper: {paper_words}",
    f"  estimate: {r['seconds_per_run'] / 60:.1f} minutes per run ({r['eval_sec']:.1f} s per "
    "evaluation)"
    + (
      ""
      if r["basis"] == "probe"
      else f"; {r['gflops']:.2f} GFLOP forward per image, rate set by {r['basis']}"
    ),
  ]
  return lines


def _runs(count: int, seeds: int) -> str:
  """'2 runs (seed 0)' or '2 runs of 3 seeds side by side (seeds 0, 1, 2)'."""
  runs = f"{count} run{'s' if count != 1 else ''}"
  if seeds == 1:
    return f"{runs} (seed 0)"
  return f"{runs} of {seeds} seeds side by side (seeds {', '.join(map(str, range(seeds)))})"


def side_by_side(configs: dict[str, ml_collections.ConfigDict], seeds: int):
  """``configs`` training ``seeds`` seeds side by side (``config.num_seeds``)."""
  configs = {row: complete_config(config) for row, config in configs.items()}
  for config in configs.values():
    config.num_seeds = seeds
  return configs


def check_fits(name: str, total: float, minutes: float | None, spent: float, rows, seeds) -> None:
  """Refuses a protocol plan whose estimate (``total`` seconds) does not fit ``minutes``."""
  available = (minutes or 0) * 60 - spent
  if minutes is None or total <= available:
    return
  per_run = {row: (r["overhead_sec"], r["full_training_sec"]) for row, r in rows.items()}
  fits = fit_fraction(per_run, 1, available)
  raise ReproduceError(
    f"plan {name!r} needs an estimated {total / 60:.1f} minutes for {_runs(len(rows), seeds)} "
    f"but --minutes={minutes:g}"
    + (f" leaves {available / 60:.1f} after probing" if spent else "")
    + f"; give more --minutes, fewer --seeds, or --fraction (at most {fits:.3f} of this length "
    "fits; --fraction=fit picks it)"
  )


def make_protocol_plan(
  name, plan, configs, workdir, seeds, minutes, fraction, started, probe_here=True, lossy=False
):
  """Probes each row here (or takes the kit's H200 figures), fits ``fraction`` and refuses a plan
  that does not fit ``minutes``, a dataset of another size than the paper's, or (unless ``lossy``,
  ``--allow_lossy_data``) a JPEG copy of it."""
  lossy = check_protocol_data(plan, configs, lossy)
  costs = None
  if probe_here:
    costs = measure(side_by_side(configs, seeds), os.path.join(workdir, "_probe"))
  spent = time.time() - started if probe_here else 0.0  # the budget counts the probe's minutes
  rows, fraction, total, source = protocol_estimate(
    plan, configs, seeds, minutes, fraction, costs, spent
  )
  print(describe_protocol(plan, rows, fraction, seeds, total, source), flush=True)
  check_fits(name, total, minutes, spent, rows, seeds)
  if costs is None:
    costs = {
      row: RowCost(
        steps_per_sec=1 / r["step_seconds"],
        overhead_sec=r["overhead_sec"],
        steps_per_epoch=round(r["full_steps"] / r["full_epochs"]),
        batch_size=r["batch_size"],
        eval_sec=r["eval_sec"],
      )
      for row, r in rows.items()
    }
  return {
    "plan": name,
    "protocol": True,
    "fraction": fraction,
    "seeds": seeds,
    "side_by_side": seeds > 1,  # each row's seeds in one run (config.num_seeds), DIR/ROW/seedK
    "row_names": list(configs),
    "minutes": minutes,
    "started": started,
    "estimate_source": source,
    "load_at_probe": os.getloadavg(),
    "locvit_commit": locvit_commit(),
    "estimated_minutes": total / 60,
    "data": describe_data(next(iter(configs.values()))),
    "lossy_data": lossy,
    "evaluation": official_evaluation(plan),
    "rows": {
      row: {
        **dataclasses.asdict(costs[row]),
        "steps": rows[row]["steps"],
        "evaluations": rows[row]["evaluations"],
      }
      for row in configs
    },
  }
