"""``python -m locvit.reproduce``: the smoke plan end to end, the budget split, skip and resume,
the report's statistics and the missing-data message."""

import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest
from scipy import stats

from locvit import metrics, optim
from locvit import reproduce as rp
from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import KIT_SEED_KERNELS
from locvit.reproduce import report
from locvit.workdir import provenance
from tests.train_utils import sigterm_after_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(**extra):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", **extra)  # one device: CI's command
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  return env


def test_smoke_plan_end_to_end(tmp_path):
  workdir = str(tmp_path / "smoke")
  done = subprocess.run(
    [sys.executable, "-m", "locvit.reproduce", "smoke", "--minutes=3", f"--workdir={workdir}"],
    cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-3000:]
  out = done.stdout
  assert "depth1" in out and "Estimated training time" in out and "estimated end" in out
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  steps = results["rows"]["depth1"]["steps"]
  assert steps == rp.PLANS["smoke"]["max_steps"]
  for row in ("depth1", "depth2"):
    assert results["rows"][row]["seeds_finished"] == [0, 1]
    assert results["rows"][row]["steps"] == steps
    assert 0.1 < results["rows"][row]["top1_mean"] <= 1.0
    for seed in (0, 1):
      assert rp.is_finished(os.path.join(workdir, row, f"seed{seed}"), steps)
  (comparison,) = results["comparisons"]
  assert comparison["seeds"] == [0, 1] and comparison["df"] == 1
  assert results["machine"]["jax_backend"] == "cpu"
  text = pathlib.Path(workdir, "results.md").read_text()
  assert "| depth2 - depth1 |" in text
  assert "Step cap: every run stopped at the plan's cap of 60 steps (its max_steps)" in text
  assert "Data: scikit-learn's 8x8 digits." in text


# ------------------------------------------------------------------------------------------------
# The budget


def test_budget_gives_every_row_the_same_steps_and_fits():
  costs = {
    "fast": rp.RowCost(steps_per_sec=4.0, overhead_sec=20.0, steps_per_epoch=39, batch_size=128),
    "slow": rp.RowCost(steps_per_sec=1.0, overhead_sec=30.0, steps_per_epoch=39, batch_size=128),
  }
  seconds, seeds = 3600.0, 3
  steps = rp.split_budget(costs, seeds, seconds)
  total = lambda s: seeds * sum(rp.run_seconds(c, s) for c in costs.values())
  assert total(steps) <= seconds < total(steps + 1)
  with pytest.raises(rp.ReproduceError, match=r"needs at least 3.6 minutes \(--minutes; 1.0 of "):
    rp.split_budget(costs, seeds, 60.0, spent=60.0)


@pytest.mark.parametrize("plan, row", [("structinit", "impulse3"), ("smoke", "depth2")])
def test_schedule_fits_the_budgeted_steps(plan, row, monkeypatch):
  monkeypatch.setenv("CIFAR10_ROOT", "/nonexistent")
  base = rp.row_config(rp.PLANS[plan]["rows"][row])
  fraction = rp.warmup_fraction(base)
  config = rp.budgeted_config(base, 137, seed=2)
  assert config.total_steps == 137 and config.seed == 2
  assert config.schedule.warmup_steps == round(fraction * 137) > 0
  schedule = optim.make_schedule(config, 137, 39)
  peak = optim.peak_learning_rate(config)
  assert math.isclose(schedule(config.schedule.warmup_steps), peak, rel_tol=1e-5)
  assert math.isclose(schedule(137), config.schedule.min_lr, rel_tol=1e-4)
  assert schedule(100) > schedule(120) > schedule(137)
  if plan == "structinit":  # the config's own reference follows the run's seed
    assert config.init.seed == 2


def test_seeds_alternate_between_rows():
  order = rp.plan_runs(rp.PLANS["structinit"], 2)
  assert order == [
    (0, "trunc_normal"), (0, "impulse3"), (0, "mimetic"),
    (1, "trunc_normal"), (1, "impulse3"), (1, "mimetic"),
  ]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Skip and resume


def _write_plan(workdir, steps, seeds=2):
  os.makedirs(workdir, exist_ok=True)
  cost = {"steps_per_sec": 20.0, "overhead_sec": 5.0, "steps_per_epoch": 22, "batch_size": 64}
  plan = {
    "plan": "smoke", "seeds": seeds, "minutes": 3, "steps": steps, "started": time.time(),
    "load_at_probe": [1.0, 1.0, 1.0], "rows": {"depth1": cost, "depth2": cost},
  }  # fmt: skip
  with open(os.path.join(workdir, "plan.json"), "w") as f:
    json.dump(plan, f)


def test_ctrl_c_resumes_the_interrupted_run_and_skips_finished_ones(tmp_path, capsys):
  workdir, steps = str(tmp_path / "smoke"), 20
  _write_plan(workdir, steps, seeds=1)
  first = os.path.join(workdir, "depth1", "seed0")
  with sigterm_after_step(6, signal.SIGINT):  # Ctrl-C during the first run
    assert rp.main(["smoke", f"--workdir={workdir}"]) == 130
  out = capsys.readouterr().out
  assert "Stopped. Everything is saved: run the same command again to resume" in out
  assert not rp.is_finished(first, steps)
  assert "7" in os.listdir(os.path.join(first, "checkpoints"))  # saved at the end of the step
  assert not os.path.exists(os.path.join(workdir, "depth2"))

  assert rp.main(["smoke", f"--workdir={workdir}"]) == 0
  out = capsys.readouterr().out
  assert "0 of 2 runs finished" in out
  logged = [r["step"] for r in metrics.read_metrics(first) if "train/loss" in r]
  assert logged == sorted(set(logged)) and logged[-1] == steps  # each step once, to the end
  assert 8 in logged  # the resumed run logs its first step, after the checkpoint at 7
  finished = _metrics_files(workdir)
  assert all(rp.is_finished(run, steps) for run in finished)

  assert rp.main(["smoke", f"--workdir={workdir}"]) == 0  # everything finished: nothing trains
  out = capsys.readouterr().out
  assert "2 of 2 runs finished" in out and "==" not in out
  assert finished == _metrics_files(workdir)


def _metrics_files(workdir):
  runs = [pathlib.Path(workdir, row, "seed0") for row in ("depth1", "depth2")]
  return {str(run): (run / "metrics.jsonl").read_text() for run in runs}


def test_a_saved_plan_is_not_replaced(tmp_path):
  workdir = str(tmp_path / "w")
  _write_plan(workdir, 30)
  with pytest.raises(rp.ReproduceError, match="planned with --seeds=2; use that or a new"):
    rp.reproduce("smoke", workdir, 3, seeds=3)
  with pytest.raises(rp.ReproduceError, match="holds plan 'smoke', not 'gmm'"):
    rp.load_or_make_plan("gmm", rp.PLANS["gmm"], {}, workdir, None, 3, time.time())


def test_a_report_of_no_plan_prints_the_command_that_makes_one(tmp_path, capsys):
  """Was 'run `python -m locvit.reproduce smoke` first', which stops: --workdir is required."""
  assert rp.main(["smoke", f"--workdir={tmp_path}", "--report"]) == 2
  assert capsys.readouterr().err == (
    f"locvit.reproduce: error: {tmp_path} holds no plan.json: run `python -m locvit.reproduce "
    f"smoke --workdir={tmp_path}` first\n"
  )


