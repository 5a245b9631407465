"""rove_jax.train.clipping against optax's global-norm clipping and a float64 norm."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rove_jax.train import clipping


@pytest.fixture
def tree(rng):
  # Big and small leaves, as a GPT's matrices and biases; one bfloat16.
  return {
    "w": jnp.asarray(rng.normal(size=(64, 96)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(96,)), jnp.float32),
    "ln": {
      "scale": jnp.asarray(rng.normal(size=(64,)), jnp.bfloat16),
      "bias": jnp.asarray(rng.normal(size=(64,)), jnp.float32),
    },
    "e": jnp.asarray(rng.normal(size=(5000,)), jnp.float32),
  }


def test_global_norm_is_the_float64_norm(tree):
  want = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in jax.tree.leaves(tree)))
  np.testing.assert_allclose(float(clipping.global_norm(tree)), want, rtol=1e-6)
  assert float(clipping.global_norm({})) == 0.0


@pytest.mark.parametrize("max_norm", [0.5, 1e6])  # clipped, and left alone
def test_clipping_matches_optax(tree, max_norm):
  ours, theirs = clipping.clip_by_global_norm(max_norm), optax.clip_by_global_norm(max_norm)
  state = ours.init(tree)
  assert jax.tree.structure(state) == jax.tree.structure(theirs.init(tree))
  got, _ = ours.update(tree, state)
  want, _ = theirs.update(tree, theirs.init(tree))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-7
    )
  if max_norm < 1:
    np.testing.assert_allclose(float(clipping.global_norm(got)), max_norm, rtol=1e-2)
