"""``malloc`` choices that stop XLA:CPU from re-faulting its temporaries every step.

XLA:CPU allocates one block for all of a step's temporaries at every execution and frees it at
the end (ConViT-Ti at 224x224, batch 8: 537 MB). With glibc's allocator the block is always a
fresh ``mmap``: it is larger than glibc's largest ``mmap`` threshold (32 MiB), and XLA allocates
it on a worker thread, whose arena falls back to ``mmap`` whatever ``mmap_max`` says. So the
kernel zero-fills it page by page at every step: 131,000 minor page faults per step, a fifth to
two fifths of the step. Modes (measurements in docs/benchmarks.md, "Session 5"):

- ``default``: the C library's allocator, untouched.
- ``tcmalloc``: gperftools' TCMalloc, preloaded (``LD_PRELOAD``). It keeps freed spans for reuse:
  no faults from the second step on, at a moderate memory cost (a CIFAR training run: 3.1 GB
  peak against 2.0 GB). Needs the library (Debian/Ubuntu: ``apt install libtcmalloc-minimal4``).
  The recommended mode.
- ``retain``: glibc only, through ``GLIBC_TUNABLES``: one arena (``arena_max=1``: worker threads
  use the main heap, which grows by ``brk``), no ``mmap`` (``mmap_max=0``), no trimming
  (``trim_threshold``). The same speed as ``tcmalloc``, but small allocations that land in a freed
  temporary block make the heap grow by another block until it settles (the same run: 6.4 GB).
- ``auto``: ``tcmalloc`` where JAX can only use the CPU (``JAX_PLATFORMS=cpu``, or no accelerator
  plugin and no ``libtpu`` installed) and TCMalloc is installed; ``default`` otherwise.

The loader reads ``LD_PRELOAD`` and ``GLIBC_TUNABLES`` when a process starts, so a mode needs a
new process: ``python -m locvit.main --cpu_malloc=MODE`` re-executes the command once (same
process id) under it. Its default is ``auto``: nothing changes unless JAX is CPU-only and
TCMalloc is installed. Elsewhere start Python with ``environment(MODE)``'s variables set.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
import re
import sys
from collections.abc import Mapping, Sequence

MODES = ("default", "tcmalloc", "retain")
FLAG_CHOICES = ("auto", *MODES)

RETAIN_TUNABLES = {
  "glibc.malloc.arena_max": "1",
  "glibc.malloc.mmap_max": "0",
  "glibc.malloc.trim_threshold": str(2**62),
}
TCMALLOC_NAMES = ("tcmalloc_minimal", "tcmalloc")


def _check(mode: str) -> None:
  if mode not in MODES:
    raise ValueError(f"cpu_malloc={mode!r} is not a mode; choose one of {', '.join(FLAG_CHOICES)}")


def find_tcmalloc() -> str | None:
  """The shared library name of an installed TCMalloc (for ``LD_PRELOAD``), or ``None``."""
  for name in TCMALLOC_NAMES:
    if found := ctypes.util.find_library(name):
      return found
  return None


def _parse_tunables(value: str) -> dict[str, str]:
  pairs = (item.partition("=") for item in value.split(":") if item)
  return {key: val for key, _, val in pairs}


def _preload_entries(env: Mapping[str, str]) -> list[str]:
  # The loader splits LD_PRELOAD on spaces and colons.
  return [entry for entry in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if entry]


def environment(mode: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
  """``env`` (default ``os.environ``) with ``mode``'s variables set.

  ``retain`` merges its entries into ``GLIBC_TUNABLES`` (other tunables are kept; for a key set
  both ways, ``retain``'s value wins); ``tcmalloc`` puts TCMalloc first in ``LD_PRELOAD``.
  """
  _check(mode)
  env = dict(os.environ if env is None else env)
  if mode == "retain":
    merged = _parse_tunables(env.get("GLIBC_TUNABLES", "")) | RETAIN_TUNABLES
    env["GLIBC_TUNABLES"] = ":".join(f"{key}={val}" for key, val in merged.items())
  elif mode == "tcmalloc":
    library = find_tcmalloc()
    if library is None:
      raise ValueError(
        "cpu_malloc='tcmalloc' needs gperftools' TCMalloc, which is not installed "
        "(Debian/Ubuntu: apt install libtcmalloc-minimal4). Or choose 'retain' (glibc only) or "
        "'default'."
      )
    preload = _preload_entries(env)
    env["LD_PRELOAD"] = " ".join([library, *(p for p in preload if p != library)])
  return env


def is_active(mode: str, env: Mapping[str, str] | None = None) -> bool:
  """Whether ``env`` (default: this process's) already runs under ``mode``."""
  _check(mode)
  env = os.environ if env is None else env
  if mode == "retain":
    current = _parse_tunables(env.get("GLIBC_TUNABLES", ""))
    return all(current.get(key) == val for key, val in RETAIN_TUNABLES.items())
  if mode == "tcmalloc":
    return any("tcmalloc" in os.path.basename(p) for p in _preload_entries(env))
  return True


def uses_glibc() -> bool:
  """Whether this Python runs on glibc (``LD_PRELOAD`` and the tunables are glibc's loader's)."""
  return platform.libc_ver()[0] == "glibc"


def _configured_platforms() -> str:
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if not platforms and "jax" in sys.modules:
    platforms = sys.modules["jax"].config.jax_platforms or ""
  return platforms


def jax_is_cpu_only() -> bool:
  """Whether JAX can only use the CPU in this process, decided without starting a backend.

  True when ``JAX_PLATFORMS`` (or ``jax.config.jax_platforms``) names only ``cpu``; when it is
  unset, true unless a PJRT plugin (the ``jax_plugins`` namespace package or entry points, as
  JAX discovers them: CUDA, ROCm, ...) or ``libtpu`` is installed.
  """
  platforms = _configured_platforms()
  if platforms:
    return {p.strip() for p in platforms.split(",") if p.strip()} == {"cpu"}
  if importlib.util.find_spec("libtpu") is not None:
    return False
  if importlib.metadata.entry_points(group="jax_plugins"):
    return False
  namespace = importlib.util.find_spec("jax_plugins")
  locations = namespace.submodule_search_locations if namespace else None
  return not (locations and any(True for _ in pkgutil.iter_modules(locations)))


def resolve(mode: str) -> str:
  """``mode`` itself, or for ``auto``: ``tcmalloc`` if installed and JAX is CPU-only, else
  ``default``."""
  if mode == "auto":
    use = uses_glibc() and jax_is_cpu_only() and find_tcmalloc() is not None
    return "tcmalloc" if use else "default"
  _check(mode)
  return mode


def reexec_with(mode: str, argv: Sequence[str] | None = None) -> None:
  """Replaces this process with ``argv`` (default: the command that started it) under ``mode``.

  ``mode`` is one of ``FLAG_CHOICES``. Returns without doing anything when the mode is already
  active (so the new process does not loop) or resolves to ``default``. Raises ``ValueError``
  where the mode cannot be had (not glibc; TCMalloc not installed). Call it before starting
  threads or devices you need: the process image is replaced.
  """
  mode = resolve(mode)
  if is_active(mode):
    return
  if not uses_glibc():
    raise ValueError(
      f"cpu_malloc={mode!r} needs glibc's loader; this system's C library is "
      f"{platform.libc_ver()[0] or 'unknown'!r}. Use cpu_malloc='default'."
    )
  env = environment(mode)
  argv = list(sys.orig_argv if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *argv[1:]], env)
