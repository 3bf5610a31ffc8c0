"""Running a plan: its saved ``DIR/plan.json`` (made here or resumed), each run's config, and the
runs trained seed by seed, alternating rows, each an ordinary locvit workdir ``DIR/ROW/seedK``.

Ctrl-C or SIGTERM saves a checkpoint at the end of the current step and leaves everything
resumable: running the command again skips finished runs and resumes interrupted ones, on this
machine or another one the workdir was copied to.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from typing import Any

import ml_collections

from locvit import metrics as metrics_lib
from locvit.reproduce import protocol
from locvit.reproduce.budget import RowCost, budgeted_config, describe, make_plan, run_seconds
from locvit.reproduce.data_checks import check_batches, check_data, check_protocol_data
from locvit.reproduce.plans import (
  ReproduceError,
  default_seeds,
  get_plan,
  official_evaluation,
  plan_configs,
  plan_runs,
  row_evaluations,
  row_steps,
  run_dir,
  saved_cost,
  saved_rows,
  select_rows,
)
from locvit.run import preemption


def is_finished(workdir: str, steps: int) -> bool:
  """Whether the run in ``workdir`` has its final evaluation at ``steps``."""
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return False
  return any(r.get("step") == steps and "eval/top1" in r for r in metrics_lib.read_metrics(workdir))


class Interrupt:
  """Ctrl-C or SIGTERM between runs stops at once (``KeyboardInterrupt``); inside a run's training
  loop, the loop's own handler (``locvit.run.preemption.PreemptionWatcher``) saves the step
  first."""

  def __enter__(self):
    self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
    return self

  def _handle(self, signum, frame):
    preemption.raise_stop(KeyboardInterrupt, signum, frame)  # never inside an XLA compilation

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def load_or_make_plan(
  name,
  plan,
  configs,
  workdir,
  seeds,
  minutes,
  started,
  fraction=1.0,
  probe_here=True,
  allow_lossy_data=False,
) -> dict[str, Any]:
  """The plan saved in ``workdir/plan.json`` (a re-run resumes it, on this machine or another one
  the workdir was copied to).

  Without one, a new plan is measured on this machine. A protocol plan's data is checked either
  way: a resumed plan takes a JPEG folder only if it was saved with lossy data or
  ``allow_lossy_data`` (which then marks it so).
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
    if saved.get("protocol"):
      lossy = saved.get("lossy_data", False)
      if check_protocol_data(plan, configs, allow_lossy_data or lossy) and not lossy:
        saved["lossy_data"] = True  # continued on a JPEG copy: the report's title says so
        write_plan(path, saved)
    steps = sorted({row_steps(saved, row) for row in saved_rows(saved, plan)})
    print(
      f"Resuming the plan saved in {path} ({'/'.join(map(str, steps))} steps per run).",
      flush=True,
    )
    return saved
  if plan.get("protocol"):
    saved = protocol.make_protocol_plan(
      name,
      plan,
      configs,
      workdir,
      seeds or default_seeds(plan),
      minutes,
      fraction,
      started,
      probe_here,
      allow_lossy_data,
    )
  else:
    saved = make_plan(
      name, plan, configs, workdir, seeds or default_seeds(plan), minutes or 60.0, started
    )
  os.makedirs(workdir, exist_ok=True)
  write_plan(path, saved)
  return saved


