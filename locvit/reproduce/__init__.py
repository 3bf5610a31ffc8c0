"""Reproduce a paper table in one command, within a time budget.

  python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]
  python -m locvit.reproduce PLAN --dry_run [--estimate=probe] [--minutes=M] [--fraction=F]
  python -m locvit.reproduce PLAN --workdir=DIR --pack=FILE

A plan (``locvit.configs.reproduce_plans.PLANS``) names the rows of one table as shipped configs.
The command measures each row's step rate here (a short probe run, compilation excluded), gives
every row the same number of optimizer steps so that all runs fit in the budget, fits each run's
warmup and cosine schedule to that step count, prints the plan and its estimated end, then trains
the runs seed by seed, alternating rows (so a cut-short budget still leaves paired seeds). Each
run is an ordinary locvit workdir, ``DIR/ROW/seedK``. ``DIR/plan.json`` keeps the plan: running the
command again skips finished runs and resumes interrupted ones. Ctrl-C saves a checkpoint at the
end of the current step and leaves everything resumable. At the end (or with ``--report``) DIR gets
``results.md`` and ``results.json`` (``locvit.reproduce.report``).

Paper-protocol plans (``gmm_table1_cifar10``, ``structinit_table2_cifar10``,
``cordonnier_table1``; ``locvit.reproduce.protocol``) train every row at the paper's own length, or
``--fraction`` of it, and are refused when their estimate does not fit ``--minutes``. A run
survives its machine: copy DIR to another machine (or ``--pack`` it: each run's newest checkpoint
only) and run the same command there; it continues from the last checkpoint. ``--dry_run`` prints
the plan and its estimate and creates nothing.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import importlib
import json
import math
import os
import shutil
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import ml_collections

from locvit import metrics as metrics_lib
from locvit.choices import ArgumentParser
from locvit.configs import datasets
from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import KIT_H200, PLANS
from locvit.data.config import parse_split
from locvit.platform import cpu_malloc
from locvit.reproduce import protocol
from locvit.reproduce.protocol import ReproduceError
from locvit.run import preemption
from locvit.workdir.provenance import locvit_commit

PROBE_STEPS = 8
DATA_HELP = "docs/data_preparation.md"


# ------------------------------------------------------------------------------------------------
# Configs of a plan


def get_plan(name: str) -> dict[str, Any]:
  """The shipped plan ``name`` from ``locvit.configs.reproduce_plans.PLANS``.

  An unknown name raises ``ReproduceError`` listing the valid names.
  """
  if name not in PLANS:
    close = difflib.get_close_matches(name, PLANS, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    raise ReproduceError(f"unknown plan {name!r}; {hint}valid plans: {', '.join(sorted(PLANS))}")
  return PLANS[name]


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets ``config.a.b.c = value`` for ``key='a.b.c'`` (a row's override)."""
  *parents, leaf = key.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def row_config(row: dict[str, Any]) -> ml_collections.ConfigDict:
  """The shipped config ``row['config']`` (``NAME`` or ``NAME:ARG``) with the row's data, init
  and overrides (``locvit.configs.reproduce_plans``)."""
  from locvit.configs.common import cifar10_image_folder
  from locvit.configs.structinit_common import init_block

  name, _, arg = row["config"].partition(":")
  module = importlib.import_module(f"locvit.configs.{name}")
  config = module.get_config(arg) if arg else module.get_config()
  if row.get("data") == "cifar10_image_folder":
    cifar10_image_folder(config)
  if row.get("init"):
    config.init = init_block(row["init"])
  for key, value in row["overrides"].items():
    set_dotted(config, key, value)
  return config


def warmup_fraction(config: ml_collections.ConfigDict) -> float:
  """The share of training the row's own schedule spends warming up."""
  config = complete_config(config)
  schedule = config.schedule
  if config.total_steps > 0 and schedule.warmup_steps > 0:
    return schedule.warmup_steps / config.total_steps
  return min(schedule.warmup_epochs / max(config.num_epochs, 1e-9), 1.0)


