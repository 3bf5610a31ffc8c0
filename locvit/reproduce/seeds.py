"""How many seeds a plan's comparisons need: the paper's smallest gap against the spread of the
per-seed differences that a paired t test over those seeds can still separate.

A paired t test over n seeds calls a mean difference d significant at p < 0.05 (two-sided) when
|d| / (s / sqrt(n)) exceeds t_{0.975, n-1}, s being the sample sd of the per-seed differences.
For the paper's gap g, n seeds can separate it only while s < g sqrt(n) / t_{0.975, n-1}: the
largest spread ``separable_spread`` gives. No seed count separates a gap of 0 (the papers print
equal numbers for some rows), and one seed separates nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

SIGNIFICANCE = 0.05  # report.NOISE_P: the verdicts' threshold


def separable_spread(gap: float, seeds: int) -> float | None:
  """The largest sd of the per-seed differences at which a paired t test over ``seeds`` seeds
  finds a mean difference of ``gap`` significant (None: fewer than 2 seeds)."""
  if seeds < 2:
    return None
  return abs(gap) * math.sqrt(seeds) / stats.t.ppf(1 - SIGNIFICANCE / 2, seeds - 1)


def paper_gaps(plan: dict[str, Any], rows: Sequence[str]) -> list[tuple[float, str, str]]:
  """(|gap|, baseline, treatment) of each comparison among ``rows`` with both paper numbers,
  smallest first."""
  gaps = []
  for base, treat in plan["comparisons"]:
    specs = plan["rows"]
    if base in rows and treat in rows:
      papers = specs[base]["paper_top1"], specs[treat]["paper_top1"]
      if None not in papers:
        gaps.append((abs(papers[1] - papers[0]), base, treat))
  return sorted(gaps)


def gap_words(gap: float, base: str, treat: str, seeds: int) -> str:
  """Whether ``seeds`` seeds can separate the paper's ``gap`` between two rows, in one sentence."""
  pair = f"{treat} vs {base}"
  if gap == 0:
    return (
      f"The paper's gap {pair} is 0.00 points: no seed count separates it, and the report counts "
      "it within the seed spread."
    )
  spread = separable_spread(gap, seeds)
  if spread is None:
    return (
      f"The paper's smallest gap, {pair}, is {100 * gap:.2f} points: one seed cannot separate it "
      "(no spread is measured); give --seeds=3 or more."
    )
  return (
    f"The paper's smallest gap, {pair}, is {100 * gap:.2f} points: {seeds} seeds separate it "
    f"(paired t, p < {SIGNIFICANCE}) only if the per-seed differences spread by less than "
    f"{100 * spread:.2f} points (sd); the report says so where they do not."
  )


def seeds_words(plan: dict[str, Any], seeds: int, rows: Sequence[str]) -> str:
  """The dry run's seeds paragraph: the seeds per row and what they can separate."""
  gaps = paper_gaps(plan, rows)
  side_by_side = ", side by side in one run per row (config.num_seeds)" if seeds > 1 else ""
  lines = [f"Seeds: {seeds} per row{side_by_side}."]
  zero = [g for g in gaps if g[0] == 0]
  nonzero = [g for g in gaps if g[0] > 0]
  lines += [gap_words(*g, seeds) for g in zero]
  if nonzero:
    lines.append(gap_words(*nonzero[0], seeds))
  return " ".join(lines)


def within_spread_words(comparison: dict[str, Any], paper_gap: float | None) -> str | None:
  """For the report: a plain sentence when the paper's gap for ``comparison`` (a paired t test of
  our per-seed differences) is within our seed spread; None when ours separated it or no paper
  gap exists."""
  if paper_gap is None:
    return None
  pair = f"{comparison['treatment']} - {comparison['baseline']}"
  if paper_gap == 0:
    return (
      f"{pair}: the paper prints no gap (0.00 points); no seed count separates one, so any "
      "difference of ours is read against the seed spread above."
    )
  if comparison["sd"] == 0 or (comparison["p"] is not None and comparison["p"] < SIGNIFICANCE):
    return None
  if comparison["sd"] is None:
    return (
      f"{pair}: the paper's gap of {100 * paper_gap:+.2f} points cannot be told from seed noise "
      f"here: {comparison['n']} paired seed(s) measure no spread (--seeds=3 or more)."
    )
  return (
    f"{pair}: the paper's gap of {100 * paper_gap:+.2f} points is within our seed spread (sd of "
    f"the per-seed differences {100 * comparison['sd']:.2f} points over {comparison['n']} seeds; "
    f"{comparison['n']} seeds separate it only below "
    f"{100 * separable_spread(paper_gap, comparison['n']):.2f})."
  )
