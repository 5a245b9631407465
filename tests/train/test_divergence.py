"""A divergence never costs the last good checkpoint: only states judged good
(train/health.py) are saved, so retention cannot rotate the good ones out, and the run that
diverged says where a rerun resumes."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from rove_jax.storage import paths
from rove_jax.train import health as health_lib
from rove_jax.train import loop as training
from rove_jax.train.metrics import read_metrics
from tests.conftest import small_config, write_corpus
from tests.train.test_loop import ENV1, ROOT, final_params, run_train
from tests.train.test_metrics import _events


def judge(losses, norm, *, jump=2.0, growth=4.0, good_norm=10.0, finite=True):
  h = health_lib.Health(
    max_loss_jump=jump, max_param_growth=growth, good_step=4, good_norm=good_norm
  )
  for i, loss in enumerate(losses):
    h.observe(i + 5, loss, True)
  if not finite:
    h.observe(len(losses) + 5, float("nan"), False)
  return h.verdict(norm)


def test_a_healthy_state_is_good():
  assert judge([3.0, 2.9, 2.8, 2.9, 2.7, 2.6, 2.7, 2.5, 2.6], 11.0) is None


def test_a_skipped_step_leaves_a_state_that_is_not_good():
  assert "step 14's loss or gradient was not finite" in judge([3.0] * 9, 10.0, finite=False)


@pytest.mark.parametrize("last, bad", [(5.9, False), (6.1, True)])
def test_a_loss_jump_over_the_recent_median(last, bad):
  # median of the eight before it: 3.0; the limit is 2 x 3.0
  problem = judge([3.0, 2.0, 4.0, 3.0, 3.0, 2.5, 3.5, 3.0, last], 10.0)
  assert (problem is not None) == bad
  if bad:
    assert "loss 6.1 is more than optim.max_loss_jump=2 x the median 3" in problem


def test_too_little_history_judges_no_jump():
  # A fresh or resumed run: seven losses are not enough to call the eighth a jump.
  assert judge([1.0] * 7 + [100.0], 10.0) is None


@pytest.mark.parametrize(
  "norm, bad", [(39.0, False), (41.0, True), (float("inf"), True), (float("nan"), True)]
)
def test_parameter_norm_growth_over_the_last_good_state(norm, bad):
  problem = judge([3.0] * 9, norm)
  assert (problem is not None) == bad, problem
  if bad and np.isfinite(norm):
    assert "4 x its 10 at step 4" in problem


def test_zero_turns_either_check_off():
  assert judge([3.0] * 9 + [100.0], 1e9, jump=0, growth=0) is None


def test_accepting_a_state_makes_it_the_reference():
  h = health_lib.Health(max_loss_jump=2, max_param_growth=4, good_step=None, good_norm=10.0)
  assert h.last_good().startswith("no checkpoint of this run was judged good")
  h.observe(2, 3.0, True)
  h.accept(2, 30.0)
  assert h.verdict(100.0) is None  # 100 < 4 x 30
  assert h.last_good() == "the last good checkpoint is step 2, where a rerun resumes"


def test_a_finite_but_exploded_update_keeps_the_last_good_checkpoint(tmp_path):
  """The red team's reproducer, in small: a run stopped at step 6 with checkpoints every 2
  steps and keep_checkpoints=3, rerun at lr 1e9. Its updates explode the parameters; no later
  state is saved, step 6 survives retention, the error names it, and a rerun at a sane rate
  resumes from it and finishes."""
  work = tmp_path / "run"
  base = {
    "steps": 30,
    "checkpoint_every": 2,
    "keep_checkpoints": 3,
    "eval_every": 100,
    "optim.warmup_steps": 0,
  }
  run_train(small_config(tmp_path, run_steps=6, **base), work, log=lambda *a: None)
  _, good_params = final_params(work)
  out = []
  with pytest.raises(training.NonFiniteError) as e:
    run_train(small_config(tmp_path, **base, **{"optim.lr": 1e9}), work, log=out.append)
  assert e.value.last_good == 6
  assert "the last good checkpoint is step 6, where a rerun resumes" in str(e.value)
  assert any(line.startswith("step 8: not saved:") for line in out), out
  steps = sorted(int(p.name) for p in (work / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [2, 4, 6], steps
  step, params = final_params(work)
  assert step == 6
  for k in good_params:  # the good state, untouched
    np.testing.assert_array_equal(params[k], good_params[k], err_msg=k)
  out.clear()
  summary = run_train(small_config(tmp_path, **base), work, log=out.append)
  assert "resumed from step 6" in " ".join(out), out
  assert summary.step == 30 and np.isfinite(summary.last["loss"])
  with open(work / "metrics.jsonl") as f:
    norms = [r["param_norm"] for r in map(json.loads, f) if "param_norm" in r]
  assert all(np.isfinite(norms)) and max(norms) < 4 * min(norms)


def test_the_command_line_says_how_to_resume(tmp_path):
  """exit 3, one line: the last good step and this command again at a tenth of the rate."""
  work = tmp_path / "run"
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
    "steps": 12,
    "checkpoint_every": 2,
    "optim.warmup_steps": 0,
    "progress": False,
    "sample_tokens": 0,
    "eval_every": 100,
  }
  cmd = [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    str(ROOT / "configs" / "tiny.py"),
    f"--workdir={work}",
  ] + [f"--config.{k}={v}" for k, v in small.items()]
  subprocess.run(
    cmd + ["--config.run_steps=4"], env=ENV1, check=True, capture_output=True, cwd=ROOT, timeout=300
  )
  p = subprocess.run(
    cmd + ["--config.optim.lr=1e9"], env=ENV1, capture_output=True, text=True, cwd=ROOT, timeout=300
  )
  assert p.returncode == 3, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "the last good checkpoint is step 4" in last, last
  assert last.endswith("--config.eval_every=100 --config.optim.lr=1e+08"), last
  assert "python train.py --config " in last, last
  assert sorted(os.listdir(work / "checkpoints"))[-1] == "4"


def test_a_run_stopped_by_its_error_keeps_what_it_logged(tmp_path, gcs_bucket):
  """An error ends the loop between two stores of the log, inside the profiler's window. What
  was recorded before it is kept as a finished run keeps it: on gs://, metrics.jsonl's lines
  since the last store (the losses leading up to the error); locally, TensorBoard's buffered
  events; the trace of the steps run. The process can profile again."""
  c = small_config(
    tmp_path,
    profile_steps="2:6",
    **{"optim.lr": 1e30, "optim.clip_norm": 0.0, "optim.max_nonfinite": 3, "optim.warmup_steps": 0},
  )
  local, remote = str(tmp_path / "local"), f"{gcs_bucket}/run"
  errors = []  # held, as a caller holds the error it reports: its frames keep the run alive
  for workdir in (local, remote):
    with pytest.raises(training.NonFiniteError, match="3 consecutive non-finite steps") as e:
      run_train(c, workdir, log=lambda *a: None)
    errors.append(e)
  logged = lambda w: [(r["step"], r["loss"]) for r in read_metrics(w) if "loss" in r]
  assert [step for step, _ in logged(local)] == [1, 2]  # the third stops the run
  assert logged(remote) == logged(local)
  events = _events(tmp_path / "local" / "tensorboard")
  assert {ev.step for ev in events if ev.HasField("summary")} == {1, 2}, events
  for workdir in (local, remote):
    traces = [f for f in paths.walk_files(paths.join(workdir, "profile")) if "trace" in f]
    assert traces, workdir
  jax.profiler.start_trace(str(tmp_path / "again"))  # raises while a trace is still running
  jax.profiler.stop_trace()
