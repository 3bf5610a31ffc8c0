"""When the training loop acts on the host: which steps it logs, saves and evaluates, how many
steps one dispatch runs, and how far the host may run ahead of the device.

Every host step ends a dispatch (``dispatch_end``), so a dispatch runs either
``config.steps_per_dispatch`` steps or one, and the loop logs, saves and evaluates exactly the steps
an undispatched loop would.
"""

from __future__ import annotations

import collections

import jax
import ml_collections


def is_log_step(config, step: int, total_steps: int) -> bool:
  """Whether the loop logs ``step``'s training row: every ``log_every_steps``, the first step and
  the last."""
  every = config.log_every_steps
  return bool(every and step % every == 0) or step in (1, total_steps)


def is_save_step(config, step: int, total_steps: int) -> bool:
  """Whether the loop saves ``step`` (besides a stop request's step): every
  ``checkpoint_every_steps``, and the last step."""
  every = config.checkpoint_every_steps
  return bool(every and step % every == 0) or step == total_steps


def host_step(config, step: int, start: int, total_steps: int) -> bool:
  """Whether the loop acts on ``step`` on the host: the first step after ``start`` (a progress
  line), and the steps it logs, saves or evaluates."""
  rules = (is_log_step, is_save_step, is_evaluation_step)
  return step == start + 1 or any(rule(config, step, total_steps) for rule in rules)


def dispatch_end(config, done: int, start: int, total_steps: int) -> int:
  """The last step of the dispatch that follows step ``done``: ``config.steps_per_dispatch``
  steps when none of them but the last is a host step, else one. So every host step ends a
  dispatch, and a dispatch runs either K steps or one (two compiled programs)."""
  k = config.steps_per_dispatch
  steps = range(done + 1, done + k)  # all but the last
  if done + k > total_steps or any(host_step(config, s, start, total_steps) for s in steps):
    return done + 1
  return done + k


def is_evaluation_step(config: ml_collections.ConfigDict, step: int, total_steps: int) -> bool:
  """Whether the loop evaluates at ``step``: every ``eval_every_steps``, and at the last step."""
  every = config.eval_every_steps
  return bool(every and step % every == 0) or step == total_steps


class RunAhead:
  """Bounds how far the host runs ahead of the device: before a dispatch (one step, or
  ``config.steps_per_dispatch``), the dispatch ``limit`` earlier has finished. A stop request read
  after step ``s`` (``should_stop``) then saves at most ``limit`` dispatches after the one the
  device was running, instead of after every step dispatched since the last log line. ``limit`` 2
  keeps the device fed (one dispatch queued while one runs): benchmarks/run_ahead.py."""

  def __init__(self, limit: int | None = 2):
    self.limit = limit
    self._in_flight: collections.deque = collections.deque()  # outputs, oldest first

  def wait(self) -> None:
    """Blocks until fewer than ``limit`` dispatched steps may still be running."""
    while self.limit is not None and len(self._in_flight) >= self.limit:
      jax.block_until_ready(self._in_flight.popleft())

  def dispatched(self, output) -> None:
    """Records a step's output (arrays that step never donates) to wait on later."""
    self._in_flight.append(output)
