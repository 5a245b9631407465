"""The end-of-run report (train/result.py) and the resume warnings (train/resume.py) a user
sees when rerunning a run: a finished run says that nothing was trained, a config that differs
from the saved run's names each changed field, and every report ends with the next command."""

import dataclasses

import jax

from rove_jax.train import loop as training
from rove_jax.train import result, resume
from tests.conftest import small_config

ONE = jax.devices()[:1]


def train(c, workdir, log):
  return training.train(c, str(workdir), devices=ONE, log=log)


def warnings_in(lines):
  return [line for line in lines if line.startswith("WARNING: this config differs")]


def test_rerunning_a_finished_run_says_nothing_was_trained_and_names_overrides(tmp_path):
  workdir = tmp_path / "run"
  first = []
  done = train(small_config(tmp_path), workdir, first.append)
  assert not warnings_in(first)
  report = []
  result.report(done, small_config(tmp_path), out=report.append)
  assert report[0].startswith(f"done: step 8 in {done.workdir}")
  assert report[-1] == (
    f"next: rove-eval --workdir {done.workdir} --tasks ppl (perplexity from "
    f"0.5x to 16x the training length, with and without YaRN; "
    f"docs/evaluation.md)"
  )

  # The same command again: finished, nothing trained, no warning.
  again = []
  rerun = train(small_config(tmp_path), workdir, again.append)
  assert (rerun.start_step, rerun.step, rerun.steps_run) == (8, 8, 0)
  assert not warnings_in(again), again
  report.clear()
  result.report(rerun, small_config(tmp_path), out=report.append)
  assert report == [
    f"already finished at step 8 in {rerun.workdir}; nothing trained (--config.steps=8: raise "
    f"it to train further, or give a new --workdir)",
    result.next_step(rerun),
  ]

  # With an override that the saved run does not have: a warning names it.
  changed = []
  train(small_config(tmp_path, **{"optim.lr": 1e-2}), workdir, changed.append)
  (warning,) = warnings_in(changed)
  assert "optim.lr: saved 0.001, now 0.01" in warning and str(workdir) in warning, warning
  assert warning.endswith("; the run is finished, so nothing is trained."), warning

  # Continuing under a longer schedule trains, and says the schedule changed.
  longer = []
  more = train(small_config(tmp_path, steps=10, **{"optim.lr": 1e-2}), workdir, longer.append)
  assert (more.start_step, more.step) == (8, 10)
  (warning,) = warnings_in(longer)
  assert "steps: saved 8, now 10" in warning and "optim.lr" in warning, warning
  assert "the run continues under the new values" in warning


def test_config_changes_compare_what_the_run_computes():
  saved = {
    "model": {"n_layer": 2, "rope_scaling": None},
    "config": {
      "steps": 8,
      "seed": 0,
      "log_every": 1,
      "run_steps": 4,
      "optim": {"lr": 1e-3},
      "data": {"allow_changed": False, "seq_len": 32},
    },
  }
  now = {
    "model": {  # a checkpoint from before fused_variant lacks it: no change either
      "n_layer": 2,
      "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
      "fused_variant": "2wg+bf16",
    },
    "config": {
      "steps": 8,
      "seed": 1,
      "log_every": 5,
      "run_steps": None,
      "optim": {"lr": 1e-3},
      "data": {"allow_changed": True, "seq_len": 32},
    },
  }
  assert resume.config_changes(saved, now) == [
    "model.rope_scaling: saved None, now {'rope_type': 'yarn', 'factor': 2.0}",
    "seed: saved 0, now 1",
  ]
  assert resume.config_changes(saved, saved) == []


def test_a_run_stopped_by_a_signal_is_not_called_finished():
  r = result.TrainResult(
    workdir="w",
    start_step=4,
    step=4,
    steps_run=0,
    nonfinite_steps=0,
    last={},
    tokenizer=None,
    model_config=None,
    params=None,
    graphdef=None,
    mesh=None,
    stopped_by="SIGTERM",
  )
  assert not result.finished_already(r)
  assert result.finished_already(dataclasses.replace(r, stopped_by=None))
