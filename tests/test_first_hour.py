"""What a new user meets on the command line: one-line config errors, a locked and checked workdir,
consistent metrics after kills, the run's config kept in the workdir, configs shipped in the wheel.

The quickstart at its defaults (quiet stderr, progress and evaluation lines) is checked in
``tests/test_cli.py``.
"""

import glob
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile

import pytest

from locvit.metrics import _eval_numbers, read_evaluations, read_metrics
from locvit.models import list_models
from locvit.run import config as run_config
from locvit.workdir import saved_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = "--config=configs/quickstart.py"


def _env(**extra) -> dict[str, str]:
  env = dict(os.environ)
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.update(extra)
  return env


def _start(*args, prefix=(), cwd=ROOT, env=None):
  return subprocess.Popen(
    [*prefix, sys.executable, "-m", "locvit.main", *args],
    cwd=cwd,
    env=env or _env(),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _run(*args, timeout=300, **kwargs):
  proc = _start(*args, **kwargs)
  out, err = proc.communicate(timeout=timeout)
  return proc.returncode, out, err


# ------------------------------------------------------------------------------------------------
# Config mistakes: one line, exit 2, no traceback, and no workdir


FIELDS = (
  "analysis, async_checkpointing, attention_implementation, batch_size, bucket_timeout_seconds, "
  "checkpoint_every_steps, "
  "data, distillation, ema, eval_batch_size, eval_every_steps, freeze, grad_accum_steps, "
  "grad_clip_norm, init, init_from, "
  "keep_checkpoints, label_smoothing, log_every_steps, mesh, mixed_precision, mixup, model, "
  "nonfinite, num_epochs, num_seeds, optimizer, random_erasing, schedule, seed, "
  "steps_per_dispatch, "
  "total_steps, xla_options"
)


@pytest.mark.parametrize(
  "args, line",
  [
    (
      [QUICKSTART, "--config.bach_size=1"],
      "--config.bach_size=1: config has no field 'bach_size'; did you mean batch_size or "
      "eval_batch_size?",
    ),
    (
      [QUICKSTART, "--config.zzz=1"],
      f"--config.zzz=1: config has no field 'zzz'; fields: {FIELDS}",
    ),
    (
      [QUICKSTART, "--config.model.overrides.dept=3"],  # any model field may be given
      "model.overrides.dept: deit_tiny_patch2_32 has no field 'dept'; did you mean depth?",
    ),
    ([QUICKSTART, "--config.batch_size=0"], "--config.batch_size=0: must be a positive integer"),
    (
      [QUICKSTART, "--config.xla_options=gpu_tune"],
      "--config.xla_options='gpu_tune' is not one of ['auto', 'none', 'gpu_tuned', 'gpu_graphs']; "
      "did you mean gpu_tuned?",
    ),
    (
      [QUICKSTART, "--config.model.overrides.depth=0"],
      "--config.model.overrides.depth=0: must be > 0",
    ),
    (
      [QUICKSTART, "--config.model.overrides.mlp_ratio=2x"],  # was int()'s error and a traceback
      "model.overrides.mlp_ratio=2x: deit_tiny_patch2_32's mlp_ratio takes a float",
    ),
    (
      [QUICKSTART, "--config.model.overrides.num_classes=3"],  # was create_model's TypeError
      "model.overrides.num_classes: the class count is the data's; set it with "
      "--config.data.num_classes",
    ),
    (
      [QUICKSTART, "--noconfig.model.overrides.depth"],
      "--noconfig.model.overrides.depth: the prefix 'no' is for bool fields; depth is not one",
    ),
    (
      [QUICKSTART, "--config.batch_size=abc"],
      "flag --config.batch_size=abc: invalid literal for int() with base 10: 'abc'",
    ),
    (
      ["--config=configs/quickstrt.py"],
      "--config=configs/quickstrt.py: no such file, and no shipped config 'quickstrt'; did you "
      "mean quickstart?",
    ),
    (
      ["--config=gmm_table1:nonsense"],  # a shipped config by name, whose get_config refuses ARG
      "--config=gmm_table1:nonsense: unknown architecture 'nonsense' for gmm_table1.py; choices: "
      "vit, swin, cait, pit, t2t",
    ),
    (
      ["--config=quickstart:digits"],  # was: get_config() takes 0 positional arguments but 1 ...
      "--config=quickstart:digits: quickstart takes no argument (`--list_configs` shows each "
      "config's arguments)",
    ),
    (
      [],
      "no --config given and {workdir}/config.json does not exist (no run saved its config)",
    ),
    (
      ["--mode=analyse"],  # was: no config.json in the workdir, then absl's list of choices
      "--mode=analyse: choose train, eval, predict or analyze; did you mean analyze?",
    ),
    (
      [QUICKSTART, "--flagfile=/no/such/flags"],  # was a traceback from config_flags' import
      "Unable to open flagfile: [Errno 2] No such file or directory: '/no/such/flags'",
    ),
  ],
  ids=[
    "misspelt",
    "unknown",
    "nested",
    "zero_batch",
    "xla_options",
    "zero_depth",
    "override_type",
    "override_num_classes",
    "override_no_prefix",
    "bad_value",
    "no_file",
    "bad_arg",
    "no_arg",
    "none",
    "mode",
    "no_flagfile",
  ],
)
def test_config_mistake_is_one_line_and_creates_no_workdir(tmp_path, args, line):
  workdir = tmp_path / "run"
  rc, out, err = _run(*args, f"--workdir={workdir}", timeout=120)
  assert rc == 2, (out, err)
  assert err.splitlines() == ["locvit: error: " + line.format(workdir=workdir)]
  assert out == ""
  assert not workdir.exists()


def test_model_overrides_take_absls_forms_and_load_the_config_once(tmp_path):
  calls = tmp_path / "calls"
  failing = tmp_path / "failing.py"
  failing.write_text(
    f"def get_config():\n  open({str(calls)!r}, 'a').write('.')\n  raise ValueError('no')\n"
  )
  argv = ["locvit", f"--config={failing}", *[f"--config.model.overrides.depth={d}" for d in "123"]]
  # config_flags then reports the config's
  assert run_config.split_model_overrides(argv) == (argv, {})
  assert calls.read_text() == "."  # was once per override flag
  config = f"--config={ROOT}/configs/quickstart.py"
  argv = [
    "locvit",
    config,
    "--config.model.overrides.depth",  # the value in the next argument
    "2",
    "--config.model.overrides.remat",  # a bare bool: True
    "--noconfig.model.overrides.qkv_bias",
    "--",
    "--config.model.overrides.depth=3",  # after '--': not a flag
  ]
  added = {"depth": 2, "remat": True, "qkv_bias": False}
  assert run_config.split_model_overrides(argv) == (["locvit", config, *argv[-2:]], added)


def test_every_config_mistake_is_listed_at_once_before_anything_is_built(tmp_path):
  """One pass over the config: the run's numbers, the model name, the data, recipe and optimizer
  blocks, the kernels, the mesh layout and the init block, a line each, then exit 2 with no
  workdir (an unknown init or layout used to fail after the workdir was written)."""
  workdir = tmp_path / "run"
  rc, out, err = _run(
    QUICKSTART,
    f"--workdir={workdir}",
    "--config.batch_size=0",
    "--config.model.name=deit_tiny_patch2_3",
    "--config.data.augment_on=gpu",
    "--config.data.train_fraction=0",
    "--config.mixup.prob=2.0",
    "--config.optimizer.name=adamv",
    "--config.attention_implementation=cudnnn",
    "--config.mesh.layout=dpp",
    "--config.init.name=impuls",
    "--config.analysis.locality=True",
    "--config.analysis.locality_mode=faithfull",
    timeout=120,
  )
  assert rc == 2 and out == "", (out, err)
  assert err.splitlines() == [
    "locvit: error: 10 errors in the config:",
    "  --config.batch_size=0: must be a positive integer",
    "  unknown model 'deit_tiny_patch2_3'; did you mean deit_tiny_patch2_32 or "
    "deit_tiny_patch4_32 or deit_tiny_patch8_64? `python -m locvit.main --list_models='PATTERN'` "
    f"lists the {len(list_models())} names",
    "  data.augment_on='gpu' is not one of ['device', 'host']",
    "  data.train_fraction=0.0 must be a number in (0.0, 1.0]",
    "  mixup.prob=2.0 must be a probability in [0, 1]",
    "  optimizer.name='adamv' is not one of ['adamw', 'sgd']; did you mean adamw?",
    "  --config.attention_implementation='cudnnn' is not one of [None, 'xla', 'cudnn', "
    "'cpu_kernels', 'einsum']; did you mean cudnn?",
    "  mesh.layout='dpp' is not one of ['dp', 'fsdp', 'tp']; did you mean dp?",
    "  init.name='impuls' is not one of ['none', 'trunc_normal', 'kaiming_uniform', "
    "'xavier_normal', 'mimetic', 'impulse']; did you mean impulse?",
    "  analysis.locality_mode='faithfull' is not one of ['per_layer', 'faithful']; did you mean "
    "faithful?",
  ]
  assert not workdir.exists()


# ------------------------------------------------------------------------------------------------
# The workdir: locked while a run uses it, taken over after a kill; unwritable paths named at once


def _rows(workdir) -> int:
  path = workdir / "metrics.jsonl"
  return len(path.read_text().splitlines()) if path.exists() else 0


def _kill_after(proc, workdir, rows: int, timeout=240):
  deadline = time.time() + timeout
  while _rows(workdir) < rows and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  assert proc.poll() is None, proc.communicate()
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)


