"""The writer lock of a directory (a training workdir, rove-prepare's output): one process
writes there at a time, on local disks, shared file systems and GCS alike.

The lock is a sequence of files `DIR/.writer-lock.<n>`; the one with the highest n is in force.
Taking the lock means creating the next number with `paths.create_exclusive` (a hard link locally,
the ifGenerationMatch=0 precondition on GCS), so of several processes that find the lock free
(absent, released or stale) exactly one gets it and the others see it taken. Numbers only grow:
a released lock is rewritten as released, not deleted (only a full disk, where nothing can be
rewritten, gets it deleted), so no two holders create the same number from different pasts.

The holder renews its lease every `heartbeat_s` by rewriting its file. A lock is stale when the
file's age exceeds `stale_after_s`, the age measured between two timestamps of the storage
itself (the file's modification time and that of a probe written now), never with this
machine's clock, so hosts whose clocks disagree still agree on staleness. A holder whose lock
was taken over (it stalled past the lease) finds a higher number at its next heartbeat:
`check()` then raises, and the run stops before it writes another checkpoint.

The fast path: a lock whose holder's process is gone is free at once, without waiting for the
lease, but only when its pid means the same process here as where it was written. A hostname
does not prove that (two containers on one host network share a name, cloned machines too), so
each record carries its pid namespace: the kernel's boot id (random at each boot, so two
machines or two boots never share it) and the inode of /proc/self/ns/pid (unique among the pid
namespaces alive on that kernel; reused only after every process of the old one is gone). Equal
values mean the holder's pid is a pid of this process's namespace, and `kill(pid, 0)` with the
kernel start time of the pid tells whether that process still runs. Any other record (another
namespace or machine, a system without /proc, a record of an older version) is judged by its
lease alone.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
import uuid
from typing import Optional

from rove_jax.storage import paths

PREFIX = ".writer-lock."
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)$")


class LockError(RuntimeError):
  """Another live process holds the lock (or took it over from this one)."""


def _start_time(pid: int) -> Optional[str]:
  """The kernel's start time of `pid` (Linux /proc), to tell a reused pid apart; None if the
  process does not exist or /proc is unavailable."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _pid_namespace() -> Optional[str]:
  """Where this process's pid has its meaning: "<boot id>:<nsfs device>:<pid namespace inode>";
  None where /proc cannot say (not Linux, /proc unmounted or masked, or a /proc mounted from
  another pid namespace, whose /proc/<pid> files would describe other processes)."""
  try:
    if os.readlink("/proc/self") != str(os.getpid()):
      return None
    with open("/proc/sys/kernel/random/boot_id") as f:
      boot = f.read().strip()
    ns = os.stat("/proc/self/ns/pid")
  except OSError:
    return None
  return f"{boot}:{ns.st_dev}:{ns.st_ino}" if boot else None


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by someone else
    return True
  return True


