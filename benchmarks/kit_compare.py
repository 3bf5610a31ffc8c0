"""Two runs of the accelerator kit side by side: each locvit side's step time and kernels per step
in a log of an earlier checkout ("before") against a log of this one ("after").

  python benchmarks/kit_compare.py BEFORE.log AFTER.log

The logs are what ``benchmarks/accelerator.py`` prints (Table 1 and, with ``--profile``, Table
1p). ``benchmarks/kit_gpu.sh`` runs call A0 (an earlier checkout's kit, ``BASELINE_TREE``) beside
call A on the same machine and prints this comparison; the rows and sides found in both logs are
compared, the others listed as missing.
"""

from __future__ import annotations

import argparse
import re
import sys

# Table 1: "GMM-ViT d9   32   128 locvit default   145.7   4.06   31553.2 ..."
_STEP = re.compile(
  r"^(?P<model>\S.*?) +(?P<size>\d+) +(?P<batch>\d+) locvit (?P<side>\S+) +[\d.]+ +"
  r"(?P<ms>[\d.]+) +(?P<images>[\d.,]+)\s",
  re.M,
)
# Table 1p: "GMM-ViT d9 b128 default   gpu   991   5.89   3.43 ..."
_PROFILE = re.compile(
  r"^(?P<model>\S.*?) b(?P<batch>\d+) (?P<side>\S+) +\S+ +(?P<kernels>[\d,]+) +"
  r"(?P<wall>[\d.]+) +(?P<busy>[\d.]+) ",
  re.M,
)


def read_log(text: str) -> dict[tuple[str, int, str], dict[str, float]]:
  """``{(model, batch, side): {"ms", "images_per_s"[, "kernels", "busy_ms"]}}`` of a kit log."""
  rows: dict[tuple[str, int, str], dict[str, float]] = {}
  for m in _STEP.finditer(text):
    rows[(m["model"], int(m["batch"]), m["side"])] = {
      "ms": float(m["ms"]),
      "images_per_s": float(m["images"].replace(",", "")),
    }
  for m in _PROFILE.finditer(text):
    row = rows.get((m["model"], int(m["batch"]), m["side"]))
    if row is not None:
      row["kernels"] = float(m["kernels"].replace(",", ""))
      row["busy_ms"] = float(m["busy"])
  return rows


def comparison(before: str, after: str) -> list[str]:
  """The lines that ``main`` prints for the logs' texts ``before`` and ``after``."""
  old, new = read_log(before), read_log(after)
  lines = [
    f"{'row':<22} {'side':<10} {'ms before':>9} {'ms after':>9} {'after/before':>12} "
    f"{'img/s after':>11} {'kernels before':>14} {'kernels after':>13}"
  ]
  for key in [k for k in new if k in old]:
    model, batch, side = key
    a, b = old[key], new[key]
    kernels = [f"{r['kernels']:,.0f}" if "kernels" in r else "-" for r in (a, b)]
    lines.append(
      f"{f'{model} b{batch}':<22} {side:<10} {a['ms']:>9.2f} {b['ms']:>9.2f} "
      f"{b['ms'] / a['ms']:>11.2f}x {b['images_per_s']:>11,.0f} {kernels[0]:>14} {kernels[1]:>13}"
    )
  for name, rows, other in (("before", old, new), ("after", new, old)):
    for model, batch, side in [k for k in rows if k not in other]:
      lines.append(f"{model} b{batch} {side}: only in the {name} log")
  if len(lines) == 1:
    lines.append("no locvit side of Table 1 in both logs")
  return lines


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("before", help="the kit's log of the earlier checkout")
  parser.add_argument("after", help="the kit's log of this checkout")
  args = parser.parse_args(argv)
  texts = []
  for path in (args.before, args.after):
    try:
      with open(path) as f:
        texts.append(f.read())
    except OSError as e:
      print(f"kit_compare.py: error: cannot read {path}: {e.strerror}", file=sys.stderr)
      return 2
  print("\n".join(comparison(*texts)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
