"""Stop requests: SIGTERM and Ctrl-C become "save this step and exit", read between steps and
between evaluation batches (``locvit.train``'s loop asks ``should_stop`` after every step).

A stop that raises an exception (SIGTERM outside the loop, Ctrl-C, a second Ctrl-C in it) goes
through ``raise_stop``: it never raises while JAX waits for XLA to compile."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

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
    wait_for_deferred_stop()  # a stop sent before the loop ends the run, as it would have
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
      raise_stop(KeyboardInterrupt, signum, frame)
      return
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


# How often a stop that arrived where it must not raise is sent again, until it can (JAX itself
# looks at pending signals every 0.2 s while it waits for a compilation).
RESEND_SECONDS = 0.05
_deferred = {"stop": False}  # a stop signal waits to be sent again; main thread only
_NO_RAISE: set = set()  # code of the functions a stop must not raise in (defer_stops_in)


def defer_stops_in(function):
  """Decorator: a stop signal that arrives while ``function`` runs (or anything it calls) is sent
  again shortly instead of raising there; e.g. ``sys.unraisablehook``, which drops what it raises.
  """
  _NO_RAISE.add(function.__code__)
  return function


def in_xla_compilation(frame) -> bool:
  """Whether a signal handler was called with ``frame`` in JAX's compiler module: there jaxlib
  waits for XLA to compile (on a thread of the backend's pool) and runs signal handlers while it
  waits."""
  return frame is not None and frame.f_globals.get("__name__") == "jax._src.compiler"


def _must_not_raise(frame) -> bool:
  if in_xla_compilation(frame):
    return True
  while frame is not None:
    if frame.f_code in _NO_RAISE:
      return True
    frame = frame.f_back
  return False


@defer_stops_in  # a second signal while this one is sent again (Timer.start)
def raise_stop(exception: type[BaseException], signum: int, frame) -> None:
  """From a signal handler: raises ``exception`` (a stop: SIGTERM, Ctrl-C) in ``frame``, or, where
  it must not raise, sends ``signum`` again shortly, until it can: once JAX's wait for an XLA
  compilation has returned, once a ``defer_stops_in`` function has.

  An exception raised during JAX's wait abandons the compilation, which goes on in the backend's
  pool; the interpreter's exit then destroys the backend client under it, and the compilation,
  once done, uses the freed client: a segmentation fault after the run's last line. Raised after
  the compilation, the stop ends the run cleanly (a start-up compilation takes seconds)."""
  if _must_not_raise(frame):
    _deferred["stop"] = True
    threading.Timer(RESEND_SECONDS, os.kill, (os.getpid(), signum)).start()
    return
  _deferred["stop"] = False
  raise exception


def redeliver_swallowed_stops(resend: dict[type[BaseException], int]) -> None:
  """Installs a ``sys.unraisablehook`` for stops: a stop raised by a signal handler while Python
  runs a gc callback (JAX registers one) or a finalizer is printed as "Exception ignored" and
  dropped, and the run would go on. ``resend`` maps each stop exception to its signal, which is
  sent again from a timer thread, so that it lands once the callback has returned; one that lands
  in this hook (dropped too) is sent again by ``raise_stop``."""
  previous = sys.unraisablehook

  @defer_stops_in
  def hook(unraisable):
    signum = resend.get(unraisable.exc_type)
    if signum is None:
      previous(unraisable)
    else:
      threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()

  sys.unraisablehook = hook


def wait_for_deferred_stop(timeout: float = 1.0) -> None:
  """Returns once no stop deferred by ``raise_stop`` is pending: its signal, sent again, raises in
  this wait (before a new handler takes the signal over). Gives up after ``timeout`` seconds
  (another handler took the signal meanwhile)."""
  deadline = time.monotonic() + timeout
  while _deferred["stop"] and time.monotonic() < deadline:
    time.sleep(RESEND_SECONDS / 5)
  _deferred["stop"] = False
