"""rove_jax.kernels.fused (the Pallas kernel that rotates inside; interpret mode on CPU) through
rj.rope_attention / rj.rove_attention(kernel="fused") against a float64 reference built from
dense rotation matrices: outputs and the gradients of q, k and v, for RoPE and RoVE, causal and
bidirectional, packed documents, MHA, GQA and MQA, float32 and bfloat16, partial rotary, YaRN's
attention factor, both layouts; rows that see no key; the limits dispatch checks; the GPT's
attention_impl="fused"."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rove_jax as rj
from rove_jax import kernels
from rove_jax.kernels import fused
from rove_jax.nn.model import GPT
from tests.conftest import gpt_config
from tests.reference import dense_rotation

T = 256  # lengths are multiples of 128; blocks of 128 give 2 x 2 block pairs (one skipped)
D = 64
F32, BF16 = jnp.float32, jnp.bfloat16
# Tolerances relative to the largest reference value: tests/core/test_kernels_splash.py's.
TOL = {F32: 1e-5, BF16: 2e-2}
FNS = {"rope": rj.rope_attention, "rove": rj.rove_attention, "rotated": rj.rove_attention_rotated}


def yarn_rope(rot_dim, layout):
  inv_freq, factor = rj.scaling.yarn(rot_dim, factor=4.0, original_max_len=64)
  assert abs(float(factor) - 1.0) > 0.1  # the attention factor is exercised
  return rj.Rope(jnp.asarray(inv_freq, F32), float(factor), layout)


CASES = {
  # name: (function, dtype, layout, B, H, K, causal, document lengths, rotary dims, yarn)
  "rope_causal_interleaved_mha_f32": ("rope", F32, "interleaved", 1, 2, 2, True, None, 64, False),
  "rove_causal_interleaved_gqa_f32": ("rove", F32, "interleaved", 1, 4, 2, True, None, 64, False),
  "rove_packed_half_mqa_partial_yarn_f32": (
    "rove",
    F32,
    "half",
    2,
    2,
    1,
    True,
    (100, 60, 96),
    32,
    True,
  ),
  "rope_packed_bidirectional_half_gqa_partial_f32": (
    "rope",
    F32,
    "half",
    1,
    4,
    2,
    False,
    (31, 150, 75),
    48,
    False,
  ),
  "rove_packed_interleaved_partial_yarn_bf16": (
    "rove",
    BF16,
    "interleaved",
    1,
    4,
    2,
    True,
    (90, 166),
    48,
    True,
  ),
  "rope_causal_half_mqa_bf16": ("rope", BF16, "half", 1, 2, 1, True, None, 64, False),
}


def documents(B, lengths):
  """(segment ids, positions restarting at each document), each [B, T], rolled per row: the
  mask's `ordered` promise holds (positions grow with the index inside each document)."""
  ids = np.repeat(np.arange(len(lengths)), lengths)
  seg = np.stack([np.roll(ids, 37 * b) for b in range(B)]).astype(np.int32)
  # Rolling splits the last document in two at the row's start: renumber it so each segment
  # is one run whose positions grow.
  out_pos = np.zeros((B, T), np.int32)
  for b in range(B):
    run = np.concatenate([[0], np.flatnonzero(np.diff(seg[b])) + 1, [T]])
    for n, (s, e) in enumerate(zip(run[:-1], run[1:])):
      seg[b, s:e] = n
      out_pos[b, s:e] = np.arange(e - s)
  return seg, out_pos


def rotations(pos_BT, rope, dim=D):
  """float64 R [B, T, dim, dim] built pair by pair; the angles are the float32 products
  position * inv_freq that define the library's rotations (rotary.rotation_angles), the
  rest is float64."""
  inv = np.asarray(rope.inv_freq, np.float32)
  angles = (np.asarray(pos_BT, np.float32)[..., None] * inv).astype(np.float64)
  return np.stack([np.stack([dense_rotation(a, dim, rope.layout) for a in row]) for row in angles])


