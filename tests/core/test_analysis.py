"""Value kernels and mixer matrices: RoPE's Kronecker vs RoVE's block Toeplitz.

The kernels and mixers run eagerly and under jit (chex variants); weights_TS, w_v, positions and
frequencies are traced arguments under jit."""

import chex
import jax.numpy as jnp
import numpy as np
from absl.testing import parameterized

import rove_jax as rj
from rove_jax import analysis
from tests.reference import angles_for, dense_rotation


def _head_weights(q, k, q_pos, kv_pos, inv):
  """Causal RoPE attention weights A [T, S] of a single head, computed in float64."""
  D = q.shape[-1]
  rq = np.stack([dense_rotation(angles_for(p, inv), D) @ x for p, x in zip(q_pos, q)])
  rk = np.stack([dense_rotation(angles_for(p, inv), D) @ x for p, x in zip(kv_pos, k)])
  logits = rq @ rk.T / np.sqrt(D)
  logits = np.where(kv_pos[None, :] <= q_pos[:, None], logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


class Analysis(chex.TestCase):
  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_value_kernel_is_rotated_projection(self):
    D, E = 8, 5
    w_v = self.rng.standard_normal((D, E)).astype(np.float32)
    inv = rj.rope_frequencies(8, base=100.0)
    kernel = self.variant(analysis.value_kernel)
    chex.assert_trees_all_close(kernel(0, w_v, inv), w_v, atol=1e-6, rtol=1e-7)
    for delta in (-3, 1, 17):
      r = dense_rotation(angles_for(delta, inv), D)
      chex.assert_shape(kernel(delta, w_v, inv), (D, E))
      chex.assert_trees_all_close(kernel(delta, w_v, inv), r @ w_v, atol=1e-5, rtol=1e-7)
    batch = kernel(jnp.array([2.0, 5.0]), w_v, inv)
    chex.assert_shape(batch, (2, D, E))
    # psi_{a+b} = R_a psi_b: the kernels form a one-parameter group acting on w_v.
    r2 = dense_rotation(angles_for(2, inv), D)
    chex.assert_trees_all_close(r2 @ batch[1], kernel(7, w_v, inv), atol=1e-5, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(False, True)
  def test_mixer_matrix_reproduces_the_attention_layer(self, rove):
    T, D, E = 6, 8, 5
    inv = rj.rope_frequencies(8, base=100.0)
    x = self.rng.standard_normal((T, E)).astype(np.float32)
    w_v = self.rng.standard_normal((D, E)).astype(np.float32)
    q = self.rng.standard_normal((T, D)).astype(np.float32)
    k = self.rng.standard_normal((T, D)).astype(np.float32)
    pos = np.arange(T) * 2 + 3
    a = _head_weights(q, k, pos, pos, np.asarray(inv))
    mixer = self.variant(lambda *args: analysis.mixer_matrix(*args, rove=rove))
    m = np.asarray(mixer(a, w_v, pos, pos, inv))
    chex.assert_shape(m, (T * D, T * E))
    y_mixer = (m @ x.reshape(-1)).reshape(T, D)
    attn = rj.rove_attention if rove else rj.rope_attention
    y_attn = attn(
      q[None, :, None],
      k[None, :, None],
      (x @ w_v.T)[None, :, None],
      q_positions=pos[None],
      kv_positions=pos[None],
      rope=rj.Rope(inv),
    )
    chex.assert_trees_all_close(y_mixer, np.asarray(y_attn)[0, :, 0], atol=1e-4, rtol=1e-7)
    if not rove:
      chex.assert_trees_all_close(m, np.kron(a, w_v), atol=1e-6, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rove_mixer_is_block_toeplitz_up_to_weights(self):
    T, D, E = 5, 6, 3
    inv = rj.rope_frequencies(6, base=10.0)
    w_v = self.rng.standard_normal((D, E)).astype(np.float32)
    ones = np.ones((T, T), np.float32)
    pos = np.arange(T)
    mixer = {
      rove: self.variant(lambda *args, rove=rove: analysis.mixer_matrix(*args, rove=rove))
      for rove in (False, True)
    }
    m = np.asarray(mixer[True](ones, w_v, pos, pos, inv))
    block = lambda i, j: m[i * D : (i + 1) * D, j * E : (j + 1) * E]
    for i in range(T - 1):
      for j in range(T - 1):
        chex.assert_trees_all_close(block(i + 1, j + 1), block(i, j), atol=1e-5, rtol=1e-7)
    assert np.abs(block(0, 1) - block(0, 2)).max() > 1e-2  # not the trivial Kronecker structure
    rope = np.asarray(mixer[False](ones, w_v, pos, pos, inv))
    chex.assert_trees_all_close(rope[:D, E : 2 * E], w_v, atol=1e-6, rtol=1e-7)
