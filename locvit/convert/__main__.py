r"""Command line: convert a timm / official ConViT or DeiT checkpoint to a Flax orbax checkpoint.

  python -m locvit.convert --model=convit_tiny --input=weights.pth --output=DIR
  python -m locvit.convert --model=deit_small --input=model.safetensors --output=DIR \
    --num_classes=100
  python -m locvit.convert --model=convit_tiny_patch4_32 --input=weights.npz --output=DIR \
    --num_classes=10 --override depth=3 --override class_token_layer=2 \
    --override "layer_attention=('gpsa', 'gpsa', 'mhsa')"   # convit_overrides(2, depth=3)
  python -m locvit.convert --model=deit_tiny_distilled_patch16_224 --input=w.pth --output=DIR
  python -m locvit.convert --workdir=RUN --output=DIR   # a locvit run's ConViT / DeiT weights

``--override FIELD=VALUE`` (repeatable) passes the module fields the checkpoint was trained with
to ``create_model``, each value read by the field's type (``qkv_bias=false``, ``mlp_ratio=3``,
``layer_attention="('gpsa', 'mhsa')"``); timm's distilled DeiT names (``deit_*_distilled_*``)
imply ``distilled=True``. Inputs: ``.pth``/``.pt``/``.bin`` (torch),
``.safetensors`` or ``.npz`` (NumPy arrays keyed by the timm names, no PyTorch needed).

``--workdir=RUN [--step=N]`` writes the parameters of a locvit training run's checkpoint (the
latest by default) instead, with its model name, overrides, class count and evaluation
preprocessing (image size and channels, mean, std, crop), so that
``--config.init_from.weights=DIR`` fine-tunes them as it does published weights and
``--mode=predict`` reads images as the run evaluated them.

Restore with ``locvit.convert.load_converted(DIR)`` and use it with
``create_model(model, num_classes=...).apply``.
"""

from __future__ import annotations

import argparse
import os
import sys

from locvit.choices import ArgumentParser
from locvit.convert.checkpoint import export_run, read_state_dict, save_converted
from locvit.convert.timm import ConversionError, from_timm, resolve_timm_name
from locvit.models.registry import parse_override

PROG = "locvit.convert"  # its error lines, as locvit.main's "locvit: error: ..."


def split_override(text: str) -> tuple[str, str]:
  """``'depth=6'`` -> ``('depth', '6')``; the value is read by the field's type once the model is
  known (``registry.parse_override``: ``qkv_bias=false`` is False)."""
  field, sep, value = text.partition("=")
  if not sep or not field.isidentifier():
    raise argparse.ArgumentTypeError(f"--override {text!r} must look like FIELD=VALUE")
  if field == "num_classes":  # create_model's own argument
    raise argparse.ArgumentTypeError(f"--override {text!r}: give the class count as --num_classes")
  return field, value


def main(argv: list[str] | None = None) -> int:
  """Runs the converter; returns the process exit code (0, or 2 with the error on stderr, as
  locvit.main's)."""
  parser = ArgumentParser(prog="python -m locvit.convert", description=__doc__.split("\n")[0])
  parser.add_argument(
    "--model",
    help="a ConViT/DeiT name, e.g. convit_tiny or deit_small_patch16_224 "
    "(all: locvit.convert.supported_models())",
  )
  parser.add_argument("--input", help=".pth/.pt/.bin (torch), .safetensors or .npz (NumPy)")
  parser.add_argument("--workdir", help="a locvit run whose ConViT/DeiT parameters to write")
  parser.add_argument("--step", type=int, help="--workdir's checkpoint step (default: latest)")
  parser.add_argument("--output", required=True, help="orbax checkpoint directory to write")
  parser.add_argument("--num_classes", type=int, default=1000, help="classifier width")
  parser.add_argument("--force", action="store_true", help="overwrite an existing --output")
  parser.add_argument(
    "--override",
    action="append",
    type=split_override,
    default=[],
    metavar="FIELD=VALUE",
    help="a create_model field the checkpoint was trained with (repeatable), e.g. depth=6",
  )
  args = parser.parse_args(argv)
  timm_args = (args.model, args.input)
  if None in timm_args if args.workdir is None else timm_args != (None, None):
    message = "give --model and --input (a timm state dict), or --workdir (a locvit run)"
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2
  if os.path.exists(args.output) and not args.force:
    message = f"{args.output} already exists (pass --force to overwrite)."
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2
  if args.workdir is not None:
    try:
      path, metadata = export_run(args.workdir, args.output, step=args.step, force=args.force)
    except (ValueError, FileNotFoundError) as e:
      print(f"{PROG}: error: {e}", file=sys.stderr)
      return 2
    print(f"Wrote {metadata['model']} (num_classes={metadata['num_classes']}) to {path}")
    return 0
  try:
    name, implied = resolve_timm_name(args.model)  # timm's distilled DeiT: distilled=True
    overrides = {field: parse_override(name, field, text) for field, text in args.override}
    overrides = {**implied, **overrides}
    variables = from_timm(
      name, read_state_dict(args.input), num_classes=args.num_classes, **overrides
    )
  except (ConversionError, ValueError, TypeError, ImportError, FileNotFoundError) as e:
    print(f"{PROG}: error: {e}", file=sys.stderr)
    return 2
  path = save_converted(
    args.output,
    variables,
    metadata={
      "model": name,
      "num_classes": args.num_classes,
      "overrides": {k: repr(v) for k, v in overrides.items()},
      "source": args.input,
    },
    force=args.force,
  )
  print(f"Wrote {name} (num_classes={args.num_classes}) to {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