@pytest.mark.slow
def test_lock_refuses_a_second_run_and_kills_leave_consistent_metrics(tmp_path):
  """SIGKILL before the first checkpoint and again after one: every later run takes the workdir
  over, and metrics.jsonl ends with each step exactly once, in order."""
  workdir = tmp_path / "run"
  args = (
    QUICKSTART,
    f"--workdir={workdir}",
    "--config.total_steps=100",
    "--config.log_every_steps=1",
    "--config.eval_every_steps=40",
    "--config.checkpoint_every_steps=40",
  )
  first = _start(*args)
  deadline = time.time() + 240
  while _rows(workdir) < 3 and first.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  start = time.time()
  rc, out, err = _run(*args, timeout=120)  # a second run while the first one trains
  refused_after = time.time() - start
  assert rc == 2, (out, err)
  [line] = err.splitlines()
  assert line.startswith(
    f"locvit: error: workdir {workdir} is in use by pid {first.pid} on host {socket.gethostname()} "
    "(started "
  ), line
  assert line.endswith("); wait for that run to end or use another --workdir"), line
  assert refused_after < 60
  _kill_after(first, workdir, rows=10)  # before the checkpoint of step 40 (or just after it)
  with open(workdir / "metrics.jsonl", "a") as f:
    f.write('{"step": 11, "train/lo')  # as if killed in the middle of writing a row

  second = _start(*args)
  _kill_after(second, workdir, rows=55)  # after the checkpoint of step 40: rows 41.. are redone
  rc, out, err = _run(*args)
  assert rc == 0, (out, err)
  assert "in use" not in err
  rows = read_metrics(workdir)
  assert [r["step"] for r in rows] == list(range(1, 101))
  assert [r["step"] for r in rows if "eval/top1" in r] == [40, 80, 100]