# ------------------------------------------------------------------------------------------------
# The report


def _write_finals(workdir, steps, top1):
  for row, values in top1.items():
    for seed, value in enumerate(values):
      writer = metrics.MetricWriter(os.path.join(workdir, row, f"seed{seed}"))
      writer.write(steps, {"eval/top1": value, "eval/top5": 0.9 + value / 10})
      writer.close()


def test_report_statistics_match_a_hand_computation(tmp_path):
  workdir, steps = str(tmp_path / "r"), 30
  _write_plan(workdir, steps, seeds=3)
  top1 = {"depth1": [0.61, 0.58, 0.64], "depth2": [0.66, 0.60, 0.71]}
  _write_finals(workdir, steps, top1)
  result = report.write_report("smoke", workdir)

  row = result["rows"]["depth2"]
  assert row["top1_mean"] == pytest.approx(np.mean(top1["depth2"]))
  assert row["top1_sd"] == pytest.approx(np.std(top1["depth2"], ddof=1))
  assert row["epochs"] == pytest.approx(30 / 22)
  assert row["paper_budget_fraction"] == pytest.approx(30 * 64 / (30 * 1437))
  (c,) = result["comparisons"]
  expected = stats.ttest_rel(top1["depth2"], top1["depth1"])
  diffs = np.subtract(top1["depth2"], top1["depth1"])
  assert c["top1_differences"] == pytest.approx(diffs.tolist())
  assert c["mean"] == pytest.approx(diffs.mean()) and c["df"] == 2
  assert c["t"] == pytest.approx(expected.statistic)
  assert c["p"] == pytest.approx(expected.pvalue)
  assert c["verdict"] == f"within noise (p = {expected.pvalue:.2f} >= 0.05)"
  text = pathlib.Path(workdir, "results.md").read_text()
  assert (
    "| depth2 | - | 65.67 +- 5.51 | - | 3 | 96.57 +- 0.55 | 1.364 | 30 | 4.45% | - | - |" in text
  )
  assert f"| depth2 - depth1 | +5.00, +2.00, +7.00 | +4.67 | {expected.statistic:.2f} (2) |" in text


@pytest.mark.parametrize("paper", [(0.60, 0.70), (0.70, 0.60)])
def test_report_puts_the_paper_beside_ours(tmp_path, monkeypatch, paper):
  for row, top1 in zip(("depth1", "depth2"), paper):
    monkeypatch.setitem(rp.PLANS["smoke"]["rows"][row], "paper_top1", top1)
  workdir, steps = str(tmp_path / "r"), 30
  _write_plan(workdir, steps, seeds=3)
  _write_finals(workdir, steps, {"depth1": [0.61, 0.58, 0.64], "depth2": [0.66, 0.60, 0.71]})
  text = (
    pathlib.Path(workdir, "results.md").read_text() if report.write_report("smoke", workdir) else ""
  )
  first, second = (f"{100 * p:.2f}" for p in paper)
  assert f"| depth1 | {first} | 61.00 +- 3.00 | {61 - 100 * paper[0]:+.2f} | 3 |" in text
  assert f"| depth2 | {second} | 65.67 +- 5.51 | {65.67 - 100 * paper[1]:+.2f} | 3 |" in text
  if paper[1] > paper[0]:
    assert (
      "Ordering the paper claims: depth2 > depth1. Ours: depth2 > depth1. The paper's "
      "ordering held." in text
    )
  else:
    assert (
      "Ordering the paper claims: depth1 > depth2. Ours: depth2 > depth1. The paper's "
      "ordering did not hold (depth1 not above depth2)." in text
    )
  # Ours are within noise (paired t, p = 0.08): the paper's 10-point gap is within our spread.
  sd = np.std([5.0, 2.0, 7.0], ddof=1)
  below = 10 * math.sqrt(3) / stats.t.ppf(0.975, 2)
  assert (
    f"Seed spread: depth2 - depth1: the paper's gap of {100 * (paper[1] - paper[0]):+.2f} points "
    f"is within our seed spread (sd of the per-seed differences {sd:.2f} points over 3 seeds; 3 "
    f"seeds separate it only below {below:.2f})." in text
  )
  assert (
    "Step cap: the plan caps runs at 60 steps (its max_steps); the budget gave these runs "
    "fewer (30)." in text
  )
  assert "Data: " not in text  # a plan saved before it was recorded names none
  assert "| img/s | minutes per run |" in text and "locvit commit not recorded" in text


def test_a_protocol_report_names_its_fraction_and_leaves_out_rows_not_run(tmp_path, monkeypatch):
  monkeypatch.setenv("CIFAR10_ROOT", str(_tiny_cifar(tmp_path / "cifar")))  # a JPEG copy
  workdir, steps = str(tmp_path / "g"), 16614
  os.makedirs(workdir)
  cost = {"steps_per_sec": 136.2, "overhead_sec": 27.5, "steps_per_epoch": 390, "batch_size": 128}
  plan = {
    "plan": "gmm_table1_cifar10", "protocol": True, "fraction": 0.142, "seeds": 1,
    "row_names": ["vit", "gmm"], "minutes": 5, "started": time.time(),
    "load_at_probe": [1.0, 1.0, 1.0], "locvit_commit": "abc1234", "estimated_minutes": 5.0,
    "data": rp.protocol.describe_data(rp.row_config(rp.PLANS["gmm_table1_cifar10"]["rows"]["vit"])),
    "rows": {row: {**cost, "steps": steps} for row in ("vit", "gmm")},
  }  # fmt: skip
  with open(os.path.join(workdir, "plan.json"), "w") as f:
    json.dump(plan, f)
  _write_finals(workdir, steps, {"vit": [0.8712], "gmm": [0.8650]})
  result = report.write_report("gmm_table1_cifar10", workdir)
  text = pathlib.Path(workdir, "results.md").read_text()
  assert text.startswith("# Li & Zhang, CIFAR-10: ViT vs GMM-ViT") and (
    "batch 128, float32, at 0.142 of the paper's protocol\n" in text
  )
  assert (  # Table 3's depth-9 numbers
    "| vit | 94.17 | 87.12 | 87.12 | -7.05 | 1 |" in text
    and "| gmm | 94.87 | 86.50 | 86.50 | -8.37 | 1 |" in text
  )
  assert "gmm_impulse3" not in text and [c["treatment"] for c in result["comparisons"]] == ["gmm"]
  assert (
    "Ordering the paper claims: gmm > vit. Ours: vit > gmm. The paper's ordering did not hold "
    "(gmm not above vit)." in text
  )
  assert "Data: the CIFAR-10 JPEG copy" in text and "the JPEG copy costs some accuracy." in text
  assert "locvit commit abc1234" in text and "Step cap" not in text


def test_step_ranges_follow_each_start_and_attribute_steps_before_the_record():
  start = lambda commit, first: {"commit": commit, "first_step": first}
  ranges = lambda entries: provenance.step_ranges(entries, 200, "P", "commit")
  seg = lambda first, last, commit, recorded=True: (first, last, commit, recorded)
  # A resume from an older checkpoint (step 100) trains 101-120 again: those steps are C's.
  starts = [start("A", 1), start("B", 121), start("B", 121), start("C", 101)]
  assert ranges(starts) == [seg(1, 100, "A"), seg(101, 200, "C")]
  # A run begun before runs kept the record: its first steps are the plan's commit, marked so.
  assert ranges([start("B", 51)]) == [seg(1, 50, "P", recorded=False), seg(51, 200, "B")]
  assert ranges([start("A", 1), start("A", 51)]) == [seg(1, 200, "A")]


