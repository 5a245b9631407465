"""rove_jax.kernels.fused_hopper (the Pallas Mosaic GPU kernel for Hopper that rotates inside) in
Mosaic GPU interpret mode on CPU, against the float64 references of test_kernels_fused: outputs
and the gradients of q, k and v, in bfloat16 (the kernel's dtype), for RoPE, RoVE and RoVE with
the output left rotated; causal and bidirectional; packed documents; MHA, GQA and MQA; partial
rotary; YaRN's attention factor; both layouts; rows that see no key; a batch of two. One case
runs through rj.rove_attention(kernel="fused") with dispatch seeing a Hopper GPU. Also the limits
dispatch checks for a Hopper target and how it picks the Hopper kernel. On an H100/H200
(bench/gpu_check.sh) the same cases run compiled: FUSED_HOPPER_COMPILED=1 turns interpret off."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import kernels
from rove_jax.kernels import fused_hopper, platform
from tests.core.test_kernels_fused import (
  BF16,
  F32,
  FNS,
  TOL,
  D,
  T,
  check,
  direct,
  documents,
  inputs,
  reference_and_grads,
  yarn_rope,
)

INTERPRET = os.environ.get("FUSED_HOPPER_COMPILED") != "1"
KIND = {"rope": "rope", "rove": "rove", "rotated": "rove_rotated"}
CASES = {
  # name: (kind, layout, B, H, K, causal, document lengths, rotary dims, yarn)
  "rove_causal_interleaved_mqa": ("rove", "interleaved", 1, 2, 1, True, None, 64, False),
  "rope_packed_bidirectional_half_gqa_partial_yarn": (
    "rope",
    "half",
    1,
    4,
    2,
    False,
    (31, 150, 75),
    48,
    True,
  ),
  "rove_packed_causal_half_mha_partial": ("rove", "half", 2, 1, 1, True, (100, 60, 96), 32, False),
}


def hopper_and_grads(kind, q, k, v, ct, pos, rope, mask, *, through_dispatch=False):
  """(out, (dq, dk, dv)) of the Hopper kernel (in interpret mode on CPU), one jitted program."""
  attend = fused_hopper.kernel(interpret=INTERPRET)

  def f(q, k, v):
    if through_dispatch:
      return FNS[kind](
        q, k, v, q_positions=pos, kv_positions=pos, rope=rope, mask=mask, kernel="fused"
      )
    return direct(attend, q, k, v, mask, pos, rope, KIND[kind])

  def run(q, k, v):
    out, vjp = jax.vjp(f, q, k, v)
    return out, vjp(jnp.asarray(ct, out.dtype))

  return jax.jit(run)(q, k, v)


@pytest.fixture
def hopper_target(monkeypatch):
  """dispatch sees a Hopper GPU, and its Hopper kernel runs interpreted (on CPU)."""
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(platform, "gpu_is_hopper", lambda: True)
  monkeypatch.setattr(fused_hopper, "attend", fused_hopper.kernel(interpret=INTERPRET).attend)


def run_case(case, **kw):
  kind, layout, B, H, K, causal, lengths, rot_dim, yarn = CASES[case]
  q, k, v, ct = inputs(B, H, K, BF16, seed=len(case))
  rope = yarn_rope(rot_dim, layout) if yarn else rj.Rope(rj.rope_frequencies(rot_dim), 1.0, layout)
  if lengths is None:
    seg, pos = None, np.broadcast_to(7 + np.arange(T), (B, T))  # positions are not indices
  else:
    seg, pos = documents(B, lengths)
  mask = rj.Mask(causal=causal, segment_ids=None if seg is None else jnp.asarray(seg), ordered=True)
  out, grads = hopper_and_grads(kind, q, k, v, ct, jnp.asarray(pos), rope, mask, **kw)
  assert out.dtype == BF16 and all(g.dtype == BF16 for g in grads)
  want, want_grads = reference_and_grads(
    kind, q, k, v, ct, pos, rope, causal=causal, seg_q=seg, seg_kv=seg
  )
  check("out", out, want, TOL[BF16])
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
    check(name, g, w, TOL[BF16])


@pytest.mark.parametrize("case", sorted(set(CASES) - {"rove_causal_interleaved_mqa"}))
def test_matches_float64_reference_with_gradients(case):
  run_case(case)


def test_rove_attention_dispatches_to_it_on_hopper(hopper_target):
  """rj.rove_attention(kernel="fused") on a Hopper target runs this kernel (the dispatch
  path), and matches the reference."""
  calls = []
  interpreted = fused_hopper.attend

  def counted(call):
    calls.append(call.kind)
    return interpreted(call)

  fused_hopper.attend = counted
  run_case("rove_causal_interleaved_mqa", through_dispatch=True)
  assert calls == ["rove"]


def test_rotated_output_and_rows_without_keys():
  """rove_attention_rotated's kind under distinct q/kv segment ids, partial rotary with YaRN,
  interleaved: queries of segment 2 find no key and return 0 with zero gradients into them;
  the rest match the reference."""
  q, k, v, ct = inputs(1, 1, 1, BF16, seed=11)
  q_seg = np.repeat([0, 1, 2], [100, 100, 56])[None].astype(np.int32)
  kv_seg = np.repeat([0, 1, 0], [50, 106, 100])[None].astype(np.int32)
  pos = np.arange(T)[None]
  rope = yarn_rope(48, "interleaved")
  mask = rj.Mask(
    causal=True, segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg), ordered=True
  )
  out, grads = hopper_and_grads("rotated", q, k, v, ct, jnp.asarray(pos), rope, mask)
  assert np.all(np.asarray(out, np.float32)[0, 200:] == 0)
  assert np.all(np.asarray(grads[0], np.float32)[0, 200:] == 0)
  want, want_grads = reference_and_grads(
    "rotated", q, k, v, ct, pos, rope, causal=True, seg_q=q_seg, seg_kv=kv_seg
  )
  check("out", out, want, TOL[BF16])
  for name, g, w in zip(("dq", "dk", "dv"), grads, want_grads):
    check(name, g, w, TOL[BF16])


def test_dispatch_checks_the_hopper_limits(monkeypatch):
  rope = rj.Rope(rj.rope_frequencies(D))
  shape = lambda T_, D_=D, dtype=BF16: jax.ShapeDtypeStruct((1, T_, 2, D_), dtype)
  choose = lambda q, mask=rj.Mask(ordered=True), rope=rope: kernels.choose(
    "fused", q=q, k=q, mask=mask, rope=rope, platform_name="gpu"
  )
  if jax.default_backend() == "cpu":
    assert not platform.gpu_is_hopper()
  monkeypatch.setattr(platform, "gpu_is_hopper", lambda: True)
  assert choose(shape(192)) == "fused"
  with pytest.raises(ValueError, match="fused' cannot run.*bfloat16.*'cudnn'"):
    choose(shape(128, dtype=F32))
  with pytest.raises(ValueError, match="multiple of 64"):
    choose(shape(160))
  with pytest.raises(ValueError, match="head dim D=32"):
    choose(shape(128, 32), rope=rj.Rope(rj.rope_frequencies(32)))
  for mask, rope_, reason in (
    (rj.Mask(), rope, "ordered=True"),
    (rj.Mask(ordered=True, window=8), rope, "window"),
    (rj.Mask(ordered=True), None, "needs a Rope"),
  ):
    with pytest.raises(ValueError, match=f"fused' cannot run.*{reason}"):
      choose(shape(128), mask=mask, rope=rope_)
  # Other GPUs keep the Triton kernel, whose limits differ (lengths in multiples of 16, float32).
  monkeypatch.setattr(platform, "gpu_is_hopper", lambda: False)
  assert choose(shape(144, dtype=F32)) == "fused"
  for bad in (96, 256, True):
    with pytest.raises(ValueError, match="block_kv"):
      fused_hopper.kernel(bad)
