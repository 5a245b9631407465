"""Google Cloud Storage for the path layer: the one module that imports gcsfs.

Paths arrive as gs://bucket/key. The file system keeps no listing cache (another process's
writes must be seen at once: the writer lock and the multi-host check depend on it). With
STORAGE_EMULATOR_HOST set (a local GCS API server such as fake-gcs-server, as the tests use)
requests go there unauthenticated; otherwise gcsfs finds the machine's credentials (a TPU VM's
service account, `gcloud auth application-default login`). Orbax and tensorstore reach the same
objects on their own (tensorstore reads TENSORSTORE_GCS_HTTP_URL for an emulator).
"""

from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def _fs(emulator: str):
  import gcsfs  # the [gcs] extra; rove_jax.storage.paths.resolve checked it is installed
  if emulator:
    return gcsfs.GCSFileSystem(use_listings_cache=False, token="anon", skip_instance_cache=True)
  return gcsfs.GCSFileSystem(use_listings_cache=False, skip_instance_cache=True)


def fs():
  return _fs(os.environ.get("STORAGE_EMULATOR_HOST", ""))


def _key(path: str) -> str:
  return str(path)[len("gs://"):].rstrip("/")


def exists(path: str) -> bool:
  return fs().exists(_key(path))


def isdir(path: str) -> bool:
  return fs().isdir(_key(path))


def isfile(path: str) -> bool:
  return fs().isfile(_key(path))


def listdir(path: str) -> list[str]:
  try:
    entries = fs().ls(_key(path), detail=False)
  except FileNotFoundError:
    return []
  key = _key(path)
  return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries if e.rstrip("/") != key})


def file_sizes(path: str) -> dict[str, int]:
  """{name: size} of the objects directly under path, from one listing request."""
  try:
    entries = fs().ls(_key(path), detail=True)
  except FileNotFoundError:
    return {}
  return {e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
          for e in entries if e.get("type") == "file"}


def remove(path: str) -> None:
  fs().rm_file(_key(path))


def rmtree(path: str) -> None:
  # object by object: gcsfs's rm(recursive=True) would read [ ] * ? in the name as a pattern
  key = _key(path)
  for name in fs().find(key):
    if name == key or name.startswith(key + "/"):
      fs().rm_file(name)


def size(path: str) -> int:
  return int(fs().info(_key(path))["size"])


def mtime(path: str) -> float:
  return fs().info(_key(path))["mtime"].timestamp()


def read_bytes(path: str) -> bytes:
  return fs().cat_file(_key(path))


def open_read(path: str):
  return fs().open(_key(path), "rb")


def download_into(path: str, f) -> None:
  with fs().open(_key(path), "rb", block_size=16 * 2**20) as src:
    while True:
      chunk = src.read(16 * 2**20)
      if not chunk:
        return
      f.write(chunk)


def write(path: str, data: bytes) -> None:
  fs().pipe_file(_key(path), data)


def create_exclusive(path: str, data: bytes) -> bool:
  """Creates the object only if it does not exist (the ifGenerationMatch=0 precondition)."""
  try:
    fs().pipe_file(_key(path), data, mode="create")
  except FileExistsError:
    return False
  return True


def walk_files(root: str) -> list[str]:
  key = _key(root)
  return sorted(p[len(key) + 1:] for p in fs().find(key) if p.startswith(key + "/"))


def forget_listings() -> None:
  """Drops the directory listings cached by the gcsfs instance that orbax reaches through
  etils.epath (created as GCSFileSystem(finalize_on_close=True), which fsspec keeps as one
  instance): after this module moved or deleted objects, orbax must list them afresh."""
  import gcsfs
  gcsfs.GCSFileSystem(finalize_on_close=True).invalidate_cache()
