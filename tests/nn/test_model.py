"""The NNX GPT: presets, causality, cache == full forward, packing, encodings, YaRN, decoding."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rove_jax import analysis, scaling
from rove_jax.nn import decoding, model_config
from rove_jax.nn import model as M
from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.train import program
from tests import reference as ref
from tests.conftest import gpt_config

ALL = M.POS_ENCODINGS


def small(pos_encoding="rove", **kw):
  return gpt_config(
    **{**dict(vocab_size=64, n_layer=2, n_head=4, pos_encoding=pos_encoding, rope_base=100.0), **kw}
  )


def make(cfg, seed=0):
  return GPT(cfg, rngs=nnx.Rngs(seed))


def transplant(src: GPT, cfg: GPTConfig) -> GPT:
  """The same parameters under another config (same parameter shapes)."""
  return M.build(cfg, nnx.state(src))


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


@pytest.mark.parametrize("pe", ["rove", "learned", "t5_bias"])
def test_the_abstract_model_is_the_real_one_without_arrays(pe):
  """abstract_model, abstract_params, graphdef and build: the real model's graph, parameter
  names, shapes and dtypes, nothing allocated; the model built from its parameters computes the
  same logits, bit for bit."""
  cfg = small(pe, tie_embeddings=False, param_dtype="bfloat16")
  real = make(cfg, seed=3)
  want = nnx.state(real, nnx.Param)
  got = M.abstract_params(cfg)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (b.shape, b.dtype)
  assert M.graphdef(cfg) == nnx.graphdef(real)
  assert M.count_params(M.abstract_model(cfg)) == M.param_count(cfg) == M.count_params(real)
  x = tokens(2, 16)
  np.testing.assert_array_equal(M.build(cfg, want)(x), real(x))


def test_the_vocabulary_is_padded_to_a_multiple_of_64():
  assert model_config.VOCAB_MULTIPLE == 64
  got = [model_config.padded_vocab_size(n) for n in (1, 64, 65, 257, 50257)]
  assert got == [64, 64, 128, 320, 50304]


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
  grad = jax.jit(
    jax.grad(  # one compile for every t: eager gradients are slow
      lambda x, t: jnp.sum(jnp.take(m.forward_embeddings(x, pos), t, axis=1) ** 2)
    )
  )
  for t in (0, 3, 7):
    g = grad(x, t)
    per_pos = np.abs(np.asarray(g)).sum(axis=(0, 2))
    assert np.all(per_pos[t + 1 :] == 0), (t, per_pos)
    assert np.all(per_pos[: t + 1] > 0), (t, per_pos)


@pytest.mark.parametrize("pe", ALL)
def test_cached_decoding_equals_full_forward(pe):
  cfg = small(pe, n_kv_head=2)  # GQA too
  m = make(cfg)
  toks = tokens(2, 24)
  full = jax.jit(lambda t: m(t))(toks)  # jitted: one program, not op by op
  cache = m.init_cache(2, 28)
  step = jax.jit(lambda t, c: m(t, cache=c))
  logits, cache = step(toks[:, :8], cache)  # a prompt, then 16 one-token steps
  outs = [logits]
  for t in range(8, 24):
    logits, cache = step(toks[:, t : t + 1], cache)
    outs.append(logits)
  np.testing.assert_allclose(jnp.concatenate(outs, axis=1), full, atol=2e-5)
  assert int(cache.length) == 24


def _cached_logits(m, toks, prompt=4, **kw):
  """Logits of a prompt, then of one-token decoding steps against the KV cache."""
  cache = m.init_cache(toks.shape[0], toks.shape[1])
  step = jax.jit(lambda t, c: m(t, cache=c, **kw))  # one compile a shape, not op by op
  logits, cache = step(toks[:, :prompt], cache)
  outs = [logits]
  for t in range(prompt, toks.shape[1]):
    logits, cache = step(toks[:, t : t + 1], cache)
    outs.append(logits)
  return jnp.concatenate(outs, axis=1)


@pytest.mark.parametrize("pe", ["rove", "rope"])
def test_cached_decoding_bf16_close(pe):
  m32 = make(small(pe))
  m16 = transplant(m32, small(pe, dtype="bfloat16"))
  assert m16.blocks[0].attn.wqkv[...].dtype == jnp.float32  # float32 master weights
  toks = tokens(1, 20)
  full = jax.jit(lambda t: m32(t))(toks)
  inc = _cached_logits(m16, toks)
  chex.assert_type(inc, jnp.float32)
  chex.assert_shape(inc, full.shape)
  # Measured at this size: bf16 decoding is within 2.3e-3 of the float32 forward, while RoVE
  # and RoPE logits differ by 8.9e-2. 1e-2 sits between them, so a cache that decodes with the
  # other encoding (e.g. values stored unrotated) fails, as the last assertion shows.
  tol = 1e-2
  chex.assert_trees_all_close(inc, full, atol=tol, rtol=0)
  other = transplant(m32, small("rope" if pe == "rove" else "rove", dtype="bfloat16"))
  assert float(jnp.abs(_cached_logits(other, toks) - full).max()) > 4 * tol


@pytest.mark.parametrize("pe", ALL)
def test_packing_equals_separate_documents(pe):
  m = make(small(pe))
  a, b = tokens(1, 7, seed=2), tokens(1, 9, seed=3)
  packed = jnp.concatenate([a, b], axis=1)
  seg = jnp.array([[0] * 7 + [1] * 9])
  pos = jnp.array([list(range(7)) + list(range(9))])
  f = jax.jit(lambda t, **kw: m(t, **kw))  # compiled once a shape: eager dispatch is slow
  out = f(packed, positions=pos, segment_ids=seg)
  np.testing.assert_allclose(out[:, :7], f(a), atol=2e-5)
  np.testing.assert_allclose(out[:, 7:], f(b), atol=2e-5)


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
  assert first_only.blocks[0].attn.rotary == "rove" and first_only.blocks[1].attn.rotary == "rope"
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
  # a call's override: None keeps the config's, RopeScaling() is plain RoPE, a RopeScaling
  # and its dict are the same setting
  np.testing.assert_array_equal(configured(long, rope_scaling=None), configured(long))
  np.testing.assert_array_equal(configured(long, rope_scaling=scaling.RopeScaling()), m(long))
  np.testing.assert_array_equal(
    m(long, rope_scaling=scaling.RopeScaling.from_dict(yarn3)), m(long, rope_scaling=yarn3)
  )
  with pytest.raises(ValueError, match=r"unknown keys \['facter'\]"):
    m(long, rope_scaling={"rope_type": "yarn", "facter": 3.0})


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


@pytest.mark.slow
def test_remat_and_chunked_give_the_same_loss_and_grads():
  cfg = small("rove")
  m = make(cfg)
  toks = tokens(2, 16)

  def loss(model):
    logits = model(toks[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), toks[:, 1:, None], -1))

  grad = nnx.jit(nnx.value_and_grad(loss))  # one program a variant, not op by op
  ref_l, ref_g = grad(m)
  for variant in (
    dict(remat="full"),
    dict(remat="dots"),
    dict(attention_impl="chunked", attention_chunk=4),
  ):
    other = transplant(m, dataclasses.replace(cfg, **variant))
    l, g = grad(other)
    np.testing.assert_allclose(l, ref_l, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref_g)):
      np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
  "kw, msg",
  [
    (dict(d_model=30, n_head=4), "divisible by n_head"),
    (dict(n_head=4, n_kv_head=3), "multiple of n_kv_head"),
    (dict(rotary_fraction=0.3), "positive even integer"),
    (dict(pos_encoding="alibi"), "unknown pos_encoding 'alibi'"),
    (dict(norm="batchnorm"), "unknown norm"),
    (dict(rope_scaling={"rope_type": "yarn", "facter": 2}), "unknown keys"),
    (dict(pos_encoding="rope", rove_layers=(0,)), "needs pos_encoding='rove'"),
    (dict(rove_layers=(5,)), "out of range"),
  ],
)
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


# ------------------------------------------------- parameters: fused layout, init, decay, axes


def test_fused_projections_hold_the_unfused_init_values():
  """q, k, v are drawn in that order right after the embedding and stacked: the values the
  separate wq, wk, wv had, so training runs the same numbers."""
  for kv_heads in (4, 2):
    cfg = small("rove", n_kv_head=kv_heads)
    m = make(cfg, seed=3)
    rngs = nnx.Rngs(3)
    draw = lambda shape: jax.random.normal(rngs.params(), shape) * cfg.init_std
    embed = draw((64, 32))
    q, k, v = draw((32, 4, 8)), draw((32, kv_heads, 8)), draw((32, kv_heads, 8))
    attn = m.blocks[0].attn
    chex.assert_trees_all_equal(m.embed[...], embed)
    if kv_heads == 4:
      chex.assert_trees_all_equal(attn.wqkv[...], jnp.stack([q, k, v], axis=1))
      assert attn.wqkv.get_metadata()["logical_axes"] == ("embed", None, "heads", "head_dim")
      chex.assert_shape(attn.bqkv[...], (3, 4, 8))
    else:
      chex.assert_trees_all_equal(attn.wq[...], q)
      chex.assert_trees_all_equal(attn.wkv[...], jnp.stack([k, v], axis=1))
      assert attn.wkv.get_metadata()["logical_axes"] == ("embed", None, "kv_heads", "head_dim")
      chex.assert_shape([attn.bq[...], attn.bkv[...]], [(4, 8), (2, 2, 8)])
    chex.assert_trees_all_equal(attn.wo[...], draw((4, 8, 32)) / np.sqrt(2 * 2))
    w_v, b_v = attn.value_projection()
    chex.assert_trees_all_equal(w_v, v)
    chex.assert_shape(b_v, (kv_heads, 8))


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_weight_decay_reaches_every_attention_matrix(kv_heads):
  m = make(small("rove", n_kv_head=kv_heads))
  mask = nnx.to_pure_dict(program.decay_mask(nnx.state(m, nnx.Param)))["blocks"][0]["attn"]
  assert {name for name, decayed in mask.items() if decayed} == (
    {"wqkv", "wo"} if kv_heads == 4 else {"wq", "wkv", "wo"}
  )


# ------------------------------------------------------------ against a float64 reference

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


def randomized(cfg, seed=0, scale=0.3):
  """A model whose every parameter is random (biases and norm gains too: zero biases and unit
  gains would hide bugs on their paths), large enough that attention is far from uniform."""
  m = make(cfg, seed)
  leaves, treedef = jax.tree.flatten(nnx.state(m, nnx.Param))
  keys = jax.random.split(jax.random.key(seed + 100), len(leaves))
  nnx.update(
    m,
    jax.tree.unflatten(
      treedef,
      [x + scale * jax.random.normal(key, x.shape, x.dtype) for x, key in zip(leaves, keys)],
    ),
  )
  return m


def reference_logits(m, toks, **kw):
  """The float64 reference on the model's parameters; frequencies base^(-2m/rot_dim) by hand."""
  cfg = m.config
  inv = (
    float(cfg.rope_base) ** -(np.arange(0, cfg.rot_dim, 2) / cfg.rot_dim) if cfg.rot_dim else None
  )
  kw = {"inv_freq": inv, **kw}
  return ref.naive_gpt(nnx.to_pure_dict(nnx.state(m, nnx.Param)), cfg, np.asarray(toks), **kw)


