"""The reduced-scale CIFAR-10 configs of docs/results.md (Cordonnier, structured init, GMM): the
variants of each experiment differ only in what is compared, and the models have the parameter
counts the write-up states (abstract shapes only, no training). About 10 s on 2 shared cores."""

from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from configs import cordonnier_cifar10_small, gmm_cifar10_small, structinit_cifar10_small
from locvit.data import validate_data_config
from locvit.init.impulse import solver_config
from locvit.models import create_model

NUM_CLASSES = 10


def flat(config) -> dict[str, object]:
  return flax.traverse_util.flatten_dict(config.to_dict(), sep=".")


def differing_fields(configs) -> set[str]:
  """Fields whose value is not the same in every config (missing counts as different)."""
  flats = [flat(c) for c in configs]
  keys = set().union(*flats)
  return {k for k in keys if len({repr(f.get(k, "<missing>")) for f in flats}) > 1}


def param_shapes(config) -> dict[str, tuple[int, ...]]:
  model = create_model(config.model.name, NUM_CLASSES, **config.model.overrides.to_dict())
  variables = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3), jnp.float32))
  )
  params = flax.traverse_util.flatten_dict(nn.meta.unbox(variables["params"]), sep="/")
  return {k: tuple(v.shape) for k, v in params.items()}


def count(shapes: dict[str, tuple[int, ...]]) -> int:
  total = 0
  for shape in shapes.values():
    size = 1
    for dim in shape:
      size *= dim
    total += size
  return total


@pytest.fixture(autouse=True)
def cifar_root(monkeypatch):
  monkeypatch.setenv("CIFAR10_ROOT", "/data/cifar10")


def check_data(config, augment: str) -> None:
  validate_data_config(config.data)
  assert config.data.source == "image_folder"
  assert config.data.root == "/data/cifar10"
  assert (config.data.train_split, config.data.eval_split) == ("train", "test")
  assert config.data.train_fraction == 0.1
  assert config.data.image_size == 32
  assert config.data.train_augment == augment


# ------------------------------------------------------------------------------------------------
# Cordonnier et al.: SA quadratic vs SA learned vs ResNet


def resnet_cifar_params(width: int, classes: int) -> int:
  """Parameters of the CIFAR ResNet18 (3x3 stem, BasicBlocks (2, 2, 2, 2), BN scale and bias)."""
  total = 9 * 3 * width + 2 * width  # stem conv + BN
  c_in = width
  for stage in range(4):
    c = width * 2**stage
    for block in range(2):
      total += 9 * c_in * c + 2 * c + 9 * c * c + 2 * c
      if c_in != c or (stage > 0 and block == 0):
        total += c_in * c + 2 * c  # 1x1 projection shortcut + BN
      c_in = c
  return total + c_in * classes + classes


def sa_params(hidden: int, mlp: int, heads: int, depth: int, channels: int, per_head: int) -> int:
  """Reference-layout SA: embed, per layer positional + value (H, D, D) + bias + dense + LNs + MLP,
  mean pooling and the head; ``per_head`` positional parameters per head."""
  layer = heads * per_head + heads * hidden * hidden + hidden
  layer += hidden * hidden + hidden + 4 * hidden + 2 * hidden * mlp + mlp + hidden
  return channels * hidden + hidden + depth * layer + hidden * NUM_CLASSES + NUM_CLASSES


def test_cordonnier_variants_differ_only_in_the_model():
  configs = {v: cordonnier_cifar10_small.get_config(v) for v in ("quadratic", "learned", "resnet")}
  assert differing_fields(configs.values()) == {
    "model.name",
    "model.overrides.hidden_dim",
    "model.overrides.mlp_dim",
    "model.overrides.downsample",
    "model.overrides.width",
    "paper.variant",
    "paper.top1",
    "paper.params",
  }
  c = configs["quadratic"]
  check_data(c, "crop_flip")
  assert (c.optimizer.name, c.optimizer.lr, c.optimizer.momentum) == ("sgd", 0.1, 0.9)
  assert (c.optimizer.weight_decay, c.batch_size, c.seed) == (1e-4, 100, 0)
  assert c.schedule.warmup_steps == c.total_steps // 20
  # Every checkpoint is kept for the centre plots.
  assert c.keep_checkpoints * c.checkpoint_every_steps >= c.total_steps
  assert cordonnier_cifar10_small.get_config(None).model.name == "cordonnier_sa"


def test_cordonnier_parameter_counts():
  quadratic = param_shapes(cordonnier_cifar10_small.get_config("quadratic"))
  learned = param_shapes(cordonnier_cifar10_small.get_config("learned"))
  resnet = param_shapes(cordonnier_cifar10_small.get_config("resnet"))
  # 4x4 space-to-depth: 48 input channels; quadratic: 2 centre coordinates + 1 spread per head;
  # learned: (2 x 15 offsets + 2 x 9 head keys) x D_p = 96 per layer, i.e. 48 / 9 per head.
  assert count(quadratic) == sa_params(96, 192, 9, 6, 48, 3) == 785_164
  assert count(learned) == sa_params(96, 192, 9, 6, 48, 0) + 6 * 48 * 96 == 812_650
  assert quadratic["layers_0/attn/positional/attention_centers"] == (9, 2)
  assert resnet_cifar_params(64, 10) == 11_173_962  # resnet18_cifar's documented count
  assert count(resnet) == resnet_cifar_params(16, 10) == 701_466


