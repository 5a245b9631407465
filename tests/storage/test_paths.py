"""The path layer (rove_jax/storage/paths.py, gcs.py) on a local directory and on a bucket of
the session's GCS API server (tests/gcs_server.py), and the writer lock (storage/lock.py):
exclusive on both backends, stale by the storage's clock, released, taken over only once."""

import json
import multiprocessing
import os
import re
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from rove_jax.storage import lock as lock_lib
from rove_jax.storage import paths
from tests import gcs_server


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
  """A directory on each backend; its name holds a space, unicode and glob characters."""
  base = str(tmp_path) if request.param == "local" else gcs_server.new_bucket()
  return paths.join(base, "runs", "lr[3e-4] é *?")


def test_resolve_names_local_and_gs_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve("runs/a") == str(tmp_path / "runs" / "a")
  assert paths.resolve("gs://b//x/./y/") == "gs://b/x/y"
  assert paths.resolve("gs://b") == "gs://b"
  with pytest.raises(ValueError, match="s3:// scheme is not supported"):
    paths.resolve("s3://b/x")
  with pytest.raises(ValueError, match="no bucket name"):
    paths.resolve("gs:///x")
  assert not os.path.exists(tmp_path / "gs:")


def test_a_gs_path_without_gcsfs_is_one_line_naming_the_extra(tmp_path):
  code = (
    "import sys; sys.modules['gcsfs'] = None\n"
    "import importlib.util as u; u.find_spec = lambda name, *a: None\n"
    "from rove_jax.storage import paths\n"
    "try:\n  paths.resolve('gs://b/run', what='--workdir')\n"
    "except paths.MissingExtra as e:\n  print(e)\n"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == (
    "--workdir gs://b/run is on Google Cloud Storage, which needs "
    "gcsfs: pip install 'rove_jax[gcs]'"
  )


def test_file_operations_agree_on_both_backends(root):
  f = paths.join(root, "sub", "a b.txt")
  assert not paths.exists(f) and paths.listdir(root) == []
  assert paths.write_atomic(f, "héllo") == len("héllo".encode())
  assert paths.read_text(f) == "héllo" and paths.isfile(f) and paths.size(f) == 6
  assert paths.isdir(paths.join(root, "sub")) and paths.listdir(root) == ["sub"]
  paths.write_atomic(f, lambda fh: fh.write(b"x" * 10))
  assert paths.read_bytes(f) == b"x" * 10
  with paths.open_read(f) as fh:
    fh.seek(4)
    assert fh.read(3) == b"xxx"
  assert paths.create_exclusive(paths.join(root, "only"), b"1")
  assert not paths.create_exclusive(paths.join(root, "only"), b"2")
  assert paths.read_bytes(paths.join(root, "only")) == b"1"
  paths.move_tree(paths.join(root, "sub"), paths.join(root, "moved", "sub"))
  assert paths.walk_files(root) == ["moved/sub/a b.txt", "only"]
  assert not paths.exists(f)
  age = paths.storage_now(root) - paths.mtime(paths.join(root, "only"))
  assert -5 < age < 60
  paths.remove(paths.join(root, "only"))
  paths.remove(paths.join(root, "only"))  # missing_ok
  with pytest.raises(FileNotFoundError):
    paths.remove(paths.join(root, "only"), missing_ok=False)
  paths.rmtree(root)
  assert paths.listdir(root) == []


def test_local_copy_of_a_remote_file_is_reused_until_it_changes(gcs_bucket, tmp_path):
  remote = paths.join(gcs_bucket, "data", "train-00000.bin")
  paths.write_atomic(remote, bytes(range(256)) * 100)
  local = paths.local_copy(remote, cache=str(tmp_path / "cache"))
  assert open(local, "rb").read() == bytes(range(256)) * 100
  assert paths.local_copy(remote, cache=str(tmp_path / "cache")) == local
  time.sleep(0.01)
  paths.write_atomic(remote, b"new")
  again = paths.local_copy(remote, cache=str(tmp_path / "cache"))
  assert again != local and open(again, "rb").read() == b"new"


def test_orbax_gets_a_glob_free_name_for_a_local_directory(tmp_path):
  d = str(tmp_path / "lr[3e-4]" / "checkpoints")
  link = paths.orbax_dir(d)
  assert not paths.glob_chars(link) and os.path.realpath(link) == os.path.realpath(d)
  assert paths.orbax_dir(d) == link  # stable across calls (and processes)
  plain = str(tmp_path / "plain")
  assert paths.orbax_dir(plain) == plain


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
  """TMPDIR for this test alone, world-writable and sticky like /tmp; yields where this user's
  link directory goes."""
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  os.chmod(tmp, 0o1777)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp))
  return tmp / f"rove-jax-links-{os.getuid()}"


