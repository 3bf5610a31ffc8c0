"""One path layer for everything a run reads or writes: local directories and object stores alike.

Paths are ``etils.epath.Path`` (the layer orbax uses): a local path, or ``gs://BUCKET/...`` (gcsfs)
and ``s3://BUCKET/...`` (s3fs). Object stores have no rename, no append and no file locks, so the
few operations that relied on them are spelled out here once, with their object-store form:
an atomic replace is a single object write, a move is copy-then-delete.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator

from etils import epath

# scheme -> (modules the scheme needs, the install line that provides them)
CLIENTS = {
  "gs": (("gcsfs", "google.cloud.storage"), "pip install 'locvit[gcs]'"),
  "s3": (("s3fs",), "pip install 'locvit[s3]'"),
}


class PathError(RuntimeError):
  """A workdir path that cannot be used as given (e.g. its storage client is not installed)."""


def scheme(path: str | os.PathLike) -> str:
  """'gs', 's3', ... for an object-store URI, '' for a local path."""
  text = os.fspath(path)
  return text.split("://", 1)[0] if "://" in text else ""


def is_object_store(path: str | os.PathLike) -> bool:
  """Whether ``path`` is an object-store URI (no rename, no append, no file locks)."""
  return scheme(path) != ""


def check_client(path: str | os.PathLike) -> None:
  """Raises ``PathError`` naming what to install when ``path``'s storage client is missing, so a
  run fails before it creates anything instead of deep inside a writer."""
  name = scheme(path)
  if not name:
    return
  if name not in CLIENTS:
    raise PathError(
      f"{path}: unsupported storage scheme '{name}://'; use a local path, gs:// or s3://"
    )
  modules, install = CLIENTS[name]
  missing = [m for m in modules if _missing(m)]
  if missing:
    raise PathError(f"{path}: {name}:// needs {' and '.join(missing)}: {install}")


def _missing(module: str) -> bool:
  if sys.modules.get(module, ...) is None:  # Python's mark of a blocked import
    return True
  try:
    return importlib.util.find_spec(module) is None
  except ModuleNotFoundError:  # a missing parent package
    return True


def path(value: str | os.PathLike) -> epath.Path:
  """``value`` as an epath.Path; local paths are made absolute (the cwd may change later)."""
  text = os.fspath(value)
  return epath.Path(text if is_object_store(text) else os.path.abspath(text))


def write_atomically(target: epath.Path, text: str) -> None:
  """Replaces ``target`` with ``text`` so that readers see the old or the new content, never a
  part: a temporary file renamed over it locally, one object write on an object store."""
  if is_object_store(target):
    target.write_text(text)
    return
  tmp = target.parent / (target.name + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, target)


def files_under(directory: epath.Path) -> list[epath.Path]:
  """Every file below ``directory``, recursively (epath's GCS backend refuses ``**`` globs)."""
  found = []
  for child in directory.iterdir():
    found.extend(files_under(child) if child.is_dir() else [child])
  return found


def move_tree(source: epath.Path, target: epath.Path) -> None:
  """Moves a directory: a rename locally; on an object store every object is copied, and the
  source is deleted only once all copies exist (a failure leaves the source whole)."""
  if not is_object_store(source):
    target.parent.mkdir(parents=True, exist_ok=True)
    os.rename(source, target)
    return
  for file in files_under(source):
    destination = target / os.path.relpath(os.fspath(file), os.fspath(source))
    destination.parent.mkdir(parents=True, exist_ok=True)
    file.copy(destination)
  source.rmtree()


def s3_endpoint() -> str | None:
  """The S3 endpoint to use instead of AWS (a local or S3-compatible server), from the standard
  AWS SDK variables ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``; None for AWS itself."""
  return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


# s3fs's wait after its try i fails (``s3fs.core._error_wrapper``), in seconds.
def _s3fs_wait(i: int) -> float:
  return min(0.1 * 1.7**i, 15.0)


# gcsfs's wait after its try i fails (``gcsfs.retry.retry_request``), at least: 2**i s plus up to
# 1 s at random, at most 32 s in all.
def _gcsfs_wait(i: int) -> float:
  return min(2.0**i, 32.0)


def _tries_spanning(seconds: float, wait) -> int:
  tries, waited = 1, 0.0
  while waited < seconds:
    waited += wait(tries - 1)
    tries += 1
  return tries


def s3fs_tries(seconds: float) -> int:
  """How many tries of a call s3fs must make for its waits between them to span ``seconds``."""
  return _tries_spanning(seconds, _s3fs_wait)


def gcsfs_tries(seconds: float) -> int:
  """How many tries of a call gcsfs must make for its waits between them to span ``seconds``."""
  return _tries_spanning(seconds, _gcsfs_wait)


class BucketClients:
  """A run's storage clients for its workdir, while it holds it: when the workdir is a bucket, its
  reads and writes through etils (orbax's metadata, locvit's metrics and manifests) go through
  gcsfs or s3fs, the clients locvit's bucket tests run, even where TensorFlow is installed (etils
  would pick ``tf.io.gfile`` then: on Colab, for one; ``EPATH_USE_TF``, etils' own switch, read at
  every path operation), and those clients retry a bucket that does not answer for ``seconds``.
  Nothing changes for a local path. ``restore`` puts back what was there before, which this
  object holds. Every process of a run needs it: each writes its own part of a checkpoint through
  the client (orbax's ``state/array_metadatas/process_N``)."""

  def __init__(self, workdir: str | os.PathLike, seconds: float):
    self._undo = contextlib.ExitStack()
    store = scheme(workdir)
    if store in ("gs", "s3"):
      with self._undo:  # a failure here undoes what was done
        self._undo.enter_context(_etils_without_tensorflow())
        self._undo.enter_context(
          retrying_gcs_for(seconds) if store == "gs" else retrying_s3_for(seconds)
        )
        self._undo = self._undo.pop_all()

  def restore(self) -> None:
    """Etils' choice of client and the clients' own retries, as they were."""
    self._undo.close()


@contextlib.contextmanager
def _etils_without_tensorflow() -> Iterator[None]:
  before = os.environ.get("EPATH_USE_TF")
  os.environ["EPATH_USE_TF"] = "false"
  _forget_etils_tf_check()
  try:
    yield
  finally:
    if before is None:
      os.environ.pop("EPATH_USE_TF", None)
    else:
      os.environ["EPATH_USE_TF"] = before
    _forget_etils_tf_check()


def _forget_etils_tf_check() -> None:
  """etils checks once per process whether to use TensorFlow (a cached check that reads
  ``EPATH_USE_TF``): forgotten, the variable as it is now decides the next path operation."""
  from etils.epath import gpath

  getattr(gpath._is_tf_installed, "cache_clear", lambda: None)()


@contextlib.contextmanager
def retrying_s3_for(seconds: float) -> Iterator[None]:
  """Within it, s3fs retries a call to a bucket that does not answer for ``seconds``. By default a
  call gives up after botocore's own 5 attempts, about 10 s: s3fs retries timeouts and broken
  replies 5 times, but not botocore's connection errors (``EndpointConnectionError``). A bucket
  workdir's outage is ended by ``locvit.workdir.outage``'s deadline,
  ``config.bucket_timeout_seconds``, not by whichever call gave up first."""
  import s3fs.core
  from botocore.exceptions import ConnectionError as BotocoreConnectionError

  own = (s3fs.S3FileSystem.retries, s3fs.core.S3_RETRYABLE_ERRORS)
  s3fs.S3FileSystem.retries = max(s3fs_tries(seconds), own[0])
  if BotocoreConnectionError not in s3fs.core.S3_RETRYABLE_ERRORS:
    s3fs.core.add_retryable_error(BotocoreConnectionError)
  try:
    yield
  finally:
    s3fs.S3FileSystem.retries, s3fs.core.S3_RETRYABLE_ERRORS = own


@contextlib.contextmanager
def retrying_gcs_for(seconds: float) -> Iterator[None]:
  """Within it, gcsfs retries a call to a bucket that does not answer for ``seconds``. By default
  a call gives up after 6 tries, 31 to 36 s (its waits: 1, 2, 4, 8 and 16 s, each plus up to 1 s).
  Its ``GCSFileSystem.retries`` is read only once, when its retry decorator wraps the request
  method at class definition, so the method is wrapped again, by gcsfs's own ``retry_request``
  (same waits, same retryable errors), with more tries: every gcsfs call of every instance,
  orbax's writes included, goes through it."""
  import gcsfs.retry
  from gcsfs.core import GCSFileSystem

  own = GCSFileSystem._request
  if not hasattr(own, "__wrapped__"):  # gcsfs is pinned; say what changed
    raise RuntimeError("gcsfs's GCSFileSystem._request is no longer its retry decorator's")
  tries = max(gcsfs_tries(seconds), GCSFileSystem.retries)
  GCSFileSystem._request = gcsfs.retry.retry_request(retries=tries)(own.__wrapped__)
  try:
    yield
  finally:
    GCSFileSystem._request = own


def tensorstore_s3_spec(bucket: str, key_prefix: str) -> dict:
  """TensorStore's kvstore spec for ``s3://bucket/key_prefix``, at ``s3_endpoint()``.

  s3fs/botocore read ``AWS_ENDPOINT_URL`` themselves; TensorStore's s3 driver (0.1.86) does not:
  its endpoint is only the spec's ``"endpoint"`` field, and without it the driver resolves the
  bucket's region with a HEAD request to https://BUCKET.s3.amazonaws.com (see its
  kvstore/s3/s3_endpoint.cc). With an endpoint it addresses the bucket path-style
  (ENDPOINT/BUCKET/KEY), which is what local servers need. Credentials come from the usual
  ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (or ~/.aws) in both clients; when the variables
  are set, TensorStore is told to read only them, since its default chain logs every file and
  service it tries and fails (~/.aws/config, ~/.aws/credentials, ...) as errors on stderr."""
  spec = {"driver": "s3", "bucket": bucket, "path": key_prefix}
  endpoint = s3_endpoint()
  if endpoint:
    spec["endpoint"] = endpoint
  if os.environ.get("AWS_ACCESS_KEY_ID"):
    spec["aws_credentials"] = {"type": "environment"}
  region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
  if region:
    spec["aws_region"] = region
  return spec
