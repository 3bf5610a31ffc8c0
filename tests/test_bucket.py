"""Workdirs in a bucket: the quickstart trains on ``gs://``, against a real GCS-API server on
loopback (tests/gcs_server.py), from a working directory that must stay empty."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.gcs_server import BUCKET, blobs, client_env, gcs_server
from tests.slow_proxy import progress_gaps, slow_proxy, timed_quickstart
from tests.test_cli import ROOT, _free_port

RUN = "run"
WORKDIR = f"gs://{BUCKET}/{RUN}"
# The quickstart, shortened: 40 steps, a checkpoint and an evaluation every 10.
SHORT = [
  "--config=quickstart",
  "--config.total_steps=40",
  "--config.checkpoint_every_steps=10",
  "--config.eval_every_steps=10",
  "--config.log_every_steps=5",
]


@pytest.fixture(scope="module")
def server():
  with gcs_server() as env:
    yield env


def _main(cwd, env, *args, python_prefix=(), devices=8):
  full_env = {**os.environ, **env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  command = [sys.executable, *python_prefix, "-m", "locvit.main", *args]
  if python_prefix:
    command = [sys.executable, *python_prefix, *args]
  return subprocess.Popen(
    command, cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )


def _rows(prefix=RUN):
  text = blobs(f"{prefix}/metrics.jsonl")[f"{prefix}/metrics.jsonl"].download_as_text()
  return [json.loads(line) for line in text.splitlines()]


def _steps(prefix=RUN):
  names = blobs(f"{prefix}/checkpoints/")
  return sorted({int(n.split("/")[2]) for n in names if n.split("/")[2].isdigit()})


@pytest.mark.slow
def test_quickstart_trains_in_a_bucket_survives_sigterm_damage_and_a_second_run(server, tmp_path):
  cwd = tmp_path / "cwd"
  cwd.mkdir()

  # Train; SIGTERM after the step-20 checkpoint; the run saves its step and exits 0.
  proc = _main(cwd, server, *SHORT, f"--workdir={WORKDIR}")
  seen = []
  for line in proc.stdout:
    seen.append(line)
    if line.startswith("step 25/40"):
      proc.send_signal(signal.SIGTERM)
      break
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, "".join(seen) + out + err
  saved = _steps()
  assert saved and 25 <= saved[-1] < 40, saved
  assert {f"{RUN}/config.json", f"{RUN}/metrics.jsonl"} <= set(blobs(RUN))

  # A second run on the workdir while the first one's lease is live is refused, naming it.
  lock = {"pid": 4242, "host": "other-host", "started": "now", "expires": time.time() + 600}
  blob = blobs(RUN).get(f"{RUN}/lock")
  assert blob is None, "a finished or preempted run leaves no lock behind"
  from google.cloud import storage

  lease = storage.Client().bucket(BUCKET).blob(f"{RUN}/lock")
  lease.upload_from_string(json.dumps(lock), if_generation_match=0)
  refused = _main(cwd, server, *SHORT, f"--workdir={WORKDIR}")
  out, err = refused.communicate(timeout=120)
  assert refused.returncode == 2, out + err
  assert f"workdir {WORKDIR} is in use by pid 4242 on host other-host" in err, err
  # ... and an expired lease (a killed run's) is taken over.
  lock["expires"] = time.time() - 1
  lease.upload_from_string(json.dumps(lock))

  # One object of the newest step is overwritten: the resume passes over that step with a
  # warning, keeps it under damaged/, and finishes from the step before.
  newest = saved[-1]
  data = sorted(n for n in blobs(f"{RUN}/checkpoints/{newest}/state/") if "/d/" in n)
  storage.Client().bucket(BUCKET).blob(data[0]).upload_from_string(b"\0" * 64)
  proc = _main(cwd, server, *SHORT, f"--workdir={WORKDIR}")
  out, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, out + err
  assert f"Damaged checkpoints skipped: step {newest}:" in err, err
  assert "checksum mismatch" in err
  assert any(n.startswith(f"{RUN}/checkpoints/damaged/{newest}/") for n in blobs(RUN))
  assert "Final evaluation at step 40/40" in out
  steps = [r["step"] for r in _rows()]
  assert steps == sorted(set(steps)) and steps[-1] == 40, steps  # each logged step once

  # Eval and analyze read the bucket (analyze writes its figures there).
  proc = _main(cwd, server, f"--workdir={WORKDIR}", "--mode=eval")
  out, err = proc.communicate(timeout=180)
  assert proc.returncode == 0, out + err
  assert out.startswith("Evaluation at step 40: top-1"), out
  proc = _main(cwd, server, f"--workdir={WORKDIR}", "--mode=analyze")
  out, err = proc.communicate(timeout=180)
  assert proc.returncode == 0, out + err
  assert f"{RUN}/analysis/attention_maps.png" in blobs(f"{RUN}/analysis/")

  assert list(cwd.iterdir()) == [], "nothing may be written under the working directory"


def test_a_missing_client_library_is_one_line_before_anything_is_created(server, tmp_path):
  blocked = (  # gcsfs not installed, as Python marks a blocked import
    "import sys, runpy; sys.modules['gcsfs'] = None; "
    "runpy.run_module('locvit.main', run_name='__main__')"
  )
  proc = _main(
    tmp_path,
    server,
    "--config=quickstart",
    f"--workdir=gs://{BUCKET}/nolib",
    python_prefix=("-c", blocked),
  )
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 2
  assert err.strip() == (
    f"locvit: error: gs://{BUCKET}/nolib: gs:// needs gcsfs: pip install 'locvit[gcs]'"
  ), err
  assert not blobs("nolib")
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_two_processes_save_to_a_bucket_and_one_process_resumes_on_half_the_devices(
  server, tmp_path
):
  """2 processes x 4 devices write one checkpoint in the bucket; SIGTERM to process 1 saves a step
  on both; 1 process x 4 devices resumes from the bucket and logs each later step once."""
  workdir = f"gs://{BUCKET}/topology"
  tiny = [
    f"--config={os.path.join(ROOT, 'tests', 'configs', 'tiny.py')}",
    "--config.total_steps=24",
    "--config.checkpoint_every_steps=4",
    f"--workdir={workdir}",
  ]
  port = _free_port()
  procs = [
    _main(
      tmp_path,
      server,
      *tiny,
      f"--coordinator_address=localhost:{port}",
      "--num_processes=2",
      f"--process_id={i}",
      devices=4,
    )
    for i in range(2)
  ]
  for line in procs[0].stdout:
    if line.startswith("step 10/24"):
      procs[1].send_signal(signal.SIGTERM)
      break
  for p in procs:
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, out[-2000:] + err[-3000:]
  stopped = _steps("topology")[-1]
  assert 10 <= stopped < 24
  resumed = _main(tmp_path, server, *tiny, devices=4)
  out, err = resumed.communicate(timeout=240)
  assert resumed.returncode == 0, out + err[-3000:]
  first = next(line for line in out.splitlines() if line.startswith("step "))
  assert first.startswith(f"step {stopped + 1}/24 "), out
  steps = [r["step"] for r in _rows("topology") if "train/loss" in r]
  assert steps == list(range(1, 25)), steps
  assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_slow_bucket_never_stalls_training_for_bookkeeping(server, tmp_path):
  """The quickstart, shortened, direct and through a proxy holding each request 0.1 s: the
  longest gap between progress lines grows by at most half, or to 3 s (benchmarks/slow_bucket.py
  measures the full run)."""
  args = [
    "--config.total_steps=90",
    "--config.log_every_steps=5",
    "--config.checkpoint_every_steps=30",
    "--config.eval_every_steps=0",
  ]
  with slow_proxy(server["STORAGE_EMULATOR_HOST"], 0.1) as url:
    direct = progress_gaps(timed_quickstart(server, f"gs://{BUCKET}/direct", args, tmp_path))
    slow = progress_gaps(timed_quickstart(client_env(url), f"gs://{BUCKET}/slow", args, tmp_path))
  assert slow[0] <= max(1.5 * direct[0], 3.0), f"longest gaps {direct} direct, {slow} slow"
  assert _steps("slow") == [30, 60, 90]
  assert list(tmp_path.iterdir()) == []