def _as_unprivileged_user() -> list[str]:
  """A command prefix under which directory permissions apply (root ignores them)."""
  if os.geteuid() != 0:
    return []
  if shutil.which("unshare") is None or subprocess.run(["unshare", "--user", "true"]).returncode:
    pytest.skip("running as root without user namespaces: permissions cannot be tested")
  return ["unshare", "--user"]


@pytest.mark.parametrize("unwritable", ["", "checkpoints"])
def test_unwritable_workdir_fails_at_start_naming_the_path(tmp_path, unwritable):
  workdir = tmp_path / "run"
  path = workdir / unwritable
  path.mkdir(parents=True)
  path.chmod(0o555)
  try:
    start = time.time()
    rc, out, err = _run(QUICKSTART, f"--workdir={workdir}", prefix=_as_unprivileged_user())
    took = time.time() - start
  finally:
    path.chmod(0o755)
  assert rc == 2, (out, err)
  path = str(path).rstrip("/")
  assert err.splitlines() == [f"locvit: error: cannot write to {path}: Permission denied"]
  assert took < 60
  assert not (workdir / "metrics.jsonl").exists()


def test_a_workdir_that_is_a_file_is_named_as_one(tmp_path):
  workdir = tmp_path / "run"
  workdir.write_text("notes")
  rc, out, err = _run(QUICKSTART, f"--workdir={workdir}", timeout=120)
  assert (rc, out) == (2, ""), err  # was: "cannot write to W: File exists"
  assert err.splitlines() == [
    f"locvit: error: cannot write to {workdir}: it is a file, not a directory"
  ]
  assert os.listdir(tmp_path) == ["run"] and workdir.read_text() == "notes"