# ------------------------------------------------------------------------------------------------
# Structured initialization: trunc-normal vs mimetic vs impulse-3


def test_structinit_variants_differ_only_in_the_init():
  configs = [structinit_cifar10_small.get_config(v) for v in structinit_cifar10_small.INITS]
  different = differing_fields(configs)
  assert {k.split(".")[0] for k in different} == {"init", "paper"}
  c = configs[0]
  check_data(c, "rrc_flip")
  assert (c.data.rrc_scale, c.data.rrc_ratio) == ((1.0, 1.0), (1.0, 1.0))
  assert (c.optimizer.name, c.optimizer.lr, c.optimizer.eps, c.grad_clip_norm) == (
    "adamw",
    1e-3,
    1e-3,
    3.0,
  )
  impulse = configs[2].init
  assert (impulse.name, impulse.filter_size, impulse.mode, impulse.solver) == (
    "impulse",
    3,
    "same",
    "paper",
  )
  assert solver_config(impulse).steps == 10_000  # the paper's solver
  assert impulse.cache_dir is None
  assert configs[1].init.name == "mimetic" and configs[1].init.alpha == 0.7


def test_structinit_init_seed_follows_seed():
  c = structinit_cifar10_small.get_config("mimetic")
  assert c.init.seed == c.seed == 0
  c.seed = 3
  assert c.init.seed == 3
  unknown_init = (
    r"unknown init 'impulse5' for structinit_cifar10_small.py; did you mean impulse3\? "
    "choices: trunc_normal, mimetic, impulse3"
  )
  with pytest.raises(ValueError, match=unknown_init):
    structinit_cifar10_small.get_config("impulse5")


def test_structinit_model():
  c = structinit_cifar10_small.get_config("impulse3")
  shapes = param_shapes(c)
  dim, depth, mlp = 64, 8, 256
  norms, qkv, proj = 4 * dim, dim * 3 * dim + 3 * dim, dim * dim + dim
  block = norms + qkv + proj + (dim * mlp + mlp + mlp * dim + dim)
  patch = 4 * 4 * 3 * dim + dim
  assert count(shapes) == patch + depth * block + 2 * dim + dim * 10 + 10 == 403_786
  assert "pos_embed" not in shapes  # fixed sin-cos
  assert shapes["blocks_0/attn/qkv/kernel"] == (dim, 3, 4, 16)


# ------------------------------------------------------------------------------------------------
# GMM: ViT vs ELM-ViT vs GMM-ViT


def test_gmm_variants_differ_only_in_the_mask():
  configs = {v: gmm_cifar10_small.get_config(v) for v in gmm_cifar10_small.VARIANTS}
  assert differing_fields(configs.values()) == {
    "model.name",
    "model.overrides.layer_attention",
    "paper.row",
    "paper.top1",
    "paper.params",
    "paper.variant",
  }
  c = configs["gmm"]
  check_data(c, "crop_flip")
  assert (c.optimizer.name, c.optimizer.weight_decay, c.optimizer.decay_mask) == (
    "adamw",
    0.05,
    "all",
  )
  assert (c.batch_size, c.seed, c.schedule.warmup_steps) == (128, 0, c.total_steps // 10)
  assert c.model.overrides.layer_attention == ("gmm",) * gmm_cifar10_small.DEPTH
  unknown_variant = "unknown variant 'deit' for gmm_cifar10_small.py; choices: vit, elm, gmm"
  with pytest.raises(ValueError, match=unknown_variant):
    gmm_cifar10_small.get_config("deit")


def test_gmm_parameter_counts():
  depth, heads, kernels, tokens, dim = gmm_cifar10_small.DEPTH, 12, 5, 64, 144
  shapes = {v: param_shapes(gmm_cifar10_small.get_config(v)) for v in gmm_cifar10_small.VARIANTS}
  gmm_masks = {k: s for k, s in shapes["gmm"].items() if "/mask/" in k}
  elm_masks = {k: s for k, s in shapes["elm"].items() if "/mask/" in k}
  assert set(gmm_masks.values()) == {(kernels, heads)} and len(gmm_masks) == 2 * depth
  assert set(elm_masks.values()) == {(tokens, tokens)} and len(elm_masks) == depth
  # Without their masks, GMM-ViT and ELM-ViT are the same mean-pooled ViT.
  gmm_rest = {k: s for k, s in shapes["gmm"].items() if k not in gmm_masks}
  elm_rest = {k: s for k, s in shapes["elm"].items() if k not in elm_masks}
  assert gmm_rest == elm_rest
  mean_pooled = count(gmm_rest)
  assert count(shapes["gmm"]) - mean_pooled == 2 * kernels * heads * depth == 720
  assert count(shapes["elm"]) - mean_pooled == depth * tokens * tokens == 24_576
  # The class-token baseline: the token and its position embedding row.
  assert count(shapes["vit"]) - mean_pooled == 2 * dim
  assert (count(shapes["vit"]), count(shapes["elm"]), count(shapes["gmm"])) == (
    1_020_538,
    1_044_826,
    1_020_970,
  )
