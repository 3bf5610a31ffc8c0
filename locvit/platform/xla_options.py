"""XLA compiler options for the training step on a GPU, as one resolved setting.

The options travel with each compilation (``jax.jit(..., compiler_options=...)`` or
``Lowered.compile(...)``), not through the process-wide ``XLA_FLAGS``: a setting changes only the
step it is given to, and two settings can be compiled and timed side by side in one process.
Settings:

- ``none``: XLA's defaults.
- ``gpu_tuned``: the candidates for a step bound by kernel launches and the gaps between kernels
  (a CIFAR model at batch 128-512 on one H100/H200; docs/benchmarks.md, "Accelerator kit"):
  ``GPU_TUNED`` below, each with why.
- ``gpu_graphs``: ``gpu_tuned`` with loops and conditionals in the command buffers too
  (``GPU_GRAPHS``): without it each test of a ``while`` loop's condition and each branch choice
  is a copy to the host and a wait for the device, and cuts the step's CUDA graphs apart.
- ``auto``: ``gpu_tuned`` where the step compiles for a GPU, ``none`` elsewhere.

Which settings help is for the accelerator kit to show on a GPU (``benchmarks/accelerator.py
--variants=default,gpu_tuned``). The CPU build of jaxlib parses the same options (GPU ones are
ignored there) and refuses an unknown option or value before compiling anything, so
``tests/test_accelerator_kit.py`` checks them on CPU.
"""

from __future__ import annotations

from typing import Any

from locvit.choices import check_choice

GPU_TUNED = {
  # The latency-hiding scheduler orders the step's ops so that independent work overlaps
  # (copies, cuDNN/cuBLAS calls beside fusions) rather than in XLA's default order.
  "xla_gpu_enable_latency_hiding_scheduler": True,
  # Command buffers (CUDA graphs): fusions, cuBLAS/cuBLASLt GEMMs, cuDNN and custom calls are
  # recorded once and replayed, one launch for a run of kernels instead of one per kernel...
  "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL",
  # ...for every run of captured ops, however short (XLA's default leaves runs under 5 ops out).
  "xla_gpu_graph_min_graph_size": 1,
}
GPU_GRAPHS = {
  **GPU_TUNED,
  # Loops and conditionals as CUDA graph conditional nodes, evaluated on the device (a data-
  # dependent loop: device RandAugment grouped by op, jax.random's rejection samplers).
  "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUDNN,CUSTOM_CALL,WHILE,CONDITIONAL",
}
SETTINGS: dict[str, dict[str, Any]] = {
  "none": {},
  "gpu_tuned": GPU_TUNED,
  "gpu_graphs": GPU_GRAPHS,
}
CHOICES = ("auto", *SETTINGS)


def resolve(setting: str, platform: str) -> str:
  """The setting ``auto`` stands for on ``platform`` ('gpu', 'cpu', 'tpu'); others unchanged."""
  check_choice("xla_options", setting, CHOICES)
  if setting != "auto":
    return setting
  return "gpu_tuned" if platform == "gpu" else "none"


def compiler_options(setting: str, platform: str) -> dict[str, Any]:
  """The ``compiler_options`` of ``setting`` on ``platform`` (a fresh dict)."""
  return dict(SETTINGS[resolve(setting, platform)])
