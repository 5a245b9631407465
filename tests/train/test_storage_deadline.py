"""Storage that stops answering ends a run cleanly: a gs:// trainer whose
GCS server goes silent mid-run (tests/stall_proxy.py: connections accepted, never answered)
stops with exit 1 and one line naming the operation and the path, within its storage deadline;
SIGTERM is honoured within seconds while storage hangs; the lock and the checkpoints written
before stay as they were. Also: against an emulator gcsfs never probes gRPC, whatever the
environment says, and rove-export ends the same way as the trainer."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rove_jax.storage import deadline
from rove_jax.storage import lock as lock_lib
from rove_jax.train import checkpoint as ckpt_lib
from tests import gcs_server
from tests.conftest import subprocess_env, write_corpus
from tests.stall_proxy import StallProxy
from tests.train.test_loop_gcs import finished_steps

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_flags(tmp_path, **extra) -> list[str]:
  small = {
    "data.source": "text",
    "data.path": write_corpus(tmp_path / "corpus"),
    "model.n_layer": 1,
    "model.d_model": 32,
    "model.n_head": 2,
    "model.d_ff": 64,
    "model.max_len": 32,
    "data.seq_len": 32,
    "data.batch_size": 4,
    "steps": 100000,
    "checkpoint_every": 2,
    "optim.warmup_steps": 0,
    "progress": False,
    "sample_tokens": 0,
    "eval_every": 100000,
    **extra,
  }
  return [f"--config.{k}={v}" for k, v in small.items()]


@pytest.fixture
def silent_storage(gcs_bucket):
  """(workdir on the bucket, the proxy, the environment that reaches the bucket through it)."""
  proxy = StallProxy(os.environ[gcs_server.URL_VAR])
  env = subprocess_env(
    devices=1,
    **{k: v for k, v in gcs_server.environment(proxy.url).items() if k != gcs_server.URL_VAR},
  )
  try:
    yield f"{gcs_bucket}/run", proxy, env
  finally:
    proxy.close()


def start_and_stall(tmp_path, workdir, proxy, env, **extra):
  """train.py on the bucket, through the proxy; the proxy stalls once checkpoint 2 is final.
  Returns (the process, the checkpoints final before the stall)."""
  cmd = [
    sys.executable,
    os.path.join(ROOT, "train.py"),
    "--config",
    os.path.join(ROOT, "configs", "tiny.py"),
    "--workdir",
    workdir,
    *small_flags(tmp_path, **extra),
  ]
  proc = subprocess.Popen(
    cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  deadline_at = time.time() + 240
  while not finished_steps(workdir):  # read through the server's own address
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.time() < deadline_at, "no checkpoint within 240 s"
    time.sleep(0.1)
  before = finished_steps(workdir)
  proxy.stall()
  return proc, before


def assert_as_they_were(workdir, before):
  assert set(before) <= set(finished_steps(workdir))
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), read_only=True)
  try:
    for step in before:
      assert ck.read_meta(step)["step"] == step  # readable, its digest verified
  finally:
    ck.close()
  assert lock_lib.holder(workdir) is not None  # not released (storage was gone), not broken


def last_line(stderr: str) -> str:
  return stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_silent_storage_ends_the_run_within_its_deadline(tmp_path, silent_storage):
  workdir, proxy, env = silent_storage
  proc, before = start_and_stall(tmp_path, workdir, proxy, env, storage_timeout=8)
  t0 = time.time()
  try:
    _, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  took = time.time() - t0
  assert proc.returncode == 1, err[-3000:]
  line = last_line(err)
  assert line.startswith("error: ") and workdir in line, line
  assert "storage did not answer within 8 s" in line, line
  # the deadline, then at most a few short ones for the cleanup (lock, checkpoints)
  assert took < 8 + 4 * deadline.GONE_S + 30, took
  assert_as_they_were(workdir, before)


@pytest.mark.slow
def test_sigterm_is_honoured_while_storage_hangs(tmp_path, silent_storage):
  workdir, proxy, env = silent_storage
  proc, before = start_and_stall(tmp_path, workdir, proxy, env, storage_timeout=600)
  time.sleep(3)  # let it block on the silent storage
  t0 = time.time()
  proc.send_signal(signal.SIGTERM)
  try:
    _, err = proc.communicate(timeout=90)
  finally:
    proc.kill()
  took = time.time() - t0
  assert proc.returncode == 1, err[-3000:]
  line = last_line(err)
  assert "a stop signal arrived while storage had not answered" in line, line
  assert took < deadline.STOP_GRACE_S + 4 * deadline.GONE_S + 20, took
  assert_as_they_were(workdir, before)


@pytest.mark.slow
def test_export_ends_on_silent_storage(tmp_path, silent_storage):
  workdir, proxy, env = silent_storage
  proc, _ = start_and_stall(tmp_path, workdir, proxy, env, storage_timeout=600)
  proc.send_signal(signal.SIGKILL)
  proc.wait(timeout=60)
  export = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.export",
      "--workdir",
      workdir,
      "--out",
      f"{workdir}/export",
    ],
    env={**env, deadline.ENV_VAR: "6"},
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=150,
  )
  assert export.returncode == 1, export.stderr[-3000:]
  line = last_line(export.stderr)
  assert line.startswith("rove-export: error: ") and "did not answer within 6 s" in line, line


@pytest.mark.slow
def test_an_emulator_is_never_probed_over_grpc(tmp_path, gcs_bucket):
  """GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT unset (gcsfs's default: its experimental client, which
  probes gRPC first): a run on the emulator still starts and finishes."""
  env = subprocess_env(devices=1)
  env.pop("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", None)
  env[deadline.ENV_VAR] = "60"
  done = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "train.py"),
      "--config",
      os.path.join(ROOT, "configs", "tiny.py"),
      "--workdir",
      f"{gcs_bucket}/grpc",
      *small_flags(tmp_path, steps=2),
    ],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert finished_steps(f"{gcs_bucket}/grpc") == [2]


def test_a_deadline_passes_errors_and_values_through():
  assert deadline.call(lambda: 7, what="reading", path="gs://b/x") == 7
  with pytest.raises(KeyError):
    deadline.call(lambda: {}["k"], what="reading", path="gs://b/x")


@pytest.fixture
def fresh_deadline():
  """No deadline configured by an in-process run of an earlier test, no stop, storage not gone."""
  deadline.configure(None)
  yield
  deadline.configure(None)


def test_a_blocked_call_times_out_naming_the_operation(monkeypatch, fresh_deadline):
  monkeypatch.setenv(deadline.ENV_VAR, "0.5")
  t0 = time.monotonic()
  with pytest.raises(
    deadline.StorageTimeout,
    match=r"^writing gs://b/x: storage did not answer "
    r"within 0.5 s",
  ):
    deadline.call(lambda: time.sleep(30), what="writing", path="gs://b/x")
  assert time.monotonic() - t0 < 3
  # storage is now taken as gone: the cleanup's calls wait GONE_S at most
  monkeypatch.setenv(deadline.ENV_VAR, "600")
  t0 = time.monotonic()
  with pytest.raises(deadline.StorageTimeout):
    deadline.call(lambda: time.sleep(30), what="releasing", path="gs://b/lock")
  assert time.monotonic() - t0 < deadline.GONE_S + 2


def test_a_bad_deadline_is_named(monkeypatch, fresh_deadline):
  monkeypatch.setenv(deadline.ENV_VAR, "soon")
  with pytest.raises(ValueError, match="ROVE_JAX_STORAGE_TIMEOUT='soon'"):
    deadline.timeout()
  with pytest.raises(ValueError, match="storage_timeout must be a number of seconds > 0"):
    deadline.configure(-1)


def test_init_from_is_read_under_the_runs_own_deadline(tmp_path, silent_storage):
  """The checkpoint init_from names is read before the overrides apply to it; the
  --config.storage_timeout override is its deadline all the same (the environment says 600)."""
  workdir, proxy, env = silent_storage
  proxy.stall()
  t0 = time.time()
  done = subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, "train.py"),
      "--config",
      os.path.join(ROOT, "configs", "tiny.py"),
      "--workdir",
      str(tmp_path / "run"),
      f"--config.init_from={workdir}",
      "--config.storage_timeout=3",
    ],
    env={**env, deadline.ENV_VAR: "600"},
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 1, done.stderr[-3000:]
  line = last_line(done.stderr)
  assert line.startswith("error: ") and workdir in line, line
  assert "storage did not answer within 3 s" in line, line
  assert time.time() - t0 < 60
  assert not (tmp_path / "run").exists()  # nothing was started


def test_resolving_a_config_starts_its_run_deadline(monkeypatch, fresh_deadline):
  """A notebook's second run: the first one's storage went away and a stop arrived; resolving
  the next config sets its own deadline (the command line's override first) and forgets both."""
  from rove_jax.train import resolve
  from rove_jax.train.run_config import RunConfig

  monkeypatch.setenv(deadline.ENV_VAR, "0.2")
  with pytest.raises(deadline.StorageTimeout):
    deadline.call(lambda: time.sleep(5), what="reading", path="gs://b/x")
  deadline.interrupt()
  assert deadline._gone.is_set() and deadline._stop.is_set()
  resolve.resolve(RunConfig(storage_timeout=7))
  assert deadline.timeout() == 7.0
  assert not deadline._gone.is_set() and not deadline._stop.is_set()
  resolve.command_line(RunConfig(storage_timeout=7), [("storage_timeout", "9")])
  assert deadline.timeout() == 9.0
  resolve.resolve(RunConfig())  # unset: the environment's
  assert deadline.timeout() == 0.2
  for bad in (0, -1, float("inf"), True, "10"):
    with pytest.raises(ValueError, match=r"storage_timeout must be a number of seconds > 0"):
      deadline.configure(bad)


@pytest.mark.parametrize(
  "value, message",
  [
    ("soon", r"--config\.storage_timeout=soon: 'soon' is not a number or None"),
    ("-1", r"storage_timeout must be a number of seconds > 0 \(or unset\), got -1\.0"),
  ],
)
def test_a_bad_deadline_override_is_named_before_any_read(value, message, fresh_deadline):
  from rove_jax.train import resolve
  from rove_jax.train.run_config import RunConfig

  given = [("init_from", "gs://nowhere/ckpt"), ("storage_timeout", value)]
  with pytest.raises(ValueError, match=message):
    resolve.command_line(RunConfig(), given)
  assert deadline.timeout() == deadline.DEFAULT_S  # left as it was
