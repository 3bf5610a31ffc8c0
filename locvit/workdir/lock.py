"""Start-up checks of a training workdir: writable directories and one run at a time.

On a local disk, ``DIR/lock`` is locked with ``fcntl.lockf`` by process 0 for the whole run. The
kernel drops the lock when its process ends, however it ends (SIGKILL included), so a lock left by a
killed run is simply taken over; the file's content (pid, host, start time) names the holder when a
second run is refused. A finished run removes the file.

An object store has no file locks. There ``DIR/lock`` is a lease: an object created only if absent
(GCS ``ifGenerationMatch=0``, S3 ``If-None-Match: *``), rewritten every ``LEASE_SECONDS / 4`` while
the run lives (again under a precondition on its generation or ETag), and taken over once it is
``LEASE_SECONDS`` old, or at once when its holder ran on this host and is no longer running (its
pid is gone, or now belongs to a process started at another time). Cost: one small object write
every 15 s; a run killed on another host blocks its workdir for at most a minute, and the refusal
says when the lease expires.

The lease's thread is also how the run hears from its bucket: it reports each failure and each
answer to the lease's ``locvit.workdir.outage.Watch`` (which ``claim`` returns to the run),
probing every few seconds while something waits on the bucket, so a bucket that stays away ends
the run after ``config.bucket_timeout_seconds`` with one line. A lease outlives that limit, so a
run that cannot reach its bucket stops before its lease can expire.

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
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from locvit.workdir import outage, paths

LOCK_NAME = "lock"
LEASE_SECONDS = 60.0
PROBE_SECONDS = 2.0  # between probes of the bucket while something waits on it
_HELD: dict[str, _LocalLock | _Lease] = {}  # lock path -> the lock this process holds
_CLIENTS: dict[str, paths.BucketClients] = {}  # lock path -> the clients a claim set up


class WorkdirError(RuntimeError):
  """The workdir cannot be used: not writable, or in use by another run."""


def check_writable(directory: str | os.PathLike) -> None:
  """Creates ``directory`` if needed and writes (real bytes) and deletes a probe in it; raises
  ``WorkdirError`` naming the directory when that fails (rather than an orbax timeout minutes
  later, or a full disk found at the first save)."""
  directory = paths.path(directory)
  probe = directory / f".write_probe.{socket.gethostname()}.{os.getpid()}"
  created = not directory.exists()
  if not created and not directory.is_dir():  # was mkdir's "File exists"
    raise WorkdirError(f"cannot write to {directory}: it is a file, not a directory")
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
  info = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
  return {**info, "pid_start": _process_start(os.getpid()), **extra}


def _stat(pid: int) -> list[str] | None:
  """The fields of ``/proc/PID/stat`` after the command name (state first), or None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rpartition(")")[2].split()
  except OSError:
    return None


def _process_start(pid: int) -> str | None:
  """When process ``pid`` started (``/proc/PID/stat``'s starttime, in clock ticks since boot), so
  that a pid reused by a later process is told apart; None without /proc."""
  fields = _stat(pid)
  return fields[19] if fields and len(fields) > 19 else None


def _gone_from_this_host(info: dict) -> bool:
  """Whether the holder ``info`` ran on this host and no longer runs: its pid is gone, killed but
  not yet reaped, or now another process (started at another time)."""
  if info.get("host") != socket.gethostname() or not isinstance(info.get("pid"), int):
    return False
  try:
    os.kill(info["pid"], 0)
  except ProcessLookupError:
    return True
  except PermissionError:  # alive, another user's
    pass
  fields = _stat(info["pid"])
  if fields is None:  # no /proc: the pid is alive, and that is all that can be told
    return False
  started = info.get("pid_start")
  return fields[0] == "Z" or (started is not None and started != _process_start(info["pid"]))


