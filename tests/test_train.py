"""The training system: sharding layouts, resume, evaluation and bad input."""

import os
import signal
import struct

import flax.linen as nn
import jax
import numpy as np
import pytest

from locvit import train
from locvit.metrics import read_metrics
from locvit.models.factory import build_model
from locvit.platform import sharding
from locvit.run import cadence, checks, evaluation
from locvit.run.state import state_shardings
from tests.train_utils import sigterm_after_step, tiny_config


@pytest.fixture(scope="module")
def single_device_run(tmp_path_factory):
  """The reference: the tiny config trained on one device."""
  workdir = tmp_path_factory.mktemp("one_device")
  config = tiny_config()
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  return workdir, train.train_and_evaluate(config, str(workdir))


def _losses(workdir):
  return [r["train/loss"] for r in read_metrics(workdir) if "train/loss" in r]


def test_eight_fake_devices():
  assert jax.device_count() == 8


@pytest.mark.parametrize(
  "shape,layout", [((8, 1), "dp"), ((4, 2), "tp"), ((8, 1), "fsdp"), ((4, 2), "fsdp")]
)
def test_mesh_layouts_match_single_device(tmp_path, single_device_run, shape, layout):
  one_dir, ref = single_device_run
  config = tiny_config()
  config.mesh.shape, config.mesh.layout = shape, layout
  out = train.train_and_evaluate(config, str(tmp_path / "many"))
  np.testing.assert_allclose(_losses(tmp_path / "many"), _losses(one_dir), rtol=2e-5)
  assert out["eval/top1"] == pytest.approx(ref["eval/top1"], abs=1 / ref["eval/num_examples"])


def _param_specs(layout, shape):
  config = tiny_config()
  config.mesh.shape, config.mesh.layout = shape, layout
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  model = build_model(config, 10)
  boxed, _ = sharding.model_variable_shapes(model, (8, 8, 1))
  shardings = sharding.tree_shardings(boxed, mesh, rules)
  return jax.tree.map(lambda s: s.spec, shardings, is_leaf=lambda x: hasattr(x, "spec"))


def test_layouts_shard_parameters_as_configured():
  dp = _param_specs("dp", (8, 1))
  assert all(
    all(a is None for a in spec)
    for spec in jax.tree.leaves(dp, is_leaf=lambda x: isinstance(x, tuple))
  )
  fsdp = _param_specs("fsdp", (8, 1))
  assert tuple(fsdp["blocks_0"]["mlp"]["fc1"]["kernel"]) == ("data", None)  # embed=32 over 8
  assert fsdp["blocks_0"]["attn"]["qkv"]["kernel"][0] == "data"
  tp = _param_specs("tp", (4, 2))
  assert tuple(tp["blocks_0"]["mlp"]["fc1"]["kernel"]) == (None, "model")
  assert tuple(tp["blocks_0"]["mlp"]["fc2"]["kernel"]) == ("model", None)
  assert tuple(tp["blocks_0"]["attn"]["qkv"]["kernel"]) == (None, None, "model", None)
  assert tuple(tp["blocks_0"]["attn"]["proj"]["kernel"]) == ("model", None, None)


def test_optimizer_state_sharded_like_parameters():
  from locvit import optim

  config = tiny_config(freeze=("blocks_0/",))
  config.mesh.layout = "fsdp"
  mesh, rules = sharding.make_mesh(config.mesh), sharding.logical_rules(config.mesh)
  boxed, _ = sharding.model_variable_shapes(build_model(config, 10), (8, 8, 1))
  params = nn.meta.unbox(boxed)
  tx = optim.make_optimizer(config, params, optim.make_schedule(config, 6, 1))
  shardings = state_shardings(boxed, tx, mesh, rules)
  specs = [
    (jax.tree_util.keystr(path), tuple(s.spec))
    for path, s in jax.tree_util.tree_flatten_with_path(shardings.opt_state)[0]
  ]
  mu_fc1 = [
    spec for path, spec in specs if "mu" in path and "blocks_1']['mlp']['fc1']['kernel" in path
  ]
  assert mu_fc1 == [("data", None)], specs
  assert all(spec == () for path, spec in specs if "count" in path)


