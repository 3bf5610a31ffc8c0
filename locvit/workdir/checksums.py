"""Integrity of a committed checkpoint step: ``checksums.json``, the SHA-256 of each of its files.

Written as orbax commits the step (``Checkpointer``); verified before a resume restores it.
Works through the path layer, so a step in a bucket is checked like one on a local disk. GCS's own
per-object CRC32C/MD5 is not used: it is recomputed by the server on every write, so an object
overwritten with damaged bytes carries a matching server checksum; only a digest recorded at
commit time can tell.
"""

from __future__ import annotations

import hashlib
import json
import os

from etils import epath

from locvit.workdir import paths

CHECKSUMS = "checksums.json"  # in each committed step directory
# Not hashed: the manifest itself, and orbax's step metadata, which orbax rewrites as it commits
# the step (commit_timestamp_nsecs), after the manifest is written (``locvit.workdir.checkpoint``).
UNHASHED = (CHECKSUMS, "_CHECKPOINT_METADATA")


def _digest(file: epath.Path) -> str:
  return hashlib.sha256(file.read_bytes()).hexdigest()


def _file_digests(step_dir: epath.Path) -> dict[str, str]:
  digests = {}
  for file in paths.files_under(step_dir):
    rel = os.path.relpath(os.fspath(file), os.fspath(step_dir))
    if rel not in UNHASHED:
      digests[rel] = _digest(file)
  return dict(sorted(digests.items()))


def write_checksums(step_dir: str | os.PathLike) -> None:
  """Writes ``step_dir/checksums.json`` (SHA-256 of every file) atomically."""
  step_dir = epath.Path(step_dir)
  manifest = {"algorithm": "sha256", "files": _file_digests(step_dir)}
  paths.write_atomically(step_dir / CHECKSUMS, json.dumps(manifest, indent=0))


def verify_checksums(step_dir: str | os.PathLike) -> str | None:
  """None when every file listed in ``checksums.json`` is present and unchanged (or the step has
  no manifest: a run killed between commit and manifest); else a short description."""
  step_dir = epath.Path(step_dir)
  manifest = step_dir / CHECKSUMS
  if not manifest.exists():
    return None
  try:
    expected = json.loads(manifest.read_text())["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable {CHECKSUMS} ({type(e).__name__})"
  problems = []
  for rel, digest in expected.items():
    file = step_dir / rel
    if not file.exists():
      problems.append(f"{rel} missing")
    elif _digest(file) != digest:
      problems.append(f"{rel} checksum mismatch")
  if not problems:
    return None
  more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
  return ", ".join(problems[:3]) + more
