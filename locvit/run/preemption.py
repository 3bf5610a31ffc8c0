"""Stop requests: SIGTERM and Ctrl-C become "save this step and exit", read between steps and
between evaluation batches (``locvit.train``'s loop asks ``should_stop`` after every step)."""

from __future__ import annotations

import signal
import threading

from absl import logging


class PreemptionWatcher:
  """Turns SIGTERM and a first Ctrl-C into a request to save and exit, read between steps and
  between evaluation batches; a second Ctrl-C stops at once (``KeyboardInterrupt``). Installed
  from the main thread only.

  Single-process only. With several processes, JAX's preemption sync manager (started by
  ``jax.distributed.initialize``) owns SIGTERM: a notice to any one process reaches all of them,
  and ``reached_preemption(step)`` becomes True at the same step everywhere. A Python handler
  here would replace JAX's and leave the processes saving different steps (a hang); Ctrl-C keeps
  Python's default there.
  """

  NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

  def __init__(self, multiprocess: bool = False, checkpointer=None):
    self.requested = False
    self._previous = {}
    self._multiprocess = multiprocess
    self._checkpointer = checkpointer

  def __enter__(self):
    if not self._multiprocess and threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.NAMES}
    return self

  def should_stop(self, step: int) -> bool:
    """Whether to save ``step`` and exit; the same answer on every process."""
    if self._multiprocess:
      if self._checkpointer.reached_preemption(step):
        logging.warning("Preemption notice: all processes save step %d and exit.", step)
        return True
      return False
    return self.requested

  def interrupts_evaluation(self) -> bool:
    """Whether a running evaluation should stop at its next batch (single process)."""
    return self.requested and not self._multiprocess

  def _handle(self, signum, frame):
    if signum == signal.SIGINT and self.requested:
      raise KeyboardInterrupt
    logging.warning(
      "%s received: saving a checkpoint at the end of this step%s.",
      self.NAMES[signum],
      " (Ctrl-C again stops at once, without saving)" if signum == signal.SIGINT else "",
    )
    self.requested = True

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)


class EvaluationInterruptedError(Exception):
  """A stop request (SIGTERM, Ctrl-C) reached a running evaluation between two batches."""
