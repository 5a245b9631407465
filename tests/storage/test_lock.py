"""Whether the writer lock's holder lives (rove_jax/storage/lock.py): a holder whose pid is gone
is taken over at once only when its record proves it ran in this process's pid namespace of
this boot; a holder of the same host name in another namespace (two `docker --net=host`
containers), of another boot, or with a record that does not say, keeps the lock until its
lease runs out. The exclusivity and the lease itself are tested in test_paths.py."""

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest

from rove_jax.storage import lock as lock_lib
from rove_jax.storage import paths

OURS = lock_lib._pid_namespace()
needs_proc = pytest.mark.skipif(
  OURS is None,
  reason="no /proc of this pid namespace: the lock judges every holder by its lease here",
)


def _dead_pid() -> int:
  """A pid that no process of this namespace has now (a child's, after it was reaped)."""
  child = subprocess.Popen(["true"])
  child.wait()
  with pytest.raises(ProcessLookupError):
    os.kill(child.pid, 0)
  return child.pid


def _holder(root, pid, **fields) -> dict:
  """Writes lock 1 of `root` as a holder on this host with `pid` would, fresh (beat just now)."""
  record = {
    "host": socket.gethostname(),
    "pid": pid,
    "pid_start": "12345",
    "id": "x" * 32,
    "started": "earlier",
    "argv": ["train.py"],
    "beat": 7,
    **fields,
  }
  paths.write_atomic(os.path.join(root, f"{lock_lib.PREFIX}1"), json.dumps(record))
  return record


def _quiet(*_):
  pass


@needs_proc
def test_a_dead_holder_of_this_pid_namespace_is_taken_over_at_once(tmp_path):
  pid = _dead_pid()
  _holder(str(tmp_path), pid, pid_namespace=OURS)
  notes = []
  lk = lock_lib.WriterLock(str(tmp_path), stale_after_s=3600, heartbeat_s=3600)
  lk.acquire(log=notes.append)  # a lease of an hour, fresh: only the pid can free it
  assert len(notes) == 1 and "no longer running" in notes[0] and f"pid {pid}" in notes[0]
  assert lk.path.endswith(f"{lock_lib.PREFIX}2")
  assert json.loads(paths.read_bytes(lk.path))["pid_namespace"] == OURS
  lk.release()


@needs_proc
def test_a_live_holder_of_this_pid_namespace_holds_past_its_lease(tmp_path):
  """A frozen holder (SIGSTOP, a debugger) whose process still exists keeps the lock."""
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    _holder(
      str(tmp_path), sleeper.pid, pid_namespace=OURS, pid_start=lock_lib._start_time(sleeper.pid)
    )
    time.sleep(1.1)
    with pytest.raises(lock_lib.LockError, match=f"pid {sleeper.pid} on host"):
      lock_lib.WriterLock(str(tmp_path), stale_after_s=0.5).acquire(log=_quiet)
  finally:
    sleeper.kill()
    sleeper.wait()


def _elsewhere(part: str):
  """A pid_namespace value that differs from this process's in `part` alone."""
  boot, dev, ino = (OURS or "boot:0:1").rsplit(":", 2)
  if part == "namespace":
    return f"{boot}:{dev}:{int(ino) + 1}"
  if part == "boot":
    return f"{'0' * 8}-0000-0000-0000-{'0' * 12}:{dev}:{ino}"
  return None  # a record without one: written by an older version, or where /proc is absent


@pytest.mark.parametrize("part", ["namespace", "boot", "absent"])
def test_a_holder_whose_pid_is_not_ours_to_judge_keeps_its_lease(tmp_path, part):
  """A lock held from another container of this host name, where the holder's pid means
  another process; that pid is dead here. The lock must hold until the lease runs out, then
  go to exactly the starter that finds it stale."""
  pid = _dead_pid()
  fields = {"pid_namespace": _elsewhere(part)} if part != "absent" else {}
  _holder(str(tmp_path), pid, **fields)
  with pytest.raises(lock_lib.LockError, match="another pid namespace or machine") as e:
    lock_lib.WriterLock(str(tmp_path), stale_after_s=300).acquire(log=_quiet)
  assert f"pid {pid} on host {socket.gethostname()}" in str(e.value)
  assert os.listdir(tmp_path) == [f"{lock_lib.PREFIX}1"]  # nothing written
  time.sleep(1.1)  # its lease (0.5 s below) runs out by the storage's clock
  notes = []
  lk = lock_lib.WriterLock(str(tmp_path), stale_after_s=0.5, heartbeat_s=3600)
  lk.acquire(log=notes.append)
  assert len(notes) == 1 and "lease was not renewed for over 0.5 s" in notes[0], notes
  lk.release()


# ----------------------------------------------------------- a real second pid namespace

HOLD = """
import sys, time
from rove_jax.storage import lock as lock_lib
lk = lock_lib.WriterLock(sys.argv[1], heartbeat_s=0.2)
lk.acquire(log=lambda *_: None)
print(lk.record["pid"], flush=True)
time.sleep(300)
"""


def _unshare_works() -> bool:
  if os.geteuid() != 0 or shutil.which("unshare") is None or OURS is None:
    return False
  probe = subprocess.run(
    ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
  )
  return probe.returncode == 0


@pytest.mark.skipif(
  not _unshare_works(),
  reason="needs root and unshare(1) to start a process "
  "in a new pid namespace (the container case); the records above simulate it",
)
def test_a_holder_in_another_pid_namespace_is_not_taken_over_while_it_renews(tmp_path):
  pid = _dead_pid()
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # In the new namespace the holder is made to get the pid that is dead here (ns_last_pid is
  # the pid given last), as a container's process can; `; true` keeps sh from exec'ing it.
  script = (
    f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "
    f"{shlex.join([sys.executable, '-c', HOLD, str(tmp_path)])}; true"
  )
  proc = subprocess.Popen(
    ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", script],
    cwd=repo,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    line = proc.stdout.readline()
    assert line.strip() == str(pid), (line, pid)  # its pid there; none has it here
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)
    record = lock_lib.holder(str(tmp_path))
    assert record["pid"] == pid and record["host"] == socket.gethostname()
    assert record["pid_namespace"] not in (None, OURS)
    with pytest.raises(lock_lib.LockError, match="another pid namespace or machine"):
      lock_lib.WriterLock(str(tmp_path)).acquire(log=_quiet)
    time.sleep(1.5)  # longer than the lease below, which its heartbeats keep renewing
    with pytest.raises(lock_lib.LockError, match=f"pid {pid} on host"):
      lock_lib.WriterLock(str(tmp_path), stale_after_s=1.0).acquire(log=_quiet)
  finally:
    proc.kill()  # --kill-child: the namespace's first process, and with it the holder, die
    proc.wait()
  time.sleep(1.5)  # its last renewal is now older than the lease
  notes = []
  lk = lock_lib.WriterLock(str(tmp_path), stale_after_s=1.0, heartbeat_s=3600)
  lk.acquire(log=notes.append)
  assert "lease was not renewed" in notes[0], notes
  lk.release()
