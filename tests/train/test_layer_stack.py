"""The train state with the layers' parameters stacked (rove_jax/train/layer_stack.py): the
conversions, the checkpoints' layout, and a train step that is the per-layer one."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.train import clipping, program, sharding
from rove_jax.train.flat_state import to_flat
from rove_jax.train.layer_stack import LayerStack
from rove_jax.train.run_config import OptimConfig
from tests.conftest import small_config
from tests.train.test_loop import assert_same_params, final_params, losses, run_train


@pytest.fixture(scope="module")
def tiny():
  cfg = GPTConfig.tiny(n_layer=3, d_model=32, n_head=2, d_ff=64, vocab_size=64, max_len=32)
  model = GPT(cfg, rngs=nnx.Rngs(0))
  return nnx.split(model, nnx.Param)


def test_stack_and_unstack_are_inverse(tiny):
  _, params = tiny
  layers = LayerStack(jax.eval_shape(lambda: params))
  assert layers.active and layers.n_layers == 3
  stacked = layers.stack(params)
  assert stacked["blocks"]["attn"]["wqkv"].shape == (3,) + params["blocks"][0]["attn"]["wqkv"].shape
  assert stacked["embed"].shape == params["embed"].shape  # not a block's: as it is
  np.testing.assert_array_equal(
    stacked["blocks"]["mlp"]["w_in"][2], params["blocks"][2]["mlp"]["w_in"][...]
  )
  back = layers.unstack(stacked)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  chex.assert_trees_all_equal(back, params)
  # a model built from the unstacked parameters is the model
  assert isinstance(back["blocks"][1]["attn"]["wqkv"], nnx.Param)


def test_checkpoints_keep_the_models_layout(tiny):
  """to_layers names every entry as a train state of per-layer parameters did before stacking
  (so older checkpoints restore, and readers see the model's parameters); from_layers inverts
  it, moments included."""
  _, params = tiny
  layers = LayerStack(params)
  tx = program.make_optimizer(OptimConfig(), 10)
  old = program.new_state(tx, params)  # the layout checkpoints have always had
  state = program.new_state(tx, params, layers)
  state = state.replace(opt_state=jax.tree.map(lambda x: x + 1, state.opt_state))
  saved = layers.to_layers(state)
  assert {k: v.shape for k, v in to_flat(saved).items()} == {
    k: v.shape for k, v in to_flat(old).items()
  }
  assert "opt_state.1.0.mu.blocks.2.attn.wqkv.value" in to_flat(saved)
  assert "params.blocks.attn.wqkv" in to_flat(state)
  chex.assert_trees_all_equal(layers.from_layers(saved), state)


def test_blocks_of_different_shapes_are_not_stacked():
  tree = {"blocks": {0: {"w": jnp.zeros(2)}, 1: {"w": jnp.zeros(3)}}, "e": jnp.ones(4)}
  layers = LayerStack(tree)
  assert not layers.active
  assert layers.stack(tree) is tree and layers.to_layers(tree) is tree


def test_stacked_arrays_keep_their_layers_sharding(tiny):
  _, params = tiny
  layers = LayerStack(params)
  mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
  specs = {
    k: (shape, P(*(f"ax{i}" for i in range(len(shape)))))
    for k, (shape, _) in sharding.param_path_specs(params, mesh).items()
  }
  stacked = layers.path_specs(specs)
  shape, spec = stacked["['blocks']['mlp']['w_in']"]
  assert shape == (3, 32, 64) and spec == P(None, "ax0", "ax1")
  assert stacked["['embed']"] == specs["['embed'].value"]
  assert len(stacked) == len(jax.tree.leaves(layers.stack(params)))


def test_stacked_adamw_updates_equal_optax_per_layer():
  """The optimizer on the stacked tree (the trainer's clipping + optax.adamw) against
  optax.clip_by_global_norm + optax.adamw on the per-layer tree, over three steps whose
  gradients are clipped. They agree to float32 rounding: the global norm sums the squares in
  another order and the trainer's clipping divides by the norm before it multiplies (a few
  ulp a gradient, hence rtol 1e-6 on the parameters; the moments, sums of terms of both signs,
  to 1e-8 absolute where they are about 1e-3)."""
  keys = iter(jax.random.split(jax.random.key(0), 64))
  leaf = lambda *shape: jax.random.normal(next(keys), shape)
  block = lambda: {"wqkv": leaf(8, 3, 2, 4), "bo": leaf(8), "norm": {"scale": leaf(8)}}
  params = {"blocks": {i: block() for i in range(4)}, "embed": leaf(16, 8)}
  layers = LayerStack(params)
  assert layers.active
  schedule = optax.linear_schedule(1e-2, 1e-3, 3)
  adamw = lambda: optax.adamw(
    schedule, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=program.decay_mask
  )
  want_tx = optax.chain(optax.clip_by_global_norm(1.0), adamw())
  got_tx = optax.chain(clipping.clip_by_global_norm(1.0), adamw())
  want_p, got_p = params, layers.stack(params)
  want_s, got_s = want_tx.init(want_p), got_tx.init(got_p)
  for step in range(3):
    grads = jax.tree.map(lambda x: 10.0 * jax.random.normal(next(keys), x.shape), params)
    assert float(optax.tree.norm(grads)) > 1.0  # clipped
    u, want_s = want_tx.update(grads, want_s, want_p)
    want_p = optax.apply_updates(want_p, u)
    u, got_s = got_tx.update(layers.stack(grads), got_s, got_p)
    got_p = optax.apply_updates(got_p, u)
    chex.assert_trees_all_close(layers.unstack(got_p), want_p, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(layers.to_layers(got_s), want_s, rtol=1e-5, atol=1e-8)
  # weight decay reached the stacked matrices: without it they would have moved less
  assert program.decay_mask(got_p)["blocks"]["wqkv"]


@pytest.mark.parametrize("accum", [1, 2])
def test_stacked_train_step_is_the_per_layer_step(tiny, accum):
  graphdef, params = tiny
  layers = LayerStack(params)
  o = OptimConfig(lr=1e-2, warmup_steps=0, clip_norm=0.5)
  tx = program.make_optimizer(o, 10)
  toks = jax.random.randint(jax.random.key(1), (4, 17), 0, 64)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  plain = program.make_train_step(graphdef, tx, accum)
  stacked = program.make_train_step(graphdef, tx, accum, layers=layers)
  eval_step = program.make_eval_step(graphdef, layers=layers)
  copy = lambda: jax.tree.map(jnp.copy, params)  # each step donates its state
  a, b = program.new_state(tx, copy()), program.new_state(tx, copy(), layers)
  for _ in range(3):
    a, ma = plain(a, batch)
    b, mb = stacked(b, batch)
    np.testing.assert_allclose(mb["loss"], ma["loss"], rtol=1e-6)
    np.testing.assert_allclose(mb["grad_norm"], ma["grad_norm"], rtol=1e-6)
    assert bool(mb["finite"])
  # AdamW moves each parameter by about lr a step whatever its gradient's size, so the norm's
  # summation order (float32 rounding) shows in a small bias's update: atol a thousandth of lr.
  chex.assert_trees_all_close(layers.unstack(b.params), a.params, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    eval_step(b.params, batch), program.make_eval_step(graphdef)(a.params, batch), rtol=1e-5
  )


def test_a_run_saves_and_resumes_in_the_models_layout(tmp_path):
  """A trainer run of two layers (stacked) writes checkpoints whose entries are those of the
  per-layer train state, as before stacking, so checkpoints of either kind restore; resuming
  from one gives the straight run's parameters and losses."""
  two = {"model.n_layer": 2}
  run_train(small_config(tmp_path, **two), tmp_path / "a", log=lambda *a: None)
  run_train(small_config(tmp_path, run_steps=4, **two), tmp_path / "b", log=lambda *a: None)
  step, flat = final_params(tmp_path / "b")
  c = small_config(tmp_path, **two)
  _, params = nnx.split(nnx.eval_shape(lambda: GPT(c.model, rngs=nnx.Rngs(0))), nnx.Param)
  per_layer = jax.eval_shape(
    lambda p: program.new_state(program.make_optimizer(c.optim, 8), p), params
  )
  assert step == 4 and set(flat) == set(to_flat(per_layer))
  assert "params.blocks.1.attn.wqkv.value" in flat
  out = []
  run_train(small_config(tmp_path, **two), tmp_path / "b", log=out.append)
  assert any("resumed from step 4" in line for line in out)
  assert_same_params(final_params(tmp_path / "a")[1], final_params(tmp_path / "b")[1])
  assert losses(tmp_path / "a") == losses(tmp_path / "b")