class WriterLock:
  """The exclusive writer lock of `directory`: `acquire`, `check` now and then, `release`.

  Args:
    directory: a local path or gs:// URL (resolved).
    what: what the lock protects, for messages ("workdir", "prepared dataset").
    stale_after_s: a lease not renewed for this long (storage time) may be taken over.
    heartbeat_s: how often the holder renews it.
  """

  def __init__(
    self,
    directory: str,
    *,
    what: str = "workdir",
    stale_after_s: float = STALE_AFTER_S,
    heartbeat_s: float = HEARTBEAT_S,
  ):
    self.directory = directory
    self.what = what
    self.stale_after_s = stale_after_s
    self.heartbeat_s = heartbeat_s
    self.path: Optional[str] = None
    self.lost: Optional[str] = None
    self._number = 0
    self._stop = threading.Event()
    self._thread = None
    self.record = {
      "host": socket.gethostname(),
      "pid": os.getpid(),
      "pid_start": _start_time(os.getpid()),
      "pid_namespace": _pid_namespace(),
      "id": uuid.uuid4().hex,
      "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
      "argv": sys.argv[:8],
      "beat": 0,
    }

  # ---------------------------------------------------------------------------- reading
  def _numbers(self) -> list[int]:
    found = (_NAME.match(name) for name in paths.listdir(self.directory))
    return sorted(int(m.group(1)) for m in found if m)

  def _file(self, number: int) -> str:
    return paths.join(self.directory, f"{PREFIX}{number}")

  def _read(self, number: int) -> Optional[dict]:
    """The record of lock `number`; {} when unreadable, None when gone."""
    try:
      record = json.loads(paths.read_bytes(self._file(number)))
    except FileNotFoundError:
      return None
    except (OSError, ValueError):
      return {}
    return record if isinstance(record, dict) else {}

  def _age(self, number: int) -> float:
    """Seconds since lock `number` was last renewed, by the storage's clock."""
    try:
      return paths.storage_now(self.directory) - paths.mtime(self._file(number))
    except FileNotFoundError:
      return float("inf")

  def _free(self, number: int, holder: dict) -> bool:
    if holder.get("released"):
      return True
    if self._same_pid_namespace(holder):
      pid = holder["pid"]
      if not _alive(pid):
        return True
      started = holder.get("pid_start")  # a live pid started later is another process
      return started is not None and _start_time(pid) not in (None, started)
    return self._age(number) > self.stale_after_s

  def _same_pid_namespace(self, holder: dict) -> bool:
    """Whether the holder's pid names a process of this one's pid namespace (module doc)."""
    pid = holder.get("pid")
    ours = self.record["pid_namespace"]
    return (
      ours is not None and holder.get("pid_namespace") == ours and isinstance(pid, int) and pid > 0
    )

  # ------------------------------------------------------------------------ acquiring
  def acquire(self, *, log=print) -> None:
    """Takes the lock or raises LockError naming the live holder."""
    for _ in range(20):  # each pass either wins or sees someone else win and re-reads
      numbers = self._numbers()
      newest = numbers[-1] if numbers else 0
      if newest:
        holder = self._read(newest)
        if holder is None:
          continue  # removed under our feet: look again
        if not self._free(newest, holder):
          raise self._held_error(holder, newest)
        if not holder.get("released"):
          why = (
            "that is no longer running"
            if self._same_pid_namespace(holder)
            else f"whose lease was not renewed for over {self.stale_after_s:g} s"
          )
          log(
            f"taking over the writer lock of {self.directory} from a process {why} ({_who(holder)})"
          )
      if paths.create_exclusive(self._file(newest + 1), json.dumps(self.record)):
        self._number = newest + 1
        self.path = self._file(self._number)
        for n in numbers:  # the older generations are history now
          paths.remove(self._file(n))
        self._thread = threading.Thread(target=self._beat, name="rove-jax-writer-lock", daemon=True)
        self._thread.start()
        return
    raise LockError(
      f"could not take the writer lock of {self.directory}: other processes keep taking it"
    )

  def _held_error(self, holder: dict, number: int) -> LockError:
    where = ""
    if holder.get("host") == self.record["host"] and not self._same_pid_namespace(holder):
      where = (
        " (this host's name, but another pid namespace or machine: a container, or a "
        "record without one, so only its lease tells whether it lives)"
      )
    return LockError(
      f"{self.what} {self.directory} is being written by {_who(holder)}{where}: two writers "
      f"would overwrite each other's files. Stop that process or choose another {self.what}. "
      f"If it is gone (its machine or container was lost), its lock goes stale "
      f"{self.stale_after_s:.0f} s after its last heartbeat; or delete {self._file(number)} by "
      f"hand."
    )

  # ------------------------------------------------------------------------- holding
  def _beat(self):
    while not self._stop.wait(self.heartbeat_s) and self._beat_once():
      pass

  def _beat_once(self) -> bool:
    """Renews the lease; False (and `lost` set) when another process holds the lock now."""
    try:
      numbers = self._numbers()
      if numbers[-1:] != [self._number]:
        holder = self._read(numbers[-1]) if numbers else None
        self.lost = (
          f"the writer lock of {self.directory} was taken over by another process "
          f"({_who(holder or {})}) after this one missed its heartbeats for "
          f"{self.stale_after_s:.0f} s"
        )
        return False
      self.record["beat"] += 1
      paths.write_atomic(self.path, json.dumps(self.record))
    except OSError:  # storage briefly unavailable: the next beat tries again
      pass
    return True

  def check(self) -> None:
    """Raises LockError when the lock was taken over by another process."""
    if self.lost:
      raise LockError(f"{self.lost}; stopping without writing further")

  def release(self) -> None:
    """Marks the lock released (idempotent; never touches a lock taken over by another)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
      self._thread = None
    if self.path is None or self.lost:
      return
    path, self.path = self.path, None
    try:
      if self._numbers()[-1:] != [self._number]:
        return
    except OSError:
      return  # unreadable storage: the lease expires on its own
    try:
      paths.write_atomic(path, json.dumps({**self.record, "released": True}))
    except OSError:  # a full disk: deleting needs no space (the numbers may restart at 1)
      try:
        paths.remove(path)
      except OSError:
        pass  # read-only storage: the lease expires on its own


def _who(holder: dict) -> str:
  if not holder:
    return "a process whose lock record is unreadable"
  return f"pid {holder.get('pid')} on host {holder.get('host')} (started {holder.get('started')})"


def holder(directory: str) -> Optional[dict]:
  """The record of the lock in force in `directory`; None when it is free (no lock, or the
  newest one released). Staleness is not judged here."""
  lk = WriterLock(directory)
  numbers = lk._numbers()
  record = lk._read(numbers[-1]) if numbers else None
  return None if record is None or record.get("released") else record