def reference(kind, q, k, v, pos_BT, rope, *, causal, seg_q=None, seg_kv=None):
  """float64 jnp (call under jax.enable_x64) softmax attention on dense rotations; differentiable
  in q, k, v. RoPE: softmax(c R_i q . c R_j k / sqrt(D)) v; RoVE: R_i^T (... R_j v); rotated:
  RoVE without the R_i^T. c: the attention factor on the rotated dims."""
  B, _, H, D = q.shape  # the head dim of these inputs (the module's D by default)
  R = jnp.asarray(rotations(pos_BT, rope, D))
  K = k.shape[2]
  c_D = jnp.where(jnp.arange(D) < rope.n_rotated, float(rope.attention_factor), 1.0)
  c_D = c_D.reshape(1, 1, 1, D)
  rot = lambda x, RR: jnp.einsum("btde,bthe->bthd", RR, x)
  q_r, k_r = rot(q * c_D, R), rot(k * c_D, R)
  v_r = v if kind == "rope" else rot(v, R)
  logits = jnp.einsum("btkgd,bskd->bkgts", q_r.reshape(B, T, K, H // K, D), k_r) / np.sqrt(D)
  mask = np.ones((B, T, T), bool)
  if causal:
    mask &= np.tril(np.ones((T, T), bool))
  if seg_q is not None:
    mask &= np.asarray(seg_q)[:, :, None] == np.asarray(seg_kv)[:, None, :]
  logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
  top = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
  w = jnp.exp(logits - jnp.where(jnp.isfinite(top), top, 0.0))
  w = w / jnp.maximum(jnp.sum(w, -1, keepdims=True), 1e-300)
  out = jnp.einsum("bkgts,bskd->btkgd", w, v_r).reshape(B, T, H, D)
  return rot(out, jnp.swapaxes(R, -1, -2)) if kind == "rove" else out


def direct(kernel, q, k, v, mask, pos, rope, kind):
  """A rotating kernel called at the kernel boundary: one KernelCall, the scale 1 / sqrt(D)."""
  return kernel.attend(
    kernels.KernelCall(q, k, v, mask, pos, pos, 1.0 / math.sqrt(q.shape[-1]), rope=rope, kind=kind)
  )


def inputs(B, H, K, dtype, seed):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal((B, T, H, D)) * 2  # sharper softmax than unit logits
  k, v = rng.standard_normal((B, T, K, D)), rng.standard_normal((B, T, K, D))
  ct = rng.standard_normal((B, T, H, D))
  return tuple(jnp.asarray(a, dtype) for a in (q, k, v)) + (ct,)


def fused_and_grads(kind, q, k, v, ct, pos, rope, mask):
  """(out, (dq, dk, dv)) of the fused kernel, one jitted program, cotangent ct."""

  def f(q, k, v):
    return FNS[kind](
      q, k, v, q_positions=pos, kv_positions=pos, rope=rope, mask=mask, kernel="fused"
    )

  def run(q, k, v):
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(jnp.asarray(ct, out.dtype))

  return jax.jit(run)(q, k, v)


def reference_and_grads(kind, q, k, v, ct, pos, rope, **mask):
  with jax.enable_x64(True):
    args = tuple(jnp.asarray(np.asarray(a, np.float64)) for a in (q, k, v))
    out, vjp = jax.vjp(functools.partial(reference, kind, pos_BT=pos, rope=rope, **mask), *args)
    grads = vjp(jnp.asarray(ct, jnp.float64))
    return np.asarray(out), tuple(np.asarray(g) for g in grads)


def check(name, got, want, tol):
  got = np.asarray(jnp.asarray(got, F32), np.float64)
  assert got.shape == want.shape, name
  err = np.abs(got - want).max() / np.abs(want).max()
  assert err < tol, f"{name}: max error {err:.2e} relative to its scale (tolerance {tol:.0e})"


def check_case(case, run):
  """CASES[case] through `run` (fused_and_grads' signature) against the float64 reference:
  the output and the gradients of q, k and v, in the inputs' dtype."""
  kind, dtype, layout, B, H, K, causal, lengths, rot_dim, yarn = CASES[case]
  q, k, v, ct = inputs(B, H, K, dtype, seed=len(case))
  rope = yarn_rope(rot_dim, layout) if yarn else rj.Rope(rj.rope_frequencies(rot_dim), 1.0, layout)
  if lengths is None:
    seg, pos = None, np.broadcast_to(7 + np.arange(T), (B, T))  # positions are not indices
  else:
    seg, pos = documents(B, lengths)
  mask = rj.Mask(causal=causal, segment_ids=None if seg is None else jnp.asarray(seg), ordered=True)
  out, grads = run(kind, q, k, v, ct, jnp.asarray(pos), rope, mask)
  assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
  want, want_grads = reference_and_grads(
    kind, q, k, v, ct, pos, rope, causal=causal, seg_q=seg, seg_kv=seg
  )
  check("out", out, want, TOL[dtype])
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
    check(name, g, w, TOL[dtype])


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64_reference_with_gradients(case):
  check_case(case, fused_and_grads)


def test_rotated_output_and_rows_without_keys():
  """rove_attention_rotated (values rotated inside, the output left rotated) under distinct
  q/kv segment ids: queries of segment 2 find no key and return 0 with zero gradients into
  them; the rest match the reference, gradients included."""
  q, k, v, ct = inputs(1, 2, 1, F32, seed=11)
  q_seg = np.repeat([0, 1, 2], [100, 100, 56])[None].astype(np.int32)
  kv_seg = np.repeat([0, 1, 0], [50, 106, 100])[None].astype(np.int32)
  pos = np.arange(T)[None]
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, "interleaved")
  mask = rj.Mask(
    causal=True, segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg), ordered=True
  )
  out, grads = fused_and_grads("rotated", q, k, v, ct, jnp.asarray(pos), rope, mask)
  assert np.all(np.asarray(out)[0, 200:] == 0)
  assert np.all(np.asarray(grads[0])[0, 200:] == 0)
  want, want_grads = reference_and_grads(
    "rotated", q, k, v, ct, pos, rope, causal=True, seg_q=q_seg, seg_kv=kv_seg
  )
  check("out", out, want, TOL[F32])
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
    check(name, g, w, TOL[F32])


