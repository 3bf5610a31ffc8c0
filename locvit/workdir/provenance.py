"""Which locvit commit trained which steps of a run: ``DIR/commits.json``.

A run that stops and continues, on this machine or another one its workdir was copied to, may
continue under a different checkout, whose steps differ numerically (random draws, fusion order).
So each time a run starts or resumes, process 0 appends one entry to ``DIR/commits.json``: the
locvit commit (``locvit_commit``), the first step it trains, the device kind and the time
(replaced whole: one object write on a bucket, a renamed temporary file locally). The entry is
this session's (``Session``): at each checkpoint it gains the step saved (``last_step``) and the
wall seconds since the run was built (``seconds``), written by the save itself (orbax's save
thread for an asynchronous one: ``Checkpointer.on_saved``), the range of the machine's 1-minute
load average seen at the start, the checkpoints and the end (``load_average``, the report's
"during the runs" on every machine), and ``ended`` when the session
closes, however it stops (finished, SIGTERM, Ctrl-C, an error); a session killed outright
(SIGKILL) keeps the seconds of its last checkpoint. So a run's wall time across machines is the
sum of its sessions' (``wall_time``), exact when every session ended, else a lower bound.
``step_ranges`` reads the entries back as step ranges by a field (the commit, the device kind);
``locvit.reproduce``'s report names them per row.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time
from typing import Any, NamedTuple

import jax

from locvit.workdir import outage, paths

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


class Session:
  """This process's entry of ``workdir``'s record, from ``record_start`` to ``end``.

  Only the entry's own process writes the record (process 0 holds the workdir's lock), so it
  keeps the entries in memory and replaces the file whole at each update: at checkpoints and at
  the end, never per step.
  """

  def __init__(
    self,
    workdir: str,
    entries: list[dict[str, Any]],
    started: float,
    watch: outage.Watch | None = None,
  ):
    self.workdir, self.entries, self.started = workdir, entries, started
    self.watch = watch  # the run's deadline of its bucket workdir (None on a local disk)

  def _write(self, **fields: Any) -> None:
    entry = self.entries[-1]
    load = os.getloadavg()[0]
    low, high = entry.get("load_average", (load, load))
    entry.update(
      fields,
      seconds=round(time.monotonic() - self.started, 3),
      load_average=[min(low, load), max(high, load)],
    )
    text = json.dumps(self.entries, indent=1) + "\n"
    target = paths.path(self.workdir) / FILENAME
    # On a bucket, an outage shorter than the run's limit is ridden out, as the metrics write is.
    write = lambda: paths.write_atomically(target, text)
    outage.retrying(self.watch, f"the {FILENAME} write", write)

  def checkpointed(self, step: int) -> None:
    """Records ``step`` as this session's last saved step, with the seconds so far."""
    self._write(last_step=step)

  def end(self) -> None:
    """Records the session's whole wall time: it ended and its time is complete."""
    self._write(ended=True)


def record_start(
  workdir: str,
  first_step: int,
  started: float | None = None,
  watch: outage.Watch | None = None,
) -> Session:
  """Appends this process's commit, ``first_step``, the device kind and the time to the record
  (call it on process 0, once the run knows the step it resumes from); the session's seconds
  count from ``started`` (``time.monotonic()``; default now). On a bucket, its writes ride out
  an outage under the run's ``watch`` (``outage.retrying``)."""
  entry = {
    "commit": locvit_commit(),
    "first_step": first_step,
    "device_kind": jax.devices()[0].device_kind,
    "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  started = time.monotonic() if started is None else started
  session = Session(workdir, [*read(workdir), entry], started, watch)
  session._write()
  return session


def wall_time(entries: list[dict[str, Any]]) -> tuple[float, bool]:
  """The run's wall seconds over its recorded sessions, and whether that is exact: False (a lower
  bound) when a session ended without recording its end (killed outright) or kept no seconds (a
  run from before they were recorded), or steps precede the first entry."""
  seconds = sum(e.get("seconds", 0.0) for e in entries)
  exact = bool(entries) and entries[0]["first_step"] <= 1 and all(e.get("ended") for e in entries)
  return seconds, exact


class StepRange(NamedTuple):
  """Steps ``first``-``last`` of a run, trained where a record's field had ``value``
  (``recorded``: by the run's own record, else the value assumed for steps trained before the
  run kept one)."""

  first: int
  last: int
  value: str
  recorded: bool


def step_ranges(
  entries: list[dict[str, Any]], last_step: int, unrecorded: str, field: str
) -> list[StepRange]:
  """Steps 1-``last_step`` by the ``field`` (``commit``, ``device_kind``) of the session that
  trained them, adjacent equal values merged.

  A start at step F supersedes whatever an earlier start trained from F on (a resume from an
  older checkpoint trains those steps again). Steps before the first entry (a run begun before
  the record existed) are attributed to ``unrecorded`` (``recorded`` False).
  """
  starts: list[tuple[int, str]] = []
  for entry in entries:
    starts = [s for s in starts if s[0] < entry["first_step"]]
    starts.append((entry["first_step"], entry[field]))
  starts = [s for s in starts if s[0] <= last_step]
  ranges = [] if starts and starts[0][0] <= 1 else [[1, last_step, unrecorded, False]]
  for first, value in starts:
    if ranges:
      ranges[-1][1] = first - 1
    ranges.append([first, last_step, value, True])
  merged = ranges[:1]
  for first, last, value, recorded in ranges[1:]:
    if value == merged[-1][2]:
      merged[-1][1:] = [last, value, merged[-1][3] or recorded]
    else:
      merged.append([first, last, value, recorded])
  return [StepRange(*r) for r in merged]
