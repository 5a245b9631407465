"""Training: learning, exact resume, faults (SIGTERM, SIGKILL mid-save, corrupt checkpoints,
non-finite steps) and the bad-input errors."""

import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import loop as training
from rove_jax.train import overrides, program, result
from rove_jax.train.loss import cross_entropy
from rove_jax.train.run_config import RunConfig
from tests.conftest import small_config, subprocess_env, write_corpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
ONE = jax.devices()[:1]  # single-device runs inside the 8-fake-device test process
# train.py subprocesses see one CPU device (the default mesh fills all devices)
ENV1 = subprocess_env(devices=1)


def run_train(c, workdir, **kw):
  return training.train(c, str(workdir), devices=ONE, **kw)


def losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def final_params(workdir):
  ck = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  step = ck.latest_step()
  flat = ck.manager.restore(
    step, args=ckpt_lib.ocp.args.Composite(state=ckpt_lib.ocp.args.StandardRestore())
  )["state"]
  ck.close()
  return step, {k: np.asarray(v) for k, v in flat.items()}


def assert_same_params(a, b):
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_loss_falls_when_overfitting_one_batch(tmp_path):
  c = small_config(tmp_path, **{"optim.lr": 1e-2, "optim.warmup_steps": 0})
  model = GPT(c.model, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = program.make_optimizer(c.optim, 100)
  state = program.TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
  step = program.make_train_step(graphdef, tx, grad_accum=2)
  toks = jax.random.randint(jax.random.key(0), (4, 33), 0, 64)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  first = None
  for _ in range(100):
    state, m = step(state, batch)
    first = float(m["loss"]) if first is None else first
  assert float(m["loss"]) < 0.2 * first, (first, float(m["loss"]))  # memorised


@pytest.mark.slow
def test_grad_accumulation_equals_the_full_batch(tmp_path):
  """A = 4 micro-batches give the full batch's loss and gradient, checked against a jax.grad
  of the full-batch cross-entropy, and the same parameters after a step with a nonzero learning
  rate: with AdamW (nearly scale-invariant, so the grad norm is what catches a missing 1 / A)
  and with SGD (whose update is the gradient itself)."""
  c = small_config(tmp_path, **{"optim.warmup_steps": 0, "optim.lr": 1e-2})
  model = GPT(c.model, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  toks = jax.random.randint(jax.random.key(1), (4, 33), 0, 64)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}

  def full_batch_loss(p):
    logp = jax.nn.log_softmax(nnx.merge(graphdef, p)(batch["inputs"]), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, batch["targets"][..., None], axis=-1))

  want_loss, want_grads = jax.value_and_grad(full_batch_loss)(params)
  want_norm = math.sqrt(
    sum(float(np.sum(np.square(np.asarray(g, np.float64)))) for g in jax.tree.leaves(want_grads))
  )
  # AdamW moves every parameter by ~lr; where a gradient is near its eps the float32 rounding
  # of the two sums shows up, hence atol 1e-3 lr. SGD's update is the gradient.
  for tx, atol in (
    (program.make_optimizer(c.optim, 10), 1e-3 * c.optim.lr),
    (optax.sgd(1.0), 1e-6),
  ):
    outs = []
    for accum in (1, 4):
      state = program.TrainState(
        jax.tree.map(jnp.copy, params), tx.init(params), jnp.zeros((), jnp.int32)
      )
      outs.append(program.make_train_step(graphdef, tx, accum)(state, batch))
    for _, m in outs:
      np.testing.assert_allclose(m["loss"], want_loss, rtol=1e-6)
      np.testing.assert_allclose(m["grad_norm"], want_norm, rtol=1e-5)
    np.testing.assert_allclose(outs[0][1]["loss"], outs[1][1]["loss"], rtol=1e-6)
    chex.assert_trees_all_close(outs[0][0].params, outs[1][0].params, atol=atol, rtol=0)
    moved = max(
      float(np.max(np.abs(a - b)))
      for a, b in zip(jax.tree.leaves(outs[1][0].params), jax.tree.leaves(params))
    )
    assert moved > 1e-3, moved  # the update was not a no-op (lr 0 would make this vacuous)


