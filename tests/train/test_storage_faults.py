"""Storage that fails under a running trainer: the workdir's file system fills up, or turns
read-only, while train.py runs. The run must stop with one `error:` line and exit code 1 (the
README's code for I/O), release its writer lock where the storage still allows it, and leave
every checkpoint finished before the fault readable and verified.

The file system is a small tmpfs mounted for the test, which needs root (CAP_SYS_ADMIN); where
mounting is not permitted the tests are skipped with that reason. Linux refuses to remount a
file system read-only while a file on it is open for writing, which TensorBoard's event file is
for the whole run: the read-only case runs with tracking=none.
"""

import errno
import os
import signal
import subprocess
import sys
import time

import orbax.checkpoint as ocp
import pytest

from rove_jax.storage import lock as lock_lib
from rove_jax.train import checkpoint as ckpt_lib
from tests.conftest import subprocess_env
from tests.train.test_loop_faults import (  # noqa: F401
  ROOT,
  STEPS,
  cli_overrides,
  config,
  copy_run,
  reference,
  train,
)


@pytest.fixture
def small_disk(tmp_path):
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  done = subprocess.run(
    ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True
  )
  if done.returncode != 0:
    pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}): needs root")
  try:
    yield mnt
  finally:
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def finished(workdir) -> list[int]:
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(str(workdir)), read_only=True)
  try:
    return ck.steps()
  finally:
    ck.close()


def assert_readable_and_verified(workdir, steps):
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(str(workdir)), read_only=True)
  try:
    for s in steps:
      got = ck.manager.restore(
        s,
        args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()
        ),
      )
      assert ckpt_lib.verify(got["state"], dict(got["meta"]), dict(got["data"])), s
  finally:
    ck.close()


def run_until_fault(reference, workdir, fault, **overrides):
  """train.py on a long schedule; `fault()` once checkpoint 2 is final; returns (the process's
  exit code, its stderr, the checkpoints finished before the fault)."""
  c = config(reference, steps=2000, checkpoint_every=2, eval_every=100000, **overrides)
  cmd = [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    str(ROOT / "configs" / "tiny.py"),
    "--workdir",
    str(workdir),
    *cli_overrides(c),
  ]
  # a trainer that does not exit is made to print every thread's stack (SIGABRT) for the failure
  env = {**subprocess_env(devices=1), "PYTHONFAULTHANDLER": "1"}
  proc = subprocess.Popen(
    cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  try:
    deadline = time.time() + 240
    while not finished(workdir):
      assert proc.poll() is None, proc.stderr.read()[-3000:]
      assert time.time() < deadline
      time.sleep(0.05)
    before = finished(workdir)
    fault()
    try:
      err = proc.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGABRT)
      pytest.fail(
        "the trainer did not exit after the fault; its threads:\n"
        + proc.communicate(timeout=30)[1][-8000:]
      )
  finally:
    proc.kill()
  return proc.returncode, err, before


def assert_one_error_line(err: str, *needles: str):
  errors = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in err, err[:6000]
  assert all(n in errors[0] for n in needles), errors[0]
  assert ".writer-lock" not in errors[0], errors[0]
  return errors[0]


@pytest.mark.slow
def test_a_full_disk_during_the_run_is_one_line_exit_1_lock_released(reference, small_disk):
  workdir = small_disk / "run"
  filler = small_disk / "filler"

  def fill():
    with open(filler, "wb") as f:
      try:
        while True:
          f.write(b"\0" * (1 << 20))
          f.flush()
      except OSError:
        pass

  code, err, before = run_until_fault(reference, workdir, fill)
  assert code == 1, err[-3000:]
  assert_one_error_line(err, "No space left on device")
  filler.unlink()
  assert lock_lib.holder(str(workdir)) is None  # released (deleted: the disk was full)
  assert set(before) <= set(finished(workdir))
  assert_readable_and_verified(workdir, finished(workdir))


@pytest.mark.slow
def test_storage_turning_read_only_is_one_line_about_the_write_exit_1(reference, small_disk):
  workdir = small_disk / "run"

  def read_only():  # refused while a write is in flight there: retried until it takes
    deadline = time.time() + 60
    while (
      subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], capture_output=True).returncode
      != 0
    ):
      assert time.time() < deadline, "the tmpfs could not be remounted read-only"
      time.sleep(0.002)

  code, err, before = run_until_fault(reference, workdir, read_only, tracking="none")
  assert code == 1, err[-3000:]
  assert_one_error_line(err, "Read-only file system")
  assert set(before) <= set(finished(workdir))
  assert_readable_and_verified(workdir, finished(workdir))
  # the lock could not be released on read-only storage: it names the dead trainer, whose
  # lease the next run on this host takes over at once (its pid is gone)
  assert lock_lib.holder(str(workdir))["pid"] not in (None, os.getpid())


def test_a_failed_final_save_still_releases_the_lock(reference, tmp_path, monkeypatch):
  """The last save of a run fails in the background (simulated in orbax's manager: the save
  writes nothing and the wait raises what a full disk raises): the run ends with a SaveError naming
  step 8, and the lock is
  released (before, the failing close skipped the release)."""
  workdir = copy_run(reference, tmp_path, keep=(2, 4, 6))
  real_save, real_wait = ocp.CheckpointManager.save, ocp.CheckpointManager.wait_until_finished
  final = []

  def save(self, step, *args, **kwargs):
    if step != STEPS:
      return real_save(self, step, *args, **kwargs)
    final.append(step)  # its background write "fails": nothing of it reaches the disk
    return True

  def wait(self):
    real_wait(self)
    if final:
      raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", wait)
  with pytest.raises(
    ckpt_lib.SaveError, match="step 8 .*No space left on device.*step 6 is intact"
  ):
    train(config(reference), workdir)
  monkeypatch.undo()
  assert lock_lib.holder(str(workdir)) is None
  assert {2, 4, 6} <= set(finished(workdir))
  assert_readable_and_verified(workdir, [2, 4, 6])
