"""Command-line entry point.

  python -m locvit.main --config=configs/NAME.py --workdir=DIR [--config.FIELD=VALUE ...]
  python -m locvit.main --config=NAME --workdir=DIR           # a shipped config, by name
  python -m locvit.main --config=NAME --workdir=DIR --data=image_folder:ROOT  # its data from ROOT
  python -m locvit.main --workdir=DIR --mode=eval [--step=N]  # the config saved in DIR
  python -m locvit.main --workdir=DIR --mode=analyze          # curves, attention figures (PNG)
  python -m locvit.main --mode=predict --config.init_from.weights=convit_tiny.fb_in1k \
    --data=image_folder:PHOTOS --workdir=DIR  # published weights: DIR/predictions.jsonl
  python -m locvit.main --config=... --workdir=DIR --cpu_malloc=tcmalloc  # faster CPU steps

``--config`` takes a file, the name of a shipped config (``convit_s``,
``gmm_table1:vit,cifar10,gmm``; ``--list_configs`` shows each one's argument and its choices), or
a run's ``DIR/config.json``. Without it the config saved in ``--workdir`` is used, or, for
published weights (``--config.init_from.weights``) and a workdir without one, the shipped
``pretrained`` config. ``--mode=eval`` and ``--mode=predict`` on such a workdir run the weights
with their own model, class count and preprocessing (``locvit.run.predict``). Library INFO
logs are off unless ``--verbosity=0`` (or higher) asks for them.

Multi-host (TPU pods, multi-node GPU): every process runs the same command; add
``--jax_distributed`` to let ``jax.distributed.initialize()`` auto-detect the cluster, or pass
``--coordinator_address=HOST:PORT --num_processes=P --process_id=I`` explicitly.
"""

from __future__ import annotations

import difflib
import functools
import logging as std_logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence

import jax
import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags

from locvit.metrics import append_evaluation, evaluation_line
from locvit.platform import cpu_malloc
from locvit.run import preemption
from locvit.run.config import (
  ConfigError,
  add_model_overrides,
  config_argv,
  explain_override,
  flag_value,
  list_configs_text,
  with_absolute_paths,
  with_data,
)
from locvit.workdir import lock, paths, saved_config

MODES = ("train", "eval", "predict", "analyze")

try:  # config_flags reads sys.argv's --flagfile here, when the flag is defined
  _CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "A config file, the name of a shipped config (e.g. convit_s), or a run's config.json. "
    "Default: the config saved in --workdir.",
    lock_config=True,
  )
except flags.CantOpenFlagFileError as e:
  if __name__ != "__main__":
    raise
  print(f"locvit: error: {str(e).removeprefix('ERROR:: ')}", file=sys.stderr)
  sys.exit(2)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics.")
_DATA = flags.DEFINE_string(
  "data",
  None,
  "Where the config's dataset is read from, for any config: 'image_folder:DIR' (or just DIR: "
  "DIR/<split>/<class>/*.jpg) or 'tfds[:DATA_DIR]'. The class count, image size and "
  "normalisation stay the config's. Default: the config's choice ($CIFAR10_ROOT, ... ; "
  "configs/datasets.py).",
)
_MODE = flags.DEFINE_enum("mode", "train", MODES, "What to run.")
_STEP = flags.DEFINE_integer(
  "step", None, "Checkpoint step for --mode=eval and --mode=analyze (default: latest)."
)
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
  "default. See locvit/platform/cpu_malloc.py.",
)
_TRACEBACK = flags.DEFINE_bool("traceback", False, "Show full tracebacks for config errors.")
_LIST_MODELS = flags.DEFINE_string(
  "list_models", None, "Print the registered models matching a glob (e.g. 'convit*') and exit."
)
_LIST_CONFIGS = flags.DEFINE_bool("list_configs", False, "Print the shipped configs and exit.")
_PRINT_CONFIG = flags.DEFINE_bool(
  "print_config", False, "Print the resolved config (overrides included) and exit."
)


CPU_MALLOC_HINT = (
  "note: CPU training without TCMalloc; `apt install libtcmalloc-minimal4` makes steps 1.2-1.9x "
  "faster (README: On CPU)"
)


