"""rove_jax.rotary against dense rotation matrices built independently, and RoPE's properties.

The equivalences run eagerly and under jit (chex variants); hand values and errors run once."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import rove_jax as rj
from tests.reference import angles_for, dense_rotation

LAYOUTS = ("interleaved", "half")


def test_rope_frequencies_hand_values():
  chex.assert_trees_all_close(rj.rope_frequencies(8), np.array([1.0, 0.1, 0.01, 0.001]), rtol=1e-7)
  chex.assert_trees_all_close(
    rj.rope_frequencies(6, base=1000.0), np.array([1.0, 0.1, 0.01]), rtol=1e-7
  )
  chex.assert_type(rj.rope_frequencies(8), jnp.float32)


def test_axial_frequencies_split_dims():
  tables = rj.axial_frequencies(16, 2, base=100.0)
  assert len(tables) == 2
  for t in tables:
    chex.assert_shape(t, (4,))
    chex.assert_trees_all_close(t, np.array([1.0, 100**-0.25, 0.1, 100**-0.75]), rtol=1e-6)


def test_rotation_matrix_single_pair_by_hand():
  r = rj.rotation_matrix(2.0, jnp.array([0.5]), 3)
  c, s = np.cos(1.0), np.sin(1.0)
  chex.assert_trees_all_close(r, np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]]), atol=1e-7, rtol=1e-7)


class RotaryEquivalences(chex.TestCase):
  """Each pure function, eager and jitted, against the float64 pair-by-pair construction."""

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*LAYOUTS)
  def test_rotation_matrix_matches_pairwise_construction_and_is_orthogonal(self, layout):
    inv = rj.rope_frequencies(6)
    matrix = self.variant(lambda p: rj.rotation_matrix(p, inv, 8, layout=layout))
    r = np.asarray(matrix(7.0), np.float64)
    chex.assert_shape(r, (8, 8))
    chex.assert_trees_all_close(
      r, dense_rotation(angles_for(7.0, inv), 8, layout), atol=1e-6, rtol=1e-7
    )
    chex.assert_trees_all_close(r @ r.T, np.eye(8), atol=1e-6, rtol=1e-7)
    chex.assert_trees_all_close(np.linalg.det(r), 1.0, atol=1e-6, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(layout=LAYOUTS, rot_dim=(8, 4))  # full and partial rotary on D = 8
  def test_rotate_equals_dense_matrix(self, layout, rot_dim):
    B, T, H, D = 2, 5, 3, 8
    x = self.rng.standard_normal((B, T, H, D)).astype(np.float32)
    pos = self.rng.integers(0, 300, size=(B, T))
    inv = rj.rope_frequencies(rot_dim)
    fwd = self.variant(lambda x, p: rj.rotate(x, p, inv, layout=layout))
    back = self.variant(lambda x, p: rj.rotate(x, p, inv, inverse=True, layout=layout))
    y, y_inv = np.asarray(fwd(x, pos)), np.asarray(back(x, pos))
    chex.assert_shape([y, y_inv], (B, T, H, D))
    for b in range(B):
      for t in range(T):
        r = dense_rotation(angles_for(pos[b, t], inv), D, layout)
        chex.assert_trees_all_close(y[b, t], x[b, t] @ r.T, atol=2e-5, rtol=1e-7)
        chex.assert_trees_all_close(y_inv[b, t], x[b, t] @ r, atol=2e-5, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*LAYOUTS)
  def test_inverse_roundtrip_norms_and_identity_at_zero(self, layout):
    x = self.rng.standard_normal((3, 7, 2, 16)).astype(np.float32)
    pos = self.rng.uniform(-50, 50, size=(3, 7)).astype(np.float32)  # float positions too
    inv = rj.rope_frequencies(12)
    fwd = self.variant(lambda x, p: rj.rotate(x, p, inv, layout=layout))
    back = self.variant(lambda x, p: rj.rotate(x, p, inv, inverse=True, layout=layout))
    y = fwd(x, pos)
    chex.assert_trees_all_close(back(y, pos), x, atol=1e-5, rtol=1e-7)
    chex.assert_trees_all_close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    assert np.abs(np.asarray(y) - x).max() > 0.1  # it did rotate
    chex.assert_trees_all_equal(fwd(x, np.zeros((3, 7), np.int32)), x)

  @chex.variants(with_jit=True, without_jit=True)
  def test_half_layout_is_interleaved_under_permutation(self):
    D, rot = 10, 8
    F = rot // 2
    x = self.rng.standard_normal((2, 4, 3, D)).astype(np.float32)
    pos = self.rng.integers(0, 100, size=(2, 4))
    inv = rj.rope_frequencies(rot)
    # interleaved pair m = (2m, 2m+1) <-> half pair m = (m, m + F); the tail stays put.
    perm = np.concatenate([np.arange(0, rot, 2), np.arange(1, rot, 2), np.arange(rot, D)])
    inter = self.variant(lambda x, p: rj.rotate(x, p, inv, layout="interleaved"))
    half = self.variant(lambda x, p: rj.rotate(x, p, inv, layout="half"))
    y_inter = np.asarray(inter(x, pos))
    y_half = np.asarray(half(x[..., perm], pos))
    chex.assert_trees_all_close(y_half, y_inter[..., perm], atol=1e-6, rtol=1e-7)
    # And against the definition, in float64: half pair m is (x[m], x[m + F]), turned by
    # pos * inv_freq[m]; the tail passes through.
    angle = pos[..., None, None].astype(np.float64) * np.asarray(inv, np.float64)  # [B,T,1,F]
    a, b = x[..., :F].astype(np.float64), x[..., F:rot].astype(np.float64)
    want = np.concatenate(
      [a * np.cos(angle) - b * np.sin(angle), a * np.sin(angle) + b * np.cos(angle), x[..., rot:]],
      axis=-1,
    )
    chex.assert_trees_all_close(np.asarray(half(x, pos)), want, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*LAYOUTS)
  def test_partial_rotary_leaves_tail(self, layout):
    x = self.rng.standard_normal((1, 6, 2, 12)).astype(np.float32)
    rot = self.variant(lambda x, p: rj.rotate(x, p, rj.rope_frequencies(4), layout=layout))
    y = np.asarray(rot(x, np.arange(6)[None] + 3))
    chex.assert_trees_all_equal(y[..., 4:], x[..., 4:])
    assert np.abs(y[..., :4] - x[..., :4]).max() > 0.1

  @chex.variants(with_jit=True, without_jit=True)
  def test_positions_broadcast_over_batch(self):
    x = self.rng.standard_normal((3, 5, 2, 8)).astype(np.float32)
    inv = rj.rope_frequencies(8)
    pos = np.arange(5) + 11
    rot = self.variant(lambda x, p: rj.rotate(x, p, inv))
    chex.assert_trees_all_close(rot(x, pos), rot(x, np.tile(pos, (3, 1))), atol=0, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*LAYOUTS)
  def test_relative_property_1d(self, layout):
    """(R_m q).(R_n k) depends only on n - m, and equals q . R_{n-m} k."""
    D = 16
    inv = rj.rope_frequencies(D)
    q = self.rng.standard_normal((1, 1, 1, D)).astype(np.float32)
    k = self.rng.standard_normal((1, 1, 1, D)).astype(np.float32)
    rot = self.variant(lambda x, p: rj.rotate(x, p, inv, layout=layout))

    def score(m, n):
      return float(jnp.sum(rot(q, np.array([[m]])) * rot(k, np.array([[n]]))))

    for offset in (0, 3, -7, 40):
      values = np.array([score(m, m + offset) for m in (0, 5, 123, 1000)])
      chex.assert_trees_all_close(values, values[0], rtol=1e-4, atol=1e-4)
      direct = q[0, 0, 0] @ (dense_rotation(angles_for(offset, inv), D, layout) @ k[0, 0, 0])
      chex.assert_trees_all_close(values[0], direct, rtol=1e-4, atol=1e-4)
    assert abs(score(0, 3) - score(0, 4)) > 1e-3  # the score does depend on the offset

  @chex.variants(with_jit=True, without_jit=True)
  def test_relative_property_multi_axis(self):
    """2-D RoPE: the score depends on (n - m) per axis, and on each axis separately."""
    D = 16
    tables = rj.axial_frequencies(D, 2)
    q = self.rng.standard_normal((1, 1, 1, D)).astype(np.float32)
    k = self.rng.standard_normal((1, 1, 1, D)).astype(np.float32)
    rot = self.variant(lambda x, p: rj.rotate(x, p, tables))

    def score(m, n):
      rq = rot(q, np.array([[m]], np.float32))
      rk = rot(k, np.array([[n]], np.float32))
      return float(jnp.sum(rq * rk))

    offset = np.array([2.0, -5.0])
    starts = [np.array([0.0, 0.0]), np.array([7.0, 3.0]), np.array([-4.0, 19.0])]
    values = np.array([score(m, m + offset) for m in starts])
    chex.assert_trees_all_close(values, values[0], rtol=1e-4, atol=1e-4)
    swapped = score(np.zeros(2), offset[::-1].copy())
    assert abs(swapped - values[0]) > 1e-3  # the axes are distinguished
    r = dense_rotation(angles_for(offset, tables), D)
    chex.assert_trees_all_close(values[0], q[0, 0, 0] @ r @ k[0, 0, 0], rtol=1e-4, atol=1e-4)

  @chex.variants(with_jit=True, without_jit=True)
  def test_multi_axis_rotate_and_matrix_agree(self):
    tables = rj.axial_frequencies(12, 3)
    x = self.rng.standard_normal((2, 4, 1, 12)).astype(np.float32)
    pos = self.rng.integers(0, 20, size=(2, 4, 3))
    y = np.asarray(self.variant(lambda x, p: rj.rotate(x, p, tables))(x, pos))
    matrix = self.variant(lambda p: rj.rotation_matrix(p, tables, 12))
    for b in range(2):
      for t in range(4):
        r = np.asarray(matrix(pos[b, t]), np.float64)
        chex.assert_trees_all_close(
          r, dense_rotation(angles_for(pos[b, t], tables), 12), atol=1e-6, rtol=1e-7
        )
        chex.assert_trees_all_close(y[b, t], x[b, t] @ r.T, atol=2e-5, rtol=1e-7)


def test_bf16_input_rotates_with_float32_angles(rng):
  x = rng.standard_normal((1, 2, 1, 8)).astype(np.float32)
  pos = np.array([[1001, 2049]])  # not representable in bf16
  inv = rj.rope_frequencies(8)
  y16 = rj.rotate(jnp.asarray(x, jnp.bfloat16), pos, inv)
  chex.assert_type(y16, jnp.bfloat16)
  y32 = rj.rotate(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32), pos, inv)
  chex.assert_trees_all_close(y16.astype(jnp.float32), y32, atol=2e-2, rtol=1e-2)


def test_bad_input_raises_clear_errors(rng):
  x = np.zeros((1, 4, 2, 8), np.float32)
  with pytest.raises(ValueError, match="even"):
    rj.rope_frequencies(7)
  with pytest.raises(ValueError, match="head dimension D is 8"):
    rj.rotate(x, np.arange(4)[None], rj.rope_frequencies(10))
  with pytest.raises(ValueError, match="do not match"):
    rj.rotate(x, np.arange(5)[None], rj.rope_frequencies(8))
  with pytest.raises(ValueError, match="do not match"):
    rj.rotate(x, np.zeros((2, 4)), rj.rope_frequencies(8))
  with pytest.raises(ValueError, match="layout"):
    rj.rotate(x, np.arange(4)[None], rj.rope_frequencies(8), layout="neox")
  with pytest.raises(ValueError, match=r"\[\.\.\., T, 2\]"):
    rj.rotate(x, np.arange(4)[None], rj.axial_frequencies(8, 2))
  with pytest.raises(ValueError, match="split evenly"):
    rj.axial_frequencies(12, 4)


@pytest.mark.parametrize("inverse", [False, True])
def test_the_tpu_pair_swap_equals_the_cpu_one_bitwise(monkeypatch, inverse):
  """The interleaved swap is written two ways (a reshape-reverse on CPU/GPU, pads and a select
  for TPU layouts): both move data only, so R x and its gradient agree bit for bit."""
  import jax

  from rove_jax import rotary

  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(2, 16, 3, 10)), jnp.float32)  # 4 pairs + a 2-wide tail
  inv_freq = rj.rotary.rope_frequencies(8)
  cos, sin = rotary.rotary_tables(jnp.arange(16), inv_freq)
  tables = rotary.expand_tables(cos, sin, 10)
  f = lambda x: rotary.apply_expanded(x, tables, inverse=inverse)
  got = {}
  for name in ("cpu", "tpu"):
    monkeypatch.setattr(rotary.platform, "target_platform", lambda name=name: name)
    got[name] = (f(x), jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))(x))
  for a, b in zip(got["cpu"], got["tpu"]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  rot = np.stack([dense_rotation(t * np.asarray(inv_freq, np.float64), 8) for t in range(16)])
  rot = rot.transpose(0, 2, 1) if inverse else rot  # R^-1 = R^T
  want = np.einsum("tij,bthj->bthi", rot, np.asarray(x, np.float64)[..., :8])
  np.testing.assert_allclose(np.asarray(got["cpu"][0])[..., :8], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_dim,n_rotated", [(8, 8), (12, 8), (64, 48)])
def test_half_order_renames_interleaved_pairs_into_the_half_layout(head_dim, n_rotated):
  """Rotating x's dims gathered in half_order by the half layout is rotating x by the
  interleaved layout, then gathering: the order renames dims, pairs onto pairs, with their
  frequencies; pass-through dims stay last as they are. Checked against the dense rotation
  matrix of the interleaved layout."""
  from rove_jax import rotary

  order = rotary.half_order(head_dim, n_rotated)
  assert sorted(order) == list(range(head_dim))
  w = np.arange(3 * head_dim * 2).reshape(3, head_dim, 2)  # in_half_order: the same, on an axis
  np.testing.assert_array_equal(rotary.in_half_order(jnp.asarray(w), n_rotated, 1), w[:, order])
  rng = np.random.default_rng(head_dim)
  x = rng.standard_normal((2, 5, 3, head_dim))
  pos = np.array([[0, 3, 7, 40, 41], [5, 1, 2, 90, 12]])
  inv = rj.rope_frequencies(n_rotated, base=100.0)
  half = rj.rotate(jnp.asarray(x[..., order], jnp.float32), pos, inv, layout="half")
  rot = [[dense_rotation(angles_for(p, inv), head_dim) for p in row] for row in pos]
  want = np.einsum("btde,bthe->bthd", np.array(rot), x)
  np.testing.assert_allclose(np.asarray(half), want[..., order], atol=2e-5, rtol=0)
  with pytest.raises(ValueError, match="n_rotated must be even"):
    rotary.half_order(8, 10)