def test_fsdp_leaves_indivisible_dims_unsharded():
  config = tiny_config()
  config.mesh.layout = "fsdp"
  mesh = sharding.make_mesh(config.mesh)
  spec = sharding._fit_spec(jax.sharding.PartitionSpec("data", None), (10, 4), mesh)
  assert tuple(spec) == (None, None)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_resume_reproduces_uninterrupted_run(tmp_path, single_device_run, signum):
  """SIGTERM (or a Ctrl-C) during step 3 -> checkpoint after step 4 -> resume: bitwise the same
  run."""
  full_dir, full = single_device_run
  config = tiny_config()
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  workdir = str(tmp_path / "split")
  with sigterm_after_step(3, signum):
    first = train.train_and_evaluate(config, workdir)
  # The flag is read between steps: the step in flight completes and is checkpointed.
  assert first == {"preempted": True, "step": 4}
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
  assert [r["step"] for r in read_metrics(workdir)] == [1, 2, 3, 4]
  second = train.train_and_evaluate(config, workdir)
  assert _losses(workdir) == _losses(full_dir)  # bitwise
  assert second["eval/top1"] == full["eval/top1"]
  assert second["eval/loss"] == full["eval/loss"]


def test_a_resumed_run_logs_the_rows_of_the_uninterrupted_run(tmp_path, single_device_run, capsys):
  """Logging every 2 steps, stopped after step 2 and resumed at step 3: the rows are those of the
  uninterrupted run (one loss curve, no extra point one step after the resume); step 3 still
  prints its progress line, with its compilation time."""
  full_dir, _ = single_device_run
  config = tiny_config(log_every_steps=2)
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  workdir = str(tmp_path / "split")
  with sigterm_after_step(1):
    assert train.train_and_evaluate(config, workdir) == {"preempted": True, "step": 2}
  train.train_and_evaluate(config, workdir)
  full = {r["step"]: r["train/loss"] for r in read_metrics(full_dir)}  # logged every step
  rows = [(r["step"], r["train/loss"]) for r in read_metrics(workdir) if "train/loss" in r]
  assert rows == [(step, full[step]) for step in (1, 2, 4, 6)]
  assert "step 3/6  loss " in capsys.readouterr().out


def test_a_dispatch_ends_at_every_log_save_and_eval_step():
  """K = 2 steps per dispatch: one step where a host step (first, log, save, last) falls inside."""
  config = tiny_config(log_every_steps=3, checkpoint_every_steps=4, steps_per_dispatch=2)

  def ends(start, total=6):
    done, out = start, []
    while done < total:
      done = cadence.dispatch_end(config, done, start, total)
      out.append(done)
    return out

  assert ends(0) == [1, 3, 4, 6] and ends(3) == [4, 6] and ends(4) == [5, 6]
  assert "--config.steps_per_dispatch=0: must be a positive integer" in checks.config_errors(
    tiny_config(steps_per_dispatch=0)
  )


def test_steps_per_dispatch_reproduces_single_steps_through_a_stop(tmp_path, single_device_run):
  """Two steps per dispatch (dispatches [1], [2, 3]; SIGTERM; resumed from 3: [4], [5, 6]): every
  logged row, the checkpoint at 4 and the final evaluation as one step per dispatch, bitwise."""
  full_dir, full = single_device_run
  config = tiny_config(log_every_steps=3, checkpoint_every_steps=4, steps_per_dispatch=2)
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  workdir = str(tmp_path)
  with sigterm_after_step(1):
    first = train.train_and_evaluate(config, workdir)
  assert first == {"preempted": True, "step": 3}  # the dispatch in flight completes
  second = train.train_and_evaluate(config, workdir)
  assert os.path.isdir(os.path.join(workdir, "checkpoints", "4"))
  single = {r["step"]: r for r in read_metrics(full_dir) if "train/loss" in r}
  rows = [r for r in read_metrics(workdir) if "train/loss" in r]
  assert [r["step"] for r in rows] == [1, 3, 6]  # the rows of an uninterrupted run
  for row in rows:
    assert {k: v for k, v in row.items() if k.startswith("train/")} == {
      k: v for k, v in single[row["step"]].items() if k.startswith("train/")
    }
  assert (second["eval/top1"], second["eval/loss"]) == (full["eval/top1"], full["eval/loss"])


