"""What stops or shows a running training loop: SIGTERM / SIGINT (`StopSignal`), the progress
bar (`progress`), the failures found between steps (`failure`: a background checkpoint save
that failed, the writer lock taken over by another trainer), what every process says
(`gather_flags`: all stop together), the writer lock taken at the start (`lock`) and released
at the end (`release_lock`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Optional

import jax
import numpy as np
from jax.experimental import multihost_utils

from rove_jax.storage import deadline
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import resume


class StopSignal:
  """SIGTERM / SIGINT set a flag; the loop finishes its step, saves and returns."""

  def __init__(self):
    self.received = None
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    self.received = signal.Signals(signum).name
    deadline.interrupt()  # a wait blocked on storage that stopped answering ends soon

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def progress(total, initial, enabled):
  if not enabled:
    return contextlib.nullcontext(None)
  try:
    from tqdm import tqdm
  except ImportError:
    return contextlib.nullcontext(None)
  return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)


def gather_flags(*flags: bool) -> np.ndarray:
  """Every process's `flags`, the same array on every process: bool [process_count,
  len(flags)]. `.any()` over a column is "any process says so". A collective on a multi-host
  run: every process must call it at the same point."""
  if jax.process_count() == 1:
    return np.array([flags], bool)
  said = multihost_utils.process_allgather(np.array(flags, bool))
  return np.asarray(said).reshape(jax.process_count(), len(flags))


def failure(ckpt, lock) -> Optional[Exception]:
  """What must stop the run now: a background checkpoint save that failed, or the writer lock
  taken over by another trainer (process 0 holds it: `lock`; None elsewhere)."""
  try:
    ckpt.check_saves()
    if lock is not None:
      lock.check()
  except (ckpt_lib.SaveError, resume.LockError) as e:
    return e
  return None


def lock(workdir: str, log) -> Optional[resume.WriterLock]:
  """Process 0's writer lock on the workdir, taken (None on the other processes); if process 0
  cannot take it, every process stops. The lock comes first: opening the checkpoints for
  writing cleans up unfinished saves, which must never happen under another trainer's feet."""
  held = resume.WriterLock(workdir) if jax.process_index() == 0 else None
  error = None
  if held is not None:
    try:
      held.acquire(log=log)
    except resume.LockError as e:
      error = e
  if gather_flags(error is not None).any() and error is None:
    error = resume.LockError(f"process 0 could not lock {workdir}; see its log")
  if error is not None:
    raise error
  return held


def release_lock(lock, log) -> None:
  """Releases the writer lock; while the run is already failing (storage gone), a failure to
  release is logged and the first error stays the one reported."""
  failing = sys.exc_info()[1] is not None
  try:
    lock.release()
  except OSError as e:
    if not failing:
      raise
    log(f"while stopping: the writer lock was left as it was ({e})")
