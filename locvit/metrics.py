"""Metric sinks: ``metrics.jsonl``, TensorBoard event files and the progress lines on stdout;
``eval.jsonl`` for the results of ``--mode=eval``.

Only process 0 writes. TensorBoard files come from tensorboardX, which does not need TensorFlow.
Its record writer is used directly, in the calling thread (not through the threaded
``SummaryWriter`` and its exit hook), so a failed write, such as a full disk, raises here, where
the run reports it in one line, and nothing is left to fail again at interpreter exit.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import jax
from absl import logging
from etils import epath

from locvit.workdir import outage, paths

METRICS = "metrics.jsonl"
EVALUATIONS = "eval.jsonl"  # --mode=eval results; metrics.jsonl keeps one row per training step


def _jsonable(value: Any) -> Any:
  value = value.item() if hasattr(value, "item") and getattr(value, "size", 2) == 1 else value
  if hasattr(value, "tolist"):
    return value.tolist()
  return value


class MetricWriter:
  """Writes one JSON object per logged step to ``DIR/metrics.jsonl`` and mirrors scalars to
  TensorBoard.

  On a local disk each row is one ``write`` of a whole line to a file opened for appending, so a
  killed run leaves no half row. An object store has no append: rows are kept in memory and the
  object is rewritten whole at ``flush`` (after each checkpoint save, and at the end). Rows newer
  than the last checkpoint may then be lost by a kill, which costs nothing: the resumed run logs
  them again. A resumed or restarted run first drops the rows it will log again
  (``truncate_after``). ``watch``: the run's deadline of its bucket workdir (``outage.Watch``, from
  ``locvit.workdir.lock.claim``; None on a local disk), under which a whole-object write that
  fails during an outage is made again (``outage.retrying``).
  """

  def __init__(self, workdir, *, enabled: bool | None = None, watch: outage.Watch | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.watch = watch
    self.path = paths.path(workdir) / METRICS
    self._rows: list[str] | None = None  # object store: every row of the file, in order
    self._tb = None
    if self.enabled:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._tb = _event_file(self.path.parent / "tensorboard")
      if paths.is_object_store(self.path):
        self._rows = _complete_lines(self.path) if self.path.exists() else []

  def truncate_after(self, step: int) -> None:
    """Drops records logged after ``step`` (steps a resumed run will log again; all of them for
    ``step=-1``), a partial last line, and lines that are not JSON (named in a warning)."""
    if not self.enabled:
      return
    if self._rows is not None:
      self._rows = [row for row in self._rows if _row_step(row, self.path) <= step]
      self.flush()
    elif self.path.exists():
      kept = [row for row in _complete_lines(self.path) if _row_step(row, self.path) <= step]
      paths.write_atomically(self.path, "".join(kept))

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    """Writes ``{'step': step, **metrics}``; finite scalars also go to TensorBoard. A no-op on
    processes other than 0."""
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    line = json.dumps(record) + "\n"
    if self._rows is not None:
      self._rows.append(line)
    else:
      _append_line(self.path, line)
    for key, value in record.items():
      if key != "step" and isinstance(value, int | float) and math.isfinite(value):
        self._tb.write(_scalar_event(key, value, int(step)).SerializeToString())

  def _write_rows(self) -> None:
    """Object stores: rewrites the whole object; a failure names it (a client's own error, such
    as "Cannot connect to host", does not)."""
    try:
      write = lambda: self.path.write_text("".join(self._rows))
      outage.retrying(self.watch, "the metrics write", write)
    except Exception as e:  # gcsfs/s3fs raise their HTTP clients' errors, of many types
      raise MetricsWriteError(
        f"writing {self.path} failed ({outage.one_line(e)}); the checkpoints committed are kept"
      ) from e

  def flush(self) -> None:
    """Makes every row written so far durable (object stores; local rows already are)."""
    if self.enabled and self._rows is not None:
      self._write_rows()
    if self._tb is not None:
      outage.retrying(self.watch, "the metrics write", self._tb.flush)  # a whole-object write

  def close(self) -> None:
    """Flushes the rows and closes the TensorBoard file (closed even when its last write fails)."""
    try:
      if self.enabled and self._rows is not None:
        self._write_rows()
    finally:
      if self._tb is not None:
        self._tb, event_file = None, self._tb
        outage.retrying(self.watch, "the metrics write", event_file.close)


class MetricsWriteError(OSError):
  """``metrics.jsonl`` could not be written to its object store."""


def _append_line(path, line: str) -> None:
  """Appends ``line`` to the local file ``path`` in one ``write``: a kill leaves no half line."""
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, line.encode())
  except OSError as e:  # e.g. a full disk: name the file
    raise OSError(e.errno, e.strerror, os.fspath(path)) from e
  finally:
    os.close(fd)


def _event_file(directory):
  """A new event file in ``directory``, named as TensorBoard looks for, with its header."""
  from tensorboardX import RecordWriter
  from tensorboardX.proto.event_pb2 import Event

  directory = paths.path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
  event_file = RecordWriter(os.fspath(directory / name))
  event_file.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
  return event_file


def _scalar_event(tag: str, value: float, step: int):
  from tensorboardX.proto.event_pb2 import Event
  from tensorboardX.summary import scalar

  return Event(wall_time=time.time(), step=step, summary=scalar(tag, value))


def _complete_lines(path) -> list[str]:
  """The newline-terminated, non-empty lines of ``path``."""
  lines = epath.Path(path).read_text().splitlines(keepends=True)
  return [line for line in lines if line.endswith("\n") and line.strip()]


def _row_step(line: str, path) -> int:
  """The step of a row; a line that is not a JSON row is named in a warning and sorts last
  (dropped by ``truncate_after``) instead of blocking every resume."""
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):
    logging.warning("Dropping a line of %s that is not a metrics row: %r", path, line[:80])
    return 2**62


def _read_rows(path) -> list[dict[str, Any]]:
  return [json.loads(line) for line in _complete_lines(path) if _row_step(line, path) < 2**62]


def read_metrics(workdir) -> list[dict[str, Any]]:
  """Reads ``metrics.jsonl`` back (for tests, notebooks and plots), skipping non-JSON lines."""
  return _read_rows(paths.path(workdir) / METRICS)


def append_evaluation(workdir, result: dict[str, Any]) -> None:
  """Appends one ``--mode=eval`` result (``step``, ``eval/*``, ...) to ``DIR/eval.jsonl`` on
  process 0. A separate log: ``metrics.jsonl`` keeps each training step once, and a resumed run
  drops its rows after the checkpoint, never these."""
  if jax.process_index() != 0:
    return
  path = paths.path(workdir) / EVALUATIONS
  line = json.dumps({k: _jsonable(v) for k, v in result.items()}) + "\n"
  if paths.is_object_store(path):  # no append: the object is rewritten whole
    path.write_text("".join(_complete_lines(path) if path.exists() else []) + line)
  else:
    _append_line(path, line)


def read_evaluations(workdir) -> list[dict[str, Any]]:
  """The ``--mode=eval`` results of ``DIR/eval.jsonl`` in the order they were run ([]: none)."""
  path = paths.path(workdir) / EVALUATIONS
  return _read_rows(path) if path.exists() else []


def last_evaluation(workdir: str) -> dict[str, Any]:
  """The last row of ``metrics.jsonl`` with ``eval/top1``, or {} (none, or no file)."""
  if not (paths.path(workdir) / METRICS).exists():
    return {}
  rows = [row for row in read_metrics(workdir) if "eval/top1" in row]
  return rows[-1] if rows else {}


def _eval_numbers(metrics: dict[str, Any]) -> str:
  text = f"top-1 {metrics['eval/top1']:.4f}  top-5 {metrics['eval/top5']:.4f}"
  text += f"  loss {metrics['eval/loss']:.4f}" if "eval/loss" in metrics else ""
  if "eval_ema/top1" in metrics:
    text += f"  (EMA top-1 {metrics['eval_ema/top1']:.4f})"
  return text


class Progress:
  """Whole lines on stdout (process 0): one per log interval (step, loss, steps/s, images/s, ETA)
  and one per evaluation.

  Rates and the ETA count the time the loop was held by checkpoint saves (on a slow disk or
  bucket the training takes that long), and leave out compilation (the first step) and
  evaluations, reported on their own lines.
  """

  def __init__(self, total_steps: int, batch_size: int, first_step: int = 0, name: str = ""):
    self.total_steps, self.batch_size = total_steps, batch_size
    self.name = name  # which run a line is about, where one process trains several ("seed3")
    self.enabled = jax.process_index() == 0
    self._last_step, self._last_time = first_step, time.perf_counter()
    self._paused = 0.0  # evaluation (and other seeds' host) seconds since the last line
    self._checkpoint_seconds = 0.0
    self._waited_seconds = 0.0  # of which waiting for the previous save to be committed
    self._compiled = False  # the first line's interval includes compiling the step
    self._train_steps, self._train_seconds = 0, 0.0  # since the first line

  def print_line(self, line: str) -> None:
    """Prints ``line`` on process 0 (after the run's name, if any)."""
    if self.enabled:
      print(f"{self.name}: {line}" if self.name else line, flush=True)

  def update(self, step: int, loss: float) -> dict[str, float]:
    """Prints the progress line for ``step`` and returns the throughput since the last call as
    ``{'perf/steps_per_sec', 'perf/images_per_sec'}`` (plus ``perf/checkpoint_seconds`` when
    checkpoints were saved in between)."""
    now = time.perf_counter()
    steps, seconds = step - self._last_step, max(now - self._last_time - self._paused, 1e-9)
    compiling, self._compiled = not self._compiled, True
    self._last_step, self._last_time, self._paused = step, now, 0.0
    steps_per_s = steps / seconds
    perf = {"perf/steps_per_sec": steps_per_s, "perf/images_per_sec": steps_per_s * self.batch_size}
    line = f"step {step}/{self.total_steps}  loss {loss:.4f}  "
    if compiling:
      line += f"first step (with compilation) {seconds:.1f} s"
    else:
      self._train_steps += steps
      self._train_seconds += seconds
      eta = (self.total_steps - step) * self._train_seconds / self._train_steps
      line += f"{steps_per_s:.2f} steps/s  {perf['perf/images_per_sec']:.1f} img/s  ETA {_hms(eta)}"
    if self._checkpoint_seconds:
      waited = self._waited_seconds
      line += f"  (checkpoint {self._checkpoint_seconds:.1f} s"
      line += f", {waited:.1f} s of it waiting for the previous save)" if waited >= 0.05 else ")"
      perf["perf/checkpoint_seconds"] = self._checkpoint_seconds
      self._checkpoint_seconds = self._waited_seconds = 0.0
    self.print_line(line)
    return perf

  def pause(self, seconds: float) -> None:
    """Leaves ``seconds`` out of the rates and the ETA: the host work of the other seeds trained
    side by side (their evaluations, saves and lines), which this seed does not wait for alone."""
    self._paused += seconds

  def evaluation(self, step: int, metrics: dict[str, Any], seconds: float) -> dict[str, float]:
    """Prints the evaluation line of ``step``; its time is left out of speed and ETA. Returns
    ``{'perf/eval_seconds': seconds}``."""
    self._paused += seconds
    self.print_line(evaluation_line(step, metrics, seconds, self.total_steps))
    return {"perf/eval_seconds": seconds}

  def checkpoint(self, seconds: float, waited: float = 0.0) -> None:
    """Counts the ``seconds`` a checkpoint save held the loop (``waited`` of them for the previous
    save to be committed), shown on the next progress line and counted in the rates."""
    self._checkpoint_seconds += seconds
    self._waited_seconds += waited

  def finished(self, workdir: str, metrics: dict[str, Any]) -> None:
    """Says that ``workdir`` already holds the last step, with its final evaluation."""
    numbers = f": {_eval_numbers(metrics)}" if "eval/top1" in metrics else ""
    self.print_line(
      f"{workdir} is finished at step {self.total_steps}/{self.total_steps}{numbers}. Nothing to "
      "train: raise --config.total_steps or use a new --workdir to train more."
    )


def evaluation_line(
  step: int, metrics: dict[str, Any], seconds: float, total_steps: int | None = None
) -> str:
  """The line an evaluation prints, in training and in ``--mode=eval`` alike."""
  which = "Final evaluation" if step == total_steps else "Evaluation"
  at = f"{step}/{total_steps}" if total_steps else f"{step}"
  examples = metrics.get("eval/num_examples")
  count = f"{examples} examples, " if examples is not None else ""
  return f"{which} at step {at}: {_eval_numbers(metrics)}  ({count}{seconds:.1f} s)"


def eval_progress(
  num_batches: int, print_line: Callable[[str], None] = print, every_seconds: float = 10.0
) -> Callable[[int], None]:
  """A callback ``(batches_done)`` printing ``evaluating: 12/79 batches (10 s)`` at most once per
  ``every_seconds``, so that a long evaluation is not silent."""
  start = last = time.perf_counter()

  def report(done: int) -> None:
    nonlocal last
    now = time.perf_counter()
    if now - last >= every_seconds and done < num_batches:
      last = now
      print_line(f"evaluating: {done}/{num_batches} batches ({now - start:.0f} s)")

  return report


def _hms(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  s = int(seconds)
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
