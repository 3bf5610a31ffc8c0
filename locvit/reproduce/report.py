"""The table of a reproduced plan: ``DIR/results.md`` and ``DIR/results.json``.

Per row, the paper's top-1, ours (final top-1 as mean +- sample sd over the finished seeds) and
the difference; the ordering the paper's numbers claim and whether ours held it; the data, the
devices, the images/s, the wall time and the locvit commit that trained the runs (per row, with
step ranges, where runs continued under another commit: ``locvit.workdir.provenance``); any step
cap. A run continued across machines counts the wall time of all its sessions (each run's
``commits.json``; a lower bound, and said so, when a session was killed before recording its end),
and its images/s per device kind that trained its steps.
Per comparison (baseline, treatment), the per-seed paired differences of top-1, their mean, and
the paired t statistic t = mean(d) / (sd(d) / sqrt(n)) with n - 1 degrees of freedom and its
two-sided p (Student's t distribution).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
from typing import Any

from scipy import stats

from locvit import metrics as metrics_lib
from locvit.configs.reproduce_plans import PLANS
from locvit.reproduce.plans import cadence_words
from locvit.reproduce.seeds import within_spread_words
from locvit.workdir import provenance
from locvit.workdir.provenance import locvit_commit

NOISE_P = 0.05


def final_evaluation(workdir: str, steps: int) -> dict[str, float] | None:
  """``eval/top1`` and ``eval/top5`` of ``workdir``'s step ``steps``, and the best ``eval/top1``
  of its evaluations up to it (``best_top1``, at ``best_step``), or None if not finished."""
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return None
  evaluated = [
    r for r in metrics_lib.read_metrics(workdir) if "eval/top1" in r and r["step"] <= steps
  ]
  final = [r for r in evaluated if r["step"] == steps]
  if not final:
    return None
  best = max(evaluated, key=lambda r: r["eval/top1"])  # the first of equal ones
  return {
    "top1": final[-1]["eval/top1"],
    "top5": final[-1]["eval/top5"],
    "best_top1": best["eval/top1"],
    "best_step": best["step"],
  }


UNRECORDED_DEVICE = "an unrecorded device"  # steps trained before the run kept DIR/commits.json


def device_ranges(entries: list[dict[str, Any]], steps: int) -> list[provenance.StepRange]:
  """Steps 1-``steps`` of a run by the device kind that trained them (its ``commits.json``)."""
  return provenance.step_ranges(entries, steps, UNRECORDED_DEVICE, "device_kind")


def training_rates(
  workdir: str, entries: list[dict[str, Any]], ranges: list[provenance.StepRange], steps: int
) -> dict[str, list]:
  """The run's logged training images/s (compilation and evaluation excluded) by the device kind
  that trained each logged step (``entries``: its ``DIR/commits.json``; ``ranges``: theirs by
  ``device_ranges``): each log line's rate but those of a session's first step, which include the
  compilation (all, if that is every one)."""
  compiled = {1} | {e["first_step"] for e in entries}
  kept: dict[str, list[float]] = {kind: [] for _, _, kind, _ in ranges}
  every = {kind: [] for kind in kept}
  for r in metrics_lib.read_metrics(workdir):
    if "perf/images_per_sec" in r and 1 <= r["step"] <= steps:
      kind = next(kind for first, last, kind, _ in ranges if first <= r["step"] <= last)
      every[kind].append(r["perf/images_per_sec"])
      if r["step"] not in compiled:
        kept[kind].append(r["perf/images_per_sec"])
  return {kind: kept[kind] or every[kind] for kind in kept}


def device_steps(ranges: list[provenance.StepRange]) -> dict[str, list[list[int]]]:
  """The step ranges ``[first, last]`` of the run that each device kind trained (``ranges``: by
  ``device_ranges``)."""
  by_kind: dict[str, list[list[int]]] = {}
  for first, last, kind, _ in ranges:
    by_kind.setdefault(kind, []).append([first, last])
  return by_kind


def run_load_averages(entries: list[dict[str, Any]]) -> list[float]:
  """The 1-minute load averages seen while the run trained, in every session on every machine."""
  return [load for e in entries for load in e.get("load_average", ())]


def ordering(rows: dict[str, dict[str, Any]], key: str = "top1_mean") -> dict[str, Any] | None:
  """The ordering the paper's numbers claim (best first; equal numbers tie) and whether our
  means (``key``: of the final or the best top-1) hold every strict pair of it. None when fewer
  than two rows have a paper number."""
  ranked = sorted(
    (r for r in rows if rows[r]["paper_top1"] is not None),
    key=lambda r: -rows[r]["paper_top1"],
  )
  if len(ranked) < 2:
    return None
  pairs = [
    (better, worse)
    for i, better in enumerate(ranked)
    for worse in ranked[i + 1 :]
    if rows[better]["paper_top1"] > rows[worse]["paper_top1"]
  ]
  measured = [(b, w) for b, w in pairs if None not in (rows[b][key], rows[w][key])]
  broken = [(b, w) for b, w in measured if rows[b][key] <= rows[w][key]]
  claim = ranked[0]
  for previous, row in itertools.pairwise(ranked):
    equal = rows[row]["paper_top1"] == rows[previous]["paper_top1"]
    claim += (" = " if equal else " > ") + row
  ours = sorted((r for r in ranked if rows[r][key] is not None), key=lambda r: -rows[r][key])
  return {
    "paper": claim,
    "ours": " > ".join(ours),
    "held": None if len(measured) < len(pairs) else not broken,
    "broken_pairs": broken,
  }


def median_or_none(values: list[float]) -> float | None:
  """The median of ``values``; None for none."""
  return statistics.median(values) if values else None


def mean_sd(values: list[float]) -> tuple[float | None, float | None]:
  """Mean and sample standard deviation (None for fewer than 1 or 2 values)."""
  if not values:
    return None, None
  return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def paired_t(differences: list[float]) -> dict[str, Any]:
  """Paired t test of per-seed differences (the same as scipy.stats.ttest_rel on the pairs)."""
  n = len(differences)
  result: dict[str, Any] = {"n": n, "mean": statistics.fmean(differences) if n else None}
  result.update(sd=None, t=None, df=None, p=None)
  if n < 2:
    return result
  sd = statistics.stdev(differences)
  result.update(sd=sd, df=n - 1)
  if sd == 0:
    return result
  t = result["mean"] / (sd / math.sqrt(n))
  result.update(t=t, p=2 * stats.t.sf(abs(t), n - 1))
  return result


def verdict(test: dict[str, Any]) -> str:
  """The plain-words reading of a paired t test: significant at p < 0.05, or within noise."""
  if test["p"] is None:
    return "not testable (fewer than 2 paired seeds or identical differences)"
  if test["p"] >= NOISE_P:
    return f"within noise (p = {test['p']:.2f} >= {NOISE_P})"
  return f"significant at p < {NOISE_P} (p = {test['p']:.3f})"


def machine() -> dict[str, Any]:
  """The JAX backend, device kind and count, and CPU count of this machine."""
  import jax

  return {
    "jax_backend": jax.default_backend(),
    "device_kind": jax.devices()[0].device_kind,
    "device_count": jax.device_count(),
    "cpu_count": os.cpu_count(),
  }


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


@dataclasses.dataclass
class RowRuns:
  """What a row's finished runs left: per seed their final evaluation, the device kinds and the
  commits that trained their steps; their training images/s per device kind and wall seconds."""

  finals: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
  rates: dict[str, list[float]] = dataclasses.field(default_factory=dict)
  devices: dict[str, dict[int, list[list[int]]]] = dataclasses.field(default_factory=dict)
  trained_by: dict[int, list[provenance.StepRange]] = dataclasses.field(default_factory=dict)
  wall_seconds: list[float] = dataclasses.field(default_factory=list)
  wall_exact: bool = True
  loads: list[float] = dataclasses.field(default_factory=list)
  recorded: bool = False  # whether any run kept DIR/ROW/seedK/commits.json


def read_row_runs(workdir: str, row: str, seeds: int, steps: int, plan_commit: str) -> RowRuns:
  """The finished runs of ``row`` in ``workdir`` (``DIR/ROW/seedK``), read from their metrics and
  their sessions (``commits.json``: wall time over every session, on every machine)."""
  runs = RowRuns()
  for seed in range(seeds):
    run = os.path.join(workdir, row, f"seed{seed}")
    final, recorded = final_evaluation(run, steps), provenance.read(run)
    runs.loads += run_load_averages(recorded)
    if final is None:
      continue
    runs.finals[seed] = final
    kinds = device_ranges(recorded, steps)
    for kind, kind_rates in training_rates(run, recorded, kinds, steps).items():
      runs.rates.setdefault(kind, []).extend(kind_rates)
    for kind, ranges in device_steps(kinds).items():
      runs.devices.setdefault(kind, {})[seed] = ranges
    runs.trained_by[seed] = provenance.step_ranges(recorded, steps, plan_commit, "commit")
    runs.recorded |= bool(recorded)
    if any("seconds" in e for e in recorded):
      seconds, exact = provenance.wall_time(recorded)
      runs.wall_seconds.append(seconds)
      runs.wall_exact &= exact
  return runs


def row_result(
  spec: dict[str, Any], cost: dict[str, Any], steps: int, runs: RowRuns, reported: str = "final"
):
  """One row of ``results.json``: the paper's top-1 beside the mean and sd of ours (final and
  best; ``reported``: which one the paper's code reported, the one the difference takes), the
  rates, the wall time, the length against the paper's and the commits that trained it."""
  top1_mean, top1_sd = mean_sd([f["top1"] for f in runs.finals.values()])
  best_mean, best_sd = mean_sd([f["best_top1"] for f in runs.finals.values()])
  top5_mean, top5_sd = mean_sd([f["top5"] for f in runs.finals.values()])
  paper = spec["paper_top1"]
  ours = best_mean if reported == "best" else top1_mean
  rates = runs.rates
  return {
    "config": spec["config"],
    "overrides": spec["overrides"],
    "seeds_finished": sorted(runs.finals),
    "top1_per_seed": {s: f["top1"] for s, f in runs.finals.items()},
    "top1_mean": top1_mean,
    "top1_sd": top1_sd,
    "best_top1_per_seed": {s: f["best_top1"] for s, f in runs.finals.items()},
    "best_step_per_seed": {s: f["best_step"] for s, f in runs.finals.items()},
    "best_top1_mean": best_mean,
    "best_top1_sd": best_sd,
    "top5_mean": top5_mean,
    "top5_sd": top5_sd,
    "paper_top1": paper,
    "paper_reports": reported,  # the top-1 the paper's code reported: 'best' or 'final'
    "difference": ours - paper if None not in (ours, paper) else None,
    # The median logged rate where one device kind trained the row; else per kind (devices).
    "images_per_sec": median_or_none(*rates.values()) if len(rates) == 1 else None,
    "devices": [
      {
        "device_kind": kind,
        "images_per_sec": median_or_none(rates[kind]),
        "steps": by_seed,  # per seed: the [first, last] step ranges this kind trained
      }
      for kind, by_seed in runs.devices.items()
    ],
    "wall_minutes_per_run": statistics.fmean(runs.wall_seconds) / 60 if runs.wall_seconds else None,
    "wall_seconds_per_seed": runs.wall_seconds,  # of the finished seeds, over all their sessions
    "wall_exact": runs.wall_exact,  # else a lower bound: a session did not record its end
    "steps": steps,
    "epochs": steps / cost["steps_per_epoch"],
    "paper_epochs": spec["paper_epochs"],
    "paper_budget_fraction": steps
    * cost["batch_size"]
    / (spec["paper_epochs"] * spec["paper_train_examples"]),
    "steps_per_sec": cost["steps_per_sec"],
    "trained_by": {s: [commit_range(r) for r in rs] for s, rs in runs.trained_by.items()},
  }


