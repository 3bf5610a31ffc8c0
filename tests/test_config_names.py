"""Every shipped config name the project prints works as printed: the names with their arguments
in README.md, docs/*.md, ``python -m locvit.main --help``, ``--list_configs``, the configs'
docstrings and the reproduce plans all pass ``--print_config``'s checks."""

import ast
import importlib
import importlib.util
import itertools
import os
import re
import subprocess
import sys

import pytest

from locvit import main
from locvit.configs import args as config_args
from locvit.configs.reproduce_plans import PLANS
from locvit.run import config as run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = run_config.shipped_config_names()
# NAME[.py][:ARG] after --config= or a backtick or "configs/"; ARG stops at a space or a quote.
PRINTED = re.compile(
  r"(?:--config[= ]|`|configs/)(?:configs/)?(" + "|".join(NAMES) + r")(?:\.py)?(?::([^\s`'\")]*))?"
)


# Names that refuse to run as they stand, and say what they need, in one line.
REFUSALS = {
  "convit_table4": r"distillation.type='hard' needs distillation.teacher_workdir: the --workdir ",
  # Its 'folder' dataset reads the folder that --data=image_folder:DIR names; a prior goes on a
  # DeiT only.
  "transfer": r"(data.root=None must be set when source='image_folder': give "
  r"--data=image_folder:DIR|unknown model,prior 'convit_tiny,(gpsa|gmm|elm)' for transfer.py; .*)$",
  # The images of published weights: --data=image_folder:DIR names them.
  "pretrained": r"data.root=None must be set when source='image_folder': give "
  r"--data=image_folder:DIR$",
  # --list_configs shows each field's choices, then the five (dataset, size) pairs that run.
  "gmm_table56": r"unknown dataset,size '\w+,d\d+' for gmm_table56.py; did you mean .*choices: "
  "tinyimagenet,d8, cifar10,d9, cifar10,d15, cifar100,d9, cifar100,d15$",
}


def _placeholder(arg: str) -> bool:
  """``ARCH,DATASET,VARIANT``, ``ROW``, ``d15,...``, ``$init``, ``{a,b},{c}``: the form of an
  argument, not one to run."""
  return any(s in arg for s in ("...", "$", "{")) or any(
    re.fullmatch(r"[A-Z]+", field) for field in re.split(r"[,=]", arg)
  )


def printed_names(text: str) -> set[str]:
  names = set()
  for match in PRINTED.finditer(text):
    name, raw = match.group(1), match.group(2) or ""
    arg = raw.rstrip(".,;:")  # the sentence's punctuation
    if not _placeholder(raw) and not arg.isdigit():  # configs/x.py:42 is a line number
      names.add(f"{name}:{arg}" if arg else name)
  return names


def docs_text() -> str:
  paths = [os.path.join(ROOT, "README.md")]
  paths += sorted(
    os.path.join(ROOT, "docs", f)
    for f in os.listdir(os.path.join(ROOT, "docs"))
    if f.endswith(".md")
  )
  return "\n".join(open(p).read() for p in paths)


def docstrings_text() -> str:
  texts = []
  for name in NAMES:
    with open(os.path.join(run_config.shipped_configs_dir(), name + ".py")) as f:
      texts.append(ast.get_docstring(ast.parse(f.read())) or "")
  return "\n".join(texts)


def listed_names() -> set[str]:
  """Each config of ``--list_configs`` with every choice of each field (the others at their
  defaults), written as that list prints them: by position."""
  names = set(NAMES)
  for name in NAMES:
    fields = getattr(importlib.import_module(f"locvit.configs.{name}"), "ARGS", None) or {}
    specs = [
      f if isinstance(f, config_args.Field) else config_args.Field(f) for f in fields.values()
    ]
    for i, spec in enumerate(specs):
      for choice in spec.choices or [spec.default]:
        names.add(f"{name}:" + ",".join([*(str(s.default) for s in specs[:i]), str(choice)]))
  return names


