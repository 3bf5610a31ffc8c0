"""docs/protocols.md against the paper-protocol plans: every value its tables print is the value
of the plan's resolved config, so the page cannot go stale. A few seconds (configs only; models
are built, never initialised)."""

from __future__ import annotations

import ast
import math
import pathlib
import re

import pytest

from locvit.configs.common import complete_config
from locvit.configs.reproduce_plans import PLANS
from locvit.models import build_model
from locvit.reproduce import row_config

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "protocols.md"
PROTOCOL_PLANS = ("gmm_table1_cifar10", "structinit_table2_cifar10", "cordonnier_table1")
CODE = re.compile(r"^`([^`]*)`$")


def sections() -> dict[str, list[list[list[str]]]]:
  """Plan name -> its tables, each a list of rows of stripped cells (header first)."""
  found: dict[str, list[list[list[str]]]] = {}
  plan, table = None, None
  for line in DOC.read_text().splitlines():
    if line.startswith("## "):
      plan, table = line[3:].strip(), None
      found[plan] = []
    elif plan and line.startswith("|"):
      cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
      if table is None:
        table = [cells]
        found[plan].append(table)
      elif not set(line) <= set("|- "):
        table.append(cells)
    else:
      table = None
  return found


def literal(cell: str):
  match = CODE.match(cell)
  assert match, f"not a `value` cell: {cell!r}"
  return ast.literal_eval(match.group(1))


def normal(value):
  if isinstance(value, (list, tuple)):
    return tuple(normal(v) for v in value)
  return value


def same(printed, actual) -> bool:
  printed, actual = normal(printed), normal(actual)
  if isinstance(printed, tuple) and isinstance(actual, tuple):
    return len(printed) == len(actual) and all(map(same, printed, actual))
  if isinstance(printed, float) or isinstance(actual, float):
    return not isinstance(printed, (bool, str, type(None))) and math.isclose(
      printed, actual, rel_tol=1e-9, abs_tol=1e-12
    )
  return type(printed) is type(actual) and printed == actual


def resolved(config, key: str):
  """The value of ``key`` in a completed config; ``model.overrides.FIELD`` is the built model's
  field (the registered default where the config leaves it)."""
  if key.startswith("model.overrides."):
    return getattr(build_model(config, config.data.num_classes), key.split(".", 2)[2])
  node = config
  for part in key.split("."):
    node = node[part]
  return node


def plan_rows(plan: str) -> dict[str, object]:
  return {
    row: complete_config(row_config(spec))
    for row, spec in PLANS[plan]["rows"].items()
    if not spec.get("optional")
  }


def test_the_page_documents_every_protocol_plan():
  assert set(PROTOCOL_PLANS) <= set(sections())
  assert {name for name, plan in PLANS.items() if plan.get("protocol")} - {"smoke_protocol"} == set(
    PROTOCOL_PLANS
  )


@pytest.mark.parametrize("plan", PROTOCOL_PLANS)
def test_every_printed_setting_is_the_plans_resolved_value(plan):
  configs = plan_rows(plan)
  tables = sections()[plan]
  settings = [t for t in tables if t[0][0] == "setting"]
  per_row = [t for t in tables if t[0][0] == "row"]
  assert len(settings) == 1 and len(per_row) == 1, plan
  checked = 0
  for cells in settings[0][1:]:
    key, value = CODE.match(cells[0]).group(1), literal(cells[1])
    assert cells[3], f"{plan}: {key} names no official code"
    for row, config in configs.items():
      actual = resolved(config, key)
      assert same(value, actual), f"{plan} {row}: docs print {key}={value!r}, config {actual!r}"
    checked += 1
  header = per_row[0][0]
  printed_rows = set()
  for cells in per_row[0][1:]:
    row = cells[0].split()[0]
    printed_rows.add(row)
    config = complete_config(row_config(PLANS[plan]["rows"][row]))
    for name, cell in zip(header[1:], cells[1:], strict=True):
      if CODE.match(name):
        key = CODE.match(name).group(1)
        assert same(literal(cell), resolved(config, key)), f"{plan} {row}: {key}"
      elif name == "paper top-1":
        assert round(float(cell) / 100, 4) == PLANS[plan]["rows"][row]["paper_top1"], (plan, row)
  assert set(configs) <= printed_rows, f"{plan}: rows missing from the page"
  assert checked >= 25, plan


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_structinit_crop_is_the_whole_image_whatever_the_filter(interpolation):
  """The page's claim for ``data.interpolation``: the reference's ``--scale 1 1 --ratio 1 1`` crop
  of a 32 x 32 image is the image itself, so its random train interpolation has no effect."""
  import jax
  import numpy as np

  from locvit.data import device_augment

  data = plan_rows("structinit_table2_cifar10")["impulse3"].data
  data.interpolation = interpolation
  images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
  out = device_augment.random_resized_crop(jax.random.key(0), images, data)
  np.testing.assert_array_equal(out, images)
