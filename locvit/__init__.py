"""locvit: vision transformers with convolutional inductive biases, in JAX/Flax.

>>> import locvit
>>> locvit.list_models("convit_tiny*")[:2]
['convit_tiny', 'convit_tiny_patch16_224']
>>> model = locvit.create_model("convit_tiny_patch4_32", num_classes=10)

The top-level names are loaded on first use, so ``import locvit`` stays light.
"""

__version__ = "0.1.0"
__all__ = ["__version__", "create_model", "list_models"]


def __getattr__(name: str):
  if name in ("create_model", "list_models"):
    from locvit import models

    return getattr(models, name)
  raise AttributeError(f"module 'locvit' has no attribute {name!r}")
