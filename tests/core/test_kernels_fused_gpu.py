"""rove_jax.kernels.fused_gpu (the Pallas Triton kernel that rotates inside) in Pallas interpret
mode on CPU, called directly, against the float64 references of test_kernels_fused: outputs and
the gradients of q, k and v, for RoPE and RoVE, causal and bidirectional, packed documents, MHA,
GQA and MQA, float32 and bfloat16, partial rotary, YaRN's attention factor, both layouts; rows that
see no key; the same under a (2, 1, 2) mesh; the exact pair swap and the kernel's sin/cos; the
limits dispatch checks for a GPU target. On a CUDA GPU (bench/gpu_check.sh) the same cases run
compiled: FUSED_GPU_COMPILED=1 turns interpret off."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import kernels
from rove_jax.kernels import fused_gpu, fused_gpu_tiles
from tests.core.test_kernels_fused import (
  BF16,
  CASES,
  F32,
  TOL,
  D,
  T,
  check,
  check_case,
  direct,
  documents,
  inputs,
  reference_and_grads,
)

INTERPRET = os.environ.get("FUSED_GPU_COMPILED") != "1"
# test_kernels_fused's cases but its MHA one (test_mha_matches_reference_and_runs_sharded).
GPU_CASES = {
  name: CASES[name]
  for name in (
    "rove_causal_interleaved_gqa_f32",
    "rove_packed_half_mqa_partial_yarn_f32",
    "rope_packed_bidirectional_half_gqa_partial_f32",
    "rove_packed_interleaved_partial_yarn_bf16",
    "rope_causal_half_mqa_bf16",
  )
}
KIND = {"rope": "rope", "rove": "rove", "rotated": "rove_rotated"}


def fused_gpu_and_grads(kind, q, k, v, ct, pos, rope, mask):
  """(out, (dq, dk, dv)) of the GPU kernel, one jitted program, cotangent ct."""
  # The default blocks: 4 x 4 block pairs forward, 8 x 8 backward at T = 256.
  attend = fused_gpu.kernel(interpret=INTERPRET)

  def run(q, k, v):
    f = lambda q, k, v: direct(attend, q, k, v, mask, pos, rope, KIND[kind])
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(jnp.asarray(ct, out.dtype))

  return jax.jit(run)(q, k, v)


@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_matches_float64_reference_with_gradients(case):
  check_case(case, fused_gpu_and_grads)


def test_rotated_output_and_rows_without_keys():
  """rove_attention_rotated's kind under distinct q/kv segment ids: queries of segment 2 find
  no key and return 0 with zero gradients into them; the rest match the reference."""
  q, k, v, ct = inputs(1, 2, 1, F32, seed=11)
  q_seg = np.repeat([0, 1, 2], [100, 100, 56])[None].astype(np.int32)
  kv_seg = np.repeat([0, 1, 0], [50, 106, 100])[None].astype(np.int32)
  pos = np.arange(T)[None]
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, "interleaved")
  mask = rj.Mask(
    causal=True, segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg), ordered=True
  )
  out, grads = fused_gpu_and_grads("rotated", q, k, v, ct, jnp.asarray(pos), rope, mask)
  assert np.all(np.asarray(out)[0, 200:] == 0)
  assert np.all(np.asarray(grads[0])[0, 200:] == 0)
  want, want_grads = reference_and_grads(
    "rotated", q, k, v, ct, pos, rope, causal=True, seg_q=q_seg, seg_kv=kv_seg
  )
  check("out", out, want, TOL[F32])
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
    check(name, g, w, TOL[F32])


@pytest.mark.parametrize("layout,rot_dim", [("interleaved", 48), ("half", 48), ("half", 64)])
def test_pair_swap_is_exact(layout, rot_dim):
  """x @ swap_matrix gives each rotated dim its pair partner and keeps pass-through dims,
  bit for bit, for float32 tiles (three bfloat16 pieces) and bfloat16 ones."""
  P = rot_dim // 2
  offset = 1 if layout == "interleaved" else P
  swap = jnp.asarray(fused_gpu_tiles.swap_matrix(D, offset, rot_dim), jnp.bfloat16)
  partner = [
    d ^ 1 if layout == "interleaved" else (d + P if d < P else d - P) for d in range(rot_dim)
  ] + list(range(rot_dim, D))
  x = np.random.default_rng(0).standard_normal((16, D)).astype(np.float32) * 1e3
  for dtype in (F32, BF16):
    xs = jnp.asarray(x, dtype)
    got = np.asarray(fused_gpu_tiles.pair_swap(xs, swap))
    np.testing.assert_array_equal(got, np.asarray(xs, np.float32)[:, partner])


def test_dispatch_checks_the_gpu_limits():
  rope = rj.Rope(rj.rope_frequencies(D))
  shape = lambda T_, D_=D: jax.ShapeDtypeStruct((1, T_, 2, D_), BF16)
  choose = lambda q, where="gpu", mask=rj.Mask(ordered=True), rope=rope: kernels.choose(
    "fused", q=q, k=q, mask=mask, rope=rope, platform_name=where
  )
  # Lengths that are multiples of 16 but not of 128: the GPU kernel takes them, the TPU one not.
  assert choose(shape(144)) == "fused"
  with pytest.raises(ValueError, match="multiple of 128"):
    choose(shape(144), where="tpu")
  with pytest.raises(ValueError, match="fused' cannot run.*multiple of 16.*'cudnn'"):
    choose(shape(100))
  with pytest.raises(ValueError, match="power of two"):
    choose(shape(128, 48), rope=rj.Rope(rj.rope_frequencies(48)))
  for mask, rope_, reason in (
    (rj.Mask(), rope, "ordered=True"),
    (rj.Mask(ordered=True, window=8), rope, "window"),
    (rj.Mask(ordered=True), None, "needs a Rope"),
  ):
    with pytest.raises(ValueError, match=f"fused' cannot run.*{reason}"):
      choose(shape(128), mask=mask, rope=rope_)
  assert (
    kernels.choose(
      "auto",
      q=shape(1024),
      k=shape(1024),
      mask=rj.Mask(ordered=True),
      rope=rope,
      platform_name="gpu",
    )
    == "cudnn"
  )
  assert [fused_gpu._block(n, 64) for n in (1024, 144, 96, 16)] == [64, 16, 32, 16]
  for bad in (100, 8, True):
    with pytest.raises(ValueError, match="block_size"):
      fused_gpu.kernel(bad)
    with pytest.raises(ValueError, match="backward_block_size"):
      fused_gpu.kernel(backward_block_size=bad)


def test_mha_matches_reference_and_runs_sharded():
  """MHA (one query head a kv head, G = 1) against the float64 reference; and under jax.set_mesh
  on a (data, fsdp, tensor) = (2, 1, 2) mesh the kernel runs in shard_map (batch over data,
  heads over tensor, segment and position rows with the batch) and gives the unsharded output
  and gradients (with 4 devices or more: tests/conftest.py gives 8 CPU devices; one GPU skips
  this part)."""
  B, H, K = 2, 2, 2
  q, k, v, ct = inputs(B, H, K, F32, seed=5)
  seg, pos = documents(B, (120, 136))
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, "half")
  mask = rj.Mask(causal=True, segment_ids=jnp.asarray(seg), ordered=True)
  run = lambda: fused_gpu_and_grads("rove", q, k, v, ct, jnp.asarray(pos), rope, mask)
  want = run()
  ref, ref_grads = reference_and_grads(
    "rove", q, k, v, ct, pos, rope, causal=True, seg_q=seg, seg_kv=seg
  )
  for name, g, w in zip(("out", "dq", "dk", "dv"), jax.tree.leaves(want), (ref,) + ref_grads):
    check(name, g, w, TOL[F32])
  if len(jax.devices()) < 4:
    return
  mesh = jax.make_mesh(
    (2, 1, 2),
    ("data", "fsdp", "tensor"),
    devices=jax.devices()[:4],
    axis_types=(jax.sharding.AxisType.Auto,) * 3,
  )
  with jax.set_mesh(mesh):
    got = run()
  assert got[0].sharding.spec == jax.sharding.PartitionSpec("data", None, "tensor")
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)  # sharded sums: another order
