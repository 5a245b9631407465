"""Kernel selection ("auto", rove_jax.kernels.dispatch) and the index-masked fast path (an
ordered Mask)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rove_jax as rj
from rove_jax import kernels
from rove_jax.kernels import chunked
from rove_jax.kernels import mask as mask_lib
from rove_jax.nn.model import GPT, GPTConfig


def choose(
  name="auto",
  *,
  dtype=jnp.float32,
  T=256,
  S=256,
  H=4,
  K=2,
  D=64,
  platform="cpu",
  bias=False,
  **mask,
):
  """kernels.choose for a call of these shapes (no arrays: shape-dtype structs), with
  Mask(**mask) (kv_valid=True: a [B, S] array of it)."""
  mask["kv_valid"] = jnp.ones((1, S), bool) if mask.get("kv_valid") else None
  q = jax.ShapeDtypeStruct((1, T, H, D), dtype)
  k = jax.ShapeDtypeStruct((1, S, K, D), dtype)
  return kernels.choose(name, q=q, k=k, mask=rj.Mask(**mask), bias=bias, platform_name=platform)


@pytest.mark.parametrize(
  "platform, dtype, ordered, kv_mask, S, want",
  [
    ("tpu", jnp.bfloat16, True, False, 256, "splash"),
    ("tpu", jnp.float32, True, False, 256, "splash"),
    ("tpu", jnp.bfloat16, False, False, 256, "xla"),  # general positions (decoding)
    ("tpu", jnp.bfloat16, True, True, 256, "xla"),  # cache slots mask kv
    ("gpu", jnp.bfloat16, True, False, 256, "cudnn"),
    ("gpu", jnp.float16, True, False, 256, "cudnn"),
    ("gpu", jnp.float32, True, False, 256, "xla"),  # cuDNN flash runs in half precision
    ("gpu", jnp.bfloat16, False, False, 256, "xla"),
    ("cpu", jnp.float32, True, False, 256, "xla"),
    ("cpu", jnp.float32, False, False, kernels.AUTO_CHUNKED_MIN_KV, "chunked"),
  ],
)
def test_auto_picks_the_platforms_kernel(platform, dtype, ordered, kv_mask, S, want):
  got = choose(dtype=dtype, T=S, S=S, platform=platform, ordered=ordered, kv_valid=kv_mask)
  assert got == want


def test_auto_avoids_kernels_that_cannot_run_the_call():
  assert choose(dtype=jnp.bfloat16, T=100, S=100, platform="tpu", ordered=True) == "xla"
  assert choose(dtype=jnp.bfloat16, platform="gpu", ordered=True, bias=True) == "xla"
  for platform in ("tpu", "gpu"):  # neither flash kernel takes a sliding window
    assert choose(dtype=jnp.bfloat16, platform=platform, ordered=True, window=64) == "xla"
  assert choose(platform="cpu", S=kernels.AUTO_CHUNKED_MIN_KV, T=1, window=64) == "chunked"
  # Explicit kernels pass through untouched.
  assert choose("chunked", platform="tpu", ordered=True) == "chunked"
  with pytest.raises(ValueError, match="splash' cannot run.*window"):
    choose("splash", platform="tpu", ordered=True, window=64)
  with pytest.raises(ValueError, match="splash' cannot run.*kv_valid"):
    choose("splash", platform="tpu", ordered=True, kv_valid=True)
  with pytest.raises(ValueError, match="bfloat16/float16"):
    choose("cudnn", platform="gpu", ordered=True)


def test_select_returns_the_kernel():
  q = k = jnp.zeros((1, 8, 2, 8), jnp.float32)
  mask = rj.Mask()
  assert kernels.select("xla", q=q, k=k, mask=mask).attend is kernels.xla.attend
  assert kernels.select("reference", q=q, k=k, mask=mask).attend is kernels.reference.attend
  chosen = kernels.select("auto", q=q, k=k, mask=mask)  # CPU, 8 keys
  assert (chosen.name, chosen.attend, chosen.rotates) == ("xla", kernels.xla.attend, False)
  f = kernels.select("chunked", q=q, k=k, mask=mask, settings=kernels.Settings(chunk_size=3))
  call = kernels.KernelCall(q + 1, k, k + 2, mask, jnp.arange(8)[None], jnp.arange(8)[None], 0.5)
  np.testing.assert_allclose(f.attend(call), kernels.reference.attend(call), atol=1e-6)


def test_fused_variants_name_the_hopper_kernels_arguments():
  """A variant is "default" or kernels.FUSED_FEATURES joined by "+"; a wrong one is refused by
  the config that names it, and one other than "default" where "fused" runs no Hopper kernel
  (here the TPU kernel, interpreted on CPU)."""
  assert kernels.fused_options("default") == {}
  want = dict(compute_wgs=2, producer=True, bf16_turns=True)
  assert kernels.fused_options("2wg+tma+bf16") == want
  assert kernels.fused_options("bwd2wg+matrix") == dict(backward_wgs=2, slice_swap=False)
  both = dict(backward_wgs=2, backward_producer=True)
  assert kernels.fused_options("bwd2wg+bwdtma") == both
  for bad, says in (
    ("", "expected 'default' or distinct features"),
    ("bf16+bf16", "distinct features"),
    ("2wg+fast", "from \\('2wg', 'tma', 'bwd2wg', 'bwdtma', 'bf16', 'matrix'\\)"),
    ("bwdtma+bf16", "'bwdtma' needs 'bwd2wg'"),
    ("tma", "'tma' \\(a producer warpgroup\\) needs '2wg'"),
    ("bf16+matrix", "'bf16' turns by slices"),
    (2, "a fused variant is a string"),
  ):
    with pytest.raises(ValueError, match=says):
      kernels.fused_options(bad)
  with pytest.raises(ValueError, match="GPTConfig: fused_variant: .*'tma'.* needs '2wg'"):
    GPTConfig.tiny(attention_impl="fused", fused_variant="tma")
  with pytest.raises(ValueError, match="fused_variant='bf16' is a variant of attention_impl=fused"):
    GPTConfig.tiny(attention_impl="cudnn", fused_variant="bf16")
  cfg = GPTConfig.tiny(attention_impl="fused", fused_variant="bf16")
  evaluated = cfg.with_kernel("fused", attention_chunk=64)  # evaluation's: any platform
  assert (evaluated.attention_impl, evaluated.attention_chunk) == ("fused", 64)
  assert evaluated.fused_variant == "default" == cfg.with_kernel("xla").fused_variant
  q = k = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
  rope, mask = rj.Rope(rj.rope_frequencies(64)), rj.Mask(ordered=True)
  plain = kernels.select("fused", q=q, k=k, mask=mask, rope=rope)
  assert plain.rotates and plain.name == "fused"
  bf16 = kernels.Settings(fused_variant="bf16")
  with pytest.raises(ValueError, match="'bf16' is the Hopper .*kernels.fused \\(target cpu"):
    kernels.select("fused", q=q, k=k, mask=mask, rope=rope, settings=bf16)


def test_fallback_hands_by_index_kernels_a_general_mask_to_xla():
  """The GPT's policy (fallback=True): splash and fused mask by index, so a call whose mask is
  not ordered (a decoding step) runs on xla; without it the kernel refuses the call."""
  q = k = jnp.zeros((1, 128, 2, 8), jnp.float32)
  rope = rj.Rope(rj.rope_frequencies(8))
  for name in ("splash", "fused"):
    for mask in (rj.Mask(), rj.Mask(kv_valid=jnp.ones((1, 128), bool))):
      chosen = kernels.select(name, q=q, k=k, mask=mask, rope=rope, fallback=True)
      assert (chosen.name, chosen.rotates) == ("xla", False)
      with pytest.raises(ValueError, match="ordered=True"):
        kernels.select(name, q=q, k=k, mask=mask, rope=rope)
  ordered = kernels.select("fused", q=q, k=k, mask=rj.Mask(ordered=True), rope=rope, fallback=True)
  assert (ordered.name, ordered.rotates) == ("fused", True)


def test_target_platform_follows_the_mesh_being_compiled_for():
  assert kernels.target_platform() == "cpu"
  cpu_device = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1]).abstract_mesh
  tpu = type(cpu_device.abstract_device)(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
  seen = []

  def f(x):
    seen.append(kernels.target_platform())
    return x

  x = jax.ShapeDtypeStruct((2,), jnp.float32)  # nothing runs under the abstract mesh (jax 0.12)
  with jax.sharding.use_abstract_mesh(
    jax.sharding.AbstractMesh((1,), ("data",), abstract_device=tpu)
  ):
    jax.make_jaxpr(f)(x)
  assert seen == ["tpu"]


def _inputs(rng, B=2, T=24, H=4, K=2, D=8):
  q = jnp.asarray(rng.normal(size=(B, T, H, D)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(B, T, K, D)), jnp.float32)
  return q, k, v


@pytest.mark.parametrize("fn", [rj.rove_attention, rj.rope_attention])
@pytest.mark.parametrize("causal", [True, False])
def test_index_masking_equals_position_masking(fn, causal, rng):
  """An ordered mask: the xla kernel's own causal mask gives what the positions' mask gives,
  for plain aranges with an offset and for packed documents (positions restarting)."""
  q, k, v = _inputs(rng)
  B, T = q.shape[:2]
  rope = rj.Rope(rj.rope_frequencies(8))
  offset = jnp.broadcast_to(jnp.arange(T)[None] + jnp.array([[0], [37]]), (B, T))
  seg = jnp.broadcast_to(jnp.array([0] * 10 + [1] * 9 + [2] * 5)[None], (B, T))
  packed = jnp.concatenate([jnp.arange(10), jnp.arange(9), jnp.arange(5)])[None].repeat(B, 0)
  for pos, segs in ((offset, None), (packed, seg)):
    kw = dict(q_positions=pos, kv_positions=pos, rope=rope)
    fast = fn(q, k, v, mask=rj.Mask(causal=causal, segment_ids=segs, ordered=True), **kw)
    want = fn(q, k, v, mask=rj.Mask(causal=causal, segment_ids=segs), **kw)
    ref = fn(q, k, v, mask=rj.Mask(causal=causal, segment_ids=segs), kernel="reference", **kw)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_model_skips_the_dense_mask_for_default_positions(monkeypatch, rng):
  """The model's own aranges (and training's packed batches) take the index-masked path: no
  [B, T, S] mask is built; explicit positions still build it, with the same logits."""
  cfg = GPTConfig(vocab_size=64, n_layer=2, n_head=2, d_model=16, max_len=32)
  model = GPT(cfg, rngs=nnx.Rngs(0))
  tokens = jnp.asarray(rng.integers(0, 64, size=(2, 32)))
  calls = []
  real = mask_lib.visible
  monkeypatch.setattr(mask_lib, "visible", lambda *a: calls.append(1) or real(*a))
  ordered = model(tokens)
  assert calls == []
  general = model(tokens, positions=jnp.broadcast_to(jnp.arange(32)[None], (2, 32)))
  assert len(calls) == cfg.n_layer
  np.testing.assert_allclose(np.asarray(ordered), np.asarray(general), rtol=1e-5, atol=1e-5)


def test_ordered_positions_and_splash_errors(rng):
  q, k, v = _inputs(rng)
  pos = jnp.arange(q.shape[1])
  rope = rj.Rope(rj.rope_frequencies(8))
  with pytest.raises(ValueError, match="T == S"):
    rj.rope_attention(
      q,
      k[:, :20],
      v[:, :20],
      q_positions=pos,
      kv_positions=pos[:20],
      rope=rope,
      mask=rj.Mask(ordered=True),
    )
  with pytest.raises(ValueError, match="ordered=True"):
    rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=rope, kernel="splash")
  with pytest.raises(ValueError, match="splash' cannot run"):
    rj.rove_attention(
      q,
      k,
      v,
      q_positions=pos,
      kv_positions=pos,
      rope=rope,
      kernel="splash",
      mask=rj.Mask(ordered=True),
    )  # T = 24 is no multiple of a splash block


def test_chunked_kernel_skips_blocks_by_index_for_ordered_positions(rng):
  """Ordered positions: the chunked kernel decides which blocks to skip from their indices, so
  a batch sharded over devices needs no all-reduce per block pair; the result is unchanged
  (here with two packed documents, positions restarting at the second)."""
  q, k, v = _inputs(rng, B=4, T=64)
  pos = jnp.broadcast_to(jnp.arange(64)[None], (4, 64))
  segs = jnp.broadcast_to((jnp.arange(64) >= 40)[None].astype(jnp.int32), (4, 64))
  pos = jnp.where(segs == 1, pos - 40, pos)
  kw = dict(
    q_positions=pos,
    kv_positions=pos,
    rope=rj.Rope(rj.rope_frequencies(8)),
    kernel=chunked.kernel(16),
  )
  mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
  shard = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  args = [jax.device_put(a, shard) for a in (q, k, v)]
  mask = lambda ordered: rj.Mask(segment_ids=segs, ordered=ordered)
  hlo = lambda ordered: (
    jax.jit(lambda *a: rj.rove_attention(*a, mask=mask(ordered), **kw))
    .lower(*args)
    .compile()
    .as_text()
  )
  assert "all-reduce" in hlo(False) and "all-reduce" not in hlo(True)
  fast = rj.rove_attention(*args, mask=mask(True), **kw)
  ref = rj.rove_attention(q, k, v, mask=mask(False), **dict(kw, kernel="reference"))
  np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), rtol=1e-5, atol=1e-6)
