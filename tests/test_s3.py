"""Workdirs on ``s3://``, against a real S3-API server on loopback (moto, tests/s3_server.py):
outages, the lease's conditional requests, s3fs's retries. Files go through s3fs; orbax's arrays
through TensorStore's s3 driver. The faults a workdir in any bucket survives (SIGTERM, damaged
objects, a second run, another topology) are tests/test_bucket.py's, run on GCS and on S3."""

import concurrent.futures
import json
import re
import time

import pytest

from tests.s3_server import BUCKET, client, client_env, names, objects, s3_server
from tests.test_bucket import (
  OUTAGE_LIMIT,
  OUTAGE_RUN,
  _assert_gave_up_in_one_line,
  _finish,
  _main,
  _run_through_an_outage,
  _train_losses,
)


@pytest.fixture(scope="module")
def server():
  with s3_server() as s3:
    yield s3


@pytest.mark.slow
def test_a_short_s3_outage_during_a_save_is_ridden_out_and_a_long_one_ends_the_run_in_one_line(
  tmp_path,
):
  """tests/test_bucket.py's outages, on S3 (its own server)."""
  workdir = f"--workdir=s3://{BUCKET}/long"
  with s3_server() as s3, concurrent.futures.ThreadPoolExecutor(1) as pool:
    # A 14 s network outage from the first write of step 20's save, across the saves of step 20,
    # under a 30 s limit: longer than a call's own retries (botocore's 5 attempts, about 10 s; was:
    # "saving a checkpoint to s3://.../checkpoints failed (EndpointConnectionError: ...)"). The
    # run goes on. It runs alongside the long outage's run and its resume (each run through its
    # own proxy), as in tests/test_bucket.py.
    limit = "--config.bucket_timeout_seconds=30"
    short = [limit if a.startswith("--config.bucket_timeout") else a for a in OUTAGE_RUN]
    short = [*short, f"--workdir=s3://{BUCKET}/short"]
    riding_out = pool.submit(
      _run_through_an_outage, tmp_path, s3.url, client_env, short, "short", 14
    )

    # The bucket goes away for good from step 20's save, after step 10's commit: exit 2 within
    # the limit (plus a probe), one line, no traceback.
    long = [*OUTAGE_RUN, workdir]
    proc, out, err, waited = _run_through_an_outage(tmp_path, s3.url, client_env, long, "long")
    assert proc.returncode == 2, out + err
    assert waited < OUTAGE_LIMIT + 8, (waited, err)
    # botocore's error names its cause only in the error it was raised from: the line names that
    _assert_gave_up_in_one_line(err, f"s3://{BUCKET}", "long", "connection (refused|reset|aborted)")

    # The bucket answers again, step 20 as far as its save got (no commit_success.txt): the same
    # command takes over the dead process's lease and resumes after step 10, and ends as the short
    # outage's run did.
    proc = _main(tmp_path, s3.env, *OUTAGE_RUN, workdir)
    out, err = _finish(proc, 240)
    assert proc.returncode == 0, out + err
    assert re.search(
      r"Took over the lease s3://\S+/long/lock of pid \d+, which no longer runs", err
    )
    first = next(line for line in out.splitlines() if line.startswith("step "))
    assert first.startswith("step 11/20 "), out

    proc, out, err, _ = riding_out.result()
    assert proc.returncode == 0, out + err
    assert "Final evaluation at step 20/20" in out and "locvit:" not in err, out + err
    reference = _train_losses(s3, "short")
    assert sorted(reference) == [1, 5, 10, 15, 20], reference  # each step once

    saved = names("long/")
    commits = [
      n for n in saved if re.fullmatch(r"long/checkpoints/(best/)?\d+/commit_success.txt", n)
    ]
    assert sorted(commits) == [
      f"long/checkpoints/{s}/commit_success.txt" for s in ("10", "20", "best/20")
    ]
    # each logged step once across the two runs, with the losses of the run that rode it out
    assert _train_losses(s3, "long") == reference


# Writes metrics.jsonl in s3://BUCKET/ride under a 30 s config.bucket_timeout_seconds: a row, then,
# once the file `go` exists, a second row, at close.
RIDE_OUT = """
import os, sys, time
from locvit import metrics
from locvit.workdir import lock
directory, go = sys.argv[1:]
watch = lock.claim(directory, 30)  # the bucket's deadline: the writer's writes ride out an outage
writer = metrics.MetricWriter(directory, watch=watch)
writer.write(1, {"train/loss": 1.0})
writer.flush()
print("flushed", flush=True)
while not os.path.exists(go):
  time.sleep(0.05)
writer.write(2, {"train/loss": 2.0})
writer.close()
lock.release_lock(directory)
print("closed", flush=True)
"""