def comparisons(
  pairs, finals: dict[str, dict[int, dict[str, float]]], metric: str = "top1"
) -> list[dict[str, Any]]:
  """Per (baseline, treatment) pair whose rows ran: the per-seed paired differences of ``metric``
  ('top1': final, 'best_top1': the best evaluation) and their paired t test."""
  compared = []
  for base, treat in pairs:
    if base not in finals or treat not in finals:  # a row this plan's --rows left out
      continue
    paired = sorted(set(finals[base]) & set(finals[treat]))
    diffs = [finals[treat][s][metric] - finals[base][s][metric] for s in paired]
    test = paired_t(diffs)
    compared.append(
      {
        "baseline": base,
        "treatment": treat,
        "seeds": paired,
        "top1_differences": diffs,
        "metric": "best" if metric == "best_top1" else "final",
        **test,
        "verdict": verdict(test),
      }
    )
  return compared


def report_title(plan: dict[str, Any], saved: dict[str, Any]) -> str:
  """The plan's title; a protocol plan's says at what fraction of the paper's protocol, and
  whether it trained on lossy data (``--allow_lossy_data``)."""
  title = plan["title"]
  if saved.get("protocol"):
    fraction = saved.get("fraction", 1.0)
    title += ", at " + (
      "the paper's protocol" if fraction == 1 else f"{fraction:.3g} of the paper's protocol"
    )
  if saved.get("lossy_data"):
    title += ", on LOSSY JPEG data (--allow_lossy_data; the papers used the original images)"
  return title


