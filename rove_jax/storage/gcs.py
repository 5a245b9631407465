"""Google Cloud Storage for the path layer: the one module that imports gcsfs.

Paths arrive as gs://bucket/key. The file system keeps no listing cache (another process's
writes must be seen at once: the writer lock and the multi-host check depend on it). With
STORAGE_EMULATOR_HOST set (a local GCS API server such as fake-gcs-server, as the tests use)
requests go there unauthenticated; otherwise gcsfs finds the machine's credentials (a TPU VM's
service account, `gcloud auth application-default login`). Orbax and tensorstore reach the same
objects on their own (tensorstore reads TENSORSTORE_GCS_HTTP_URL for an emulator).

Every request runs under the storage deadline (rove_jax.storage.deadline): storage that stops
answering ends the operation with StorageTimeout instead of blocking the run.
"""

from __future__ import annotations

import functools
import io
import logging
import os

from rove_jax.storage import deadline, errors


@functools.lru_cache(maxsize=None)
def _fs(emulator: str):
  import gcsfs  # the [gcs] extra; rove_jax.storage.paths.resolve checked it is installed

  # gcsfs logs each request that runs out of retries with its traceback (dozens of lines); the
  # failure reaches the caller as an exception, reported in one line. ROVE_JAX_TRACEBACK=1
  # keeps gcsfs's log.
  if os.environ.get("ROVE_JAX_TRACEBACK") != "1":
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
  if emulator:
    # The core client: gcsfs's experimental one (chosen at its import unless
    # GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false) first probes the server over gRPC, which an
    # emulator never answers.
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem(use_listings_cache=False, token="anon", skip_instance_cache=True)
  return gcsfs.GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)


def fs():
  return _fs(os.environ.get("STORAGE_EMULATOR_HOST", ""))


def _key(path: str) -> str:
  return str(path)[len("gs://") :].rstrip("/")


def exists(path: str) -> bool:
  return _call(lambda: fs().exists(_key(path)), "checking", path)


def isdir(path: str) -> bool:
  return _call(lambda: fs().isdir(_key(path)), "checking", path)


def isfile(path: str) -> bool:
  return _call(lambda: fs().isfile(_key(path)), "checking", path)


def listdir(path: str) -> list[str]:
  try:
    entries = _call(lambda: fs().ls(_key(path), detail=False), "listing", path)
  except FileNotFoundError:
    return []
  key = _key(path)
  return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != key})


def file_sizes(path: str) -> dict[str, int]:
  """{name: size} of the objects directly under path, from one listing request."""
  try:
    entries = _call(lambda: fs().ls(_key(path), detail=True), "listing", path)
  except FileNotFoundError:
    return {}
  return {
    e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
    for e in entries
    if e.get("type") == "file"
  }


def remove(path: str) -> None:
  _call(lambda: fs().rm_file(_key(path)), "deleting", path)


def rmtree(path: str) -> None:
  # object by object: gcsfs's rm(recursive=True) would read [ ] * ? in the name as a pattern
  key = _key(path)
  for name in _call(lambda: fs().find(key), "listing", path):
    if name == key or name.startswith(key + "/"):
      _call(lambda: fs().rm_file(name), "deleting", f"gs://{name}")


def size(path: str) -> int:
  return int(_call(lambda: fs().info(_key(path)), "reading the size of", path)["size"])


def mtime(path: str) -> float:
  return _call(lambda: fs().info(_key(path)), "reading the time of", path)["mtime"].timestamp()


def read_bytes(path: str) -> bytes:
  return _call(lambda: fs().cat_file(_key(path)), "reading", path)


def open_read(path: str):
  """A binary file object whose every read runs under the storage deadline."""
  return _DeadlinedReader(_call(lambda: fs().open(_key(path), "rb"), "opening", path), path)


def download_into(path: str, f) -> None:
  src = _call(lambda: fs().open(_key(path), "rb", block_size=16 * 2**20), "opening", path)
  with _DeadlinedReader(src, path) as src:
    while True:
      chunk = src.read(16 * 2**20)  # each chunk within the deadline, not the whole download
      if not chunk:
        return
      f.write(chunk)


def write(path: str, data: bytes) -> None:
  _call(lambda: fs().pipe_file(_key(path), data), "writing", path)


def create_exclusive(path: str, data: bytes) -> bool:
  """Creates the object only if it does not exist (the ifGenerationMatch=0 precondition)."""
  try:
    _call(lambda: fs().pipe_file(_key(path), data, mode="create"), "creating", path)
  except FileExistsError:
    return False
  return True


def walk_files(root: str) -> list[str]:
  key = _key(root)
  found = _call(lambda: fs().find(key), "listing", root)
  return sorted(p[len(key) + 1 :] for p in found if p.startswith(key + "/"))


def forget_listings() -> None:
  """Drops the directory listings cached by the gcsfs instance that orbax reaches through
  etils.epath (created as GCSFileSystem(finalize_on_close=True), which fsspec keeps as one
  instance): after this module moved or deleted objects, orbax must list them afresh."""
  import gcsfs

  _call(
    lambda: gcsfs.GCSFileSystem(finalize_on_close=True).invalidate_cache(),
    "reaching",
    "gs:// (orbax's client)",
  )


class StorageError(OSError):
  """A request the GCS client gave up on (a server error after its retries), as an OSError
  naming the operation and the path; `code` is the HTTP status when there was one."""

  def __init__(self, message: str, code=None):
    super().__init__(message)
    self.code = code


def _call(fn, what: str, path: str):
  try:
    return deadline.call(fn, what=what, path=str(path))
  except Exception as e:  # noqa: BLE001 - the client stack's own errors, re-raised otherwise
    # gcsfs's generic OSError (a 403 is "Forbidden: <key>"; its subclasses, such as
    # FileNotFoundError, are what callers test for and pass unchanged) and its own errors.
    if not (type(e) is OSError or (not isinstance(e, OSError) and errors.is_storage_error(e))):
      raise
    code = getattr(e, "code", None) or (403 if str(e).startswith("Forbidden") else None)
    text = str(getattr(e, "message", "") or e)
    if code == 403 and text.startswith("Forbidden"):  # "Forbidden: <key>\n<the server's reason>"
      text = text.partition("\n")[2] or "Forbidden"
    detail = " ".join(text.split()) or type(e).__name__
    detail = detail.removesuffix(f", {code}")  # gcsfs appends the status to the message
    raise StorageError(
      f"{what} {path} failed ({f'HTTP {code}: ' if code else ''}{detail})", code
    ) from e


class _DeadlinedReader(io.RawIOBase):
  """A gcsfs file opened for reading, each read and seek under the storage deadline."""

  def __init__(self, f, path: str):
    super().__init__()
    self._f, self._path = f, str(path)

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def read(self, size: int = -1) -> bytes:
    return _call(lambda: self._f.read(size), "reading", self._path)

  def readinto(self, b) -> int:
    data = self.read(len(b))
    b[: len(data)] = data
    return len(data)

  def seek(self, offset: int, whence: int = 0) -> int:
    return self._f.seek(offset, whence)  # gcsfs seeks without a request

  def tell(self) -> int:
    return self._f.tell()

  def close(self) -> None:
    if not self.closed:
      self._f.close()
    super().close()
