"""Orbax checkpoints of a training run: train state, data-iterator state and metadata.

A checkpoint at step s is `workdir/checkpoints/s/` with three items:
  state  the train state pytree (params, optimizer state, step), written by orbax/tensorstore
  data   the grain iterator state (JSON), so a resumed run sees exactly the same batches
  meta   the resolved run config and model config (JSON), read before anything is built

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoints intact; old checkpoints are deleted
only after a newer one is finalized. A checkpoint that cannot be read (truncated or deleted
files) is reported by step, moved aside to `workdir/checkpoints_unreadable/`, and the previous
one is restored instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)

ITEMS = ("state", "data", "meta")


class Checkpointer:
  """A CheckpointManager with fallback on unreadable checkpoints."""

  def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
    if not (isinstance(keep, int) and keep >= 1):
      raise ValueError(f"keep_checkpoints must be an int >= 1, got {keep!r}")
    self.directory = os.path.abspath(directory)
    self.keep = keep
    self.async_save = async_save
    self._open()

  def _open(self):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=self.keep, create=True, cleanup_tmp_directories=True,
        enable_async_checkpointing=self.async_save)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  # ------------------------------------------------------------------------------ query
  def steps(self) -> list[int]:
    return sorted(int(s) for s in self.manager.all_steps())

  def latest_step(self) -> Optional[int]:
    steps = self.steps()
    return steps[-1] if steps else None

  def read_meta(self, step: int) -> dict:
    restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  # ------------------------------------------------------------------------------- save
  def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
    """Starts an (async) save of `state` at `step`; refuses a state that is not finite."""
    bad = non_finite_leaves(state)
    if bad:
      raise FloatingPointError(f"refusing to checkpoint a non-finite train state at step {step} "
                               f"(first bad leaves: {bad[:3]})")
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state),
        meta=ocp.args.JsonSave(meta)), force=True)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()

  # ---------------------------------------------------------------------------- restore
  def restore_latest(self, abstract_state: Any, *, report=print):
    """(step, state, data_state, meta) of the newest readable checkpoint, or None if none
    exists. Unreadable ones are reported, moved aside, and the next older one is tried."""
    steps = self.steps()
    for step in reversed(steps):
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore()))
        state = restored["state"]
        bad = non_finite_leaves(state)
        if bad:
          raise ValueError(f"non-finite values in {bad[:3]}")
      except Exception as e:  # noqa: BLE001 - any failure to read means: try the older one
        report(f"checkpoint at step {step} cannot be restored ({type(e).__name__}: "
               f"{str(e).splitlines()[0][:200] if str(e) else ''}); falling back to the "
               f"previous checkpoint")
        self._quarantine(step)
        continue
      return step, state, dict(restored["data"]), dict(restored["meta"])
    if steps:
      raise RuntimeError(f"none of the checkpoints {steps} in {self.directory} could be restored; "
                         f"they were moved to {self._quarantine_dir()}")
    return None

  def _quarantine_dir(self) -> str:
    return os.path.join(os.path.dirname(self.directory),
                        os.path.basename(self.directory) + "_unreadable")

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step aside (never deletes it) so a new save can reuse the step."""
    src = os.path.join(self.directory, str(step))
    if not os.path.exists(src):
      return
    os.makedirs(self._quarantine_dir(), exist_ok=True)
    dst = os.path.join(self._quarantine_dir(), f"{step}-{int(time.time() * 1000)}")
    self.manager.wait_until_finished()
    shutil.move(src, dst)
    self.manager.close()
    self._open()


def _leaf_name(path) -> str:
  """A file-system-safe, unique name for a pytree path (orbax stores one entry per leaf)."""
  name = jax.tree_util.keystr(path)
  for ch in "[]'\".":
    name = name.replace(ch, " ")
  return ".".join(name.split())


def to_flat(tree) -> dict:
  """{path name: leaf}: any pytree (optax states, nnx.State, dataclasses) as a plain dict."""
  flat = {_leaf_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  if len(flat) != len(jax.tree.leaves(tree)):
    raise ValueError("two leaves of the train state map to the same checkpoint name")
  return flat


def from_flat(flat: dict, like):
  """Inverse of to_flat, with `like` giving the tree structure."""
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  missing = [_leaf_name(p) for p, _ in paths if _leaf_name(p) not in flat]
  if missing:
    raise ValueError(f"checkpoint lacks {len(missing)} entries of the train state, e.g. "
                     f"{missing[:3]}")
  return jax.tree_util.tree_unflatten(treedef, [flat[_leaf_name(p)] for p, _ in paths])


def non_finite_leaves(tree) -> list[str]:
  """Paths of floating-point leaves holding NaN or Inf."""
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
      # reduced where the array lives (works for sharded arrays), one bool comes back
      if not bool(jax.numpy.all(jax.numpy.isfinite(leaf))):
        bad.append(jax.tree_util.keystr(path))
  return bad