def write_plan(path: str, saved: dict[str, Any]) -> None:
  """Writes ``DIR/plan.json`` atomically."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(saved, f, indent=2)
  os.replace(tmp, path)


def config_of_run(plan, saved, configs, row: str, seed: int) -> ml_collections.ConfigDict:
  """The config of one run of a saved plan."""
  if saved.get("protocol"):
    spec = plan["rows"][row]
    every = saved.get("evaluation", official_evaluation(plan))["every_epochs"]
    config = protocol.protocol_config(
      configs[row], spec["paper_train_examples"], saved["fraction"], seed, every
    )
    if config.total_steps != row_steps(saved, row):
      raise ReproduceError(
        f"row {row!r}: this checkout gives {config.total_steps} steps, the saved plan "
        f"{row_steps(saved, row)}; run it with the locvit commit {saved['locvit_commit']}"
      )
    return config
  return budgeted_config(configs[row], row_steps(saved, row), seed)


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
  allow_lossy_data: bool = False,
) -> dict[str, Any] | None:
  """Plans (or resumes) and trains ``name`` in ``workdir``; returns the report (None when
  interrupted). A protocol plan is estimated by a probe here, or (``probe_here=False``) from the
  kit's H200 figures."""
  from locvit.reproduce import report as reproduce_report

  started = time.time()
  plan = get_plan(name)
  configs = plan_configs(plan, chosen_rows(plan, workdir, rows), data, tfds_data_dir)
  for row, config in configs.items():
    check_data(config, row)
  check_batches(plan, configs)
  with Interrupt():
    try:
      saved = load_or_make_plan(
        name, plan, configs, workdir, seeds, minutes, started, fraction, probe_here,
        allow_lossy_data,
      )  # fmt: skip
      if not saved.get("protocol"):
        print(describe(saved, plan), flush=True)
      train_runs(plan, saved, configs, workdir)
    except KeyboardInterrupt:
      print(
        f"\nStopped. Everything is saved: run the same command again to resume ({workdir}; "
        "on another machine, copy it there first).",
        flush=True,
      )
      return None
  return reproduce_report.write_report(name, workdir)


def chosen_rows(plan: dict[str, Any], workdir: str, rows: str | None) -> list[str]:
  """``--rows`` (``select_rows``), except that a resumed plan keeps the rows it was saved with."""
  chosen = select_rows(plan, rows)
  saved_path = os.path.join(workdir, "plan.json")
  if os.path.exists(saved_path):
    with open(saved_path) as f:
      chosen = saved_rows(json.load(f), plan)
  return chosen


def train_runs(plan, saved, configs, workdir: str) -> None:
  """Trains the saved plan's unfinished runs in order, after printing their estimated end; a stop
  signal inside a run raises ``KeyboardInterrupt`` once the run has saved its step. Each run
  records its own sessions' wall time and load (``locvit.workdir.provenance``), which the report
  reads. A plan saved with ``side_by_side`` trains each row's seeds in one run
  (``config.num_seeds``, ``DIR/ROW/seedK`` each)."""
  from locvit import train

  runs = plan_runs(plan, saved["seeds"], saved_rows(saved, plan))
  todo = [(s, r) for s, r in runs if not is_finished(run_dir(workdir, r, s), row_steps(saved, r))]
  if saved.get("side_by_side"):
    train_side_by_side(plan, saved, configs, workdir, len(runs) - len(todo), len(runs))
    return
  announce(saved, [r for _, r in todo], len(runs) - len(todo), len(runs))
  for seed, row in todo:
    path = run_dir(workdir, row, seed)
    print(f"\n== {row} seed {seed}: {path}", flush=True)
    result = train.train_and_evaluate(config_of_run(plan, saved, configs, row, seed), path)
    if result.get("preempted"):
      raise KeyboardInterrupt


def train_side_by_side(plan, saved, configs, workdir: str, finished: int, planned: int) -> None:
  """Trains each row with an unfinished seed as one run of all its seeds side by side in
  ``DIR/ROW`` (seed K in ``DIR/ROW/seedK``, as separate runs would be), resuming it where its
  seeds stopped."""
  from locvit import train

  rows = [
    row
    for row in saved_rows(saved, plan)
    if not all(
      is_finished(run_dir(workdir, row, seed), row_steps(saved, row))
      for seed in range(saved["seeds"])
    )
  ]
  announce(saved, rows, finished, planned, f" ({saved['seeds']} seeds side by side per row)")
  for row in rows:
    path = os.path.join(workdir, row)
    print(f"\n== {row} seeds 0-{saved['seeds'] - 1} side by side: {path}", flush=True)
    config = config_of_run(plan, saved, configs, row, 0)
    config.num_seeds = saved["seeds"]
    if train.train_and_evaluate(config, path).get("preempted"):
      raise KeyboardInterrupt


def announce(saved, runs: list[str], finished: int, planned: int, how: str = "") -> None:
  """Prints the runs finished and the estimated end of ``runs`` (each named by its row)."""
  remaining = sum(
    run_seconds(RowCost(**saved_cost(saved, r)), row_steps(saved, r), row_evaluations(saved, r))
    for r in runs
  )
  end = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=remaining)
  print(
    f"{finished} of {planned} runs finished{how}; estimated end {end:%Y-%m-%d %H:%M} UTC.",
    flush=True,
  )
