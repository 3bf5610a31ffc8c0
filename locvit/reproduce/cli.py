"""``python -m locvit.reproduce``: flags, modes (run, ``--dry_run``, ``--report``, ``--pack``) and
exits. Every refusal is one ``locvit.reproduce: error: ...`` line and exit status 2, before
anything is created."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from locvit.choices import ArgumentParser
from locvit.configs.reproduce_plans import PLANS
from locvit.platform import cpu_malloc
from locvit.reproduce import protocol
from locvit.reproduce.budget import describe_budget_dry_run, measure
from locvit.reproduce.data_checks import (
  check_batches,
  check_data,
  check_protocol_data,
)
from locvit.reproduce.plans import (
  ReproduceError,
  default_seeds,
  get_plan,
  official_evaluation,
  parse_fraction,
  plan_configs,
  select_rows,
)
from locvit.reproduce.runs import reproduce
from locvit.reproduce.seeds import seeds_words
from locvit.run import preemption
from locvit.workdir import saved_config

USAGE = "Reproduce a paper table in one command, within a time budget."


def dry_run(
  name: str,
  minutes: float | None = None,
  seeds: int | None = None,
  fraction: float | str = 1.0,
  rows: str | None = None,
  probe_here: bool = False,
  data: str = "image_folder",
  tfds_data_dir: str | None = None,
  allow_lossy_data: bool = False,
  print_config: bool = False,
) -> str:
  """The plan, printed, and nothing created: rows, seeds, model, batch, epochs, images per run
  and the estimated wall time (a probe here with ``probe_here``, else the kit's H200 figures);
  a protocol plan's rows in full. With ``print_config``, each row's resolved config instead, as
  JSON (``row_configs_json``). A protocol plan that does not fit ``minutes``, or reads a JPEG
  folder without ``allow_lossy_data``, raises ``ReproduceError``."""
  plan = get_plan(name)
  configs = plan_configs(plan, select_rows(plan, rows), data, tfds_data_dir)
  seeds = seeds or default_seeds(plan)
  if plan.get("protocol"):
    check_protocol_data(plan, configs, allow_lossy_data)
  costs = None
  if probe_here:
    for row, config in configs.items():
      check_data(config, row)
    check_batches(plan, configs)
    probed = protocol.side_by_side(configs, seeds) if plan.get("protocol") else configs
    with tempfile.TemporaryDirectory(prefix="locvit-dry-run-") as scratch:
      costs = measure(probed, os.path.join(scratch, "_probe"))
  if not plan.get("protocol"):
    if print_config:
      raise ReproduceError(
        f"--print_config: {name!r} is a budget plan, whose steps a probe on the machine sets "
        "when it runs; its rows' configs are the shipped ones: python -m locvit.main "
        f"--config={plan['rows'][next(iter(configs))]['config']} --print_config"
      )
    text = describe_budget_dry_run(plan, configs, seeds, minutes or 60.0, costs)
    print(text + "\nNothing was created (--dry_run).", flush=True)
    return text
  table, fraction, total, source = protocol.protocol_estimate(
    plan, configs, seeds, minutes, fraction, costs
  )
  if print_config:
    protocol.check_fits(name, total, minutes, 0.0, table, seeds)
    text = row_configs_json(plan, configs, fraction, seeds)
    print(text, flush=True)
    return text
  text = protocol.describe_protocol(plan, table, fraction, seeds, total, source)
  text += "\n" + seeds_words(plan, seeds, list(configs))
  print(text + "\nNothing was created (--dry_run).", flush=True)
  protocol.check_fits(name, total, minutes, 0.0, table, seeds)
  return text


def row_configs_json(plan: dict[str, Any], configs, fraction: float, seeds: int) -> str:
  """``{row: DIR/config.json's record}`` of each row's run at ``fraction`` of the protocol, its
  ``seeds`` seeds side by side from seed 0 (``DIR/ROW/config.json``; each seed's own
  ``DIR/ROW/seedK/config.json`` differs in ``seed`` and ``num_seeds=1``), as JSON: every setting
  the run will train with."""
  every = official_evaluation(plan)["every_epochs"]
  records = {}
  for row, config in configs.items():
    spec = plan["rows"][row]
    run = protocol.protocol_config(config, spec["paper_train_examples"], fraction, 0, every)
    run.num_seeds = seeds
    records[row] = saved_config.record(run, plan_command())
  return json.dumps(records, indent=2)


def plan_command() -> list[str]:
  """This command line without ``--dry_run`` / ``--print_config``: the command that trains the plan
  (what each row's ``DIR/config.json`` then records), not the dry run that prints it."""
  dry = ("--dry_run", "--print_config", "--dry_run=true", "--print_config=true")
  return [arg for arg in sys.orig_argv if arg not in dry]


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


def parser() -> ArgumentParser:
  """The command's flags."""
  p = ArgumentParser(prog="python -m locvit.reproduce", description=USAGE)
  p.add_argument("plan", help=f"one of: {', '.join(sorted(PLANS))}")
  p.add_argument("--workdir", default=None, help="required except with --dry_run")
  p.add_argument(
    "--minutes",
    type=float,
    default=None,
    help="total budget, probes included (budget plans: default 60; protocol plans: refused when "
    "their estimate does not fit)",
  )
  p.add_argument(
    "--seeds",
    type=int,
    default=None,
    help="seeds per row (default: the plan's; budget plans 2). --dry_run says what the paper's "
    "smallest gap needs",
  )
  p.add_argument("--report", action="store_true", help="only write results.md/.json now")
  p.add_argument(
    "--pack",
    default=None,
    metavar="FILE",
    help="write --workdir as a .tar.gz to continue elsewhere: each run's newest checkpoint only, "
    "no best/",
  )
  p.add_argument(
    "--dry_run", action="store_true", help="print the plan and its estimate; create nothing"
  )
  p.add_argument(
    "--print_config",
    action="store_true",
    help="with --dry_run, protocol plans: print each row's resolved config (seed 0's) as JSON, in "
    "the format of a run's DIR/config.json, instead of the plan",
  )
  p.add_argument(
    "--estimate",
    choices=("probe", "kit"),
    default=None,
    help="protocol plans' time estimate: a short probe of each row here (default for a run) or "
    "the accelerator kit's H200 figures (default with --dry_run; skips the probe on a GPU)",
  )
  p.add_argument(
    "--fraction",
    default="1",
    help="protocol plans: train this fraction (0, 1] of the paper's epochs, schedule shrunk "
    "alike, or 'fit': the largest that fits --minutes",
  )
  p.add_argument(
    "--rows", default=None, help="comma-separated rows to run (default: all but optional ones)"
  )
  p.add_argument(
    "--data",
    default="image_folder",
    help="where CIFAR-10 is read from, as locvit.main's --data: 'image_folder' ($CIFAR10_ROOT, "
    "the default), 'image_folder:DIR' (or DIR), 'tfds' or 'tfds:DATA_DIR'",
  )
  p.add_argument(
    "--allow_lossy_data",
    action="store_true",
    help="protocol plans: train on a JPEG image folder anyway (refused without it: the papers "
    "used the original images; the report's title then says the data was lossy)",
  )
  p.add_argument(
    "--tfds_data_dir",
    default=None,
    help="with --data=tfds: the data_dir CIFAR-10 was prepared in (default: TFDS's own); the "
    "same as --data=tfds:DATA_DIR",
  )
  return p


def checked_args(args) -> float | str:
  """``--fraction`` (refused for a budget plan, and as 'fit' without ``--minutes``), after the
  plan (an unknown one is refused first, whatever the mode) and ``--seeds``."""
  fraction = parse_fraction(args.fraction)
  plan = get_plan(args.plan)
  if args.print_config and not args.dry_run:
    raise ReproduceError("--print_config goes with --dry_run")
  if args.seeds is not None and args.seeds < 1:
    raise ReproduceError(f"--seeds={args.seeds}: must be 1 or more")
  if fraction != 1 and not plan.get("protocol"):
    raise ReproduceError(f"--fraction is for paper-protocol plans; {args.plan!r} is a budget plan")
  if fraction == "fit" and args.minutes is None:
    raise ReproduceError("--fraction=fit needs --minutes")
  return fraction


def write_report_now(name: str, workdir: str) -> int:
  """``--report``: the report of what has finished so far."""
  from locvit.reproduce import report as reproduce_report

  try:
    reproduce_report.write_report(name, workdir)
  except ValueError as e:  # no plan.json yet
    raise ReproduceError(str(e)) from e
  return 0


def run_mode(args) -> int:
  """The mode the flags name, run; its exit status (130: stopped, everything saved)."""
  fraction = checked_args(args)
  if args.dry_run:
    dry_run(
      args.plan, args.minutes, args.seeds, fraction, args.rows, args.estimate == "probe",
      args.data, args.tfds_data_dir, args.allow_lossy_data, args.print_config,
    )  # fmt: skip
    return 0
  if args.workdir is None:
    raise ReproduceError("--workdir is required (except with --dry_run)")
  if args.pack:
    return pack_workdir(args.plan, args.workdir, args.pack)
  if args.report:
    return write_report_now(args.plan, args.workdir)
  result = reproduce(
    args.plan, args.workdir, args.minutes, args.seeds, args.data, args.tfds_data_dir,
    fraction, args.rows, args.estimate != "kit", args.allow_lossy_data,
  )  # fmt: skip
  return 0 if result is not None else 130


def main(argv: Sequence[str] | None = None) -> int:
  """``python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]``, or
  ``PLAN --dry_run [--estimate=probe]``.

  Returns the exit status.
  """
  args = parser().parse_args(argv)
  if argv is None:  # the command line, as locvit.main: TCMalloc where installed (README, "On CPU")
    cpu_malloc.reexec_with("auto")
    preemption.redeliver_swallowed_stops({KeyboardInterrupt: signal.SIGINT})
  try:
    return run_mode(args)
  except ReproduceError as e:
    print(f"locvit.reproduce: error: {e}", file=sys.stderr)
    return 2