def print_config(value: str) -> str:
  """What ``--print_config --config=VALUE`` checks and prints, in this process."""
  path, _, arg = run_config.resolve_config(value).partition(":")
  spec = importlib.util.spec_from_file_location("printed_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(*([arg] if arg else []))
  main.check_config(config)
  return config.to_json_best_effort()


@pytest.fixture
def image_folders(monkeypatch, tmp_path):
  """The image-folder-only configs (the *_small ones, ImageNet-100, Tiny-ImageNet) need a root."""
  for env in ("CIFAR10_ROOT", "IMAGENET_ROOT", "TINYIMAGENET_ROOT"):
    monkeypatch.setenv(env, str(tmp_path))


def test_the_collector_finds_the_printed_forms():
  text = (
    "--config=gmm_table1:cifar10 `gmm_table1:vit,cifar10,gmm`; configs/gmm_table3.py:d15,... "
    "--config=configs/convit_fig8.py:gpsa=3,alpha=0.5 --workdir=DIR configs/gmm_table1.py:84 "
    "--config=configs/gmm_table1.py:ARCH,DATASET,VARIANT `convit_s`. --config=quickstart:$m "
    "`gmm_table1:{vit,swin},{base,gmm}`"
  )
  assert printed_names(text) == {
    "gmm_table1:cifar10",
    "gmm_table1:vit,cifar10,gmm",
    "convit_fig8:gpsa=3,alpha=0.5",
    "convit_s",
  }


def test_every_printed_config_name_passes_print_config(image_folders):
  shown = subprocess.run(
    [sys.executable, "-m", "locvit.main", "--help"], capture_output=True, text=True, timeout=120
  )
  assert shown.returncode == 0  # was absl's 1: `--help && ...` stopped there
  help_text = shown.stdout
  assert "--step: Checkpoint step for --mode=eval and --mode=analyze (default: latest)." in (
    " ".join(help_text.split())  # was --mode=eval alone; analyze takes it too
  )
  sources = {
    "docs": printed_names(docs_text()),
    "--help": printed_names(help_text),
    "docstrings": printed_names(docstrings_text()),
    "--list_configs": listed_names(),
    "reproduce plans": {row["config"] for plan in PLANS.values() for row in plan["rows"].values()},
  }
  assert "gmm_table1:vit,cifar10,gmm" in sources["--help"] | sources["docs"]
  assert len(sources["--list_configs"]) > 150 and len(sources["docstrings"]) > 15
  failures = []
  for where, value in sorted({(w, v) for w, names in sources.items() for v in names}):
    try:
      print_config(value)
    except Exception as e:  # every failure, not the first
      refusal = REFUSALS.get(value.partition(":")[0])
      if not (refusal and re.match(refusal, str(e))):
        failures.append(f"{where}: --config={value}: {e}")
  assert not failures, "\n".join(failures)


def test_fields_go_by_position_by_name_or_take_their_defaults():
  configs = [
    print_config(value)
    for value in (
      "gmm_table1:vit,cifar100,gmm",
      "gmm_table1:dataset=cifar100",
      "gmm_table1:,cifar100",
    )
  ]
  assert configs[0] == configs[1] == configs[2]
  assert print_config("gmm_table1") == print_config("gmm_table1:vit,cifar10,gmm")
  with pytest.raises(ValueError, match=r"unknown architecture 'cifar10' for gmm_table1.py; .*t2t$"):
    print_config("gmm_table1:cifar10")


def test_list_configs_shows_the_argument_choices():
  assert run_config.config_usage("gmm_table1") == (
    "gmm_table1:{vit,swin,cait,pit,t2t},{cifar10,cifar100,svhn,tinyimagenet},{base,gmm}"
  )
  assert run_config.config_usage("quickstart") == "quickstart"
  # was the fields' choices alone: 12 of 45 refused
  assert run_config.config_usage("gmm_table56") == (
    "gmm_table56:{tinyimagenet,cifar10,cifar100},{d8,d9,d15},{vit,elm,gmm} (dataset,size: only "
    "tinyimagenet,d8 | cifar10,d9 | cifar10,d15 | cifar100,d9 | cifar100,d15)"
  )
  assert list(itertools.islice(run_config.list_configs_text().splitlines(), 2)) == [
    "cifar10_deit",
    "  DeiT-Ti at patch 4 on CIFAR-10 (32x32): the small-image baseline every paper compares "
    "against.",
  ]
