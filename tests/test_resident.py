"""The training split on the device (data.train_split_on='device'): the host pipeline's batches,
row for row, and the host-fed run bitwise, through K steps per dispatch, a stop and a resume; on
two processes, the losses and final evaluation of one host-fed process."""

import os
import re

import numpy as np
import pytest

from locvit import data as data_lib
from locvit import train
from locvit.data import resident
from locvit.metrics import read_metrics
from locvit.models.factory import build_model
from locvit.run.state import TrainState
from locvit.run.step import guarded_steps, initial_health
from tests.test_faults import _two_processes
from tests.train_utils import sigterm_after_step, tiny_config


def _data_config(**fields):
  cfg = data_lib.default_data_config()
  cfg.update(train_augment="crop_flip", augment_on="device", auto_augment="autoaug-cifar10")
  cfg.update(**fields)
  return cfg


@pytest.mark.parametrize("repeats", [1, 3])
def test_index_batches_name_the_rows_of_the_host_pipeline(repeats):
  cfg = _data_config(repeated_augmentations=repeats, train_split_on="device")
  source = data_lib.make_source(cfg, "train")
  split = resident.load_train_split(cfg, source)
  assert split["image"].shape == (len(source), 8, 8, 1) and split["label"].dtype == np.int32
  # Two processes of 120 rows each, from step 3 on, over the end of the 1,437-image epoch.
  for process in range(2):
    kwargs = dict(seed=5, local_batch_size=120, process_index=process, process_count=2)
    fed = data_lib.make_train_iterator(cfg, source, start_step=3, **kwargs)
    indices = data_lib.make_index_iterator(cfg, len(source), start_step=3, **kwargs)
    for _ in range(5):
      batch, index = next(fed), next(indices)["index"]
      assert index.dtype == np.int32
      np.testing.assert_array_equal(split["image"][index], batch["image"])
      np.testing.assert_array_equal(split["label"][index], batch["label"])


@pytest.fixture(scope="module")
def fed_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("fed")
  return workdir, train.train_and_evaluate(_config(), str(workdir))


def _config(**fields):
  config = tiny_config(log_every_steps=3, checkpoint_every_steps=4, **fields)
  config.data.update(train_augment="crop_flip", augment_on="device", auto_augment="autoaug-cifar10")
  return config


def test_a_run_with_the_split_on_the_device_is_the_host_fed_run_bitwise(tmp_path, fed_run):
  """On 8 devices, 2 steps per dispatch, stopped after step 1 (dispatch [2, 3] completes) and
  resumed: every row, the checkpoint at 4 and the final evaluation of the host-fed run."""
  fed_dir, fed = fed_run
  config = _config(steps_per_dispatch=2)
  config.data.train_split_on = "device"
  workdir = str(tmp_path)
  with sigterm_after_step(1):
    assert train.train_and_evaluate(config, workdir) == {"preempted": True, "step": 3}
  final = train.train_and_evaluate(config, workdir)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
  fed_rows = {r["step"]: r for r in read_metrics(fed_dir) if "train/loss" in r}
  rows = [r for r in read_metrics(workdir) if "train/loss" in r]
  assert [r["step"] for r in rows] == [1, 3, 6]
  for row in rows:
    train_metrics = {k: v for k, v in row.items() if k.startswith("train/")}
    assert train_metrics == {k: v for k, v in fed_rows[row["step"]].items() if k in train_metrics}
  assert (final["eval/top1"], final["eval/loss"]) == (fed["eval/top1"], fed["eval/loss"])


@pytest.mark.slow
def test_two_processes_with_the_split_on_the_device_are_one_host_fed_process(tmp_path):
  """2 processes x 4 devices, each holding the whole split and sending its half of each step's
  indices: the losses and the final evaluation of 1 process x 8 devices fed images by the host."""
  config = tiny_config(total_steps=4)
  config.data.update(train_augment="crop_flip", augment_on="device")
  fed = train.train_and_evaluate(config, str(tmp_path / "fed"))
  procs = _two_processes(
    tmp_path / "split",
    "--config.total_steps=4",
    "--config.data.train_augment=crop_flip",
    "--config.data.augment_on=device",
    "--config.data.train_split_on=device",
  )
  for proc in procs:
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, out[-3000:]
  losses = lambda d: {r["step"]: r["train/loss"] for r in read_metrics(d) if "train/loss" in r}
  split, expected = losses(tmp_path / "split"), losses(tmp_path / "fed")
  assert list(split) == list(expected) == [1, 2, 3, 4]
  # Measured: 1.1e-7 relative at most (float32 rounding across the two topologies).
  np.testing.assert_allclose(list(split.values()), list(expected.values()), rtol=1e-5)
  final, n = read_metrics(tmp_path / "split")[-1], fed["eval/num_examples"]
  assert final["eval/num_examples"] == n
  assert final["eval/top1"] == pytest.approx(fed["eval/top1"], abs=1.5 / n)
  assert final["eval/loss"] == pytest.approx(fed["eval/loss"], rel=1e-5)