def test_decay_mask_only_on_projection_matrices():
  model = GPT(
    GPTConfig.tiny(n_layer=1, d_model=32, n_head=2, pos_encoding="t5_bias"), rngs=nnx.Rngs(0)
  )
  mask = program.decay_mask(nnx.state(model, nnx.Param))
  flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  decayed = sorted(k.split("'")[-2] for k, v in flat.items() if v)
  assert decayed == ["w_in", "w_out", "wo", "wqkv"]
  assert not any(v for k, v in flat.items() if "embed" in k or "t5_table" in k or "norm" in k)


def test_tiny_run_on_stdlib_lowers_val_loss(tmp_path):
  c = small_config(
    tmp_path,
    **{
      "data.source": "stdlib",
      "data.path": None,
      "data.max_files": 100,  # 40: Python 3.12's held out one 97-byte file
      "model.n_layer": 2,
      "model.d_model": 64,
      "model.n_head": 4,
      "model.d_ff": 256,
      "data.batch_size": 8,
      "steps": 40,
      "eval_every": 20,
      "checkpoint_every": 40,
      "optim.lr": 3e-3,
      "optim.warmup_steps": 5,
      "log_every": 5,
    },
  )
  summary = run_train(c, tmp_path / "run", log=lambda *a: None)
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    vals = [r["val_loss"] for r in map(json.loads, f) if "val_loss" in r]
  # Both evaluations ran, the last far below a uniform guess over bytes (an untrained model's
  # loss). Between steps 20 and 40 it may move either way: 3.98 -> 4.00 on Python 3.12's stdlib.
  assert len(vals) == 2 and vals[1] < math.log(257) - 1.5, vals
  assert summary.step == 40


def test_resume_equals_straight_run(tmp_path):
  straight = small_config(tmp_path)
  run_train(straight, tmp_path / "a", log=lambda *a: None)
  first = small_config(tmp_path, run_steps=4)
  run_train(first, tmp_path / "b", log=lambda *a: None)
  assert final_params(tmp_path / "b")[0] == 4
  out = []
  run_train(small_config(tmp_path), tmp_path / "b", log=out.append)
  assert any("resumed from step 4" in line for line in out)
  step_a, params_a = final_params(tmp_path / "a")
  step_b, params_b = final_params(tmp_path / "b")
  assert step_a == step_b == 8
  assert_same_params(params_a, params_b)
  assert losses(tmp_path / "a") == losses(tmp_path / "b")  # same batches, same losses


def test_corrupted_latest_checkpoint_falls_back_to_the_previous(tmp_path):
  run_train(small_config(tmp_path), tmp_path / "a", log=lambda *a: None)
  _, params_a = final_params(tmp_path / "a")
  state_dir = tmp_path / "a" / "checkpoints" / "8" / "state"
  for f in state_dir.rglob("*"):
    if f.is_file() and f.stat().st_size > 0:
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])  # truncate every file
  out = []
  run_train(small_config(tmp_path), tmp_path / "a", log=out.append)
  assert any("checkpoint at step 8 cannot be restored" in line for line in out), out
  assert any("resumed from step 4" in line for line in out), out
  assert list((tmp_path / "a" / "checkpoints_unreadable").iterdir())  # kept, not deleted
  _, params_again = final_params(tmp_path / "a")
  assert_same_params(params_a, params_again)


def test_nonfinite_updates_are_skipped_counted_and_stop_the_run(tmp_path):
  c = small_config(
    tmp_path,
    **{"optim.lr": 1e30, "optim.clip_norm": 0.0, "optim.max_nonfinite": 3, "optim.warmup_steps": 0},
  )
  with pytest.raises(training.NonFiniteError, match="3 consecutive non-finite steps"):
    run_train(c, tmp_path / "nan", log=lambda *a: None)
  with open(tmp_path / "nan" / "metrics.jsonl") as f:
    counts = [r["nonfinite_steps"] for r in map(json.loads, f) if "loss" in r]
  assert counts == [1, 2], counts  # the third stops the run before its log line
  assert not (tmp_path / "nan" / "checkpoints").exists() or not list(
    (tmp_path / "nan" / "checkpoints").glob("[0-9]*")
  )