def _expiry_text(expires: float) -> str:
  at = time.strftime("%H:%M:%S UTC", time.gmtime(expires))
  return f"expires in {max(expires - time.time(), 0):.0f} s, at {at}"


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

  def __init__(self, workdir, lock_path: epath.Path, watch: outage.Watch, limit: float):
    self.watch = watch  # the run's deadline: the lease's thread reports the bucket's answers to it
    self.bucket, _, self.name = os.fspath(lock_path).split("://", 1)[1].partition("/")
    self.path = os.fspath(lock_path)
    self.version = None  # of the object this run wrote last
    self.lost: str | None = None
    # Outlives the bucket's time limit (plus one refresh): the run stops before its lease expires.
    self.lifetime = max(LEASE_SECONDS, limit + LEASE_SECONDS / 4)
    self.expires = 0.0  # time.time() at which the lease last written expires
    self.call_seconds = min(10.0, max(limit / 4, 1.0))  # one bucket call, then the next try
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

  def _body(self, expires: float | None = None) -> str:
    return json.dumps(_info(expires=expires or time.time() + self.lifetime))

  def _write(self, match) -> None:
    """Writes the lease (under ``_put``'s precondition) and notes when it expires."""
    expires = time.time() + self.lifetime
    self.version = self._put(self._body(expires), match)
    self.expires = expires

  def _create(self, workdir) -> None:
    try:
      self._write(None)
      return
    except _ConflictError:
      pass
    current = self._get()
    if current is not None:
      raw, version = current
      try:
        info = json.loads(raw)
        expires = float(info["expires"])
      except (ValueError, KeyError, TypeError):
        info, expires = {}, float("inf")
      dead = _gone_from_this_host(info)
      if expires >= time.time() and not dead:
        if expires == float("inf"):
          raise _in_use(workdir, _describe(raw))
        raise WorkdirError(
          f"workdir {workdir} is in use by {_describe(raw)}; its lease {_expiry_text(expires)}, "
          "and the same command will then resume (if that run has stopped), or use another "
          "--workdir"
        )
      try:  # an expired lease, or a dead holder's: take it over, unless another run just did
        self._write(version)
        if dead:
          logging.warning(
            "Took over the lease %s of pid %s, which no longer runs on this host.",
            self.path,
            info["pid"],
          )
        return
      except _ConflictError:
        pass
    raise _in_use(workdir, "another run that took the lock at the same moment")

  def _due(self, written: float, called: float) -> bool:
    """Whether the next bucket call is due: the refresh every ``LEASE_SECONDS / 4``, and a probe
    every ``PROBE_SECONDS`` while something waits on the bucket (or it is failing)."""
    now = time.monotonic()
    busy = self.watch.busy()
    return now - written >= LEASE_SECONDS / 4 or (busy and now - called >= PROBE_SECONDS)

  def _refresh(self) -> None:
    written = called = time.monotonic()
    while not self._stop.wait(0.25):  # no I/O unless a call is due
      if not self._due(written, called):
        continue
      called = time.monotonic()
      try:
        if called - written >= LEASE_SECONDS / 4:
          self._write(self.version)
          written = called
        else:
          self._get()  # a probe of the bucket
      except _ConflictError:
        with contextlib.suppress(Exception):
          current = self._get()
          self.lost = "was deleted" if current is None else f"was taken by {_describe(current[0])}"
        self.lost = self.lost or "was taken over"
        return
      except Exception as e:  # the bucket did not answer: the next try comes soon
        self.watch.failed(e)
        continue
      self.watch.answered()

  def problem(self) -> str | None:
    return self.lost

  def release(self) -> None:
    """Deletes the lease; raises ``WorkdirError`` (naming when the lease expires) when the bucket
    does not answer. Every bucket call here is bounded (``call_seconds``)."""
    self._stop.set()
    self._thread.join()
    if self.lost is None:
      try:
        with contextlib.suppress(_ConflictError):
          self._delete(self.version)
      except Exception as e:
        raise WorkdirError(
          f"could not release the lease {self.path} ({outage.one_line(e)}); it "
          f"{_expiry_text(self.expires)}, and a later run can then take it over"
        ) from None


class _GcsLease(_Lease):
  """Preconditions: ``ifGenerationMatch`` (0: only if absent), google-cloud-storage."""

  def __init__(self, workdir, lock_path: epath.Path, watch: outage.Watch, limit: float):
    from google.api_core import exceptions
    from google.cloud import storage

    self._refused = (exceptions.PreconditionFailed, exceptions.NotFound)
    bucket, _, name = os.fspath(lock_path).removeprefix("gs://").partition("/")
    self.blob = storage.Client().bucket(bucket).blob(name)
    super().__init__(workdir, lock_path, watch, limit)

  def _bounded(self) -> dict:
    # One try per call (the library's own retries last 120 s): the lease thread tries again.
    return {"timeout": self.call_seconds, "retry": None}

  def _put(self, body, match):
    try:
      self.blob.upload_from_string(
        body, if_generation_match=0 if match is None else match, **self._bounded()
      )
    except self._refused as e:
      raise _ConflictError from e
    return self.blob.generation

  def _get(self):
    current = self.blob.bucket.get_blob(self.blob.name, **self._bounded())
    if current is None:
      return None
    return current.download_as_text(**self._bounded()), current.generation

  def _delete(self, match):
    try:
      self.blob.delete(if_generation_match=match, **self._bounded())
    except self._refused as e:
      raise _ConflictError from e


