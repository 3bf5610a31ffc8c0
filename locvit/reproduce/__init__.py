"""Reproduce a paper table in one command, within a time budget.

  python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]

A plan (``locvit.configs.reproduce_plans.PLANS``) names the rows of one table as shipped configs.
The command measures each row's step rate here (a short probe run, compilation excluded), gives
every row the same number of optimizer steps so that all runs fit in the budget, fits each run's
warmup and cosine schedule to that step count, prints the plan and its estimated end, then trains
the runs seed by seed, alternating rows (so a cut-short budget still leaves paired seeds). Each
run is an ordinary locvit workdir, ``DIR/ROW/seedK``. ``DIR/plan.json`` keeps the plan: running the
command again skips finished runs and resumes interrupted ones. Ctrl-C saves a checkpoint at the
end of the current step and leaves everything resumable. At the end (or with ``--report``) DIR gets
``results.md`` and ``results.json`` (``locvit.reproduce_report``).
"""

from __future__ import annotations

import dataclasses
import datetime
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

from locvit import cpu_malloc
from locvit import metrics as metrics_lib
from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import PLANS
from locvit.reproduce.report import locvit_commit
from locvit.run import preemption

PROBE_STEPS = 8
DATA_HELP = "docs/data_preparation.md"


class ReproduceError(ValueError):
  """A problem the user fixes (unknown plan, missing data, budget too small): one clear line."""


# ------------------------------------------------------------------------------------------------
# Configs of a plan


def get_plan(name: str) -> dict[str, Any]:
  """The shipped plan ``name`` from ``locvit.configs.reproduce_plans.PLANS``.

  An unknown name raises ``ReproduceError`` listing the valid names.
  """
  if name not in PLANS:
    raise ReproduceError(f"unknown plan {name!r}; valid plans: {', '.join(sorted(PLANS))}")
  return PLANS[name]


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """Sets ``config.a.b.c = value`` for ``key='a.b.c'`` (a row's override)."""
  *parents, leaf = key.split(".")
  node = config
  for part in parents:
    node = node[part]
  node[leaf] = value


def row_config(row: dict[str, Any]) -> ml_collections.ConfigDict:
  """The shipped config ``row['config']`` (``NAME`` or ``NAME:ARG``) with the row's overrides."""
  name, _, arg = row["config"].partition(":")
  module = importlib.import_module(f"locvit.configs.{name}")
  config = module.get_config(arg) if arg else module.get_config()
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
        "*.jpg, DIR/test/<class>/*.jpg), or pass --data=tfds to read the TFDS copy."
      )
    missing = [s for s in (data.train_split, data.eval_split) if not os.path.isdir(f"{root}/{s}")]
    if missing:
      raise ReproduceError(
        f"row {row_name!r}: no {' or '.join(missing)} folder in CIFAR10_ROOT={root}. Prepare "
        f"CIFAR-10 as described in {DATA_HELP} (DIR/train/<class>/*.jpg, DIR/test/<class>/*.jpg)."
      )
  elif data.source == "tfds":
    from locvit.data.sources import DatasetNotPreparedError, TfdsSource

    for split in (data.train_split, data.eval_split):
      try:
        TfdsSource(data.name, split, data.data_dir)
      except DatasetNotPreparedError as e:
        raise ReproduceError(f"row {row_name!r}: {e}") from e


def use_tfds(config: ml_collections.ConfigDict, data_dir: str | None) -> None:
  """Reads a CIFAR-10 image-folder row from TFDS's ``cifar10`` instead."""
  if config.data.source == "image_folder":
    config.data.source = "tfds"
    config.data.name = "cifar10"
    config.data.data_dir = data_dir
    config.data.train_split, config.data.eval_split = "train", "test"


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
  train.train_and_evaluate(config, workdir)
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


def plan_runs(plan: dict[str, Any], seeds: int) -> list[tuple[int, str]]:
  """(seed, row) in training order: seeds alternate between rows."""
  return [(seed, row) for seed in range(seeds) for row in plan["rows"]]


def make_plan(name, plan, configs, workdir, seeds, minutes, started) -> dict[str, Any]:
  """Probes each row and splits the budget; saved as DIR/plan.json."""
  # One-time costs of the process (first compilations, lazy imports, data caches) would otherwise
  # count as the first row's per-run overhead.
  print("Warming up (2 steps of the first row)...", flush=True)
  probe(next(iter(configs.values())), os.path.join(workdir, "_probe", "warmup"), steps=2)
  costs = {}
  for row, config in configs.items():
    print(f"Measuring the step rate of {row} ({PROBE_STEPS} steps + one evaluation)...", flush=True)
    costs[row] = probe(config, os.path.join(workdir, "_probe", row))
    print(
      f"  {costs[row].steps_per_sec:.2f} steps/s, {costs[row].overhead_sec:.0f} s per run "
      "outside training (compile, evaluation, saving)",
      flush=True,
    )
  shutil.rmtree(os.path.join(workdir, "_probe"), ignore_errors=True)
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
    "rows": {row: dataclasses.asdict(cost) for row, cost in costs.items()},
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
    cost = RowCost(**saved["rows"][row])
    epochs = steps / cost.steps_per_epoch
    fraction = steps * cost.batch_size / (spec["paper_epochs"] * spec["paper_train_examples"])
    total += saved["seeds"] * run_seconds(cost, steps)
    lines.append(
      f"{row:<14} {saved['seeds']:>5} {steps:>6} {epochs:>7.2f} {spec['paper_epochs']:>12} "
      f"{fraction:>9.2%} {cost.steps_per_sec:>8.2f}"
    )
  lines.append(f"\nEstimated training time {total / 60:.1f} minutes.")
  return "\n".join(lines)