def test_a_run_whose_every_learning_step_was_skipped_fails(tmp_path):
  """Warmup's first step (lr 0) comes out finite even at lr 1e30; it must not make a run in
  which every real update was skipped look like a success."""
  c = small_config(
    tmp_path,
    **{
      "optim.lr": 1e30,
      "optim.clip_norm": 0.0,
      "steps": 5,
      "optim.max_nonfinite": 100,
      "optim.warmup_steps": 2,
    },
  )
  with pytest.raises(
    training.NonFiniteError,
    match="4 of the 5 steps run were skipped as non-finite, every one with a nonzero learning rate",
  ):
    run_train(c, tmp_path / "nan", log=lambda *a: None)


def test_the_closing_line_counts_skipped_steps():
  lines = []
  summary = result.TrainResult(
    workdir="w",
    start_step=0,
    step=8,
    steps_run=8,
    nonfinite_steps=3,
    last={"loss": 2.0},
    tokenizer=None,
    model_config=None,
    params=None,
    graphdef=None,
    mesh=None,
  )
  no_sample = RunConfig(sample_tokens=0)
  result.report(summary, no_sample, out=lines.append)
  assert lines == [
    "done: step 8 in w, train loss 2.0000; 3 of the 8 steps run were skipped "
    "as non-finite (their updates not applied)",
    result.next_step(summary),
  ]
  lines.clear()
  result.report(dataclasses.replace(summary, nonfinite_steps=0), no_sample, out=lines.append)
  assert lines == ["done: step 8 in w, train loss 2.0000", result.next_step(summary)]


def test_checkpointer_refuses_non_finite_state(tmp_path):
  ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
  with pytest.raises(FloatingPointError, match="non-finite"):
    ck.save(1, {"w": jnp.array([1.0, jnp.nan])}, {}, {})
  ck.close()


def _train_cmd(workdir, *extra):
  return [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    str(ROOT / "configs" / "tiny.py"),
    "--workdir",
    str(workdir),
    *extra,
  ]


def _cli_overrides(tmp_path, steps, ckpt_every):
  corpus = write_corpus(tmp_path / "corpus")
  return [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.d_ff=64",
    "--config.model.max_len=32",
    "--config.data.source=text",
    f"--config.data.path={corpus}",
    "--config.data.seq_len=32",
    "--config.data.batch_size=4",
    f"--config.steps={steps}",
    "--config.optim.warmup_steps=2",
    "--config.log_every=1",
    "--config.eval_every=1000",
    f"--config.checkpoint_every={ckpt_every}",
    "--config.progress=False",
    "--config.sample_tokens=0",
  ]


def _wait_for(predicate, timeout, proc=None):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return True
    if proc is not None and proc.poll() is not None:
      return False
    time.sleep(0.02)
  return False


