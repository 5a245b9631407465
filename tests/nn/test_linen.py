"""The Linen module: an existing Linen block switches to RoVE by swapping its attention module."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import rove_jax as rj
from rove_jax import scaling
from rove_jax.nn.linen import RotarySelfAttention


class Block(nn.Module):
  """A pre-norm transformer block as a Linen codebase would have it, attention injected."""

  attention: nn.Module

  @nn.compact
  def __call__(self, x):
    x = x + self.attention(nn.LayerNorm()(x))
    h = nn.gelu(nn.Dense(4 * x.shape[-1])(nn.LayerNorm()(x)))
    return x + nn.Dense(x.shape[-1])(h)


def _x(B=2, T=10, E=32):
  return jax.random.normal(jax.random.key(0), (B, T, E))


def test_swap_keeps_parameters_and_reduces_to_the_original_at_zero_frequency():
  x = _x()
  baseline = Block(attention=nn.MultiHeadDotProductAttention(num_heads=4, deterministic=True))
  params = baseline.init(jax.random.key(1), x)
  rove = Block(attention=RotarySelfAttention(num_heads=4, pos_encoding="rove", causal=False))
  rove_params = rove.init(jax.random.key(1), x)
  # Same parameter tree: a checkpoint of the Linen model loads into the RoVE version as is.
  chex.assert_trees_all_equal_structs(params, rove_params)
  chex.assert_trees_all_equal_shapes_and_dtypes(params, rove_params)
  y_base = baseline.apply(params, x)
  y_rove = rove.apply(params, x)
  chex.assert_equal_shape([y_base, y_rove, x])
  assert np.abs(y_rove - y_base).max() > 1e-3  # RoVE changes the block...
  frozen = Block(
    attention=RotarySelfAttention(
      num_heads=4,
      pos_encoding="rove",
      causal=False,
      rope_scaling={"rope_type": "linear", "factor": 1e30},
    )
  )
  # ...and with every frequency ~0 it is exactly the original attention.
  chex.assert_trees_all_close(frozen.apply(params, x), y_base, atol=1e-5, rtol=1e-7)
  typed = Block(
    attention=RotarySelfAttention(
      num_heads=4,
      pos_encoding="rove",
      causal=False,
      rope_scaling=scaling.RopeScaling(rope_type="linear", factor=1e30),
    )
  )
  chex.assert_trees_all_equal(typed.apply(params, x), frozen.apply(params, x))


def test_module_equals_the_pure_function_on_its_parameters():
  x = _x()
  mod = RotarySelfAttention(num_heads=4, num_kv_heads=2, pos_encoding="rove", rope_base=100.0)
  params = mod.init(jax.random.key(2), x)["params"]
  y = mod.apply({"params": params}, x)
  chex.assert_shape(y, x.shape)
  proj = lambda name: (
    jnp.einsum("bte,ehd->bthd", x, params[name]["kernel"]) + params[name]["bias"][None, None]
  )
  pos = jnp.broadcast_to(jnp.arange(10)[None], (2, 10))
  out = rj.rove_attention(
    proj("query"),
    proj("key"),
    proj("value"),
    q_positions=pos,
    kv_positions=pos,
    rope=rj.Rope(rj.rope_frequencies(8, base=100.0)),
  )
  want = (
    jnp.einsum("bthd,hde->bte", out, params["out"]["kernel"]) + params["out"]["bias"][None, None]
  )
  chex.assert_trees_all_close(y, want, atol=1e-5, rtol=1e-7)
  # causal: the first output does not depend on later inputs
  x2 = x.at[:, 5:].set(0.0)
  chex.assert_trees_all_close(
    mod.apply({"params": params}, x2)[:, :5], y[:, :5], atol=1e-6, rtol=1e-7
  )
