"""Orbax checkpoints of a training run: the only module that knows their layout.

A checkpoint at step s is `workdir/checkpoints/s/` with three items:
  state  the train state flattened to {entry name: array} (`to_flat`): "params.<path>" for the
         parameters, "opt_state.<path>" and "step"; written by orbax/tensorstore
  data   the grain iterator state (JSON), so a resumed run sees exactly the same batches
  meta   the model config once, `GPTConfig.to_dict()` under "model" (read back with
         `GPTConfig.from_dict`), the rest of the resolved run config under "config" (the
         two read back as a RunConfig by `RunConfig.from_metadata`) and the tokenizer (JSON),
         read before anything is built

Training resumes with `Checkpointer.restore_latest`; evaluation (and the notebook, through
`rove_jax.evaluation.scoring.load_run`) reads a finished run with
`rove_jax.train.run_reader.read_run(workdir, abstract_params)` (step, parameters, metadata);
`run_reader.restore_params` does the same for a known parameter tree. A checkpoint whose entry
names differ from the model's (written by another
parameter layout, e.g. separate attn.wq/wk/wv where the model now fuses them) is a LayoutError
naming the missing and unexpected entries; it is never taken for an unreadable one.

The workdir is a local path or gs://bucket/path (rove_jax.storage.paths); orbax receives the
same string (a local one with glob characters through `paths.orbax_dir`). Orbax writes each
checkpoint into a temporary directory and renames it when complete (on GCS, which cannot rename
a directory, it writes in place and marks the step complete with a commit_success.txt last), so
a process killed mid-save leaves the previous checkpoints intact; old checkpoints are deleted
only after a newer one is finalized. A save that fails is one SaveError (an OSError) naming the
step and its cause; background saves are checked every step (`check_saves`).

Integrity: every save records in meta["integrity"] a checksum of each state array (parameters,
optimizer state, step), of the iterator state and of the rest of the metadata (run and model
config, tokenizer) (`rove_jax.train.checksums`), computed from what is in memory; every restore
verifies them, and so does every read of the metadata alone. A checkpoint that cannot be read for
its own reasons (truncated, missing or
corrupted files, a checksum mismatch, non-finite values, a step other than its directory's
name) is reported by step, moved aside to
`workdir/checkpoints_unreadable/` (never deleted) with the reason in its UNREADABLE.txt, and the
previous one is restored instead.
A failure that is not the checkpoint's own (out of memory, permissions, a full disk, a
network file system timing out) stops the restore with every file left where it is.

Readers (`read_run`, evaluation, the notebook) open the directory read-only: they create,
clean up, move and delete nothing, so they are safe beside a run that is writing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Callable, Optional

import orbax.checkpoint as ocp

from rove_jax.storage import deadline, paths
from rove_jax.train import checksums

# the errors and checks of a checkpoint (re-exported: callers use ckpt_lib.SaveError etc.)
from rove_jax.train.checkpoint_checks import (  # noqa: F401
  PARAMS,
  LayoutError,
  RestoreEnvironmentError,
  SaveError,
  check_layout,
  check_step,
  describe,
  not_the_checkpoints_fault,
  root_cause,
)
from rove_jax.train.checksums import CorruptCheckpoint, verify, verify_meta  # noqa: F401

# the train state as named entries (re-exported: callers use ckpt_lib.to_flat etc.)
from rove_jax.train.flat_state import from_flat, non_finite_leaves, to_flat  # noqa: F401

CHECKPOINTS = "checkpoints"  # the directory inside a workdir
REASON_FILE = "UNREADABLE.txt"  # in a checkpoint moved aside: why it was


# What the storage deadline's message calls each CheckpointManager call on a gs:// directory.
_REMOTE_OPERATIONS = {
  "save": "saving a checkpoint in",
  "wait_until_finished": "waiting for a checkpoint write in",
  "restore": "reading a checkpoint in",
  "all_steps": "listing the checkpoints in",
  "item_metadata": "reading checkpoint metadata in",
  "close": "closing the checkpoints in",
  "check_for_errors": "checking the checkpoint writes in",
}


def checkpoint_dir(workdir: str) -> str:
  """Where a training workdir (local or gs://) keeps its checkpoints."""
  return paths.join(paths.resolve(workdir), CHECKPOINTS)


@contextlib.contextmanager
def _without_read_only_notice(active: bool):
  """Drops orbax's "Given directory is read only" warning (absl), which a reader opening the
  directory read-only on purpose gets on every open; every other message passes."""

  def keep(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")

  logger = logging.getLogger("absl")
  if active:
    logger.addFilter(keep)
  try:
    yield
  finally:
    if active:
      logger.removeFilter(keep)


class Checkpointer:
  """A CheckpointManager with integrity checks and fallback on unreadable checkpoints.

  Args:
    directory: the checkpoints directory (`checkpoint_dir(workdir)`).
    keep: how many checkpoints to keep (older ones are deleted after a newer one is final).
    async_save: save in a background thread (the state is copied to the host first).
    read_only: for readers: nothing is created, cleaned up, moved or deleted.
  """

  def __init__(
    self, directory: str, *, keep: int = 3, async_save: bool = True, read_only: bool = False
  ):
    if not (isinstance(keep, int) and keep >= 1):
      raise ValueError(f"keep_checkpoints must be an int >= 1, got {keep!r}")
    self.directory = paths.resolve(directory)
    self.keep = keep
    self.async_save = async_save
    self.read_only = read_only
    self._open()

  def _open(self):
    # Read-only: the saving and cleanup options orbax would otherwise reset, with a warning
    # each, are given as it wants them.
    options = ocp.CheckpointManagerOptions(
      max_to_keep=None if self.read_only else self.keep,
      save_interval_steps=0 if self.read_only else 1,
      create=not self.read_only,
      cleanup_tmp_directories=not self.read_only,
      read_only=self.read_only,
      enable_async_checkpointing=self.async_save and not self.read_only,
    )
    # Handlers named up front: metadata and single items read back without orbax warnings.
    handlers = {
      "state": ocp.StandardCheckpointHandler(),
      "data": ocp.JsonCheckpointHandler(),
      "meta": ocp.JsonCheckpointHandler(),
    }
    self._entries = {}  # step -> stored_entries; a finished step's metadata does not change
    self._pending = None  # the step of the newest save started
    paths.forget_listings(self.directory)
    # orbax globs under the directory: a local name with [ ] * ? reaches it through a link
    where = (
      self.directory
      if self.read_only and not paths.glob_chars(self.directory)
      else (paths.orbax_dir(self.directory))
    )
    with _without_read_only_notice(self.read_only):
      if paths.is_remote(self.directory):  # storage that stops answering ends with an error
        self.manager = deadline.Bounded(
          deadline.call(
            lambda: ocp.CheckpointManager(where, options=options, item_handlers=handlers),
            what="opening the checkpoints in",
            path=self.directory,
          ),
          self.directory,
          _REMOTE_OPERATIONS,
        )
      else:
        self.manager = ocp.CheckpointManager(where, options=options, item_handlers=handlers)

  # ------------------------------------------------------------------------------ query
  def steps(self) -> list[int]:
    return sorted(int(s) for s in self.manager.all_steps())

  def latest_step(self) -> Optional[int]:
    steps = self.steps()
    return steps[-1] if steps else None

  def read_meta(self, step: int) -> dict:
    """The metadata of `step`, checked against its digest (CorruptCheckpoint on a mismatch)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    meta = dict(restored["meta"])
    verify_meta(meta)
    check_step(step, meta)
    return meta

  def newest_meta(self, *, report=print) -> Optional[tuple[int, dict]]:
    """(step, metadata) of the newest checkpoint whose metadata reads, or None; checkpoints
    whose metadata does not read are reported (the restore will deal with them)."""
    for step in reversed(self.steps()):
      try:
        return step, self.read_meta(step)
      except Exception as e:  # noqa: BLE001 - any failure: look at the older one
        report(f"checkpoint at step {step}: its metadata cannot be read ({describe(e)})")
    return None

  def stored_entries(self, step: int) -> Optional[dict]:
    """{entry name: array metadata (shape, dtype)} of the state at `step`, or None when its
    metadata cannot be read (the restore that follows reports that checkpoint as unreadable)."""
    if step not in self._entries:
      try:
        tree = self.manager.item_metadata(step)["state"]
        self._entries[step] = {name: tree[name] for name in tree.keys()}
      except Exception:  # noqa: BLE001 - unreadable metadata: the restore will say so
        return None
    return self._entries[step]

  # ------------------------------------------------------------------------------- save
  def save(self, step: int, state: Any, data_state: dict, meta: dict) -> None:
    """Starts an (async) save of the flat `state` at `step` with the checksums of its arrays
    and of `data_state` in the metadata; refuses a state that is not finite."""
    if self.read_only:
      raise RuntimeError(f"{self.directory} was opened read-only")
    bad = non_finite_leaves(state)
    if bad:
      raise FloatingPointError(
        f"refusing to checkpoint a non-finite train state at step {step} "
        f"(first bad leaves: {bad[:3]})"
      )
    meta = {
      **meta,
      "integrity": {
        "algorithm": checksums.ALGORITHM,
        "state": checksums.array_checksums(state),
        "data": checksums.json_checksum(data_state),
        "meta": checksums.json_checksum(meta),
      },
    }
    self._entries.pop(step, None)
    self.wait()  # orbax would wait for the previous save anyway: its failure is named as its own
    self._pending = step
    with self._saving(f"saving the checkpoint at step {step}"):
      self.manager.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_state),
          meta=ocp.args.JsonSave(meta),
        ),
        force=True,
      )

  @contextlib.contextmanager
  def _saving(self, what: str):
    """Any failure inside as one SaveError naming the directory and its cause."""
    try:
      yield
    except (SaveError, deadline.StorageTimeout, deadline.StorageInterrupted):
      raise  # the deadline's own line names the operation and the path
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many kinds
      latest = self.latest_step_quietly(finished_only=True)
      cause = root_cause(e)
      text = " ".join(str(cause).split())
      if len(text) > 240:  # orbax's messages: the path first, what went wrong at the end
        text = f"{text[:110]} ... {text[-120:]}"
      raise SaveError(
        f"{what} in {self.directory} failed ({type(cause).__name__}: {text}); "
        + (
          f"the checkpoint at step {latest} is intact"
          if latest is not None
          else "no earlier checkpoint exists"
        )
      ) from e

  def latest_step_quietly(self, *, finished_only: bool = False) -> Optional[int]:
    """The newest step, or None when the listing fails; with finished_only, never the step of
    the save in progress (a failed save's directory can be listed without being a checkpoint)."""
    try:
      steps = [s for s in self.steps() if not (finished_only and s == self._pending)]
    except Exception:  # noqa: BLE001 - only for a message
      return None
    return steps[-1] if steps else None

  def _background(self) -> str:
    return f"saving the checkpoint at step {self._pending} (in the background)"

  def check_saves(self) -> None:
    """Raises SaveError if a background save has failed (cheap: call it every step)."""
    with self._saving(self._background()):
      self.manager.check_for_errors()

  def wait(self) -> None:
    with self._saving(self._background()):
      self.manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    except SaveError:
      with contextlib.suppress(Exception):  # it fails again on the same save: say it once
        self.manager.close()
      raise
    self.manager.close()

  def close_quietly(self, log=print) -> None:
    """close() for a run that is already failing: a further error is logged, not raised."""
    try:
      self.close()
    except Exception as e:  # noqa: BLE001 - the first error is the one to report
      log(f"while stopping: {describe(e)}")

  # ---------------------------------------------------------------------------- restore
  def newest_readable(
    self, restore_step: Callable[[int], Any], *, on_unreadable: Callable[[int, Exception], None]
  ):
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
        if not_the_checkpoints_fault(e):
          raise RestoreEnvironmentError(
            f"restoring the checkpoint at step {step} in {self.directory} failed for a reason "
            f"that is not the checkpoint's own ({describe(e)}); nothing was moved or deleted: "
            f"fix the cause and rerun"
          ) from e
        on_unreadable(step, e)
        last = e
    if steps:
      raise RuntimeError(
        f"none of the checkpoints {steps} in {self.directory} could be "
        f"restored (the oldest failed with {describe(last)})"
      ) from last
    return None

  def check_layout(self, step: int, expected_names) -> None:
    """Raises LayoutError when the state at `step` has other entries than `expected_names`
    (nothing is checked when its metadata is unreadable: then the restore fails)."""
    stored = self.stored_entries(step)
    if stored is not None:
      check_layout(
        set(stored), set(expected_names), where=f"checkpoint at step {step} in {self.directory}"
      )

  def restore_latest(self, abstract_state: Any, *, report=print):
    """(step, state, data_state, meta) of the newest readable checkpoint, or None if none
    exists. Unreadable ones are reported, moved aside, and the next older one is tried.

    Args:
      abstract_state: the flat train state (`to_flat`) of ShapeDtypeStructs with shardings.
      report: where the fallback messages go.

    Raises:
      LayoutError: the newest checkpoint names other entries than `abstract_state`.
      RestoreEnvironmentError: a restore failed for a reason outside the checkpoint (nothing
        is moved).
      RuntimeError: every checkpoint was unreadable (each was moved aside).
    """

    def restore_step(step):
      self.check_layout(step, abstract_state)
      restored = self.manager.restore(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=ocp.args.JsonRestore(),
          meta=ocp.args.JsonRestore(),
        ),
      )
      state, data_state, meta = restored["state"], dict(restored["data"]), dict(restored["meta"])
      verify(state, meta, data_state)
      check_step(step, meta, state)
      bad = non_finite_leaves(state)
      if bad:
        raise CorruptCheckpoint(f"non-finite values in {bad[:3]}")
      return state, data_state, meta

    def unreadable(step, e):
      report(
        f"checkpoint at step {step} cannot be restored ({describe(e)}); falling back "
        f"to the previous checkpoint"
      )
      self._quarantine(step, reason=describe(e))

    try:
      found = self.newest_readable(restore_step, on_unreadable=unreadable)
    except RestoreEnvironmentError:
      raise
    except RuntimeError as e:
      raise RuntimeError(f"{e}; they were moved to {self.quarantine_dir()}") from e.__cause__
    if found is None:
      return None
    step, (state, data_state, meta) = found
    return step, state, data_state, meta

  def quarantine_dir(self) -> str:
    """Where unreadable checkpoints are moved (`workdir/checkpoints_unreadable`)."""
    return paths.join(paths.dirname(self.directory), paths.basename(self.directory) + "_unreadable")

  def quarantined(self) -> list[str]:
    """The checkpoints moved aside so far (directory names `<step>-<milliseconds>`)."""
    return paths.listdir(self.quarantine_dir())

  def _quarantine(self, step: int, *, reason: str) -> None:
    """Moves an unreadable step aside (never deletes it) so a new save can reuse the step, with
    the one-line reason in REASON_FILE inside the moved directory."""
    src = paths.join(self.directory, str(step))
    if not paths.exists(src):
      return
    dst = paths.join(self.quarantine_dir(), f"{step}-{int(time.time() * 1000)}")
    self.manager.wait_until_finished()
    paths.move_tree(src, dst)
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    paths.write_atomic(paths.join(dst, REASON_FILE), f"step {step} moved here {when}: {reason}\n")
    self.manager.close()
    self._open()
