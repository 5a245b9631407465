"""What a training run checks before it touches a workdir's checkpoints: that no other trainer
is writing there (a writer lock), and that the saved run is one this config can continue.

The writer lock is `workdir/.writer-lock`, a JSON record {host, pid, started, argv}, created
exclusively (O_EXCL) by process 0 of a run and removed when the run ends. A background thread
touches it every `HEARTBEAT_S` seconds. A lock left by a dead process is taken over: on the same
host when its pid no longer runs (or runs another program), on another host when its heartbeat
is older than `STALE_AFTER_S`. A live holder stops the new run with an error naming it.

Compatibility: the newest checkpoint whose metadata reads is compared with the new config before
anything is restored or moved: model shape, tokenizer, and the optimizer state's structure
(naming the optimizer settings that changed). An incompatible config is an error that leaves
every file where it is.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Optional

from rove_jax.train import checkpoint as ckpt_lib

LOCK_NAME = ".writer-lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0

# The fields that fix the parameter shapes: a workdir's checkpoints must agree on them.
SHAPE_FIELDS = ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "max_len",
                "pos_encoding", "norm", "mlp", "use_bias", "tie_embeddings", "t5_num_buckets")


class LockError(RuntimeError):
  """Another live trainer holds the workdir."""


class IncompatibleRun(ValueError):
  """The saved run cannot be continued with this config."""


def _start_time(pid: int) -> Optional[str]:
  """The kernel's start time of `pid` (Linux /proc), to tell a reused pid apart; None if the
  process does not exist or /proc is unavailable."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