def test_a_runs_sessions_record_their_checkpoints_and_wall_time(tmp_path):
  run = str(tmp_path / "run")
  os.makedirs(run)
  first = provenance.record_start(run, 1, started=time.monotonic() - 60)  # built a minute ago
  first.checkpointed(10)
  first.end()  # stopped (finished, SIGTERM, Ctrl-C or an error): its whole time is recorded
  provenance.record_start(run, 11, started=time.monotonic() - 30).checkpointed(20)  # then SIGKILL
  entries = provenance.read(run)
  assert [(e["first_step"], e["last_step"], e.get("ended")) for e in entries] == [
    (1, 10, True), (11, 20, None)
  ]  # fmt: skip
  assert [e["seconds"] for e in entries] == [pytest.approx(60, abs=5), pytest.approx(30, abs=5)]
  # The killed session's time after its last checkpoint is lost: the sum is a lower bound.
  assert provenance.wall_time(entries) == (entries[0]["seconds"] + entries[1]["seconds"], False)
  assert provenance.wall_time(entries[:1]) == (entries[0]["seconds"], True)
  assert provenance.wall_time([{**entries[0], "first_step": 5}])[1] is False  # steps before it


def test_the_report_adds_up_the_sessions_time_and_rates_per_device(tmp_path):
  workdir, steps = str(tmp_path / "r"), 30
  _write_plan(workdir, steps)
  session = lambda kind, first, seconds, ended=True: {
    "commit": "A", "first_step": first, "device_kind": kind, "seconds": seconds, "ended": ended
  }  # fmt: skip
  sessions = {
    "depth1/seed0": [session("NVIDIA H200", 1, 60.0), session("cpu", 11, 30.0)],
    "depth1/seed1": [session("cpu", 1, 45.0, ended=False)],  # killed after its last checkpoint
    "depth2/seed0": [session("cpu", 1, 54.0)],
    "depth2/seed1": [session("cpu", 1, 66.0)],
  }
  for run, entries in sessions.items():
    pathlib.Path(workdir, run).mkdir(parents=True)
    pathlib.Path(workdir, run, "commits.json").write_text(json.dumps(entries))
    writer = metrics.MetricWriter(os.path.join(workdir, run))
    for step in (1, 5, 10, 11, 20, 30):
      kind = [e["device_kind"] for e in entries if e["first_step"] <= step][-1]
      rate = 8000 + 40 * step if kind == "NVIDIA H200" else 2000 + 10 * step
      if step in [e["first_step"] for e in entries]:
        rate = 50  # a session's first step includes the compilation: left out
      final = {"eval/top1": 0.6, "eval/top5": 0.9} if step == steps else {}
      writer.write(step, {"perf/images_per_sec": rate, **final})
    writer.close()
  result = report.write_report("smoke", workdir)
  depth1, depth2 = result["rows"]["depth1"], result["rows"]["depth2"]
  assert depth1["wall_minutes_per_run"] == pytest.approx((90 + 45) / 2 / 60)
  assert not depth1["wall_exact"] and depth2["wall_exact"] and not result["training_wall_exact"]
  assert result["training_wall_minutes"] == pytest.approx((90 + 45 + 54 + 66) / 60)
  assert result["devices_trained"] == ["NVIDIA H200", "cpu"]
  assert depth2["images_per_sec"] == 2110  # one device kind: the median, as before
  text = pathlib.Path(workdir, "results.md").read_text()
  assert (
    "| 8,300 on NVIDIA H200 (seed 0 steps 1-10), 2,200 on cpu (seed 0 steps 11-30; seed 1 steps "
    "1-30) | >= 1.1 |" in text
  )
  assert "| 2,110 | 1.0 |" in text
  assert "Devices: steps trained on NVIDIA H200 and cpu (img/s per device kind in the table" in text
  assert (
    "4 of 4 runs finished in at least 4.2 minutes of training wall time (a lower bound: a session "
    "stopped without recording its time, e.g. killed outright)" in text
  )


def test_the_report_names_the_commits_per_row_and_per_seed_where_they_differ(tmp_path):
  workdir, steps = str(tmp_path / "r"), 30
  _write_plan(workdir, steps)
  _write_finals(workdir, steps, {"depth1": [0.61, 0.58], "depth2": [0.66, 0.60]})
  started = lambda commit, first: {"commit": commit, "first_step": first, "device_kind": "cpu"}
  continued = [started("A", 1), started("B", 11)]
  for run, starts in [("depth1/seed0", continued), ("depth1/seed1", continued[:1]),
                      ("depth2/seed0", continued), ("depth2/seed1", continued)]:  # fmt: skip
    pathlib.Path(workdir, run, "commits.json").write_text(json.dumps(starts))
  result = report.write_report("smoke", workdir)
  assert result["rows"]["depth1"]["trained_by"][1] == [
    {"first": 1, "last": 30, "commit": "A", "recorded": True}
  ]
  assert (
    "locvit commits: depth1 seed 0: steps 1-10 at commit A, 11-30 at commit B; depth1 seed 1: "
    "commit A; depth2: steps 1-10 at commit A, 11-30 at commit B (report: "
  ) in pathlib.Path(workdir, "results.md").read_text()


def test_a_consistent_difference_is_significant():
  test = report.paired_t([0.031, 0.029, 0.030, 0.032])
  assert test["p"] < 0.001 and report.verdict(test).startswith("significant at p < 0.05")
  assert report.verdict(report.paired_t([0.03])).startswith("not testable")


# ------------------------------------------------------------------------------------------------
# Data


def test_missing_cifar_fails_in_seconds_with_instructions(tmp_path, monkeypatch, capsys):
  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  workdir = str(tmp_path / "w")
  start = time.perf_counter()
  assert rp.main(["structinit", "--minutes=60", f"--workdir={workdir}"]) == 2
  assert capsys.readouterr().err == (
    "locvit.reproduce: error: row 'trunc_normal' reads CIFAR-10 from an image folder but "
    "$CIFAR10_ROOT is not set. Prepare it as described in docs/data_preparation.md and `export "
    "CIFAR10_ROOT=DIR` (DIR/train/<class>/*.png, DIR/test/<class>/*.png) or pass "
    "--data=image_folder:DIR, or pass --data=tfds to read the TFDS copy.\n"
  )
  monkeypatch.setenv("CIFAR10_ROOT", str(tmp_path))
  (tmp_path / "train").mkdir()
  assert rp.main(["gmm", "--minutes=60", f"--workdir={workdir}"]) == 2
  assert capsys.readouterr().err == (
    f"locvit.reproduce: error: row 'vit': no test folder in {tmp_path}. Prepare "
    "CIFAR-10 as described in docs/data_preparation.md (DIR/train/<class>/*.png, "
    "DIR/test/<class>/*.png).\n"
  )
  config = rp.row_config({"config": "gmm_cifar10_small", "overrides": {}})
  config.data.root, config.data.eval_split = str(tmp_path), "test[:500]"  # a slice of test/
  (tmp_path / "test").mkdir()
  rp.check_data(config, "vit")
  assert rp.main(["convit", "--workdir", workdir]) == 2
  plans = "valid plans: convit_sample_efficiency, cordonnier, cordonnier_table1, gmm, "
  plans += "gmm_table1_cifar10, smoke, smoke_protocol, structinit, structinit_table2_cifar10\n"
  assert capsys.readouterr().err == "locvit.reproduce: error: unknown plan 'convit'; " + plans
  assert rp.main(["structinit_tabl2_cifar10", "--dry_run"]) == 2  # a typo: the close name
  assert capsys.readouterr().err == (
    "locvit.reproduce: error: unknown plan 'structinit_tabl2_cifar10'; did you mean "
    "structinit_table2_cifar10? " + plans
  )
  with pytest.raises(SystemExit) as usage:  # argparse's mistakes: one line too, not the usage
    rp.main(["gmm", "--dry_run", "--estimate=prob"])
  assert usage.value.code == 2 and capsys.readouterr().err == (
    "locvit.reproduce: error: argument --estimate: invalid choice: 'prob' (choose from 'probe', "
    "'kit')\n"
  )
  assert time.perf_counter() - start < 30 and not os.path.exists(workdir)


