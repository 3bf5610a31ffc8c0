"""The table of a reproduced plan: ``DIR/results.md`` and ``DIR/results.json``.

Per row, the paper's top-1, ours (final top-1 as mean +- sample sd over the finished seeds) and
the difference; the ordering the paper's numbers claim and whether ours held it; the data, the
device, the images/s, the wall time and the locvit commit that trained the runs (per row, with
step ranges, where runs continued under another commit: ``locvit.provenance``); any step cap.
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
from locvit import provenance
from locvit.configs.reproduce_plans import PLANS
from locvit.provenance import locvit_commit

NOISE_P = 0.05


def final_evaluation(workdir: str, steps: int) -> dict[str, float] | None:
  """``eval/top1`` and ``eval/top5`` of ``workdir``'s step ``steps``, or None if not finished."""
  if not os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return None
  for record in metrics_lib.read_metrics(workdir):
    if record.get("step") == steps and "eval/top1" in record:
      return {"top1": record["eval/top1"], "top5": record["eval/top5"]}
  return None


def training_rates(workdir: str) -> list[float]:
  """The run's logged training images/s (compilation and evaluation excluded): each log line's
  rate but the first, which includes the compilation."""
  records = metrics_lib.read_metrics(workdir)
  rates = [r["perf/images_per_sec"] for r in records if "perf/images_per_sec" in r]
  return rates[1:] or rates


