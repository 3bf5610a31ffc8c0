"""Every code block of README.md and docs/*.md, run as written or checked by a named stand-in.

Python blocks are executed (in a fresh temporary directory). The own-model, NNX and Theorem 1 blocks
are run by tests/test_readme.py, which also checks their results; here they are skipped.

Bash commands, line by line (``\\`` continuations joined, ``for`` loops expanded):
- ``python -m locvit.main --config=...``: the config is loaded with every override, as
  ``--print_config`` does, in this process (a full run takes minutes to hours; one subprocess per
  command would cost ~5 s of imports each). ``--print_config`` itself is tested in test_cli.py.
- ``python -m locvit.main --list_models/--list_configs``: their exact output is tested in
  test_cli_output.py.
- ``python -m locvit.main --config.init_from.weights=NAME`` without ``--config`` (published
  weights: predict, eval): run for real by ``test_published_weights_commands_run_as_printed``,
  in a temporary directory holding ``photos/`` and ``imagenet/val/``, with an offline Hugging Face
  cache whose ``timm/convit_tiny.fb_in1k`` is a two-block reference ConViT-Ti (its
  ``config.json``'s ``model_args`` say so).
- ``python -m locvit.main`` without ``--config`` (eval/analyze of a finished ``DIR``) and synopsis
  lines with placeholders (``NAME``, ``[...]``, a leading ``...``): not run;
  tests/test_first_hour.py runs eval from a workdir.
- ``python -m locvit.data.prepare``: its arguments are parsed (the download needs the network);
  tests/test_prepare.py converts official-format archives.
- ``python -m locvit.convert --workdir=RUN``: RUN is a run a ``locvit.main`` command above it in
  that file trains.
- ``python -m locvit.convert`` and the timm Python block: run on ``convit_tiny.pth``, a state dict
  of the PyTorch reference ConViT-Ti (benchmarks/torch_reference.py, timm's key names) saved with
  ``torch.save``, standing in for timm's pretrained download.
- ``python benchmarks/iterator_throughput.py`` (optionally under ``taskset``): its flags parse (it
  reads a dataset for minutes).
- ``python benchmarks/X.py`` / ``experiments/X.py``: the script exists and defines each flag given
  (they run for minutes; their importability is tested on its own), and a ``--*workdir=W`` it
  reads is one a ``locvit.main`` command above it in that file trains.
- ``--data=...`` is applied as ``python -m locvit.main`` applies it; ``VAR=VALUE command`` sets
  VAR for that command only.
- Installs (pip, venv, tfds), the whole test suite, ``LD_PRELOAD``/``GLIBC_TUNABLES`` examples
  for the user's own script: not run (network, 15 minutes, no such script). ``export`` sets the
  variable.

Runtime: ~1 min on 2 busy cores, mostly compiling ConViT-Ti at 224x224 and at 32x32.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import pathlib
import re
import shlex
import subprocess

import pytest
import torch

from benchmarks import iterator_throughput, torch_reference
from locvit import main as main_lib
from locvit.configs.reproduce_plans import PLANS
from locvit.convert import __main__ as convert_cli
from locvit.data import list_recipes, prepare
from locvit.data.config import SOURCES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CHECKED_ELSEWHERE = ("nnx.", "QuadraticPositional(", "nn.scan(")  # tests/test_readme.py
NOT_RUN = re.compile(
  r"^(pip |python3? -m (venv|pip )|\S*/pip |\S*/tfds |XLA_FLAGS=\S+ pytest"
  r"|LD_PRELOAD=|GLIBC_TUNABLES=)"
)


def blocks(language: str) -> list[tuple[str, str]]:
  """(file name, body) of every fenced block in ``language``."""
  found = []
  for path in DOCS:
    for body in re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S):
      found.append((path.name, body))
  return found


def commands() -> list[tuple[str, str]]:
  """(file name, command) of every bash line, continuations joined and loops expanded."""
  found = []
  for name, body in blocks("bash"):
    text = re.sub(r"\\\n\s*", " ", body)
    loops: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
      header = re.findall(r"for (\w+) in ([^;]+); do", line)
      if header:
        loops = [(var, values.split()) for var, values in header]
        continue
      tokens = shlex.split(line, comments=True)
      if tokens in ([], ["done;", "done"], ["done"]):
        continue
      parts = [list(group) for is_and, group in itertools.groupby(tokens, "&&".__eq__)]
      for values in itertools.product(*[v for _, v in loops]):
        for part in parts:
          if part != ["&&"]:
            expanded = shlex.join(part)
            for (var, _), value in zip(loops, values, strict=True):
              expanded = re.sub(rf"\$\{{?{var}\}}?", value, expanded)
            found.append((name, expanded))
  return found


def load_config(argv: list[str]):
  """The config ``python -m locvit.main argv`` would run, overrides applied (no workdir made)."""
  config = main_lib.command_line_config(["locvit", *argv])
  main_lib.check_config(config)
  return config


def script_flags(path: pathlib.Path) -> set[str]:
  """The flags a script defines (absl ``DEFINE_*("name"`` or argparse ``add_argument("--name"``),
  its sibling modules' included (``from run_utils import ...``)."""
  text = path.read_text()
  names = set(re.findall(r"DEFINE_\w+\(\s*[\"'](\w+)[\"']", text))
  names |= set(re.findall(r"add_argument\(\s*[\"']--([\w-]+)[\"']", text))
  for module in re.findall(r"^from (\w+) import", text, re.M):
    if (path.parent / f"{module}.py").is_file():
      names |= script_flags(path.parent / f"{module}.py")
  return names


def test_every_python_block_runs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  reference = torch_reference.build("convit_tiny")  # the stand-in for timm's download
  torch.save(reference.state_dict(), tmp_path / "convit_tiny.pth")
  ran = 0
  for name, body in blocks("python"):
    if any(marker in body for marker in CHECKED_ELSEWHERE):
      continue
    namespace = {"__name__": f"doc_block_{ran}"}
    exec(compile(body, name, "exec"), namespace)
    ran += 1
    if "logits" in namespace:
      assert namespace["logits"].shape[0] == namespace["images"].shape[0], body
  assert ran == 3  # the model in five lines, published weights, timm weights


def test_every_bash_command_runs_or_has_its_stand_in(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  monkeypatch.setenv("HOME", str(tmp_path))
  checked = {"config": 0, "prepare": 0, "convert": 0, "script": 0, "not run": 0}
  checked["reproduce"] = checked["weights"] = 0
  trained = set()  # (file, --workdir) of each locvit.main training command, in order
  for name, command in commands():
    command = os.path.expandvars(command)
    argv = shlex.split(command)
    scoped = {}  # VAR=VALUE command: VAR for this command only (PYTHONPATH: the script's path)
    while re.fullmatch(r"[A-Z][A-Z0-9_]*=.*", argv[0]):
      key, _, value = argv.pop(0).partition("=")
      if key != "PYTHONPATH":
        scoped[key] = os.environ.get(key)
        monkeypatch.setenv(key, value)
    if argv[0] == "taskset":
      argv = argv[3:]  # pinned to a core (taskset -c N)
    where = f"{name}: {command}"
    if argv[0] == "export":
      key, _, value = argv[1].partition("=")
      monkeypatch.setenv(key, value)
    elif (
      any(NOT_RUN.match(c) for c in (" ".join(argv), command))
      or argv[0] == "..."
      or "NAME" in command
      or "[" in command
    ):
      checked["not run"] += 1
    elif argv[:3] == ["python", "-m", "locvit.main"]:
      if published_weights_command(argv):
        checked["weights"] += 1  # run by test_published_weights_commands_run_as_printed
      elif any(a.startswith("--config=") for a in argv):
        assert load_config(argv[3:]) is not None, where
        trained |= {(name, a.partition("=")[2]) for a in argv if a.startswith("--workdir=")}
        checked["config"] += 1
      else:
        checked["not run"] += 1  # eval/analyze of a run's DIR, or --list_* (test_cli_output.py)
    elif argv[:3] == ["python", "-m", "locvit.data.prepare"]:
      args = prepare.parser().parse_args(argv[3:])
      assert args.dataset in prepare.ARCHIVES, where
      checked["prepare"] += 1
    elif argv[:2] == ["python", "benchmarks/iterator_throughput.py"]:  # reads a dataset: its flags
      args = iterator_throughput.parser().parse_args(argv[2:])
      assert args.augment in list_recipes() and args.source in SOURCES, where
      checked["script"] += 1
    elif argv[:3] == ["python", "-m", "locvit.reproduce"]:  # a plan runs for minutes: its name
      assert argv[3] in PLANS, where  # (the smoke plan runs end to end in test_reproduce.py)
      checked["reproduce"] += 1
    elif argv[:3] == ["python", "-m", "locvit.convert"] and any(
      a.startswith("--workdir=") for a in argv
    ):  # a run's weights: the run a locvit.main command above it in the file trains
      workdir = next(a.partition("=")[2] for a in argv if a.startswith("--workdir="))
      assert (name, workdir) in trained, where
      checked["script"] += 1
    elif argv[:3] == ["python", "-m", "locvit.convert"]:
      torch.save(torch_reference.build("convit_tiny").state_dict(), tmp_path / "convit_tiny.pth")
      monkeypatch.chdir(tmp_path)
      assert convert_cli.main(argv[3:]) == 0, where
      assert (tmp_path / "DIR").is_dir()
      monkeypatch.chdir(ROOT)
      checked["convert"] += 1
    elif os.path.basename(argv[0]) in ("python", "python3", "bash") and argv[1].startswith(
      ("benchmarks/", "experiments/")
    ):
      assert (ROOT / argv[1]).is_file(), where
      if argv[1].endswith(".py"):
        given = {a[2:].partition("=")[0].split(".")[0] for a in argv[2:] if a.startswith("--")}
        assert given <= script_flags(ROOT / argv[1]), (where, given - script_flags(ROOT / argv[1]))
        for arg in argv[2:]:  # a run's figures read the workdir that run trained
          key, _, value = arg.partition("=")
          if key.endswith("workdir") and not re.search(r"[A-Z]{2}", value):
            assert (name, value) in trained, (where, value)
      checked["script"] += 1
    elif argv == ["mkdir", "baseline_tree"]:  # for an earlier checkout's tree (kit_gpu.sh's A0)
      checked["not run"] += 1
    elif argv[:2] == ["git", "archive"]:  # ... COMMIT PATHS | tar -x -C baseline_tree
      commit, paths, pipe = argv[2], argv[3 : argv.index("|")], argv[argv.index("|") :]
      assert pipe == ["|", "tar", "-x", "-C", "baseline_tree"], where
      known = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT)
      shallow = (ROOT / ".git" / "shallow").exists()
      assert known.returncode == 0 or shallow, f"{where}: no commit {commit} here"
      in_commit = [  # a path the tree has since moved
        not subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT).returncode
        for path in paths
        if not (ROOT / path).exists()
      ]
      assert shallow or all(in_commit), where
      checked["script"] += 1
    else:
      pytest.fail(f"no runner or stand-in for {where}")
    for key, value in scoped.items():
      if value is None:
        monkeypatch.delenv(key)
      else:
        monkeypatch.setenv(key, value)
  assert checked["config"] >= 20 and checked["prepare"] >= 3 and checked["convert"] == 1, checked
  assert checked["reproduce"] >= 1 and checked["weights"] == 2, checked


def published_weights_command(argv: list[str]) -> bool:
  """``python -m locvit.main --config.init_from.weights=...`` with no ``--config``."""
  return not any(a.startswith("--config=") for a in argv) and any(
    a.startswith("--config.init_from.weights=") for a in argv
  )


def test_published_weights_commands_run_as_printed(tmp_path):
  import json

  import numpy as np
  from PIL import Image
  from safetensors.torch import save_file

  from tests.test_pretrained import TIMM_CONFIG, hub_cache

  torch.manual_seed(0)
  model = torch_reference.build("convit_tiny", depth=2, local_up_to_layer=1)
  weights = tmp_path / "model.safetensors"
  save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
  config = {**TIMM_CONFIG, "model_args": {"depth": 2, "local_up_to_layer": 1}}
  files = {"config.json": json.dumps(config).encode(), "model.safetensors": weights.read_bytes()}
  cache = hub_cache(tmp_path / "hub", "timm/convit_tiny.fb_in1k", files)
  rng = np.random.default_rng(0)
  folders = ["photos", "imagenet/val/n01440764", "imagenet/val/n01443537"]
  for folder in folders:
    (tmp_path / folder).mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (240, 300, 3), dtype=np.uint8)).save(
      tmp_path / folder / "a.jpg"
    )
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": cache, "PYTHONPATH": str(ROOT)}
  argvs = [shlex.split(c) for _, c in commands() if c.startswith("python -m locvit.main")]
  argvs = [argv for argv in argvs if published_weights_command(argv)]
  procs = [
    subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for argv in argvs
  ]
  for argv, proc in zip(argvs, procs, strict=True):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (argv, err.decode())
    workdir = tmp_path / next(a for a in argv if a.startswith("--workdir=")).partition("=")[2]
    written = "predictions.jsonl" if "--mode=predict" in argv else "eval.jsonl"
    assert (workdir / written).is_file(), (argv, out.decode())


