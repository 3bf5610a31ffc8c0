"""The names a user reaches first: ``locvit.create_model``, ``locvit.list_models`` (globs, as
timm's), ``locvit.__version__``, timm-style aliases, and an unknown name's message."""

import subprocess
import sys

import pytest

import locvit
from tests.test_cli import ROOT


def test_import_locvit_is_light_and_has_the_top_level_names():
  code = (
    "import sys, locvit; print(locvit.__version__, 'jax' in sys.modules, 'flax' in sys.modules)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
  ).stdout
  assert out == f"{locvit.__version__} False False\n"
  assert locvit.create_model is locvit.models.create_model
  assert locvit.list_models is locvit.models.list_models
  with pytest.raises(AttributeError, match="has no attribute 'create_modle'"):
    locvit.create_modle  # noqa: B018


def test_list_models_filters_by_glob_and_by_substring():
  assert locvit.list_models("*_tiny_plus_patch4_32") == [
    "convit_tiny_plus_patch4_32",
    "deit_tiny_plus_patch4_32",
  ]
  convit = locvit.list_models("convit*")
  assert convit and all(n.startswith("convit") for n in convit)
  assert locvit.list_models("convit_tiny_patch?_32") == [
    "convit_tiny_patch2_32",
    "convit_tiny_patch4_32",
  ]
  assert locvit.list_models("tiny_plus_patch4") == locvit.list_models("*tiny_plus_patch4*")


def test_convit_and_deit_share_timms_patch16_224_aliases():
  for family in ("convit", "deit"):
    for size in ("tiny", "small", "base"):
      assert f"{family}_{size}_patch16_224" in locvit.list_models(), (family, size)
  alias = locvit.create_model("convit_tiny_patch16_224")
  assert alias == locvit.create_model("convit_tiny")


def test_an_unknown_model_shows_its_close_matches_only():
  with pytest.raises(ValueError) as info:
    locvit.create_model("convit_tinny")
  n = len(locvit.list_models())
  assert str(info.value) == (
    "unknown model 'convit_tinny'; did you mean convit_tiny or convit_tiny_plus or deit_tiny? "
    f"`python -m locvit.main --list_models='PATTERN'` lists the {n} names"
  )


def test_parse_override_reads_the_text_by_the_fields_type():
  from locvit.models.registry import parse_override

  name = "deit_tiny_patch2_32"
  read = {
    ("qkv_bias", "false"): False,  # was the truthy string 'false'
    ("qkv_bias", "TRUE"): True,
    ("remat", "0"): False,
    ("depth", "6"): 6,
    ("pool", "gap"): "gap",
    ("layer_attention", "['mhsa', 'mhsa']"): ("mhsa", "mhsa"),
    ("layer_attention", "None"): None,
    ("attention_implementation", "xla"): "xla",
  }
  for (field, text), value in read.items():
    assert parse_override(name, field, text) == value
  mlp_ratio = parse_override(name, "mlp_ratio", "2")  # an int for a float field: a float
  assert (mlp_ratio, type(mlp_ratio)) == (2.0, float)
  refused = {
    ("mlp_ratio", "2x"): "takes a float",
    ("depth", "4.0"): "takes an int",
    ("qkv_bias", "maybe"): "takes a bool (true or false, 1 or 0)",
    ("pool", "mean"): "takes one of token, gap",
    ("layer_attention", "mhsa"): "takes a tuple of strings (a list or tuple literal) or None",
    ("layer_attention", "[1]"): "takes a tuple of strings (a list or tuple literal) or None",
  }
  for (field, text), expected in refused.items():
    with pytest.raises(ValueError) as error:
      parse_override(name, field, text)
    assert str(error.value) == f"model.overrides.{field}={text}: {name}'s {field} {expected}"
  with pytest.raises(ValueError, match=r"^model.overrides.dept: .* did you mean depth\?$"):
    parse_override(name, "dept", "3")