CASES = {
  "rove": dict(),
  "rope": dict(pos_encoding="rope"),
  "half": dict(rope_layout="half"),
  "swiglu": dict(mlp="swiglu"),
  "rmsnorm": dict(norm="rmsnorm"),
  "no_bias": dict(use_bias=False),
  "partial_interleaved": dict(rotary_fraction=0.5),
  "partial_half": dict(rotary_fraction=0.5, rope_layout="half"),
  "gqa": dict(n_kv_head=2),
  "rove_layers": dict(rove_layers=(1,)),
  "untied": dict(tie_embeddings=False),
  "nope": dict(pos_encoding="nope"),
  "t5_bias": dict(pos_encoding="t5_bias", t5_num_buckets=8, t5_max_distance=16),
  "sinusoidal": dict(pos_encoding="sinusoidal"),
  "learned": dict(pos_encoding="learned"),
}
TOL = dict(atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_a_float64_reference(case):
  m = randomized(small(**CASES[case]))
  toks = tokens(2, 12)
  logits = m(toks)
  chex.assert_shape(logits, (2, 12, 64))
  chex.assert_trees_all_close(logits, reference_logits(m, toks), **TOL)


def test_reference_comparison_tells_rove_from_rope():
  """The tolerance above is far below what swapping the encodings changes."""
  rove = randomized(small("rove"))
  rope = transplant(rove, small("rope"))
  toks = tokens(2, 12)
  gap = float(np.abs(np.asarray(rove(toks)) - reference_logits(rope, toks)).max())
  assert gap > 100 * TOL["atol"]


def test_yarn_attention_factor_through_the_gpt():
  m = randomized(small("rove", max_len=8, rope_scaling=YARN))
  toks = tokens(1, 16)
  inv, _ = scaling.yarn(m.config.rot_dim, base=100.0, factor=4.0, original_max_len=8)
  factor = 0.1 * np.log(4.0) + 1  # YaRN's attention temperature, by hand
  logits = m(toks)
  chex.assert_trees_all_close(logits, reference_logits(m, toks, inv_freq=inv, factor=factor), **TOL)
  without = reference_logits(m, toks, inv_freq=inv, factor=1.0)
  assert float(np.abs(np.asarray(logits) - without).max()) > 100 * TOL["atol"]
  plain = transplant(m, small("rove", max_len=8))  # the same scaling as a call override
  chex.assert_trees_all_close(plain(toks, rope_scaling=YARN), logits, atol=1e-6, rtol=0)


@pytest.mark.parametrize("pe", ["rove", "rope"])
def test_cached_decoding_under_yarn_equals_full_forward(pe):
  m = randomized(small(pe, max_len=8, rope_scaling=YARN))
  toks = tokens(2, 20)
  full = jax.jit(lambda t: m(t))(toks)
  chex.assert_trees_all_close(_cached_logits(m, toks), full, atol=1e-4, rtol=1e-5)
  plain = transplant(m, small(pe, max_len=8))
  chex.assert_trees_all_close(
    _cached_logits(plain, toks, rope_scaling=YARN), full, atol=1e-4, rtol=1e-5
  )
  assert float(np.abs(_cached_logits(plain, toks) - full).max()) > 1e-2  # scaling matters


# The plain call generates past max_len without scaling, which warns (tests/nn/
# test_decoding_length.py checks that warning); here it is only the comparison's baseline.
@pytest.mark.filterwarnings("ignore:generate:UserWarning")
def test_generate_with_rope_scaling_follows_the_scaled_forward():
  m = randomized(small("rove", max_len=8))
  prompt = tokens(2, 6)
  out = M.generate(m, prompt, 14, temperature=0.0, rope_scaling=YARN)
  chex.assert_shape(out, (2, 20))
  scaled = m(out[:, :-1], rope_scaling=YARN)  # teacher-forced: each token is the argmax
  np.testing.assert_array_equal(out[:, 6:], jnp.argmax(scaled[:, 5:], axis=-1))
  plain = M.generate(m, prompt, 14, temperature=0.0)
  assert np.any(np.asarray(plain) != np.asarray(out))  # the override changed the continuation
  hits = decoding._generate_fn.cache_info().hits
  typed = M.generate(
    m, prompt, 14, temperature=0.0, rope_scaling=scaling.RopeScaling.from_dict(YARN)
  )
  np.testing.assert_array_equal(typed, out)
  assert decoding._generate_fn.cache_info().hits == hits + 1  # the dict's program, reused
  with pytest.raises(ValueError, match="rope_scaling must be a dict"):
    M.generate(m, prompt, 2, temperature=0.0, rope_scaling=[("rope_type", "yarn")])
  with pytest.raises(ValueError, match=r"rope_scaling\['factor'\] must be a number"):
    M.generate(
      m, prompt, 2, temperature=0.0, rope_scaling={"rope_type": "yarn", "factor": {"x": 2}}
    )


def test_generate_with_remat_config():
  m = make(small("rove"))
  prompt = tokens(1, 4)
  remat = transplant(m, small("rove", remat="full"))
  chex.assert_trees_all_equal(
    M.generate(remat, prompt, 5, temperature=0.0), M.generate(m, prompt, 5, temperature=0.0)
  )


# ----------------------------------------------------------------------------- Figure 1


@pytest.mark.parametrize(
  "pe, kw",
  [
    ("rove", {}),
    ("rope", {}),
    ("rove", dict(rope_layout="half")),
    ("rove", dict(rope_layout="half", rotary_fraction=0.5)),
    ("rove", dict(max_len=8, rope_scaling=YARN)),
    ("rope", dict(max_len=8, rope_scaling=YARN)),
    ("rove", dict(max_len=8, rope_scaling=YARN, rotary_fraction=0.5)),  # factor on rotated dims
  ],
)
def test_figure1_mixer_reproduces_the_layer_output(pe, kw):
  """Figure 1's mixers, applied to the layer's input and projected out, give the attention
  layer's real output (the one matching the encoding; the other does not)."""
  m = randomized(small(pe, use_bias=False, **kw))
  toks = np.asarray(tokens(1, 10))[0]
  layer, T, D, E = 1, 10, 8, 32
  views = [analysis.layer_attention(m, toks, layer=layer, head=h) for h in range(4)]
  x_TE = views[0]["x"]
  attn = m.blocks[layer].attn
  real_TE = attn(jnp.asarray(x_TE)[None], m.context(jnp.arange(T)[None]))[0][0]
  wo_HDE = np.asarray(attn.wo[...])
  mixed = {}
  for kind in ("rope", "rove"):
    heads = [(analysis.figure1_mixers(v)[kind] @ x_TE.ravel()).reshape(T, D) for v in views]
    mixed[kind] = sum(y_TD @ wo_HDE[h] for h, y_TD in enumerate(heads))
  other = "rope" if pe == "rove" else "rove"
  chex.assert_trees_all_close(mixed[pe], real_TE, atol=1e-4, rtol=1e-4)
  assert float(np.abs(mixed[other] - real_TE).max()) > 1e-2
  # The drawn part: whole rotary pairs in the model's layout and the first features, exactly
  # the rows and columns of the full mixer.
  full = analysis.figure1_mixers(views[0])
  part = analysis.figure1_mixers(views[0], pairs=2, features=5)
  P = m.config.rot_dim // 2
  dims = [0, 1, 2, 3] if m.config.rope_layout == "interleaved" else [0, 1, P, P + 1]
  np.testing.assert_array_equal(part["dims"], dims)
  rows = (np.arange(T)[:, None] * D + np.asarray(dims)[None]).ravel()
  cols = (np.arange(T)[:, None] * E + np.arange(5)[None]).ravel()
  for kind in ("rope", "rove"):
    chex.assert_trees_all_close(part[kind], full[kind][np.ix_(rows, cols)], atol=1e-6, rtol=0)


@pytest.mark.parametrize("offset, atol", [(0.0, 2e-6), (2.0, 1e-5), (10.0, 2e-4)])
def test_layernorm_in_one_pass_matches_the_two_pass_formula(offset, atol):
  """The variance as E[x^2] - E[x]^2 (one pass over a row) against E[(x - E[x])^2] in float64,
  for rows of standard deviation 0.5 to 2 whose mean is up to 10: the cancellation costs about
  (mean / std)^2 ulp of the variance, below 1e-4 of a unit output at a mean of 20 std."""
  from rove_jax.nn.layers import Norm

  norm = Norm(256, gpt_config(d_model=256))
  x = offset + jax.random.normal(jax.random.key(0), (8, 256)) * jnp.linspace(0.5, 2, 8)[:, None]
  x64 = np.asarray(x, np.float64)
  centred = x64 - x64.mean(-1, keepdims=True)
  want = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + norm.eps)
  np.testing.assert_allclose(norm(x), want, atol=atol, rtol=0)