# ------------------------------------------------------------------------------------------------
# Paper-protocol plans


def test_data_takes_locvit_mains_forms(tmp_path, monkeypatch, capsys):
  """``--data=image_folder:DIR`` and ``--data=tfds:DATA_DIR``, as locvit.main's (was: argparse's
  invalid choice), checked before anything is created."""
  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  workdir, folder, tfds_dir = tmp_path / "w", tmp_path / "cifar", tmp_path / "tfds"
  (folder / "train").mkdir(parents=True)
  run = ["gmm", "--minutes=60", f"--workdir={workdir}"]
  assert rp.main([*run, f"--data=image_folder:{folder}"]) == 2
  assert capsys.readouterr().err == (
    f"locvit.reproduce: error: row 'vit': no test folder in {folder}. Prepare CIFAR-10 as "
    "described in docs/data_preparation.md (DIR/train/<class>/*.png, DIR/test/<class>/*.png).\n"
  )
  assert rp.main([*run, f"--data=tfds:{tfds_dir}"]) == 2
  assert capsys.readouterr().err.startswith(
    "locvit.reproduce: error: row 'vit': TFDS dataset 'cifar10' is not prepared: looked for "
    f"'{tfds_dir / 'cifar10'}/"
  )
  assert rp.main([*run, "--data=tfsd:/data"]) == 2
  assert capsys.readouterr().err == (
    "locvit.reproduce: error: --data=tfsd:/data: 'tfsd' is not a source; did you mean tfds? Give "
    "--data=image_folder:DIR, --data=DIR or --data=tfds[:DATA_DIR]\n"
  )
  assert rp.main([*run, "--data=tfds:/a", "--tfds_data_dir=/b"]) == 2  # which one?
  assert capsys.readouterr().err == (
    "locvit.reproduce: error: --tfds_data_dir goes with --data=tfds only (given --data=tfds:/a); "
    "give the data one way: --data=tfds:/b, or --data=tfds:/a alone\n"
  )
  assert not workdir.exists()


def _collapsed(text):
  return [" ".join(line.split()) for line in text.splitlines()]


def test_protocol_dry_runs_print_the_papers_protocol_and_create_nothing(
  tmp_path, capsys, monkeypatch
):
  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  expected = {  # row, model, seeds, batch, epochs, paper epochs, steps, images per run
    "gmm_table1_cifar10": [
      "vit vit_smalldata_d9_patch4_32 3 128 300 300 117000 14,976,000",
      "gmm gmm_vit_smalldata_d9_patch4_32 3 128 300 300 117000 14,976,000",
      "vit_d15 vit_smalldata_d15_patch4_32 3 128 300 300 117000 14,976,000",
      "gmm_d15 gmm_vit_smalldata_d15_patch4_32 3 128 300 300 117000 14,976,000",
    ],
    "structinit_table2_cifar10": [
      f"{init} structvit_tiny_patch2_32 3 512 200 200 19400 9,932,800"
      for init in ("trunc_normal", "mimetic", "impulse3")
    ],
    "cordonnier_table1": [
      "quadratic cordonnier_sa 3 100 300 300 150000 15,000,000",
      "learned cordonnier_sa_learned 3 100 300 300 150000 15,000,000",
      "resnet18 resnet18_cifar 3 100 300 300 150000 15,000,000",
    ],
  }
  workdir = tmp_path / "w"
  for plan, rows in expected.items():
    assert rp.main([plan, "--dry_run", f"--workdir={workdir}"]) == 0
    out = capsys.readouterr().out
    lines = _collapsed(out)
    for row in rows:
      assert any(line.startswith(row + " ") for line in lines), (row, out)
    assert "at the paper's protocol" in lines[0]
    assert "from the accelerator kit's NVIDIA H200 figures of 2026-11-26" in out
    assert (
      "  data: the CIFAR-10 image folder $CIFAR10_ROOT (100% of the training set; not read yet: "
      in out
    )
    assert "evaluations included" in out and "the best evaluation its code reported)" in out
    if plan == "gmm_table1_cifar10":  # the paper's inconsistency, under the title
      assert lines[2].startswith("The paper is inconsistent: Table 1 prints 93.65 / 95.06"), out
      # The official code's 100 epochs of 3 passes, each evaluated.
      assert (
        "  evaluations: 100 (every 3 epochs and at the end: the official code's, main.py "
        "validates after each of its 100 epochs and logs best_acc1)" in out
      )
      # 27.5 s compiling, then 117,000 steps of the 3 seeds side by side and 100 evaluations of
      # the 3 seeds in one vmapped pass: 10,000 images at a third of their step's time per image.
      step = _gmm_side_by_side_step_ms(3) / 1e3
      minutes = (27.5 + 117_000 * step + 100 * 10_000 / 128 * step / 3) / 60
      assert f"  estimate: {minutes:.1f} minutes per run (1.0 s per evaluation); " in out
      assert any(  # the table's images/s: the 3 seeds' images of a step
        line.startswith("gmm gmm_vit_smalldata_d9_patch4_32 3 128 ")
        and line.split()[-2] == f"{3 * 128 / step:,.0f}"
        for line in lines
      ), out
      assert (
        "; 3 seeds side by side: the kit's steps scaled by the 3-seed step's XLA:GPU kernel count "
        "against one seed's (" in out
      )
    assert out.rstrip().endswith("Nothing was created (--dry_run).")
  assert not workdir.exists() and os.listdir(tmp_path) == []
  # The combined row runs only when named; a fraction shrinks every row alike.
  assert rp.main(["gmm_table1_cifar10", "--dry_run", "--rows=gmm_impulse3", "--fraction=0.1"]) == 0
  lines = _collapsed(capsys.readouterr().out)
  assert lines[0].endswith("at 0.1 of the paper's protocol")
  assert any(line.startswith("gmm_impulse3 gmm_vit_smalldata_d9_patch4_32 3 128 30 300 11700 ")
             for line in lines)  # fmt: skip


