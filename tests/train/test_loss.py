"""The training loss from bfloat16 logits (rove_jax.train.loss) and the MLP's GELU with its
hand-written backward pass (rove_jax.nn.model.bias_gelu), against float64 and autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.nn.model import bias_gelu
from rove_jax.train import loss as loss_lib


def float64_nll(logits, targets):
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, targets[..., None], -1)[..., 0], np.exp(logp)


@pytest.fixture
def batch(rng):
  # GPT-2-like logits: a spread of a few units over a vocabulary of 4096.
  logits = rng.normal(size=(4, 16, 4096)) * 2.5
  targets = rng.integers(0, 4096, size=(4, 16))
  return logits, targets


def test_float32_logits_give_the_float64_loss_and_gradient(batch):
  logits, targets = batch
  nll, p = float64_nll(logits, targets)
  x = jnp.asarray(logits, jnp.float32)
  loss, grad = jax.value_and_grad(lambda x: loss_lib.cross_entropy(x, jnp.asarray(targets))[0])(x)
  np.testing.assert_allclose(float(loss), nll.mean(), rtol=1e-6)
  want = (p - np.eye(4096)[targets]) / targets.size
  np.testing.assert_allclose(np.asarray(grad), want, atol=1e-7)
  assert grad.dtype == jnp.float32


def test_bfloat16_logits_stay_within_the_stated_tolerance(batch):
  """What training computes under bfloat16: the loss of the bf16-rounded logits, in float32.
  Against the float32 loss of the unrounded logits: within 2e-3 nats (the rounding of a logit
  is at most 2^-9 of it); the gradient comes out in bfloat16, within 1e-4 of float32's (per
  element, for a mean over 64 tokens)."""
  logits, targets = batch
  t = jnp.asarray(targets)
  f32 = jax.value_and_grad(lambda x: loss_lib.cross_entropy(x, t)[0])
  loss32, grad32 = f32(jnp.asarray(logits, jnp.float32))
  loss16, grad16 = f32(jnp.asarray(logits, jnp.bfloat16))
  assert loss16.dtype == jnp.float32 and grad16.dtype == jnp.bfloat16
  assert abs(float(loss16) - float(loss32)) < 2e-3
  np.testing.assert_allclose(np.asarray(grad16, np.float32), np.asarray(grad32), atol=1e-4)
  # ... and exactly the float32 loss of the rounded logits: nothing else is rounded.
  rounded = np.asarray(jnp.asarray(logits, jnp.bfloat16), np.float64)
  np.testing.assert_allclose(float(loss16), float64_nll(rounded, targets)[0].mean(), rtol=1e-6)


def test_masked_loss_and_count(batch, rng):
  logits, targets = batch
  mask = rng.random(targets.shape) < 0.5
  nll, _ = float64_nll(logits, targets)
  loss, count = loss_lib.cross_entropy(
    jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(mask)
  )
  np.testing.assert_allclose(float(loss), (nll * mask).sum() / mask.sum(), rtol=1e-6)
  assert float(count) == mask.sum()


@pytest.mark.parametrize("dtype, atol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
def test_bias_gelu_matches_autodiff_of_the_tanh_gelu(dtype, atol, rng):
  h = jnp.asarray(rng.normal(size=(2, 8, 64)) * 2, dtype)
  b = jnp.asarray(rng.normal(size=64), jnp.float32)
  g = jnp.asarray(rng.normal(size=(2, 8, 64)), dtype)

  def ref(h, b):
    u = h.astype(jnp.float32) + b[None, None]
    return jax.nn.gelu(u, approximate=True).astype(dtype)

  out, vjp = jax.vjp(bias_gelu, h, b)
  want, vjp_ref = jax.vjp(ref, h, b)
  assert out.dtype == dtype
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), atol=atol)
  for a, w in zip(vjp(g), vjp_ref(g)):
    assert a.dtype == w.dtype
    scale = float(jnp.max(jnp.abs(w.astype(jnp.float32))))
    np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(w, np.float32), atol=atol * scale
    )
