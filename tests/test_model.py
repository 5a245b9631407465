"""The NNX GPT: presets, causality, cache == full forward, packing, encodings, YaRN, decoding."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rove_jax import model as M
from rove_jax.model import GPT, GPTConfig

ALL = M.POS_ENCODINGS


def small(pos_encoding="rove", **kw):
  base = dict(vocab_size=64, n_layer=2, n_head=4, d_model=32, d_ff=64, max_len=32,
              pos_encoding=pos_encoding, rope_base=100.0)
  return GPTConfig(**{**base, **kw})


def make(cfg, seed=0):
  return GPT(cfg, rngs=nnx.Rngs(seed))


def transplant(src: GPT, cfg: GPTConfig) -> GPT:
  """The same parameters under another config (same parameter shapes)."""
  dst = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(dst)
  return nnx.merge(graphdef, nnx.state(src))


def tokens(B, T, vocab=64, seed=1):
  return jax.random.randint(jax.random.key(seed), (B, T), 0, vocab)


def test_preset_param_counts_without_allocating():
  n124 = M.param_count(GPTConfig.gpt2_124m())
  n354 = M.param_count(GPTConfig.gpt2_354m())
  assert abs(n124 / 124e6 - 1) < 0.01, n124
  assert abs(n354 / 354e6 - 1) < 0.01, n354
  # Hand count for GPT-2 small without position embeddings (RoVE): 50304*768 embeddings, and
  # per layer 4*768^2 + 4*768 (attention) + 2*768*3072 + 3072 + 768 (MLP) + 4*768 (norms).
  per_layer = 4 * 768 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768 + 4 * 768
  assert n124 == 50304 * 768 + 12 * per_layer + 2 * 768
  assert M.param_count(GPTConfig.gpt2_124m(pos_encoding="learned")) == n124 + 1024 * 768
  tiny = M.param_count(GPTConfig.tiny())
  assert 5e6 < tiny < 15e6


def test_every_parameter_has_logical_axes():
  m = make(small("t5_bias", tie_embeddings=False))
  names = {"embed", "vocab", "heads", "kv_heads", "head_dim", "mlp", None}
  for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
    axes = var.get_metadata()["logical_axes"]
    assert len(axes) == var[...].ndim, path
    assert set(axes) <= names, (path, axes)
  wo = m.blocks[0].attn.wo
  assert wo.get_metadata()["logical_axes"] == ("heads", "head_dim", "embed")


@pytest.mark.parametrize("pe", ALL)
def test_causality_by_gradient(pe):
  m = make(small(pe))
  T = 8
  pos = jnp.broadcast_to(jnp.arange(T)[None], (2, T))
  x = m.embed_tokens(tokens(2, T), pos)
  for t in (0, 3, 7):
    g = jax.grad(lambda x: jnp.sum(m.forward_embeddings(x, pos)[:, t] ** 2))(x)
    per_pos = np.abs(np.asarray(g)).sum(axis=(0, 2))
    assert np.all(per_pos[t + 1:] == 0), (t, per_pos)
    assert np.all(per_pos[:t + 1] > 0), (t, per_pos)


@pytest.mark.parametrize("pe", ALL)
def test_cached_decoding_equals_full_forward(pe):
  cfg = small(pe, n_kv_head=2)  # GQA too
  m = make(cfg)
  toks = tokens(2, 24)
  full = m(toks)
  cache = m.init_cache(2, 28)
  logits, cache = m(toks[:, :8], cache=cache)  # a prompt, then 16 one-token steps
  outs = [logits]
  step = jax.jit(lambda t, c: m(t, cache=c))
  for t in range(8, 24):
    logits, cache = step(toks[:, t:t + 1], cache)
    outs.append(logits)
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=2e-5)
  assert int(cache.length) == 24


@pytest.mark.parametrize("pe", ["rove", "rope"])
def test_cached_decoding_bf16_close(pe):
  m32 = make(small(pe))
  m16 = transplant(m32, small(pe, dtype="bfloat16"))
  assert m16.blocks[0].attn.wq[...].dtype == jnp.float32  # float32 master weights
  toks = tokens(1, 20)
  full = m32(toks)
  cache = m16.init_cache(1, 20)
  logits, cache = m16(toks[:, :4], cache=cache)
  outs = [logits]
  for t in range(4, 20):
    logits, cache = m16(toks[:, t:t + 1], cache=cache)
    outs.append(logits)
  inc = jnp.concatenate(outs, axis=1)
  chex.assert_type(inc, jnp.float32)
  np.testing.assert_allclose(inc, full, atol=5e-2)


@pytest.mark.parametrize("pe", ALL)
def test_packing_equals_separate_documents(pe):
  m = make(small(pe))
  a, b = tokens(1, 7, seed=2), tokens(1, 9, seed=3)
  packed = jnp.concatenate([a, b], axis=1)
  seg = jnp.array([[0] * 7 + [1] * 9])
  pos = jnp.array([list(range(7)) + list(range(9))])
  out = m(packed, positions=pos, segment_ids=seg)
  np.testing.assert_allclose(out[:, :7], m(a), atol=2e-5)
  np.testing.assert_allclose(out[:, 7:], m(b), atol=2e-5)


def test_rove_and_rope_differ_and_zero_frequencies_equal_nope():
  rove = make(small("rove"))
  rope = transplant(rove, small("rope"))
  nope = transplant(rove, small("nope"))
  toks = tokens(2, 16)
  assert np.abs(rove(toks) - rope(toks)).max() > 1e-3
  # Linear scaling by 1e30 sends every frequency to ~0: psi_delta == W_V, no rotation at all.
  frozen = {"rope_type": "linear", "factor": 1e30}
  np.testing.assert_allclose(rove(toks, rope_scaling=frozen), nope(toks), atol=1e-5)
  np.testing.assert_allclose(rope(toks, rope_scaling=frozen), nope(toks), atol=1e-5)


def test_rove_layers_subset_is_an_ablation_between_rope_and_rove():
  rove = make(small("rove"))
  first_only = transplant(rove, small("rove", rove_layers=(0,)))
  rope = transplant(rove, small("rope"))
  toks = tokens(1, 12)
  assert first_only.blocks[0].attn.mode == "rove" and first_only.blocks[1].attn.mode == "rope"
  out = first_only(toks)
  assert np.abs(out - rove(toks)).max() > 1e-4 and np.abs(out - rope(toks)).max() > 1e-4


@pytest.mark.parametrize("pe", ["rove", "rope"])
def test_yarn_at_inference(pe):
  m = make(small(pe, max_len=16))
  short, long = tokens(1, 16), tokens(1, 48)
  dyn = {"rope_type": "dynamic_yarn"}  # factor = max(1, len / 16)
  np.testing.assert_array_equal(m(short, rope_scaling=dyn), m(short))
  diff = float(np.abs(m(long, rope_scaling=dyn) - m(long)).max())
  assert diff > 1e-5, diff  # small at init (near-uniform attention), far above float noise
  one = {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 16}
  np.testing.assert_array_equal(m(long, rope_scaling=one), m(long))
  yarn3 = {"rope_type": "yarn", "factor": 3.0, "original_max_position_embeddings": 16}
  np.testing.assert_allclose(m(long, rope_scaling=yarn3), m(long, rope_scaling=dyn), atol=1e-6)
  # the same scaling from the config instead of the call
  configured = transplant(m, small(pe, max_len=16, rope_scaling=yarn3))
  np.testing.assert_allclose(configured(long), m(long, rope_scaling=yarn3), atol=1e-6)


def test_greedy_generation_is_deterministic_and_matches_argmax():
  m = make(small("rove"))
  prompt = tokens(2, 5)
  a = M.generate(m, prompt, 12, temperature=0.0)
  b = M.generate(m, prompt, 12, temperature=0.0)
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a[:, :5], prompt)
  logits = m(a[:, :-1])  # teacher-forced on its own output: each token is the argmax
  np.testing.assert_array_equal(a[:, 5:], jnp.argmax(logits[:, 4:], axis=-1))


def test_sampling_respects_top_k():
  m = make(small("rope"))
  prompt = tokens(4, 3)
  out = M.generate(m, prompt, 10, temperature=1.5, top_k=3, rng=jax.random.key(7))
  logits = np.asarray(m(out[:, :-1]))[:, 2:]
  top3 = np.argsort(-logits, axis=-1)[..., :3]
  assert np.all((top3 == np.asarray(out[:, 3:])[..., None]).any(-1))
  greedy = M.generate(m, prompt, 10, temperature=0.0)
  k1 = M.generate(m, prompt, 10, temperature=1.0, top_k=1, rng=jax.random.key(0))
  np.testing.assert_array_equal(k1, greedy)
  other = M.generate(m, prompt, 10, temperature=1.5, top_k=3, rng=jax.random.key(8))
  assert np.any(np.asarray(other) != np.asarray(out))  # sampling does sample


def test_remat_and_chunked_give_the_same_loss_and_grads():
  cfg = small("rove")
  m = make(cfg)
  toks = tokens(2, 16)

  def loss(model):
    logits = model(toks[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), toks[:, 1:, None], -1))

  ref_l, ref_g = nnx.value_and_grad(loss)(m)
  for variant in (dict(remat="full"), dict(remat="dots"),
                  dict(attention_impl="chunked", attention_chunk=4)):
    other = transplant(m, dataclasses.replace(cfg, **variant))
    l, g = nnx.value_and_grad(loss)(other)
    np.testing.assert_allclose(l, ref_l, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
      np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("kw, msg", [
    (dict(d_model=30, n_head=4), "divisible by n_head"),
    (dict(n_head=4, n_kv_head=3), "multiple of n_kv_head"),
    (dict(rotary_fraction=0.3), "positive even integer"),
    (dict(pos_encoding="alibi"), "unknown pos_encoding 'alibi'"),
    (dict(norm="batchnorm"), "unknown norm"),
    (dict(rope_scaling={"rope_type": "yarn", "facter": 2}), "unknown keys"),
    (dict(pos_encoding="rope", rove_layers=(0,)), "needs pos_encoding='rove'"),
    (dict(rove_layers=(5,)), "out of range"),
])
def test_invalid_configs_raise_before_tracing(kw, msg):
  with pytest.raises(ValueError, match=msg):
    small(**kw)


def test_learned_positions_refuse_lengths_past_max_len():
  m = make(small("learned", max_len=16))
  with pytest.raises(ValueError, match="cover 16 positions"):
    m(tokens(1, 17))
  with pytest.raises(ValueError, match="cover 16 positions"):
    m.init_cache(1, 32)
  with pytest.raises(ValueError, match="got position 20"):
    m(tokens(1, 4), positions=jnp.array([[17, 18, 19, 20]]))
  with pytest.raises(ValueError, match="rotary encodings"):
    m(tokens(1, 4), rope_scaling={"rope_type": "linear", "factor": 2.0})


def test_cache_overflow_is_an_error():
  m = make(small("rove"))
  cache = m.init_cache(1, 6)
  _, cache = m(tokens(1, 4), cache=cache)
  with pytest.raises(ValueError, match="do not fit"):
    m(tokens(1, 3), cache=cache)