def _gmm_side_by_side_step_ms(seeds: int) -> float:
  """The H200 estimate of the GMM plan's N-seed step from the recorded kernel counts: the GPU
  loop's step (15.3 ms at batch 128, 4.06 ms of it the resident step), its resident part scaled
  by the N-seed step's kernels against one seed's, its feed and checkpoints once per seed."""
  counted = KIT_SEED_KERNELS["models"]["gmm_small"]
  scale = max(1.0, counted["seeds"][seeds] / counted["lone"])
  loop = 128 / 8_359 * 1e3
  step = 4.06 * scale + (loop - 4.06) * seeds
  # The longest of the limits: the kit's resident step of gmm_small (7.34 ms at batch 512) scaled
  # alike, and the feed of N batches at 55,212 img/s, are shorter.
  assert step > max(7.34 * scale, seeds * 128 / 55_212 * 1e3)
  return step


def test_side_by_side_seeds_are_estimated_from_the_n_seed_steps_kernel_count(monkeypatch):
  plan = rp.PLANS["gmm_table1_cifar10"]
  spec = plan["rows"]["gmm"]
  full = complete_config(rp.row_config(spec))
  rates = {n: rp.protocol.row_rates("gmm", spec, full, None, 10_000, n) for n in (1, 3)}
  assert rates[3]["step_seconds"] == pytest.approx(_gmm_side_by_side_step_ms(3) / 1e3)
  # Fewer than 3 times one seed's step (the kernels grow far less than 3 times), never below it.
  assert rates[1]["step_seconds"] < rates[3]["step_seconds"] < 3 * rates[1]["step_seconds"]
  # The seeds' one vmapped evaluation grows over one seed's as their step does.
  step_growth = rates[3]["step_seconds"] / rates[1]["step_seconds"]
  assert rates[3]["eval_sec"] == pytest.approx(step_growth * rates[1]["eval_sec"])
  assert rates[1]["eval_sec"] == pytest.approx(10_000 / 8_359 / 3)  # 10,000 images at 1/3 step
  counted = KIT_SEED_KERNELS["models"]["gmm_small"]
  scale = counted["seeds"][3] / counted["lone"]
  assert rates[3]["basis"] == (
    "a GPU training loop's step (15.3 ms at batch 128, its training split fed by the host), fed "
    f"3 seeds, its resident 4.06 ms x {scale:.2f}; 3 seeds side by side: the kit's steps scaled "
    f"by the 3-seed step's XLA:GPU kernel count against one seed's ({counted['seeds'][3]:,} / "
    f"{counted['lone']:,} kernels, {counted['measured']}, compiled for an NVIDIA H200 without "
    "one), the arithmetic and the feed 3 times: not a measured GPU time; the kit timed bf16 "
    "steps and this row trains in float32: likely low"
  )
  # Between measured seed counts the kernels are interpolated; beyond the largest they grow in
  # proportion to the seeds; an N-seed step counted below one seed's still takes one seed's.
  counts = {1: 500, 2: 520, 4: 540, 8: 600}
  assert [rp.protocol.seed_kernels(counts, n) for n in (2, 3, 6, 16)] == [520, 530, 570, 1200]
  monkeypatch.setitem(counted, "seeds", {1: 400, 2: 400})
  assert rp.protocol.kernel_scale("gmm_small", 2)[0] == 1.0
  grown = rp.protocol.kernel_scale("gmm_small", 4)[1]
  assert f"(800 / {counted['lone']:,} kernels, grown in proportion from 2 seeds, " in grown
  two = rp.protocol.row_rates("gmm", spec, full, None, 10_000, 2)["step_seconds"]
  assert two == pytest.approx(128 / 8_359 * 2 - 4.06e-3)  # the loop's step, fed twice
  # A kit model without counts: at most N times one seed's step, said so.
  monkeypatch.delitem(KIT_SEED_KERNELS["models"], "gmm_small")
  three = rp.protocol.row_rates("gmm", spec, full, None, 10_000, 3)
  assert three["step_seconds"] == pytest.approx(3 * rates[1]["step_seconds"])
  assert three["eval_sec"] == pytest.approx(3 * rates[1]["eval_sec"])  # as its step
  assert three["basis"].endswith(
    "; 3 seeds side by side: 3 times one seed's step (an upper bound: no kernel count of this "
    "model's N-seed step is recorded)" + rp.protocol.FLOAT32_UNDERESTIMATE
  )
  # A bf16 row (the kit's own precision) carries no such warning.
  bf16 = complete_config(rp.row_config(plan["rows"]["gmm_bf16"]))
  assert "float32" not in rp.protocol.row_rates("gmm_bf16", spec, bf16, None, 10_000)["basis"]


def test_a_protocol_dry_run_shows_each_row_in_full(capsys, monkeypatch):
  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  assert rp.main(["cordonnier_table1", "--dry_run", "--seeds=2"]) == 0
  out = capsys.readouterr().out
  for line in (
    # The paper's parameter counts: 12.1M and 12.3M (Table 1), ResNet18's 11.2M.
    "quadratic: cordonnier_sa: depth 6, width 400, 9 heads, patch 2, 12.09M parameters",
    "learned: cordonnier_sa_learned: depth 6, width 400, 9 heads, patch 2, 12.28M parameters",
    "resnet18: resnet18_cifar: width 64, 11.17M parameters",
    "  precision: fp32; batch 100; 300 epochs (150,000 steps)",  # the official code's
    "  evaluations: 300 (every epoch and at the end: the official code's, train.py tests every "
    "epoch and returns the best accuracy)",
    "  paper: 91.80% top-1 (Table 1; the best evaluation its code reported)",
  ):
    assert line in out.splitlines(), (line, out)
  gap = 10 * math.sqrt(2) / stats.t.ppf(0.975, 1)  # 2 seeds against the 2.00-point gap
  assert (
    "Seeds: 2 per row, side by side in one run per row (config.num_seeds). The paper's gap "
    "quadratic vs resnet18 is 0.00 points: no seed count "
    "separates it, and the report counts it within the seed spread. The paper's smallest gap, "
    "quadratic vs learned, is 2.00 points: 2 seeds separate it (paired t, p < 0.05) only if the "
    f"per-seed differences spread by less than {gap / 5:.2f} points (sd)" in out
  )


def test_print_config_gives_each_rows_run_config_as_config_json(tmp_path, capsys, monkeypatch):
  """``--dry_run --print_config``: every row's resolved config in the format of DIR/config.json,
  equal to the config its run trains with."""
  from locvit.workdir import saved_config

  monkeypatch.delenv("CIFAR10_ROOT", raising=False)
  plan = rp.PLANS["structinit_table2_cifar10"]
  argv = ["structinit_table2_cifar10", "--dry_run", "--print_config", "--fraction=0.5"]
  monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "locvit.reproduce", *argv])
  assert rp.main(argv) == 0
  records = json.loads(capsys.readouterr().out)
  assert list(records) == ["trunc_normal", "mimetic", "impulse3"]
  for row, record in records.items():
    saved = tmp_path / f"{row}.json"
    saved.write_text(json.dumps(record))
    expected = rp.protocol.protocol_config(rp.row_config(plan["rows"][row]), 50_000, 0.5, 0, 1)
    expected.num_seeds = 3  # the plan's seeds, side by side
    assert saved_config.read(str(saved)).to_dict() == expected.to_dict()
    config = record["config"]
    assert (config["total_steps"], config["eval_every_steps"], config["seed"]) == (9700, 97, 0)
    # The command that trains the row, not the dry run that printed it.
    assert record["command"] == (
      "python -m locvit.reproduce structinit_table2_cifar10 --fraction=0.5"
    )
  assert rp.main([argv[0], "--print_config"]) == 2
  assert capsys.readouterr().err == "locvit.reproduce: error: --print_config goes with --dry_run\n"
  assert rp.main(["structinit", "--dry_run", "--print_config"]) == 2
  assert capsys.readouterr().err.startswith(
    "locvit.reproduce: error: --print_config: 'structinit' is a budget plan, whose steps a probe "
  )


