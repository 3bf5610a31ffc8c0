"""``configs/transfer.py``: every selection resolves and passes the run's checks, holds DeiT's
transfer recipe (deit#45), and a bad selection is one ``locvit: error:`` line."""

import itertools

import pytest

from locvit import main, optim
from locvit.configs import datasets, transfer
from tests.test_cli_output import run_main

SELECTIONS = [
  (model, dataset, size, prior)
  for model, dataset, size, prior in itertools.product(
    transfer.MODELS, transfer.DATASETS, transfer.SIZES, transfer.PRIORS
  )
  if f"{model},{prior}" in transfer.PAIRS["model,prior"]
]


def test_every_selection_resolves_and_validates(tmp_path):
  assert len(SELECTIONS) == 6 * 3 * 2 + 3 * 3 * 2 * 3
  for model, dataset, size, prior in SELECTIONS:
    config = transfer.get_config(f"{model},{dataset},{size},{prior}")
    if dataset == "folder":
      config = datasets.apply_data_flag(config, f"image_folder:{tmp_path}")
    main.check_config(config)
    assert config.model.name == transfer.MODELS[model] and config.data.image_size == size
    expected = {"cifar10": 10, "cifar100": 100, "folder": None}[dataset]
    assert config.data.num_classes == expected, (model, dataset)
    assert config.init_from.weights == f"{transfer.MODELS[model]}.fb_in1k"
    assert config.init_from.add_prior == (prior != "none")
    assert config.model.overrides.get("class_token_layer", 0) == (10 if prior == "gpsa" else 0)


def test_a_prior_goes_on_a_deit_only():
  with pytest.raises(ValueError, match=r"unknown model,prior 'convit_small,gmm' for transfer\.py"):
    transfer.get_config("convit_small,cifar10,224,gmm")
  layers = transfer.get_config("deit_base,cifar10,224,gpsa").model.overrides.layer_attention
  assert layers == ("gpsa",) * 10 + ("mhsa",) * 2


def test_the_recipe_is_deits_transfer_recipe():
  c = transfer.get_config("deit_base,cifar100,384")
  assert (c.optimizer.name, c.optimizer.momentum, c.optimizer.nesterov) == ("sgd", 0.9, True)
  assert (c.optimizer.lr, c.batch_size, c.optimizer.weight_decay) == (0.01, 768, 1e-4)
  assert optim.peak_learning_rate(c) == pytest.approx(0.015)  # main.py's --lr x batch / 512
  assert c.num_epochs == 1000 and c.schedule.warmup_epochs == 5
  assert c.model.overrides.drop_path_rate == 0.0 and c.random_erasing.prob == 0.0
  assert (c.mixup.mixup_alpha, c.mixup.cutmix_alpha, c.label_smoothing) == (0.8, 1.0, 0.1)
  assert (c.data.interpolation, c.data.eval_crop_pct) == ("bicubic", 0.875)
  assert c.data.auto_augment == "rand-m9-mstd0.5-inc1" and c.data.repeated_augmentations == 3


@pytest.mark.parametrize(
  "arg, line",
  [
    (
      "convit_tiny,cifar10,256",
      "--config=transfer:convit_tiny,cifar10,256: unknown image size 256 for transfer.py; "
      "choices: 224, 384",
    ),
    (
      "deit_tiny,cifar10,224,elm --config.init_from.weights=",
      "init_from.add_prior=True adds a locality prior to pretrained weights: give "
      "init_from.weights of a plain DeiT (e.g. deit_tiny_patch16_224.fb_in1k)",
    ),
    (
      "deit_tiny,folder",
      "data.root=None must be set when source='image_folder': give --data=image_folder:DIR",
    ),
  ],
)
def test_a_bad_selection_is_one_error_line(tmp_path, arg, line):
  arg, *flags = arg.split(" ")
  code, out, err = run_main("--print_config", f"--config=transfer:{arg}", *flags)
  assert (code, out, err) == (2, "", f"locvit: error: {line}\n")
