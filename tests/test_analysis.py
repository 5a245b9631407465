"""Value kernels and mixer matrices: RoPE's Kronecker vs RoVE's block Toeplitz."""

import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import analysis
from tests.reference import angles_for, dense_rotation


def test_value_kernel_is_rotated_projection(rng):
  D, C = 8, 5
  w_v = rng.standard_normal((D, C)).astype(np.float32)
  inv = rj.rope_frequencies(8, base=100.0)
  np.testing.assert_allclose(analysis.value_kernel(0, w_v, inv), w_v, atol=1e-6)
  for delta in (-3, 1, 17):
    r = dense_rotation(angles_for(delta, inv), D)
    np.testing.assert_allclose(analysis.value_kernel(delta, w_v, inv), r @ w_v, atol=1e-5)
  batch = analysis.value_kernel(jnp.array([2.0, 5.0]), w_v, inv)
  # psi_{a+b} = R_a psi_b: the kernels form a one-parameter group acting on w_v.
  r2 = dense_rotation(angles_for(2, inv), D)
  np.testing.assert_allclose(r2 @ batch[1], analysis.value_kernel(7, w_v, inv), atol=1e-5)


def _head_weights(q, k, q_pos, kv_pos, inv):
  """Causal RoPE attention weights A [T, S] of a single head, computed in float64."""
  D = q.shape[-1]
  rq = np.stack([dense_rotation(angles_for(p, inv), D) @ x for p, x in zip(q_pos, q)])
  rk = np.stack([dense_rotation(angles_for(p, inv), D) @ x for p, x in zip(kv_pos, k)])
  logits = rq @ rk.T / np.sqrt(D)
  logits = np.where(kv_pos[None, :] <= q_pos[:, None], logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("rove", [False, True])
def test_mixer_matrix_reproduces_the_attention_layer(rove, rng):
  T, D, C = 6, 8, 5
  inv = rj.rope_frequencies(8, base=100.0)
  x = rng.standard_normal((T, C)).astype(np.float32)
  w_v = rng.standard_normal((D, C)).astype(np.float32)
  q = rng.standard_normal((T, D)).astype(np.float32)
  k = rng.standard_normal((T, D)).astype(np.float32)
  pos = np.arange(T) * 2 + 3
  a = _head_weights(q, k, pos, pos, np.asarray(inv))
  m = np.asarray(analysis.mixer_matrix(a, w_v, pos, pos, inv, rove=rove))
  assert m.shape == (T * D, T * C)
  y_mixer = (m @ x.reshape(-1)).reshape(T, D)
  attn = rj.rove_attention if rove else rj.rope_attention
  y_attn = attn(q[None, :, None], k[None, :, None], (x @ w_v.T)[None, :, None],
                q_positions=pos[None], kv_positions=pos[None], inv_freq=inv)
  np.testing.assert_allclose(y_mixer, np.asarray(y_attn)[0, :, 0], atol=1e-4)
  if not rove:
    np.testing.assert_allclose(m, np.kron(a, w_v), atol=1e-6)


def test_rove_mixer_is_block_toeplitz_up_to_weights(rng):
  T, D, C = 5, 6, 3
  inv = rj.rope_frequencies(6, base=10.0)
  w_v = rng.standard_normal((D, C)).astype(np.float32)
  ones = np.ones((T, T), np.float32)
  pos = np.arange(T)
  m = np.asarray(analysis.mixer_matrix(ones, w_v, pos, pos, inv, rove=True))
  block = lambda i, j: m[i * D:(i + 1) * D, j * C:(j + 1) * C]
  for i in range(T - 1):
    for j in range(T - 1):
      np.testing.assert_allclose(block(i + 1, j + 1), block(i, j), atol=1e-5)
  assert np.abs(block(0, 1) - block(0, 2)).max() > 1e-2  # not the trivial Kronecker structure
  rope = np.asarray(analysis.mixer_matrix(ones, w_v, pos, pos, inv, rove=False))
  np.testing.assert_allclose(rope[:D, C:2 * C], w_v, atol=1e-6)