def build_report(name: str, workdir: str) -> dict[str, Any]:
  """Per-row means and per-comparison paired statistics of the finished runs in ``workdir``."""
  plan = PLANS[name]
  saved = _read_json(os.path.join(workdir, "plan.json"))
  if saved is None:
    raise ValueError(
      f"{workdir} holds no plan.json: run `python -m locvit.reproduce {name} --workdir={workdir}` "
      "first"
    )
  seeds, plan_commit = saved["seeds"], saved.get("locvit_commit") or "unknown"
  evaluation = saved.get("evaluation")  # plans saved before it evaluated 10 times, final only
  reported = (evaluation or {"paper_reports": "final"})["paper_reports"]
  rows, runs = {}, {}
  for row in saved.get("row_names") or plan["rows"]:
    cost = saved["rows"][row]
    steps = cost.get("steps", saved.get("steps"))
    runs[row] = read_row_runs(workdir, row, seeds, steps, plan_commit)
    rows[row] = row_result(plan["rows"][row], cost, steps, runs[row], reported)
  loads = [load for r in runs.values() for load in r.loads]
  # Seeds side by side share their sessions: a row's training time is one seed's, not the sum.
  row_wall = max if saved.get("side_by_side") else sum
  metric = "best_top1" if reported == "best" else "top1"
  compared = comparisons(plan["comparisons"], {r: runs[r].finals for r in runs}, metric)
  for c in compared:
    papers = [rows[c[k]]["paper_top1"] for k in ("baseline", "treatment")]
    c["paper_difference"] = None if None in papers else papers[1] - papers[0]
    c["within_seed_spread"] = within_spread_words(c, c["paper_difference"])
  return {
    "plan": name,
    "title": report_title(plan, saved),
    "note": plan.get("note"),  # what the paper's own numbers leave open, in one sentence
    "protocol": bool(saved.get("protocol")),
    "fraction": saved.get("fraction", 1.0),
    "max_steps": None if saved.get("protocol") else plan.get("max_steps"),
    "data": saved.get("data"),
    "rows": rows,
    "evaluation": evaluation,
    "ordering": ordering(rows, "best_top1_mean" if reported == "best" else "top1_mean"),
    "comparisons": compared,
    "machine": machine(),
    "locvit_commit": saved.get("locvit_commit"),  # of the plan; plans before it was kept lack it
    "runs_recorded_commits": any(r.recorded for r in runs.values()),
    "report_commit": locvit_commit(),
    "budget_minutes": saved["minutes"],
    "estimated_minutes": saved.get("estimated_minutes"),
    "runs_finished": sum(len(r.finals) for r in runs.values()),
    "runs_planned": seeds * len(rows),
    "training_wall_minutes": sum(row_wall(r["wall_seconds_per_seed"] or [0]) for r in rows.values())
    / 60,
    "training_wall_exact": all(r["wall_exact"] for r in rows.values()),
    "devices_trained": sorted({d["device_kind"] for r in rows.values() for d in r["devices"]}),
    "load_average_range": [min(loads), max(loads)] if loads else None,
    "load_at_probe": saved["load_at_probe"],
  }