@pytest.mark.slow
def test_a_metrics_write_rides_out_an_s3_outage_that_outlasts_s3fs_own_retries(tmp_path):
  """s3fs gave up on a bucket that does not answer after about 10 s (botocore's own 5 attempts;
  s3fs does not retry a connection error by default), raising "Could not connect to the endpoint
  URL": the run ended with "writing .../metrics.jsonl failed", well within its bucket timeout.
  Now s3fs retries for the limit (``paths.retrying_s3_for``), and a write that a client gives up on
  sooner is made again once the bucket answers (``outage.retrying``)."""
  go = tmp_path / "go"
  with s3_server() as s3:
    proc = _main(tmp_path, s3.env, f"s3://{BUCKET}/ride", go, python_prefix=("-c", RIDE_OUT))
    assert proc.stdout.readline() == "flushed\n", _finish(proc, 60)
    s3.stop()
    go.touch()
    time.sleep(14)
    assert proc.poll() is None, _finish(proc, 60)
    s3.start()
    out, err = _finish(proc, 60)
    assert (proc.returncode, out) == (0, "closed\n"), out + err
    assert "Traceback" not in err and "locvit:" not in err, err
    rows = objects("ride/metrics.jsonl")["ride/metrics.jsonl"].decode().splitlines()
    assert [json.loads(row) for row in rows] == [
      {"step": 1, "train/loss": 1.0},
      {"step": 2, "train/loss": 2.0},
    ]
    assert any(n.startswith("ride/tensorboard/events.out.tfevents.") for n in names("ride/"))


def test_the_s3_lease_is_refreshed_under_its_etag_and_never_deletes_another_runs_lock(server):
  """The lease's conditional requests, in process: a refresh after another writer replaced or
  deleted the lock is refused (the run would stop), and release leaves another run's lock."""
  from locvit.workdir import lock

  directory = f"s3://{BUCKET}/lease"
  lock.acquire_lock(directory)
  lease = lock._HELD[lock._lock_key(directory)]
  try:
    lease.version = lease._put(lease._body(), lease.version)  # a refresh, as the thread does
    other = {"pid": 7, "host": "other-host", "started": "now", "expires": time.time() + 600}
    client().put_object(Bucket=BUCKET, Key="lease/lock", Body=json.dumps(other))
    with pytest.raises(lock._ConflictError):
      lease._put(lease._body(), lease.version)
  finally:
    lock.release_lock(directory)
  assert json.loads(objects("lease/lock")["lease/lock"])["pid"] == 7, "another run's lock is kept"

  client().delete_object(Bucket=BUCKET, Key="lease/lock")
  lock.acquire_lock(directory)
  lease = lock._HELD[lock._lock_key(directory)]
  try:
    client().delete_object(Bucket=BUCKET, Key="lease/lock")
    with pytest.raises(lock._ConflictError):
      lease._put(lease._body(), lease.version)
    assert lease._get() is None
  finally:
    lock.release_lock(directory)
  assert names("lease/") == []


def test_s3fs_retries_a_bucket_that_does_not_answer_for_the_runs_limit_on_every_process():
  """s3fs's own retry loop (``_error_wrapper``) and backoff, its waits recorded, not slept: once
  ``claim`` has run on a process other than 0 (which writes its own
  ``array_metadatas/process_N`` through s3fs during a save, and holds no lease), a refused
  connection is tried again for at least ``bucket_timeout_seconds`` (60 here); after
  ``release_lock``, once, as s3fs does by default."""
  import asyncio
  from unittest import mock

  import jax
  import s3fs.core
  from botocore.exceptions import EndpointConnectionError

  from locvit.workdir import lock

  def waits_of_a_refused_call() -> list[float]:
    waits, tries = [], []

    async def refused():
      tries.append(len(waits))
      raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1")

    async def wait(seconds):
      waits.append(seconds)

    with mock.patch.object(asyncio, "sleep", wait), pytest.raises(EndpointConnectionError):
      asyncio.run(s3fs.core._error_wrapper(refused, retries=s3fs.S3FileSystem.retries))
    return waits[: tries[-1]]  # the waits before the last try

  directory = f"s3://{BUCKET}/process-1"
  with mock.patch.object(jax, "process_index", return_value=1):
    lock.claim(directory, 60)
  try:
    assert 60 <= sum(waits_of_a_refused_call()) < 60 + 15
  finally:
    lock.release_lock(directory)
  assert waits_of_a_refused_call() == []
