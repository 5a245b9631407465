"""Which storage failures are which: the GCS client stack's own exceptions, refusals of access
(the caller's location is at fault: exit 2) and storage that failed (unreachable, erroring,
full: I/O, exit 1). Shared by the path layer and the GCS module."""

from __future__ import annotations

import errno

# The top-level packages of the GCS client stack (gcsfs and what it calls): their exceptions
# are storage failures, to be reported as I/O errors like an OSError.
_CLIENT_PACKAGES = ("gcsfs", "google", "aiohttp", "requests", "fsspec")

# errnos of storage that failed rather than refused: retrying later may succeed.
_UNAVAILABLE_ERRNOS = {
  errno.ENOSPC,
  errno.EDQUOT,
  errno.EIO,
  errno.ENOMEM,
  errno.ETIMEDOUT,
  errno.EAGAIN,
  errno.ECONNREFUSED,
  errno.ECONNRESET,
  errno.EHOSTUNREACH,
  errno.ENETUNREACH,
}


def is_storage_error(e: BaseException) -> bool:
  """An exception raised by the GCS client libraries (e.g. gcsfs.retry.HttpError, a
  google.auth credentials error), which are not OSErrors."""
  return type(e).__module__.split(".")[0] in _CLIENT_PACKAGES


def is_unavailable(e: BaseException) -> bool:
  """Storage that failed (unreachable, timing out, a server error, full), as opposed to a
  location that refused access or cannot hold a directory."""
  if isinstance(e, (ConnectionError, TimeoutError, InterruptedError)):
    return True
  if isinstance(e, OSError) and e.errno in _UNAVAILABLE_ERRNOS:
    return True
  code = getattr(e, "code", None)
  if isinstance(code, int):
    return code >= 500 or code in (408, 429)
  return is_storage_error(e) and not isinstance(e, FileNotFoundError)


def input_error(e: BaseException, message: str, cls: type = ValueError) -> BaseException:
  """What to raise for `e`, met reading an input: `cls(message)` (the input is wrong or
  missing), or, where the storage failed (is_unavailable), `e`'s own type with `message`, so
  that the caller's exit status blames the machine (1), not the input (2)."""
  if is_unavailable(e) and isinstance(e, OSError):
    return type(e)(message)
  return cls(message)
