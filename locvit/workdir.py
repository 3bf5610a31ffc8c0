"""Start-up checks of a training workdir: writable directories and one run at a time.

On a local disk, ``DIR/lock`` is locked with ``fcntl.lockf`` by process 0 for the whole run. The
kernel drops the lock when its process ends, however it ends (SIGKILL included), so a lock left by a
killed run is simply taken over; the file's content (pid, host, start time) names the holder when a
second run is refused. A finished run removes the file.

An object store has no file locks. There ``DIR/lock`` is a lease: an object created only if absent
(GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``), rewritten every ``LEASE_SECONDS / 4`` while
the run lives (again under a precondition on its generation or ETag), and taken over once it is
``LEASE_SECONDS`` old. Cost: one small
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


class _ConflictError(Exception):
  """A write or delete refused by its precondition (the lease object changed or went)."""


class _Lease:
  """A lease object in a bucket, created and refreshed under preconditions on its version: the
  object's generation on GCS, its ETag on S3. Subclasses provide the four object operations."""

  def __init__(self, workdir, lock_path: epath.Path):
    self.bucket, _, self.name = os.fspath(lock_path).split("://", 1)[1].partition("/")
    self.version = None  # of the object this run wrote last
    self.lost: str | None = None
    self._stop = threading.Event()
    self._create(workdir)
    self._thread = threading.Thread(target=self._refresh, name="locvit-lease", daemon=True)
    self._thread.start()

  def _put(self, body: str, match) -> object:
    """Writes the object only if absent (``match`` None) or at version ``match``; returns the new
    version, or raises ``_ConflictError``."""
    raise NotImplementedError

  def _get(self) -> tuple[str, object] | None:
    """The object's text and version, or None when there is none."""
    raise NotImplementedError

  def _delete(self, match) -> None:
    """Deletes the object if still at version ``match``; raises ``_ConflictError`` otherwise."""
    raise NotImplementedError

  def _body(self) -> str:
    return json.dumps(_info(expires=time.time() + LEASE_SECONDS))

  def _create(self, workdir) -> None:
    try:
      self.version = self._put(self._body(), None)
      return
    except _ConflictError:
      pass
    current = self._get()
    if current is not None:
      raw, version = current
      try:
        expired = json.loads(raw)["expires"] < time.time()
      except (ValueError, KeyError, TypeError):
        expired = False
      if not expired:
        raise _in_use(workdir, _describe(raw))
      try:  # an expired lease of a killed run: take it over, unless another run just did
        self.version = self._put(self._body(), version)
        return
      except _ConflictError:
        pass
    raise _in_use(workdir, "another run that took the lock at the same moment")

  def _refresh(self) -> None:
    while not self._stop.wait(LEASE_SECONDS / 4):
      try:
        self.version = self._put(self._body(), self.version)
      except _ConflictError:
        current = self._get()
        self.lost = "was deleted" if current is None else f"was taken by {_describe(current[0])}"
        return
      except Exception:  # a transient network error: the lease lasts 4 refresh periods
        continue

  def problem(self) -> str | None:
    return self.lost

  def release(self) -> None:
    self._stop.set()
    self._thread.join()
    if self.lost is None:
      with contextlib.suppress(_ConflictError):
        self._delete(self.version)


class _GcsLease(_Lease):
  """Preconditions: ``ifGenerationMatch`` (0: only if absent), google-cloud-storage."""

  def __init__(self, workdir, lock_path: epath.Path):
    from google.api_core import exceptions
    from google.cloud import storage

    self._refused = (exceptions.PreconditionFailed, exceptions.NotFound)
    bucket, _, name = os.fspath(lock_path).removeprefix("gs://").partition("/")
    self.blob = storage.Client().bucket(bucket).blob(name)
    super().__init__(workdir, lock_path)

  def _put(self, body, match):
    try:
      self.blob.upload_from_string(body, if_generation_match=0 if match is None else match)
    except self._refused as e:
      raise _ConflictError from e
    return self.blob.generation

  def _get(self):
    current = self.blob.bucket.get_blob(self.blob.name)
    return None if current is None else (current.download_as_text(), current.generation)

  def _delete(self, match):
    try:
      self.blob.delete(if_generation_match=match)
    except self._refused as e:
      raise _ConflictError from e


class _S3Lease(_Lease):
  """Preconditions: S3 conditional requests, ``If-None-Match: *`` (only if absent) and
  ``If-Match: ETAG`` on PutObject and DeleteObject, with botocore (s3fs's own client library),
  which reads ``AWS_ENDPOINT_URL`` and the credentials the standard ways."""

  # 412: the precondition failed; 409: a concurrent conditional write won; 404: object deleted
  _REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "409", "412"}

  def __init__(self, workdir, lock_path: epath.Path):
    import botocore.session
    from botocore.exceptions import ClientError

    self._client_error = ClientError
    self.client = botocore.session.get_session().create_client("s3")
    super().__init__(workdir, lock_path)

  def _call(self, operation, **kwargs):
    try:
      return getattr(self.client, operation)(Bucket=self.bucket, Key=self.name, **kwargs)
    except self._client_error as e:
      if e.response.get("Error", {}).get("Code") in self._REFUSED:
        raise _ConflictError from e
      raise

  def _put(self, body, match):
    condition = {"IfNoneMatch": "*"} if match is None else {"IfMatch": match}
    return self._call("put_object", Body=body.encode(), **condition)["ETag"]

  def _get(self):
    try:
      response = self._call("get_object")
    except _ConflictError:  # NoSuchKey
      return None
    return response["Body"].read().decode(), response["ETag"]

  def _delete(self, match):
    self._call("delete_object", IfMatch=match)


_LEASES = {"gs": _GcsLease, "s3": _S3Lease}


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
  if paths.scheme(key) in _LEASES:
    _HELD[key] = _LEASES[paths.scheme(key)](workdir, epath.Path(key))
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
