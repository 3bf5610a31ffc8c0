"""Seeds side by side (``config.num_seeds``, ``locvit.run.seeds``): each seed of the one vmapped
step is the run of that seed trained alone, in a workdir of its own.

Tolerance: the side-by-side step batches every matrix product over the seed axis (``jax.vmap``),
and XLA:CPU may tile and accumulate a batched product in another order than the lone one; so
losses, evaluations and parameters agree with the lone run to float32 rounding accumulated over
the steps (``rtol=2e-5``, as the mesh layouts against one device in test_train.py), not bit for
bit. The data order, the random keys and the initialisation are the lone run's exactly (the first
step's loss is equal).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import structinit_cifar10_small
from locvit import train
from locvit.analysis.analyze import analyze
from locvit.data import device_augment
from locvit.metrics import read_metrics
from locvit.platform import sharding
from locvit.reproduce import budget
from locvit.run import bundle, evaluation
from locvit.run import config as run_config
from locvit.run import seeds as seeds_lib
from locvit.run.step import NonFiniteError
from locvit.workdir import checkpoint, saved_config
from tests.test_cli import ROOT, _env
from tests.train_utils import sigterm_after_step, tiny_config

RTOL = 2e-5
# Adam's step g / sqrt(v) turns a rounding difference in a near-zero gradient into a difference of
# up to a learning rate (1e-3 here) in that parameter: the parameters agree to 2% of one step.
PARAM_ATOL = 2e-5
SEEDS = (0, 1)


def one_device(config):
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  return config


def small_config(**fields):
  """The tiny digits ViT, evaluated and saved at steps 3 and 6, at an eval batch size that leaves
  a partial last batch (360 examples, batches of 48)."""
  fields = {"eval_every_steps": 3, "checkpoint_every_steps": 3, "eval_batch_size": 48, **fields}
  return one_device(tiny_config(**fields))


def losses(workdir):
  return [(r["step"], r["train/loss"]) for r in read_metrics(workdir) if "train/loss" in r]


def evaluations(workdir):
  return {r["step"]: r for r in read_metrics(workdir) if "eval/top1" in r}


def final_params(workdir, step):
  reader = checkpoint.Checkpointer(str(workdir / "checkpoints"), async_save=False, read_only=True)
  state = reader.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  reader.close()
  return state["state"]["params"]


def assert_same_run(workdir, lone, step=6, same_devices=True):
  """``workdir`` trained as ``lone``: the same steps, losses, evaluations and final parameters.
  On the same devices, the first loss is equal: the same batch, keys and initial parameters."""
  got, want = losses(workdir), losses(lone)
  assert [s for s, _ in got] == [s for s, _ in want]
  assert got[0] == want[0] or not same_devices
  np.testing.assert_allclose([v for _, v in got], [v for _, v in want], rtol=RTOL)
  got, want = evaluations(workdir), evaluations(lone)
  assert sorted(got) == sorted(want)
  for s in want:
    assert got[s]["eval/num_examples"] == want[s]["eval/num_examples"]
    for key in ("eval/loss", "eval_ema/loss"):
      assert (key in got[s]) == (key in want[s])
      if key in want[s]:
        np.testing.assert_allclose(got[s][key], want[s][key], rtol=RTOL)
    assert got[s]["eval/top1"] == pytest.approx(want[s]["eval/top1"], abs=1.5 / 360)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=PARAM_ATOL),
    final_params(workdir, step),
    final_params(lone, step),
  )


@pytest.fixture(scope="module")
def lone_runs(tmp_path_factory):
  """Seeds 0 and 1 of ``small_config`` trained alone."""
  root = tmp_path_factory.mktemp("lone")
  for seed in SEEDS:
    train.train_and_evaluate(small_config(seed=seed), str(root / f"seed{seed}"))
  return {seed: root / f"seed{seed}" for seed in SEEDS}


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
  """Seeds 0 and 1 of ``small_config`` side by side: (workdir, result)."""
  workdir = tmp_path_factory.mktemp("side") / "run"
  return workdir, train.train_and_evaluate(small_config(num_seeds=2), str(workdir))


def test_each_seed_is_its_lone_run_in_a_workdir_of_its_own(lone_runs, side_by_side):
  workdir, result = side_by_side
  assert sorted(result["seeds"]) == list(SEEDS)
  for seed in SEEDS:
    assert_same_run(workdir / f"seed{seed}", lone_runs[seed])
    saved = saved_config.read(str(workdir / f"seed{seed}" / "config.json"))
    assert (saved.seed, saved.num_seeds) == (seed, 1)  # the lone run's config
    assert (workdir / f"seed{seed}" / "checkpoints" / "best").is_dir()
    final = result["seeds"][seed]
    assert final["eval/loss"] == evaluations(workdir / f"seed{seed}")[6]["eval/loss"]
  assert saved_config.read(str(workdir / "config.json")).num_seeds == 2  # resumes side by side


def test_eval_and_analyze_read_a_seed_workdir_alone(lone_runs, side_by_side, tmp_path):
  """``--mode=eval`` and ``--mode=analyze`` on ``WORKDIR/seed1`` (its config.json): the lone run's
  evaluation; on ``WORKDIR`` itself, one error line naming the seed workdirs."""
  workdir, _ = side_by_side
  seed_dir = workdir / "seed1"
  config = saved_config.read(str(seed_dir / "config.json"))
  result = evaluation.evaluate_checkpoint(config, str(seed_dir))
  want = evaluations(lone_runs[1])[6]
  assert result["step"] == 6
  np.testing.assert_allclose(result["eval/loss"], want["eval/loss"], rtol=RTOL)
  paths = analyze(config, str(seed_dir), str(tmp_path / "figures"))
  assert paths and all(os.path.isfile(p) and p.endswith(".png") for p in paths)

  proc = subprocess.run(
    [sys.executable, "-m", "locvit.main", f"--workdir={workdir}", "--mode=eval"],
    cwd=ROOT,
    env=_env(1),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert (proc.returncode, proc.stderr.splitlines()) == (
    2,
    [
      f"locvit: error: --mode=eval reads one run, and {workdir} holds 2 seeds trained side by "
      f"side: use --workdir={workdir}/seed0 (or {workdir}/seed1)"
    ],
  )


def test_one_evaluation_of_the_stacked_seeds_is_each_seed_evaluated_alone(lone_runs):
  """The seeds' one evaluation (the lone ``eval_step`` vmapped over the stacked weights, each
  test batch read once: 360 examples in batches of 48, a partial last batch) of the lone runs'
  step-6 weights gives each seed the lone ``--mode=eval`` of its workdir; with EMA weights
  (here the other seed's weights) the EMA's metrics are the other seed's.

  Tolerance: the weights are equal, so the counts are exact (no prediction is within rounding of
  a tie here) and the mean loss agrees to float32 rounding of the vmapped, batched products
  (``rtol=1e-6``, twenty times tighter than the runs' ``RTOL``)."""
  alone = {
    seed: evaluation.evaluate_checkpoint(small_config(seed=seed), str(lone_runs[seed]), step=6)
    for seed in SEEDS
  }
  run = bundle.build_evaluation(small_config())
  replicated = sharding.replicated(run.mesh)
  prepare = functools.partial(device_augment.normalize, data_config=run.config.data)
  params = [final_params(lone_runs[seed], 6) for seed in SEEDS]
  stacked, swapped = (
    jax.tree.map(lambda *xs: np.stack(xs), *order) for order in (params, params[::-1])
  )
  with jax.set_mesh(run.mesh), nn.logical_axis_rules(run.rules):
    eval_fn = evaluation.make_eval_step(
      run.model, run.mesh, run.rules, (replicated, replicated), prepare, over_seeds=True
    )
    metrics = evaluation.evaluate_with_ema(
      eval_fn, (stacked, {}), swapped, run.eval_batches, run.batch_sharding, print
    )
  for k, (got, other) in enumerate(zip(seeds_lib.split_metrics(metrics, 2), SEEDS[::-1])):
    for prefix, want in (("eval", alone[SEEDS[k]]), ("eval_ema", alone[other])):
      assert got[f"{prefix}/num_examples"] == want["eval/num_examples"] == 360
      assert got[f"{prefix}/top1"] == want["eval/top1"]
      assert got[f"{prefix}/top5"] == want["eval/top5"]
      np.testing.assert_allclose(got[f"{prefix}/loss"], want["eval/loss"], rtol=1e-6)
  assert alone[0]["eval/loss"] != alone[1]["eval/loss"]  # the seeds are told apart


def test_each_seed_keeps_its_own_best(tmp_path):
  """Evaluated and saved at every step, side by side: each seed's ``best/`` holds the step of its
  own best top-1 (the first, on a tie), and the seeds' best steps differ."""
  workdir = tmp_path / "run"
  train.train_and_evaluate(
    small_config(num_seeds=3, eval_every_steps=1, checkpoint_every_steps=1), str(workdir)
  )
  best = {}
  for seed in (0, 1, 2):
    logged = evaluations(workdir / f"seed{seed}")
    assert sorted(logged) == [1, 2, 3, 4, 5, 6]
    top1 = [logged[step]["eval/top1"] for step in sorted(logged)]
    reader = checkpoint.Checkpointer(
      str(workdir / f"seed{seed}" / "checkpoints"), async_save=False, read_only=True
    )
    best[seed] = reader.best_step()
    reader.close()
    assert best[seed] == 1 + int(np.argmax(top1)), (seed, top1)
  assert len(set(best.values())) > 1, best


def test_a_probe_of_seeds_side_by_side_counts_their_one_evaluation_once(tmp_path, monkeypatch):
  """``locvit.reproduce --estimate=probe`` of a row's seeds side by side: its seconds per
  evaluation are those of the seeds' one evaluation, which each seed logs as its
  ``perf/eval_seconds``, not that times the seeds."""
  read = {}
  read_metrics_of = budget.metrics_lib.read_metrics

  def read_metrics(workdir):
    read[str(workdir)] = read_metrics_of(workdir)
    return read[str(workdir)]

  monkeypatch.setattr(budget.metrics_lib, "read_metrics", read_metrics)
  cost = budget.probe(small_config(num_seeds=2), str(tmp_path / "probe"), steps=4)
  (records,) = read.values()
  logged = [r["perf/eval_seconds"] for r in records if "perf/eval_seconds" in r]
  assert len(logged) == 2  # halfway and at the end
  assert cost.eval_sec == logged[-1]


@pytest.mark.parametrize("checkpoint_every", [3, 0])
def test_sigterm_resume_side_by_side_and_one_seed_alone(lone_runs, tmp_path, checkpoint_every):
  """SIGTERM once seed 0 has logged step 2: the stop request cuts the seeds' one evaluation of
  step 3 short, and both seeds save step 3 without it (also where step 3 is no save step,
  ``checkpoint_every`` 0) and the run returns. Resumed side by side, both seeds evaluate step 3
  (one evaluation) and each ends as its lone run; a copy of seed 1's workdir resumed alone (with
  its own config.json) too."""
  workdir = tmp_path / "run"
  config = lambda: small_config(num_seeds=2, checkpoint_every_steps=checkpoint_every)
  with sigterm_after_step(2):
    first = train.train_and_evaluate(config(), str(workdir))
  assert (first["preempted"], first["step"]) == (True, 3)
  for seed in SEEDS:
    assert 3 not in evaluations(workdir / f"seed{seed}")
    assert (workdir / f"seed{seed}" / "checkpoints" / "3").is_dir()
  alone = tmp_path / "seed1_alone"
  shutil.copytree(workdir / "seed1", alone)

  second = train.train_and_evaluate(config(), str(workdir))
  assert "preempted" not in second
  for seed in SEEDS:
    assert_same_run(workdir / f"seed{seed}", lone_runs[seed])
  train.train_and_evaluate(saved_config.read(str(alone / "config.json")), str(alone))
  assert_same_run(alone, lone_runs[1])


def test_seeds_at_different_steps_are_refused_with_the_way_out(lone_runs, side_by_side, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(side_by_side[0], workdir)
  shutil.rmtree(workdir / "seed1" / "checkpoints" / "6")
  with pytest.raises(ValueError, match=r"seed0: 6, seed1: 3\), and side by side they train in"):
    train.train_and_evaluate(small_config(num_seeds=2), str(workdir))


def test_the_seed_axis_is_replicated_over_the_mesh_layouts(lone_runs, tmp_path):
  """FSDP over a (4, 2) mesh, two steps per dispatch, the training split on the device (shared by
  the seeds; each gathers its own rows): each seed keeps its lone run's layout (the seed axis
  replicated) and trains as the lone, host-fed run on one device."""
  config = tiny_config(num_seeds=2, eval_every_steps=3, checkpoint_every_steps=3)
  config.eval_batch_size, config.steps_per_dispatch = 48, 2
  config.data.train_split_on = "device"
  config.mesh.shape, config.mesh.layout = (4, 2), "fsdp"
  mesh = sharding.make_mesh(config.mesh)
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
  assert tuple(seeds_lib.stacked_sharding(spec).spec) == (None, "data", None)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  for seed in SEEDS:
    assert_same_run(tmp_path / "run" / f"seed{seed}", lone_runs[seed], same_devices=False)


def test_a_distilled_seed_with_an_ema_is_its_lone_run(lone_runs, tmp_path):
  """DeiT hard distillation and a weight EMA side by side: one frozen teacher (the lone seed-0
  run), shared by the seeds; seed 1 equals its lone run, its EMA's evaluations included."""

  def config(**fields):
    c = small_config(total_steps=3, **fields)
    c.distillation.type, c.distillation.teacher_workdir = "hard", str(lone_runs[0])
    c.ema.decay = 0.9
    return c

  train.train_and_evaluate(config(num_seeds=2), str(tmp_path / "side"))
  train.train_and_evaluate(config(seed=1), str(tmp_path / "lone1"))
  assert "eval_ema/loss" in evaluations(tmp_path / "lone1")[3]
  assert_same_run(tmp_path / "side" / "seed1", tmp_path / "lone1", step=3)


@pytest.fixture
def poisoned_seed(monkeypatch):
  """Seed index ``index``'s training batch of the ``at``-th step carries NaN images: the stacked
  batch crosses as float, the other seeds' rows normalised as the device would."""
  calls = {"n": 0, "at": None, "index": 1}
  orig = sharding.global_batch

  def global_batch(local, batch_sharding):
    if "mask" not in local and local["image"].ndim == 5:  # a stacked training batch
      calls["n"] += 1
      if calls["n"] == calls["at"]:
        image = local["image"].astype(np.float32) / np.float32(127.5) - np.float32(1.0)
        image[calls["index"]] = np.nan
        local = dict(local, image=image)
    return orig(local, batch_sharding)

  monkeypatch.setattr(sharding, "global_batch", global_batch)
  return calls


def test_a_nonfinite_seed_stops_alone_and_is_named(tmp_path, poisoned_seed, caplog):
  poisoned_seed["at"] = 3
  config = one_device(tiny_config(num_seeds=2, checkpoint_every_steps=1, keep_checkpoints=6))
  workdir = tmp_path / "run"
  with pytest.raises(NonFiniteError) as error:
    train.train_and_evaluate(config, str(workdir))
  assert str(error.value) == (  # locvit.main prints it as its one error line
    "seed1: non-finite loss or gradient norm at step 3; stopped at step 3 without saving it. "
    "Lower optimizer.lr, set grad_clip_norm, or set nonfinite='skip' to drop such updates. The "
    "other 1 of the 2 seeds trained on."
  )
  steps = lambda seed: sorted(
    int(d) for d in os.listdir(workdir / f"seed{seed}" / "checkpoints") if d.isdigit()
  )
  assert steps(1) == [1, 2]  # as the lone run of seed 1 would have stopped
  assert steps(0) == [1, 2, 3, 4, 5, 6]
  assert [s for s, _ in losses(workdir / "seed0")] == [1, 2, 3, 4, 5, 6]
  assert np.all(np.isfinite([v for _, v in losses(workdir / "seed0")]))


def test_a_nonfinite_seed_skips_alone_and_is_named(tmp_path, poisoned_seed, caplog):
  poisoned_seed["at"], poisoned_seed["index"] = 3, 0
  config = one_device(tiny_config(num_seeds=2, nonfinite="skip"))
  workdir = tmp_path / "run"
  train.train_and_evaluate(config, str(workdir))
  skipped = lambda seed: [
    r["train/skipped_steps"] for r in read_metrics(workdir / f"seed{seed}") if "train/loss" in r
  ]
  assert skipped(0) == [0, 0, 1, 1, 1, 1]
  assert skipped(1) == [0] * 6
  assert "seed0: 1 update(s) skipped by step 3" in caplog.text
  assert "seed1: 1 update(s) skipped" not in caplog.text


def impulse_config(**fields):
  """configs/structinit_cifar10_small.py:impulse3 (a structvit, the impulse solve per seed, the
  small-data recipe; ``init.seed`` refers to ``seed``) at toy size on the digits."""
  c = structinit_cifar10_small.get_config("impulse3")
  for key, value in dict(tiny_config(), total_steps=2, **fields).items():
    if key not in ("model", "init", "schedule", "optimizer"):
      c[key] = value
  c.model.overrides.update(embed_dim=32, depth=2, num_heads=2, patch_size=2)
  c.init.update(steps=100, lr=1e-2, norm_every=1)
  c.eval_every_steps, c.checkpoint_every_steps, c.schedule.warmup_steps = 2, 2, 1
  return one_device(c)


@pytest.fixture(scope="module")
def impulse_lone_runs(tmp_path_factory):
  """Seeds 0 and 1 of ``impulse_config`` trained alone."""
  root = tmp_path_factory.mktemp("impulse_lone")
  for seed in SEEDS:
    train.train_and_evaluate(impulse_config(seed=seed), str(root / f"lone{seed}"))
  return {seed: root / f"lone{seed}" for seed in SEEDS}


def restart_config(workdir):
  """The config ``python -m locvit.main --workdir=WORKDIR`` runs: the saved ``config.json``."""
  return run_config.command_line_config(["locvit", f"--workdir={workdir}"])


def saved_init_seeds(workdir):
  return [
    saved_config.read(str(workdir / f"seed{seed}" / "config.json")).init.seed for seed in SEEDS
  ]


def test_impulse_init_paper_config_at_toy_size(impulse_lone_runs, tmp_path):
  """The structured-init family side by side: each seed is its lone run, its impulse solve
  included. Restarted from its saved config alone (``--workdir``) once done, each seed keeps its
  lone run's config (``init.seed`` follows the seed)."""
  workdir = tmp_path / "side"
  train.train_and_evaluate(impulse_config(num_seeds=2), str(workdir))
  for seed in SEEDS:
    assert_same_run(workdir / f"seed{seed}", impulse_lone_runs[seed], step=2)
  assert saved_init_seeds(workdir) == list(SEEDS)
  train.train_and_evaluate(restart_config(workdir), str(workdir))  # resumes at its last step
  assert saved_init_seeds(workdir) == list(SEEDS)


def test_a_side_by_side_run_killed_before_its_first_checkpoint_restarts_exactly(
  impulse_lone_runs, tmp_path, monkeypatch
):
  """Killed once every config is written, before any checkpoint (as kill -9 at the first step),
  then restarted with ``--workdir`` alone: each seed initialises as its lone run (its own
  ``init.seed``, so its own impulse solve), and its config is the one the first command gave it."""
  workdir = tmp_path / "side"

  def killed(*args):
    raise KeyboardInterrupt  # nothing in the loop runs: no step, no checkpoint

  with monkeypatch.context() as patch:
    patch.setattr(train, "train_loop", killed)
    with pytest.raises(KeyboardInterrupt):
      train.train_and_evaluate(impulse_config(num_seeds=2), str(workdir))
  assert not (workdir / "seed1" / "checkpoints" / "2").exists()
  first = {seed: saved_config.read(str(workdir / f"seed{seed}" / "config.json")) for seed in SEEDS}

  config = restart_config(workdir)
  for seed in SEEDS:
    assert seeds_lib.seed_config(config, seed).to_dict() == first[seed].to_dict()
  train.train_and_evaluate(config, str(workdir))
  for seed in SEEDS:
    assert_same_run(workdir / f"seed{seed}", impulse_lone_runs[seed], step=2)
  assert saved_init_seeds(workdir) == list(SEEDS)


# ------------------------------------------------------------------------------------------------
# Bad input


def test_a_field_computed_from_the_seed_is_refused_side_by_side(tmp_path):
  """config.json keeps a field computed from the seed as its value: a restart could not rebuild
  it, so the run is refused before anything is created."""
  config = impulse_config(num_seeds=2)
  config.init.seed = config.get_ref("seed") + 100
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert str(error.value) == (
    f"--config.num_seeds=2: init.seed is computed from the seed (101 for seed 1), and "
    f"{tmp_path}/run/config.json would keep it as the value 100, so a restart would not rebuild "
    "it: make it the seed itself (get_ref('seed')) or a fixed value, or train each seed as a run "
    "of its own (--config.seed=1 --config.num_seeds=1)"
  )
  assert not (tmp_path / "run").exists()


def test_a_config_json_that_lost_the_seeds_reference_is_refused_with_the_way_out(tmp_path):
  """A WORKDIR/config.json saved before references were (init.seed the value 0): the restart with
  --workdir alone would give seed 1 seed 0's init.seed, so it is refused, naming the field and the
  way out; the seeds' workdirs stay as they were."""
  workdir = tmp_path / "run"
  config = impulse_config(num_seeds=2)
  for seed in SEEDS:
    (workdir / f"seed{seed}").mkdir(parents=True)
    saved_config.write(str(workdir / f"seed{seed}"), seeds_lib.seed_config(config, seed))
  record = saved_config.record(config)
  del record["references"]
  saved_config.path(str(workdir)).write_text(json.dumps(record))
  kept = {seed: (workdir / f"seed{seed}" / "config.json").read_text() for seed in SEEDS}
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(restart_config(workdir), str(workdir))
  assert str(error.value) == (
    f"init.seed follows the seed in each seed's config.json ({workdir}/seed1/config.json: "
    f"init.seed=1), but this restart gives seed 1 init.seed=0 (as a {workdir}/config.json saved "
    "by an earlier locvit does, which kept the value alone): restart with the original --config "
    f"and its overrides, or finish each seed alone with --workdir={workdir}/seed1 (and the "
    "others' seed<K>)"
  )
  assert sorted(os.listdir(workdir)) == ["config.json", "seed0", "seed1"]
  for seed in SEEDS:
    assert os.listdir(workdir / f"seed{seed}") == ["config.json"]
    assert (workdir / f"seed{seed}" / "config.json").read_text() == kept[seed]


def test_num_seeds_below_one_is_one_line_before_anything(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "locvit.main",
      "--config=tests/configs/tiny.py",
      f"--workdir={workdir}",
      "--config.num_seeds=0",
    ],
    cwd=ROOT,
    env=_env(1),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert (proc.returncode, proc.stderr.splitlines()) == (
    2,
    ["locvit: error: --config.num_seeds=0: must be a positive integer"],
  )
  assert not workdir.exists()


def test_seeds_that_do_not_fit_the_device_are_refused_before_the_workdir(tmp_path, monkeypatch):
  monkeypatch.setattr(seeds_lib, "device_memory_bytes", lambda device: 3 * 2**20)
  config = one_device(tiny_config(num_seeds=200))
  per_seed = seeds_lib.state_bytes_per_device(_layout_of(config).abstract)
  with pytest.raises(ValueError, match=r"^--config.num_seeds=200: the 200 training states") as e:
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert f"at most {3 * 2**20 // per_seed} fit before activations" in str(e.value)
  assert not (tmp_path / "run").exists()


def _layout_of(config):
  return bundle.checked_setup(config, {}).layout


def test_seeds_side_by_side_refuse_several_processes(tmp_path, monkeypatch):
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(ValueError, match=r"^--config.num_seeds=2 runs in one process, but this"):
    train.train_and_evaluate(one_device(tiny_config(num_seeds=2)), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