# ------------------------------------------------------------------------------------------------
# The run's config is kept in the workdir and used by --mode=eval with only --workdir


def test_config_may_name_a_runs_workdir_or_its_config_json(tmp_path):
  (tmp_path / "config.json").write_text("{}")  # resolving reads only the file's name
  saved = run_config.resolve_config(str(tmp_path / "config.json"))
  assert saved == f"{os.path.abspath(saved_config.__file__)}:{tmp_path / 'config.json'}"
  assert saved == saved_config.config_file_argument(tmp_path / "config.json")
  assert run_config.resolve_config(str(tmp_path)) == saved  # was: 'PosixGPath' has no 'endswith'


def test_saved_config_round_trips_every_shipped_config(tmp_path):
  """Types JSON drops (tuples, typed None placeholders) come back, so overrides still parse."""
  for name in run_config.shipped_config_names():
    config = importlib.import_module(f"locvit.configs.{name}").get_config()
    saved_config.write(str(tmp_path), config, ["python", "-m", "locvit.main", f"--config={name}"])
    restored = saved_config.read(saved_config.path(str(tmp_path)))
    assert restored.to_dict() == config.to_dict(), name
    assert restored.data.get_type("root") is str and restored.mesh.shape == config.mesh.shape


def test_saved_config_keeps_the_fields_that_refer_to_the_seed(tmp_path):
  """structinit's ``init.seed`` refers to ``seed``: read back, a changed seed moves it as in the
  original config, and setting it leaves the seed. An older config.json (no ``references``) reads
  as it always did: the value alone."""
  config = importlib.import_module("locvit.configs.structinit_cifar10_small").get_config()
  saved_config.write(str(tmp_path), config, ["python", "-m", "locvit.main"])
  assert json.loads(saved_config.path(str(tmp_path)).read_text())["references"] == {
    "init.seed": "seed"
  }
  loaded = lambda *overrides: run_config.command_line_config(
    ["locvit", f"--config={tmp_path}", *overrides]
  )
  for overrides, seeds in [
    ((), (0, 0)),
    (("--config.seed=3",), (3, 3)),
    (("--config.init.seed=5",), (0, 5)),
  ]:
    original = run_config.command_line_config(
      ["locvit", "--config=structinit_cifar10_small", *overrides]
    )
    assert (original.seed, original.init.seed) == seeds
    assert loaded(*overrides).to_dict() == original.to_dict(), overrides

  record = json.loads(saved_config.path(str(tmp_path)).read_text())
  del record["references"]
  saved_config.path(str(tmp_path)).write_text(json.dumps(record))
  older = loaded("--config.seed=3")
  assert (older.seed, older.init.seed) == (3, 0)


