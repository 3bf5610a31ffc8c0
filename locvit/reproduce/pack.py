"""A plan's workdir packed to continue on another machine (``python -m locvit.reproduce PLAN
--workdir=DIR --pack=FILE``).

Each run keeps everything but its checkpoints, and of those only the newest committed step: the
one it resumes from. ``best/`` (a second whole state) and the older steps stay behind, so an
unfinished GMM-ViT d9 run travels as its parameters and AdamW moments (30 MB) instead of
three to five copies of them: what a machine reached through a size-limited transfer can take.
A run continued without ``best/`` saves a new best only when it beats every evaluation it logged
(``locvit.train.keep_best_honest``), so ``best/`` never holds a worse step than one it had.
"""

from __future__ import annotations

import contextlib
import os
import tarfile

from locvit.workdir import checkpoint


def _newest_step(checkpoints: str) -> int | None:
  """The newest committed step under ``checkpoints`` (orbax's own reading of the folder); the
  read-only managers are closed before the folder is archived."""
  reader = checkpoint.Checkpointer(checkpoints, keep_best=False, read_only=True)
  with contextlib.closing(reader):
    return reader.latest_step()


def pack(workdir: str, path: str) -> list[str]:
  """Writes the gzipped tarball ``path`` of ``workdir`` (its members under the workdir's base
  name), each ``checkpoints`` folder cut to its newest committed step; returns the paths left
  out, relative to ``workdir``'s parent."""
  workdir = os.path.abspath(workdir)
  parent, left_out = os.path.dirname(workdir), []
  with tarfile.open(path, "w:gz") as archive:
    for folder, subfolders, files in os.walk(workdir):
      if os.path.basename(folder) == "checkpoints":
        newest = _newest_step(folder)
        keep = [] if newest is None else [str(newest)]
        left_out += [
          os.path.relpath(os.path.join(folder, d), parent) for d in subfolders if d not in keep
        ]
        subfolders[:] = keep
      for name in files:
        file = os.path.join(folder, name)
        archive.add(file, arcname=os.path.relpath(file, parent), recursive=False)
  return sorted(left_out)
