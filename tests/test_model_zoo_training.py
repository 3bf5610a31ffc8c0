"""Every model family takes real training steps through the trainer's sharded step.

Catches what unit tests of a module miss: initialisation under a mesh with logical partitioning,
optimizer-state shardings, BatchNorm state, and tensor-parallel layouts of each family.
"""

import flax.linen as nn
import jax
import numpy as np
import pytest

from locvit import optim
from locvit.models import create_model
from locvit.models.convit import convit_overrides
from locvit.platform import sharding
from locvit.run import state as state_lib
from locvit.run.step import train_step
from tests.train_utils import tiny_config

FAMILIES = {
  "deit_tiny_patch4_32": dict(depth=2),
  "convit_tiny_patch4_32": convit_overrides(1, 2),
  "cordonnier_sa": dict(depth=2),
  "cordonnier_sa_learned_content": dict(depth=1),
  "resnet18_cifar": {},
  "gmm_vit_smalldata_d6_patch4_32": dict(depth=2, layer_attention=("gmm",) * 2),
  "elm_vit_smalldata_d6_patch4_32": dict(depth=2, layer_attention=("elm",) * 2),
  "gmm_swin_smalldata_patch2_32": dict(depths=(1, 1, 1)),
  "gmm_cait_smalldata_patch4_32": dict(depth=2),
  "gmm_pit_smalldata_patch2_32": dict(depths=(1, 1, 1)),
  "gmm_t2t_smalldata_32": dict(depth=2),
  "structvit_tiny_patch2_32": dict(depth=2),
  "convmixer_256_8_k3_patch2_32": dict(depth=2),
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_trains_on_a_tensor_parallel_mesh(name):
  config = tiny_config()
  config.mesh.shape, config.mesh.layout = (4, 2), "tp"
  config.model.name = name
  mesh, rules = sharding.make_mesh(config.mesh), sharding.logical_rules(config.mesh)
  model = create_model(name, num_classes=10, **FAMILIES[name])
  boxed_params, _ = sharding.model_variable_shapes(model, (32, 32, 3))
  schedule = optim.make_schedule(config, 10, 1)
  tx = optim.make_optimizer(config, nn.meta.unbox(boxed_params), schedule)
  layout = state_lib.state_layout(model, (32, 32, 3), tx, mesh, rules)
  batch_sharding = sharding.batch_sharding(mesh, rules)
  rng = np.random.default_rng(0)
  batch = {
    "image": rng.normal(size=(8, 32, 32, 3)).astype(np.float32),
    "label": rng.integers(0, 10, size=8).astype(np.int32),
  }

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(layout.init, out_shardings=layout.shardings)(jax.random.key(0))
    before = jax.device_get(state.params)
    step = jax.jit(
      lambda s, b: train_step(
        s,
        b,
        model=model,
        tx=tx,
        schedule=schedule,
        config=config,
        num_classes=10,
        platform=jax.default_backend(),
      ),
      in_shardings=(layout.shardings, batch_sharding),
      out_shardings=(layout.shardings, sharding.replicated(mesh)),
    )
    for _ in range(2):
      state, metrics = step(state, sharding.global_batch(batch, batch_sharding))
  assert np.isfinite(float(metrics["train/loss"])), name
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, jax.device_get(state.params))
  assert sum(jax.tree.leaves(moved)) > 0.9 * len(jax.tree.leaves(moved)), name
