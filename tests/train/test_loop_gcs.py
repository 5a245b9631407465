"""A training run that lives in a bucket: `--workdir gs://...` on the session's GCS API server
(tests/gcs_server.py), stopped by --config.run_steps, SIGKILLed, resumed, then read by
rove-eval and rove-export. Its losses and final state must equal the uninterrupted local run's
bitwise (test_loop_faults.py's `reference`: 8 steps, checkpoints every 2), and no local `gs:`
directory may appear. Also: a checkpoint object damaged or deleted in the bucket is set aside
like a local one, and two processes given different workdirs stop at once."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from rove_jax.storage import lock as lock_lib
from rove_jax.storage import paths
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train.metrics import read_metrics
from tests import gcs_server
from tests.conftest import free_port, subprocess_env
from tests.train.test_loop_faults import (
  ROOT,
  SAVED,
  STEPS,
  assert_same_state,
  cli_overrides,
  config,
  read_state,
  reference,  # noqa: F401 - a fixture
  train,
)

ENV = dict(JAX_DEFAULT_MATMUL_PRECISION="highest", JAX_NUMPY_RANK_PROMOTION="raise")


def losses(workdir) -> dict:
  return {
    r["step"]: r["loss"] for r in read_metrics(workdir, report=lambda *a: None) if "loss" in r
  }


def finished_steps(workdir) -> list[int]:
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), read_only=True)
  try:
    return ck.steps()
  finally:
    ck.close()


@pytest.mark.slow
def test_a_gs_run_stopped_killed_and_resumed_equals_the_local_run(reference, tmp_path):
  bucket = gcs_server.new_bucket()
  workdir = f"{bucket}/runs/tiny é 1"
  cmd = [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    str(ROOT / "configs" / "tiny.py"),
    "--workdir",
    workdir,
    *cli_overrides(reference.config),
  ]
  env = subprocess_env(devices=1, **ENV)
  first = subprocess.run(
    cmd + ["--config.run_steps=3"],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert first.returncode == 0, first.stderr[-3000:]
  assert finished_steps(workdir) == [2, 3]
  assert sorted(losses(workdir)) == [1, 2, 3]
  # resumed in a subprocess, SIGKILLed once checkpoint 4 is final: four steps and two saves
  # remain, far more than one poll's interval, so the run still holds its lock when killed
  proc = subprocess.Popen(
    cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  try:
    deadline = time.time() + 300
    while 4 not in finished_steps(workdir):
      assert proc.poll() is None, f"train.py exited ({proc.returncode}) before step 4"
      assert time.time() < deadline
      time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
  finally:
    proc.kill()
  assert lock_lib.holder(workdir) is not None  # the killed run's lock is left behind
  out = []
  summary = train(config(reference), workdir, out)  # in-process, as the reference was
  assert summary.start_step >= 4 and any("taking over the writer lock" in l for l in out)
  assert losses(workdir) == reference.losses  # every step, bitwise
  assert_same_state(read_state(workdir, STEPS), reference.states[STEPS], "final checkpoint")
  assert lock_lib.holder(workdir) is None
  assert not (tmp_path / "gs:").exists() and not (ROOT / "gs:").exists()

  # rove-eval and rove-export read the bucket (and write into it)
  ev = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.eval",
      "--workdir",
      workdir,
      "--out",
      f"{workdir}/eval",
      "--tasks",
      "ppl",
      "--suite",
      "quick",
      "--lengths",
      "32",
      "--no-progress",
    ],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ev.returncode == 0, ev.stderr[-3000:]
  report = json.loads(paths.read_bytes(f"{workdir}/eval/report.json"))
  assert report["runs"][0]["step"] == STEPS
  ex = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.export",
      "--workdir",
      workdir,
      "--out",
      f"{workdir}/export",
    ],
    env=env,
    cwd=tmp_path,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ex.returncode == 0, ex.stderr[-3000:]
  from rove_jax.nn import pretrained

  _, exported = pretrained.load(f"{workdir}/export")
  params = {ckpt_lib.PARAMS + k: np.asarray(v) for k, v in ckpt_lib.to_flat(exported).items()}
  want = {k: v for k, v in reference.states[STEPS].items() if k.startswith(ckpt_lib.PARAMS)}
  assert_same_state(params, want, "exported parameters")
  assert not (tmp_path / "gs:").exists() and not (ROOT / "gs:").exists()


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_damaged_object_in_the_bucket_costs_one_checkpoint(reference, damage):
  bucket = gcs_server.new_bucket()
  workdir = f"{bucket}/run"
  paths.copy_tree(str(reference.workdir), workdir)
  paths.remove(f"{workdir}/TRAINED")
  for s in (6, 8):
    paths.rmtree(f"{workdir}/checkpoints/{s}")
  target = f"{workdir}/checkpoints/4/meta/metadata"
  if damage == "deleted":
    paths.remove(target)
  else:
    paths.write_atomic(target, paths.read_bytes(target)[:40])
  out = []
  summary = train(config(reference), workdir, out)
  assert summary.start_step == 2, out
  assert any("step 4" in l and "cannot be restored" in l for l in out), out
  moved = paths.listdir(f"{workdir}/checkpoints_unreadable")
  assert len(moved) == 1 and moved[0].startswith("4-")
  assert "step 4 moved here" in paths.read_text(
    f"{workdir}/checkpoints_unreadable/{moved[0]}/{ckpt_lib.REASON_FILE}"
  )
  assert losses(workdir) == reference.losses
  for s in SAVED:
    assert_same_state(read_state(workdir, s), reference.states[s], f"checkpoint {s}")


@pytest.mark.slow
def test_two_processes_with_unshared_workdirs_stop_at_once(tmp_path):
  args = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.d_ff=64",
    "--config.model.max_len=32",
    "--config.data.seq_len=32",
    "--config.data.batch_size=4",
    "--config.steps=2",
    "--config.progress=False",
    "--config.sample_tokens=0",
    "--config.optim.warmup_steps=1",
  ]
  port = free_port()
  env = subprocess_env(devices=1, JAX_PLATFORMS="cpu", ROVE_JAX_SHARED_CHECK_S="5")
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "configs" / "tiny.py"),
        "--workdir",
        str(tmp_path / f"w{i}"),
        *args,
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  t = time.monotonic()
  outs = [p.communicate(timeout=240)[0] for p in procs]
  elapsed = time.monotonic() - t
  for p, o in zip(procs, outs):
    assert p.returncode == 2, o[-3000:]
    assert "processes [1] of 2 do not see the workdir process 0 writes" in o, o[-3000:]
    assert "after 5 s" in o
  assert elapsed < 120, elapsed  # the check's bound (5 s here) and two starts, not a hang


@pytest.mark.slow
def test_a_sweep_name_with_glob_characters_trains_resumes_and_evaluates(reference, tmp_path):
  workdir = tmp_path / "runs" / "lr[3e-4] * ? é"
  first = train(config(reference, run_steps=4), workdir)
  assert first.step == 4 and finished_steps(str(workdir)) == [2, 4]
  train(config(reference), workdir)
  assert losses(str(workdir)) == reference.losses
  assert_same_state(read_state(str(workdir), STEPS), reference.states[STEPS], "final")
  from rove_jax.cli import eval as cli

  out = tmp_path / "eval [x]"
  assert (
    cli.main(
      [
        "--workdir",
        str(workdir),
        "--out",
        str(out),
        "--tasks",
        "ppl",
        "--suite",
        "quick",
        "--lengths",
        "32",
        "--no-progress",
      ]
    )
    == 0
  )
  assert json.loads((out / "report.json").read_text())["runs"][0]["step"] == STEPS


@pytest.mark.slow
def test_two_processes_sharing_a_gs_workdir_train_and_resume(tmp_path):
  """Two jax.distributed processes write one gs:// workdir (orbax merges their shares), stop
  after 2 steps, and a one-process resume continues it to the same losses as one process run
  straight through locally."""
  from tests.conftest import write_corpus

  corpus = write_corpus(tmp_path / "corpus")
  from tests.train.test_sharding import two_process_args

  args = two_process_args(corpus, steps=4, checkpoint_every=2)
  workdir = f"{gcs_server.new_bucket()}/shared"

  def cmd(wd, *extra):
    return [
      sys.executable,
      str(ROOT / "train.py"),
      "--config",
      str(ROOT / "configs" / "tiny.py"),
      "--workdir",
      wd,
      *args,
      *extra,
    ]

  single = subprocess.run(
    cmd(str(tmp_path / "one")),
    env=subprocess_env(devices=4),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
  )
  assert single.returncode == 0, single.stderr[-3000:]
  port = free_port()
  from tests.conftest import run_together

  run_together(
    [
      cmd(
        workdir,
        "--config.run_steps=2",
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      )
      for i in range(2)
    ],
    subprocess_env(devices=2),
  )
  assert finished_steps(workdir) == [2]
  again = subprocess.run(
    cmd(workdir),
    env=subprocess_env(devices=4),
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
  )
  assert again.returncode == 0, again.stderr[-3000:]
  one, shared = losses(str(tmp_path / "one")), losses(workdir)
  assert sorted(one) == sorted(shared) == [1, 2, 3, 4]
  for step in one:
    assert abs(one[step] - shared[step]) <= 1e-5 * one[step], (step, one, shared)
  assert not (tmp_path / "gs:").exists()


def test_a_workdir_in_a_missing_bucket_is_one_clear_error_before_any_work():
  from rove_jax.train import resume

  with pytest.raises(
    ValueError,
    match=r"workdir gs://no-such-bucket-x1/run is not writable "
    r"\(the bucket gs://no-such-bucket-x1 does not exist",
  ):
    resume.check_workdir("gs://no-such-bucket-x1/run")
  with pytest.raises(ValueError, match=r"contains '\[' '\]'"):
    resume.check_workdir(f"{gcs_server.new_bucket()}/lr[3e-4]")
