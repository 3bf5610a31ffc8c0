"""A plan's rows as configs, the runs they make and where each run lives.

``locvit.configs.reproduce_plans.PLANS`` names each plan's rows as shipped configs; this module
turns them into configs (with ``--rows``, ``--data`` and ``--fraction`` as given), lists the runs
in training order and names each run's workdir, ``DIR/ROW/seedK``. ``ReproduceError`` is every
stage's refusal: a problem the user fixes, printed as one line by the command.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from typing import Any

import ml_collections

from locvit.configs import datasets
from locvit.configs.reproduce_plans import PLANS
from locvit.run import config as run_config


class ReproduceError(ValueError):
  """A problem the user fixes (unknown plan, missing data, budget too small): one clear line."""


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

  config = run_config.load(row["config"])
  if row.get("data") == "cifar10_image_folder":
    cifar10_image_folder(config)
  if row.get("init"):
    config.init = init_block(row["init"])
  for key, value in row["overrides"].items():
    set_dotted(config, key, value)
  return config


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


def plan_configs(
  plan: dict[str, Any], rows: Sequence[str], data: str, tfds_data_dir: str | None
) -> dict[str, ml_collections.ConfigDict]:
  """The configs of ``rows``. ``data`` reads their CIFAR-10 image-folder rows from elsewhere, as
  locvit.main's ``--data`` does (``tfds[:DATA_DIR]``, ``image_folder:DIR`` or ``DIR``);
  'image_folder' keeps ``$CIFAR10_ROOT``. ``tfds_data_dir`` is ``tfds``'s DATA_DIR given apart.
  Their local paths are absolute (``locvit.run.config.with_absolute_paths``), as locvit.main's."""
  configs = {row: row_config(plan["rows"][row]) for row in rows}
  if tfds_data_dir is not None:
    if data != "tfds":
      raise ReproduceError(
        f"--tfds_data_dir goes with --data=tfds only (given --data={data}); give the data one "
        f"way: --data=tfds:{tfds_data_dir}, or --data={data} alone"
      )
    data = f"tfds:{tfds_data_dir}"
  if data != "image_folder":
    try:
      datasets.parse_data_flag(data)  # refused even where no row reads an image folder
      for row, config in configs.items():
        if config.data.source == "image_folder":
          configs[row] = datasets.apply_data_flag(config, data)
    except ValueError as e:
      raise ReproduceError(str(e)) from None
  return {row: run_config.with_absolute_paths(config) for row, config in configs.items()}


def run_dir(workdir: str, row: str, seed: int) -> str:
  """The workdir of one run: ``WORKDIR/ROW/seedK``."""
  return os.path.join(workdir, row, f"seed{seed}")


def plan_runs(
  plan: dict[str, Any], seeds: int, rows: Sequence[str] | None = None
) -> list[tuple[int, str]]:
  """(seed, row) in training order: seeds alternate between rows (``rows``, default all)."""
  return [(seed, row) for seed in range(seeds) for row in (rows or plan["rows"])]


def row_steps(saved: dict[str, Any], row: str) -> int:
  """The steps of ``row``'s runs in a saved plan (budget plans before per-row steps: one count)."""
  return saved["rows"][row].get("steps", saved.get("steps"))


def saved_rows(saved: dict[str, Any], plan: dict[str, Any]) -> list[str]:
  """The rows a saved plan runs (every row of a plan saved before ``--rows``)."""
  return saved.get("row_names") or list(plan["rows"])


def saved_cost(saved: dict[str, Any], row: str) -> dict[str, Any]:
  """A saved row's ``RowCost`` fields (without its steps and evaluations)."""
  return {k: v for k, v in saved["rows"][row].items() if k not in ("steps", "evaluations")}


def row_evaluations(saved: dict[str, Any], row: str) -> int:
  """The evaluations of each of ``row``'s runs in a saved plan (budget plans: the final one)."""
  return saved["rows"][row].get("evaluations", 1)


def official_evaluation(plan: dict[str, Any]) -> dict[str, Any]:
  """How the paper's code evaluated (a protocol plan's ``evaluation``): ``every_epochs``, which
  top-1 it reported (``paper_reports``: 'best' over its evaluations, or 'final') and ``code``,
  where the official code does it. A plan without one evaluates every epoch and reports the
  final top-1."""
  return {
    "every_epochs": 1,
    "paper_reports": "final",
    "code": "not stated",
    **plan.get("evaluation", {}),
  }


def default_seeds(plan: dict[str, Any]) -> int:
  """The plan's seeds per row without ``--seeds``: its ``seeds``, else 1 for a protocol plan and
  2 for a budget plan."""
  return plan.get("seeds") or (1 if plan.get("protocol") else 2)


def cadence_words(every_epochs: float) -> str:
  """'every epoch' or 'every 3 epochs'."""
  return "every epoch" if every_epochs == 1 else f"every {every_epochs:g} epochs"
