"""rope_attention / rove_attention against float64 loops, and the properties RoVE promises.

The equivalences (each kernel == the float64 loops, xla == chunked == reference, relative-position
invariance) run eagerly and under jit (chex variants), with positions, the Rope (frequencies,
attention factor) and the Mask (segments, kv validity) as traced arguments under jit."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import rove_jax as rj
from rove_jax import attention, kernels
from rove_jax.kernels import chunked
from tests.conftest import has_gpu
from tests.reference import naive_attention

IMPLS = ("reference", "xla", "chunked")
FNS = {"rope": rj.rope_attention, "rove": rj.rove_attention, "masked": rj.masked_attention}
KINDS = ("rope", "rove")
LAYOUTS = ("interleaved", "half")


def kernel(impl, chunk_size=4):
  """A kernel argument: the name, or for "chunked" its kernel with blocks of chunk_size."""
  return chunked.kernel(chunk_size) if impl == "chunked" else impl


def make_qkv(rng, B=2, T=6, S=6, H=4, K=2, D=8, scale=1.0):
  q = (scale * rng.standard_normal((B, T, H, D))).astype(np.float32)
  k = (scale * rng.standard_normal((B, S, K, D))).astype(np.float32)
  v = rng.standard_normal((B, S, K, D)).astype(np.float32)
  return q, k, v


CASES = {
  # name: (B, T, S, H, K, D, rot_dim, causal, query offset, attention factor)
  "mha_causal": (2, 6, 6, 2, 2, 8, 8, True, 0, 1.0),
  "gqa_partial": (1, 7, 7, 4, 2, 12, 8, True, 0, 1.0),
  "mqa_noncausal": (2, 5, 5, 3, 1, 8, 8, False, 0, 1.0),
  "cache_like": (2, 3, 9, 4, 2, 8, 8, True, 6, 1.0),  # queries at 6..8 over keys 0..8
  "yarn_factor": (1, 6, 6, 2, 1, 8, 8, True, 0, 1.3),
}


@functools.lru_cache(maxsize=None)
def loop_case(case, kind, layout):
  """Inputs and the float64 loop answer of one case; shared by its kernels and variants."""
  B, T, S, H, K, D, rot, causal, offset, factor = CASES[case]
  q, k, v = make_qkv(np.random.default_rng(0), B, T, S, H, K, D)
  kv_pos = np.tile(np.arange(S) * 3 + 5, (B, 1))  # spacing 3 makes offsets matter more
  q_pos = kv_pos[:, offset : offset + T]
  inv = np.asarray(rj.rope_frequencies(rot, base=100.0))
  want = naive_attention(
    q, k, v, q_pos, kv_pos, inv, rove=kind == "rove", causal=causal, factor=factor, layout=layout
  )
  return (q, k, v, q_pos, kv_pos, inv), want


class AttentionEquivalences(chex.TestCase):
  """Pure attention functions, eager and jitted."""

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(0)

  def attend(self, kind, **static):
    """self.variant of the attention function: q, k, v and a dict of array arguments
    (positions, frequencies, masks, factor) are traced under jit; `static` is closed over."""
    return self.variant(lambda q, k, v, arrays: FNS[kind](q, k, v, **arrays, **static))

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(case=sorted(CASES), impl=IMPLS, kind=KINDS, layout=LAYOUTS)
  def test_matches_float64_loops(self, case, impl, kind, layout):
    B, T, S, H, K, D, rot, causal, offset, factor = CASES[case]
    (q, k, v, q_pos, kv_pos, inv), want = loop_case(case, kind, layout)
    f = self.attend(kind, kernel=kernel(impl))
    out = f(
      q,
      k,
      v,
      dict(
        q_positions=q_pos,
        kv_positions=kv_pos,
        rope=rj.Rope(inv, factor, layout),
        mask=rj.Mask(causal=causal),
      ),
    )
    chex.assert_shape(out, (B, T, H, D))
    chex.assert_trees_all_close(out, want, atol=2e-5, rtol=2e-5)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*KINDS)
  def test_zero_frequencies_reduce_to_plain_softmax_attention(self, kind):
    q, k, v = make_qkv(self.rng, T=5, S=5, H=2, K=2)
    pos = np.tile(np.arange(5) * 11, (2, 1))
    out = self.attend(kind)(
      q, k, v, dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(jnp.zeros(4)))
    )
    # Plain causal softmax attention written directly (psi_delta == W_V: the identity kernel).
    logits = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(8)
    logits = np.where(np.tril(np.ones((5, 5), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    chex.assert_trees_all_close(out, np.einsum("bhts,bshd->bthd", w, v), atol=2e-6, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(kind=KINDS, impl=IMPLS)
  def test_shift_invariance(self, kind, impl):
    q, k, v = make_qkv(self.rng, T=8, S=8)
    pos = np.tile(np.arange(8), (2, 1))
    rope = rj.Rope(rj.rope_frequencies(8))
    attend = self.attend(kind, kernel=kernel(impl))
    f = lambda qp, kp: attend(q, k, v, dict(q_positions=qp, kv_positions=kp, rope=rope))
    base = f(pos, pos)
    chex.assert_trees_all_close(f(pos + 37, pos + 37), base, atol=3e-5, rtol=1e-7)
    # Shifting only the keys changes the result: the check above can fail.
    assert np.abs(f(pos + 37, pos + 30) - base).max() > 1e-3

  @chex.variants(with_jit=True, without_jit=True)
  def test_rove_shift_equivariance_on_2d_grid(self):
    """Tokens on a 4x4 grid with 2-D positions, bidirectional. Translating every position and
    listing the tokens in another order gives each token the same output (attentive convolution
    with a 2-D relative kernel)."""
    D, N = 16, 16
    tables = rj.axial_frequencies(D, 2, base=50.0)
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(4), indexing="ij"), -1).reshape(N, 2)
    q, k, v = make_qkv(self.rng, B=1, T=N, S=N, H=2, K=2, D=D)
    attend = self.attend("rove", mask=rj.Mask(causal=False))
    f = lambda q, k, v, qp, kp: attend(
      q, k, v, dict(q_positions=qp, kv_positions=kp, rope=rj.Rope(tables))
    )
    out = f(q, k, v, grid[None], grid[None])
    perm = self.rng.permutation(N)
    moved = grid[perm] + np.array([5, -3])
    out2 = f(q[:, perm], k[:, perm], v[:, perm], moved[None], moved[None])
    chex.assert_trees_all_close(out2, np.asarray(out)[:, perm], atol=3e-5, rtol=1e-7)
    want = naive_attention(
      q, k, v, grid[None], grid[None], [np.asarray(t) for t in tables], rove=True, causal=False
    )
    chex.assert_trees_all_close(out, want, atol=3e-5, rtol=1e-7)
    # Transposing the grid (swapping the axes) changes the answer: axes are not interchangeable.
    out_t = f(q, k, v, grid[None, :, ::-1], grid[None])
    assert np.abs(out_t - out).max() > 1e-3

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(impl=IMPLS, kind=KINDS)
  def test_packed_segments_equal_separate_sequences(self, impl, kind):
    q, k, v = make_qkv(self.rng, B=1, T=9, S=9, H=2, K=1)
    rope = rj.Rope(rj.rope_frequencies(8))
    seg = np.array([[0] * 4 + [1] * 5])
    pos = np.array([[0, 1, 2, 3, 0, 1, 2, 3, 4]])  # positions restart per document
    f = self.attend(kind, kernel=kernel(impl))
    packed = f(
      q, k, v, dict(q_positions=pos, kv_positions=pos, rope=rope, mask=rj.Mask(segment_ids=seg))
    )
    a, b = (
      f(q[:, s], k[:, s], v[:, s], dict(q_positions=pos[:, s], kv_positions=pos[:, s], rope=rope))
      for s in (slice(0, 4), slice(4, None))
    )
    chex.assert_trees_all_close(packed, np.concatenate([a, b], axis=1), atol=2e-6, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*IMPLS)
  def test_kv_mask_equals_dropping_slots_and_empty_rows_are_zero(self, impl):
    q, k, v = make_qkv(self.rng, B=1, T=2, S=6, H=2, K=2)
    rope = rj.Rope(rj.rope_frequencies(8))
    kv_pos = np.arange(6)[None]
    q_pos = np.array([[4, 5]])
    keep = np.array([[True, False, True, True, False, True]])
    f = self.attend("rove", kernel=kernel(impl))
    masked = f(
      q, k, v, dict(q_positions=q_pos, kv_positions=kv_pos, rope=rope, mask=rj.Mask(kv_valid=keep))
    )
    idx = np.flatnonzero(keep[0])
    dropped = f(
      q, k[:, idx], v[:, idx], dict(q_positions=q_pos, kv_positions=kv_pos[:, idx], rope=rope)
    )
    chex.assert_trees_all_close(masked, dropped, atol=2e-6, rtol=1e-7)
    none_visible = f(q, k, v, dict(q_positions=np.array([[-5, 4]]), kv_positions=kv_pos, rope=rope))
    chex.assert_trees_all_equal(np.asarray(none_visible)[0, 0], np.zeros((2, 8), np.float32))
    assert np.abs(np.asarray(none_visible)[0, 1]).max() > 0

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(kind=KINDS, causal=(True, False))
  def test_chunked_equals_xla_equals_reference_long_ragged(self, kind, causal):
    B, T, S = 2, 37, 45  # not multiples of the chunk
    q, k, v = make_qkv(self.rng, B=B, T=T, S=S, H=4, K=2, D=16)
    kv_pos = np.tile(np.arange(S), (B, 1))
    arrays = dict(
      q_positions=kv_pos[:, S - T :],
      kv_positions=kv_pos,
      rope=rj.Rope(rj.rope_frequencies(12)),
      mask=rj.Mask(causal=causal),
    )
    outs = [self.attend(kind, kernel=kernel(impl, 8))(q, k, v, arrays) for impl in IMPLS]
    chex.assert_shape(outs, (B, T, 4, 16))
    chex.assert_trees_all_close(outs[1], outs[0], atol=3e-6, rtol=1e-7)
    chex.assert_trees_all_close(outs[2], outs[0], atol=3e-6, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*IMPLS)
  def test_attention_factor_never_scales_value_or_output_rotations(self, impl):
    """One visible key: y = R_{j-i} v_j exactly, so |y| = |v| whatever the YaRN factor."""
    q, k, v = make_qkv(self.rng, B=1, T=1, S=1, H=2, K=2, D=8)
    inv, factor = rj.scaling.yarn(8, factor=8.0, original_max_len=16)
    assert factor > 1.2
    f = self.attend("rove", kernel=kernel(impl, 512))
    out = f(
      q,
      k,
      v,
      dict(q_positions=np.array([[40]]), kv_positions=np.array([[3]]), rope=rj.Rope(inv, factor)),
    )
    chex.assert_trees_all_close(np.linalg.norm(out, axis=-1), np.linalg.norm(v, axis=-1), rtol=1e-5)
    # and the factor does reach the logits: two keys, weights change with it.
    q2, k2, v2 = make_qkv(self.rng, B=1, T=1, S=2, H=1, K=1, D=8, scale=2.0)
    g = lambda a: f(
      q2,
      k2,
      v2,
      dict(q_positions=np.array([[5]]), kv_positions=np.array([[0, 5]]), rope=rj.Rope(inv, a)),
    )
    assert np.abs(g(factor) - g(1.0)).max() > 1e-3

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*IMPLS)
  def test_masked_attention_with_position_bias_matches_loops(self, impl):
    """No rotation, a logit bias from positions (T5/ALiBi-style): checked against float64 loops."""
    B, T, H, K, D = 2, 7, 4, 2, 8
    q, k, v = make_qkv(self.rng, B=B, T=T, S=T, H=H, K=K, D=D)
    pos = np.tile(np.arange(T) * 2, (B, 1))
    slopes = np.array([0.5, 0.25, 0.125, 0.0625], np.float32)

    def bias_fn(q_pos, kv_pos):  # ALiBi: -slope_h * (i - j)
      dist = (q_pos[:, :, None] - kv_pos[:, None, :]).astype(jnp.float32)
      return -jnp.asarray(slopes)[None, :, None, None] * dist[:, None]

    f = self.attend("masked", bias_fn=bias_fn, kernel=kernel(impl, 3))
    out = f(q, k, v, dict(q_positions=pos, kv_positions=pos))
    want = np.zeros((B, T, H, D))
    for b in range(B):
      for h in range(H):
        logits = q[b, :, h].astype(np.float64) @ k[b, :, h // 2].T.astype(np.float64) / np.sqrt(D)
        logits -= slopes[h] * (pos[b][:, None] - pos[b][None, :])
        logits[np.triu_indices(T, 1)] = -np.inf
        w = np.exp(logits - logits.max(1, keepdims=True))
        want[b, :, h] = (w / w.sum(1, keepdims=True)) @ v[b, :, h // 2]
    chex.assert_trees_all_close(out, want, atol=2e-5, rtol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.product(kind=KINDS, impl=IMPLS)
  def test_prerotated_kv_equals_rotating_inside(self, kind, impl):
    """What a KV cache does: store R_j k_j (and R_j v_j for RoVE); a step rotates q (with the
    attention factor), attends with masked_attention and (RoVE) rotates the output back."""
    q, k, v = make_qkv(self.rng, T=3, S=8)
    kv_pos = np.tile(np.arange(8) + 4, (2, 1))
    rope = rj.Rope(rj.rope_frequencies(8), 1.3)
    arrays = dict(q_positions=kv_pos[:, 5:], kv_positions=kv_pos)
    k_r = rope.rotate(k, kv_pos)
    v_r = rope.rotate(v, kv_pos) if kind == "rove" else v

    def cached(q, k, v, arrays, rope):
      q_r, q_tables = attention.rotate_queries(q, arrays["q_positions"], rope)
      out = rj.masked_attention(q_r, k, v, kernel=kernel(impl), **arrays)
      return rope.apply(out, q_tables, inverse=True) if kind == "rove" else out

    pre = self.variant(cached)(q, k_r, v_r, arrays, rope)
    inside = self.attend(kind, kernel=kernel(impl))(q, k, v, dict(arrays, rope=rope))
    chex.assert_trees_all_close(pre, inside, atol=2e-6, rtol=1e-7)


def test_rove_differs_from_rope(rng):
  q, k, v = make_qkv(rng)
  pos = np.tile(np.arange(6), (2, 1))
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(8)))
  assert np.abs(rj.rove_attention(q, k, v, **kw) - rj.rope_attention(q, k, v, **kw)).max() > 1e-2


@pytest.mark.parametrize("kind", ["rope", "rove", "rove_rotated"])
def test_packed_attention_is_the_function_of_its_kind_on_the_slices(kind, rng):
  """packed_attention(qkv) equals the function `kind` names on q, k, v = qkv[:, :, i] (a kernel
  that does not read the buffer in place gets the slices); bad buffers and kinds are named."""
  q, k, v = make_qkv(rng, K=4)  # multi-head: q, k, v of one shape
  pos = np.tile(np.arange(6) + 2, (2, 1))
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(8)))
  fn = {"rope": rj.rope_attention, "rove": rj.rove_attention}.get(kind, rj.rove_attention_rotated)
  got = attention.packed_attention(jnp.stack([q, k, v], axis=2), kind=kind, **kw)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(fn(q, k, v, **kw)))
  with pytest.raises(ValueError, match=r"qkv must be \[B, T, 3, H, D\].*got shape \(2, 6, 4, 8\)"):
    attention.packed_attention(q, kind=kind, **kw)
  with pytest.raises(ValueError, match="kind must be one of.*got 'nope'"):
    attention.packed_attention(jnp.stack([q, k, v], axis=2), kind="nope", **kw)


def test_rove_attention_rotated_is_the_kernel_output_before_r_inverse(rng):
  """rove_attention_rotated returns R_i y_i: the rotation matrix applied to it gives back y_i,
  and it is what a float64 reference of sum_j A_ij R_j v_j gives."""
  q, k, v = make_qkv(rng)
  pos = np.tile(np.arange(6) + 3, (2, 1))
  inv = rj.rope_frequencies(8)
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(inv))
  y = np.asarray(rj.rove_attention(q, k, v, **kw))
  o = rj.rove_attention_rotated(q, k, v, **kw)
  np.testing.assert_allclose(np.asarray(rj.rotate(o, pos, inv, inverse=True)), y, atol=1e-5)
  # R_i y_i with y the float64 attentive-convolution reference and R_i dense matrices
  want_y = naive_attention(q, k, v, pos, pos, inv, rove=True)
  R = np.stack([np.asarray(rj.rotation_matrix(p, inv, 8), np.float64) for p in range(3, 9)])
  want = np.einsum("tde,bthe->bthd", R, want_y)
  np.testing.assert_allclose(np.asarray(o, np.float64), want, atol=1e-5)


def test_bf16_inputs(rng):
  q, k, v = make_qkv(rng, T=16, S=16)
  pos = np.tile(np.arange(16) + 500, (2, 1))
  inv = rj.rope_frequencies(8)
  want = rj.rove_attention(
    q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv), kernel="reference"
  )
  for impl in IMPLS:
    got = rj.rove_attention(
      *(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)),
      q_positions=pos,
      kv_positions=pos,
      rope=rj.Rope(inv),
      kernel=kernel(impl, 8),
    )
    chex.assert_type(got, jnp.bfloat16)
    chex.assert_trees_all_close(got.astype(jnp.float32), want, atol=6e-2, rtol=1e-7)


@pytest.mark.parametrize("kind", ["rope", "rove"])
@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_match_finite_differences(kind, impl, rng):
  # float64 throughout; jax.nn.dot_product_attention ("xla") keeps its logits in float32
  # whatever the input dtype, so its check carries a float32-sized tolerance.
  tol = 2e-3 if impl == "xla" else 1e-6
  q, k, v = make_qkv(rng, B=1, T=5, S=5, H=2, K=1, D=8)
  pos = np.array([[0, 2, 3, 7, 9]])
  with jax.enable_x64(True):
    inv = jnp.asarray(rj.rope_frequencies(8), jnp.float64)
    args = tuple(jnp.asarray(a, jnp.float64) for a in (q, k, v))
    w = jnp.asarray(rng.standard_normal((1, 5, 2, 8)))

    def loss(q, k, v):
      out = FNS[kind](
        q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv, 1.2), kernel=kernel(impl, 2)
      )
      return jnp.sum(out * w)

    jax.test_util.check_grads(loss, args, order=1, modes=("rev",), atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["rope", "rove"])
def test_gradients_agree_across_implementations(kind, rng):
  q, k, v = make_qkv(rng, T=12, S=12)
  pos = np.tile(np.arange(12), (2, 1))
  inv = rj.rope_frequencies(8)

  def grads(impl):
    def loss(q, k, v):
      out = FNS[kind](
        q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv), kernel=kernel(impl, 5)
      )
      return jnp.sum(jnp.sin(out))

    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  ref = grads("reference")
  for impl in ("xla", "chunked"):
    for g, r in zip(grads(impl), ref):
      chex.assert_trees_all_close(g, r, atol=2e-5, rtol=1e-7)


@pytest.mark.parametrize("impl", IMPLS)
def test_jit_agrees_with_eager(impl, rng):
  q, k, v = make_qkv(rng)
  pos = np.tile(np.arange(6), (2, 1))
  inv = rj.rope_frequencies(8)
  f = functools.partial(rj.rove_attention, rope=rj.Rope(inv), kernel=kernel(impl))
  eager = f(q, k, v, q_positions=pos, kv_positions=pos)
  jitted = jax.jit(lambda q, k, v, p: f(q, k, v, q_positions=p, kv_positions=p))(q, k, v, pos)
  chex.assert_trees_all_close(jitted, eager, atol=1e-6, rtol=1e-7)


@pytest.mark.parametrize("kind", ["rope", "rove", "masked"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("ordered, causal", [(False, True), (False, False), (True, True)])
def test_sliding_window_matches_float64_loops(kind, impl, ordered, causal, rng):
  """Mask(window=w): key j visible only if q_pos - kv_pos < w, with packed documents and GQA,
  under jit; positions spaced 2 apart (general) or restarting in each document (ordered)."""
  B, T, H, K, D = 2, 11, 4, 2, 8
  q, k, v = make_qkv(rng, B=B, T=T, S=T, H=H, K=K, D=D)
  seg = np.tile(np.array([0] * 5 + [1] * 6), (B, 1))
  arange = np.tile(np.arange(T), (B, 1))
  pos = np.where(seg == 1, arange - 5, arange) if ordered else arange * 2 + 1
  window = 3 if ordered else 5
  inv = rj.rope_frequencies(8, base=100.0)
  rope = {} if kind == "masked" else dict(rope=rj.Rope(inv, 1.2))
  f = jax.jit(
    lambda q, k, v, mask: FNS[kind](
      q, k, v, q_positions=pos, kv_positions=pos, mask=mask, kernel=kernel(impl), **rope
    )
  )
  mask = rj.Mask(causal=causal, segment_ids=seg, ordered=ordered, window=window)
  out = f(q, k, v, mask)
  want = naive_attention(
    q,
    k,
    v,
    pos,
    pos,
    None if kind == "masked" else inv,
    rove=kind == "rove",
    causal=causal,
    factor=1.2,
    q_seg=seg,
    kv_seg=seg,
    window=window,
  )
  chex.assert_trees_all_close(out, want, atol=2e-5, rtol=2e-5)
  unwindowed = f(q, k, v, rj.Mask(causal=causal, segment_ids=seg, ordered=ordered))
  assert np.abs(np.asarray(unwindowed) - want).max() > 1e-2  # the window matters here


def test_bad_input_raises_clear_errors(rng):
  q, k, v = make_qkv(rng, H=3, K=2)
  pos = np.tile(np.arange(6), (2, 1))
  inv = rj.rope_frequencies(8)
  rope = rj.Rope(inv)
  kw = dict(q_positions=pos, kv_positions=pos, rope=rope)
  with pytest.raises(ValueError, match="multiple of kv heads"):
    rj.rove_attention(q, k, v, **kw)
  q, k, v = make_qkv(rng)
  with pytest.raises(ValueError, match="q_positions must have shape"):
    rj.rove_attention(q, k, v, q_positions=pos[:, :5], kv_positions=pos, rope=rope)
  with pytest.raises(ValueError, match="kv_positions must have shape"):
    rj.rope_attention(q, k, v, q_positions=pos, kv_positions=pos[None], rope=rope)
  with pytest.raises(ValueError, match="head dimension D is 8"):
    rj.rove_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(10))
    )
  with pytest.raises(ValueError, match="unknown attention implementation 'flash'"):
    rj.rove_attention(q, k, v, kernel="flash", **kw)
  with pytest.raises(ValueError, match="unknown rotary layout 'sideways'"):
    rj.Rope(inv, layout="sideways")
  with pytest.raises(ValueError, match="causal=False"):
    rj.rove_attention(
      q,
      k,
      v,
      q_positions=np.zeros((2, 6, 2)),
      kv_positions=np.zeros((2, 6, 2)),
      rope=rj.Rope(rj.axial_frequencies(8, 2)),
    )
  with pytest.raises(ValueError, match="segment_ids"):
    rj.rove_attention(q, k, v, mask=rj.Mask(segment_ids=np.zeros((2, 5), np.int32)), **kw)
  with pytest.raises(ValueError, match="kv_segment_ids without segment_ids"):
    rj.rove_attention(q, k, v, mask=rj.Mask(kv_segment_ids=np.zeros((2, 6), np.int32)), **kw)
  with pytest.raises(ValueError, match="kv_valid"):
    rj.rove_attention(q, k, v, mask=rj.Mask(kv_valid=np.ones((2, 5), bool)), **kw)
  with pytest.raises(ValueError, match="window must be a positive int"):
    rj.Mask(window=0)
  with pytest.raises(ValueError, match="chunk_size must be a positive int"):
    chunked.kernel(0)
  with pytest.raises(ValueError, match="same shape"):
    rj.rove_attention(q, k, v[..., :4], **kw)


@pytest.mark.skipif(has_gpu(), reason="checks the CPU error message")
def test_cudnn_on_cpu_is_a_clear_error(rng):
  q, k, v = make_qkv(rng)
  pos = np.tile(np.arange(6), (2, 1))
  with pytest.raises(ValueError, match="needs a CUDA GPU"):
    rj.rove_attention(
      q,
      k,
      v,
      q_positions=pos,
      kv_positions=pos,
      rope=rj.Rope(rj.rope_frequencies(8)),
      kernel="cudnn",
    )


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rope", "rove"])
def test_cudnn_equals_xla_in_bf16(kind, rng):
  q, k, v = make_qkv(rng, B=2, T=256, S=256, H=8, K=4, D=64)
  pos = np.tile(np.arange(256), (2, 1))
  args = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
  f = functools.partial(
    FNS[kind], *args, q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(64))
  )
  np.testing.assert_allclose(
    np.asarray(f(kernel="cudnn"), np.float32), np.asarray(f(kernel="xla"), np.float32), atol=2e-2
  )


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rope", "rove"])
def test_cudnn_causal_fast_path_equals_xla_in_bf16(kind, rng):
  """An ordered mask: cuDNN's own causal mask (no [B, T, S] array in the program) gives the
  xla kernel's dense-mask result, forward and gradients."""
  q, k, v = make_qkv(rng, B=2, T=512, S=512, H=8, K=4, D=64)
  pos = np.tile(np.arange(512), (2, 1))
  args = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]

  def loss(impl, ordered, q, k, v):
    out = FNS[kind](
      q,
      k,
      v,
      q_positions=pos,
      kv_positions=pos,
      rope=rj.Rope(rj.rope_frequencies(64)),
      mask=rj.Mask(ordered=ordered),
      kernel=impl,
    )
    return jnp.sum(out.astype(jnp.float32) ** 2), out

  grad = lambda impl, ordered: jax.grad(
    functools.partial(loss, impl, ordered), argnums=(0, 1, 2), has_aux=True
  )(*args)
  (g_fast, out_fast), (g_ref, out_ref) = grad("cudnn", True), grad("xla", False)
  np.testing.assert_allclose(
    np.asarray(out_fast, np.float32), np.asarray(out_ref, np.float32), atol=2e-2
  )
  for a, b in zip(g_fast, g_ref):
    scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
    np.testing.assert_allclose(
      np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2 * scale
    )
  hlo = jax.jit(lambda *a: loss("cudnn", True, *a)[0]).lower(*args).as_text()
  assert "pred[2,512,512]" not in hlo and "pred[2,1,512,512]" not in hlo  # no dense mask


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["rope", "rove"])
def test_cudnn_packed_documents_equal_xla_in_bf16(kind, rng):
  """Packed documents (positions restarting in each) through cuDNN's packed layout on a Hopper
  GPU give the dense-mask xla result, forward and gradients; a row of more documents than the
  layout is compiled for (T / 32) is NaN. tests/core/test_kernels_xla.py checks the descriptors."""
  B, T = 3, 512
  q, k, v = make_qkv(rng, B=B, T=T, S=T, H=8, K=4, D=64)
  args = [jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)]
  docs = [3, 1, kernels.xla.cudnn_max_segments(T) + 4]
  seg = np.stack(
    [
      np.searchsorted(
        np.sort(rng.choice(np.arange(1, T), n - 1, replace=False)), np.arange(T), side="right"
      )
      for n in docs
    ]
  ).astype(np.int32)
  first = np.maximum.accumulate(
    np.where(np.diff(seg, prepend=-1, axis=1) != 0, np.arange(T), 0), axis=1
  )
  pos = np.arange(T) - first

  def loss(impl, ordered, q, k, v):
    out = FNS[kind](
      q,
      k,
      v,
      q_positions=pos,
      kv_positions=pos,
      rope=rj.Rope(rj.rope_frequencies(64)),
      mask=rj.Mask(segment_ids=seg, ordered=ordered),
      kernel=impl,
    )
    return jnp.sum(out[:2].astype(jnp.float32) ** 2), out

  grad = lambda impl, ordered: jax.grad(
    functools.partial(loss, impl, ordered), argnums=(0, 1, 2), has_aux=True
  )(*args)
  (g_fast, out_fast), (g_ref, out_ref) = grad("cudnn", True), grad("xla", False)
  np.testing.assert_allclose(
    np.asarray(out_fast[:2], np.float32), np.asarray(out_ref[:2], np.float32), atol=2e-2
  )
  assert np.isnan(np.asarray(out_fast[2], np.float32)).all()
  for a, b in zip(g_fast, g_ref):
    scale = float(jnp.max(jnp.abs(b.astype(jnp.float32))))
    np.testing.assert_allclose(
      np.asarray(a[:2], np.float32), np.asarray(b[:2], np.float32), atol=3e-2 * scale
    )
  hlo = jax.jit(lambda *a: loss("cudnn", True, *a)[0]).lower(*args).as_text()
  assert f"pred[{B},{T},{T}]" not in hlo and f"pred[{B},1,{T},{T}]" not in hlo  # no dense mask
