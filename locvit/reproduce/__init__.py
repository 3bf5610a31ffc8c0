"""Reproduce a paper table in one command, within a time budget.

  python -m locvit.reproduce PLAN --minutes=M --workdir=DIR [--seeds=K] [--report]
  python -m locvit.reproduce PLAN --dry_run [--estimate=probe] [--minutes=M] [--fraction=F]
  python -m locvit.reproduce PLAN --dry_run --print_config   # each row's config, as config.json
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
``--fraction`` of it, evaluating as the official code did (the report gives the final and the
best top-1), on lossless data (a JPEG folder only with ``--allow_lossy_data``), and are refused
when their estimate does not fit ``--minutes``. A run
survives its machine: copy DIR to another machine (or ``--pack`` it: each run's newest checkpoint
only) and run the same command there; it continues from the last checkpoint. ``--dry_run`` prints
the plan and its estimate and creates nothing.

The stages, one module each: ``plans`` (a plan's rows as configs, its runs and their workdirs;
``ReproduceError``), ``data_checks`` (the data each row reads, checked before any run),
``budget`` (probes and the equal-steps split of budget plans), ``protocol`` (paper-protocol plans
and their estimates), ``seeds`` (what a plan's seeds can separate), ``runs`` (the saved plan and
its runs, trained or resumed), ``cli`` (the command), ``report`` (``results.md``) and ``pack`` (a
workdir packed to move).
"""

from locvit.configs.reproduce_plans import PLANS
from locvit.reproduce import protocol
from locvit.reproduce.budget import (
  RowCost,
  budgeted_config,
  probe,
  run_seconds,
  split_budget,
  warmup_fraction,
)
from locvit.reproduce.cli import dry_run, main
from locvit.reproduce.data_checks import check_data
from locvit.reproduce.plans import (
  ReproduceError,
  get_plan,
  plan_configs,
  plan_runs,
  row_config,
  run_dir,
  select_rows,
)
from locvit.reproduce.runs import config_of_run, is_finished, load_or_make_plan, reproduce

__all__ = [
  "PLANS",
  "ReproduceError",
  "RowCost",
  "budgeted_config",
  "check_data",
  "config_of_run",
  "dry_run",
  "get_plan",
  "is_finished",
  "load_or_make_plan",
  "main",
  "plan_configs",
  "plan_runs",
  "probe",
  "protocol",
  "reproduce",
  "row_config",
  "run_dir",
  "run_seconds",
  "select_rows",
  "split_budget",
  "warmup_fraction",
]