def _parse_flags(argv: Sequence[str]) -> list[str]:
  """absl's flag parsing, with config and flag mistakes as one line on stderr (exit 2). The model
  overrides (``split_model_overrides``) join ``--config`` here: ``FLAGS.config`` is the whole."""
  argv = ["--list_models=" if arg in ("--list_models", "-list_models") else arg for arg in argv]
  try:
    workdir = flag_value(argv, "workdir")[1]
    if workdir:  # a bucket workdir without its client library: one line, before anything
      paths.check_client(workdir)
    mode = flag_value(argv, "mode")[1]
    if mode is not None and mode not in MODES:  # before the config it would read from --workdir
      close = difflib.get_close_matches(mode, MODES, n=1)
      hint = f"; did you mean {close[0]}?" if close else ""
      raise ConfigError(f"--mode={mode}: choose {', '.join(MODES[:-1])} or {MODES[-1]}{hint}")
    sys.argv, added = config_argv(argv)
    rest = flags.FLAGS(sys.argv)
    add_model_overrides(_CONFIG.value, added)
    return rest
  except SystemExit as e:  # absl's --help / --helpfull print the flags, then exit 1
    asked = {"--help", "-help", "--helpfull", "--helpshort", "--helpxml", "-h", "-?"} & set(argv)
    sys.exit(0 if asked and e.code == 1 else e.code)
  except Exception as e:
    if "--traceback" in argv:
      raise
    last_line = str(e).strip().splitlines()[-1]
    if "Error whilst parsing config file" in str(e):  # get_config raised: its message, no stack
      given = flag_value(argv, "config")[1]
      reason = re.sub(r"^\w+: ", "", last_line)
      if given and reason.startswith("get_config() takes 0 positional arguments"):
        name = os.path.basename(given.partition(":")[0]).removesuffix(".py")
        reason = f"{name} takes no argument (`--list_configs` shows each config's arguments)"
      message = (f"--config={given}: " if given else "") + reason
    elif isinstance(e, ConfigError | flags.Error | paths.PathError):
      message = str(e)
    else:  # e.g. ml_collections' AttributeError for an override naming no field
      message = explain_override(sys.argv) or last_line
    _exit_with_error(message)


# How long the interpreter may take to shut down after the error or stop line: a thread stuck in a
# failed bucket write (orbax's, TensorStore's: non-daemon) would otherwise keep the process alive.
EXIT_GRACE_SECONDS = 10.0


def _exit(status: int) -> None:
  timer = threading.Timer(EXIT_GRACE_SECONDS, os._exit, (status,))
  timer.daemon = True
  timer.start()
  sys.exit(status)


def _exit_with_error(message: str, notes: Sequence[str] = ()) -> None:
  print(f"locvit: error: {message}", file=sys.stderr, flush=True)
  for note in notes:  # what failed after the error, e.g. releasing the workdir's lease
    print(f"locvit: also: {note}", file=sys.stderr, flush=True)
  _exit(2)


def the_config() -> ml_collections.ConfigDict:
  """``--config`` with its overrides, reading its data as ``--data`` says, if given; its local
  paths (``locvit.run.config.PATH_FIELDS``) made absolute."""
  return with_absolute_paths(with_data(_CONFIG.value, _DATA.value))


