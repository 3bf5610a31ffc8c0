"""Start-up checks of a training workdir: writable directories and one run at a time.

On a local disk, ``DIR/lock`` is locked with ``fcntl.lockf`` by process 0 for the whole run. The
kernel drops the lock when its process ends, however it ends (SIGKILL included), so a lock left by a
killed run is simply taken over; the file's content (pid, host, start time) names the holder when a
second run is refused. A finished run removes the file.

An object store has no file locks. There ``DIR/lock`` is a lease: an object created only if absent
(GCS ``ifGenerationMatch=0``), rewritten every ``LEASE_SECONDS / 4`` while the run lives (again
under a generation precondition), and taken over once it is ``LEASE_SECONDS`` old. Cost: one small
object write every 15 s; a killed run blocks its workdir for at most a minute.

Either way, a run notices when its lock was removed or taken by someone else (``check_lock``), and
all processes agree on the outcome of ``claim`` before any of them goes on.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from locvit import paths

LOCK_NAME = "lock"
LEASE_SECONDS = 60.0
_HELD: dict[str, _LocalLock | _Lease] = {}  # lock path -> the lock this process holds


class WorkdirError(RuntimeError):
  """The workdir cannot be used: not writable, or in use by another run."""


def check_writable(directory: str | os.PathLike) -> None:
  """Creates ``directory`` if needed and writes (real bytes) and deletes a probe in it; raises
  ``WorkdirError`` naming the directory when that fails (rather than an orbax timeout minutes
  later, or a full disk found at the first save)."""
  directory = paths.path(directory)
  probe = directory / f".write_probe.{socket.gethostname()}.{os.getpid()}"
  created = not directory.exists()
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe.write_bytes(b"locvit write probe\n" * 64)
    probe.unlink()
  except OSError as e:
    with contextlib.suppress(OSError):  # leave nothing behind (a full disk takes the empty file)
      probe.unlink(missing_ok=True)
      if created:
        directory.rmdir()
    raise WorkdirError(f"cannot write to {directory}: {e.strerror or e}") from None


def _holder_text(info: dict) -> str:
  return f"pid {info['pid']} on host {info['host']} (started {info['started']})"


def _describe(raw: str) -> str:
  try:
    return _holder_text(json.loads(raw))
  except (ValueError, KeyError, TypeError):
    return "another process"


def _info(**extra) -> dict:
  started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
  return {"pid": os.getpid(), "host": socket.gethostname(), "started": started, **extra}


def _in_use(workdir, holder: str) -> WorkdirError:
  return WorkdirError(
    f"workdir {workdir} is in use by {holder}; wait for that run to end or use another --workdir"
  )


class _LocalLock:
  """``fcntl.lockf`` on ``DIR/lock``; the file is removed when the run ends."""

  def __init__(self, workdir, lock_path: str):
    import fcntl

    self.path = lock_path
    self.fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      holder = _describe(os.pread(self.fd, 4096, 0).decode(errors="replace"))
      os.close(self.fd)  # closing our descriptor only: we never held the lock
      raise _in_use(workdir, holder) from None
    os.ftruncate(self.fd, 0)
    os.pwrite(self.fd, json.dumps(_info()).encode() + b"\n", 0)
    self.inode = os.fstat(self.fd).st_ino

  def problem(self) -> str | None:
    try:
      if os.stat(self.path).st_ino == self.inode:
        return None
      with open(self.path) as f:
        return f"was replaced (now held by {_describe(f.read())})"
    except FileNotFoundError:
      return "was deleted"

  def release(self) -> None:
    if self.problem() is None:
      os.unlink(self.path)  # while still locked: a finished workdir keeps no stale lock file
    os.close(self.fd)  # closing the descriptor releases the lockf lock


class _Lease:
  """A lease object on GCS, created and refreshed under generation preconditions."""

  def __init__(self, workdir, lock_path: epath.Path):
    from google.api_core import exceptions
    from google.cloud import storage

    bucket_name, _, name = os.fspath(lock_path).removeprefix("gs://").partition("/")
    self._precondition_failed = (exceptions.PreconditionFailed, exceptions.NotFound)
    self.blob = storage.Client().bucket(bucket_name).blob(name)
    self.lost: str | None = None
    self._stop = threading.Event()
    self._create(workdir)
    self._thread = threading.Thread(target=self._refresh, name="locvit-lease", daemon=True)
    self._thread.start()

  def _body(self) -> str:
    return json.dumps(_info(expires=time.time() + LEASE_SECONDS))

  def _create(self, workdir) -> None:
    try:
      self.blob.upload_from_string(self._body(), if_generation_match=0)
      return
    except self._precondition_failed:
      pass
    current = self.blob.bucket.get_blob(self.blob.name)
    if current is not None:
      raw = current.download_as_text()
      try:
        expired = json.loads(raw)["expires"] < time.time()
      except (ValueError, KeyError, TypeError):
        expired = False
      if not expired:
        raise _in_use(workdir, _describe(raw))
      try:  # an expired lease of a killed run: take it over, unless another run just did
        self.blob.upload_from_string(self._body(), if_generation_match=current.generation)
        return
      except self._precondition_failed:
        pass
    raise _in_use(workdir, "another run that took the lock at the same moment")

  def _refresh(self) -> None:
    while not self._stop.wait(LEASE_SECONDS / 4):
      try:
        self.blob.upload_from_string(self._body(), if_generation_match=self.blob.generation)
      except self._precondition_failed:
        current = self.blob.bucket.get_blob(self.blob.name)
        self.lost = (
          "was deleted"
          if current is None
          else f"was taken by {_describe(current.download_as_text())}"
        )
        return
      except Exception:  # a transient network error: the lease lasts 4 refresh periods
        continue

  def problem(self) -> str | None:
    return self.lost

  def release(self) -> None:
    self._stop.set()
    self._thread.join()
    if self.lost is None:
      with contextlib.suppress(self._precondition_failed):
        self.blob.delete(if_generation_match=self.blob.generation)


def _lock_key(workdir) -> str:
  lock_path = paths.path(workdir) / LOCK_NAME
  return os.fspath(lock_path) if paths.is_object_store(lock_path) else os.path.realpath(lock_path)


def acquire_lock(workdir) -> None:
  """Locks ``DIR/lock`` for this process, or raises ``WorkdirError`` naming the holder.

  A lock this process already holds (a run in this process that ended by an exception) is kept.
  """
  key = _lock_key(workdir)
  if key in _HELD:
    return
  if paths.scheme(key) == "gs":
    _HELD[key] = _Lease(workdir, epath.Path(key))
  elif paths.is_object_store(key):
    raise WorkdirError(f"{workdir}: a workdir lock on {paths.scheme(key)}:// is not supported")
  else:
    _HELD[key] = _LocalLock(workdir, key)


def check_lock(workdir) -> None:
  """Raises ``WorkdirError`` when the lock this process holds on ``workdir`` was deleted or taken
  over: going on would let two runs write the same checkpoints."""
  lock = _HELD.get(_lock_key(workdir))
  problem = lock.problem() if lock is not None else None
  if problem is not None:
    raise WorkdirError(
      f"the lock {paths.path(workdir) / LOCK_NAME} of this run {problem}; stopping so that two "
      "runs never write one workdir (the last checkpoint is kept)"
    )


def release_lock(workdir) -> None:
  """Releases the lock taken by ``acquire_lock`` (a no-op when this process holds none)."""
  lock = _HELD.pop(_lock_key(workdir), None)
  if lock is not None:
    lock.release()


def claim(workdir) -> None:
  """Start-up of a training run: on process 0, checks that ``DIR`` and ``DIR/checkpoints`` are
  writable and locks ``DIR``; every process then raises the same ``WorkdirError`` if that failed.
  """
  error = None
  if jax.process_index() == 0:
    try:
      check_writable(workdir)
      check_writable(paths.path(workdir) / "checkpoints")
      acquire_lock(workdir)
    except WorkdirError as e:
      error = e
  if jax.process_count() > 1:
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if failed and error is None:
      error = WorkdirError(f"process 0 could not claim workdir {workdir} (see its error)")
  if error is not None:
    raise error
