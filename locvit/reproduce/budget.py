"""Budget plans: a probe of each row's step rate here, and the same steps for every row so that
all runs fit ``--minutes``.

A probe trains a few steps of a row (one evaluation included), reads the logged step rate
(compilation excluded) and keeps the rest of the run's wall time as its overhead. Each row's
warmup keeps its share of the run and its cosine decays over the budgeted steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import statistics
import time
from typing import Any

import ml_collections

from locvit import metrics as metrics_lib
from locvit.configs.common import complete_config
from locvit.reproduce.data_checks import describe_data
from locvit.reproduce.plans import ReproduceError, saved_cost
from locvit.workdir.provenance import locvit_commit

PROBE_STEPS = 8


@dataclasses.dataclass
class RowCost:
  """A row's measured cost: training steps per second, seconds per run outside training and its
  evaluations, and seconds per evaluation."""

  steps_per_sec: float  # training only, compilation excluded
  overhead_sec: float  # per run: start-up, compilation, initialization, saving
  steps_per_epoch: int
  batch_size: int
  eval_sec: float = (
    0.0  # one evaluation, its compilation excluded (plans saved before: in overhead)
  )


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


def split_budget(costs: dict[str, RowCost], seeds: int, seconds: float, spent: float = 0.0) -> int:
  """The number of steps every row gets so that ``seeds`` runs of each row fit in ``seconds``
  (what is left of the budget after ``spent`` seconds of measuring)."""
  overhead = seeds * sum(c.overhead_sec + c.eval_sec for c in costs.values())  # one evaluation
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


def run_seconds(cost: RowCost, steps: int, evaluations: int = 1) -> float:
  """Estimated wall seconds of one run of ``steps`` steps and ``evaluations`` at ``cost``."""
  return cost.overhead_sec + steps / cost.steps_per_sec + evaluations * cost.eval_sec


def probe(config: ml_collections.ConfigDict, workdir: str, steps: int = PROBE_STEPS) -> RowCost:
  """Times a ``steps``-step run of ``config`` with two evaluations (halfway, where the
  evaluation compiles, and at the end, which times one evaluation) in ``workdir``. With
  ``config.num_seeds`` seeds side by side, the cost is theirs together: one shared step, and one
  evaluation of all seeds (each seed logs its time as its ``perf/eval_seconds``)."""
  from locvit import train
  from locvit.run.seeds import seed_workdir

  shutil.rmtree(workdir, ignore_errors=True)
  config = budgeted_config(config, steps, seed=0)
  config.eval_every_steps = max(1, steps // 2)
  config.log_every_steps = 1
  config.checkpoint_every_steps = 0  # the final save only, as in a run
  start = time.perf_counter()
  if train.train_and_evaluate(config, workdir).get("preempted"):
    raise KeyboardInterrupt  # Ctrl-C or SIGTERM during a probe stops the command
  wall = time.perf_counter() - start
  lanes = config.num_seeds
  records = metrics_lib.read_metrics(seed_workdir(workdir, 0) if lanes > 1 else workdir)
  rows = [r for r in records if "perf/steps_per_sec" in r]
  step_seconds = [1.0 / r["perf/steps_per_sec"] for r in rows[1:]]  # the first one compiles
  steps_per_sec = 1.0 / statistics.median(step_seconds or [wall])
  steps_per_epoch = round(rows[-1]["step"] / rows[-1]["epoch"])
  evaluations = [r["perf/eval_seconds"] for r in records if "perf/eval_seconds" in r]
  eval_sec = evaluations[-1] if evaluations else 0.0  # the last: compiled by the first
  shutil.rmtree(workdir, ignore_errors=True)
  return RowCost(
    steps_per_sec=steps_per_sec,
    overhead_sec=max(wall - len(step_seconds) / steps_per_sec - len(evaluations) * eval_sec, 0.0),
    steps_per_epoch=steps_per_epoch,
    batch_size=config.batch_size,
    eval_sec=eval_sec,
  )


def measure(configs: dict[str, ml_collections.ConfigDict], root: str) -> dict[str, RowCost]:
  """Probes every row in ``root`` (removed afterwards): its step rate and per-run overhead."""
  # One-time costs of the process (first compilations, lazy imports, data caches) would otherwise
  # count as the first row's per-run overhead.
  print("Warming up (2 steps of the first row)...", flush=True)
  probe(next(iter(configs.values())), os.path.join(root, "warmup"), steps=2)
  costs = {}
  for row, config in configs.items():
    print(f"Measuring the step rate of {row} ({PROBE_STEPS} steps + 2 evaluations)...", flush=True)
    costs[row] = probe(config, os.path.join(root, row))
    print(
      f"  {costs[row].steps_per_sec:.2f} steps/s, {costs[row].eval_sec:.1f} s per evaluation, "
      f"{costs[row].overhead_sec:.0f} s per run outside training and evaluation (compile, saving)",
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
    "data": describe_data(next(iter(configs.values()))),
    "rows": {row: {**dataclasses.asdict(cost), "steps": steps} for row, cost in costs.items()},
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
    cost = RowCost(**saved_cost(saved, row))
    epochs = steps / cost.steps_per_epoch
    fraction = steps * cost.batch_size / (spec["paper_epochs"] * spec["paper_train_examples"])
    total += saved["seeds"] * run_seconds(cost, steps)
    lines.append(
      f"{row:<14} {saved['seeds']:>5} {steps:>6} {epochs:>7.2f} {spec['paper_epochs']:>12} "
      f"{fraction:>9.2%} {cost.steps_per_sec:>8.2f}"
    )
  lines.append(f"\nEstimated training time {total / 60:.1f} minutes.")
  return "\n".join(lines)


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
