"""A `rj.Rope` stored in a user's Flax NNX module, as docs/api.md shows it: refused bare by NNX
(the error the page quotes), accepted in `nnx.data`, where it is data, not a parameter, and the
attention through it equals the same call outside the module, with jit and without."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rove_jax as rj


class Holder(nnx.Module):
  def __init__(self, rope):
    self.rope = rope


def test_a_bare_rope_is_refused_with_the_error_the_docs_quote():
  refused = r"Found data on value of type .*rotary\.Rope.* assigned to static attribute 'rope'"
  with pytest.raises(ValueError, match=refused):
    Holder(rj.Rope(rj.rope_frequencies(8)))


@pytest.mark.parametrize("jit", [False, True])
def test_a_rope_in_nnx_data_is_data_and_rotates_as_outside(jit):
  rope = rj.Rope(rj.rope_frequencies(8, base=100.0), attention_factor=1.5)
  m = Holder(nnx.data(rope))
  assert isinstance(m.rope, rj.Rope) and not nnx.state(m, nnx.Param)
  q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 6, 2, 8))
  pos = jnp.arange(6)[None]

  def call(module, q, k, v):
    return rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=module.rope)

  got = (nnx.jit(call) if jit else call)(m, q, k, v)
  want = rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=rope)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
