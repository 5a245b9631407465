"""What a run says when storage refuses or fails: GCS unreachable at the
start is an I/O failure (exit 1, one line), not a bad workdir; a save refused with 403 never
calls the step it failed to write intact; rove-export names the operation and the path of a
refused write; a server error the client gave up on is reported the same way."""

import os
import subprocess
import sys
import time

import pytest

from rove_jax.storage import gcs
from tests import gcs_server
from tests.conftest import free_port, subprocess_env
from tests.stall_proxy import StallProxy
from tests.train.test_storage_deadline import (  # noqa: F401
  ROOT,
  finished_steps,
  last_line,
  silent_storage,
  small_flags,
  start_and_stall,
)


def train_cmd(tmp_path, workdir, **extra):
  return [
    sys.executable,
    os.path.join(ROOT, "train.py"),
    "--config",
    os.path.join(ROOT, "configs", "tiny.py"),
    "--workdir",
    workdir,
    *small_flags(tmp_path, **extra),
  ]


@pytest.mark.slow
def test_unreachable_storage_at_the_start_is_an_io_failure_in_one_line(tmp_path):
  dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
  env = subprocess_env(
    devices=1, **{k: v for k, v in gcs_server.environment(dead).items() if k != gcs_server.URL_VAR}
  )
  env["ROVE_JAX_STORAGE_TIMEOUT"] = "5"
  done = subprocess.run(
    train_cmd(tmp_path, "gs://no-such-server/run", steps=2),
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 1, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1, lines[:20]
  # gcsfs would retry the refused connections for about a minute; the deadline ends it first
  assert lines[0].startswith("error: ") and "gs://no-such-server/run" in lines[0], lines[0]
  assert "storage did not answer within 5 s" in lines[0], lines[0]


@pytest.mark.slow
def test_a_save_refused_with_403_does_not_call_its_own_step_intact(tmp_path, silent_storage):
  workdir, proxy, env = silent_storage
  cmd = train_cmd(tmp_path, workdir)
  proc = subprocess.Popen(
    cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )
  try:
    deadline_at = time.time() + 240
    while not finished_steps(workdir):
      assert proc.poll() is None, proc.stderr.read()[-3000:]
      assert time.time() < deadline_at
      time.sleep(0.05)
    proxy.fail_writes(403)
    before = finished_steps(workdir)
    _, err = proc.communicate(timeout=180)
  finally:
    proc.kill()
  assert proc.returncode == 1, err[-3000:]
  line = last_line(err)
  # the refusal reaches the run through gcsfs (our layer: "HTTP 403"; its own: "Forbidden") or
  # tensorstore ("PERMISSION_DENIED ... [http_response_code='403']"), whichever write is first
  assert line.startswith("error: ") and ("403" in line or "Forbidden" in line), line
  newest = max(before)
  failed = [s for s in range(newest + 1, newest + 40) if f"step {s} is intact" in line]
  assert not failed, line  # only a checkpoint finished before the refusal may be called intact


@pytest.mark.slow
def test_export_names_the_refused_write(tmp_path, silent_storage, trained_run):
  workdir, proxy, env = silent_storage
  proxy.fail_writes(403)
  out = workdir + "/export"
  done = subprocess.run(
    [sys.executable, "-m", "rove_jax.cli.export", "--workdir", str(trained_run), "--out", out],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 1, done.stderr[-3000:]
  line = last_line(done.stderr)
  assert line.startswith("rove-export: error: ") and out in line and "HTTP 403" in line, line


def test_a_server_error_after_the_clients_retries_names_the_operation():
  from gcsfs.retry import HttpError

  def refused():
    raise HttpError({"code": 503, "message": "backend unavailable"})

  with pytest.raises(gcs.StorageError) as e:
    gcs._call(refused, "writing", "gs://b/out/model.safetensors")
  assert str(e.value) == (
    "writing gs://b/out/model.safetensors failed (HTTP 503: backend unavailable)"
  )
  assert e.value.code == 503 and isinstance(e.value, OSError)


def test_a_workdir_that_refuses_writes_is_a_bad_workdir(gcs_bucket, monkeypatch):
  """403 on the write probe: exit 2's ValueError ("choose another --workdir"), not an I/O
  failure; the probe object was never created."""
  from rove_jax.storage import paths
  from rove_jax.train import resume

  proxy = StallProxy(os.environ[gcs_server.URL_VAR])
  try:
    proxy.fail_writes(403)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    with pytest.raises(
      ValueError,
      match=r"workdir gs://.*/ro is not writable \(.*HTTP 403.*\); "
      r"choose another --workdir",
    ):
      resume.check_workdir(f"{gcs_bucket}/ro")
  finally:
    proxy.close()
  monkeypatch.undo()
  assert paths.listdir(gcs_bucket) == []