def _pct(mean: float | None, sd: float | None) -> str:
  if mean is None:
    return "-"
  return f"{100 * mean:.2f}" + (f" +- {100 * sd:.2f}" if sd is not None else "")


def _points(value: float | None, sign: bool = False) -> str:
  if value is None:
    return "-"
  return f"{100 * value:+.2f}" if sign else f"{100 * value:.2f}"


def commit_range(r: provenance.StepRange) -> dict[str, Any]:
  """A range of steps by commit, as ``results.json`` keeps it."""
  return {"first": r.first, "last": r.last, "commit": r.value, "recorded": r.recorded}


def trained_by_words(ranges: list[dict[str, Any]]) -> str:
  """'commit A', or 'steps 1-13 at commit A, 14-33 at commit B' (``commit_range``s); steps
  trained before the run kept a record are the plan's commit, and say so."""
  name = lambda s: s["commit"] if s["recorded"] else f"{s['commit']} (not recorded: the plan's)"
  if len(ranges) == 1:
    return f"commit {name(ranges[0])}"
  return "steps " + ", ".join(f"{s['first']}-{s['last']} at commit {name(s)}" for s in ranges)


def commit_words(report: dict[str, Any]) -> str:
  """'locvit commit A' when one commit trained every finished run (or no run kept a record: the
  plan's), else per row, and per seed where a row's seeds differ: 'locvit commits: vit: steps
  1-13 at commit A, 14-33 at commit B; gmm: commit B'."""
  entries = []
  for row, r in report["rows"].items():
    by_seed = {seed: trained_by_words(ranges) for seed, ranges in r["trained_by"].items()}
    if len(set(by_seed.values())) == 1:
      entries.append((row, next(iter(by_seed.values()))))
    else:
      entries += [(f"{row} seed {seed}", words) for seed, words in by_seed.items()]
  if not report.get("runs_recorded_commits") or not entries:
    return f"locvit commit {report['locvit_commit'] or 'not recorded'}"
  if len({words for _, words in entries}) == 1 and entries[0][1].startswith("commit "):
    return f"locvit {entries[0][1]}"
  return "locvit commits: " + "; ".join(f"{row}: {words}" for row, words in entries)