def test_a_split_that_cannot_live_on_the_device_is_refused_before_the_workdir(tmp_path):
  config = _config()
  config.data.update(train_split_on="device", augment_on="host")
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(config, str(workdir))
  assert (
    "data.train_split_on='device' sends the step decoded images, but the host ops pad_crop, "
    "hflip, auto_augment of data.train_augment='crop_flip' draw new values each epoch; set "
    "data.augment_on='device' to run them in the train step"
  ) in str(error.value)
  config.data.update(augment_on="device", decoded_cache_mb=0)
  with pytest.raises(ValueError, match=r"^data.train_split_on='device' keeps the decoded") as error:
    train.train_and_evaluate(config, str(workdir))
  assert str(error.value).endswith(
    ": 0.1 MB for 1437 images of 8x8x1, over data.decoded_cache_mb=0; raise it, or set "
    "data.train_split_on='host'"
  )
  assert not workdir.exists()


@pytest.mark.parametrize("platform", ["tpu", "cuda"])
def test_the_step_takes_the_split_as_an_argument_when_lowered_for(platform):
  """The split reaches the accelerator's program as an argument it gathers from, not as a
  constant (154 MB of CIFAR-10 compiled into every step), and without host callbacks."""
  import functools

  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from locvit import optim
  from locvit.configs.common import complete_config
  from locvit.platform import sharding

  config = complete_config(_config())
  model = build_model(config, 10)
  init = functools.partial(sharding.init_model_variables, model, (8, 8, 1))
  params, model_state = nn.meta.unbox(jax.eval_shape(init, jax.random.key(0)))
  schedule = optim.make_schedule(config, 6, 1)
  tx = optim.make_optimizer(config, params, schedule)
  state = TrainState(jnp.int32(0), params, jax.eval_shape(tx.init, params), model_state)
  kwargs = dict(
    model=model, tx=tx, schedule=schedule, config=config, num_classes=10, platform="cpu"
  )
  step = jax.jit(functools.partial(guarded_steps, **kwargs))
  split = {"image": jnp.zeros((1437, 8, 8, 1), jnp.uint8), "label": jnp.zeros(1437, jnp.int32)}
  batches = [{"index": jnp.arange(32, dtype=jnp.int32)}]
  traced = step.trace(state, batches, (), initial_health(), split)
  text = traced.lower(lowering_platforms=(platform,)).as_text()
  signature = text[text.index("func.func public @main") :].split("{", 1)[0]
  assert "tensor<1437x8x8x1xui8>" in signature and "tensor<1437xi32>" in signature
  assert "dense<0> : tensor<1437" not in text and "callback" not in text.lower()


def test_the_loop_rate_benchmark_runs_both_sides(tmp_path):
  """benchmarks/loop_rate.py at toy sizes: the host-fed and the device-held loop, side by side."""
  import subprocess
  import sys

  from tests.test_reproduce import _tiny_cifar

  root = _tiny_cifar(tmp_path / "cifar", per_class=2)
  command = [sys.executable, "benchmarks/loop_rate.py", f"--cifar_root={root}", "--host_only"]
  command += ["--tiny", "--batch_size=8", "--steps=16", "--log_every=2"]
  out = subprocess.run(command, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  for place in ("host", "device"):
    row = rf"^{place} +1 +[\d.]+ +[\d.]+ +[\d,]+ +[\d.]+x$"  # K, start s, steps/s, img/s, ratio
    assert re.search(row, out.stdout, re.M), out.stdout


def test_a_random_resized_crop_recipe_trains_with_the_split_on_the_device(tmp_path):
  """rrc_flip: with whole images in the step, the step draws each crop box itself
  (tests/test_device_resize.py: Pillow's resize of that box, timm's box distribution)."""
  config = tiny_config(total_steps=2)
  config.data.update(train_augment="rrc_flip", augment_on="device", train_split_on="device")
  final = train.train_and_evaluate(config, str(tmp_path))
  losses = [r["train/loss"] for r in read_metrics(tmp_path) if "train/loss" in r]
  assert len(losses) == 2 and np.isfinite(losses).all() and np.isfinite(final["eval/loss"])