def test_a_protocol_plan_that_does_not_fit_the_budget_is_refused(tmp_path, monkeypatch, capsys):
  assert rp.main(["gmm_table1_cifar10", "--dry_run", "--minutes=10"]) == 2
  captured = capsys.readouterr()
  assert (
    "Estimated wall time 306.5 minutes for 4 runs of 3 seeds side by side (seeds 0, 1, 2)"
    in captured.out
  )
  # The rate is the H200 training loop's measured step, longer than the kit's resident step.
  assert (
    "rate set by a GPU training loop's step (15.3 ms at batch 128, its training split fed by "
    "the host)" in captured.out
  )
  refusal = (
    "locvit.reproduce: error: plan 'gmm_table1_cifar10' needs an estimated 306.5 minutes for 4 "
    "runs of 3 seeds side by side (seeds 0, 1, 2) but --minutes=10; give more --minutes, fewer "
    "--seeds, or --fraction (at most 0.026 of this length fits; --fraction=fit picks it)\n"
  )
  assert captured.err == refusal
  assert rp.main(["gmm_table1_cifar10", "--dry_run", "--minutes=10", "--fraction=fit"]) == 0
  assert "at 0.026 of the paper's protocol" in capsys.readouterr().out
  # A run is refused the same way, before anything is created (the kit's estimate: no probe).
  monkeypatch.setenv("CIFAR10_ROOT", str(tmp_path))
  for split in ("train", "test"):
    (tmp_path / split).mkdir()
  workdir = tmp_path / "w"
  assert (
    rp.main(["gmm_table1_cifar10", f"--workdir={workdir}", "--minutes=10", "--estimate=kit"]) == 2
  )
  assert capsys.readouterr().err == refusal and not workdir.exists()
  assert rp.main(["gmm", "--dry_run", "--fraction=0.5"]) == 2
  assert capsys.readouterr().err == (
    "locvit.reproduce: error: --fraction is for paper-protocol plans; 'gmm' is a budget plan\n"
  )


def _write_protocol_plan(workdir, fraction=0.05, seeds=1):
  steps, _ = rp.protocol.protocol_steps(
    rp.row_config(rp.PLANS["smoke_protocol"]["rows"]["depth1"]), 1437, fraction
  )
  os.makedirs(workdir)
  cost = {"steps_per_sec": 20.0, "overhead_sec": 5.0, "steps_per_epoch": 22, "batch_size": 64}
  plan = {
    "plan": "smoke_protocol", "protocol": True, "fraction": fraction, "seeds": seeds,
    "side_by_side": seeds > 1,
    "row_names": ["depth1"], "minutes": None, "started": time.time(),
    "load_at_probe": [1.0, 1.0, 1.0], "locvit_commit": "test", "estimated_minutes": 1.0,
    "data": "scikit-learn's 8x8 digits", "rows": {"depth1": {**cost, "steps": steps}},
    "evaluation": rp.PLANS["smoke_protocol"]["evaluation"],
  }  # fmt: skip
  with open(os.path.join(workdir, "plan.json"), "w") as f:
    json.dump(plan, f)
  return steps


def _trained(run):
  """Per step, the logged training loss and evaluation (timings left out)."""
  keep = ("train/loss", "eval/top1", "eval/loss")
  return {(r["step"], k): r[k] for r in metrics.read_metrics(run) for k in keep if k in r}


def test_a_protocol_report_gives_the_final_and_the_best_evaluation(tmp_path):
  """The official code evaluates every epoch and reports the best: the smoke protocol plan's runs
  evaluate every epoch, and its report gives both, the difference taking the best."""
  workdir = str(tmp_path / "w")
  steps = _write_protocol_plan(workdir, fraction=0.1)
  assert steps == 66  # 3 epochs of 22 steps
  assert rp.main(["smoke_protocol", f"--workdir={workdir}"]) == 0
  run = os.path.join(workdir, "depth1", "seed0")
  evaluated = {r["step"]: r["eval/top1"] for r in metrics.read_metrics(run) if "eval/top1" in r}
  assert sorted(evaluated) == [22, 44, 66]
  results = json.loads(pathlib.Path(workdir, "results.json").read_text())
  row = results["rows"]["depth1"]
  assert row["top1_mean"] == evaluated[66] and row["best_top1_mean"] == max(evaluated.values())
  assert row["best_step_per_seed"] == {"0": max(evaluated, key=evaluated.get)}
  assert row["paper_reports"] == "best"
  text = pathlib.Path(workdir, "results.md").read_text()
  assert "| row | paper top-1 % | ours final top-1 % | ours best top-1 % | ours - paper" in text
  assert (
    f"| depth1 | - | {100 * evaluated[66]:.2f} | {100 * max(evaluated.values()):.2f} | - |" in text
  )
  assert (
    "Evaluations: ours every epoch and at the end; final is the last evaluation, best the "
    "highest; the paper's code reported the best top-1 of its evaluations (every epoch; none: "
    "the smoke plan evaluates as the protocol plans do), so 'ours - paper', the ordering and the "
    "comparisons take our best." in text
  )


def test_a_protocol_plans_seeds_train_side_by_side_each_a_run_of_its_own(tmp_path, capsys):
  """A row's seeds train in one run (config.num_seeds), each in DIR/ROW/seedK as a lone run
  would; the report pairs them, and counts their shared sessions' time once."""
  workdir = str(tmp_path / "w")
  steps = _write_protocol_plan(workdir, seeds=2)
  assert rp.main(["smoke_protocol", f"--workdir={workdir}"]) == 0
  assert "0 of 2 runs finished (2 seeds side by side per row)" in capsys.readouterr().out
  side_by_side = json.loads(pathlib.Path(workdir, "depth1", "config.json").read_text())["config"]
  assert (side_by_side["num_seeds"], side_by_side["seed"]) == (2, 0)
  for seed in (0, 1):
    run = os.path.join(workdir, "depth1", f"seed{seed}")
    assert rp.is_finished(run, steps)
    assert json.loads(pathlib.Path(run, "config.json").read_text())["config"]["seed"] == seed
  results = json.loads(pathlib.Path(workdir, "results.json").read_text())
  row = results["rows"]["depth1"]
  assert row["seeds_finished"] == [0, 1] and row["top1_per_seed"]["0"] != row["top1_per_seed"]["1"]
  assert results["training_wall_minutes"] == pytest.approx(max(row["wall_seconds_per_seed"]) / 60)
  assert rp.main(["smoke_protocol", f"--workdir={workdir}"]) == 0  # finished: nothing trains
  assert "2 of 2 runs finished" in capsys.readouterr().out


