"""Checks at every start of a training run that the prepared shards a process reads are the
bytes their manifest vouches for, hashing a shard only when it may have changed.

A shard is hashed (sha256, against the manifest's) once per machine, and what was found is kept
as a record in the local cache ($XDG_CACHE_HOME/rove_jax/verified, default
~/.cache/rove_jax/verified): keyed by the local file read (the shard itself, or the local copy of
a gs:// shard, see `paths.local_copy`), it holds the file's size, modification and change times,
inode and device as they were when it was hashed. A later start stats each file and compares:
a file written since, in place and keeping its size too, has another change time (a write sets
it, and no one can set it back), so it is hashed again. A record is written only for a file
whose change time lies more than `SETTLE_NS` before its hashing began, so that a write in the
same tick of the file system's coarse clock cannot hide behind an unchanged stamp; such a file
is simply hashed again at the next start.

Every process checks every shard it reads (all of them: each reads its rows of every window).
The processes of one machine share the records, each starting with its own share of the shards
(position i with i % process_count == process_index) and skipping a shard another one recorded
meanwhile, so that together they hash each shard about once; processes on another machine hash
their own copies once.

A local copy of a gs:// shard that fails is fetched again once (the cache is damaged, not the
dataset). What to do about a shard that still fails is the caller's (`prepared.for_run`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

from rove_jax.data.sources import SPLITS
from rove_jax.storage import paths

SETTLE_NS = 1_000_000_000
RECORD_VERSION = 1
_HASH_CHUNK = 1 << 24


def file_sha256(file: str, start: int = 0) -> str:
  """The hex sha256 of a file's bytes from offset `start` on, read in chunks (local or gs://)."""
  h = hashlib.sha256()
  with paths.open_read(file) as f:
    f.seek(start)
    for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
      h.update(chunk)
  return h.hexdigest()


def local_file(path: str, shard: dict, log=None) -> str:
  """The local file holding a manifest's `shard` of the directory `path`: the shard itself,
  or for gs:// its copy in the local cache (made now if missing)."""
  return paths.local_copy(paths.join(path, shard["file"]), expect_size=shard["bytes"], log=log)


def records_dir() -> str:
  """Where this machine keeps its records of hashed shards."""
  base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
  return os.path.join(base, "rove_jax", "verified")


def _record_path(local: str) -> str:
  key = hashlib.sha256(os.path.realpath(local).encode("utf-8")).hexdigest()[:32]
  return os.path.join(records_dir(), f"{key}.json")


def _stamp(st: os.stat_result) -> list[int]:
  return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def is_recorded(local: str, sha256: str) -> bool:
  """True when `local` was hashed to `sha256` on this machine and has not changed since."""
  try:
    with open(_record_path(local), encoding="utf-8") as f:
      record = json.load(f)
    st = os.stat(local)
  except (OSError, ValueError):
    return False
  return (
    isinstance(record, dict)
    and record.get("version") == RECORD_VERSION
    and record.get("file") == os.path.realpath(local)
    and record.get("sha256") == sha256
    and record.get("stamp") == _stamp(st)
  )


def hash_and_record(local: str, sha256: str) -> bool:
  """Hashes `local`; True when it is `sha256`, which is then recorded unless the file changed
  too recently to trust its stamp (or during the hashing)."""
  began = time.time_ns()
  before = os.stat(local)
  ok = file_sha256(local) == sha256
  after = os.stat(local)
  if ok and _stamp(before) == _stamp(after) and before.st_ctime_ns < began - SETTLE_NS:
    record = {
      "version": RECORD_VERSION,
      "file": os.path.realpath(local),
      "sha256": sha256,
      "stamp": _stamp(before),
    }
    try:
      paths.write_atomic(_record_path(local), json.dumps(record))
    except OSError:  # a read-only cache costs a hash at every start, nothing else
      pass
  return ok


def check(
  path: str, manifest: dict, *, process_index: int = 0, process_count: int = 1, log=None
) -> tuple[int, list[dict]]:
  """Checks every shard of the prepared directory `path` (resolved) that a run reads.

  Args:
    path: the prepared directory, resolved (local or gs://).
    manifest: its manifest (`prepared.read_manifest`).
    process_index, process_count: this process, for the order in which shards are hashed.
    log: a function of one string.

  Returns:
    (how many shards were hashed now, the shard records of those that do not match: for gs://,
    a fresh local copy of each did not match either).
  """
  log = log or (lambda line: None)
  shards = [s for split in SPLITS for s in manifest["splits"][split]["shards"]]
  n = len(shards)
  mine = set(range(process_index, n, process_count))  # this process's share first
  todo = [shards[i] for i in sorted(mine)] + [s for i, s in enumerate(shards) if i not in mine]
  hashed, bad = 0, []
  t = time.perf_counter()
  for shard in todo:
    local = local_file(path, shard, log)
    if is_recorded(local, shard["sha256"]):
      continue
    hashed += 1
    ok = hash_and_record(local, shard["sha256"])
    if not ok and paths.is_remote(path):  # perhaps only the local copy is damaged
      log(
        f"the local copy {local} of {paths.join(path, shard['file'])} does not match its "
        f"sha256: fetching it again"
      )
      os.remove(local)
      ok = hash_and_record(local_file(path, shard, log), shard["sha256"])
    if not ok:
      bad.append(shard)
  size = sum(s["bytes"] for s in shards)
  log(
    f"verifying the {n} shards of {path} ({size / 2**20:.1f} MiB): {hashed} hashed "
    f"(sha256) in {time.perf_counter() - t:.1f} s, the others unchanged since hashed"
  )
  return hashed, bad
