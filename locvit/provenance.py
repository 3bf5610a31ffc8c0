"""Which locvit commit trained which steps of a run: ``DIR/commits.json``.

A run that stops and continues, on this machine or another one its workdir was copied to, may
continue under a different checkout, whose steps differ numerically (random draws, fusion order).
So each time a run starts or resumes, process 0 appends one entry to ``DIR/commits.json``: the
locvit commit (``locvit_commit``), the first step it trains, the device kind and the time
(replaced whole: one object write on a bucket, a renamed temporary file locally). ``segments``
reads the entries back as step ranges; ``locvit.reproduce``'s report names them per row.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import time
from typing import Any

import jax

from locvit import paths

FILENAME = "commits.json"


def locvit_commit(checkout: str | None = None) -> str:
  """The git commit of the locvit checkout (``checkout``: this file's), marked when its tracked
  files differ from that commit; the installed version outside a checkout. ``$LOCVIT_COMMIT``,
  when set, names it instead: a copy of a checkout without its git metadata (a lent machine)."""
  if checkout is None and os.environ.get("LOCVIT_COMMIT"):
    return os.environ["LOCVIT_COMMIT"]
  here = checkout or os.path.dirname(os.path.abspath(__file__))
  try:
    out = subprocess.run(
      ["git", "-C", here, "describe", "--always", "--abbrev=7", "--dirty= with local changes"],
      capture_output=True,
      text=True,
      check=True,
    )
    return out.stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    try:
      version = importlib.metadata.version("locvit")
    except importlib.metadata.PackageNotFoundError:
      version = "unknown version"
    return f"locvit {version} (no git checkout)"


def read(workdir: str) -> list[dict[str, Any]]:
  """The entries of ``workdir``'s record, oldest first (none for a run from before it)."""
  path = paths.path(workdir) / FILENAME
  return json.loads(path.read_text()) if path.exists() else []


def record_start(workdir: str, first_step: int) -> None:
  """Appends this process's commit, ``first_step``, the device kind and the time to the record
  (call it on process 0, once the run knows the step it resumes from)."""
  entries = read(workdir)
  entries.append(
    {
      "commit": locvit_commit(),
      "first_step": first_step,
      "device_kind": jax.devices()[0].device_kind,
      "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
  )
  paths.write_atomically(paths.path(workdir) / FILENAME, json.dumps(entries, indent=1) + "\n")


@dataclasses.dataclass(frozen=True)
class Segment:
  """Steps ``first``-``last`` of a run, trained at ``commit`` (``recorded``: by the run's own
  record, else the commit assumed for steps trained before the run kept one)."""

  first: int
  last: int
  commit: str
  recorded: bool = True


def segments(entries: list[dict[str, Any]], last_step: int, unrecorded: str) -> list[Segment]:
  """Steps 1-``last_step`` by the commit that trained them, adjacent equal commits merged.

  A start at step F supersedes whatever an earlier start trained from F on (a resume from an
  older checkpoint trains those steps again). Steps before the first entry (a run begun before
  the record existed) are attributed to ``unrecorded``.
  """
  starts: list[tuple[int, str]] = []
  for entry in entries:
    starts = [s for s in starts if s[0] < entry["first_step"]]
    starts.append((entry["first_step"], entry["commit"]))
  starts = [s for s in starts if s[0] <= last_step]
  ranges = [] if starts and starts[0][0] <= 1 else [Segment(1, last_step, unrecorded, False)]
  for first, commit in starts:
    if ranges:
      ranges[-1] = dataclasses.replace(ranges[-1], last=first - 1)
    ranges.append(Segment(first, last_step, commit))
  merged = ranges[:1]
  for segment in ranges[1:]:
    if segment.commit == merged[-1].commit:
      recorded = merged[-1].recorded or segment.recorded
      merged[-1] = dataclasses.replace(merged[-1], last=segment.last, recorded=recorded)
    else:
      merged.append(segment)
  return merged