class _S3Lease(_Lease):
  """Preconditions: S3 conditional requests, ``If-None-Match: *`` (only if absent) and
  ``If-Match: ETAG`` on PutObject and DeleteObject, with botocore (s3fs's own client library),
  which reads ``AWS_ENDPOINT_URL`` and the credentials the standard ways."""

  # 412: the precondition failed; 409: a concurrent conditional write won; 404: object deleted
  _REFUSED = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "404", "409", "412"}

  def __init__(self, workdir, lock_path: epath.Path, watch: outage.Watch, limit: float):
    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import ClientError

    self._client_error = ClientError
    seconds = min(10.0, max(limit / 4, 1.0))  # bounded calls: the lease thread tries again
    bounded = Config(connect_timeout=seconds, read_timeout=seconds, retries={"max_attempts": 1})
    self.client = botocore.session.get_session().create_client("s3", config=bounded)
    super().__init__(workdir, lock_path, watch, limit)

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


def acquire_lock(workdir, bucket_timeout: float = LEASE_SECONDS) -> outage.Watch | None:
  """Locks ``DIR/lock`` for this process, or raises ``WorkdirError`` naming the holder.

  On a bucket, also starts the lease's ``locvit.workdir.outage.Watch`` and returns it: a bucket
  that does not answer for ``bucket_timeout`` seconds ends the process with one line (exit status
  2). None on a local disk. A lock this process already holds (a run in this process that ended
  by an exception) is kept, with its watch.
  """
  key = _lock_key(workdir)
  if key in _HELD:
    return getattr(_HELD[key], "watch", None)
  if paths.scheme(key) in _LEASES:
    watch = outage.Watch(os.fspath(paths.path(workdir)), bucket_timeout)
    try:
      _HELD[key] = _LEASES[paths.scheme(key)](workdir, epath.Path(key), watch, bucket_timeout)
    except BaseException:
      watch.stop()
      raise
    return watch
  if paths.is_object_store(key):
    raise WorkdirError(f"{workdir}: a workdir lock on {paths.scheme(key)}:// is not supported")
  _HELD[key] = _LocalLock(workdir, key)
  return None


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
  """Releases the lock taken by ``acquire_lock`` (a no-op when this process holds none), and, on
  every process, puts back etils' choice of storage client and the clients' own retries
  (``claim``)."""
  key = _lock_key(workdir)
  lock, clients = _HELD.pop(key, None), _CLIENTS.pop(key, None)
  try:
    if lock is not None:
      lock.release()
  finally:
    if isinstance(lock, _Lease):
      lock.watch.stop()
    if clients is not None:
      clients.restore()


def claim(workdir, bucket_timeout: float = LEASE_SECONDS) -> outage.Watch | None:
  """Start-up of a training run: on process 0, checks that ``DIR`` and ``DIR/checkpoints`` are
  writable and locks ``DIR`` (``acquire_lock``); every process then raises the same
  ``WorkdirError`` if that failed. Returns the run's ``outage.Watch`` of its bucket (process 0,
  which holds the lease), for what the run writes there; None on a local disk and elsewhere.

  On a bucket, every process first routes the bucket through gcsfs or s3fs (also where
  TensorFlow is installed), and those clients retry a bucket that does not answer for
  ``bucket_timeout`` seconds (``paths.BucketClients``; s3fs gives up after about 10 s,
  gcsfs after about 30 s): a shorter outage is ridden out, during a checkpoint save too, and
  process 0's deadline (the watch), not whichever call gave up first, ends a longer one.
  ``release_lock`` puts both back, also when the claim fails.
  """
  key = _lock_key(workdir)
  if key not in _CLIENTS:
    _CLIENTS[key] = paths.BucketClients(workdir, bucket_timeout)
  error = watch = None
  if jax.process_index() == 0:
    try:
      check_writable(workdir)
      check_writable(paths.path(workdir) / "checkpoints")
      watch = acquire_lock(workdir, bucket_timeout)
    except WorkdirError as e:
      error = e
  if jax.process_count() > 1:
    failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
    if failed and error is None:
      error = WorkdirError(f"process 0 could not claim workdir {workdir} (see its error)")
  if error is not None:
    raise error
  return watch
