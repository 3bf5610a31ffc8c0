"""A real S3-API server on loopback for tests: moto's server mode (PyPI ``moto[server]``), reached
the standard ways: ``AWS_ENDPOINT_URL`` and the ``AWS_*`` credentials for s3fs/botocore; TensorStore
(orbax's array writer) gets the same endpoint in its kvstore spec (``locvit.workdir.paths``)."""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import subprocess
import sys
import time
import urllib.request
from unittest import mock

from benchmarks.gcs_server import kill

BUCKET = "locvit-test"


def client_env(url: str) -> dict[str, str]:
  """The environment variables that point every S3 client at the server at ``url``."""
  return {
    "AWS_ENDPOINT_URL": url,
    "AWS_ACCESS_KEY_ID": "test",
    "AWS_SECRET_ACCESS_KEY": "test",
    "AWS_DEFAULT_REGION": "us-east-1",
  }


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# moto's server with the bucket and the objects (pickled, on stdin) in place before it serves: a
# client that calls while a restart is under way sees no empty bucket (a run's lease would be lost).
_SERVE = """
import pickle, sys
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import main
bucket, port = sys.argv[1:]
backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
backend.create_bucket(bucket, "us-east-1")
for key, body in pickle.load(sys.stdin.buffer).items():
  backend.put_object(bucket, key, body)
main(["-H", "127.0.0.1", "-p", port])
"""


class S3Server:
  """moto's server on a fixed loopback port. ``stop`` and ``start`` (by pid) make a bucket outage
  that loses nothing, as ``GcsServer``'s do: moto keeps its objects in memory only, so ``stop``
  copies them (between the copy and the kill, milliseconds, a write would be lost) and ``start``
  puts them back, with the same bytes and so the same ETags (a lease's ``If-Match`` still holds)."""

  def __init__(self, log_path: str = os.devnull):
    self.log_path = log_path
    self.url = f"http://127.0.0.1:{_free_port()}"
    self.env = client_env(self.url)
    self.process: subprocess.Popen | None = None
    self.kept: dict[str, bytes] = {}  # the objects at the last ``stop``

  def start(self) -> None:
    """Starts the server with the bucket ``BUCKET`` and the objects kept at the last ``stop``."""
    command = [sys.executable, "-c", _SERVE, BUCKET, self.url.rsplit(":", 1)[1]]
    with open(self.log_path, "a") as log:
      self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=log)
    with self.process.stdin as objects_in:
      objects_in.write(pickle.dumps(self.kept))
    _wait_until_serving(self.url, self.process)

  def stop(self) -> None:
    """Copies the objects, then kills the server (SIGKILL, as ``GcsServer.stop``)."""
    self.kept = objects("")
    kill(self.process)
    self.process = None

  # The objects of ``BUCKET``, as ``GcsServer`` has them (tests parametrized over both buckets).
  scheme = "s3"

  client_env = staticmethod(client_env)  # (url) -> the environment for a proxy at ``url``

  def names(self, prefix: str) -> list[str]:
    return names(prefix)

  def read(self, name: str) -> bytes:
    return client().get_object(Bucket=BUCKET, Key=name)["Body"].read()

  def write(self, name: str, data: bytes | str, only_if_absent: bool = False) -> None:
    conditions = {"IfNoneMatch": "*"} if only_if_absent else {}
    client().put_object(Bucket=BUCKET, Key=name, Body=data, **conditions)


@contextlib.contextmanager
def s3_server(log_path: str = os.devnull):
  """Starts moto's S3 server (in memory) with an empty bucket ``BUCKET``; yields the ``S3Server``
  (its client environment, ``.env``, is also set in ``os.environ`` meanwhile); stops it by pid."""
  server = S3Server(log_path)
  with mock.patch.dict(os.environ, server.env):
    try:
      server.start()
      yield server
    finally:
      if server.process is not None:
        kill(server.process)


def _wait_until_serving(url: str, server: subprocess.Popen, timeout: float = 30.0) -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if server.poll() is not None:
      raise RuntimeError(f"moto server exited with {server.returncode}")
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
      return
    time.sleep(0.1)
  raise RuntimeError(f"moto server at {url} did not answer within {timeout} s")


def client():
  """A botocore S3 client of the server (from the environment ``s3_server`` set)."""
  import botocore.session

  return botocore.session.get_session().create_client("s3")


def objects(prefix: str) -> dict[str, bytes]:
  """Every object under ``s3://BUCKET/prefix``: name -> content (less any deleted meanwhile)."""
  s3 = client()
  found = {}
  for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
    for item in page.get("Contents", []):
      with contextlib.suppress(s3.exceptions.NoSuchKey):
        found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
  return found


def names(prefix: str) -> list[str]:
  """The names of the objects under ``s3://BUCKET/prefix``, sorted."""
  s3 = client()
  pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
  return sorted(item["Key"] for page in pages for item in page.get("Contents", []))