def test_the_link_directory_is_created_private(tmp_path, private_tmp):
  link = paths.orbax_dir(str(tmp_path / "lr[3e-4]"))
  assert os.path.dirname(link) == str(private_tmp)
  st = os.lstat(private_tmp)
  assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
  assert st.st_uid == os.getuid()


def test_a_link_directory_others_can_only_read_is_closed(tmp_path, private_tmp):
  """One an older version made under umask 022: nobody else could write in it."""
  private_tmp.mkdir()
  os.chmod(private_tmp, 0o755)
  link = paths.orbax_dir(str(tmp_path / "lr[3e-4]"))
  assert os.path.realpath(link) == str(tmp_path / "lr[3e-4]")
  assert stat.S_IMODE(os.lstat(private_tmp).st_mode) == 0o700


def _attacker_dir(tmp_path):
  """Where another user would like the checkpoints to go."""
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  return theirs


@pytest.mark.parametrize("case", ["mode 0777", "mode 0770", "symlink", "another uid"])
def test_a_link_directory_another_user_could_write_is_refused(tmp_path, private_tmp, case):
  theirs = _attacker_dir(tmp_path)
  if case == "symlink":
    os.symlink(theirs, private_tmp)
    expect = "is a symbolic link"
  elif case == "another uid":
    if os.geteuid() != 0:
      pytest.skip("giving a directory to another uid needs root")
    private_tmp.mkdir(mode=0o700)
    os.chown(private_tmp, 65534, 65534)
    expect = f"belongs to uid 65534, not this user \\(uid {os.getuid()}\\)"
  else:
    private_tmp.mkdir()
    os.chmod(private_tmp, int(case.split()[1], 8))
    expect = f"writable by other users \\({case}\\)"
  before = sorted(os.listdir(private_tmp))
  workdir = tmp_path / "lr[3e-4]"
  with pytest.raises(PermissionError, match=expect) as e:
    paths.orbax_dir(str(workdir))
  message = str(e.value)
  assert "\n" not in message and str(private_tmp) in message
  assert f"rm -r '{private_tmp}'" in message and "set TMPDIR" in message
  assert sorted(os.listdir(private_tmp)) == before and os.listdir(theirs) == []  # no link made
  assert stat.S_ISLNK(os.lstat(private_tmp).st_mode) == (case == "symlink")  # left as it was
  if case != "symlink":
    assert stat.S_IMODE(os.lstat(private_tmp).st_mode) == (
      0o700 if case == "another uid" else int(case.split()[1], 8)
    )


def test_a_gs_directory_with_glob_characters_is_refused_for_orbax():
  with pytest.raises(ValueError, match=r"contains '\[' '\]'.*lr3e-4"):
    paths.check_orbax_path("gs://b/runs/lr[3e-4]")


@pytest.mark.parametrize(
  "name,shown", [("run#1", "'#'"), ("a?b", "'?'"), ("a\nb", "'\\n'"), ("a\tb", "'\\t'")]
)
def test_a_gs_directory_that_orbax_parses_as_a_url_is_refused(name, shown):
  """orbax reads a gs:// checkpoint path as a URL: '#' and '?' end it, tabs and line breaks
  vanish, so tensorstore would write the arrays under another name than gcsfs the rest."""
  with pytest.raises(ValueError, match="contains " + re.escape(shown) + ".*outside the workdir"):
    paths.check_orbax_path(f"gs://b/runs/{name}")
  paths.check_orbax_path(f"/tmp/runs/{name}")  # local: the file driver takes it as written


def test_gs_names_that_orbax_keeps_as_written_pass():
  for name in ("a%41b", "a b", "a+b", "a;b", "a@b", "a:b"):
    paths.check_orbax_path(f"gs://b/runs/{name}")


def test_a_workdir_with_a_hash_is_refused_before_the_run_touches_storage(tmp_path, gcs_bucket):
  from rove_jax.train import resume, run_reader

  with pytest.raises(ValueError, match="'#'.*run-1 for run#1"):
    resume.check_workdir(f"{gcs_bucket}/run#1")
  with pytest.raises(ValueError, match="'#'"):
    run_reader.read_run(f"{gcs_bucket}/run#1", lambda meta: None)
  assert paths.listdir(gcs_bucket) == []  # nothing created, under either name


