"""optim.loss_impl=fused: the trainer with the output projection and loss in one kernel
(rove_jax.kernels.linear_ce, interpreted on CPU) against the unfused loss, and the config's
refusals before any work."""

import json

import numpy as np
import pytest

from tests.conftest import small_config
from tests.train.test_loop import run_train


def test_a_run_with_the_fused_loss_trains_as_the_unfused_one(tmp_path):
  """optim.loss_impl=fused through the trainer (train step and validation): a float32 tiny run
  logs the losses and the validation loss of the same run with the unfused loss, to float32
  rounding over 6 steps."""
  base = {"steps": 6, "eval_every": 6, "checkpoint_every": 6}
  runs = {
    impl: run_train(
      small_config(tmp_path, **base, **{"optim.loss_impl": impl}),
      tmp_path / impl,
      log=lambda *a: None,
    )
    for impl in ("xla", "fused")
  }
  losses = {
    impl: [
      r["loss"] for r in map(json.loads, open(tmp_path / impl / "metrics.jsonl")) if "loss" in r
    ]
    for impl in runs
  }
  assert len(losses["fused"]) == 6
  np.testing.assert_allclose(losses["fused"], losses["xla"], rtol=2e-5)
  np.testing.assert_allclose(runs["fused"].val_loss, runs["xla"].val_loss, rtol=2e-5)


@pytest.mark.parametrize(
  "override,message",
  [
    ({"optim.loss_impl": "cuda"}, r"optim.loss_impl must be one of \('xla', 'fused'\)"),
    (
      {"optim.loss_impl": "fused", "model.d_model": 40, "model.n_head": 2},
      "model.d_model a multiple of 16, got 40",
    ),
    ({"optim.loss_impl": "fused", "data.seq_len": 30}, "the micro-batch's tokens"),
  ],
)
def test_the_config_refuses_what_the_fused_loss_cannot_run(tmp_path, override, message):
  with pytest.raises(ValueError, match=message):
    small_config(tmp_path, **override)


def test_a_run_resumes_with_the_other_loss_without_a_warning(tmp_path):
  """The two losses compute the same thing, so switching between them is not a config change
  that resume.py warns about (it warns for other optim.* fields)."""
  base = {"steps": 4, "eval_every": 100, "checkpoint_every": 2}
  work = tmp_path / "run"
  run_train(small_config(tmp_path, run_steps=2, **base), work, log=lambda *a: None)
  out = []
  fused = {"optim.loss_impl": "fused"}
  result = run_train(small_config(tmp_path, **base, **fused), work, log=out.append)
  assert result.start_step == 2 and result.step == 4
  assert not [line for line in out if "loss_impl" in line], out
  out.clear()
  changed = {"optim.loss_impl": "xla", "optim.b2": 0.99}
  run_train(small_config(tmp_path, **{**base, "steps": 6}, **changed), work, log=out.append)
  assert any("optim.b2" in line for line in out), out  # the warning itself still works
  assert not [line for line in out if "loss_impl" in line], out