def steps_words(by_seed: dict[int, list[list[int]]], seeds: int) -> str:
  """'steps 1-13, 20-33' when every one of the ``seeds`` finished seeds has these ranges, else
  per seed: 'seed 0 steps 1-13; seed 1 steps 1-20'."""
  words = {seed: ", ".join(f"{a}-{b}" for a, b in ranges) for seed, ranges in by_seed.items()}
  if len(set(words.values())) == 1 and len(words) == seeds:
    return "steps " + next(iter(words.values()))
  return "; ".join(f"seed {seed} steps {w}" for seed, w in words.items())


def rate_words(row: dict[str, Any]) -> str:
  """The img/s cell: '8,400' where one device kind trained the row, else per kind: '8,400 on
  NVIDIA H200 (steps 1-6004), 2,100 on cpu (steps 6005-12000)'."""
  rate = lambda value: f"{value:,.0f}" if value else "-"
  devices = row.get("devices") or []
  if len(devices) <= 1:
    return rate(row.get("images_per_sec"))
  seeds = len(row["seeds_finished"])
  return ", ".join(
    f"{rate(d['images_per_sec'])} on {d['device_kind']} ({steps_words(d['steps'], seeds)})"
    for d in devices
  )


def machine_words(report: dict[str, Any], load: list[float] | None) -> str:
  """The device line: this machine's, as before, when it is the device kind that trained every
  run (or no run recorded one); else each device kind that trained steps, then this machine."""
  m, kinds = report["machine"], report.get("devices_trained") or []
  if load:
    here = (
      f"JAX backend {m['jax_backend']}, device {m['device_kind']} x {m['device_count']}, "
      f"{m['cpu_count']} CPUs; 1-minute load average {load[0]:.1f}-{load[1]:.1f} during the runs."
    )
  else:
    here = f"JAX backend {m['jax_backend']}, device {m['device_kind']}."
  if set(kinds) <= {m["device_kind"], UNRECORDED_DEVICE}:
    return f"Machine: {here}"
  names = ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]
  return (
    f"Devices: steps trained on {names} (img/s per device kind in the table where a row's steps "
    f"span several). This report's machine: {here}"
  )