def ordering(rows: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
  """The ordering the paper's numbers claim (best first; equal numbers tie) and whether our
  means hold every strict pair of it. None when fewer than two rows have a paper number."""
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
  measured = [(b, w) for b, w in pairs if None not in (rows[b]["top1_mean"], rows[w]["top1_mean"])]
  broken = [(b, w) for b, w in measured if rows[b]["top1_mean"] <= rows[w]["top1_mean"]]
  claim = ranked[0]
  for previous, row in itertools.pairwise(ranked):
    equal = rows[row]["paper_top1"] == rows[previous]["paper_top1"]
    claim += (" = " if equal else " > ") + row
  ours = sorted(
    (r for r in ranked if rows[r]["top1_mean"] is not None), key=lambda r: -rows[r]["top1_mean"]
  )
  return {
    "paper": claim,
    "ours": " > ".join(ours),
    "held": None if len(measured) < len(pairs) else not broken,
    "broken_pairs": broken,
  }


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


def build_report(name: str, workdir: str) -> dict[str, Any]:
  """Per-row means and per-comparison paired statistics of the finished runs in ``workdir``."""
  plan = PLANS[name]
  saved = _read_json(os.path.join(workdir, "plan.json"))
  if saved is None:
    raise ValueError(f"{workdir} holds no plan.json: run `python -m locvit.reproduce {name}` first")
  seeds, plan_commit = saved["seeds"], saved.get("locvit_commit") or "unknown"
  rows, finals, wall, loads, any_recorded = {}, {}, 0.0, [], False
  for row in saved.get("row_names") or plan["rows"]:
    spec, cost = plan["rows"][row], saved["rows"][row]
    steps = cost.get("steps", saved.get("steps"))
    finals[row], rates, row_wall, trained_by = {}, [], [], {}
    for seed in range(seeds):
      run = os.path.join(workdir, row, f"seed{seed}")
      final = final_evaluation(run, steps)
      if final is not None:
        finals[row][seed] = final
        rates += training_rates(run)
        recorded = provenance.read(run)
        trained_by[seed] = provenance.segments(recorded, steps, plan_commit)
        any_recorded |= bool(recorded)
      timing = _read_json(os.path.join(run, "reproduce_run.json"))
      if timing is not None:
        wall += timing["wall_seconds"]
        row_wall.append(timing["wall_seconds"])
        loads += [timing["load_before"][0], timing["load_after"][0]]
    top1_mean, top1_sd = mean_sd([f["top1"] for f in finals[row].values()])
    top5_mean, top5_sd = mean_sd([f["top5"] for f in finals[row].values()])
    rows[row] = {
      "config": spec["config"],
      "overrides": spec["overrides"],
      "seeds_finished": sorted(finals[row]),
      "top1_per_seed": {s: f["top1"] for s, f in finals[row].items()},
      "top1_mean": top1_mean,
      "top1_sd": top1_sd,
      "top5_mean": top5_mean,
      "top5_sd": top5_sd,
      "paper_top1": spec["paper_top1"],
      "difference": top1_mean - spec["paper_top1"]
      if top1_mean is not None and spec["paper_top1"] is not None
      else None,
      "images_per_sec": statistics.median(rates) if rates else None,
      "wall_minutes_per_run": statistics.fmean(row_wall) / 60 if row_wall else None,
      "steps": steps,
      "epochs": steps / cost["steps_per_epoch"],
      "paper_epochs": spec["paper_epochs"],
      "paper_budget_fraction": steps
      * cost["batch_size"]
      / (spec["paper_epochs"] * spec["paper_train_examples"]),
      "steps_per_sec": cost["steps_per_sec"],
      "trained_by": {s: [dataclasses.asdict(r) for r in rs] for s, rs in trained_by.items()},
    }
  comparisons = []
  for base, treat in plan["comparisons"]:
    if base not in finals or treat not in finals:  # a row this plan's --rows left out
      continue
    paired = sorted(set(finals[base]) & set(finals[treat]))
    diffs = [finals[treat][s]["top1"] - finals[base][s]["top1"] for s in paired]
    test = paired_t(diffs)
    comparisons.append(
      {
        "baseline": base,
        "treatment": treat,
        "seeds": paired,
        "top1_differences": diffs,
        **test,
        "verdict": verdict(test),
      }
    )
  fraction = saved.get("fraction", 1.0)
  title = plan["title"]
  if saved.get("protocol"):
    title += ", at " + (
      "the paper's protocol" if fraction == 1 else f"{fraction:.3g} of the paper's protocol"
    )
  return {
    "plan": name,
    "title": title,
    "protocol": bool(saved.get("protocol")),
    "fraction": fraction,
    "max_steps": None if saved.get("protocol") else plan.get("max_steps"),
    "data": saved.get("data"),
    "rows": rows,
    "ordering": ordering(rows),
    "comparisons": comparisons,
    "machine": machine(),
    "locvit_commit": saved.get("locvit_commit"),  # of the plan; plans before it was kept lack it
    "runs_recorded_commits": any_recorded,  # runs before DIR/ROW/seedK/commits.json kept none
    "report_commit": locvit_commit(),
    "budget_minutes": saved["minutes"],
    "estimated_minutes": saved.get("estimated_minutes"),
    "runs_finished": sum(len(f) for f in finals.values()),
    "runs_planned": seeds * len(rows),
    "training_wall_minutes": wall / 60,
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


def trained_by_words(ranges: list[dict[str, Any]]) -> str:
  """'commit A', or 'steps 1-13 at commit A, 14-33 at commit B' (``provenance.Segment`` fields);
  steps trained before the run kept a record are the plan's commit, and say so."""
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


def markdown(report: dict[str, Any]) -> str:
  """``report`` as the markdown tables of ``results.md``."""
  m = report["machine"]
  lines = [f"# {report['title']}", ""]
  lines += [
    "| row | paper top-1 % | ours top-1 % | ours - paper (points) | seeds | top-5 % | "
    "epochs | paper epochs | of paper budget | img/s | minutes per run |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in report["rows"].items():
    rate = f"{r['images_per_sec']:,.0f}" if r.get("images_per_sec") else "-"
    wall = r.get("wall_minutes_per_run")
    lines.append(
      f"| {name} | {_points(r['paper_top1'])} | {_pct(r['top1_mean'], r['top1_sd'])} | "
      f"{_points(r.get('difference'), sign=True)} | {len(r['seeds_finished'])} | "
      f"{_pct(r['top5_mean'], r['top5_sd'])} | {r['epochs']:.4g} | {r['paper_epochs']} | "
      f"{r['paper_budget_fraction']:.2%} | {rate} | {f'{wall:.1f}' if wall else '-'} |"
    )
  order = report.get("ordering")
  lines.append("")
  if order is None:
    lines.append("Ordering: fewer than two rows have a paper number; none is claimed.")
  else:
    held = {True: "held", False: "did not hold", None: "not yet known (rows unfinished)"}
    lines.append(
      f"Ordering the paper claims: {order['paper']}. Ours: {order['ours'] or '-'}. "
      f"The paper's ordering {held[order['held']]}"
      + (
        " (" + ", ".join(f"{b} not above {w}" for b, w in order["broken_pairs"]) + ")."
        if order["broken_pairs"]
        else "."
      )
    )
  if report["comparisons"]:
    lines += [
      "",
      "| comparison | per-seed top-1 differences (points) | mean | paired t (df) | verdict |",
      "|---|---|---|---|---|",
    ]
  for c in report["comparisons"]:
    diffs = ", ".join(f"{100 * d:+.2f}" for d in c["top1_differences"]) or "-"
    mean = f"{100 * c['mean']:+.2f}" if c["mean"] is not None else "-"
    t = f"{c['t']:.2f} ({c['df']})" if c["t"] is not None else "-"
    lines.append(
      f"| {c['treatment']} - {c['baseline']} | {diffs} | {mean} | {t} | {c['verdict']} |"
    )
  load = report["load_average_range"]
  lines += [""]
  if report.get("data"):
    lines.append(f"Data: {report['data']}.")
  if report.get("max_steps"):
    cap, steps = report["max_steps"], sorted({r["steps"] for r in report["rows"].values()})
    lines.append(
      f"Step cap: every run stopped at the plan's cap of {cap} steps (its max_steps), fewer than "
      "the budget allowed."
      if steps == [cap]
      else f"Step cap: the plan caps runs at {cap} steps (its max_steps); the budget gave these "
      f"runs fewer ({'/'.join(map(str, steps))})."
    )
  lines += [
    f"Machine: JAX backend {m['jax_backend']}, device {m['device_kind']} x {m['device_count']}, "
    f"{m['cpu_count']} CPUs; 1-minute load average {load[0]:.1f}-{load[1]:.1f} during the runs."
    if load
    else f"Machine: JAX backend {m['jax_backend']}, device {m['device_kind']}.",
    f"{commit_words(report)} (report: {report['report_commit']}); "
    + (
      f"budget {report['budget_minutes']:g} minutes; "
      if report["budget_minutes"] is not None
      else ""
    )
    + f"{report['runs_finished']} of {report['runs_planned']} "
    f"runs finished in {report['training_wall_minutes']:.1f} minutes of training wall time"
    + (
      f" (planned: {report['estimated_minutes']:.1f} for all)."
      if report["estimated_minutes"] is not None
      else "."
    ),
    "Top-1/top-5: final evaluation on the full test split, mean +- sample sd over seeds; img/s: "
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