# Printed as mistakes: the one-line errors they give are shown beside them (docs/reliability.md).
SHOWN_MISTAKES = {"bach_size", "zzz", "configs/quickstrt.py"}


def config_field_exists(path: str) -> bool:
  """``a.b.c`` is a field of the base config (every init scheme's block for ``init.*``), or under
  ``model.overrides`` (a model's own fields)."""
  from locvit.configs import defaults
  from locvit.configs.common import base_config, complete_config

  if path.startswith("model.overrides."):
    return True
  if path.startswith("init."):
    return any(path[5:] in defaults.init_config(name) for name in defaults.INIT_NAMES)
  node = complete_config(base_config())
  for part in path.split("."):
    if not hasattr(node, "keys") or part not in node:
      return False
    node = node[part]
  return True


def python_name_exists(dotted: str) -> bool:
  """``locvit.a.b.C``: the longest importable module prefix, then attributes."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      spec = importlib.util.find_spec(".".join(parts[:i]))
    except ModuleNotFoundError:  # a.b.c where a.b is a module, not a package
      spec = None
    if spec is not None:
      obj = importlib.import_module(".".join(parts[:i]))
      for attr in parts[i:]:
        if not hasattr(obj, attr):
          return False
        obj = getattr(obj, attr)
      return True
  return False


def test_every_printed_path_module_and_name_exists():
  """README.md and docs/*.md (benchmarks.md: its commands only) name files of the repository
  (``tests/X.py::test``: the test too), ``python -m`` modules, ``locvit.a.b`` names and
  ``--config.FIELD`` fields that exist as printed."""
  missing = []
  for path in DOCS:
    text = path.read_text()
    if path.name == "benchmarks.md":  # a git archive's paths are its commit's (checked above)
      text = "\n".join(
        c for n, c in commands() if n == path.name and not c.startswith("git archive ")
      )
    for match in re.finditer(
      r"(?<![\w/.$~])((?:locvit|configs|tests|benchmarks|experiments|docs|colabs|ci)/[\w/.-]*\w)"
      r"(::\w+)?(\*?)",
      text,
    ):
      file, test, star = match.groups()
      if star or "NAME" in file or file in SHOWN_MISTAKES:  # a glob, a placeholder
        continue
      prefix_of = list((ROOT / file).parent.glob(file.split("/")[-1] + "_*"))  # figures' prefix
      if not (ROOT / file).exists() and not prefix_of:
        missing.append(f"{path.name}: no file {file}")
      elif test and not re.search(rf"def {test[2:]}\b", (ROOT / file).read_text()):
        missing.append(f"{path.name}: no test {file}{test}")
    missing += missing_modules_names_and_fields(path.name, text)
  assert not missing, "\n".join(missing)


def missing_modules_names_and_fields(label: str, text: str) -> list[str]:
  """The ``python -m`` modules, ``locvit.a.b`` names and ``--config.FIELD`` fields that ``text``
  (labelled ``label``) prints and that do not exist, one line each."""
  missing = []
  for module in re.findall(r"python3? -m (locvit[\w.]*)", text):
    if importlib.util.find_spec(module) is None:
      missing.append(f"{label}: no module {module}")
  for dotted in re.findall(r"(?<![\w/.])(locvit(?:\.\w+)+)", text):
    if not python_name_exists(dotted):
      missing.append(f"{label}: no name {dotted}")
  for field in re.findall(r"--config\.([\w.]+)=", text):
    if field not in SHOWN_MISTAKES | {"FIELD"} and not config_field_exists(field):
      missing.append(f"{label}: no config field {field}")
  return missing