def rows_table(report: dict[str, Any]) -> list[str]:
  """The rows as a markdown table: the paper's top-1 beside ours (a protocol plan's: final and
  best), the length and the rates."""
  protocol = report.get("protocol")
  ours = "ours final top-1 % | ours best top-1 %" if protocol else "ours top-1 %"
  lines = [
    f"| row | paper top-1 % | {ours} | ours - paper (points) | seeds | top-5 % | "
    "epochs | paper epochs | of paper budget | img/s | minutes per run |",
    "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if protocol else ""),
  ]
  for name, r in report["rows"].items():
    wall = r.get("wall_minutes_per_run")
    at_least = "" if r.get("wall_exact", True) else ">= "
    top1 = _pct(r["top1_mean"], r["top1_sd"])
    if protocol:
      top1 += f" | {_pct(r.get('best_top1_mean'), r.get('best_top1_sd'))}"
    lines.append(
      f"| {name} | {_points(r['paper_top1'])} | {top1} | "
      f"{_points(r.get('difference'), sign=True)} | {len(r['seeds_finished'])} | "
      f"{_pct(r['top5_mean'], r['top5_sd'])} | {r['epochs']:.4g} | {r['paper_epochs']} | "
      f"{r['paper_budget_fraction']:.2%} | {rate_words(r)} | "
      f"{f'{at_least}{wall:.1f}' if wall else '-'} |"
    )
  return lines


def evaluation_words(report: dict[str, Any]) -> str:
  """Which top-1 the paper's code reported, and which one 'ours - paper' and the comparisons
  take."""
  evaluation = report["evaluation"]
  every = evaluation.get("every_epochs", 1)
  cadence = cadence_words(every)
  if evaluation["paper_reports"] == "best":
    reported = (
      f"the paper's code reported the best top-1 of its evaluations ({cadence}; "
      f"{evaluation.get('code', 'not stated')}), so 'ours - paper', the ordering and the "
      "comparisons take our best"
    )
  else:
    reported = "the paper's code reported the final top-1, so 'ours - paper' takes our final"
  return (
    f"Evaluations: ours {cadence} and at the end; final is the last evaluation, best the "
    f"highest; {reported}."
  )


def ordering_words(order: dict[str, Any] | None) -> str:
  """The ordering the paper claims, ours, and whether it held, in one sentence."""
  if order is None:
    return "Ordering: fewer than two rows have a paper number; none is claimed."
  held = {True: "held", False: "did not hold", None: "not yet known (rows unfinished)"}
  broken = ", ".join(f"{b} not above {w}" for b, w in order["broken_pairs"])
  return (
    f"Ordering the paper claims: {order['paper']}. Ours: {order['ours'] or '-'}. "
    f"The paper's ordering {held[order['held']]}" + (f" ({broken})." if broken else ".")
  )


