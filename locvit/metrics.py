"""Metric sinks: ``metrics.jsonl``, TensorBoard event files and a live progress line.

Only process 0 writes. TensorBoard files come from tensorboardX, which does not need TensorFlow.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import jax


def _jsonable(value: Any) -> Any:
  value = value.item() if hasattr(value, "item") and getattr(value, "size", 2) == 1 else value
  if hasattr(value, "tolist"):
    return value.tolist()
  return value


class MetricWriter:
  """Appends one JSON object per logged step and mirrors scalars to TensorBoard."""

  def __init__(self, workdir: str, *, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if self.enabled:
      from tensorboardX import SummaryWriter

      os.makedirs(workdir, exist_ok=True)
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def truncate_after(self, step: int) -> None:
    """Drops records logged after ``step`` (steps a resumed run will log again)."""
    if not self.enabled or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      kept = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      f.writelines(kept)
    os.replace(tmp, self.path)

  def write(self, step: int, metrics: dict[str, Any]) -> None:
    """Appends ``{'step': step, **metrics}`` to ``metrics.jsonl``; finite scalars also go to
    TensorBoard. A no-op on processes other than 0."""
    if not self.enabled:
      return
    record = {"step": int(step), **{k: _jsonable(v) for k, v in metrics.items()}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    for key, value in record.items():
      if key != "step" and isinstance(value, int | float) and math.isfinite(value):
        self._tb.add_scalar(key, value, int(step))

  def close(self) -> None:
    """Flushes and closes the TensorBoard writer."""
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  """Reads ``metrics.jsonl`` back (for tests, notebooks and plots)."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


class Progress:
  """Prints ``step, loss, steps/s, images/s, ETA``; rewrites one line on a terminal."""

  def __init__(self, total_steps: int, batch_size: int, first_step: int = 0):
    self.total_steps, self.batch_size = total_steps, batch_size
    self.enabled = jax.process_index() == 0
    self._last_step, self._last_time = first_step, time.perf_counter()
    self.tty = sys.stdout.isatty()

  def update(self, step: int, loss: float) -> dict[str, float]:
    """Prints the progress line for ``step`` and returns the throughput since the last call as
    ``{'perf/steps_per_sec', 'perf/images_per_sec'}``."""
    now = time.perf_counter()
    steps_per_s = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    eta = (self.total_steps - step) / steps_per_s if steps_per_s > 0 else float("inf")
    if self.enabled:
      line = (
        f"step {step}/{self.total_steps}  loss {loss:.4f}  {steps_per_s:.2f} steps/s  "
        f"{steps_per_s * self.batch_size:.1f} img/s  ETA {_hms(eta)}"
      )
      print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", flush=True)
    return {"perf/steps_per_sec": steps_per_s, "perf/images_per_sec": steps_per_s * self.batch_size}

  def done(self) -> None:
    """Ends the rewritten terminal line with a newline."""
    if self.enabled and self.tty:
      print(flush=True)


def _hms(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  s = int(seconds)
  return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
