"""The checkout that study/ and reproduce.py run from: its root, a run config by preset name
or path (configs/PRESET.py), and the commit that trained, evaluated or wrote (for the
write-ups' records).
"""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(preset: str):
  """A RunConfig: configs/PRESET.py for a preset's name, or the config file at that path."""
  from rove_jax.train import overrides  # jax: loaded when a config is, not with this module

  path = preset if preset.endswith(".py") else os.path.join(ROOT, "configs", f"{preset}.py")
  return overrides.load_file(path)


def git_commit() -> str:
  """The checkout's HEAD, marked when tracked files other than results/ (what reproduce.py
  itself rewrites) have uncommitted changes: reproduce.py's record of the code that trained,
  evaluated or wrote."""
  try:
    head = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
      cwd=ROOT,
      capture_output=True,
      text=True,
    ).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"