@pytest.mark.slow
def test_eval_with_only_workdir_uses_the_runs_config_and_overrides(tmp_path):
  workdir = tmp_path / "run"
  override = "--config.model.overrides.depth=2"  # the quickstart has depth 4
  rc, out, err = _run(
    QUICKSTART,
    f"--workdir={workdir}",
    override,
    "--config.model.overrides.qkv_bias=false",  # a field the config does not set
    "--config.total_steps=30",
    "--config.eval_every_steps=0",
  )
  assert rc == 0, (out, err)
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["config"]["model"]["overrides"]["depth"] == 2
  assert saved["config"]["model"]["overrides"]["qkv_bias"] is False  # was the string 'false'
  assert saved["command"].endswith(
    f"--workdir={workdir} {override} --config.model.overrides.qkv_bias=false "
    "--config.total_steps=30 --config.eval_every_steps=0"
  )

  metrics = (workdir / "metrics.jsonl").read_text()
  rc, out, err = _run(f"--workdir={workdir}", "--mode=eval")
  assert rc == 0, (out, err)
  # The line training evaluations print (the same numbers as the run's final evaluation).
  final = [r for r in read_metrics(workdir) if "eval/top1" in r][-1]
  examples = final["eval/num_examples"]
  expected = f"Evaluation at step 30: {_eval_numbers(final)}  ({examples} examples, "
  assert re.fullmatch(re.escape(expected) + r"\d+\.\d s\)", out.splitlines()[-1]), out
  # Its result goes to DIR/eval.jsonl, for --mode=analyze; metrics.jsonl is the training's alone.
  keys = ("eval/top1", "eval/top5", "eval/loss", "eval/num_examples")
  assert read_evaluations(workdir) == [
    {"step": 30, **{k: final[k] for k in keys}, "eval_split": "test"}
  ]
  assert (workdir / "metrics.jsonl").read_text() == metrics
  # An override given with --workdir replaces the saved value: a 4-block model does not fit.
  rc, out, err = _run(f"--workdir={workdir}", "--mode=eval", "--config.model.overrides.depth=4")
  assert rc == 2 and "incompatible config" in err and "'depth': 2" in err, err
  # A damaged config.json is named in one line, with the cause.
  (workdir / "config.json").write_text('{"command": "python -m locvit.main", "config": {')
  rc, out, err = _run(f"--workdir={workdir}", "--mode=eval")
  assert rc == 2 and len(err.splitlines()) == 1, err
  assert err.startswith(f"locvit: error: {workdir}/config.json is not a readable run config ("), err
  assert len(read_evaluations(workdir)) == 1  # refused evaluations record nothing


# ------------------------------------------------------------------------------------------------
# Packaging: the wheel holds only `locvit`, with the configs inside it, runnable by name


def test_wheel_has_only_locvit_and_runs_shipped_configs_by_name(tmp_path):
  build = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
  subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "--no-deps", *build, "-q", "-w", str(tmp_path), ROOT],
    check=True,
    timeout=300,
  )
  [wheel] = glob.glob(str(tmp_path / "locvit-*.whl"))
  names = zipfile.ZipFile(wheel).namelist()
  top = {n.split("/")[0] for n in names}
  assert {t for t in top if not t.endswith(".dist-info")} == {"locvit"} and len(top) == 2, top
  shipped = run_config.shipped_config_names()
  assert {f"locvit/configs/{name}.py" for name in shipped} <= set(names)

  target = tmp_path / "site"
  subprocess.run(
    [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), wheel],
    check=True,
    timeout=300,
  )
  assert sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info")) == ["locvit"]
  elsewhere = tmp_path / "elsewhere"  # no checkout on the path: only the installed wheel
  elsewhere.mkdir()
  env = _env(PYTHONPATH=str(target))
  check = (
    "import importlib.util, locvit.configs\n"
    "from locvit.run import config as run_config\n"
    "from locvit.configs import common\n"
    "spec = importlib.util.find_spec('configs')\n"  # None, or another install's (not the wheel's)
    f"assert spec is None or not spec.origin.startswith({str(target)!r})\n"
    f"assert locvit.configs.__path__[0].startswith({str(target)!r})\n"
    "for name in run_config.shipped_config_names():\n"
    "  path = run_config.resolve_config(name)\n"
    "  spec = importlib.util.spec_from_file_location('c', path)\n"
    "  module = importlib.util.module_from_spec(spec)\n"
    "  spec.loader.exec_module(module)\n"
    "  module.get_config()\n"
    "print(len(run_config.shipped_config_names()))\n"
  )
  done = subprocess.run(
    [sys.executable, "-c", check], cwd=elsewhere, env=env, capture_output=True, text=True
  )
  assert done.returncode == 0, done.stderr
  assert int(done.stdout) == len(shipped)
  # The README's command, from anywhere: the name (or configs/NAME.py) finds the shipped file.
  rc, _, err = _run(
    "--config=configs/convit_s.py", "--workdir=w", "--config.batch_size=0", cwd=elsewhere, env=env
  )
  assert (rc, err) == (2, "locvit: error: --config.batch_size=0: must be a positive integer\n")
  assert not (elsewhere / "w").exists()
