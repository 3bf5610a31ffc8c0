"""Data is chosen in one place for every config (configs/datasets.py): ``$CIFAR10_ROOT`` and the
other variables, or ``--data``, switch any paper config to an image folder with its class count and
normalisation kept; a missing TFDS dataset names both ways; image folders take TFDS's split
slices, as class-stratified subsets that are the same on any number of processes."""

import collections
import hashlib
import importlib
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from locvit import data as D
from locvit.configs import datasets, gmm_table1
from locvit.configs.common import base_config
from locvit.data.sources import ImageFolderSource, split_slice
from locvit.run import config as run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def image_folder(root, counts: dict[str, dict[str, int]], side: int = 8):
  """ROOT/<split>/<class>/NNN.png with counts[split][class] distinct images (pixel = index)."""
  for split, classes in counts.items():
    for label, (name, n) in enumerate(classes.items()):
      (root / split / name).mkdir(parents=True)
      for i in range(n):
        pixels = np.full((side, side, 3), (label * 40 + i) % 256, np.uint8)
        pixels[0, 0] = (label, i, 7)
        Image.fromarray(pixels).save(root / split / name / f"{i:03d}.png")
  return root


def folder_config(root, **fields):
  c = base_config().data
  c.source, c.root, c.image_size, c.train_augment = "image_folder", str(root), 8, "none"
  c.update(fields)
  return c


# ------------------------------------------------------------------------------------------------
# One place: the variables and --data


@pytest.mark.parametrize(
  "module, arg, env",
  [
    ("gmm_table1", "vit,cifar10,gmm", "CIFAR10_ROOT"),
    ("gmm_table1", "vit,cifar100,gmm", "CIFAR100_ROOT"),
    ("gmm_table1", "vit,svhn,gmm", "SVHN_ROOT"),
    ("gmm_table1", "vit,tinyimagenet,gmm", "TINYIMAGENET_ROOT"),
    ("cifar10_deit", None, "CIFAR10_ROOT"),
    ("cordonnier_cifar10", None, "CIFAR10_ROOT"),
    ("convit_cifar100", None, "CIFAR100_ROOT"),
    ("structinit_datasets", "svhn", "SVHN_ROOT"),
    ("structinit_models", None, "CIFAR100_ROOT"),
    ("convit_s", None, "IMAGENET_ROOT"),
  ],
)
def test_a_variable_or_data_flag_reads_an_image_folder(monkeypatch, module, arg, env):
  get_config = importlib.import_module(f"locvit.configs.{module}").get_config
  args = [arg] if arg else []
  from_tfds = get_config(*args)
  monkeypatch.setenv(env, "/data/folder")
  from_env = get_config(*args)
  from_flag = datasets.apply_data_flag(from_tfds, "image_folder:/data/folder")
  assert from_env.to_dict() == from_flag.to_dict()
  assert datasets.apply_data_flag(from_tfds, "/data/folder").to_dict() == from_flag.to_dict()
  dataset = datasets.find(from_tfds.data.name)
  assert (from_flag.data.source, from_flag.data.root) == ("image_folder", "/data/folder")
  assert (from_flag.data.train_split, from_flag.data.eval_split) == dataset.folder_splits
  assert from_flag.data.num_classes == dataset.num_classes
  # Everything but where the data is read from stays: the paper's normalisation, size, recipe.
  changed = {"source", "root", "train_split", "eval_split"}
  for field in from_tfds.data:
    if field not in changed:
      assert from_flag.data[field] == from_tfds.data[field], field
  assert {k: v for k, v in from_flag.to_dict().items() if k != "data"} == {
    k: v for k, v in from_tfds.to_dict().items() if k != "data"
  }
  if dataset.tfds:  # and back: --data=tfds reads TFDS even when the variable is set
    back = datasets.apply_data_flag(from_env, "tfds:/tfds")
    assert back.data.to_dict() == dict(from_tfds.data.to_dict(), data_dir="/tfds")


def test_data_flag_keeps_a_split_slice_and_refuses_an_empty_folder_or_a_misspelt_source():
  config = gmm_table1.get_config("vit,cifar10,gmm")
  config.data.eval_split = "test[:500]"
  assert datasets.apply_data_flag(config, "/d").data.eval_split == "test[:500]"
  with pytest.raises(ValueError, match=r"^--data=image_folder needs its folder: "):
    datasets.apply_data_flag(config, "image_folder")
  with pytest.raises(ValueError) as typo:  # was read as a folder named 'tfsd:/data'
    datasets.apply_data_flag(config, "tfsd:/data")
  assert str(typo.value) == (
    "--data=tfsd:/data: 'tfsd' is not a source; did you mean tfds? Give "
    "--data=image_folder:DIR, --data=DIR or --data=tfds[:DATA_DIR]"
  )


