"""Repeated two-process runs whose last-N and best/ checkpoints save the same steps asynchronously.

  python experiments/multiprocess_saves.py [--trials=20] [--steps=12] [--timeout=240]

Each trial starts two ``jax.distributed`` CPU processes (4 devices each) on the tiny test config
with a checkpoint and an evaluation every 2 steps (so the rolling and ``best/`` managers save the
same step, the case that used to hang in orbax's step-named barriers), waits at most ``--timeout``
seconds, and records the exit codes, the wall time and whether the final checkpoint is there.
Prints one line per trial and a summary (docs/reliability.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_TRIALS = flags.DEFINE_integer("trials", 20, "Number of two-process runs.")
_STEPS = flags.DEFINE_integer("steps", 12, "Training steps per run.")
_TIMEOUT = flags.DEFINE_integer("timeout", 240, "Seconds before a run counts as hung.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def trial(workdir: str, steps: int, timeout: int) -> tuple[list[int | None], float, bool]:
  """(exit codes, None for a hung process; seconds; whether step ``steps`` was saved)."""
  env = dict(
    os.environ,
    XLA_FLAGS="--xla_force_host_platform_device_count=4",
    JAX_PLATFORMS="cpu",
    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
  )
  port = _free_port()
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        "-m",
        "locvit.main",
        "--config=tests/configs/tiny.py",
        f"--workdir={workdir}",
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
        f"--config.total_steps={steps}",
        "--config.async_checkpointing=True",
        "--config.checkpoint_every_steps=2",
        "--config.eval_every_steps=2",
      ],
      cwd=ROOT,
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL,
    )
    for i in range(2)
  ]
  start, codes = time.time(), []
  for p in procs:
    try:
      codes.append(p.wait(timeout=max(1.0, timeout - (time.time() - start))))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
      codes.append(None)
  saved = os.path.isdir(os.path.join(workdir, "checkpoints", str(steps)))
  return codes, time.time() - start, saved


def main(argv):
  del argv
  ok = 0
  times = []
  for t in range(_TRIALS.value):
    with tempfile.TemporaryDirectory() as tmp:
      codes, seconds, saved = trial(os.path.join(tmp, "run"), _STEPS.value, _TIMEOUT.value)
    good = codes == [0, 0] and saved
    ok += good
    times.append(seconds)
    print(f"trial {t + 1}: exit codes {codes}, {seconds:.1f} s, final checkpoint saved: {saved}")
  print(
    f"{ok}/{_TRIALS.value} trials completed without a hang "
    f"({min(times):.1f}-{max(times):.1f} s per trial)",
    flush=True,
  )


if __name__ == "__main__":
  app.run(main)
