"""The public names of `import rove_jax as rj` and the identities between them, in numbers
(tests/test_readme.py runs the README's python examples; test_attention.py tests each function
against float64 references)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj

B, T, H, K, D = 2, 12, 4, 2, 16


def _inputs(seed=0):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  return (
    jax.random.normal(kq, (B, T, H, D)),
    jax.random.normal(kk, (B, T, K, D)),
    jax.random.normal(kv, (B, T, K, D)),
  )


def test_every_public_name_resolves():
  missing = [name for name in rj.__all__ if not hasattr(rj, name)]
  assert not missing, missing
  for name in (
    "linear",
    "ntk",
    "dynamic_ntk",
    "yarn",
    "dynamic_yarn",
    "llama3",
    "longrope",
    "from_config",
    "RopeScaling",
  ):
    assert callable(getattr(rj.scaling, name)), name


def test_rove_is_the_rotated_output_turned_back():
  q, k, v = _inputs()
  pos = jnp.broadcast_to(jnp.arange(T) * 3 + 5, (B, T))
  rope = rj.Rope(rj.rope_frequencies(D))
  kw = dict(q_positions=pos, kv_positions=pos, rope=rope)
  y = rj.rove_attention(q, k, v, **kw)
  o = rj.rove_attention_rotated(q, k, v, **kw)
  np.testing.assert_allclose(y, rj.rotate(o, pos, rope.inv_freq, inverse=True), atol=1e-5)
  assert float(jnp.max(jnp.abs(y - o))) > 1e-2  # the turn back is not the identity here


@pytest.mark.parametrize("fn", [rj.rope_attention, rj.rove_attention])
def test_a_shift_of_every_position_changes_nothing(fn):
  q, k, v = _inputs(1)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  rope = rj.Rope(rj.rope_frequencies(D))
  y0 = fn(q, k, v, q_positions=pos, kv_positions=pos, rope=rope)
  y1 = fn(q, k, v, q_positions=pos + 37, kv_positions=pos + 37, rope=rope)
  np.testing.assert_allclose(y0, y1, atol=2e-5)


def test_rope_without_rotation_is_masked_attention():
  q, k, v = _inputs(2)
  pos = jnp.broadcast_to(jnp.arange(T), (B, T))
  still = rj.Rope(jnp.zeros((D // 2,), jnp.float32))  # every pair turns by angle 0
  mask = rj.Mask(causal=True)
  y = rj.rope_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=still, mask=mask)
  want = rj.masked_attention(q, k, v, q_positions=pos, kv_positions=pos, mask=mask)
  np.testing.assert_allclose(y, want, atol=1e-6)


def test_scaling_function_and_rope_scaling_value_agree():
  inv, factor = rj.scaling.yarn(D, factor=4.0, original_max_len=64)
  setting = rj.scaling.RopeScaling.from_dict(
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
  )
  inv2, factor2 = setting.frequencies(D, base=10000.0, max_len=64, seq_len=256)
  np.testing.assert_array_equal(np.asarray(inv), np.asarray(inv2))
  assert float(factor) == float(factor2) > 1.0