# ------------------------------------------------------------------------------- the lock


def test_the_lock_is_exclusive_and_released(root):
  a = lock_lib.WriterLock(root, heartbeat_s=0.05)
  a.acquire(log=lambda *_: None)
  b = lock_lib.WriterLock(root)
  with pytest.raises(lock_lib.LockError, match=f"pid {os.getpid()}"):
    b.acquire(log=lambda *_: None)
  time.sleep(0.2)  # heartbeats rewrite the record
  assert json.loads(paths.read_bytes(a.path))["beat"] >= 1
  a.check()
  a.release()
  a.release()
  b.acquire(log=lambda *_: None)
  assert b.path.endswith(".writer-lock.2")
  assert [n for n in paths.listdir(root) if n.startswith(".writer-lock")] == [".writer-lock.2"]
  b.release()


def _stale_record(root, number=1):
  """A lock left by a process of another host whose lease expired long ago."""
  record = {"host": "elsewhere", "pid": 1, "started": "earlier", "beat": 3}
  paths.write_atomic(paths.join(root, f".writer-lock.{number}"), json.dumps(record))


def _race(root, queue):
  lk = lock_lib.WriterLock(root, stale_after_s=0.5, heartbeat_s=60)
  try:
    lk.acquire(log=lambda *_: None)
    queue.put("won")
  except lock_lib.LockError:
    queue.put("lost")


@pytest.mark.slow
def test_starters_racing_over_a_stale_lock_let_exactly_one_win(root):
  ctx = multiprocessing.get_context("spawn")
  for trial in range(2):
    sub = paths.join(root, str(trial))
    _stale_record(sub)
    time.sleep(1.0)  # the lease expires (storage time)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(sub, queue)) for _ in range(3)]
    for p in procs:
      p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
      p.join(timeout=60)
    assert results == ["lost", "lost", "won"], (trial, results)


@pytest.mark.parametrize("backend, trials", [("local", 60), ("gcs", 10)])
def test_threads_racing_over_a_stale_lock_never_both_win(tmp_path, backend, trials):
  """The issue's reproducer (two starters over a stale lock both won 19 of 60 times), with
  four threads a trial, each calling acquire as train() does."""
  import threading

  base = str(tmp_path) if backend == "local" else gcs_server.new_bucket()
  for trial in range(trials):
    sub = paths.join(base, str(trial))
    _stale_record(sub)
    won, barrier = [], threading.Barrier(4)

    def start():
      lk = lock_lib.WriterLock(sub, stale_after_s=-1.0, heartbeat_s=3600)
      barrier.wait()
      try:
        lk.acquire(log=lambda *_: None)
        won.append(lk)
      except lock_lib.LockError:
        pass

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert len(won) == 1, (trial, len(won))
    won[0].release()


def _on_another_host(lk):
  """`lk` as if it ran on another machine: judged by its lease, not by a pid here."""
  lk.record.update(host="another-host", pid_namespace="another-boot-id:4:4026531836")
  return lk


def test_a_live_lease_holds_whatever_this_hosts_clock_says(root, monkeypatch):
  holder = _on_another_host(lock_lib.WriterLock(root, heartbeat_s=60))
  holder.acquire(log=lambda *_: None)
  real = time.time
  monkeypatch.setattr(time, "time", lambda: real() + 400)  # this host's clock runs 400 s ahead
  with pytest.raises(lock_lib.LockError, match="another-host"):
    lock_lib.WriterLock(root, stale_after_s=300).acquire(log=lambda *_: None)
  holder.release()


def test_a_holder_whose_lease_was_taken_over_stops(root):
  stalled = _on_another_host(lock_lib.WriterLock(root, heartbeat_s=3600))  # renews too late
  stalled.acquire(log=lambda *_: None)
  time.sleep(1.0)
  notes = []
  taker = lock_lib.WriterLock(root, stale_after_s=0.5, heartbeat_s=3600)
  taker.acquire(log=notes.append)
  assert "taking over" in notes[0] and "another-host" in notes[0]
  stalled.heartbeat_s = 0.01
  stalled._beat_once()
  with pytest.raises(lock_lib.LockError, match="taken over by another process"):
    stalled.check()
  stalled.release()  # leaves the new holder's lock alone
  assert paths.listdir(root) == [".writer-lock.2"]
  assert json.loads(paths.read_bytes(taker.path))["id"] == taker.record["id"]
  taker.release()
