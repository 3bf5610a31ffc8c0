"""Is the compiled training step of this checkout the same program as another checkout's?

  python benchmarks/step_hlo_diff.py --baseline=PATH [--model=convit_tiny] [--image_size=112]

Compiles the training step of ``convit_throughput.py`` (``locvit.run.step.train_step``, DeiT recipe,
batch ``--batch_size``, one CPU device) in two fresh processes, one importing ``locvit`` and
``configs`` from each checkout, and compares XLA's optimised HLO after dropping what does not
change the program (source metadata, stack frames, instruction and computation names). Equal
programs mean a timing difference between the checkouts is measurement noise, not code;
otherwise the first differing lines are printed.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DROPPED_LINE = re.compile(r'^\s*\d+ (\{(file_name_id|file_location_id)|")')
_DROPPED = (
  (re.compile(r",? ?metadata=\{[^}]*\}"), ""),
  (re.compile(r",? ?stack_frame_id=\d+"), ""),
  (re.compile(r"%[\w.-]+"), "%x"),
  (re.compile(r"\b([A-Za-z_][\w-]*)\.\d+\b"), r"\1"),
)
_SECTIONS = ("HloModule", "FileNames", "FunctionNames", "FileLocations", "StackFrames")


def normalised(hlo: str) -> list[str]:
  """The optimised HLO's instructions with names and source locations removed."""
  lines = []
  for line in hlo.splitlines():
    if line.startswith(_SECTIONS) or _DROPPED_LINE.match(line):
      continue
    for pattern, replacement in _DROPPED:
      line = pattern.sub(replacement, line)
    lines.append(line)
  return lines


def compiled_hlo(root: str, model: str, image_size: int, batch_size: int) -> str:
  """Optimised HLO of ``convit_throughput``'s training step with ``root``'s locvit and configs."""
  import convit_throughput

  convit_throughput.use_checkout(root)
  return convit_throughput.compiled_step(model, image_size, batch_size)[0].as_text()


def hlo_of_checkout(root: str, args) -> list[str]:
  env = dict(os.environ, PYTHONPATH=os.path.abspath(root))
  command = [sys.executable, __file__, f"--worker={os.path.abspath(root)}"]
  command += [f"--model={args.model}", f"--image_size={args.image_size}"]
  command += [f"--batch_size={args.batch_size}"]
  out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=root)
  return normalised(out.stdout)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--baseline", required=False, help="the other checkout")
  parser.add_argument("--model", default="convit_tiny")
  parser.add_argument("--image_size", type=int, default=112)
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    print(compiled_hlo(args.worker, args.model, args.image_size, args.batch_size))
    return
  if not args.baseline:
    parser.error("--baseline=PATH (another checkout) is required")
  ours, theirs = hlo_of_checkout(ROOT, args), hlo_of_checkout(args.baseline, args)
  ops = lambda lines: collections.Counter(re.findall(r"= \S+ ([\w-]+)\(", "\n".join(lines)))
  print(f"{args.model}, {args.image_size}x{args.image_size}, batch {args.batch_size}:")
  print(f"  this checkout: {len(ours)} lines, {sum(ops(ours).values())} instructions")
  print(f"  baseline:      {len(theirs)} lines, {sum(ops(theirs).values())} instructions")
  if ours == theirs:
    print("  the optimised HLO is identical: the same program")
    return
  diff = [(i, a, b) for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  print(f"  the optimised HLO differs ({len(diff)} lines); first differences:")
  for i, a, b in diff[:5]:
    print(f"    line {i}\n      this: {a[:200]}\n      base: {b[:200]}")


if __name__ == "__main__":
  main()
