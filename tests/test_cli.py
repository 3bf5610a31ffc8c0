"""End-to-end runs through ``python -m locvit.main``: quickstart, SIGTERM, multi-process."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from locvit import main
from locvit.metrics import read_metrics
from locvit.platform import cpu_malloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(devices: int) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT prints every thread's stack (_finish_all)
  return env


def _main(*args, devices=8, stderr=subprocess.STDOUT, **kwargs):
  return subprocess.Popen(
    [sys.executable, "-m", "locvit.main", *args],
    cwd=ROOT,
    env=_env(devices),
    stdout=subprocess.PIPE,
    stderr=stderr,
    text=True,
    **kwargs,
  )


def _losses(workdir):
  return [r["train/loss"] for r in read_metrics(workdir) if "train/loss" in r]


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
  """The README's quickstart command at its defaults, run once: (workdir, stdout, stderr)."""
  workdir = tmp_path_factory.mktemp("quickstart") / "run"
  start = time.time()
  proc = _main("--config=configs/quickstart.py", f"--workdir={workdir}", stderr=subprocess.PIPE)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, (out, err)
  print(f"quickstart took {time.time() - start:.0f}s")
  return workdir, out, err


def _eval_numbers(row) -> str:
  return f"top-1 {row['eval/top1']:.4f}  top-5 {row['eval/top5']:.4f}  loss {row['eval/loss']:.4f}"


@pytest.mark.slow
def test_quickstart_reaches_090(quickstart):
  workdir, out, _ = quickstart
  final = [r for r in read_metrics(workdir) if "eval/top1" in r][-1]
  assert final["eval/top1"] >= 0.90, final
  assert f"Final evaluation at step {final['step']}/{final['step']}: {_eval_numbers(final)}" in out
  assert os.listdir(workdir / "checkpoints")


@pytest.mark.slow
def test_quickstart_reruns_to_the_printed_number(quickstart):
  """docs/results.md prints the quickstart's final evaluation on the tests' 8 CPU devices: XLA:CPU
  is deterministic for a fixed commit and seed, so a rerun prints the same numbers, and a change
  that moves them must print the new line there."""
  _, out, _ = quickstart
  results = (pathlib.Path(ROOT) / "docs" / "results.md").read_text()
  section = results.split("## Rerunning a figure", 1)[1].split("\n## ", 1)[0]
  printed = re.findall(r"^Final evaluation at step \S+: top-1 .*$", section, re.MULTILINE)
  assert len(printed) == 1, printed
  ran = [line for line in out.splitlines() if line.startswith("Final evaluation at step ")]
  assert [line.split("  (")[0] for line in ran] == printed


@pytest.mark.slow
def test_quickstart_is_quiet_and_prints_every_evaluation(quickstart):
  """At most 10 lines on stderr (no library INFO logs); on stdout whole lines, one per log interval
  and one per evaluation in metrics.jsonl; no ETA over 10 minutes (compilation is left out)."""
  workdir, out, err = quickstart
  assert len(err.splitlines()) <= 10, err
  assert "\r" not in out
  rows = read_metrics(workdir)
  total = rows[-1]["step"]
  lines = out.splitlines()
  for row in rows:
    if "eval/top1" in row:
      which = "Final evaluation" if row["step"] == total else "Evaluation"
      prefix = f"{which} at step {row['step']}/{total}: {_eval_numbers(row)}  ("
      assert sum(line.startswith(prefix) for line in lines) == 1, (prefix, out)
  progress = [line for line in lines if line.startswith("step ")]
  assert [int(line.split()[1].split("/")[0]) for line in progress] == [
    r["step"] for r in rows if "train/loss" in r
  ]
  etas = [line.split("ETA ")[1].split()[0] for line in progress if "ETA " in line]
  assert len(etas) == len(progress) - 1  # all but the first line, whose step compiles
  for eta in etas:
    hours, minutes, _ = map(int, eta.split(":"))
    assert hours * 60 + minutes < 10, eta
  # Plus, on CPU without TCMalloc, the one line naming it (main.CPU_MALLOC_HINT).
  notes = [line for line in lines if line.startswith("note: ")]
  assert notes == ([main.CPU_MALLOC_HINT] if cpu_malloc.find_tcmalloc() is None else [])
  assert len(lines) == len(progress) + sum("eval/top1" in r for r in rows) + len(notes)


