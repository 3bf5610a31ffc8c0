"""Command-line entry point.

  python -m locvit.main --config=configs/NAME.py --workdir=DIR [--config.FIELD=VALUE ...]
  python -m locvit.main --config=... --workdir=DIR --mode=eval [--step=N]
  python -m locvit.main --config=... --workdir=DIR --mode=analyze   # ConViT Figs. 5-7 as PNG
  python -m locvit.main --config=... --workdir=DIR --cpu_malloc=tcmalloc  # faster CPU steps

Multi-host (TPU pods, multi-node GPU): every process runs the same command; add
``--jax_distributed`` to let ``jax.distributed.initialize()`` auto-detect the cluster, or pass
``--coordinator_address=HOST:PORT --num_processes=P --process_id=I`` explicitly.
"""

from __future__ import annotations

import json
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from locvit import cpu_malloc

MODES = ("train", "eval", "analyze")

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Path to a config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_MODE = flags.DEFINE_enum("mode", "train", MODES, "What to run.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step for --mode=eval (default: latest).")
_DISTRIBUTED = flags.DEFINE_bool(
  "jax_distributed", False, "Call jax.distributed.initialize() with cluster auto-detection."
)
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
  "heartbeat_timeout",
  100,
  "Seconds without heartbeats after which a process counts as dead; the others then exit with an "
  "error instead of waiting in a collective.",
)
_CPU_MALLOC = flags.DEFINE_enum(
  "cpu_malloc",
  "auto",
  cpu_malloc.FLAG_CHOICES,
  "Allocator for CPU training. 'tcmalloc' (if installed) or 'retain' (glibc settings) re-run the "
  "command once so that XLA's per-step temporaries stay mapped: faster steps, more resident "
  "memory. 'auto': tcmalloc where JAX can only use the CPU and TCMalloc is installed, else "
  "default. See locvit/cpu_malloc.py.",
)
_TRACEBACK = flags.DEFINE_bool("traceback", False, "Show full tracebacks for config errors.")
flags.mark_flags_as_required(["config", "workdir"])


def _init_distributed() -> None:
  if _COORDINATOR.value:
    jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value,
      process_id=_PROCESS_ID.value,
      heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value,
    )
  elif _DISTRIBUTED.value:
    jax.distributed.initialize(heartbeat_timeout_seconds=_HEARTBEAT_TIMEOUT.value)


def main(argv):
  """Runs ``--mode`` (train, eval or analyze) on ``--config`` and ``--workdir``."""
  del argv
  cpu_malloc.reexec_with(_CPU_MALLOC.value)  # before any device or thread starts
  _init_distributed()
  from locvit import train

  logging.info(
    "JAX %s: %d processes, %d devices", jax.__version__, jax.process_count(), jax.device_count()
  )
  active = [mode for mode in ("tcmalloc", "retain") if cpu_malloc.is_active(mode)]
  if active:
    logging.info("cpu_malloc: %s", active[0])
  elif jax.default_backend() == "cpu":
    logging.info(
      "CPU training: TCMalloc (apt install libtcmalloc-minimal4) avoids per-step page "
      "faults; see the README"
    )
  config = _CONFIG.value
  if _MODE.value == "analyze":  # PNG figures of a run: nonlocality, gates, attention maps
    from locvit.analysis.analyze import analyze

    for path in analyze(config, _WORKDIR.value, step=_STEP.value):
      print(path, flush=True)
    return
  if _MODE.value == "eval":
    result = train.evaluate_checkpoint(config, _WORKDIR.value, _STEP.value)
    print(json.dumps(result), flush=True)
    return
  result = train.train_and_evaluate(config, _WORKDIR.value)
  if result.get("preempted"):
    sys.exit(0)


def _main_with_clear_errors(argv):
  """Configuration and data errors are printed as one clear message, not a traceback."""
  try:
    main(argv)
  except (ValueError, FileNotFoundError, AttributeError, KeyError) as e:
    if _TRACEBACK.value:
      raise
    print(f"locvit: error: {e}\n(run with --traceback for the full stack)", file=sys.stderr)
    sys.exit(2)


def run() -> None:
  """Console entry point: parses flags and runs ``main`` with one-line config/data errors."""
  app.run(_main_with_clear_errors)


if __name__ == "__main__":
  run()
