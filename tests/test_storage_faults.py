"""Storage that fails under a running trainer: the workdir's file system fills up while
train.py runs. The run must stop with one `error:` line and exit code 1 (the
README's code for I/O), release its writer lock where the storage still allows it, and leave
every checkpoint finished before the fault readable and verified.

The file system is a small tmpfs mounted for the test, which needs root (CAP_SYS_ADMIN); where
mounting is not permitted the test is skipped with that reason. (Turning it read-only under the
run is not tested: Linux refuses the remount while the trainer holds files open for writing.)
"""

import subprocess
import sys
import time

import orbax.checkpoint as ocp
import pytest

from rove_jax.storage import lock as lock_lib
from rove_jax.train import checkpoint as ckpt_lib
from tests.conftest import subprocess_env
from tests.test_faults import ROOT, cli_overrides, config, reference  # noqa: F401 - fixture


@pytest.fixture
def small_disk(tmp_path):
  mnt = tmp_path / "mnt"
  mnt.mkdir()
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)],
                        capture_output=True, text=True)
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
      got = ck.manager.restore(s, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore(),
          meta=ocp.args.JsonRestore()))
      assert ckpt_lib.verify(got["state"], dict(got["meta"]), dict(got["data"])), s
  finally:
    ck.close()


def run_until_fault(reference, workdir, fault):
  """train.py on a long schedule; `fault()` once checkpoint 2 is final; returns (the process's
  exit code, its stderr, the checkpoints finished before the fault)."""
  c = config(reference, steps=2000, checkpoint_every=2, eval_every=100000)
  cmd = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs" / "tiny.py"),
         "--workdir", str(workdir), *cli_overrides(c)]
  proc = subprocess.Popen(cmd, env=subprocess_env(devices=1), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 240
    while not finished(workdir):
      assert proc.poll() is None, proc.stderr.read()[-3000:]
      assert time.time() < deadline
      time.sleep(0.05)
    before = finished(workdir)
    fault()
    err = proc.communicate(timeout=240)[1]
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