class WriterLock:
  """The exclusive writer lock of a workdir: `acquire`, then `release` when the run ends."""

  def __init__(self, workdir: str, *, stale_after_s: float = STALE_AFTER_S,
               heartbeat_s: float = HEARTBEAT_S):
    self.path = os.path.join(os.path.abspath(workdir), LOCK_NAME)
    self.stale_after_s = stale_after_s
    self.heartbeat_s = heartbeat_s
    self._stop = threading.Event()
    self._thread = None
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "pid_start": _start_time(os.getpid()),
                   "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv[:8]}

  def _holder(self) -> Optional[dict]:
    try:
      with open(self.path) as f:
        return json.load(f)
    except FileNotFoundError:
      return None
    except (OSError, ValueError):  # half-written by a process killed while creating it
      return {}

  def _stale(self, holder: dict) -> bool:
    if not holder:  # unreadable: stale once nobody has touched it for a while
      return self._age() > self.stale_after_s
    if holder.get("host") == self.record["host"]:
      pid = holder.get("pid")
      if not isinstance(pid, int) or not _alive(pid):
        return True
      started = holder.get("pid_start")
      return started is not None and _start_time(pid) not in (None, started)
    return self._age() > self.stale_after_s

  def _age(self) -> float:
    try:
      return time.time() - os.path.getmtime(self.path)
    except OSError:
      return 0.0

  def _create(self) -> bool:
    try:
      fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      json.dump(self.record, f)
    return True

  def acquire(self, *, log=print) -> None:
    for _ in range(3):  # a race with another starter: re-read and decide again
      if self._create():
        break
      holder = self._holder()
      if holder is None:
        continue
      if not self._stale(holder):
        who = (f"pid {holder.get('pid')} on host {holder.get('host')} (started "
               f"{holder.get('started')})" if holder else "a process whose lock is unreadable")
        raise LockError(
            f"workdir {os.path.dirname(self.path)} is being trained by {who}: two trainers on "
            f"one workdir would overwrite each other's checkpoints. Stop that run or choose "
            f"another --workdir. If that process is gone (e.g. its machine was lost), delete "
            f"{self.path}.")
      log(f"taking over the writer lock of a run that is no longer running "
          f"({holder or 'unreadable lock'})")
      try:
        os.remove(self.path)
      except FileNotFoundError:
        pass
    else:
      raise LockError(f"could not create {self.path}: other processes keep creating it")
    self._thread = threading.Thread(target=self._beat, name="rove-jax-writer-lock", daemon=True)
    self._thread.start()

  def _beat(self):
    while not self._stop.wait(self.heartbeat_s):
      try:
        os.utime(self.path)
      except OSError:
        pass

  def release(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
      self._thread = None
      if self._holder() == self.record:
        os.remove(self.path)


# --------------------------------------------------------------------------- compatibility


def check_tokenizer(saved_meta: dict, tokenizer, *, workdir: str) -> None:
  """Raises IncompatibleRun when `tokenizer` maps text to other ids than the tokenizer a
  checkpoint was saved with (its fingerprint, recorded at save; older checkpoints have none).
  For a tokenizer kept as a file in the workdir (bpe), that file was changed or damaged."""
  saved = saved_meta.get("tokenizer", {}).get("fingerprint")
  if saved is None or saved == tokenizer.fingerprint:
    return
  where = getattr(tokenizer, "name", "the tokenizer")
  files = sorted(f for f in os.listdir(workdir) if f.startswith("tokenizer-"))
  raise IncompatibleRun(
      f"the tokenizer {where} loaded for {workdir} is not the one its checkpoint at step "
      f"{saved_meta.get('step')} was trained with (fingerprint {tokenizer.fingerprint[:19]}, "
      f"saved {saved[:19]}){': its file ' + ', '.join(files) + ' changed' if files else ''}. "
      f"Restore the tokenizer file the run was trained with, or train into a new --workdir; "
      f"nothing was moved or deleted.")


def model_diffs(saved: dict, mine: dict) -> dict:
  """{field: (saved, now)} over the shape-defining model fields."""
  return {k: (saved.get(k), mine.get(k)) for k in SHAPE_FIELDS if saved.get(k) != mine.get(k)}


def _section_diffs(saved: dict, mine: dict, prefix: str) -> list[str]:
  keys = sorted(set(saved) | set(mine))
  return [f"{prefix}.{k}: saved {saved.get(k)!r}, now {mine.get(k)!r}" for k in keys
          if saved.get(k) != mine.get(k)]


def check_resumable(ckpt: ckpt_lib.Checkpointer, meta: dict, abstract_flat: dict, *,
                    workdir: str, log=print) -> None:
  """Raises IncompatibleRun (or LayoutError) when the newest readable checkpoint of `ckpt`
  cannot be continued by a run whose metadata would be `meta` and whose flat train state is
  `abstract_flat`. Nothing is restored, moved or deleted.
  """
  found = ckpt.newest_meta(report=log)
  if found is None:
    return
  step, saved = found
  fix = (f"Rerun with the settings the run was started with (its config is in the checkpoint "
         f"metadata and metrics), or train into a new --workdir than {workdir}.")
  diffs = model_diffs(saved.get("model", {}), meta["model"])
  if diffs:
    raise IncompatibleRun(f"workdir {workdir} holds checkpoints of a different model (field: "
                          f"saved, now): {diffs}. {fix}")
  saved_tok = saved.get("tokenizer", {}).get("spec")
  if saved_tok is not None and saved_tok != meta["tokenizer"]["spec"]:
    raise IncompatibleRun(f"the checkpoint at step {step} was trained with tokenizer "
                          f"{saved_tok!r}, the config now says {meta['tokenizer']['spec']!r} "
                          f"(data.tokenizer). {fix}")
  stored = ckpt.stored_entries(step)
  if stored is None:
    return  # unreadable: the restore reports it and falls back
  want = set(abstract_flat)
  differ = set(stored) ^ want
  if differ and not any(n.startswith(ckpt_lib.PARAMS) for n in differ):
    changed = _section_diffs(saved.get("config", {}).get("optim", {}),
                             meta["config"].get("optim", {}), "optim")
    raise IncompatibleRun(
        f"the optimizer state saved at step {step} has another structure than this config's "
        f"({len(want - set(stored))} entries missing, {len(set(stored) - want)} unexpected); "
        f"changed optimizer settings: {'; '.join(changed) or 'none found in the config'}. {fix}")
  ckpt.check_layout(step, want)  # parameters named differently: LayoutError
