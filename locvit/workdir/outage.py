"""One deadline for a bucket that stops answering: the run ends within a stated time, with one line.

A run on ``gs://`` or ``s3://`` talks to its bucket from several places: orbax's save threads,
the metric writer, the lease thread (``locvit.workdir.lock``). Each client retries on its own terms
(gcsfs for about 30 s, google-cloud-storage for 120 s, TensorStore for minutes), and a shutdown
that closed each in turn waited for each in turn. Instead, the run keeps one ``Watch`` of its
bucket workdir: its lease owns it (``locvit.workdir.lock.claim`` starts it and returns it,
``release_lock`` stops it), and the run hands it to what writes to the bucket (the checkpointer,
the metric writer, the provenance record), so two runs in one process (seeds side by side, a
notebook) each keep their own:

- the lease thread probes the bucket (every few seconds while something waits on it) and reports
  each failure (``failed``) and each answer (``answered``);
- the first failure starts the deadline, ``limit`` seconds later
  (``config.bucket_timeout_seconds``); any answer before it clears it, so a shorter outage is
  ridden out: by the clients' own retries, made to span the limit on every process of the run
  (by default s3fs gives up after about 10 s, gcsfs after 31 to 36 s;
  ``locvit.workdir.paths.BucketClients``, set by ``locvit.workdir.lock.claim``: each process
  writes its own part of a checkpoint through them, orbax's ``state/array_metadatas/process_N``),
  and, for a whole-object write that a client gives up on sooner anyway, by ``retrying``, which
  writes again once the bucket answers;
- when the deadline passes, the process prints one ``locvit: error:`` line (the bucket, what was
  being written, the steps already committed) and exits with status 2 at once, whatever thread is
  still waiting: a committed checkpoint is already safe, an uncommitted one is left as orbax left it
  (the resume passes over it), and nothing more can be written to a bucket that does not answer.

Without a watch (``None``: local workdirs, readers) ``doing`` and ``retrying`` just run their block.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

EXIT_STATUS = 2
T = TypeVar("T")


# What HTTP clients bury in long messages (urllib3's "Max retries exceeded with url: ...").
_REASONS = re.compile(
  r"connection refused|connection reset|connection aborted|timed? ?out|name or service not known|"
  r"cannot connect to host [^ ]+|no route to host|service unavailable",
  re.IGNORECASE,
)


def one_line(error: BaseException) -> str:
  """A short description of a client error: its reason when its message, or that of an error it
  was raised from, names a known one (botocore's "Could not connect to the endpoint URL" was
  raised from urllib3's "Connection refused"), else ``Type: first line of the message``."""
  cause, seen = error, 0
  while cause is not None and seen < 8:
    reason = _REASONS.search(str(cause))
    if reason:
      return reason.group(0).lower()
    cause, seen = cause.__cause__ or cause.__context__, seen + 1
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0][:160] if text else ''}"


class Watch:
  """The deadline of one bucket workdir (see the module docstring)."""

  def __init__(self, workdir: str, limit: float):
    self.workdir = workdir
    self.bucket = "/".join(workdir.split("/")[:3])  # gs://BUCKET
    self.limit = limit
    self.deadline: float | None = None  # time.monotonic() at which the run gives up
    self.error: str | None = None  # the first failure of this outage
    self.doing: list[str] = []  # what the run is writing to the bucket now, outermost first
    # Set by the checkpointer: (the save in flight or None, the committed steps), without I/O.
    self.checkpoints: Callable[[], tuple[str | None, str]] = lambda: (None, "")
    self._lock = threading.Lock()
    self._reported = threading.Condition(self._lock)  # each failure or answer, for ``retrying``
    self._reports = 0
    self._wake = threading.Event()
    self._stopped = False
    self._thread = threading.Thread(target=self._run, name="locvit-outage", daemon=True)
    self._thread.start()

  def busy(self) -> bool:
    """Whether something waits on the bucket, or it is failing: then the lease probes it often."""
    return bool(self.doing) or self.deadline is not None or self.checkpoints()[0] is not None

  def failed(self, error: BaseException) -> None:
    """A bucket call failed: starts the deadline unless one runs already."""
    with self._lock:
      if self.deadline is None:
        self.deadline = time.monotonic() + self.limit
        self.error = one_line(error)
        self._wake.set()
      self._report()

  def answered(self) -> None:
    """The bucket answered: the outage, if any, is over."""
    with self._lock:
      self.deadline = self.error = None
      self._report()

  def _report(self) -> None:
    self._reports += 1
    self._reported.notify_all()

  def wait_out_outage(self) -> bool:
    """After a write failed: waits for the lease's verdict. When its next probe also failed, waits
    until the bucket answers (True: write again) or the deadline ends the process; False when the
    bucket answers (the write's error is its own) or the watch stops."""
    with self._lock:
      # The second report from now comes from a probe that began after the write failed (the
      # lease's thread probes every few seconds while a write waits; a lost lease stops it).
      seen = self._reports
      heard = lambda: self._reports >= seen + 2 or self._stopped
      if not self._reported.wait_for(heard, timeout=max(self.limit, 30.0)) or self.deadline is None:
        return False
      self._reported.wait_for(lambda: self.deadline is None or self._stopped)
      return not self._stopped

  def stop(self) -> None:
    """Ends the watch; its thread exits."""
    with self._lock:
      self._stopped = True
      self._reported.notify_all()
    self._wake.set()

  def _run(self) -> None:
    while not self._stopped:
      deadline = self.deadline
      timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
      if self._wake.wait(timeout):
        self._wake.clear()
        continue
      if self.deadline is not None and time.monotonic() >= self.deadline and not self._stopped:
        self._give_up()

  def message(self) -> str:
    """The one line the run ends with."""
    in_flight, committed = self.checkpoints()
    what = self.doing[0] if self.doing else in_flight or "the lease"
    return (
      f"the bucket {self.bucket} did not answer for {self.limit:g} s "
      f"(config.bucket_timeout_seconds) during {what} ({self.error}); gave up. {committed}; "
      "the same command resumes from the newest once the bucket answers"
    )

  def _give_up(self) -> None:
    """Prints the line and exits at once: other threads may be stuck in a client's retries."""
    line = f"locvit: error: {self.message()}\n"
    with contextlib.suppress(Exception):
      sys.stdout.flush()
    os.write(2, line.encode())
    os._exit(EXIT_STATUS)


def retrying(watch: Watch | None, what: str, write: Callable[[], T]) -> T:
  """Runs ``write``, a whole-object write to the bucket of ``watch``, named ``what`` (as
  ``doing``). When it fails while the bucket does not answer the lease's probes either, it is run
  again once the bucket answers, or the deadline ends the process with its line: an outage
  shorter than ``config.bucket_timeout_seconds`` is ridden out however soon the client gave up.
  Any other error is raised."""
  with doing(watch, what):
    while True:
      try:
        return write()
      except Exception:
        if watch is None or not watch.wait_out_outage():
          raise


@contextlib.contextmanager
def doing(watch: Watch | None, what: str) -> Iterator[None]:
  """Names what the block writes to the bucket of ``watch`` (``the metrics write``), for the line
  the run ends with should the bucket stop answering meanwhile."""
  if watch is None:
    yield
    return
  watch.doing.append(what)
  try:
    yield
  finally:
    with contextlib.suppress(ValueError):
      watch.doing.remove(what)