def test_eval_only_mode_matches_final_evaluation(tmp_path):
  config = tiny_config()
  final = train.train_and_evaluate(config, str(tmp_path))
  config.eval_batch_size = 24
  again = evaluation.evaluate_checkpoint(config, str(tmp_path))
  assert again["eval/num_examples"] == final["eval/num_examples"]
  assert again["eval/top1"] == pytest.approx(final["eval/top1"])
  assert again["step"] == config.total_steps


@pytest.mark.parametrize("batch", [8, 40, 64, 360])
def test_evaluation_counts_every_example_once(tmp_path, batch):
  from locvit import data as data_lib

  config = tiny_config()
  source = data_lib.make_source(config.data, "test")
  mesh = sharding.make_mesh(config.mesh)
  rules = sharding.logical_rules(config.mesh)
  batches = data_lib.make_eval_iterator(config.data, source, local_batch_size=batch)
  # A step function that counts label occurrences reveals duplicates and drops exactly.
  seen = np.zeros(10)

  def counting_step(params, b):
    labels, mask = jax.device_get((b["label"], b["mask"]))
    np.add.at(seen, labels[mask], 1)
    return {"top1": 0.0, "top5": 0.0, "loss": 0.0, "count": float(mask.sum())}

  with jax.set_mesh(mesh):
    result = evaluation.evaluate(counting_step, None, batches, sharding.batch_sharding(mesh, rules))
  assert result["eval/num_examples"] == len(source)
  np.testing.assert_array_equal(seen, np.bincount(source.labels, minlength=10))


def test_gradient_accumulation_matches_full_batch(tmp_path):
  base = tiny_config()
  base.model.overrides.drop_path_rate = 0.0
  base.model.overrides.drop_rate = 0.0
  train.train_and_evaluate(base, str(tmp_path / "full"))
  accum = tiny_config(grad_accum_steps=2)
  accum.model.overrides.drop_path_rate = 0.0
  accum.model.overrides.drop_rate = 0.0
  train.train_and_evaluate(accum, str(tmp_path / "accum"))
  np.testing.assert_allclose(_losses(tmp_path / "accum"), _losses(tmp_path / "full"), rtol=1e-5)


