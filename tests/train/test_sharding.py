"""Sharded training on 8 simulated CPU devices and on two real processes."""

import json
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rove_jax.nn.model import GPTConfig, abstract_params
from rove_jax.train import loop as training
from rove_jax.train import sharding
from tests.conftest import (
  free_port,
  run_together,
  small_config,
  subprocess_env,
  write_corpus,
)
from tests.train.test_loop import ROOT, losses

# data alone, all three axes, fsdp with tensor (tensor also runs 4-way in the save/restore test)
MESHES = [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2)]


def mesh_config(tmp_path, mesh, **over):
  return small_config(
    tmp_path,
    **{
      "model.n_layer": 1,
      "model.d_model": 64,
      "model.n_head": 8,
      "model.d_ff": 128,
      "model.max_len": 32,
      "data.batch_size": 8,
      "steps": 5,
      "checkpoint_every": 100,
      "eval_every": 100,
      "mesh.data": mesh[0],
      "mesh.fsdp": mesh[1],
      "mesh.tensor": mesh[2],
      **over,
    },
  )


def run(c, workdir, n_devices):
  return training.train(c, str(workdir), devices=jax.devices()[:n_devices], log=lambda *a: None)


def grad_norms(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return {r["step"]: r["grad_norm"] for r in map(json.loads, f) if "grad_norm" in r}


@pytest.mark.slow
def test_five_steps_have_the_same_losses_on_every_mesh(tmp_path):
  """Every mesh gives the one-device run's losses, gradient norms and final parameters: a loss
  is computed before its step's update, so only the parameters show the last update, and the
  grad norm shows a gradient scaled per device (which AdamW would hide from the losses). Two
  layers: the train state holds the blocks' parameters stacked (train/layer_stack.py)."""
  results, norms, params = {}, {}, {}
  for mesh in MESHES:
    n = int(np.prod(mesh))
    work = tmp_path / f"m{'x'.join(map(str, mesh))}"
    summary = run(mesh_config(tmp_path, mesh, **{"model.n_layer": 2}), work, n)
    results[mesh], norms[mesh] = losses(work), grad_norms(work)
    params[mesh] = jax.tree.map(np.asarray, summary.params)
  ref = results[(1, 1, 1)]
  assert sorted(ref) == [1, 2, 3, 4, 5]
  assert ref[5] < ref[1]
  for mesh, got in results.items():
    for step in ref:
      assert abs(got[step] - ref[step]) <= 1e-5 * abs(ref[step]), (mesh, step, got, ref)
    assert sorted(norms[mesh]) == [1, 2, 3, 4, 5], mesh
    chex.assert_trees_all_close(norms[mesh], norms[(1, 1, 1)], rtol=1e-5)
    # AdamW moves each parameter by ~lr = 1e-3 a step; 1e-5 is 1% of one step.
    chex.assert_trees_all_close(params[mesh], params[(1, 1, 1)], atol=1e-5, rtol=0)


def test_parameter_specs_follow_the_rules():
  cfg = GPTConfig.tiny(
    n_layer=1, d_model=64, n_head=8, d_ff=128, pos_encoding="t5_bias", tie_embeddings=False
  )
  mesh = sharding.make_mesh(1, 4, 2)
  paths = sharding.param_path_specs(abstract_params(cfg), mesh)
  specs = {k: spec for k, (_, spec) in paths.items()}
  get = lambda suffix: next(v for k, v in specs.items() if k.endswith(suffix))
  assert get("['attn']['wo'].value") == P("tensor", None, "fsdp")  # heads over tensor
  assert get("['attn']['wqkv'].value") == P("fsdp", None, "tensor", None)  # [E, 3, H, D]
  gqa = GPTConfig.tiny(n_layer=1, d_model=64, n_head=8, n_kv_head=2, d_ff=128)
  gqa_specs = {
    k: spec for k, (_, spec) in sharding.param_path_specs(abstract_params(gqa), mesh).items()
  }
  assert next(v for k, v in gqa_specs.items() if k.endswith("['attn']['wq'].value")) == P(
    "fsdp", "tensor", None
  )
  assert next(v for k, v in gqa_specs.items() if k.endswith("['attn']['wkv'].value")) == P(
    "fsdp", None, "tensor", None
  )
  assert get("['mlp']['w_in'].value") == P("fsdp", "tensor")
  assert get("['mlp']['w_out'].value") == P("tensor", "fsdp")
  assert get("['embed'].value") == P("tensor", "fsdp")
  assert get("['lm_head'].value") == P("fsdp", "tensor")
  assert get("['t5_table'].value") == P(None, "tensor")
  assert get("['norm1']['scale'].value") == P("fsdp")
  # Pure FSDP: every parameter with an embed axis is split; the rules leave only the small
  # parameters without one (per-head and MLP biases, the T5 table: tensor axes of size 1)
  # replicated.
  mesh = sharding.make_mesh(1, 8, 1)
  params = abstract_params(cfg)
  flat = sharding.param_path_specs(params, mesh)
  axes = {
    jax.tree_util.keystr(p) + ".value": v.get_metadata()["logical_axes"]
    for p, v in jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nnx.Variable)
    )[0]
  }
  replicated = sorted(k for k, (_, spec) in flat.items() if all(a is None for a in spec))
  assert replicated == sorted(k for k, a in axes.items() if "embed" not in a), replicated
  assert all("embed" not in axes[k] for k in replicated)
  assert len(replicated) < len(flat) / 3