@pytest.mark.slow
def test_rerun_on_a_finished_workdir_says_it_is_finished(quickstart):
  workdir, _, _ = quickstart
  before = (workdir / "metrics.jsonl").read_text()
  proc = _main("--config=configs/quickstart.py", f"--workdir={workdir}", stderr=subprocess.PIPE)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, (out, err)
  final = [r for r in read_metrics(workdir) if "eval/top1" in r][-1]
  lines = [line for line in out.splitlines() if not line.startswith("note: CPU training without")]
  assert lines == [
    f"{workdir} is finished at step {final['step']}/{final['step']}: {_eval_numbers(final)}. "
    "Nothing to train: raise --config.total_steps or use a new --workdir to train more."
  ]
  assert (workdir / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_cli_sigterm_then_resume_matches(tmp_path):
  """A real SIGTERM to the CLI during the step-8 evaluation, then a restart: the resumed run
  evaluates step 8, and every step is logged once with the uninterrupted run's losses and
  evaluations."""
  args = [
    "--config=tests/configs/tiny.py",
    "--config.total_steps=16",
    "--config.eval_every_steps=8",
  ]
  workdir = tmp_path / "split"
  proc = _main(*args, f"--workdir={workdir}")
  seen = []
  for line in proc.stdout:  # step 8's progress line comes just before its evaluation starts
    seen.append(line)
    if line.startswith("step 8/16"):
      proc.send_signal(signal.SIGTERM)
      break
  out, _ = proc.communicate(timeout=120)
  out = "".join(seen) + out
  assert proc.returncode == 0, out
  assert "Stop requested at step 8: the evaluation stopped after batch" in out
  assert "Preempted: checkpoint saved at step 8; exiting." in out
  assert "eval/top1" not in read_metrics(workdir)[-1]
  # The restart, side by side with the uninterrupted run
  again, full = _main(*args, f"--workdir={workdir}"), _main(*args, f"--workdir={tmp_path / 'full'}")
  (out2, _), (full_out, _) = _finish_all([again, full], 300)
  assert again.returncode == 0, out2
  assert full.returncode == 0, full_out
  assert "Evaluation at step 8/16" in out2
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == list(range(1, 17))  # each step once
  assert _losses(workdir) == _losses(tmp_path / "full")
  evals = lambda d: [
    (r["step"], r["eval/top1"], r["eval/loss"]) for r in read_metrics(d) if "eval/top1" in r
  ]
  assert evals(workdir) == evals(tmp_path / "full") and len(evals(workdir)) == 2


def _finish(proc, timeout):
  """``proc.communicate()`` within ``timeout`` seconds; see ``_finish_all``."""
  return _finish_all([proc], timeout)[0]


def _finish_all(procs, timeout):
  """``communicate()`` of each of ``procs`` (one run's processes), all within ``timeout`` seconds.
  When one is still running then, every one still running is aborted, and the assertion shows
  each process's output and where each of its threads waited (SIGABRT, with PYTHONFAULTHANDLER
  set in its environment, as ``_env`` does; less faulthandler's list of extension modules): a
  hang names the barrier, on every process."""
  deadline, ends = time.monotonic() + timeout, []
  try:
    for proc in procs:
      ends.append(proc.communicate(timeout=max(deadline - time.monotonic(), 0)))
    return ends
  except subprocess.TimeoutExpired:
    pass
  still_running = [proc.poll() is None for proc in procs]
  for proc, running in zip(procs, still_running):
    if running:
      proc.send_signal(signal.SIGABRT)
  ends += [proc.communicate(timeout=60) for proc in procs[len(ends) :]]  # output is kept
  report = []
  for i, (proc, running, (out, err)) in enumerate(zip(procs, still_running, ends)):
    state = f"still running after {timeout} s" if running else f"exited {proc.returncode}"
    out, err = (re.sub(r"\nExtension modules: .*", "", t) if t else t for t in (out, err))
    text = out[-12000:] if err is None else f"{out[-2000:]}\n{err[-12000:]}"
    report.append(f"process {i} of {len(procs)}, {state}:\n{text}")
  raise AssertionError("\n".join(report))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_eval_of_a_missing_workdir_is_one_clear_error_and_creates_nothing(tmp_path):
  """Also runs the CLI's re-execution under ``--cpu_malloc=retain`` (glibc)."""
  workdir = tmp_path / "no_such_run"
  proc = _main(
    "--config=configs/quickstart.py",
    f"--workdir={workdir}",
    "--mode=eval",
    "--cpu_malloc=retain",
    "--verbosity=0",  # the INFO line below
  )
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 2, out
  assert f"locvit: error: No checkpoint found in {workdir}/checkpoints." in out
  assert "Traceback" not in out  # nor one from a background thread at exit
  assert not workdir.exists()  # a mistyped --workdir is not created by reading it
  assert "cpu_malloc: retain" in out
