"""optim.loss_impl=fused: the trainer with the output projection and loss in one kernel
(rove_jax.kernels.linear_ce, interpreted on CPU) against the unfused loss, and the config's
refusals before any work."""

import json

import jax
import numpy as np
import pytest

from tests.conftest import small_config
from tests.train.test_loop import losses, run_train
from tests.train.test_sharding import grad_norms, mesh_config, run


def test_a_run_resumed_with_the_fused_loss_trains_as_the_unfused_one(tmp_path):
  """optim.loss_impl=fused through the trainer (train step and validation): a float32 tiny run
  trained 2 steps with the unfused loss and resumed with the fused one logs the losses and the
  validation loss of the same run trained unfused throughout, to float32 rounding; the switch
  is not a config change that resume.py warns about (the two compute the same loss)."""
  base = {"steps": 4, "eval_every": 4, "checkpoint_every": 2}
  want = run_train(small_config(tmp_path, **base), tmp_path / "xla", log=lambda *a: None)
  work = tmp_path / "switched"
  run_train(small_config(tmp_path, run_steps=2, **base), work, log=lambda *a: None)
  out = []
  fused = {"optim.loss_impl": "fused"}
  got = run_train(small_config(tmp_path, **base, **fused), work, log=out.append)
  assert got.start_step == 2 and got.step == 4
  assert not [line for line in out if "loss_impl" in line], out
  losses = {
    name: [
      r["loss"] for r in map(json.loads, open(tmp_path / name / "metrics.jsonl")) if "loss" in r
    ]
    for name in ("xla", "switched")
  }
  assert len(losses["switched"]) == 4
  np.testing.assert_allclose(losses["switched"], losses["xla"], rtol=2e-5)
  np.testing.assert_allclose(got.val_loss, want.val_loss, rtol=2e-5)


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


def test_on_a_data_fsdp_tensor_mesh_the_fused_loss_trains_as_the_unfused_one(tmp_path):
  """On a (data, fsdp, tensor) = (2, 2, 2) mesh of the 8 CPU devices the fused loss splits the
  tokens over data and fsdp and the classes over tensor, and reduce-scatters the weight's
  gradient over fsdp: three steps log the unfused run's losses and gradient norms."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py gives 8 CPU devices)")
  logged = {}
  for impl in ("xla", "fused"):
    c = mesh_config(tmp_path, (2, 2, 2), **{"steps": 3, "optim.loss_impl": impl})
    run(c, tmp_path / impl, 8)
    logged[impl] = (losses(tmp_path / impl), grad_norms(tmp_path / impl))
  assert sorted(logged["fused"][0]) == [1, 2, 3]
  for got, want in zip(logged["fused"], logged["xla"]):
    np.testing.assert_allclose(
      [got[s] for s in sorted(want)], [want[s] for s in sorted(want)], rtol=2e-5
    )
