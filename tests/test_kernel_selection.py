"""Kernel selection ("auto") and the index-masked fast path (positions_ordered)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rove_jax as rj
from rove_jax import attention, kernels
from rove_jax.nn.model import GPT, GPTConfig

SHAPES = dict(T=256, S=256, H=4, K=2, D=64, causal=True)


@pytest.mark.parametrize("platform, dtype, ordered, kv_mask, S, want", [
    ("tpu", jnp.bfloat16, True, False, 256, "splash"),
    ("tpu", jnp.float32, True, False, 256, "splash"),
    ("tpu", jnp.bfloat16, False, False, 256, "xla"),  # general positions (decoding)
    ("tpu", jnp.bfloat16, True, True, 256, "xla"),  # cache slots mask kv
    ("gpu", jnp.bfloat16, True, False, 256, "cudnn"),
    ("gpu", jnp.float16, True, False, 256, "cudnn"),
    ("gpu", jnp.float32, True, False, 256, "xla"),  # cuDNN flash runs in half precision
    ("gpu", jnp.bfloat16, False, False, 256, "xla"),
    ("cpu", jnp.float32, True, False, 256, "xla"),
    ("cpu", jnp.float32, False, False, attention.AUTO_CHUNKED_MIN_KV, "chunked"),
])
def test_auto_picks_the_platforms_kernel(platform, dtype, ordered, kv_mask, S, want):
  shapes = dict(SHAPES, S=S, T=S)
  got = attention.resolve_implementation("auto", dtype=dtype, positions_ordered=ordered,
                                         kv_mask=kv_mask, platform=platform, **shapes)
  assert got == want


def test_auto_avoids_splash_for_shapes_it_cannot_run_and_for_biases():
  odd = dict(SHAPES, T=100, S=100)
  assert attention.resolve_implementation("auto", dtype=jnp.bfloat16, positions_ordered=True,
                                          platform="tpu", **odd) == "xla"
  assert attention.resolve_implementation("auto", dtype=jnp.bfloat16, positions_ordered=True,
                                          bias=True, platform="gpu", **SHAPES) == "xla"
  # Explicit kernels pass through untouched.
  assert attention.resolve_implementation("chunked", dtype=jnp.float32, positions_ordered=True,
                                          platform="tpu", **SHAPES) == "chunked"


def test_target_platform_follows_the_mesh_being_compiled_for():
  assert attention.target_platform() == "cpu"
  cpu_device = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]).abstract_mesh
  tpu = type(cpu_device.abstract_device)(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
  seen = []

  def f(x):
    seen.append(attention.target_platform())
    return x

  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("data",),
                                                                abstract_device=tpu)):
    jax.make_jaxpr(f)(jnp.zeros(2))
  assert seen == ["tpu"]


def _inputs(rng, B=2, T=24, H=4, K=2, D=8):
  q = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
  return q, k, v


@pytest.mark.parametrize("fn", [rj.rove_attention, rj.rope_attention])
@pytest.mark.parametrize("causal", [True, False])
def test_index_masking_equals_position_masking(fn, causal, rng):
  """positions_ordered: the xla kernel's own causal mask gives what the positions' mask gives,
  for plain aranges with an offset and for packed documents (positions restarting)."""
  q, k, v = _inputs(rng)
  B, T = q.shape[:2]
  inv = rj.rope_frequencies(8)
  offset = jnp.broadcast_to(jnp.arange(T)[None] + jnp.array([[0], [37]]), (B, T))
  seg = jnp.broadcast_to(jnp.array([0] * 10 + [1] * 9 + [2] * 5)[None], (B, T))
  packed = jnp.concatenate([jnp.arange(10), jnp.arange(9), jnp.arange(5)])[None].repeat(B, 0)
  for pos, segs in ((offset, None), (packed, seg)):
    kw = dict(q_positions=pos, kv_positions=pos, inv_freq=inv, causal=causal, segment_ids=segs,
              implementation="xla")
    fast = fn(q, k, v, positions_ordered=True, **kw)
    want = fn(q, k, v, **kw)
    ref = fn(q, k, v, **dict(kw, implementation="reference"))
    np.testing.assert_allclose(np.asarray(fast), np.asarray(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_model_skips_the_dense_mask_for_default_positions(monkeypatch, rng):
  """The model's own aranges (and training's packed batches) take the index-masked path: no
  [B, T, S] mask is built; explicit positions still build it, with the same logits."""
  cfg = GPTConfig(vocab_size=64, n_layer=2, n_head=2, d_model=16, max_len=32)
  model = GPT(cfg, rngs=nnx.Rngs(0))
  tokens = jnp.asarray(rng.integers(0, 64, size=(2, 32)))
  calls = []
  real = kernels.mask_block
  monkeypatch.setattr(kernels, "mask_block", lambda *a: calls.append(1) or real(*a))
  ordered = model(tokens)
  assert calls == []
  general = model(tokens, positions=jnp.broadcast_to(jnp.arange(32)[None], (2, 32)))
  assert len(calls) == cfg.n_layer
  np.testing.assert_allclose(np.asarray(ordered), np.asarray(general), rtol=1e-5, atol=1e-5)


def test_ordered_positions_and_splash_errors(rng):
  q, k, v = _inputs(rng)
  pos = jnp.arange(q.shape[1])
  with pytest.raises(ValueError, match="T == S"):
    rj.rope_attention(q, k[:, :20], v[:, :20], q_positions=pos, kv_positions=pos[:20],
                      inv_freq=rj.rope_frequencies(8), positions_ordered=True)
  with pytest.raises(ValueError, match="positions_ordered=True"):
    rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos,
                      inv_freq=rj.rope_frequencies(8), implementation="splash")
  with pytest.raises(ValueError, match="splash' cannot run"):
    rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos,
                      inv_freq=rj.rope_frequencies(8), implementation="splash",
                      positions_ordered=True)  # T = 24 is no multiple of a splash block


def test_chunked_kernel_skips_blocks_by_index_for_ordered_positions(rng):
  """Ordered positions: the chunked kernel decides which blocks to skip from their indices, so
  a batch sharded over devices needs no all-reduce per block pair; the result is unchanged
  (here with two packed documents, positions restarting at the second)."""
  q, k, v = _inputs(rng, B=4, T=64)
  pos = jnp.broadcast_to(jnp.arange(64)[None], (4, 64))
  segs = jnp.broadcast_to((jnp.arange(64) >= 40)[None].astype(jnp.int32), (4, 64))
  pos = jnp.where(segs == 1, pos - 40, pos)
  kw = dict(q_positions=pos, kv_positions=pos, inv_freq=rj.rope_frequencies(8),
            implementation="chunked", chunk_size=16, segment_ids=segs)
  mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  args = [jax.device_put(a, shard) for a in (q, k, v)]
  hlo = lambda ordered: jax.jit(lambda *a: rj.rove_attention(
      *a, positions_ordered=ordered, **kw)).lower(*args).compile().as_text()
  assert "all-reduce" in hlo(False) and "all-reduce" not in hlo(True)
  fast = rj.rove_attention(*args, positions_ordered=True, **kw)
  ref = rj.rove_attention(q, k, v, **dict(kw, implementation="reference"))
  np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-6)