def test_sigterm_saves_and_exits_zero(tmp_path):
  args = _cli_overrides(tmp_path, steps=100000, ckpt_every=100000)
  work = tmp_path / "run"
  proc = subprocess.Popen(
    _train_cmd(work, *args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV1
  )
  try:
    assert _wait_for(
      lambda: len(losses(work)) >= 3 if (work / "metrics.jsonl").exists() else False, 240, proc
    ), "training did not start"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 0, out
  assert "SIGTERM received" in out
  step, _ = final_params(work)
  assert step >= 3 and step == max(losses(work))


def _unfinished_saves(ckdir: pathlib.Path) -> set:
  """Steps whose orbax temporary directory exists and that are not finalized yet."""
  try:
    names = [p.name for p in ckdir.iterdir()]
  except FileNotFoundError:
    return set()
  tmp = {n.split(".")[0] for n in names if ".orbax-checkpoint-tmp" in n}
  return {int(s) for s in tmp if s.isdigit()} - {int(n) for n in names if n.isdigit()}


@pytest.mark.slow
def test_sigkill_during_checkpoint_write_then_resume_is_bitwise_equal(tmp_path):
  args = _cli_overrides(tmp_path, steps=16, ckpt_every=2)
  straight = subprocess.run(
    _train_cmd(tmp_path / "straight", *args), capture_output=True, text=True, timeout=600, env=ENV1
  )
  assert straight.returncode == 0, straight.stderr[-2000:]
  work = tmp_path / "killed"
  ckdir = work / "checkpoints"
  proc = subprocess.Popen(
    _train_cmd(work, *args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV1
  )
  killed_during = set()
  try:
    # Saves come every 2 steps. Freeze the process when a write is seen in progress and look
    # again while it cannot move: still unfinished -> SIGKILL; finished meanwhile -> resume it
    # and wait for the next save.
    while not killed_during and _wait_for(lambda: _unfinished_saves(ckdir), 300, proc):
      proc.send_signal(signal.SIGSTOP)
      killed_during = _unfinished_saves(ckdir)
      if killed_during:
        os.kill(proc.pid, signal.SIGKILL)
      else:
        proc.send_signal(signal.SIGCONT)
    proc.wait(timeout=60)
  finally:
    proc.kill()
  assert killed_during, "no checkpoint write was caught in progress before the run ended"
  assert proc.returncode == -signal.SIGKILL
  # The kill interrupted that write: its temporary directory outlives the process unfinalized,
  # and every finalized checkpoint is older.
  assert _unfinished_saves(ckdir) == killed_during
  finished = sorted(int(p.name) for p in ckdir.iterdir() if p.name.isdigit())
  assert all(s < min(killed_during) for s in finished), (finished, killed_during)
  resumed = subprocess.run(
    _train_cmd(work, *args), capture_output=True, text=True, timeout=600, env=ENV1
  )
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert ("resumed from step" in resumed.stdout) == bool(finished), resumed.stdout[-2000:]
  if finished:
    assert f"resumed from step {finished[-1]} " in resumed.stdout, resumed.stdout[-2000:]
  assert not _unfinished_saves(ckdir)  # the half-written directory was cleaned up
  step_s, params_s = final_params(tmp_path / "straight")
  step_k, params_k = final_params(work)
  assert step_s == step_k == 16
  assert_same_params(params_s, params_k)
  assert losses(work) == losses(tmp_path / "straight")


# --------------------------------------------------------------------------- bad inputs


def test_unknown_config_keys(tmp_path):
  with pytest.raises(
    ValueError,
    match=r"--config.optim.lrr=0.1: optim has no field 'lrr'; "
    r"did you mean --config.optim.lr\?",
  ):
    small_config(tmp_path, **{"optim.lrr": 0.1})
  with pytest.raises(ValueError, match=r"unknown config fields \['optim.lrr'\]; optim has: "):
    RunConfig.from_dict({"optim": {"lrr": 0.1}})
  with pytest.raises(TypeError, match=r"a run config is a rove_jax.train.RunConfig, got dict"):
    run_train({"steps": 3}, tmp_path / "w")
  r = subprocess.run(
    _train_cmd(tmp_path / "w2", "--config.model.n_layers=2"),
    capture_output=True,
    text=True,
    timeout=120,
    env=ENV1,
  )
  assert r.returncode != 0 and "n_layers" in r.stderr


@pytest.mark.parametrize("path_kind", ["missing", "empty"])
def test_missing_or_empty_data_path(tmp_path, path_kind):
  path = tmp_path / "nothing-here"
  if path_kind == "empty":
    path.mkdir()
  c = small_config(tmp_path, **{"data.path": str(path)})
  with pytest.raises(ValueError, match="nothing-here"):
    run_train(c, tmp_path / "w")


def test_workdir_with_a_different_model(tmp_path, trained_run):
  shutil.copytree(trained_run, tmp_path / "w")  # d_model 32, max_len 64
  other = small_config(
    tmp_path, steps=4, **{"model.d_model": 64, "model.max_len": 64, "data.seq_len": 64}
  )
  with pytest.raises(ValueError, match="different model.*d_model"):
    run_train(other, tmp_path / "w")


def test_seq_len_above_the_model_context(tmp_path):
  with pytest.raises(ValueError, match="exceeds model.max_len=32"):
    small_config(tmp_path, **{"data.seq_len": 64, "model.max_len": 32})
  # model.max_len follows data.seq_len unless set
  assert small_config(tmp_path, **{"data.seq_len": 64}).model.max_len == 64


def test_batch_not_divisible(tmp_path):
  c = small_config(tmp_path, **{"mesh.data": 8, "data.batch_size": 12})
  with pytest.raises(ValueError, match="not divisible by the data-parallel size"):
    training.train(c, str(tmp_path / "w"))  # all 8 devices: data-parallel size 8
  with pytest.raises(ValueError, match="grad_accum"):
    small_config(tmp_path, **{"optim.grad_accum": 3})


def test_unwritable_workdir(tmp_path):
  blocker = tmp_path / "a-file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="not writable"):
    run_train(small_config(tmp_path), blocker / "run")


def test_validation_split_too_small_is_an_error_before_training(tmp_path):
  c = small_config(
    tmp_path,
    **{"data.source": "stdlib", "data.path": None, "data.max_files": 20, "data.seq_len": 32},
  )
  with pytest.raises(ValueError, match="validation split has .* fewer than one batch"):
    run_train(c, tmp_path / "w")
  assert not (tmp_path / "w" / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["tiny", "gpt2_124m", "gpt2_354m"])
def test_config_files_validate(name):
  c = overrides.load_file(str(ROOT / "configs" / f"{name}.py"))
  model = c.model
  assert model.pos_encoding == "rove" and c.data.seq_len == model.max_len
  if name != "tiny":
    assert (c.data.tokenizer, model.max_len, model.vocab_size) == ("tiktoken:gpt2", 1024, 50304)
    assert c.data.batch_size * c.data.seq_len == 512 * 1024


def test_dry_run_compiles_the_job_and_trains_nothing(tmp_path):
  """--config.dry_run=True: the configured train step is compiled for the mesh (here 2 CPU
  devices, data=2) and its figures printed; no step runs and the workdir stays empty."""
  work = tmp_path / "work"
  args = _cli_overrides(tmp_path, steps=5, ckpt_every=5)
  proc = subprocess.run(
    _train_cmd(work, *args, "--config.dry_run=True"),
    capture_output=True,
    text=True,
    timeout=300,
    env=subprocess_env(devices=2),
  )
  assert proc.returncode == 0, proc.stderr
  assert "train on local (local), mesh data=2 fsdp=1 tensor=1" in proc.stdout
  assert "memory/device" in proc.stdout and "FLOPs/device" in proc.stdout
  assert not work.exists() or not any(work.iterdir())


def test_cross_entropy_matches_a_float64_reference_and_its_gradient():
  """logsumexp minus the target logit (no gather from log_softmax) == -log softmax[target] in
  float64, masked and unmasked, and its gradient == (softmax - one-hot) / tokens."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 11)) * 3
  targets = rng.integers(0, 11, size=(2, 5))
  mask = rng.random((2, 5)) < 0.6
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  loss, count = cross_entropy(jnp.asarray(logits, jnp.float32), jnp.asarray(targets))
  np.testing.assert_allclose(float(loss), nll.mean(), rtol=1e-6)
  assert count == 10
  loss_m, count_m = cross_entropy(
    jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(mask)
  )
  np.testing.assert_allclose(float(loss_m), (nll * mask).sum() / mask.sum(), rtol=1e-6)
  assert float(count_m) == mask.sum()
  grad = jax.grad(lambda x: cross_entropy(x, jnp.asarray(targets))[0])(
    jnp.asarray(logits, jnp.float32)
  )
  expected = (np.exp(logp) - np.eye(11)[targets]) / targets.size
  np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-6)
