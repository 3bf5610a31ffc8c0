"""Start-up checks of a training workdir: writable directories and one run at a time.

``DIR/lock`` is locked with ``fcntl.lockf`` by process 0 for the whole run. The kernel drops the
lock when its process ends, however it ends (SIGKILL included), so a lock left by a killed run is
simply taken over; the file's content (pid, host, start time) names the holder when a second run
is refused. All processes agree on the outcome before any of them goes on, so a refused
multi-process run exits everywhere instead of leaving the other processes waiting.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

LOCK_NAME = "lock"
_HELD: dict[str, int] = {}  # realpath of a lock file -> the descriptor holding it in this process


class WorkdirError(RuntimeError):
  """The workdir cannot be used: not writable, or in use by another run."""


def check_writable(directory: str) -> None:
  """Creates ``directory`` if needed and writes a probe file into it; raises ``WorkdirError``
  naming the directory when either fails (rather than an orbax timeout minutes later)."""
  try:
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_probe"):
      pass
  except OSError as e:
    raise WorkdirError(f"cannot write to {directory}: {e.strerror or e}") from None


def _holder(lock_path: str) -> str:
  try:
    with open(lock_path) as f:
      info = json.load(f)
    return f"pid {info['pid']} on host {info['host']} (started {info['started']})"
  except (OSError, ValueError, KeyError):
    return "another process"


def acquire_lock(workdir: str) -> None:
  """Locks ``DIR/lock`` for this process, or raises ``WorkdirError`` naming the holder.

  A lock this process already holds (a run in this process that ended by an exception) is kept.
  """
  lock_path = os.path.realpath(os.path.join(workdir, LOCK_NAME))
  if lock_path in _HELD:
    return
  fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    import fcntl

    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)  # closing our descriptor only: we never held the lock
    raise WorkdirError(
      f"workdir {workdir} is in use by {_holder(lock_path)}; wait for that run to end or use "
      "another --workdir"
    ) from None
  started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
  info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
  os.ftruncate(fd, 0)
  os.pwrite(fd, info.encode() + b"\n", 0)
  _HELD[lock_path] = fd


def release_lock(workdir: str) -> None:
  """Releases the lock taken by ``acquire_lock`` (a no-op when this process holds none)."""
  fd = _HELD.pop(os.path.realpath(os.path.join(workdir, LOCK_NAME)), None)
  if fd is not None:
    os.ftruncate(fd, 0)
    os.close(fd)  # closing the descriptor releases the lockf lock


def claim(workdir: str) -> None:
  """Start-up of a training run: on process 0, checks that ``DIR`` and ``DIR/checkpoints`` are
  writable and locks ``DIR``; every process then raises the same ``WorkdirError`` if that failed.
  """
  error = None
  if jax.process_index() == 0:
    try:
      check_writable(workdir)
      check_writable(os.path.join(workdir, "checkpoints"))
      acquire_lock(workdir)
    except WorkdirError as e:
      error = e
  if jax.process_count() > 1:
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if failed and error is None:
      error = WorkdirError(f"process 0 could not claim workdir {workdir} (see its error)")
  if error is not None:
    raise error
