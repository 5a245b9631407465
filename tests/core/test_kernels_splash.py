"""rove_jax.kernels.splash (TPU splash attention; Pallas interpret mode on CPU) against a
float64 NumPy softmax with the same mask: causal, bidirectional, packed documents, GQA and MQA,
bfloat16, rows that see no key, gradients, and under a (data, fsdp, tensor) mesh through
shard_map."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.kernels import KernelCall, Mask, splash
from rove_jax.kernels.splash import unsupported_reason
from rove_jax.train import sharding

T = 256  # splash needs lengths that are multiples of 128; 256 gives 2 x 2 blocks of 128
D = 64  # GPT-2's head dim
SCALE = 1 / np.sqrt(D)


def splash_attention(
  q,
  k,
  v,
  *,
  scale,
  causal,
  q_segment_ids=None,
  kv_segment_ids=None,
  block_size=splash.DEFAULT_BLOCK,
):
  """The splash kernel on index-ordered positions (which it does not read)."""
  mask = Mask(causal=causal, segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids, ordered=True)
  return splash.kernel(block_size).attend(KernelCall(q, k, v, mask, None, None, scale))


@functools.lru_cache(maxsize=None)
def attend(causal, block_size=128):
  """One jitted splash per mask kind, shared by the cases (segments are traced arguments)."""
  return jax.jit(
    functools.partial(splash_attention, scale=SCALE, causal=causal, block_size=block_size)
  )


def inputs(B, H, K, dtype=np.float32, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, T, H, D)) * 2  # sharper softmax than unit logits
  k = rng.standard_normal((B, T, K, D))
  v = rng.standard_normal((B, T, K, D))
  return tuple(jnp.asarray(a, dtype) for a in (q, k, v))


def documents(B, lengths):
  """Segment ids [B, T] of packed documents with these lengths (summing to T), per row rolled
  so the rows differ."""
  ids = np.repeat(np.arange(len(lengths)), lengths)
  return np.stack([np.roll(ids, 37 * b) for b in range(B)]).astype(np.int32)


def visible(B, causal, q_seg=None, kv_seg=None):
  mask = np.tril(np.ones((T, T), bool)) if causal else np.ones((T, T), bool)
  mask = np.broadcast_to(mask, (B, T, T))
  if q_seg is not None:
    mask = mask & (q_seg[:, :, None] == kv_seg[:, None, :])
  return mask


def naive(q, k, v, mask_BTS):
  """Float64 einsum softmax attention; rows with no visible key give 0."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  B, _, H, _ = q.shape
  K = k.shape[2]
  q_BTKGD = q.reshape(B, T, K, H // K, D)
  logits = np.einsum("btkgd,bskd->bkgts", q_BTKGD, k) * SCALE
  logits = np.where(mask_BTS[:, None, None], logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  w = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
  w /= np.maximum(w.sum(-1, keepdims=True), 1e-300)
  return np.einsum("bkgts,bskd->btkgd", w, v).reshape(B, T, H, D)


def check(out, want, tol):
  out = np.asarray(out, np.float64)
  assert out.shape == want.shape
  err = np.abs(out - want).max() / np.abs(want).max()
  assert err < tol, f"max error {err:.2e} relative to the output's scale (tolerance {tol:.0e})"


CASES = {
  # name: (B, H, K, causal, document lengths or None)
  "causal_gqa": (2, 4, 2, True, None),
  "bidirectional_mha": (1, 2, 2, False, None),
  "packed_causal_mqa": (2, 4, 1, True, (100, 60, 96)),
  "packed_bidirectional_gqa": (1, 4, 2, False, (31, 150, 75)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64_softmax(case):
  B, H, K, causal, lengths = CASES[case]
  q, k, v = inputs(B, H, K)
  seg = None if lengths is None else documents(B, lengths)
  out = attend(causal)(q, k, v, q_segment_ids=seg)
  assert out.dtype == q.dtype
  check(out, naive(q, k, v, visible(B, causal, seg, seg)), 1e-5)


def test_bfloat16():
  q, k, v = inputs(2, 4, 2, jnp.bfloat16)
  out = attend(True)(q, k, v)
  assert out.dtype == jnp.bfloat16
  # Against the float64 answer for the same (bfloat16-rounded) inputs.
  check(out, naive(q, k, v, visible(2, True)), 2e-2)


def test_rows_without_keys_are_zero():
  """Distinct q/kv segment ids: queries of segment 2 find no kv of their segment (and causal
  hides segment 1's later kv from its early queries); those rows return 0, the rest match."""
  B, H, K = 1, 2, 1
  q, k, v = inputs(B, H, K, seed=1)
  q_seg = np.repeat([0, 1, 2], [100, 100, 56])[None].astype(np.int32)
  kv_seg = np.repeat([0, 1, 0], [50, 106, 100])[None].astype(np.int32)  # segment 1 at 50..155
  mask = visible(B, True, q_seg, kv_seg)
  empty = ~mask.any(-1)
  assert empty[0, 200:].all() and not empty[0, 150:200].any()  # the case has both kinds
  out = attend(True)(q, k, v, q_segment_ids=q_seg, kv_segment_ids=kv_seg)
  assert np.all(np.asarray(out)[empty] == 0)
  check(out, naive(q, k, v, mask), 1e-5)


def test_gradients_match_reference():
  """d/dq, d/dk, d/dv through splash's custom VJP equal autodiff of an einsum softmax, and stay
  the same under a (2, 1, 2) mesh (batch and query heads split, MQA's kv head replicated: its
  gradient is summed over the tensor shards by shard_map's transpose)."""
  B, H, K = 2, 2, 1
  q, k, v = inputs(B, H, K, seed=2)
  seg = documents(B, (90, 166))
  mask = jnp.asarray(visible(B, True, seg, seg))
  cotangent = jnp.asarray(np.random.default_rng(3).standard_normal((B, T, H, D)), jnp.float32)

  def reference(q, k, v):  # float32 einsum softmax, written independently of splash
    q_BTKGD = q.reshape(B, T, K, H // K, D)
    logits = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k) * SCALE
    w = jax.nn.softmax(jnp.where(mask[:, None, None], logits, -jnp.inf), axis=-1)
    return jnp.einsum("bkgts,bskd->btkgd", w, v).reshape(B, T, H, D)

  def grads(f):
    return jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2)))

  splash_grads = grads(
    lambda q, k, v: splash_attention(
      q, k, v, scale=SCALE, causal=True, q_segment_ids=seg, block_size=128
    )
  )
  got, want = splash_grads(q, k, v), grads(reference)(q, k, v)
  with jax.set_mesh(sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])):
    sharded = splash_grads(q, k, v)
  for name, g, w, s in zip("qkv", got, want, sharded):
    err = float(jnp.abs(g - w).max() / jnp.abs(w).max())
    assert err < 1e-5, f"d{name}: max error {err:.2e} relative to its scale"
    np.testing.assert_allclose(s, g, rtol=1e-5, atol=1e-6, err_msg=f"sharded d{name}")