def test_a_relative_folder_is_saved_absolute(tmp_path, monkeypatch):
  """Was 'audit-data/c10' in the run's config.json: --mode=eval / analyze from another directory
  stopped with 'image folder root ... does not exist'. The loader makes the folders absolute, in
  one place (``run.config.with_absolute_paths``); a get_config() keeps them as given."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("CIFAR10_ROOT", "cifar")
  name = "gmm_table1:vit,cifar10,gmm"
  assert gmm_table1.get_config("vit,cifar10,gmm").data.root == "cifar"  # plain data
  assert run_config.load(name).data.root == str(tmp_path / "cifar")
  loaded = lambda *flags: run_config.command_line_config(["locvit", f"--config={name}", *flags])
  assert loaded().data.root == str(tmp_path / "cifar")
  assert loaded("--data=mine/c10").data.root == str(tmp_path / "mine" / "c10")
  assert loaded("--config.data.root=mine/c10").data.root == str(tmp_path / "mine" / "c10")
  assert loaded("--data=tfds:tf").data.data_dir == str(tmp_path / "tf")
  assert loaded("--data=gs://bucket/c10").data.root == "gs://bucket/c10"


def test_a_missing_tfds_dataset_names_both_ways(tmp_path, caplog):
  with pytest.raises(D.DatasetNotPreparedError) as e:
    D.TfdsSource("cifar10", "train", str(tmp_path))
  warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert warnings == []  # was TFDS's "Variant folder ... has no dataset_info.json" first
  assert f"tfds build cifar10 --data_dir={tmp_path} --file_format=array_record" in str(e.value)
  assert str(e.value).splitlines()[-1] == (
    "Or read an image folder DIR/train/<class>/*.jpg, DIR/test/<class>/*.jpg instead with "
    "--data=image_folder:DIR (or export CIFAR10_ROOT=DIR); `python -m locvit.data.prepare cifar10 "
    "--out=DIR` writes DIR."
  )


def test_gmm_table1_trains_from_the_image_folder_in_cifar10_root(monkeypatch, tmp_path):
  from locvit import train

  split = {f"c{i}": 2 for i in range(10)}
  root = image_folder(tmp_path / "cifar", {"train": split, "test": split}, side=32)
  monkeypatch.setenv("CIFAR10_ROOT", str(root))
  config = gmm_table1.get_config("vit,cifar10,gmm")  # as --config=gmm_table1:vit,cifar10,gmm
  config.model.overrides.update(depth=1, layer_attention=("gmm",), embed_dim=32, num_heads=2)
  config.total_steps, config.batch_size, config.data.eval_split = 2, 8, "test[:8]"
  result = train.train_and_evaluate(config, str(tmp_path / "run"))
  saved = json.loads((tmp_path / "run" / "config.json").read_text())["config"]["data"]
  assert (saved["source"], saved["root"], saved["num_classes"]) == ("image_folder", str(root), 10)
  assert saved["mean"] == list(gmm_table1.get_config().data.mean)  # the paper's normalisation
  metrics = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert (json.loads(metrics[-1])["step"], result["eval/num_examples"]) == (2, 8)


def test_a_folder_of_one_class_is_refused_before_the_workdir(tmp_path):
  """A one-class folder trained to loss 0 and top-1 1.0 (one logit), or a 10-way head on one
  label: refused, naming the folder and its class."""
  from locvit import train

  root = image_folder(tmp_path / "cats", {"train": {"cat": 4}, "test": {"cat": 2}})
  config = datasets.apply_data_flag(gmm_table1.get_config("vit,cifar10,gmm"), str(root))
  config.batch_size = 4
  with pytest.raises(ValueError) as refused:
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert str(refused.value) == (
    f"{root} has one class in 'train' (cat): a classifier needs at least 2, one folder per "
    "class: ROOT/<split>/<class_name>/*.jpg"
  )
  assert not (tmp_path / "run").exists()


def test_a_folder_of_fewer_classes_than_the_config_is_named_in_one_warning(tmp_path, caplog):
  """A paper config on a 3-class folder trained a 10-way head unannounced (top-5 of 3 classes
  reported below 1)."""
  from locvit.run import bundle

  counts = {"cat": 3, "dog": 3, "ship": 3}
  root = image_folder(tmp_path / "three", {"train": counts, "test": counts})
  config = datasets.apply_data_flag(gmm_table1.get_config("vit,cifar10,gmm"), str(root))
  config.batch_size = 8
  bundle.checked_setup(config, {})  # the checks before the workdir
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == [
    f"data.num_classes=10, but {root} has 3 classes in 'train': the head's other 7 outputs are "
    "never a label, and top-5 ranks them too; --config.data.num_classes=3 fits the head to the "
    "folder"
  ]
  caplog.clear()
  config.data.num_classes = 3
  bundle.checked_setup(config, {})  # the checks before the workdir
  assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_missing_split_folder_names_its_field_and_the_folders_there(tmp_path):
  """An ImageNet-style config ('val') on a train/ + test/ folder: was the path alone."""
  counts = {"cat": 1, "dog": 1}
  root = image_folder(tmp_path / "mine", {"train": counts, "test": counts})
  with pytest.raises(FileNotFoundError) as missing:
    D.make_source(folder_config(root, eval_split="val[:50%]"), "val[:50%]")
  assert str(missing.value) == (
    f"image folder split directory '{root / 'val'}' does not exist; expected "
    "ROOT/<split>/<class_name>/*.{jpg,jpeg,png} (e.g. ROOT/train/cat/0001.jpg) "
    f"(data.eval_split='val[:50%]'; {root} holds test, train; --config.data.eval_split=test "
    "reads test/)"
  )


def test_data_flag_on_the_command_line(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  command = [sys.executable, "-m", "locvit.main", "--config=gmm_table1:vit,cifar10,gmm"]
  printed = subprocess.run(
    [*command, f"--data={tmp_path}", "--print_config"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert (printed.returncode, printed.stderr) == (0, "")
  data = json.loads(printed.stdout)["data"]
  assert (data["source"], data["root"], data["num_classes"]) == ("image_folder", str(tmp_path), 10)
  refused = subprocess.run(
    [*command, "--data=image_folder", "--print_config"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert (refused.returncode, refused.stdout) == (2, "")
  assert refused.stderr == (
    "locvit: error: --data=image_folder needs its folder: --data=image_folder:DIR\n"
  )


# ------------------------------------------------------------------------------------------------
# TFDS's split slices on image folders


def test_split_slices_select_class_stratified_subsets(tmp_path):
  root = image_folder(tmp_path, {"train": {"a": 10, "b": 6, "c": 4}})

  def subset(split):
    source = ImageFolderSource(root, split)
    names = [os.path.relpath(p, root / "train") for p in source.paths]
    return names, np.bincount(source.labels, minlength=3).tolist()

  head, counts = subset("train[:50%]")
  assert counts == [5, 3, 2]  # each class's share of the slice
  first = {"a": 5, "b": 3, "c": 2}  # each class's first files, in source order
  assert head == [f"{c}/{i:03d}.png" for c, n in first.items() for i in range(n)]
  tail, tail_counts = subset("train[50%:]")
  assert tail_counts == [5, 3, 2] and sorted(head + tail) == sorted(subset("train")[0])
  assert subset("train[:90%]")[1] == [9, 5, 4] and subset("train[90%:]")[1] == [1, 1, 0]
  assert subset("train[:5]")[1] == [3, 1, 1] and subset("train[-5:]")[1] == [2, 2, 1]
  assert subset("train[10%:]")[1] == [9, 5, 4]  # 18 of 20
  # Any run of positions holds each class in proportion (within one example).
  labels = np.repeat(np.arange(10), 1000)
  counts = np.bincount(labels[split_slice(labels, None, "500")], minlength=10)
  assert counts.tolist() == [50] * 10


def test_a_bad_split_is_refused_before_reading(tmp_path):
  with pytest.raises(ValueError) as e:
    D.validate_data_config(folder_config(tmp_path, eval_split="test[:x]"))
  assert str(e.value) == (
    "data.eval_split='test[:x]' is not a split of an image folder: NAME or NAME[START:STOP] with "
    "integers or percentages (test[:500], train[:90%])"
  )


def test_a_split_slice_is_the_same_subset_on_1_and_8_processes(tmp_path):
  root = image_folder(tmp_path, {"test": {"a": 9, "b": 5, "c": 3}})
  cfg = folder_config(root)

  def evaluated(process_count):
    seen = collections.Counter()
    for process_index in range(process_count):  # each process builds its own source
      source = D.make_source(cfg, "test[:60%]")
      batches = D.make_eval_iterator(
        cfg, source, local_batch_size=2, process_index=process_index, process_count=process_count
      )
      for batch in batches:
        for image, label, mask in zip(batch["image"], batch["label"], batch["mask"]):
          if mask:
            seen[(hashlib.sha1(np.asarray(image).tobytes()).hexdigest(), int(label))] += 1
    return seen

  one = evaluated(1)
  assert sum(one.values()) == 10 and max(one.values()) == 1  # round(0.6 * 17) = 10, each once
  assert collections.Counter(label for _, label in one) == {0: 5, 1: 3, 2: 2}
  assert evaluated(8) == one
