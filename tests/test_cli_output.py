"""What the command line prints: --list_models, --list_configs, --print_config (exact output,
nothing created), and progress rates that leave checkpoint, best-checkpoint and evaluation time
out."""

import json
import os
import subprocess
import sys

import pytest

from locvit import metrics
from locvit.configs import quickstart
from locvit.models import list_models
from locvit.run import config as run_config
from locvit.run import evaluation
from locvit.workdir import fingerprint
from tests.test_dataset_choice import image_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(*args, cwd=ROOT):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(
    [sys.executable, "-m", "locvit.main", *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.xfail(
  list_models("*_tiny_plus_patch4_32") == [],
  reason="list_models globs come with the registry change of issue 23 (refactor-models)",
  strict=True,
)
def test_list_models_takes_a_glob():
  rc, out, err = run_main("--list_models=*_tiny_plus_patch4_32")
  assert (rc, err) == (0, "")
  assert out == "convit_tiny_plus_patch4_32\ndeit_tiny_plus_patch4_32\n"
  rc, out, err = run_main("--list_models=convitt*")  # was an empty line and exit 0
  assert (rc, out) == (2, "")
  assert err == (
    "locvit: error: --list_models=convitt*: no registered model matches; `--list_models` alone "
    f"lists the {len(list_models())} names (globs: 'convit*', '*_patch4_32')\n"
  )


def test_list_models_alone_lists_every_model():
  rc, out, err = run_main("--list_models")
  assert (rc, err) == (0, "")
  assert out.splitlines() == list_models() and len(out.splitlines()) > 100


def test_list_configs_names_each_shipped_config_with_its_arguments_and_summary():
  rc, out, err = run_main("--list_configs")
  assert (rc, err) == (0, "")
  lines = out.splitlines()
  names, summaries = lines[::2], lines[1::2]
  assert [name.split(":")[0] for name in names] == run_config.shipped_config_names()
  gmm_table1 = "gmm_table1:{vit,swin,cait,pit,t2t},{cifar10,cifar100,svhn,tinyimagenet},{base,gmm}"
  assert gmm_table1 in names
  assert "convit_fig8:gpsa=INT,alpha=FLOAT" in names
  summary = "Quickstart: a small DeiT-style ViT on scikit-learn's 8x8 digits, offline, ~1 minute "
  summary += "on 2 cores."
  assert summaries[names.index("quickstart")] == f"  {summary}"
  assert all(s.startswith("  ") and s.endswith(".") for s in summaries), summaries  # sentences


def test_print_config_shows_the_resolved_config_and_creates_nothing(tmp_path):
  workdir = tmp_path / "run"
  flagfile = tmp_path / "flags"  # model fields the config does not set, read by their types
  flagfile.write_text("--config.model.overrides.qkv_bias=false\n--config.model.overrides.remat\n")
  rc, out, err = run_main(
    "--config=quickstart",
    f"--workdir={workdir}",
    "--config.total_steps=7",
    "--config.model.overrides.depth",
    "2",
    "--config.model.overrides.mlp_ratio=2",  # a float field: 2.0
    f"--flagfile={flagfile}",
    "--print_config",
  )
  assert (rc, err) == (0, "")
  expected = quickstart.get_config()
  expected.total_steps, expected.model.overrides.depth = 7, 2
  with expected.unlocked():
    expected.model.overrides.update(mlp_ratio=2.0, qkv_bias=False, remat=True)
  assert out == expected.to_json_best_effort(indent=2, sort_keys=True) + "\n"
  assert json.loads(out)["data"]["name"] == "digits"  # not "cifar10" beside source "digits"
  assert not workdir.exists()


def test_local_paths_given_by_overrides_are_saved_absolute(tmp_path):
  """Was 'previous' in the run's config.json: eval, analyze or a resume from another directory
  looked for the other run there (--data's folders were made absolute first)."""
  rc, out, err = run_main(
    "--config=quickstart",
    "--config.init_from.workdir=previous",
    "--config.distillation.teacher_workdir=teacher",
    "--config.data.data_dir=tf",
    "--config.data.root=gs://bucket/c10",
    "--print_config",
    cwd=tmp_path,
  )
  assert (rc, err) == (0, "")
  config = json.loads(out)
  assert config["init_from"]["workdir"] == str(tmp_path / "previous")
  assert config["distillation"]["teacher_workdir"] == str(tmp_path / "teacher")
  assert config["data"]["data_dir"] == str(tmp_path / "tf")
  assert config["data"]["root"] == "gs://bucket/c10"  # a bucket URL unchanged


def test_a_run_without_workdir_is_one_line():
  rc, out, err = run_main("--config=quickstart")
  assert (rc, out) == (2, "")
  assert err == (
    "locvit: error: --workdir=DIR is required: the directory for the run's checkpoints and "
    "metrics\n"
  )


def test_rates_count_checkpoint_time_and_leave_out_evaluations(monkeypatch, capsys):
  now = [0.0]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
  progress = metrics.Progress(total_steps=100, batch_size=64)
  now[0] = 10.0  # step 1, with compilation
  progress.update(1, 2.0)
  now[0] += 10 * 0.5  # steps 2-11 at 2 steps/s
  progress.checkpoint(3.0, waited=2.0)  # held 3 s, 2 s of it by the previous save
  now[0] += 3.0
  progress.evaluation(11, {"eval/top1": 0.5, "eval/top5": 0.9}, seconds=4.0)
  now[0] += 4.0
  progress.checkpoint(2.0)  # saving the best checkpoint
  now[0] += 2.0
  perf = progress.update(11, 1.5)
  assert perf["perf/steps_per_sec"] == pytest.approx(1.0)  # 10 steps in 5 + 3 + 2 s
  assert perf["perf/images_per_sec"] == pytest.approx(64.0)
  assert perf["perf/checkpoint_seconds"] == 5.0
  lines = capsys.readouterr().out.splitlines()
  assert lines[-1] == (
    "step 11/100  loss 1.5000  1.00 steps/s  64.0 img/s  ETA 0:01:29  "
    "(checkpoint 5.0 s, 2.0 s of it waiting for the previous save)"
  )
  assert lines[-2] == "Evaluation at step 11/100: top-1 0.5000  top-5 0.9000  (4.0 s)"
  now[0] += 10.0  # steps 12-21; a save that found the previous one committed waits for nothing
  progress.checkpoint(0.5)
  assert progress.update(21, 1.4)["perf/checkpoint_seconds"] == 0.5
  assert capsys.readouterr().out.endswith("  (checkpoint 0.5 s)\n")


def test_a_seeds_rate_leaves_out_the_other_seeds_host_work(monkeypatch):
  """Side by side, seed 1's line comes after seed 0's evaluation: the loop pauses seed 1's clock
  for it (``Progress.pause``), so both seeds report the step's own rate."""
  now = [0.0]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
  seed0, seed1 = (metrics.Progress(100, 64, name=f"seed{k}") for k in range(2))
  seed0.update(1, 2.0), seed1.update(1, 2.0)  # the compiling step
  now[0] += 10 * 0.5  # steps 2-11 at 2 steps/s
  seed0.update(11, 1.5)
  seed0.evaluation(11, {"eval/top1": 0.5, "eval/top5": 0.9}, seconds=8.0)
  now[0] += 8.0
  seed1.pause(8.0)  # what train_loop does for seed 0's host work
  assert seed1.update(11, 1.5)["perf/steps_per_sec"] == pytest.approx(2.0)


def test_long_evaluations_show_progress(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(metrics.time, "perf_counter", lambda: now[0])
  printed = []
  report = metrics.eval_progress(8, printed.append, every_seconds=10)
  for batch in range(1, 9):
    now[0] += 4.0
    report(batch)
  assert printed == ["evaluating: 3/8 batches (12 s)", "evaluating: 6/8 batches (24 s)"]


def test_resume_warning_shows_values_as_the_user_sets_them():
  saved = {"total_steps": -1, "optimizer": {"lr": 1e-3, "b1": 0.9}, "batch_size": 32}
  current = {"total_steps": 700, "optimizer": {"lr": 5e-4, "b1": 0.9}, "batch_size": 32}
  assert fingerprint.describe_changes(saved, current) == [
    "total_steps: unset (from num_epochs) -> 700",
    "optimizer.lr: 0.001 -> 0.0005",
  ]


def test_an_enum_typo_gets_its_close_match_before_anything_else(tmp_path):
  rc, out, err = run_main(
    "--config=quickstart", f"--workdir={tmp_path / 'run'}", "--config.data.source=imagefolder"
  )
  assert rc == 2
  assert err == (
    "locvit: error: data.source='imagefolder' is not one of ['digits', 'image_folder', 'tfds']; "
    "did you mean image_folder?\n"
  )
  # The config is refused before a run starts: no CPU TCMalloc note either (tests/test_cli.py
  # has it once in a run that trains).
  assert out == ""


def test_a_bad_config_under_eval_is_the_line_training_gives(tmp_path):
  """Training and evaluation check their config through the one ``checks.check_config``
  (``build_training``, ``build_evaluation``), on the command line and from a notebook alike:
  without it an evaluation's unknown kernel got past ``evaluate_checkpoint`` to the model."""
  bad = "--config.attention_implementation=flash"
  line = (
    "locvit: error: --config.attention_implementation='flash' is not one of [None, 'xla', "
    "'cudnn', 'cpu_kernels', 'einsum']\n"
  )
  for mode in ("train", "eval"):
    workdir = tmp_path / mode
    rc, out, err = run_main("--config=quickstart", f"--workdir={workdir}", f"--mode={mode}", bad)
    assert (rc, out, err) == (2, "", line), mode
    assert not workdir.exists()
  config = quickstart.get_config()
  config.attention_implementation = "flash"
  with pytest.raises(ValueError) as raised:
    evaluation.evaluate_checkpoint(config, str(tmp_path / "notebook"))
  assert f"locvit: error: {raised.value}\n" == line
  assert not (tmp_path / "notebook").exists()


@pytest.mark.parametrize(
  "args, line",
  [
    (
      ["--config.batch_size=5000"],
      "batch_size=5000 is larger than the 1437 training examples of digits ('train'): a step "
      "needs a whole batch; use --config.batch_size of at most 1437, or more data.",
    ),
    (  # was '... of DecodedCache(ImageFolderSource(root=..., split=..., n=6, classes=2))'
      ["--data={tmp_path}/folder", "--config.data.num_classes=2"],
      "batch_size=64 is larger than the 6 training examples of {tmp_path}/folder ('train'): a "
      "step needs a whole batch; use --config.batch_size of at most 6, or more data.",
    ),
    (
      ["--data={tmp_path}/missing"],
      "image folder root '{tmp_path}/missing' does not exist; expected "
      "ROOT/<split>/<class_name>/*.{{jpg,jpeg,png}} (e.g. ROOT/train/cat/0001.jpg) (data.root; "
      "--data=image_folder:DIR reads DIR instead)",
    ),
  ],
  ids=["batch_too_large", "batch_too_large_folder", "missing_data_folder"],
)
def test_a_setup_error_comes_alone_without_the_cpu_malloc_note(tmp_path, args, line):
  """The run's setup (data, batch, freeze patterns) refuses it before the CPU TCMalloc note,
  which a run that trains prints (tests/test_cli.py)."""
  two_classes = {"a": 3, "b": 3}  # 6 training images
  image_folder(tmp_path / "folder", {"train": two_classes, "test": two_classes})
  args = [arg.format(tmp_path=tmp_path) for arg in args]
  rc, out, err = run_main("--config=quickstart", f"--workdir={tmp_path / 'run'}", *args)
  assert (rc, out) == (2, "")
  assert err == f"locvit: error: {line.format(tmp_path=tmp_path)}\n"
  assert not (tmp_path / "run").exists()


def test_a_corrupt_training_image_is_one_error_line(tmp_path):
  """Was the error line, then 'locvit: also: ----... For simplicity, Grain has removed its
  internal frames from the traceback ...': grain's note about a traceback not shown."""
  image_folder(tmp_path, {"train": {"a": 4, "b": 4}, "test": {"a": 4, "b": 4}})
  bad = tmp_path / "train" / "b" / "9.jpg"
  bad.write_bytes(b"not a jpeg")
  rc, _, err = run_main(
    "--config=tests/configs/tiny.py",
    f"--workdir={tmp_path / 'run'}",
    f"--data={tmp_path}",
    "--config.batch_size=8",
    "--config.data.mean=(0.5, 0.5, 0.5)",
    "--config.data.std=(0.5, 0.5, 0.5)",
    "--cpu_malloc=default",
  )
  assert rc == 2
  assert err.splitlines()[-1:] == [
    f"locvit: error: cannot decode image file '{bad}' (UnidentifiedImageError: cannot identify "
    f"image file '{bad}'); --config.data.on_corrupt=skip reads the next readable file in its "
    "place"
  ]
  assert "also:" not in err
