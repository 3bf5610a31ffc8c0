"""locvit: vision transformers with convolutional inductive biases, in JAX/Flax."""

__version__ = "0.1.0"