def test_a_run_continues_on_another_machine_from_the_copied_workdir(tmp_path, capsys, monkeypatch):
  whole, first, second = (str(tmp_path / name) for name in ("whole", "first", "second"))
  steps = _write_protocol_plan(whole)
  assert steps == 33  # 5% of 30 epochs of 22 steps: 1.5 epochs
  _write_protocol_plan(first)
  monkeypatch.setattr(provenance, "locvit_commit", lambda: "aaaaaaa")  # the first machine's
  assert rp.main(["smoke_protocol", f"--workdir={whole}"]) == 0
  monkeypatch.setattr(os, "getloadavg", lambda: (9.5, 1.0, 1.0))  # a busy first machine
  with sigterm_after_step(12, signal.SIGINT):  # the first machine stops mid-run
    assert rp.main(["smoke_protocol", f"--workdir={first}"]) == 130
  assert "on another machine, copy it there first" in capsys.readouterr().out
  # The workdir travels packed (its newest checkpoint only); the first machine is gone.
  assert rp.main(["smoke_protocol", f"--workdir={first}", f"--pack={tmp_path}/moved.tgz"]) == 0
  assert "1 checkpoint folders left out" in capsys.readouterr().out
  assert rp.main(["smoke", f"--workdir={first}", f"--pack={tmp_path}/other.tgz"]) == 2
  assert f"--pack: {first} holds plan 'smoke_protocol', not 'smoke'" in capsys.readouterr().err
  with tarfile.open(tmp_path / "moved.tgz") as archive:
    names = archive.getnames()
    archive.extractall(tmp_path / "machine2", filter="data")
  assert "first/depth1/seed0/checkpoints/13/checksums.json" in names
  assert not [n for n in names if "/best/" in n]
  shutil.rmtree(first)
  second = str(tmp_path / "machine2" / "first")
  # The second machine runs a later checkout, with local changes: its steps say so.
  monkeypatch.setattr(provenance, "locvit_commit", lambda: "bbbbbbb with local changes")
  monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 1.0, 1.0))  # a quiet second machine
  assert rp.main(["smoke_protocol", f"--workdir={second}"]) == 0
  out = capsys.readouterr().out
  assert "0 of 1 runs finished" in out
  run_whole, run_second = (os.path.join(d, "depth1", "seed0") for d in (whole, second))
  resumed = [r["step"] for r in metrics.read_metrics(run_second) if "train/loss" in r]
  assert 13 in resumed and resumed == sorted(set(resumed))  # continued after its checkpoint
  assert _trained(run_second) == _trained(run_whole)
  assert (steps, "eval/top1") in _trained(run_whole)
  # best/ holds the run's best step or nothing: the one the whole run kept, unless that one was
  # was evaluated on the first machine (up to step 13, its checkpoint) and so did not travel.
  best = lambda run: next(iter(os.listdir(os.path.join(run, "checkpoints", "best"))), None)
  assert best(run_second) == (best(run_whole) if int(best(run_whole)) > 13 else None)
  text = pathlib.Path(second, "results.md").read_text()
  assert "| depth1 | - |" in text and "smoke test of a paper-protocol plan" in text.lower()
  assert "at 0.05 of the paper's protocol" in text
  # Each start appended its commit and first step; the report names both, with their steps.
  started = [(e["commit"], e["first_step"], e["device_kind"]) for e in provenance.read(run_second)]
  assert started == [("aaaaaaa", 1, "cpu"), ("bbbbbbb with local changes", 14, "cpu")]
  assert (
    f"locvit commits: depth1: steps 1-13 at commit aaaaaaa, 14-{steps} at commit bbbbbbb with "
    f"local changes (report: {report.locvit_commit()}); " in text
  )
  whole_text = pathlib.Path(whole, "results.md").read_text()
  assert f"locvit commit aaaaaaa (report: {report.locvit_commit()}); " in whole_text
  # Its wall time is both machines' sessions (the first stopped by Ctrl-C), not the last one's.
  sessions = provenance.read(run_second)
  assert [(e["last_step"], e["ended"]) for e in sessions] == [(13, True), (steps, True)]
  results = json.loads(pathlib.Path(second, "results.json").read_text())
  seconds = results["rows"]["depth1"]["wall_minutes_per_run"] * 60
  assert seconds == pytest.approx(sessions[0]["seconds"] + sessions[1]["seconds"])
  assert seconds > sessions[1]["seconds"] and results["training_wall_exact"]
  assert "Machine: JAX backend cpu, device cpu x " in text  # one device kind: this machine's
  # The load during the runs is both machines' (was: the last session's only, 0.5-0.5).
  assert [e["load_average"] for e in sessions] == [[9.5, 9.5], [0.5, 0.5]]
  assert "1-minute load average 0.5-9.5 during the runs." in text


def test_pack_closes_the_checkpoint_readers_it_opens(tmp_path, monkeypatch):
  """Was: a read-only Checkpointer per run, opened to find its newest step and never closed."""
  from locvit.reproduce import pack
  from locvit.workdir import checkpoint

  opened, closed = [], []
  monkeypatch.setattr(
    checkpoint.Checkpointer, "__init__", _recording(checkpoint.Checkpointer.__init__, opened)
  )
  monkeypatch.setattr(
    checkpoint.Checkpointer, "close", _recording(checkpoint.Checkpointer.close, closed)
  )
  for row in ("depth1", "depth2"):
    (tmp_path / "w" / row / "seed0" / "checkpoints").mkdir(parents=True)
  assert pack.pack(str(tmp_path / "w"), str(tmp_path / "w.tgz")) == []
  assert len(opened) == 2 and sorted(map(id, closed)) == sorted(map(id, opened))


def _recording(method, calls):
  def record(self, *args, **kwargs):
    calls.append(self)
    return method(self, *args, **kwargs)

  return record


def _tiny_cifar(root, per_class=2, suffix="jpg"):
  """A 32x32 JPEG (or ``suffix='png'``: PNG) image folder with CIFAR-10's ten classes
  (``per_class`` images per split)."""
  from PIL import Image

  rng = np.random.default_rng(0)
  for split in ("train", "test"):
    for label in range(10):
      folder = root / split / f"class{label}"
      folder.mkdir(parents=True)
      for i in range(per_class):
        pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.{suffix}", quality=75)
  return root


def test_a_protocol_plan_refuses_a_folder_of_another_size(tmp_path, capsys):
  """Was: 117,000 steps planned on a 20-image folder, '100% of the training set' printed."""
  folder, workdir = _tiny_cifar(tmp_path / "mine"), tmp_path / "w"
  refusal = (
    f"locvit.reproduce: error: row 'vit': {folder} holds 20 training images, not the 50,000 of "
    "the paper's dataset: a paper-protocol plan trains the paper's epochs of the whole dataset, "
    "its steps set by that size. On your own images: python -m locvit.main "
    f"--config=gmm_table3:d9,base --data=image_folder:{folder} --workdir=DIR\n"
  )
  run = ["gmm_table1_cifar10", f"--data={folder}"]
  assert rp.main([*run, "--dry_run"]) == 2
  assert capsys.readouterr().err == refusal
  assert rp.main([*run, f"--workdir={workdir}", "--estimate=kit"]) == 2
  assert capsys.readouterr().err == refusal and not workdir.exists()


