"""What stops or shows a running training loop: SIGTERM / SIGINT (`StopSignal`), the progress
bar (`progress`), and the failures found between steps (`failure`: a background checkpoint save
that failed, the writer lock taken over by another trainer).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Optional

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