def budgeted_config(
  config: ml_collections.ConfigDict, steps: int, seed: int
) -> ml_collections.ConfigDict:
  """``config`` trained for exactly ``steps`` steps from ``seed``: warmup keeps its share of the
  run and the cosine decays over the ``steps``; one final evaluation. Fields ``config`` lacks take
  their defaults (``configs/common.py:complete_config``)."""
  config = complete_config(config)
  fraction = warmup_fraction(config)
  config.seed = seed
  config.total_steps = steps
  config.schedule.warmup_steps = max(1, round(fraction * steps)) if fraction > 0 else 0
  config.eval_every_steps = 0
  config.checkpoint_every_steps = max(1, steps // 5)
  config.log_every_steps = max(1, min(config.log_every_steps, steps // 10))
  return config


# ------------------------------------------------------------------------------------------------
# Data


def check_data(config: ml_collections.ConfigDict, row_name: str) -> None:
  """Fails in seconds, before any run, when a row's dataset is not where its config reads it."""
  data = complete_config(config).data
  if data.source == "image_folder":
    root = data.root
    if not root:
      raise ReproduceError(
        f"row {row_name!r} reads CIFAR-10 from an image folder but $CIFAR10_ROOT is not set. "
        f"Prepare it as described in {DATA_HELP} and `export CIFAR10_ROOT=DIR` (DIR/train/<class>/"
        "*.jpg, DIR/test/<class>/*.jpg) or pass --data=image_folder:DIR, or pass --data=tfds to "
        "read the TFDS copy."
      )
    folders = [parse_split(s)[0] for s in (data.train_split, data.eval_split)]  # 'test[:500]'
    missing = [s for s in folders if not os.path.isdir(f"{root}/{s}")]
    if missing:
      raise ReproduceError(
        f"row {row_name!r}: no {' or '.join(missing)} folder in {root}. Prepare "
        f"CIFAR-10 as described in {DATA_HELP} (DIR/train/<class>/*.jpg, DIR/test/<class>/*.jpg)."
      )
  elif data.source == "tfds":
    from locvit.data.sources import DatasetNotPreparedError, TfdsSource

    for split in (data.train_split, data.eval_split):
      try:
        TfdsSource(data.name, split, data.data_dir)
      except DatasetNotPreparedError as e:
        raise ReproduceError(f"row {row_name!r}: {e}") from e


# ------------------------------------------------------------------------------------------------
# The budget


@dataclasses.dataclass
class RowCost:
  """A row's measured cost: training steps per second and seconds per run outside training."""

  steps_per_sec: float  # training only, compilation excluded
  overhead_sec: float  # per run: start-up, compilation, initialization, evaluation, saving
  steps_per_epoch: int
  batch_size: int


def split_budget(costs: dict[str, RowCost], seeds: int, seconds: float, spent: float = 0.0) -> int:
  """The number of steps every row gets so that ``seeds`` runs of each row fit in ``seconds``
  (what is left of the budget after ``spent`` seconds of measuring)."""
  overhead = seeds * sum(c.overhead_sec for c in costs.values())
  per_step = seeds * sum(1.0 / c.steps_per_sec for c in costs.values())
  steps = math.floor((seconds - overhead) / per_step)
  if steps < 2:
    need = (spent + overhead + 2 * per_step) / 60
    raise ReproduceError(
      f"the budget is too small for {seeds} seed(s) of {len(costs)} rows here: it needs at least "
      f"{need:.1f} minutes (--minutes; {spent / 60:.1f} of them measuring step rates at load "
      f"{os.getloadavg()[0]:.1f}), or fewer --seeds"
    )
  return steps


def run_seconds(cost: RowCost, steps: int) -> float:
  """Estimated wall seconds of one run of ``steps`` steps at ``cost``."""
  return cost.overhead_sec + steps / cost.steps_per_sec


def probe(config: ml_collections.ConfigDict, workdir: str, steps: int = PROBE_STEPS) -> RowCost:
  """Times a ``steps``-step run of ``config`` (one evaluation included) in ``workdir``."""
  from locvit import train

  shutil.rmtree(workdir, ignore_errors=True)
  config = budgeted_config(config, steps, seed=0)
  config.log_every_steps = 1
  config.checkpoint_every_steps = 0  # the final save only, as in a run
  start = time.perf_counter()
  if train.train_and_evaluate(config, workdir).get("preempted"):
    raise KeyboardInterrupt  # Ctrl-C or SIGTERM during a probe stops the command
  wall = time.perf_counter() - start
  rows = [r for r in metrics_lib.read_metrics(workdir) if "perf/steps_per_sec" in r]
  step_seconds = [1.0 / r["perf/steps_per_sec"] for r in rows[1:]]  # the first one compiles
  steps_per_sec = 1.0 / statistics.median(step_seconds or [wall])
  steps_per_epoch = round(rows[-1]["step"] / rows[-1]["epoch"])
  shutil.rmtree(workdir, ignore_errors=True)
  return RowCost(
    steps_per_sec=steps_per_sec,
    overhead_sec=max(wall - len(step_seconds) / steps_per_sec, 0.0),
    steps_per_epoch=steps_per_epoch,
    batch_size=config.batch_size,
  )


# ------------------------------------------------------------------------------------------------
# Runs


def run_dir(workdir: str, row: str, seed: int) -> str:
  """The workdir of one run: ``WORKDIR/ROW/seedK``."""
  return os.path.join(workdir, row, f"seed{seed}")


def is_finished(workdir: str, steps: int) -> bool:
  """Whether the run in ``workdir`` has its final evaluation at ``steps``."""
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return False
  return any(r.get("step") == steps and "eval/top1" in r for r in metrics_lib.read_metrics(workdir))


class Interrupt:
  """Ctrl-C or SIGTERM between runs stops at once (``KeyboardInterrupt``); inside a run's training
  loop, the loop's own handler (``train.PreemptionWatcher``) saves the step first."""

  def __enter__(self):
    self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    return self

  def _handle(self, signum, frame):
    preemption.raise_stop(KeyboardInterrupt, signum, frame)  # never inside an XLA compilation

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def plan_runs(
  plan: dict[str, Any], seeds: int, rows: Sequence[str] | None = None
) -> list[tuple[int, str]]:
  """(seed, row) in training order: seeds alternate between rows (``rows``, default all)."""
  return [(seed, row) for seed in range(seeds) for row in (rows or plan["rows"])]


def measure(configs: dict[str, ml_collections.ConfigDict], root: str) -> dict[str, RowCost]:
  """Probes every row in ``root`` (removed afterwards): its step rate and per-run overhead."""
  # One-time costs of the process (first compilations, lazy imports, data caches) would otherwise
  # count as the first row's per-run overhead.
  print("Warming up (2 steps of the first row)...", flush=True)
  probe(next(iter(configs.values())), os.path.join(root, "warmup"), steps=2)
  costs = {}
  for row, config in configs.items():
    print(f"Measuring the step rate of {row} ({PROBE_STEPS} steps + one evaluation)...", flush=True)
    costs[row] = probe(config, os.path.join(root, row))
    print(
      f"  {costs[row].steps_per_sec:.2f} steps/s, {costs[row].overhead_sec:.0f} s per run "
      "outside training (compile, evaluation, saving)",
      flush=True,
    )
  shutil.rmtree(root, ignore_errors=True)
  return costs


def make_plan(name, plan, configs, workdir, seeds, minutes, started) -> dict[str, Any]:
  """Probes each row and splits the budget; saved as DIR/plan.json."""
  costs = measure(configs, os.path.join(workdir, "_probe"))
  spent = time.time() - started
  steps = split_budget(costs, seeds, minutes * 60 - spent, spent)
  if plan.get("max_steps"):
    steps = min(steps, plan["max_steps"])
  return {
    "plan": name,
    "seeds": seeds,
    "minutes": minutes,
    "steps": steps,
    "started": started,
    "load_at_probe": os.getloadavg(),
    "locvit_commit": locvit_commit(),
    "estimated_minutes": seeds * sum(run_seconds(c, steps) for c in costs.values()) / 60,
    "data": protocol.describe_data(next(iter(configs.values()))),
    "rows": {row: {**dataclasses.asdict(cost), "steps": steps} for row, cost in costs.items()},
  }


def row_steps(saved: dict[str, Any], row: str) -> int:
  """The steps of ``row``'s runs in a saved plan (budget plans before per-row steps: one count)."""
  return saved["rows"][row].get("steps", saved.get("steps"))


# ------------------------------------------------------------------------------------------------
# Paper-protocol plans (locvit.reproduce.protocol)


def select_rows(plan: dict[str, Any], rows: str | None) -> list[str]:
  """The rows to run: ``--rows=a,b`` (any of the plan's) or every row not marked optional."""
  if rows is None:
    return [row for row, spec in plan["rows"].items() if not spec.get("optional")]
  chosen = [row for row in rows.split(",") if row]
  bad = [row for row in chosen if row not in plan["rows"]]
  if bad or not chosen:
    raise ReproduceError(
      f"--rows={rows}: unknown row(s) {', '.join(bad) or '(none given)'}; this plan's rows: "
      f"{', '.join(plan['rows'])}"
    )
  return chosen


def parse_fraction(value: str) -> float | str:
  """``--fraction``: a number in (0, 1], or 'fit' (the largest that fits ``--minutes``)."""
  if value == "fit":
    return value
  try:
    fraction = float(value)
  except ValueError:
    fraction = -1.0
  if not 0 < fraction <= 1:
    raise ReproduceError(f"--fraction={value}: must be a number in (0, 1] or 'fit'")
  return fraction


def fraction_words(fraction: float) -> str:
  """'the paper's protocol' or 'F of the paper's protocol', for titles."""
  return "the paper's protocol" if fraction == 1 else f"{fraction:.3g} of the paper's protocol"


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
    full_steps, _ = protocol.protocol_steps(full, n, 1.0)
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
      flops, params = protocol.forward_flops(full)
      kit = protocol.kit_estimate(spec["kit"], full.batch_size, flops)
      step_seconds = full.batch_size / kit.images_per_sec
      overhead = KIT_H200["models"][spec["kit"]]["compile_s"]
      info.update(basis=kit.basis, params=params, gflops=flops / 1e9)
    info["images_per_sec"] = full.batch_size / step_seconds
    info["overhead_sec"], info["full_training_sec"] = overhead, full_steps * step_seconds
    per_run[row] = (overhead, full_steps * step_seconds)
    rows[row] = info
  if fraction == "fit":
    fraction = protocol.fit_fraction(per_run, seeds, (minutes or 0) * 60 - spent)
    if fraction <= 0:
      overhead = seeds * sum(o for o, _ in per_run.values())
      raise ReproduceError(
        f"--minutes={minutes:g} leaves no time to train: the runs' compilation and evaluation "
        f"alone take an estimated {overhead / 60:.1f} minutes"
        + (f", after {spent / 60:.1f} minutes of probing" if spent else "")
      )
  total = 0.0
  for row, info in rows.items():
    steps, _ = protocol.protocol_steps(
      configs[row], plan["rows"][row]["paper_train_examples"], fraction
    )
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
  fits = protocol.fit_fraction(per_run, seeds, available)
  raise ReproduceError(
    f"plan {name!r} needs an estimated {total / 60:.1f} minutes for {_runs(seeds * len(rows))} "
    f"but --minutes={minutes:g}"
    + (f" leaves {available / 60:.1f} after probing" if spent else "")
    + f"; give more --minutes, fewer --seeds, or --fraction (at most {fits:.3f} of this length "
    "fits; --fraction=fit picks it)"
  )


def train_images(config: ml_collections.ConfigDict) -> int | None:
  """The training images of ``config``'s image folder (None: not an image folder, or one the run
  itself refuses: missing, or without class folders)."""
  from locvit.data.sources import ImageFolderSource

  data = complete_config(config).data
  if data.source != "image_folder" or not data.root:
    return None
  try:
    return len(ImageFolderSource(data.root, data.train_split))
  except (FileNotFoundError, ValueError):
    return None


def check_batches(plan: dict[str, Any], configs: dict[str, Any]) -> None:
  """A row whose image folder gives fewer training images than its batch is refused before any
  probe (the run's own refusal names ``--config.batch_size``, which this command does not take)."""
  from locvit.data.sources import make_source

  if plan.get("protocol"):  # refused unless the folder holds the paper's dataset
    return
  for row, config in configs.items():
    complete = complete_config(config)
    data, batch = complete.data, complete.batch_size
    if data.source != "image_folder" or not data.root:
      continue
    try:  # one listing of the folder (check_data has refused a bad split or a missing folder)
      count = len(make_source(data, data.train_split))
    except FileNotFoundError:  # no class folders or no images: the run itself refuses it
      continue
    if count < batch:
      share = f"data.train_fraction={data.train_fraction:g} of " if data.train_fraction < 1 else ""
      raise ReproduceError(
        f"row {row!r}: {data.root} gives {count} training images ({share}its "
        f"{data.train_split!r} split), fewer than the row's batch of {batch}: the plan is made "
        f"for CIFAR-10 ({DATA_HELP}). On your own images: python -m locvit.main "
        f"--config={plan['rows'][row]['config']} --data=image_folder:{data.root} "
        f"--config.batch_size={count} --workdir=DIR"
      )


def check_protocol_data(plan: dict[str, Any], configs: dict[str, Any]) -> None:
  """A paper-protocol plan trains the paper's epochs of the whole CIFAR-10 and sets its steps by
  that size: a folder of another size is refused, not trained for those steps."""
  for row, config in configs.items():
    spec, count = plan["rows"][row], train_images(config)
    expected = round(spec["paper_train_examples"] * complete_config(config).data.train_fraction)
    if count is not None and count != expected:
      raise ReproduceError(
        f"row {row!r}: {config.data.root} holds {count:,} training images, not the "
        f"{expected:,} of the paper's dataset: a paper-protocol plan trains the paper's epochs "
        "of the whole dataset, its steps set by that size. On your own images: python -m "
        f"locvit.main --config={spec['config']} --data=image_folder:{config.data.root} "
        "--workdir=DIR"
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
    "data": protocol.describe_data(next(iter(configs.values()))),
    "rows": {
      row: {**dataclasses.asdict(costs[row]), "steps": rows[row]["steps"]} for row in configs
    },
  }


def describe(saved: dict[str, Any], plan: dict[str, Any]) -> str:
  """The plan as printed before the runs start: rows, seeds, steps, epochs, budget fraction."""
  steps, lines = saved["steps"], [plan["title"], ""]
  lines.append(
    f"{'row':<14} {'seeds':>5} {'steps':>6} {'epochs':>7} {'paper epochs':>12} "
    f"{'of paper':>9} {'steps/s':>8}"
  )
  total = 0.0
  for row, spec in plan["rows"].items():
    cost = RowCost(**_cost(saved, row))
    epochs = steps / cost.steps_per_epoch
    fraction = steps * cost.batch_size / (spec["paper_epochs"] * spec["paper_train_examples"])
    total += saved["seeds"] * run_seconds(cost, steps)
    lines.append(
      f"{row:<14} {saved['seeds']:>5} {steps:>6} {epochs:>7.2f} {spec['paper_epochs']:>12} "
      f"{fraction:>9.2%} {cost.steps_per_sec:>8.2f}"
    )
  lines.append(f"\nEstimated training time {total / 60:.1f} minutes.")
  return "\n".join(lines)


def saved_rows(saved: dict[str, Any], plan: dict[str, Any]) -> list[str]:
  """The rows a saved plan runs (every row of a plan saved before ``--rows``)."""
  return saved.get("row_names") or list(plan["rows"])


def load_or_make_plan(
  name, plan, configs, workdir, seeds, minutes, started, fraction=1.0, probe_here=True
) -> dict[str, Any]:
  """The plan saved in ``workdir/plan.json`` (a re-run resumes it, on this machine or another one
  the workdir was copied to).

  Without one, a new plan is measured on this machine.
  """
  path = os.path.join(workdir, "plan.json")
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    if saved["plan"] != name:
      raise ReproduceError(
        f"{workdir} holds plan {saved['plan']!r}, not {name!r}: use a new --workdir"
      )
    if seeds is not None and seeds != saved["seeds"]:
      raise ReproduceError(
        f"{workdir} was planned with --seeds={saved['seeds']}; use that or a new --workdir"
      )
    steps = sorted({row_steps(saved, row) for row in saved_rows(saved, plan)})
    print(
      f"Resuming the plan saved in {path} ({'/'.join(map(str, steps))} steps per run).",
      flush=True,
    )
    return saved
  if plan.get("protocol"):
    saved = make_protocol_plan(
      name, plan, configs, workdir, seeds or 1, minutes, fraction, started, probe_here
    )
  else:
    saved = make_plan(name, plan, configs, workdir, seeds or 2, minutes or 60.0, started)
  os.makedirs(workdir, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(saved, f, indent=2)
  os.replace(tmp, path)
  return saved


def run_config(plan, saved, configs, row: str, seed: int) -> ml_collections.ConfigDict:
  """The config of one run of a saved plan."""
  if saved.get("protocol"):
    spec = plan["rows"][row]
    config = protocol.protocol_config(
      configs[row], spec["paper_train_examples"], saved["fraction"], seed
    )
    if config.total_steps != row_steps(saved, row):
      raise ReproduceError(
        f"row {row!r}: this checkout gives {config.total_steps} steps, the saved plan "
        f"{row_steps(saved, row)}; run it with the locvit commit {saved['locvit_commit']}"
      )
    return config
  return budgeted_config(configs[row], row_steps(saved, row), seed)


def plan_configs(
  plan: dict[str, Any], rows: Sequence[str], data: str, tfds_data_dir: str | None
) -> dict[str, ml_collections.ConfigDict]:
  """The configs of ``rows``. ``data`` reads their CIFAR-10 image-folder rows from elsewhere, as
  locvit.main's ``--data`` does (``tfds[:DATA_DIR]``, ``image_folder:DIR`` or ``DIR``);
  'image_folder' keeps ``$CIFAR10_ROOT``. ``tfds_data_dir`` is ``tfds``'s DATA_DIR given apart."""
  configs = {row: row_config(plan["rows"][row]) for row in rows}
  if tfds_data_dir is not None:
    if data != "tfds":
      raise ReproduceError(
        f"--tfds_data_dir goes with --data=tfds only (given --data={data}); give the data one "
        f"way: --data=tfds:{tfds_data_dir}, or --data={data} alone"
      )
    data = f"tfds:{tfds_data_dir}"
  if data == "image_folder":
    return configs
  try:
    datasets.parse_data_flag(data)  # refused even where no row reads an image folder
    for row, config in configs.items():
      if config.data.source == "image_folder":
        configs[row] = datasets.apply_data_flag(config, data)
  except ValueError as e:
    raise ReproduceError(str(e)) from None
  return configs


def dry_run(
  name: str,
  minutes: float | None = None,
  seeds: int | None = None,
  fraction: float | str = 1.0,
  rows: str | None = None,
  probe_here: bool = False,
  data: str = "image_folder",
  tfds_data_dir: str | None = None,
) -> str:
  """The plan, printed, and nothing created: rows, seeds, model, batch, epochs, images per run
  and the estimated wall time (a probe here with ``probe_here``, else the kit's H200 figures).
  A protocol plan that does not fit ``minutes`` raises ``ReproduceError`` with its estimate."""
  import tempfile

  plan = get_plan(name)
  configs = plan_configs(plan, select_rows(plan, rows), data, tfds_data_dir)
  costs = None
  with tempfile.TemporaryDirectory(prefix="locvit-dry-run-") as scratch:
    if probe_here:
      for row, config in configs.items():
        check_data(config, row)
      check_batches(plan, configs)
      costs = measure(configs, os.path.join(scratch, "_probe"))
    if not plan.get("protocol"):
      text = describe_budget_dry_run(plan, configs, seeds or 2, minutes or 60.0, costs)
    else:
      check_protocol_data(plan, configs)
      seeds = seeds or 1
      table, fraction, total, source = protocol_estimate(
        plan, configs, seeds, minutes, fraction, costs
      )
      text = describe_protocol(plan["title"], table, fraction, seeds, total, source)
      data_line = protocol.describe_data(next(iter(configs.values())))
      text += f"\nData: {data_line}."
  print(text + "\nNothing was created (--dry_run).", flush=True)
  if plan.get("protocol"):
    check_fits(name, total, minutes, 0.0, table, seeds)
  return text


def describe_budget_dry_run(plan, configs, seeds, minutes, costs) -> str:
  """A budget plan's dry run: its rows, and its steps once a probe has measured them."""
  lines = [plan["title"], ""]
  lines.append(f"{'row':<14} {'model':<34} {'seeds':>5} {'batch':>5} {'paper epochs':>12}")
  for row, config in configs.items():
    full = complete_config(config)
    lines.append(
      f"{row:<14} {full.model.name:<34} {seeds:>5} {full.batch_size:>5} "
      f"{plan['rows'][row]['paper_epochs']:>12}"
    )
  if costs is None:
    lines.append(
      f"\nEvery row gets the same steps, set by a probe on this machine so that all runs fit "
      f"--minutes={minutes:g} (--estimate=probe measures them now)."
    )
  else:
    steps = split_budget(costs, seeds, minutes * 60)
    if plan.get("max_steps"):
      steps = min(steps, plan["max_steps"])
    total = seeds * sum(run_seconds(c, steps) for c in costs.values())
    lines.append(f"\n{steps} steps per run; estimated {total / 60:.1f} minutes (a probe here).")
  return "\n".join(lines)


def reproduce(
  name: str,
  workdir: str,
  minutes: float | None = None,
  seeds: int | None = None,
  data: str = "image_folder",
  tfds_data_dir: str | None = None,
  fraction: float | str = 1.0,
  rows: str | None = None,
  probe_here: bool = True,
) -> dict[str, Any]:
  """Plans (or resumes) and trains ``name`` in ``workdir``; returns the report (None when
  interrupted). A protocol plan is estimated by a probe here, or (``probe_here=False``) from the
  kit's H200 figures."""
  from locvit import train
  from locvit.reproduce import report as reproduce_report

  started = time.time()
  plan = get_plan(name)
  chosen = select_rows(plan, rows)
  saved_path = os.path.join(workdir, "plan.json")
  if os.path.exists(saved_path):  # a resumed plan keeps its rows, whatever --rows says
    with open(saved_path) as f:
      chosen = saved_rows(json.load(f), plan)
  configs = plan_configs(plan, chosen, data, tfds_data_dir)
  for row, config in configs.items():
    check_data(config, row)
  check_batches(plan, configs)
  with Interrupt():
    try:
      saved = load_or_make_plan(
        name, plan, configs, workdir, seeds, minutes, started, fraction, probe_here
      )
      if not saved.get("protocol"):
        print(describe(saved, plan), flush=True)
      runs = plan_runs(plan, saved["seeds"], saved_rows(saved, plan))
      todo = [
        (s, r) for s, r in runs if not is_finished(run_dir(workdir, r, s), row_steps(saved, r))
      ]
      remaining = sum(run_seconds(RowCost(**_cost(saved, r)), row_steps(saved, r)) for _, r in todo)
      end = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=remaining)
      print(
        f"{len(runs) - len(todo)} of {len(runs)} runs finished; estimated end "
        f"{end:%Y-%m-%d %H:%M} UTC.",
        flush=True,
      )
      for seed, row in todo:
        path = run_dir(workdir, row, seed)
        print(f"\n== {row} seed {seed}: {path}", flush=True)
        start = time.time()
        result = train.train_and_evaluate(run_config(plan, saved, configs, row, seed), path)
        if result.get("preempted"):
          raise KeyboardInterrupt
        # This session's time; the run's time and load over all its sessions, on every machine,
        # are in its commits.json (locvit.workdir.provenance), which the report reads.
        with open(os.path.join(path, "reproduce_run.json"), "w") as f:
          json.dump({"wall_seconds": time.time() - start}, f)
    except KeyboardInterrupt:
      print(
        f"\nStopped. Everything is saved: run the same command again to resume ({workdir}; "
        "on another machine, copy it there first).",
        flush=True,
      )
      return None
  return reproduce_report.write_report(name, workdir)


def _cost(saved: dict[str, Any], row: str) -> dict[str, Any]:
  """A saved row's ``RowCost`` fields (without its steps)."""
  return {k: v for k, v in saved["rows"][row].items() if k != "steps"}


def pack_workdir(name: str, workdir: str, path: str) -> int:
  """``--pack``: the plan's workdir as ``path``, with one line on what it holds."""
  from locvit.reproduce import pack

  path_json = os.path.join(workdir, "plan.json")
  if not os.path.exists(path_json):
    raise ReproduceError(f"--pack: {workdir} holds no plan (no plan.json)")
  with open(path_json) as f:
    saved = json.load(f)["plan"]
  if saved != name:
    raise ReproduceError(f"--pack: {workdir} holds plan {saved!r}, not {name!r}")
  left_out = pack.pack(workdir, path)
  print(
    f"Packed {workdir} into {path} ({os.path.getsize(path) / 1e6:.1f} MB; "
    f"{len(left_out)} checkpoint folders left out: best/ and steps older than each run's newest). "
    f"On the next machine: tar xzf {os.path.basename(path)}, then the same command with "
    f"--workdir={os.path.basename(os.path.abspath(workdir))}."
  )
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]``, or
  ``PLAN --dry_run [--estimate=probe]``.

  Returns the exit status.
  """
  parser = ArgumentParser(prog="python -m locvit.reproduce", description=__doc__.split("\n\n")[0])
  parser.add_argument("plan", help=f"one of: {', '.join(sorted(PLANS))}")
  parser.add_argument("--workdir", default=None, help="required except with --dry_run")
  parser.add_argument(
    "--minutes",
    type=float,
    default=None,
    help="total budget, probes included (budget plans: default 60; protocol plans: refused when "
    "their estimate does not fit)",
  )
  parser.add_argument(
    "--seeds", type=int, default=None, help="seeds per row (default 2; protocol plans 1)"
  )
  parser.add_argument("--report", action="store_true", help="only write results.md/.json now")
  parser.add_argument(
    "--pack",
    default=None,
    metavar="FILE",
    help="write --workdir as a .tar.gz to continue elsewhere: each run's newest checkpoint only, "
    "no best/",
  )
  parser.add_argument(
    "--dry_run", action="store_true", help="print the plan and its estimate; create nothing"
  )
  parser.add_argument(
    "--estimate",
    choices=("probe", "kit"),
    default=None,
    help="protocol plans' time estimate: a short probe of each row here (default for a run) or "
    "the accelerator kit's H200 figures (default with --dry_run; skips the probe on a GPU)",
  )
  parser.add_argument(
    "--fraction",
    default="1",
    help="protocol plans: train this fraction (0, 1] of the paper's epochs, schedule shrunk "
    "alike, or 'fit': the largest that fits --minutes",
  )
  parser.add_argument(
    "--rows", default=None, help="comma-separated rows to run (default: all but optional ones)"
  )
  parser.add_argument(
    "--data",
    default="image_folder",
    help="where CIFAR-10 is read from, as locvit.main's --data: 'image_folder' ($CIFAR10_ROOT, "
    "the default), 'image_folder:DIR' (or DIR), 'tfds' or 'tfds:DATA_DIR'",
  )
  parser.add_argument(
    "--tfds_data_dir",
    default=None,
    help="with --data=tfds: the data_dir CIFAR-10 was prepared in (default: TFDS's own); the "
    "same as --data=tfds:DATA_DIR",
  )
  args = parser.parse_args(argv)
  if argv is None:  # the command line, as locvit.main: TCMalloc where installed (README, "On CPU")
    cpu_malloc.reexec_with("auto")
    preemption.redeliver_swallowed_stops({KeyboardInterrupt: signal.SIGINT})
  try:
    fraction = parse_fraction(args.fraction)
    plan = get_plan(args.plan)
    if fraction != 1 and not plan.get("protocol"):
      raise ReproduceError(
        f"--fraction is for paper-protocol plans; {args.plan!r} is a budget plan"
      )
    if fraction == "fit" and args.minutes is None:
      raise ReproduceError("--fraction=fit needs --minutes")
    if args.dry_run:
      dry_run(
        args.plan, args.minutes, args.seeds, fraction, args.rows, args.estimate == "probe",
        args.data, args.tfds_data_dir,
      )  # fmt: skip
      return 0
    if args.workdir is None:
      raise ReproduceError("--workdir is required (except with --dry_run)")
    if args.pack:
      return pack_workdir(args.plan, args.workdir, args.pack)
    if args.report:
      from locvit.reproduce import report as reproduce_report

      try:
        reproduce_report.write_report(args.plan, args.workdir)
      except ValueError as e:  # no plan.json yet
        raise ReproduceError(str(e)) from e
      return 0
    result = reproduce(
      args.plan, args.workdir, args.minutes, args.seeds, args.data, args.tfds_data_dir,
      fraction, args.rows, args.estimate != "kit",
    )  # fmt: skip
  except ReproduceError as e:
    print(f"locvit.reproduce: error: {e}", file=sys.stderr)
    return 2
  return 0 if result is not None else 130
