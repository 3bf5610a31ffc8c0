"""The README's examples run as printed: a GPSA block of one's own (plain and scanned), Theorem 1
from the public API, and the Flax NNX model that trains.

Runtime: about 45 s on 2 busy CPU cores (load average 9), nearly all of it compiling one train step
of a small GPSA classifier and a 2-layer ConViT bridged the same way.
"""

import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import bridge

from locvit.attention import GPSA, TokenGrid
from locvit.models import create_model
from locvit.models.convit import convit_overrides

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def readme_block(heading: str) -> str:
  """The first ```python block after the Markdown heading ``heading``."""
  with open(README) as f:
    text = f.read()
  section = text[text.index(f"\n{heading}\n") :]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def shapes(tree):
  return jax.tree.map(jnp.shape, tree)


def test_readme_own_model_block_prints_what_its_comments_say(capsys):
  """A GPSA block of one's own on a 5 x 7 grid, and the same block under nn.scan + nn.remat
  (which needs metadata_params for locvit's logically partitioned parameters)."""
  block = readme_block("## Using the modules in your own model")
  exec(compile(block, README, "exec"), {"__name__": "readme_own_model"})
  expected = re.findall(r"^print\(.*\)  # (.*)$", block, re.M)
  assert len(expected) == 3
  assert capsys.readouterr().out.splitlines() == expected


def test_readme_nnx_example_trains_and_keeps_locvit_names():
  namespace = {"__name__": "readme_nnx"}
  exec(compile(readme_block("### In a Flax NNX model"), README, "exec"), namespace)
  assert float(namespace["loss_after"]) < float(namespace["loss_before"])
  bridged = nnx.to_pure_dict(nnx.state(namespace["model"].gpsa, nnx.Param))
  linen = GPSA(num_heads=4, locality_strength=1.0).init(
    jax.random.key(0), jnp.zeros((1, 64, 64)), grid=TokenGrid(8, 8)
  )
  assert shapes(bridged) == shapes(nn.meta.unbox(linen["params"]))


def test_a_whole_convit_bridges_with_its_parameter_names():
  overrides = dict(num_classes=10, embed_dim=32, num_heads=4, **convit_overrides(1, depth=2))
  images = jnp.zeros((1, 16, 16, 3))
  with nnx.use_eager_sharding(False):
    model = bridge.lazy_init(
      bridge.ToNNX(create_model("convit_tiny_patch2_32", **overrides), rngs=nnx.Rngs(0)), images
    )
  linen_model = create_model("convit_tiny_patch2_32", **overrides)
  variables = linen_model.init(jax.random.key(0), images)
  bridged = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  assert shapes(bridged) == shapes(nn.meta.unbox(variables["params"]))
  # Same weights, same logits: the bridge runs locvit's own forward pass.
  nnx.update(model, nnx.State(nn.meta.unbox(variables["params"])))
  expected = linen_model.apply(variables, images)
  assert jnp.allclose(model(images), expected, atol=1e-6)


def test_readme_theorem_1_example_runs():
  with open(README) as f:
    code = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  blocks = [block for block in code if "QuadraticPositional(" in block]
  assert len(blocks) == 1, "expected one README example building QuadraticPositional"
  exec(compile(blocks[0], README, "exec"), {})  # its last line asserts conv == attention
