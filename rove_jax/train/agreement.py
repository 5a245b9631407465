"""Before step 1 of a multi-process run, every process confirms that it writes where the others
do and trains what they train.

Process 0 (holding the writer lock) writes `workdir/.run-check.json` with a fresh random nonce
and the digest of its config; the nonce and digest travel to every process over jax's
collectives (not through the storage); each process then reads the file from *its* workdir,
retrying for a bounded time (a shared file system may show a new file late), and compares.
What every process found is gathered over the collectives, so all of them raise the same
error at the same point: a run whose processes were given different workdirs, or a workdir
that is not shared storage, or different configs, stops within `timeout_s` (TIMEOUT_S, or the
environment variable ROVE_JAX_SHARED_CHECK_S) on every process,
naming which processes differ, instead of hanging at the first checkpoint. Nothing here reads
a clock of another host.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time

import jax
import numpy as np

from rove_jax.storage import paths

CHECK_FILE = ".run-check.json"
TIMEOUT_S = 60.0
_OK, _MISSING, _OTHER = 0, 1, 2  # what a process found in its workdir


def config_digest(c) -> str:
  """The sha256 of a RunConfig: its `to_dict()` as canonical JSON."""
  return hashlib.sha256(json.dumps(c.to_dict(), sort_keys=True, default=str).encode()).hexdigest()


def _words(hex_digest: str, n: int = 4) -> list[int]:
  """The first n 31-bit words of a hex digest (int32 travels through collectives without x64)."""
  return [int(hex_digest[8 * i : 8 * i + 8], 16) & 0x7FFFFFFF for i in range(n)]


def confirm(workdir: str, c, *, timeout_s: float | None = None) -> None:
  """Raises ValueError on every process unless all of them see process 0's check file in their
  workdir and hold the same config; returns at once for a single process. Call it on every
  process at the same point, after process 0 took the writer lock."""
  nproc, pidx = jax.process_count(), jax.process_index()
  if nproc == 1:
    return
  if timeout_s is None:
    timeout_s = float(os.environ.get("ROVE_JAX_SHARED_CHECK_S", TIMEOUT_S))
  from jax.experimental import multihost_utils

  digest = config_digest(c)
  path = paths.join(workdir, CHECK_FILE)
  nonce = secrets.token_hex(16)
  if pidx == 0:
    paths.write_atomic(path, json.dumps({"nonce": nonce, "config": digest}))
  # process 0's nonce reaches everyone over the collectives, not through the workdir
  words = multihost_utils.broadcast_one_to_all(np.array(_words(nonce), np.int32))
  want = [int(w) for w in np.asarray(words)]
  found, deadline = _MISSING, time.monotonic() + timeout_s
  while True:
    try:
      seen = json.loads(paths.read_bytes(path)).get("nonce", "")
      found = _OK if _words(seen) == want else _OTHER
    except (OSError, ValueError):
      found = _MISSING
    if found == _OK or time.monotonic() > deadline:
      break
    time.sleep(min(1.0, timeout_s / 20))
  mine = np.array([found] + _words(digest), np.int32)
  table = np.asarray(multihost_utils.process_allgather(mine)).reshape(nproc, -1)
  blind = [i for i in range(nproc) if table[i, 0] != _OK]
  if blind:
    what = (
      "missing" if all(table[i, 0] == _MISSING for i in blind) else "one written by another run"
    )
    raise ValueError(
      f"processes {blind} of {nproc} do not see the workdir process 0 writes ({workdir}: "
      f"the file {CHECK_FILE} there is {what} after {timeout_s:.0f} s). Every process must "
      f"be given the same --workdir, on storage they share (gs://bucket/path, or a shared "
      f"file system); nothing was trained."
    )
  differ = [i for i in range(nproc) if list(table[i, 1:]) != list(table[0, 1:])]
  if differ:
    raise ValueError(
      f"processes {differ} of {nproc} were given another config than process 0 (config "
      f"digests differ): give every process the same --config file and --config.* "
      f"overrides; nothing was trained."
    )


def gather_json(obj) -> list:
  """Every process's `obj` (JSON-serialisable), in process order; [obj] for one process. Call
  it on every process at the same point."""
  nproc = jax.process_count()
  if nproc == 1:
    return [obj]
  from jax.experimental import multihost_utils

  blob = np.frombuffer(json.dumps(obj, sort_keys=True, default=str).encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int32)))
  sizes = sizes.reshape(nproc)
  padded = np.zeros(int(sizes.max()), np.int32)  # int32: what collectives carry without x64
  padded[: blob.size] = blob
  table = np.asarray(multihost_utils.process_allgather(padded)).reshape(nproc, -1)
  return [json.loads(table[i, : sizes[i]].astype(np.uint8).tobytes()) for i in range(nproc)]