@pytest.mark.parametrize("pe", ["rove", "rope"])
def test_a_rotating_kernel_reads_q_k_v_from_the_fused_projection(pe, monkeypatch):
  """With the fused q, k, v projection (K = H) the layer hands a kernel that rotates inside the
  projection's [B, T, 3, H, D] output (KernelCall.qkv_BT3HD, which the Hopper kernel reads in
  place) beside its three slices; the logits are the float64 reference's."""
  from rove_jax import attention, kernels

  seen = []

  def attend(call):  # rotates inside: the call's q, k, v are the unrotated slices
    seen.append(call.qkv_BT3HD)
    stacked = jnp.stack([call.q_BTHD, call.k_BSKD, call.v_BSKD], axis=2)
    assert call.qkv_BT3HD is not None and bool(jnp.all(call.qkv_BT3HD == stacked))
    fn = {"rope": attention.rope_attention, "rove": attention.rove_attention}[call.kind]
    pos = dict(q_positions=call.q_pos_BT, kv_positions=call.kv_pos_BS)
    return fn(*stacked.transpose(2, 0, 1, 3, 4), **pos, rope=call.rope, mask=call.mask, kernel=xla)

  xla = kernels.Kernel("xla", kernels.xla.attend)  # not through select, patched below
  probe = kernels.Kernel("probe", attend, rotates=True)
  monkeypatch.setattr(kernels, "select", lambda *a, **kw: probe)
  m = randomized(small(pe))
  toks = tokens(2, 12)
  chex.assert_trees_all_close(m(toks), reference_logits(m, toks), **TOL)
  assert len(seen) == m.config.n_layer


