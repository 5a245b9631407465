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