def test_a_protocol_plan_refuses_a_jpeg_folder_unless_told_it_is_lossy(
  tmp_path, monkeypatch, capsys
):
  """The papers trained on the original images: a JPEG copy is refused before anything is
  created, with the lossless ways; ``--allow_lossy_data`` takes it, and the report's title says
  so."""
  # A tiny folder stands in for CIFAR-10's 50,000 training images.
  for row in ("vit", "gmm", "vit_d15", "gmm_d15"):
    monkeypatch.setitem(rp.PLANS["gmm_table1_cifar10"]["rows"][row], "paper_train_examples", 20)
  folder, workdir = _tiny_cifar(tmp_path / "jpeg"), tmp_path / "w"
  run = ["gmm_table1_cifar10", f"--data={folder}", "--estimate=kit"]
  refusal = (
    f"locvit.reproduce: error: row 'vit': {folder} holds JPEG images, a lossy copy of the "
    "original CIFAR-10 the papers trained and tested on: prepare a lossless PNG folder (python -m "
    "locvit.data.prepare cifar10 --out=DIR, then --data=image_folder:DIR) or read TFDS "
    "(--data=tfds); or pass --allow_lossy_data to train on the JPEG copy anyway (the report's "
    "title then says so)\n"
  )
  assert rp.main([*run, "--dry_run"]) == 2
  assert capsys.readouterr().err == refusal
  assert rp.main([*run, f"--workdir={workdir}"]) == 2
  assert capsys.readouterr().err == refusal and not workdir.exists()
  assert rp.main([*run, "--dry_run", "--allow_lossy_data"]) == 0
  assert (
    f"  data: the CIFAR-10 JPEG copy (image folder {folder}, lossy, " in capsys.readouterr().out
  )
  # Opted in: the saved plan and the report's title say the data was lossy.
  plan = rp.PLANS["gmm_table1_cifar10"]
  configs = rp.plan_configs(plan, ["vit", "gmm"], str(folder), None)
  rp.load_or_make_plan(
    "gmm_table1_cifar10", plan, configs, str(workdir), 1, None, time.time(), probe_here=False,
    allow_lossy_data=True,
  )  # fmt: skip
  result = report.write_report("gmm_table1_cifar10", str(workdir))
  assert result["title"].endswith(
    "at the paper's protocol, on LOSSY JPEG data (--allow_lossy_data; the papers used the "
    "original images)"
  )
  # A lossless folder needs no flag.
  png = _tiny_cifar(tmp_path / "png", suffix="png")
  assert rp.main(["gmm_table1_cifar10", f"--data={png}", "--dry_run"]) == 0
  assert f"  data: CIFAR-10 as lossless PNG (image folder {png}, 100%" in capsys.readouterr().out


def test_a_budget_plan_refuses_a_folder_smaller_than_a_batch_in_one_line(tmp_path, capsys):
  """Was: 'Warming up...' and a traceback ending in the run's refusal, which named
  --config.batch_size, a flag this command does not take."""
  folder, workdir = _tiny_cifar(tmp_path / "mine"), tmp_path / "w"
  assert rp.main(["structinit", f"--data={folder}", f"--workdir={workdir}"]) == 2
  assert capsys.readouterr().err == (
    f"locvit.reproduce: error: row 'trunc_normal': {folder} gives 10 training images "
    "(data.train_fraction=0.1 of its 'train' split), fewer than the row's batch of 128: the plan "
    "is made for CIFAR-10 (docs/data_preparation.md). On your own images: python -m locvit.main "
    f"--config=structinit_cifar10_small:trunc_normal --data=image_folder:{folder} "
    "--config.batch_size=10 --workdir=DIR\n"
  )
  assert not workdir.exists()


def test_the_combined_row_changes_only_q_and_k_and_trains(tmp_path, monkeypatch):
  """GMM-ViT with impulse-3 q/k (gmm_table1_cifar10's optional row): the GMM row's init but the
  query/key kernels, and a few training steps on CPU (two blocks, the fast solver)."""
  import flax
  import jax

  from locvit import train
  from locvit.init import apply_init
  from locvit.models.factory import build_model

  monkeypatch.setenv("CIFAR10_ROOT", str(_tiny_cifar(tmp_path / "cifar")))
  rows = rp.PLANS["gmm_table1_cifar10"]["rows"]
  config = rp.row_config(rows["gmm_impulse3"])
  assert rp.select_rows(rp.PLANS["gmm_table1_cifar10"], None) == [
    "vit",
    "gmm",
    "vit_d15",
    "gmm_d15",
  ]
  gmm_init = rp.row_config(rows["gmm"]).init
  assert config.model.name == rp.row_config(rows["gmm"]).model.name
  assert (config.init.name, config.init.filter_size) == ("impulse", 3)
  assert config.init.base == gmm_init.name == "xavier_normal"
  config.model.overrides.depth = 2
  config.model.overrides.layer_attention = ("gmm",) * 2
  config.init.solver = "fast"
  config.mixed_precision = False

  model = build_model(config, 10)
  params = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32), train=False)
  params = apply_init(gmm_init, flax.linen.meta.unbox(params["params"]), model, 32, seed=0)
  impulse = apply_init(config.init, params, model, 32, seed=0)
  before, after = (flax.traverse_util.flatten_dict(p, sep="/") for p in (params, impulse))
  changed = {k for k in before if not np.array_equal(before[k], after[k])}
  assert changed == {f"blocks_{i}/attn/qkv/kernel" for i in range(2)}
  kernel, new = (
    params["blocks_0"]["attn"]["qkv"]["kernel"],
    impulse["blocks_0"]["attn"]["qkv"]["kernel"],
  )
  np.testing.assert_array_equal(kernel[:, 2], new[:, 2])  # v is kept

  config = rp.budgeted_config(config, 3, seed=0)
  config.batch_size = config.eval_batch_size = 8
  # The recipe's augmentations are tested elsewhere: off here, so the step compiles faster.
  config.data.augment_on, config.data.auto_augment = "host", None
  config.data.train_split_on = "host"
  config.mixup.mixup_alpha = config.mixup.cutmix_alpha = config.random_erasing.prob = 0.0
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  losses = [r["train/loss"] for r in metrics.read_metrics(workdir) if "train/loss" in r]
  assert losses and np.isfinite(losses).all()
  assert rp.is_finished(workdir, 3)


def test_forward_flops_compiles_where_the_lowering_counts_nothing(monkeypatch):
  import jax

  from locvit.reproduce import protocol
  from tests.train_utils import tiny_config

  counted = protocol.forward_flops(tiny_config())
  # XLA:GPU's lowering has no cost analysis (None): the count then comes from the compiled pass.
  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", lambda self: None)
  flops, params = protocol.forward_flops(tiny_config())
  assert params == counted[1] and flops == pytest.approx(counted[0], rel=0.05)
  monkeypatch.setattr(jax.stages.Compiled, "cost_analysis", lambda self: None)
  no_count = r"^XLA counts no FLOPs for \w+'s forward pass on cpu: "
  with pytest.raises(rp.ReproduceError, match=no_count):
    protocol.forward_flops(tiny_config())


def test_the_commit_says_when_the_checkout_has_local_changes(tmp_path, monkeypatch):
  def git(*args):
    return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

  git("init", "-q")
  (tmp_path / "a.py").write_text("x = 1\n")
  git("add", "a.py")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
  head = git("rev-parse", "--short=7", "HEAD").stdout.decode().strip()
  assert report.locvit_commit(str(tmp_path)) == head
  (tmp_path / "a.py").write_text("x = 2\n")  # as a copy whose files are newer than its .git
  assert report.locvit_commit(str(tmp_path)) == f"{head} with local changes"
  # A copy without git metadata (a lent machine) is named by $LOCVIT_COMMIT.
  monkeypatch.setenv("LOCVIT_COMMIT", "abc1234")
  assert report.locvit_commit() == "abc1234"