def comparisons_table(compared: list[dict[str, Any]]) -> list[str]:
  """The paired comparisons as a markdown table (none: no lines)."""
  if not compared:
    return []
  lines = [
    "",
    "| comparison | per-seed top-1 differences (points) | mean | paired t (df) | verdict |",
    "|---|---|---|---|---|",
  ]
  for c in compared:
    diffs = ", ".join(f"{100 * d:+.2f}" for d in c["top1_differences"]) or "-"
    mean = f"{100 * c['mean']:+.2f}" if c["mean"] is not None else "-"
    t = f"{c['t']:.2f} ({c['df']})" if c["t"] is not None else "-"
    lines.append(
      f"| {c['treatment']} - {c['baseline']} | {diffs} | {mean} | {t} | {c['verdict']} |"
    )
  return lines


def step_cap_words(report: dict[str, Any]) -> str:
  """Whether the plan's step cap stopped the runs, or the budget gave them fewer steps."""
  cap, steps = report["max_steps"], sorted({r["steps"] for r in report["rows"].values()})
  if steps == [cap]:
    return (
      f"Step cap: every run stopped at the plan's cap of {cap} steps (its max_steps), fewer than "
      "the budget allowed."
    )
  return (
    f"Step cap: the plan caps runs at {cap} steps (its max_steps); the budget gave these "
    f"runs fewer ({'/'.join(map(str, steps))})."
  )


def wall_time_words(report: dict[str, Any]) -> str:
  """The commits, the budget, the runs finished and their training wall time, in one line."""
  exact = report.get("training_wall_exact", True)
  budget = report["budget_minutes"]
  planned = report["estimated_minutes"]
  return (
    f"{commit_words(report)} (report: {report['report_commit']}); "
    + (f"budget {budget:g} minutes; " if budget is not None else "")
    + f"{report['runs_finished']} of {report['runs_planned']} runs finished in "
    f"{'' if exact else 'at least '}{report['training_wall_minutes']:.1f} minutes of training "
    "wall time"
    + (
      ""
      if exact
      else " (a lower bound: a session stopped without recording its time, e.g. killed outright)"
    )
    + (f" (planned: {planned:.1f} for all)." if planned is not None else ".")
  )


def markdown(report: dict[str, Any]) -> str:
  """``report`` as the markdown tables of ``results.md``."""
  lines = [f"# {report['title']}", ""]
  if report.get("note"):
    lines += [report["note"], ""]
  lines += [*rows_table(report), ""]
  if report.get("evaluation"):
    lines.append(evaluation_words(report))
  lines.append(ordering_words(report["ordering"]))
  lines += comparisons_table(report["comparisons"])
  spread = [c["within_seed_spread"] for c in report["comparisons"] if c.get("within_seed_spread")]
  if spread:
    lines += ["", "Seed spread: " + " ".join(spread)]
  lines.append("")
  if report.get("data"):
    lines.append(f"Data: {report['data']}.")
  if report.get("max_steps"):
    lines.append(step_cap_words(report))
  lines += [
    machine_words(report, report["load_average_range"]),
    wall_time_words(report),
    (
      "Top-1: final and best evaluation"
      if report.get("protocol")
      else "Top-1/top-5: final evaluation"
    )
    + " on the full test split, mean +- sample sd over seeds; img/s: "
    "median logged training rate (compilation and evaluation excluded).",
  ]
  return "\n".join(lines) + "\n"


def write_report(name: str, workdir: str) -> dict[str, Any]:
  """Writes ``DIR/results.json`` and ``DIR/results.md`` (atomically) and prints the table."""
  report = build_report(name, workdir)
  text = markdown(report)
  for filename, content in (("results.json", json.dumps(report, indent=2)), ("results.md", text)):
    path = os.path.join(workdir, filename)
    with open(path + ".tmp", "w") as f:
      f.write(content)
    os.replace(path + ".tmp", path)
  print(text, flush=True)
  return report
