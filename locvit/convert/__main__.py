r"""Command line: convert a timm / official ConViT or DeiT checkpoint to a Flax orbax checkpoint.

  python -m locvit.convert --model=convit_tiny --input=weights.pth --output=DIR
  python -m locvit.convert --model=deit_small --input=model.safetensors --output=DIR \
    --num_classes=100

Restore with ``locvit.convert.load_converted(DIR)`` and use it with
``create_model(model, num_classes=...).apply``.
"""

from __future__ import annotations

import argparse
import os
import sys

from locvit.convert.checkpoint import read_state_dict, save_converted
from locvit.convert.timm import ConversionError, from_timm, resolve_model_name


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
    prog="python -m locvit.convert", description=__doc__.split("\n")[0]
  )
  parser.add_argument(
    "--model",
    required=True,
    help="a ConViT/DeiT name, e.g. convit_tiny or deit_small_patch16_224 "
    "(all: locvit.convert.supported_models())",
  )
  parser.add_argument("--input", required=True, help=".pth/.pt/.bin (torch) or .safetensors")
  parser.add_argument("--output", required=True, help="orbax checkpoint directory to write")
  parser.add_argument("--num_classes", type=int, default=1000, help="classifier width")
  parser.add_argument("--force", action="store_true", help="overwrite an existing --output")
  args = parser.parse_args(argv)
  if os.path.exists(args.output) and not args.force:
    print(f"error: {args.output} already exists (pass --force to overwrite).", file=sys.stderr)
    return 1
  try:
    name = resolve_model_name(args.model)
    variables = from_timm(name, read_state_dict(args.input), num_classes=args.num_classes)
  except (ConversionError, ValueError, ImportError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  path = save_converted(
    args.output,
    variables,
    metadata={"model": name, "num_classes": args.num_classes, "source": args.input},
    force=args.force,
  )
  print(f"Wrote {name} (num_classes={args.num_classes}) to {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