@pytest.mark.parametrize(
  "pe,over",
  [("rove", {}), ("rope", {"n_kv_head": 2, "rotary_fraction": 0.5, "use_bias": True})],
)
def test_a_kernel_cheaper_in_the_half_layout_gets_the_model_in_it(pe, over, monkeypatch):
  """A rotating kernel whose half-layout rotation is cheaper (kernels.Kernel.half_pairs: the
  Hopper fused kernel) gets the interleaved model's rotary as the half layout, the head dims
  renamed through the projections' weights (rotary.half_order): the logits are still the
  float64 reference's of the interleaved model. Fused q, k, v (RoVE; the buffer handed on) and
  GQA with partial rotary and biases (RoPE; q, k, v apart)."""
  from rove_jax import attention, kernels

  layouts = []

  def attend(call):
    layouts.append((call.rope.layout, call.qkv_BT3HD is not None))
    fn = {"rope": attention.rope_attention, "rove": attention.rove_attention}[call.kind]
    pos = dict(q_positions=call.q_pos_BT, kv_positions=call.kv_pos_BS)
    qkv = (call.q_BTHD, call.k_BSKD, call.v_BSKD)
    return fn(*qkv, **pos, rope=call.rope, mask=call.mask, kernel=xla)

  xla = kernels.Kernel("xla", kernels.xla.attend)  # not through select, patched below
  probe = kernels.Kernel("probe", attend, rotates=True, half_pairs=True)
  monkeypatch.setattr(kernels, "select", lambda *a, **kw: probe)
  m = randomized(small(pe, **over))
  assert m.config.rope_layout == "interleaved"
  toks = tokens(2, 12)
  chex.assert_trees_all_close(m(toks), reference_logits(m, toks), **TOL)
  assert layouts == [("half", not over)] * m.config.n_layer