def test_dispatch_checks_the_limits_once():
  rope = rj.Rope(rj.rope_frequencies(D))
  q = k = jax.ShapeDtypeStruct((1, T, 2, D), F32)
  choose = lambda mask, rope=rope, **kw: kernels.choose(
    "fused", q=kw.get("q", q), k=k, mask=mask, rope=rope, bias=kw.get("bias", False)
  )
  assert choose(rj.Mask(ordered=True)) == "fused"
  for mask, rope_, reason in (
    (rj.Mask(), rope, "ordered=True"),
    (rj.Mask(ordered=True, window=8), rope, "window"),
    (rj.Mask(ordered=True), None, "needs a Rope"),
    (rj.Mask(causal=False, ordered=True), rj.Rope(rj.axial_frequencies(D, 2)), "multi-axis"),
  ):
    with pytest.raises(ValueError, match=f"fused' cannot run.*{reason}"):
      choose(mask, rope_)
  with pytest.raises(ValueError, match="multiple of 128"):
    choose(rj.Mask(ordered=True), q=jax.ShapeDtypeStruct((1, 100, 2, D), F32))
  with pytest.raises(ValueError, match="no logit bias"):
    choose(rj.Mask(ordered=True), bias=True)
  # "auto" never picks it, on any platform.
  for where in ("tpu", "gpu", "cpu"):
    assert (
      kernels.choose("auto", q=q, k=k, mask=rj.Mask(ordered=True), rope=rope, platform_name=where)
      != "fused"
    )
  # Attention without rotation cannot take it; the rotary functions name the problem.
  x = jnp.zeros((1, T, 2, D), F32)
  pos = jnp.arange(T)[None]
  with pytest.raises(ValueError, match="needs a Rope"):
    rj.masked_attention(x, x, x, q_positions=pos, kv_positions=pos, kernel="fused")
  with pytest.raises(ValueError, match="ordered=True"):
    rj.rove_attention(x, x, x, q_positions=pos, kv_positions=pos, rope=rope, kernel="fused")
  with pytest.raises(ValueError, match="block_size"):
    fused.kernel(100)


def test_gpt_attention_impl_fused():
  """The GPT with attention_impl="fused" (RoVE and RoPE layers) gives the logits of
  attention_impl="xla"; a decoding step (cached, so the xla kernel) still works; a
  non-rotary encoding refuses it."""
  cfg = gpt_config(max_len=128, rove_layers=(0,), n_layer=2)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 128)))
  models = {
    impl: GPT(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))
    for impl in ("fused", "xla")
  }
  got, want = (np.asarray(jax.jit(lambda t, m=m: m(t))(tokens)) for m in models.values())
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  m = models["fused"]
  logits, cache = m(tokens[:, :8], cache=m.init_cache(1, 16))
  np.testing.assert_allclose(logits, want[:, :8], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="rotary pos_encoding"):
    gpt_config(pos_encoding="learned", attention_impl="fused")