def test_metrics_jsonl_and_tensorboard(tmp_path):
  train.train_and_evaluate(tiny_config(), str(tmp_path))
  records = read_metrics(tmp_path)
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  for key in ("train/loss", "train/lr", "perf/images_per_sec"):
    assert key in records[0]
  last = records[-1]
  assert 0.0 <= last["eval/top5"] <= 1.0 and 0.0 <= last["eval/top1"] <= last["eval/top5"]
  (event_file,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  events = _tfrecords(event_file.read_bytes())
  assert events[0].file_version == "brain.Event:2"
  logged = {(e.step, v.tag): v.simple_value for e in events[1:] for v in e.summary.value}
  for record in records:
    for key, value in record.items():
      if key != "step":
        assert logged[record["step"], key] == pytest.approx(value, rel=1e-6), key


def _tfrecords(data: bytes) -> list:
  """The Event protos of a TensorBoard file: TFRecords of length (u64), crc, payload, crc."""
  from tensorboardX.proto.event_pb2 import Event

  events, offset = [], 0
  while offset < len(data):
    (length,) = struct.unpack_from("<Q", data, offset)
    events.append(Event.FromString(data[offset + 12 : offset + 12 + length]))
    offset += 12 + length + 4
  return events


# ------------------------------------------------------------------------------------------------
# Bad input: each fails with a clear message before anything is compiled.


def _fails(config, tmp_path, *fragments):
  with pytest.raises(ValueError) as info:
    train.train_and_evaluate(config, str(tmp_path))
  for fragment in fragments:
    assert fragment in str(info.value), str(info.value)


def test_unknown_model_names_its_close_matches_only(tmp_path):
  config = tiny_config()
  config.model.name = "deit_tinny_patch2_32"
  _fails(config, tmp_path, "unknown model 'deit_tinny_patch2_32'; did you mean deit_tiny_patch2_32")


def test_unknown_dataset_lists_choices(tmp_path):
  config = tiny_config()
  config.data.source = "imgfolder"
  _fails(config, tmp_path, "imgfolder", "image_folder")


def test_image_size_not_divisible_by_patch(tmp_path):
  config = tiny_config()
  config.model.overrides.patch_size = 3
  _fails(config, tmp_path, "not divisible by patch_size=3")


def test_batch_not_divisible_by_devices_names_the_nearest_sizes_on_both_sides(tmp_path):
  mesh = "mesh {'data': 8, 'model': 1}"
  line = f"batch_size=100 is not divisible by the 8 data-parallel devices of {mesh}."
  _fails(tiny_config(batch_size=100), tmp_path, f"{line} Valid values near it: [88, 96, 104, 112].")
  _fails(tiny_config(batch_size=4), tmp_path, "batch_size=4", "Valid values near it: [8, 16].")


def test_a_batch_larger_than_the_dataset_is_refused_before_the_workdir_exists(tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(tiny_config(batch_size=2048), str(workdir))
  assert str(error.value).startswith("batch_size=2048 is larger than the 1437 training examples")
  assert "use --config.batch_size of at most 1437" in str(error.value)
  assert not workdir.exists()


@pytest.mark.parametrize(
  "field, value, choices, close",
  [
    ("optimizer.name", "adamm", "['adamw', 'sgd']", "adamw"),
    ("schedule.name", "cosin", "['cosine', 'step', 'constant']", "cosine"),
    ("mesh.layout", "fsdb", "['dp', 'fsdp', 'tp']", "fsdp"),
  ],
)
def test_a_mistyped_choice_names_its_close_match_before_the_workdir_exists(
  tmp_path, field, value, choices, close
):
  config = tiny_config()
  block, name = field.split(".")
  config[block][name] = value
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert str(error.value) == f"{field}={value!r} is not one of {choices}; did you mean {close}?"
  assert not (tmp_path / "run").exists()


def test_mesh_not_matching_devices(tmp_path):
  config = tiny_config()
  config.mesh.shape = (3, 2)
  _fails(config, tmp_path, "needs 6 devices but 8", "(4, 2)")


def test_incompatible_checkpoint_in_workdir(tmp_path):
  train.train_and_evaluate(tiny_config(), str(tmp_path))
  config = tiny_config(total_steps=8)
  config.model.overrides.embed_dim = 64
  _fails(config, tmp_path, "incompatible config", "model")


def test_misspelled_config_field_names_valid_ones(tmp_path):
  config = tiny_config()
  config.lock()
  with pytest.raises(AttributeError, match='Did you mean "batch_size"'):
    config.bach_size = 4


def test_train_params_with_unknown_freeze_pattern(tmp_path):
  """Refused before the workdir exists (was: after it, leaving DIR/checkpoints behind)."""
  config = tiny_config(freeze=("pos_embedd",))
  fragment = "freeze patterns ['pos_embedd'] match no parameter; did you mean pos_embed? Examples "
  _fails(config, tmp_path / "run", fragment + "of paths: ['blocks_0/attn/proj/bias', ")
  assert not (tmp_path / "run").exists()


def test_config_init_is_applied_to_a_fresh_run(tmp_path):
  """config.init (here: impulse) writes the solved q/k kernels before the first step."""
  import orbax.checkpoint as ocp

  from locvit.init import apply_init, init_config

  config = tiny_config(total_steps=1, checkpoint_every_steps=1)
  config.model.overrides.pool = "gap"
  config.init = init_config("impulse", steps=30, lr=1e-2, norm_every=1, base="keep", cache_dir="")
  config.optimizer.lr, config.schedule.warmup_init_lr = 0.0, 0.0  # step 1 leaves params as is
  config.optimizer.weight_decay = 0.0
  train.train_and_evaluate(config, str(tmp_path))
  ckpt = train.checkpoint.Checkpointer(str(tmp_path / "checkpoints"), async_save=False)
  saved = ckpt.manager.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  ckpt.close()
  model = build_model(config, 10)
  fresh, _ = sharding.init_model_variables(model, (8, 8, 1), jax.random.key(config.seed + 1))
  fresh = nn.meta.unbox(fresh)
  expected = apply_init(config.init, fresh, model, 8)
  np.testing.assert_allclose(
    saved["state"]["params"]["blocks_1"]["attn"]["qkv"]["kernel"],
    expected["blocks_1"]["attn"]["qkv"]["kernel"],
    atol=1e-4,  # the solver ran twice; float reassociation differs slightly
  )
  assert not np.allclose(
    expected["blocks_1"]["attn"]["qkv"]["kernel"], fresh["blocks_1"]["attn"]["qkv"]["kernel"]
  )
