"""Deadlines on remote storage: no read, write or wait on gs:// blocks a run forever.

Storage that stops answering (a server that accepts and never replies, a bucket behind a dead
network) would otherwise hold the calling thread inside gcsfs, orbax or tensorstore, where
neither a timeout of theirs nor SIGTERM reaches it. `call` runs such an operation in a helper
thread and waits for it in short slices, so that

  * an operation that has not finished after the deadline (`timeout()` seconds: set by the
    run's config (`configure`), by ROVE_JAX_STORAGE_TIMEOUT elsewhere, `DEFAULT_S` otherwise)
    raises StorageTimeout, an OSError naming the operation and the path: the command line ends
    it with one line and exit 1;
  * SIGTERM / SIGINT (`interrupt()`, called by the trainer's signal handler) end a wait that
    is still blocked `STOP_GRACE_S` seconds later with StorageInterrupted, so a stop is honoured
    within seconds, while a save that is merely slow still finishes;
  * once one operation has timed out, storage is taken as gone: later ones (the cleanup of a
    failing run: releasing the lock, closing the checkpoints) wait `GONE_S` seconds at most.

The abandoned helper thread is a daemon: it never keeps the interpreter alive. Nothing is
retried here; what the operation left half done is what the caller's own protections (the
writer lock's lease, orbax's unfinished-checkpoint markers) already handle.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

DEFAULT_S = 180.0
ENV_VAR = "ROVE_JAX_STORAGE_TIMEOUT"
STOP_GRACE_S = 10.0
GONE_S = 5.0
_SLICE_S = 0.1

_configured: Optional[float] = None
_stop = threading.Event()
_gone = threading.Event()


class StorageTimeout(TimeoutError):
  """A remote operation that did not finish within the deadline (an OSError)."""


class StorageInterrupted(InterruptedError):
  """SIGTERM / SIGINT arrived while a remote operation was blocked (an OSError)."""


def checked(seconds) -> Optional[float]:
  """`seconds` as a deadline (None: unset), or ValueError naming the setting."""
  if seconds is None:
    return None
  if not (
    isinstance(seconds, (int, float))
    and not isinstance(seconds, bool)
    and math.isfinite(seconds)
    and seconds > 0
  ):
    raise ValueError(f"storage_timeout must be a number of seconds > 0 (or unset), got {seconds!r}")
  return float(seconds)


def configure(seconds: Optional[float]) -> None:
  """Starts this process's storage deadline for a run (rove_jax.train.resolve, before the
  run's first read): `seconds` (None: the environment's or the default). A stop signal and a
  storage that was gone, both of an earlier run in this process, are forgotten."""
  global _configured
  _configured = checked(seconds)
  _stop.clear()
  _gone.clear()


def timeout() -> float:
  if _configured is not None:
    return _configured
  value = os.environ.get(ENV_VAR)
  if value:
    try:
      seconds = float(value)
    except ValueError:
      seconds = 0.0
    if seconds > 0:
      return seconds
    raise ValueError(f"{ENV_VAR}={value!r}: give the storage deadline in seconds (> 0)")
  return DEFAULT_S


def interrupt() -> None:
  """A stop signal arrived: blocked remote waits end within STOP_GRACE_S."""
  _stop.set()


def call(fn: Callable[[], T], *, what: str, path: str) -> T:
  """fn(), an operation on the remote `path` described by `what` ("writing", "listing", ...),
  within the deadline. Its own exceptions pass through unchanged."""
  limit = min(timeout(), GONE_S) if _gone.is_set() else timeout()
  box: dict = {}
  done = threading.Event()

  def run():
    try:
      box["value"] = fn()
    except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
      box["error"] = e
    finally:
      done.set()

  threading.Thread(target=run, name=f"rove-jax storage: {what}", daemon=True).start()
  start = time.monotonic()
  stopped_at = None
  while not done.wait(_SLICE_S):
    now = time.monotonic()
    if _stop.is_set() and stopped_at is None:
      stopped_at = now
    if stopped_at is not None and now - stopped_at >= STOP_GRACE_S:
      _gone.set()
      raise StorageInterrupted(
        f"{what} {path}: a stop signal arrived while storage had not answered for "
        f"{now - start:.0f} s; stopping without it (what was saved before is intact)"
      )
    if now - start >= limit:
      _gone.set()
      raise StorageTimeout(
        f"{what} {path}: storage did not answer within {limit:g} s (the storage deadline: "
        f"--config.storage_timeout or {ENV_VAR}); stopping (what was saved before is intact)"
      )
  if "error" in box:
    raise box["error"]
  return box.get("value")


class Bounded:
  """`target` (a storage client such as orbax's CheckpointManager on a gs:// directory) with
  every method call run by `call` on `path`; `whats` names the operations for the message."""

  def __init__(self, target, path: str, whats: dict):
    self._target, self._path, self._whats = target, str(path), whats

  def __getattr__(self, name):
    attr = getattr(self._target, name)
    if not callable(attr):
      return attr
    what = self._whats.get(name, f"{name} on")
    return lambda *a, **k: call(lambda: attr(*a, **k), what=what, path=self._path)
