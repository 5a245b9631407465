"""What makes a checkpoint unusable, and whose fault a failure is: the checkpoint's errors,
the failures that belong to the machine rather than to the files (never a reason to move a
checkpoint aside), and the two checks a restored checkpoint must pass (its step, its entry
names). rove_jax.train.checkpoint, the owner of the layout, raises and re-exports them.
"""

from __future__ import annotations

import errno
from typing import Optional

import jax

from rove_jax.train.checksums import CorruptCheckpoint

PARAMS = "params."  # the prefix of the parameter entries in the flat state


class LayoutError(ValueError):
  """A readable checkpoint whose entries do not match the tree it is restored into."""


class RestoreEnvironmentError(RuntimeError):
  """A restore that failed for a reason outside the checkpoint (memory, permissions, disk)."""


class SaveError(OSError):
  """Writing a checkpoint failed (a full disk, read-only or unreachable storage); the
  checkpoints finished before it are intact."""


_ENV_ERRNOS = {
  errno.ENOMEM,
  errno.EACCES,
  errno.EPERM,
  errno.EROFS,
  errno.ENOSPC,
  errno.EMFILE,
  errno.ENFILE,
  errno.ETIMEDOUT,
  errno.EAGAIN,
  errno.EINTR,
}
_ENV_MARKERS = (
  "RESOURCE_EXHAUSTED",
  "out of memory",
  "Out of memory",
  "PERMISSION_DENIED",
  "DEADLINE_EXCEEDED",
  "UNAVAILABLE",
  "Cannot allocate memory",
)


def not_the_checkpoints_fault(e: BaseException) -> bool:
  """Failures of the machine rather than of the files: retrying later may well succeed, so
  they must never get a checkpoint moved aside."""
  if isinstance(e, (MemoryError, PermissionError, TimeoutError, ConnectionError, InterruptedError)):
    return True
  if isinstance(e, OSError) and e.errno in _ENV_ERRNOS:
    return True
  return any(m in str(e) for m in _ENV_MARKERS)


def root_cause(e: BaseException, *, implicit: bool = True) -> BaseException:
  """The innermost exception of a chain (orbax wraps the OSError that says what happened):
  through `raise ... from` causes and, with implicit, the exceptions raised while handling
  another."""
  seen = set()
  inner = lambda x: x.__cause__ or (x.__context__ if implicit else None)
  while id(e) not in seen and inner(e) is not None:
    seen.add(id(e))
    e = inner(e)
  return e


def describe(e: BaseException) -> str:
  """One line: the exception's type and first line or, when it wraps another (orbax's
  "Encountered error while reading array index" wraps tensorstore's reason), its first sentence
  and the innermost cause's type and first line, which say what was wrong."""

  def line(x: BaseException, limit: int, first_sentence: bool = False) -> str:
    text = str(x).splitlines()[0] if str(x).strip() else ""
    text = text.split(". ")[0] if first_sentence else text
    return f"{type(x).__name__}: {text[:limit]}"

  root = root_cause(e, implicit=False)  # what the wrapper says it wraps, not a later failure
  if root is e:
    return line(e, 200)
  return f"{line(e, 160, first_sentence=True)}; caused by {line(root, 400)}"


def check_step(step: int, meta: dict, state: Optional[dict] = None) -> None:
  """Raises CorruptCheckpoint when the step a checkpoint records (its metadata's "step" and,
  given the restored flat state, the state's step) is not the step its directory is named by:
  a checkpoint directory copied or renamed under another number, whose state, data position
  and schedule belong to the step it records."""
  recorded = {"metadata": meta.get("step")}
  if state is not None and "step" in state:
    value = state["step"]  # replicated: any local shard holds it, on every host
    value = value.addressable_data(0) if hasattr(value, "addressable_data") else value
    recorded["state"] = int(jax.device_get(value))
  differ = {k: v for k, v in recorded.items() if v is not None and v != step}
  if differ:
    raise CorruptCheckpoint(
      f"its directory says step {step} but its "
      + " and ".join(f"{k} records step {v}" for k, v in differ.items())
      + " (a checkpoint directory copied or renamed under another step number)"
    )


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
    f"wrote it, or train into a fresh --workdir."
  )