def test_state_is_created_sharded(tmp_path):
  c = mesh_config(tmp_path, (2, 2, 2), steps=1, **{"optim.warmup_steps": 0})
  summary = run(c, tmp_path / "w", 8)
  wo = summary.params["blocks"][0]["attn"]["wo"][...]
  assert wo.sharding.spec == P("tensor", None, "fsdp")
  shard_shapes = {s.data.shape for s in wo.addressable_shards}
  assert shard_shapes == {(4, 8, 32)}  # [8 heads / 2, 8, 64 / 2] on every device


@pytest.mark.slow
def test_save_on_one_mesh_restore_on_another_and_continue(tmp_path):
  straight = mesh_config(tmp_path, (8, 1, 1), steps=6)
  run(straight, tmp_path / "straight", 8)
  first = mesh_config(tmp_path, (8, 1, 1), steps=6, run_steps=3)
  run(first, tmp_path / "moved", 8)
  for mesh, n in (((1, 2, 4), 8), ((1, 1, 1), 1)):  # fsdp=2 x tensor=4, then one device
    out = []
    second = mesh_config(tmp_path, mesh, steps=6, run_steps=None if n == 1 else 2)
    training.train(second, str(tmp_path / "moved"), devices=jax.devices()[:n], log=out.append)
    assert any("resumed from step" in line for line in out), out
  want, got = losses(tmp_path / "straight"), losses(tmp_path / "moved")
  assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * want[step], (step, got, want)


def test_mesh_errors(tmp_path):
  with pytest.raises(ValueError, match=r"needs 3 devices but 8 are available"):
    sharding.make_mesh(3, 1, 1)
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    sharding.make_mesh(-1, -1, 1)
  with pytest.raises(ValueError, match="not divisible by 3"):
    sharding.make_mesh(-1, 3, 1)
  c = mesh_config(tmp_path, (4, 2, 1), **{"data.batch_size": 12})
  with pytest.raises(ValueError, match="data-parallel size mesh.data \\* mesh.fsdp = 8"):
    run(c, tmp_path / "w", 8)


def two_process_args(corpus, *, steps: int, checkpoint_every: int) -> list[str]:
  """train.py flags over configs/tiny.py for the two-process tests: a 1-layer model on the
  text corpus, a global batch of 8 over a (data 2, fsdp 2) mesh, every step logged."""
  return [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=4",
    "--config.model.d_ff=64",
    "--config.model.max_len=32",
    "--config.data.source=text",
    f"--config.data.path={corpus}",
    "--config.data.seq_len=32",
    "--config.data.batch_size=8",
    f"--config.steps={steps}",
    "--config.optim.warmup_steps=2",
    "--config.log_every=1",
    "--config.eval_every=1000",
    f"--config.checkpoint_every={checkpoint_every}",
    "--config.progress=False",
    "--config.sample_tokens=0",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
  ]


@pytest.mark.slow
def test_two_processes_equal_one_process(tmp_path):
  corpus = write_corpus(tmp_path / "corpus")
  args = two_process_args(corpus, steps=5, checkpoint_every=1000)

  def cmd(workdir, *extra):
    return [
      sys.executable,
      str(ROOT / "train.py"),
      "--config",
      str(ROOT / "configs" / "tiny.py"),
      "--workdir",
      str(workdir),
      *args,
      *extra,
    ]

  def env(n):
    return subprocess_env(devices=n, JAX_PLATFORMS="cpu")

  single = subprocess.run(
    cmd(tmp_path / "one"), env=env(4), capture_output=True, text=True, timeout=300
  )
  assert single.returncode == 0, single.stderr[-3000:]
  port = free_port()
  run_together(
    [
      cmd(
        tmp_path / "two",
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      )
      for i in range(2)
    ],
    env(2),
  )
  one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
  assert sorted(one) == sorted(two) == [1, 2, 3, 4, 5]
  for step in one:
    assert abs(one[step] - two[step]) <= 1e-5 * one[step], (step, one, two)
  chex.assert_trees_all_close(grad_norms(tmp_path / "two"), grad_norms(tmp_path / "one"), rtol=1e-5)
  # The evaluation restore reads a checkpoint two processes wrote onto this one process.
  from rove_jax.evaluation import scoring

  p_one, p_two = (scoring.load_run(tmp_path / w).params for w in ("one", "two"))
  chex.assert_trees_all_close(p_two, p_one, rtol=1e-5, atol=1e-6)
