"""malloc modes for XLA:CPU (``locvit.platform.cpu_malloc``): variables, re-execution, page
faults."""

import os
import subprocess
import sys
import textwrap

import pytest

from locvit.platform import cpu_malloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_glibc = pytest.mark.skipif(not cpu_malloc.uses_glibc(), reason="glibc only")
needs_tcmalloc = pytest.mark.skipif(
  cpu_malloc.find_tcmalloc() is None, reason="TCMalloc not installed (libtcmalloc-minimal4)"
)


def test_unknown_mode_names_the_choices():
  with pytest.raises(ValueError, match="'retian' is not a mode; choose one of auto, default, tcm"):
    cpu_malloc.environment("retian", {})
  with pytest.raises(ValueError, match="choose one of"):
    cpu_malloc.resolve("keep")


def test_retain_merges_with_existing_tunables():
  env = {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=4", "A": "1"}
  merged = cpu_malloc.environment("retain", env)
  entries = merged["GLIBC_TUNABLES"].split(":")
  assert "glibc.malloc.tcache_count=0" in entries  # kept
  assert "glibc.malloc.arena_max=1" in entries and "glibc.malloc.arena_max=4" not in entries
  assert "glibc.malloc.mmap_max=0" in entries
  assert merged["A"] == "1" and env["GLIBC_TUNABLES"].endswith("arena_max=4")  # input untouched
  assert cpu_malloc.is_active("retain", merged)
  assert not cpu_malloc.is_active("retain", env)
  assert cpu_malloc.is_active("default", {})
  assert cpu_malloc.environment("default", {}) == {}


def test_tcmalloc_goes_first_in_ld_preload(monkeypatch):
  monkeypatch.setattr(cpu_malloc, "find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
  env = cpu_malloc.environment("tcmalloc", {"LD_PRELOAD": "libfoo.so:libtcmalloc_minimal.so.4"})
  assert env["LD_PRELOAD"] == "libtcmalloc_minimal.so.4 libfoo.so"
  assert cpu_malloc.is_active("tcmalloc", env)
  assert not cpu_malloc.is_active("tcmalloc", {"LD_PRELOAD": "libfoo.so"})


def test_tcmalloc_missing_says_how_to_install(monkeypatch):
  monkeypatch.setattr(cpu_malloc, "find_tcmalloc", lambda: None)
  with pytest.raises(ValueError, match=r"apt install libtcmalloc-minimal4.*'retain'"):
    cpu_malloc.environment("tcmalloc", {})
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert cpu_malloc.resolve("auto") == "default"  # auto never fails


def test_auto_follows_jax_platforms(monkeypatch):
  monkeypatch.setattr(cpu_malloc, "uses_glibc", lambda: True)
  monkeypatch.setattr(cpu_malloc, "find_tcmalloc", lambda: "libtcmalloc_minimal.so.4")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert cpu_malloc.jax_is_cpu_only() and cpu_malloc.resolve("auto") == "tcmalloc"
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not cpu_malloc.jax_is_cpu_only() and cpu_malloc.resolve("auto") == "default"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setattr(cpu_malloc, "uses_glibc", lambda: False)
  assert cpu_malloc.resolve("auto") == "default"
  assert cpu_malloc.resolve("retain") == "retain"


def test_auto_sees_installed_accelerator_plugins(monkeypatch, tmp_path):
  monkeypatch.setattr(cpu_malloc, "_configured_platforms", lambda: "")
  without = cpu_malloc.jax_is_cpu_only()
  plugin = tmp_path / "jax_plugins" / "fake_gpu_plugin"
  plugin.mkdir(parents=True)
  (plugin / "__init__.py").write_text("")
  monkeypatch.syspath_prepend(str(tmp_path))
  assert without  # this machine: CPU jaxlib only
  assert not cpu_malloc.jax_is_cpu_only()  # as JAX would, finds jax_plugins.fake_gpu_plugin


def _clean_env() -> dict[str, str]:
  unset = ("GLIBC_TUNABLES", "LD_PRELOAD", "XLA_FLAGS")
  env = {k: v for k, v in os.environ.items() if k not in unset}
  return dict(env, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")


def test_cli_rejects_an_unknown_mode():
  out = subprocess.run(
    [
      sys.executable,
      "-m",
      "locvit.main",
      "--cpu_malloc=fast",
      f"--config={os.path.join(ROOT, 'configs', 'quickstart.py')}",
      "--workdir=y",
    ],
    env=_clean_env(),
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode != 0
  assert "--cpu_malloc=fast" in out.stderr and "<auto|default|tcmalloc|retain>" in out.stderr


def test_readme_spells_the_retain_tunables():
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  assert cpu_malloc.environment("retain", {})["GLIBC_TUNABLES"] in readme


def _run(code: str, env: dict[str, str]) -> str:
  out = subprocess.run(
    [sys.executable, "-c", textwrap.dedent(code)],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  )
  return out.stdout


@needs_glibc
def test_reexec_with_runs_the_command_once_under_the_mode():
  out = _run(
    """
    import os
    from locvit.platform import cpu_malloc
    print("start", flush=True)
    cpu_malloc.reexec_with("retain")
    print("active", os.environ["GLIBC_TUNABLES"])
    """,
    _clean_env(),
  )
  lines = out.splitlines()
  assert lines[:2] == ["start", "start"]  # the command ran again, once
  assert lines[2].startswith("active ") and "glibc.malloc.mmap_max=0" in lines[2]


# Minor page faults of each of 20 steps (after 4 warm-up steps) of a jitted function whose
# temporary, exp(x), is 64 MiB: above glibc's largest mmap threshold.
_FAULTS_PER_STEP = """
  import resource
  import jax, jax.numpy as jnp

  @jax.jit
  def step(x, v):
    return jnp.exp(x) @ v

  x, v = jnp.ones((4096, 4096)) * 1e-3, jnp.ones((4096, 1))
  for _ in range(4):
    step(x, v).block_until_ready()
  for _ in range(20):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x, v).block_until_ready()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> list[int]:
  env = cpu_malloc.environment(mode, _clean_env())
  return [int(line) for line in _run(_FAULTS_PER_STEP, env).split()]


@needs_glibc
def test_default_malloc_faults_the_temporary_in_every_step():
  assert min(_faults("default")) > 10_000  # 64 MiB = 16,384 pages, every step


@needs_glibc
def test_retain_stops_per_step_page_faults():
  # The heap grows by whole blocks a few times while it settles (the documented memory cost),
  # then no step faults.
  assert sorted(_faults("retain"))[10] < 100


@needs_tcmalloc
def test_tcmalloc_stops_per_step_page_faults():
  assert sorted(_faults("tcmalloc"))[17] < 100  # no growth phase; allow for a stray fault
