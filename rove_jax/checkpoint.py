"""Orbax checkpoints of a training run: the only module that knows their layout.

A checkpoint at step s is `workdir/checkpoints/s/` with three items:
  state  the train state flattened to {entry name: array} (`to_flat`): "params.<path>" for the
         parameters, "opt_state.<path>" and "step"; written by orbax/tensorstore
  data   the grain iterator state (JSON), so a resumed run sees exactly the same batches
  meta   the resolved run config, `GPTConfig.to_dict()` under "model" and the tokenizer (JSON),
         read before anything is built

Training resumes with `Checkpointer.restore_latest`; evaluation (and the notebook, through
`rove_jax.evaluation.scoring.load_run`) reads a finished run with `read_run(workdir,
abstract_params)` (step, parameters, metadata); `restore_params` does the same for a known
parameter tree. A checkpoint whose entry names differ from the model's (written by another
parameter layout, e.g. separate attn.wq/wk/wv where the model now fuses them) is a LayoutError
naming the missing and unexpected entries; it is never taken for an unreadable one.

Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
process killed mid-save leaves the previous checkpoints intact; old checkpoints are deleted
only after a newer one is finalized. A checkpoint that cannot be read (truncated or deleted
files) is reported by step, moved aside to `workdir/checkpoints_unreadable/`, and the previous
one is restored instead.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Callable, Optional

import jax
import orbax.checkpoint as ocp

CHECKPOINTS = "checkpoints"  # the directory inside a workdir
PARAMS = "params."  # the prefix of the parameter entries in the flat state


class LayoutError(ValueError):
  """A readable checkpoint whose entries do not match the tree it is restored into."""


def checkpoint_dir(workdir: str) -> str:
  """Where a training workdir keeps its checkpoints."""
  return os.path.join(os.path.abspath(workdir), CHECKPOINTS)


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
    # Handlers named up front: metadata and single items read back without orbax warnings.
    handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler()}
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

  # ------------------------------------------------------------------------------ query
  def steps(self) -> list[int]:
    return sorted(int(s) for s in self.manager.all_steps())

  def latest_step(self) -> Optional[int]:
    steps = self.steps()
    return steps[-1] if steps else None

  def read_meta(self, step: int) -> dict:
    restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])

  def stored_entries(self, step: int) -> Optional[dict]:
    """{entry name: array metadata (shape, dtype)} of the state at `step`, or None when its
    metadata cannot be read (the restore that follows reports that checkpoint as unreadable)."""
    try:
      tree = self.manager.item_metadata(step)["state"]
      return {name: tree[name] for name in tree.keys()}
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore will say so
      return None

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
  def newest_readable(self, restore_step: Callable[[int], Any], *,
                      on_unreadable: Callable[[int, Exception], None]):
    """(step, restore_step(step)) for the newest step that restores, or None if there are no
    checkpoints. The one fallback loop: a step whose restore raises is passed to
    `on_unreadable` and the next older one is tried; a LayoutError (a readable checkpoint of
    another parameter layout) is raised at once.

    Raises:
      RuntimeError: checkpoints exist but none could be restored.
    """
    steps = self.steps()
    last = None
    for step in reversed(steps):
      try:
        return step, restore_step(step)
      except LayoutError:
        raise
      except Exception as e:  # noqa: BLE001 - any failure to read means: try the older one
        on_unreadable(step, e)
        last = e
    if steps:
      raise RuntimeError(f"none of the checkpoints {steps} in {self.directory} could be "
                         f"restored (the oldest failed with {_describe(last)})") from last
    return None

  def check_layout(self, step: int, expected_names) -> None:
    """Raises LayoutError when the state at `step` has other entries than `expected_names`
    (nothing is checked when its metadata is unreadable: then the restore fails)."""
    stored = self.stored_entries(step)
    if stored is not None:
      check_layout(set(stored), set(expected_names), where=f"checkpoint at step {step} in "
                                                            f"{self.directory}")

  def restore_latest(self, abstract_state: Any, *, report=print):
    """(step, state, data_state, meta) of the newest readable checkpoint, or None if none
    exists. Unreadable ones are reported, moved aside, and the next older one is tried.

    Args:
      abstract_state: the flat train state (`to_flat`) of ShapeDtypeStructs with shardings.
      report: where the fallback messages go.

    Raises:
      LayoutError: the newest checkpoint names other entries than `abstract_state`.
    """
    def restore_step(step):
      self.check_layout(step, abstract_state)
      restored = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore(),
          meta=ocp.args.JsonRestore()))
      bad = non_finite_leaves(restored["state"])
      if bad:
        raise ValueError(f"non-finite values in {bad[:3]}")
      return restored["state"], dict(restored["data"]), dict(restored["meta"])

    def unreadable(step, e):
      report(f"checkpoint at step {step} cannot be restored ({_describe(e)}); falling back "
             f"to the previous checkpoint")
      self._quarantine(step)

    try:
      found = self.newest_readable(restore_step, on_unreadable=unreadable)
    except RuntimeError as e:
      raise RuntimeError(f"{e}; they were moved to {self._quarantine_dir()}") from e.__cause__
    if found is None:
      return None
    step, (state, data_state, meta) = found
    return step, state, data_state, meta

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


def _describe(e: Exception) -> str:
  text = str(e).splitlines()[0][:200] if str(e) else ""
  return f"{type(e).__name__}: {text}"


def check_layout(stored: set, expected: set, *, where: str) -> None:
  """Raises LayoutError naming the entries `expected` lacks and those it does not know."""
  if stored == expected:
    return
  def show(names):
    # parameter entries first: they say which layout wrote the checkpoint
    names = sorted(names, key=lambda n: (not n.startswith(PARAMS), n))
    return ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
  missing, unexpected = sorted(expected - stored), sorted(stored - expected)
  raise LayoutError(
      f"{where} was written by an older (or another) parameter layout of the model: it lacks "
      f"{len(missing)} entries the model needs [{show(missing)}] and has {len(unexpected)} the "
      f"model does not know [{show(unexpected)}]. Restore it with the rove-jax version that "
      f"wrote it, or train into a fresh --workdir.")


def read_run(workdir: str, abstract_params: Callable[[dict], Any], *, report=print):
  """Restores the parameters of the newest readable checkpoint of a training workdir onto one
  device, for evaluation. Nothing is moved or deleted (a training run may be writing there);
  an unreadable checkpoint is reported and the previous one is read instead.

  Args:
    workdir: a training run's directory (checkpoints/ inside).
    abstract_params: meta -> the parameter tree to fill (leaves with .shape and .dtype, e.g.
      `nnx.state(nnx.eval_shape(...), nnx.Param)` of the model built from meta["model"]).
    report: where the fallback messages go.

  Returns:
    (step, params: the tree of abstract_params with arrays, meta: the checkpoint's metadata).

  Raises:
    ValueError: no workdir, no checkpoints, or none readable.
    LayoutError: the checkpoint's parameters are named differently from the model's.
  """
  workdir = os.path.abspath(workdir)
  ckdir = checkpoint_dir(workdir)
  if not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} does not exist; give the --workdir of a training run")
  if not os.path.isdir(ckdir):
    raise ValueError(f"{workdir} holds no {CHECKPOINTS}/ directory: train it first "
                     f"(rove-train --config ... --workdir {workdir})")
  ck = Checkpointer(ckdir)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])

  def restore_step(step):
    stored = ck.stored_entries(step)
    # Every entry onto one device, whatever mesh wrote it (orbax restores a whole item).
    target = None if stored is None else {
        name: jax.ShapeDtypeStruct(md.shape, md.dtype, sharding=device)
        for name, md in stored.items()}
    restored = ck.manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    meta, state = dict(restored["meta"]), restored["state"]
    try:
      abstract = abstract_params(meta)
    except ValueError as e:  # readable, but not a model this code builds: no fallback
      raise LayoutError(f"checkpoint at step {step} in {ckdir} describes a model this version "
                        f"cannot build: {e}") from e
    want = {PARAMS + name for name in to_flat(abstract)}
    check_layout({n for n in state if n.startswith(PARAMS)}, want,
                 where=f"checkpoint at step {step} in {ckdir}")
    return from_flat({name[len(PARAMS):]: state[name] for name in want}, abstract), meta

  def unreadable(step, e):
    report(f"checkpoint at step {step} of {workdir} cannot be restored ({_describe(e)}); "
           f"trying the previous one")

  try:
    found = ck.newest_readable(restore_step, on_unreadable=unreadable)
  except RuntimeError as e:
    raise ValueError(str(e)) from e.__cause__
  finally:
    ck.close()
  if found is None:
    raise ValueError(f"{ckdir} holds no finished checkpoint")
  step, (params, meta) = found
  return step, params, meta


def restore_params(workdir: str, abstract_params: Any, *, report=print):
  """(step, params) of the newest readable checkpoint in workdir: `read_run` for a model whose
  abstract parameter tree is already known."""
  step, params, _ = read_run(workdir, lambda meta: abstract_params, report=report)
  return step, params


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
