"""Integrity of a committed checkpoint step: ``checksums.json``, the SHA-256 of each of its files.

Written once orbax has committed the step (``Checkpointer``); verified before a resume restores it.
"""

from __future__ import annotations

import hashlib
import json
import os

CHECKSUMS = "checksums.json"  # in each committed step directory


def _file_digests(step_dir: str) -> dict[str, str]:
  digests = {}
  for root, _, files in os.walk(step_dir):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, step_dir)
      if rel == CHECKSUMS:
        continue
      with open(path, "rb") as f:
        digests[rel] = hashlib.file_digest(f, "sha256").hexdigest()
  return dict(sorted(digests.items()))


def write_checksums(step_dir: str) -> None:
  """Writes ``step_dir/checksums.json`` (SHA-256 of every file) atomically."""
  manifest = {"algorithm": "sha256", "files": _file_digests(step_dir)}
  tmp = os.path.join(step_dir, CHECKSUMS + ".tmp")
  with open(tmp, "w") as f:
    json.dump(manifest, f, indent=0)
  os.replace(tmp, os.path.join(step_dir, CHECKSUMS))


def verify_checksums(step_dir: str) -> str | None:
  """None when every file listed in ``checksums.json`` is present and unchanged (or the step has
  no manifest: a run killed between commit and manifest); else a short description."""
  path = os.path.join(step_dir, CHECKSUMS)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      expected = json.load(f)["files"]
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable {CHECKSUMS} ({type(e).__name__})"
  problems = []
  for rel, digest in expected.items():
    full = os.path.join(step_dir, rel)
    if not os.path.exists(full):
      problems.append(f"{rel} missing")
      continue
    with open(full, "rb") as f:
      if hashlib.file_digest(f, "sha256").hexdigest() != digest:
        problems.append(f"{rel} checksum mismatch")
  if not problems:
    return None
  more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
  return ", ".join(problems[:3]) + more
