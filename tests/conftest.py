"""Test set-up: 8 fake CPU devices, set before JAX initialises, and one persistent XLA
compilation cache for every test process and every CLI run the tests start."""

import os
import tempfile

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Many tests compile the same programs (most CLI runs train the quickstart): compiling each once
# roughly halves a CLI run here. A size limit turns on JAX's file lock, so concurrent test
# processes never read a half-written entry; every write then scans the whole cache, so only
# compilations of a second or more (JAX's default threshold: the train and eval steps) are kept,
# not the thousands of small ones, which made the in-process tests twice as slow. The
# subprocesses inherit these variables.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "locvit-tests-xla-cache")
)
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

# The configs read their image folders from these variables (configs/datasets.py): a developer's
# own settings must not change what the tests load. Tests that need one set it themselves.
for _env in ("CIFAR10_ROOT", "CIFAR100_ROOT", "SVHN_ROOT", "TINYIMAGENET_ROOT", "IMAGENET_ROOT"):
  os.environ.pop(_env, None)