def test_sharded_matches_unsharded_with_gradients():
  """Under jax.set_mesh on a (data, fsdp, tensor) = (2, 1, 2) mesh the kernel runs in
  shard_map (batch over data, query and kv heads over tensor) and gives the unsharded RoVE
  output and gradients of q, k and v, packed documents and GQA included."""
  from rove_jax.train import sharding

  q, k, v, ct = inputs(2, 4, 2, F32, seed=5)
  seg, pos = documents(2, (100, 60, 96))
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, "interleaved")
  mask = rj.Mask(causal=True, segment_ids=jnp.asarray(seg), ordered=True)
  want_out, want_grads = fused_and_grads("rove", q, k, v, ct, jnp.asarray(pos), rope, mask)
  with jax.set_mesh(sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])):
    f = lambda q: rj.rove_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rope, mask=mask, kernel="fused"
    )
    assert "shard_map" in str(jax.make_jaxpr(f)(q))
    out, grads = fused_and_grads("rove", q, k, v, ct, jnp.asarray(pos), rope, mask)
  # a shard holds half the heads, so the CPU's batched matmuls may sum in another order:
  # equal up to float32 rounding, relative to the largest value (the reference tolerance)
  for name, g, w in zip(("out", "dq", "dk", "dv"), (out, *grads), (want_out, *want_grads)):
    check(f"sharded {name}", g, np.asarray(w, np.float64), TOL[F32])


def _pallas_costs(jaxpr) -> list:
  """(cost_estimate, bytes of the operands and results) of every pallas_call in a jaxpr."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "pallas_call":
      sizes = [np.prod(a.aval.shape) * a.aval.dtype.itemsize for a in eqn.invars + eqn.outvars]
      found.append((eqn.params["cost_estimate"], int(sum(sizes))))
    for p in eqn.params.values():
      inner = getattr(p, "jaxpr", None)
      if inner is not None:
        found += _pallas_costs(getattr(inner, "jaxpr", inner))
  return found


def test_cost_estimate_follows_the_documented_formula():
  """The forward pass's pl.CostEstimate for RoVE, B=1, H=2, K=1, T=S=256, D=64, blocks of 128,
  causal (3 of the 4 block pairs run), worked by hand from the formula in the module
  docstring; the backward's two calls count their operands and results once as well."""
  B, H, K = 1, 2, 1
  q, k, v, _ = inputs(B, H, K, F32, seed=0)
  pos = jnp.arange(T)[None]
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, "interleaved")
  attend = fused.kernel(128)
  f = lambda q, k, v: direct(
    attend, q, k, v, rj.Mask(causal=True, ordered=True), pos, rope, "rove"
  ).sum()
  ((forward, forward_bytes),) = _pallas_costs(jax.make_jaxpr(f)(q, k, v).jaxpr)
  scores = B * H * 3 * 128 * 128  # block pairs that run x block size
  rotated = 3 * K * 128 * 2 + B * T * H * 2  # k and v each step; q in and the output back
  table_rows = 3 * 128 + B * T * 2  # a kv block's each step; the q block's, twice
  assert forward.flops == 2 * 2 * D * scores + 6 * D * rotated + 3 * D * table_rows
  assert forward.transcendentals == scores + 2 * D * table_rows
  assert forward.bytes_accessed == forward_bytes
  grad = jax.make_jaxpr(jax.grad(f, argnums=(0, 1, 2)))(q, k, v).jaxpr
  costs = _pallas_costs(grad)
  assert len(costs) == 3  # forward (with the softmax statistics), dq, dk/dv
  for cost, size in costs:
    assert cost.bytes_accessed == size
  # dq: 3 products a score (q.k, dO.v, ds.k); k (v) rotated each step, q, dO and dq once a
  # block. dk/dv: 4 (k.q, p.dO, v.dO, ds.q); q and dO each step, k, v, dk and dv once a block.
  dq = 3 * 2 * D * scores + 6 * D * (3 * K * 128 * 2 + B * T * H * 3) + 3 * D * table_rows
  dkv = 4 * 2 * D * scores + 6 * D * (3 * H * 128 * 2 + 2 * B * T * K * 2) + 3 * D * table_rows
  assert sorted(c.flops for c, _ in costs) == sorted([forward.flops, dq, dkv])