def check_config(config: ml_collections.ConfigDict) -> None:
  """Raises ``ConfigError`` listing every value no run can start with, a line each naming the
  field and the bad value (``locvit.run.checks.check_config``), before anything is built: for
  ``--mode=analyze`` and ``--print_config``. Training, evaluation and prediction check their
  config themselves, through the same function (``build_training``, ``build_evaluation``,
  ``predict_weights``).

  Fields the config lacks take their defaults (``configs/common.py:complete_config``)."""
  from locvit.run import checks  # the training stack: after the flags are read

  try:
    checks.check_config(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None


# ------------------------------------------------------------------------------------------------
# Running


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


def _answer_what_is_there() -> bool:
  """``--list_models``, ``--list_configs``, ``--print_config``: prints the answer; True if any."""
  if _LIST_MODELS.value is not None:
    from locvit.models import list_models

    names = list_models(_LIST_MODELS.value or None)  # bare: all
    if not names:  # was an empty line
      raise ConfigError(
        f"--list_models={_LIST_MODELS.value}: no registered model matches; `--list_models` alone "
        f"lists the {len(list_models())} names (globs: 'convit*', '*_patch4_32')"
      )
    print("\n".join(names), flush=True)
  if _LIST_CONFIGS.value:
    print(list_configs_text(), flush=True)
  if _PRINT_CONFIG.value:
    if _CONFIG.value is None:
      raise ConfigError("--print_config needs --config=NAME or FILE (or --workdir of a run)")
    config = the_config()
    check_config(config)
    print(config.to_json_best_effort(indent=2, sort_keys=True), flush=True)
  return _LIST_MODELS.value is not None or _LIST_CONFIGS.value or _PRINT_CONFIG.value


def main(argv):
  """Runs ``--mode`` (train, eval, predict or analyze) on ``--config`` and ``--workdir``."""
  del argv
  if not flags.FLAGS["verbosity"].present:  # quiet by default: `--verbosity=0` shows INFO logs
    logging.set_verbosity(logging.WARNING)
  if _answer_what_is_there():
    return
  if not _WORKDIR.value:
    raise ConfigError(
      "--workdir=DIR is required: the directory for the run's checkpoints and metrics"
    )
  config = the_config()
  if _MODE.value == "analyze":  # built by locvit.analysis, below locvit.run: checked here
    check_config(config)  # train, eval, predict: locvit.run checks it before building anything
  if _MODE.value in ("eval", "analyze"):
    _check_one_run(config, _WORKDIR.value, _MODE.value)
  cpu_malloc.reexec_with(_CPU_MALLOC.value)  # before any device or thread starts
  _init_distributed()
  from locvit import train
  from locvit.run import evaluation

  logging.info(
    "JAX %s: %d processes, %d devices", jax.__version__, jax.process_count(), jax.device_count()
  )
  active = [mode for mode in ("tcmalloc", "retain") if cpu_malloc.is_active(mode)]
  if active:
    logging.info("cpu_malloc: %s", active[0])
  if _MODE.value == "analyze":  # PNG figures of a run: nonlocality, gates, attention maps
    from locvit.analysis.analyze import analyze

    for path in analyze(config, _WORKDIR.value, step=_STEP.value):
      print(path, flush=True)
    return
  from_weights = bool(config.init_from.weights) and not saved_config.path(_WORKDIR.value).is_file()
  if _MODE.value == "predict":
    _predict(config, from_weights)
    return
  if _MODE.value == "eval":
    start = time.perf_counter()
    progress = functools.partial(print, flush=True)
    if from_weights:  # published weights, no training run: their model and preprocessing
      result = evaluation.evaluate_weights(config, progress)
      config = result.pop("config")
      paths.path(_WORKDIR.value).mkdir(parents=True, exist_ok=True)  # for eval.jsonl
    else:
      result = evaluation.evaluate_checkpoint(config, _WORKDIR.value, _STEP.value, progress)
    print(evaluation_line(result["step"], result, time.perf_counter() - start), flush=True)
    from locvit.configs.common import complete_config

    split = complete_config(config).data.eval_split
    append_evaluation(_WORKDIR.value, {**result, "eval_split": split})  # drawn by --mode=analyze
    return
  from locvit.analysis.hooks import training_hooks

  if not _TRACEBACK.value:
    _report_failed_saves_once()

  on_setup = None  # the note, on stdout once (the re-run process above does not get here)...
  if jax.default_backend() == "cpu" and not active and not cpu_malloc.find_tcmalloc():
    # ... once the run's setup has passed its checks: a setup error comes alone
    on_setup = functools.partial(print, CPU_MALLOC_HINT, flush=True)
  result = train.train_and_evaluate(config, _WORKDIR.value, **training_hooks(), on_setup=on_setup)
  if result.get("preempted"):
    sys.exit(0)


def _check_one_run(config: ml_collections.ConfigDict, workdir: str, mode: str) -> None:
  """``--mode=eval`` and ``analyze`` read one run: a side-by-side run's seeds are each in their
  own ``WORKDIR/seed<K>``."""
  from locvit.configs.common import complete_config
  from locvit.run import seeds

  config = complete_config(config)
  if config.num_seeds > 1:
    dirs = [seeds.seed_workdir(workdir, seed) for seed in seeds.seeds_of(config)]
    raise ConfigError(
      f"--mode={mode} reads one run, and {workdir} holds {config.num_seeds} seeds trained side "
      f"by side: use --workdir={dirs[0]} (or {', '.join(dirs[1:])})"
    )


def _predict(config: ml_collections.ConfigDict, from_weights: bool) -> None:
  """``--mode=predict``: ``WORKDIR/predictions.jsonl`` of ``--data``'s folder (its evaluation split,
  or its loose images) with ``config.init_from.weights``."""
  from locvit.run import predict

  if not from_weights:
    raise ConfigError(
      f"--mode=predict runs weights, and {_WORKDIR.value} holds a training run: write its "
      f"weights with python -m locvit.convert --workdir={_WORKDIR.value} --output=WEIGHTS, then "
      "give --config.init_from.weights=WEIGHTS and a new --workdir"
      if saved_config.path(_WORKDIR.value).is_file()
      else "--mode=predict needs --config.init_from.weights=FILE or a hub name"
    )
  if config.data.source != "image_folder" or not config.data.root:
    raise ConfigError("--mode=predict reads images from a folder: give --data=image_folder:DIR")
  predict.predict_weights(
    config,
    _WORKDIR.value,
    print_line=functools.partial(print, flush=True),
    warn=functools.partial(print, file=sys.stderr, flush=True),
  )


class TerminatedError(BaseException):
  """SIGTERM outside the training loop (start-up, evaluation, shutdown). Like KeyboardInterrupt,
  not an ``Exception``: no ``except Exception`` on its way out (an image decoder's, a checkpoint
  restore's) turns it into an error of its own."""


def _stop(signum, frame):
  preemption.raise_stop(TerminatedError, signum, frame)


def _interrupt(signum, frame):
  preemption.raise_stop(KeyboardInterrupt, signum, frame)


def _exit_stopped(cause: str, status: int) -> None:
  workdir = _WORKDIR.value or "the workdir"
  print(
    f"locvit: stopped by {cause}; the checkpoints committed in {workdir} are kept (the same "
    "command resumes from the newest)",
    file=sys.stderr,
    flush=True,
  )
  _exit(status)


def _main_with_clear_errors(argv):
  """Configuration and data errors are printed as one clear message, not a traceback; so is a
  stop by SIGTERM outside the loop (which saves and exits 0 itself) or by a second Ctrl-C."""
  signal.signal(signal.SIGTERM, _stop)  # the loop takes SIGTERM over; JAX's multi-host sync too
  signal.signal(signal.SIGINT, _interrupt)  # Python's KeyboardInterrupt, not during a compilation
  preemption.redeliver_swallowed_stops(
    {TerminatedError: signal.SIGTERM, KeyboardInterrupt: signal.SIGINT}
  )
  try:
    main(argv)
  except TerminatedError:
    _exit_stopped("SIGTERM", 128 + signal.SIGTERM)
  except KeyboardInterrupt:
    _exit_stopped("Ctrl-C", 128 + signal.SIGINT)
  except (
    ValueError,
    OSError,  # FileNotFoundError, a full disk, CheckpointSaveError
    AttributeError,
    KeyError,
    lock.WorkdirError,
  ) as e:
    if _TRACEBACK.value:
      raise
    # Grain's and JAX's notes say they filtered the traceback that --traceback shows.
    notes = [n for n in getattr(e, "__notes__", ()) if "removed its internal frames" not in n]
    if type(e) is OSError and e.filename and e.strerror:  # e.g. metrics.jsonl on a full disk
      _exit_with_error(f"{e.filename}: {e.strerror}; the checkpoints committed are kept", notes)
    _exit_with_error(str(e), notes)  # --traceback shows the stack


def _report_failed_saves_once() -> None:
  """After a failed checkpoint write, orbax logs each of its writer threads' tracebacks, and
  TensorStore's late callbacks raise on orbax's closed event loop (hundreds of lines). The
  failure reaches the loop as one ``CheckpointSaveError`` (a failed restore as a damaged step);
  this drops the echoes: orbax's error records, asyncio's unretrieved futures at exit."""
  orbax_dir = os.sep + "orbax" + os.sep
  logging.get_absl_logger().addFilter(
    lambda r: not (orbax_dir in r.pathname and r.levelno >= std_logging.ERROR)
  )
  std_logging.getLogger("asyncio").addFilter(
    lambda r: "exception was never retrieved" not in r.getMessage()
  )
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (
      isinstance(unraisable.exc_value, RuntimeError)
      and "loop is closed" in str(unraisable.exc_value)
    ):
      previous(unraisable)

  sys.unraisablehook = hook


def run() -> None:
  """Console entry point: parses flags and runs ``main`` with one-line config/data errors."""
  app.run(_main_with_clear_errors, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