def load_or_make_plan(name, plan, configs, workdir, seeds, minutes, started) -> dict[str, Any]:
  """The plan saved in ``workdir/plan.json`` (a re-run resumes it).

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
    print(f"Resuming the plan saved in {path} ({saved['steps']} steps per run).", flush=True)
    return saved
  saved = make_plan(name, plan, configs, workdir, seeds or 2, minutes, started)
  os.makedirs(workdir, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(saved, f, indent=2)
  os.replace(tmp, path)
  return saved


def reproduce(
  name: str,
  workdir: str,
  minutes: float,
  seeds: int | None = None,
  data: str = "image_folder",
  tfds_data_dir: str | None = None,
) -> dict[str, Any]:
  """Plans (or resumes) and trains ``name`` in ``workdir``; returns the report (None when
  interrupted)."""
  from locvit import train
  from locvit.reproduce import report as reproduce_report

  started = time.time()
  plan = get_plan(name)
  configs = {row: row_config(spec) for row, spec in plan["rows"].items()}
  for row, config in configs.items():
    if data == "tfds":
      use_tfds(config, tfds_data_dir)
    check_data(config, row)
  with Interrupt():
    try:
      saved = load_or_make_plan(name, plan, configs, workdir, seeds, minutes, started)
      print(describe(saved, plan), flush=True)
      runs = plan_runs(plan, saved["seeds"])
      todo = [(s, r) for s, r in runs if not is_finished(run_dir(workdir, r, s), saved["steps"])]
      remaining = sum(run_seconds(RowCost(**saved["rows"][r]), saved["steps"]) for _, r in todo)
      end = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=remaining)
      print(
        f"{len(runs) - len(todo)} of {len(runs)} runs finished; estimated end "
        f"{end:%Y-%m-%d %H:%M} UTC.",
        flush=True,
      )
      for seed, row in todo:
        path = run_dir(workdir, row, seed)
        print(f"\n== {row} seed {seed}: {path}", flush=True)
        start, load = time.time(), os.getloadavg()
        result = train.train_and_evaluate(budgeted_config(configs[row], saved["steps"], seed), path)
        if result.get("preempted"):
          raise KeyboardInterrupt
        with open(os.path.join(path, "reproduce_run.json"), "w") as f:
          json.dump(
            {
              "wall_seconds": time.time() - start,
              "load_before": load,
              "load_after": os.getloadavg(),
            },
            f,
          )
    except KeyboardInterrupt:
      print(
        f"\nStopped. Everything is saved: run the same command again to resume ({workdir}).",
        flush=True,
      )
      return None
  return reproduce_report.write_report(name, workdir)


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]``.

  Returns the exit status.
  """
  import argparse

  parser = argparse.ArgumentParser(
    prog="python -m locvit.reproduce", description=__doc__.split("\n\n")[0]
  )
  parser.add_argument("plan", help=f"one of: {', '.join(sorted(PLANS))}")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--minutes", type=float, default=60.0, help="total budget, probes included")
  parser.add_argument("--seeds", type=int, default=None, help="seeds per row (default 2)")
  parser.add_argument("--report", action="store_true", help="only write results.md/.json now")
  parser.add_argument(
    "--data",
    choices=("image_folder", "tfds"),
    default="image_folder",
    help="CIFAR-10 from $CIFAR10_ROOT (default) or from TFDS",
  )
  parser.add_argument("--tfds_data_dir", default=None)
  args = parser.parse_args(argv)
  if argv is None:  # the command line, as locvit.main: TCMalloc where installed (README, "On CPU")
    cpu_malloc.reexec_with("auto")
    preemption.redeliver_swallowed_stops({KeyboardInterrupt: signal.SIGINT})
  try:
    if args.report:
      from locvit.reproduce import report as reproduce_report

      get_plan(args.plan)
      reproduce_report.write_report(args.plan, args.workdir)
      return 0
    result = reproduce(
      args.plan, args.workdir, args.minutes, args.seeds, args.data, args.tfds_data_dir
    )
  except ReproduceError as e:
    print(f"locvit.reproduce: error: {e}", file=sys.stderr)
    return 2
  return 0 if result is not None else 130