def test_unsupported_reason():
  assert unsupported_reason(256, 256, 4, 2, 64, causal=True) is None
  assert unsupported_reason(256, 512, 4, 1, 64, causal=False) is None
  assert "multiple of 128" in unsupported_reason(100, 100, 4, 2, 64, causal=True)
  assert "T == S" in unsupported_reason(256, 512, 4, 2, 64, causal=True)
  assert "multiple of kv heads" in unsupported_reason(256, 256, 3, 2, 64, causal=False)
  q, k, v = inputs(1, 2, 1)
  with pytest.raises(ValueError, match="multiple of 128"):
    splash_attention(q[:, :100], k[:, :100], v[:, :100], scale=1.0, causal=True)
  with pytest.raises(ValueError, match="block_size"):
    splash_attention(q, k, v, scale=1.0, causal=True, block_size=100)
  for mask, reason in (
    (Mask(), "ordered=True"),
    (Mask(ordered=True, window=8), "window"),
    (Mask(ordered=True, kv_valid=np.ones((1, T), bool)), "kv_valid"),
  ):
    with pytest.raises(ValueError, match=reason):
      splash.attend(KernelCall(q, k, v, mask, None, None, 1.0))


def test_sharded_matches_unsharded():
  """Under jax.set_mesh on a (data, fsdp, tensor) = (2, 1, 2) mesh the kernel runs in
  shard_map (batch over data, query and kv heads over tensor) and gives the unsharded numbers.
  (test_gradients_match_reference covers MQA and segments under the same mesh.)"""
  B, H, K = 2, 4, 2
  q, k, v = inputs(B, H, K, seed=4)
  want = attend(True)(q, k, v)  # compiled by causal_gqa already
  f = jax.jit(functools.partial(splash_attention, scale=SCALE, causal=True, block_size=128))
  with jax.set_mesh(sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])):
    assert "shard_map" in str(jax.make_jaxpr(f)(q, k, v))
    got = f(q, k, v)
  assert got.sharding.spec == jax.sharding.PartitionSpec("data", None, "tensor")
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  check(got, naive(q, k, v, visible(B, True)), 1e-5)
