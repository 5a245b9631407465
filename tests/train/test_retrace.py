"""The train step and the decoding step compile once per shape: chex.assert_max_traces guards.

A guard wraps a function that runs inside the jitted step (the optimizer's update, the model's
forward), so every trace of the step traces it again. Each test then retraces on purpose (a new
shape, a new Python scalar) and expects the guard to fire, so a guard that no longer sees the
step cannot pass silently.
"""

import chex
import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from rove_jax.nn.model import GPT, generate
from rove_jax.train import loop as training
from rove_jax.train import program
from rove_jax.train.run_config import OptimConfig
from tests.conftest import gpt_config, small_config

RETRACED = "traced > "


@pytest.fixture(autouse=True)
def fresh_trace_counts():
  chex.clear_trace_counter()  # counts are global, keyed by where the guard was made
  yield
  chex.clear_trace_counter()


def guarded(tx: optax.GradientTransformation, n: int) -> optax.GradientTransformation:
  """tx whose update may be traced at most n times (it is traced once per train-step trace)."""
  return optax.GradientTransformation(tx.init, chex.assert_max_traces(tx.update, n=n))


def batch_of(key, B=4, T=16, vocab=320):
  toks = jax.random.randint(key, (B, T + 1), 0, vocab)
  return {"inputs": toks[:, :-1], "targets": toks[:, 1:]}


def test_train_step_traces_once():
  """With gradient accumulation (a scan over micro-batches); the loop test below runs A = 1."""
  cfg = gpt_config()
  graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  o = OptimConfig()
  tx = guarded(program.make_optimizer(o, 10), n=1)
  step = program.make_train_step(graphdef, tx, grad_accum=2, schedule=program.lr_schedule(o, 10))
  state = program.TrainState(params, tx.init(params), jnp.zeros((), jnp.int32))
  for i in range(4):  # new data every step, same shapes: one trace
    state, metrics = step(state, batch_of(jax.random.key(i)))
  assert int(state.step) == 4 and bool(metrics["finite"])
  # A batch of another length is a new trace, and the guard says so.
  with pytest.raises(AssertionError, match=RETRACED):
    step(state, batch_of(jax.random.key(9), T=8))


def test_training_loop_traces_its_step_once(tmp_path, monkeypatch):
  """The real loop (data pipeline, metrics, checkpoint, resume state) feeds its step batches
  and states that never force a second compile."""
  made, original = [], program.make_optimizer

  def make_optimizer(o, steps):
    made.append(guarded(original(o, steps), n=1))
    return made[-1]

  monkeypatch.setattr(program, "make_optimizer", make_optimizer)
  c = small_config(tmp_path, steps=5, eval_every=100, checkpoint_every=100)
  training.train(c, str(tmp_path / "run"), devices=jax.devices()[:1], log=lambda *a: None)
  assert len(made) == 1
  # The loop traced the guarded update exactly once: one more trace is over the limit.
  tx, params = made[0], {"w": jnp.ones(2)}
  with pytest.raises(AssertionError, match=RETRACED):
    jax.jit(tx.update)(params, tx.init(params), params)


def test_decode_step_traces_once():
  """A jitted one-token step against the KV cache (the public model(tokens, cache=...) API):
  the cache it returns has the same structure, shapes and dtypes as the one it was given."""
  cfg = gpt_config(vocab_size=64, pos_encoding="rove")
  graphdef, state = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)))

  @jax.jit
  def prefill(state, prompt_BP, cache):
    return nnx.merge(graphdef, state)(prompt_BP, cache=cache)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def decode(state, token_B1, cache):
    logits, cache = nnx.merge(graphdef, state)(token_B1, cache=cache)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None], cache

  model = nnx.merge(graphdef, state)
  prompt = jax.random.randint(jax.random.key(0), (2, 5), 0, 64)
  logits, cache = prefill(state, prompt, model.init_cache(2, 12))
  token = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)[:, None]
  for _ in range(6):
    token, cache = decode(state, token, cache)
  assert int(cache.length) == 11
  # A cache of another capacity is a new trace, and the guard says so.
  with pytest.raises(AssertionError, match=RETRACED):
    decode(state, token, model.init_cache(2, 13))


def test_generate_traces_once(monkeypatch):
  """generate() compiles its prefill + decoding scan once for a given shape and settings: the
  model's forward is traced twice in that compile (the prefill and the scan body), never again
  on later calls with new prompts and keys."""
  cfg = gpt_config(vocab_size=96, pos_encoding="rove", n_layer=2)
  model = GPT(cfg, rngs=nnx.Rngs(0))
  monkeypatch.setattr(GPT, "__call__", chex.assert_max_traces(GPT.__call__, n=2))
  kw = dict(max_new_tokens=7, temperature=0.8, top_k=5)
  for i in range(3):
    prompt = jax.random.randint(jax.random.key(i), (2, 4), 0, 96)
    out = generate(model, prompt, rng=jax.random.key(10 + i), **kw)
    chex.assert_shape(out, (2, 11))
  # A new Python temperature compiles a new function: the forward is traced again.
  with pytest.raises(AssertionError, match=RETRACED):
    generate(model, prompt, rng=jax.random.key(0), **{**kw, "temperature": 0.5})
