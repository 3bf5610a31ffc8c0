"""data.num_workers: training batches built in grain worker processes, batch for batch the same
as in-process, stopped cleanly when the run ends or is preempted."""

import numpy as np
from PIL import Image

from locvit import train
from locvit.data import default_data_config, make_source, make_train_iterator
from locvit.metrics import read_metrics
from tests.train_utils import sigterm_after_step, tiny_config


def write_folder(root):
  rng = np.random.default_rng(0)
  for k in range(12):
    folder = root / "train" / "ab"[k % 2]
    folder.mkdir(parents=True, exist_ok=True)
    pixels = rng.integers(0, 256, (int(rng.integers(20, 40)), 30, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / f"{k}.png")
  return root


def test_worker_processes_send_the_in_process_batches(tmp_path):
  """Two workers, DeiT's host RandAugment and the device crop's boxes: every key of every batch
  equal, from a resumed position (start_step) on."""
  cfg = default_data_config()
  cfg.update(
    dict(
      source="image_folder",
      root=str(write_folder(tmp_path)),
      image_size=16,
      train_augment="rrc_flip",
      auto_augment="rand-m9-mstd0.5-inc1",
      augment_on="device",
      num_threads=1,
      prefetch=1,
    )
  )
  source = make_source(cfg, "train")
  batches = {}
  for workers in (0, 2):
    cfg.num_workers = workers
    it = make_train_iterator(cfg, source, seed=3, local_batch_size=4, start_step=2)
    batches[workers] = [next(it) for _ in range(5)]
    it.close()
  assert set(batches[2][0]) == {"image", "resize_taps", "resize_transposed", "label"}
  for ours, theirs in zip(batches[0], batches[2], strict=True):
    for key in ours:
      np.testing.assert_array_equal(ours[key], theirs[key])


def test_a_run_with_workers_resumes_bitwise_after_sigterm(tmp_path, capfd):
  config = tiny_config(total_steps=4)
  config.mesh.num_devices, config.mesh.shape = 1, (1, 1)
  config.data.num_workers, config.data.num_threads = 2, 1
  full_dir, resumed_dir = str(tmp_path / "full"), str(tmp_path / "resumed")
  train.train_and_evaluate(config, full_dir)
  with sigterm_after_step(2):
    assert train.train_and_evaluate(config, resumed_dir)["preempted"]
  train.train_and_evaluate(config, resumed_dir)
  losses = [
    [r["train/loss"] for r in read_metrics(d) if "train/loss" in r] for d in (full_dir, resumed_dir)
  ]
  assert losses[0] == losses[1] and len(losses[0]) >= 2
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Exception ignored" not in err and "leaked" not in err, err
