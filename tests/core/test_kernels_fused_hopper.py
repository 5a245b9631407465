"""rove_jax.kernels.fused_hopper (the Pallas Mosaic GPU kernel for Hopper that rotates inside) in
Mosaic GPU interpret mode on CPU, against the float64 references of test_kernels_fused: outputs
and the gradients of q, k and v, in bfloat16 (the kernel's dtype), for RoPE, RoVE and RoVE with
the output left rotated; causal and bidirectional; packed documents; MHA, GQA and MQA; partial
rotary; YaRN's attention factor; both layouts; rows that see no key; a batch of two; each for the
default forward and its multi-warpgroup variants (VARIANTS). One case
runs through rj.rove_attention(kernel="fused") with dispatch seeing a Hopper GPU. Also the limits
dispatch checks for a Hopper target and how it picks the Hopper kernel. On an H100/H200
(bench/gpu_check.sh) the same cases run compiled: FUSED_HOPPER_COMPILED=1 turns interpret off.
Interpreted, a case whose variant has more warpgroups than XLA's CPU pool has threads (a
producer's, on 2 cores) runs in a child process with a pool that fits
(rerun_where_the_pool_fits): with fewer, the interpreter can hang."""

import concurrent.futures
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import kernels
from rove_jax.kernels import fused_hopper, mgpu_interpret, platform
from rove_jax.kernels import fused_hopper_backward_pipe as pipe
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import Plan
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
  "rove_packed_causal_half_gqa_yarn": ("rove", "half", 1, 4, 2, True, (100, 156), 64, True),
  "rope_causal_half_mqa": ("rope", "half", 1, 2, 1, True, None, 64, False),
}
# The bidirectional case with half its heads (two on one kv head), for the two-warpgroup
# backward kernels.
_bidirectional = CASES["rope_packed_bidirectional_half_gqa_partial_yarn"]
CASES["rope_packed_bidirectional_half_mqa_partial_yarn"] = (
  *_bidirectional[:3],
  2,
  1,
  *_bidirectional[5:],
)


# The forward variants (fused_hopper.kernel's arguments): the default, two compute warpgroups
# sharing each rotated key/value block (fused_hopper_ws), and those with a producer warpgroup.
# Each swaps pairs by column slices where the case's rotary allows (the half layout with
# n_rotated / 2 a multiple of 16) and by the swap matrix elsewhere; "_matrix" always by the matrix.
VARIANTS = {
  "1wg": {},
  "2wg": dict(compute_wgs=2),
  "2wg_tma": dict(compute_wgs=2, producer=True),
  "1wg_matrix": dict(slice_swap=False),
  "1wg_bwd2wg": dict(backward_wgs=2),  # dq and dk, dv by two warpgroups sharing each block
  "2wg_bwd2wg": dict(compute_wgs=2, backward_wgs=2),
  "2wg_tma_bwd2wg": dict(compute_wgs=2, producer=True, backward_wgs=2),
  # q, k, v and dO turned in bfloat16 pairs (slices only)
  "1wg_bf16": dict(bf16_turns=True),
  "2wg_bwd2wg_bf16": dict(compute_wgs=2, backward_wgs=2, bf16_turns=True),
  "2wg_tma_bf16": dict(compute_wgs=2, producer=True, bf16_turns=True),  # the producer turns
  # producer warpgroups in the backward kernels too: copying, and (bf16) turning
  "2wg_bwd2wg_bwdtma": dict(compute_wgs=2, backward_wgs=2, backward_producer=True),
  "2wg_tma_bwd2wg_bwdtma_bf16": dict(
    compute_wgs=2, producer=True, backward_wgs=2, backward_producer=True, bf16_turns=True
  ),
}


# A child process that runs one test again (rerun_where_the_pool_fits) has this set.
CHILD = "ROVE_JAX_TEST_HOPPER_POOL_CHILD"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def rerun_where_the_pool_fits(request, options: dict) -> bool:
  """Whether this test was run again, and passed there, in a child process whose XLA CPU pool
  has a thread for each of the variant's warpgroups and one more, because this process's pool
  has fewer threads than the warpgroups. Interpreted, the warpgroups' programs run on that pool
  at once, and blocked on each other's barriers they hold its threads; a jitted call's own
  callback runs on the calling thread, so a pool of as many threads as warpgroups is enough
  here (mgpu_interpret.interpret_pool_problem(jitted=True); bench/RESULTS.md, nineteenth
  session). On 2 cores that is the variants with a producer warpgroup."""
  needed = tiles.warpgroups(options)
  if not INTERPRET or os.environ.get(CHILD):
    return False
  if mgpu_interpret.interpret_pool_problem(needed, jitted=True) is None:
    return False
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CUR"))}
  env.update({"PJRT_NPROC": str(needed + 1), CHILD: "1"})
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # programs no other test compiles
  proc = subprocess.run(
    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
  assert "1 passed" in proc.stdout, proc.stdout[-2000:]
  return True


def hopper_and_grads(
  kind, q, k, v, ct, pos, rope, mask, *, through_dispatch=False, variant="1wg", packed=False
):
  """(out, (dq, dk, dv)) of the Hopper kernel (in interpret mode on CPU), one jitted program.
  packed: q, k, v stacked into one [B, T, 3, H, D] buffer that the kernel reads in place
  (rj.attention.packed_attention; K = H), its gradient split back into dq, dk, dv."""
  attend = fused_hopper.kernel(interpret=INTERPRET, **VARIANTS[variant])
  if packed:
    kw = dict(kind=KIND[kind], q_positions=pos, kv_positions=pos, rope=rope, mask=mask)
    f = lambda qkv: rj.attention.packed_attention(qkv, kernel=attend, **kw)

    def run_packed(qkv):
      out, vjp = jax.vjp(f, qkv)
      (d,) = vjp(jnp.asarray(ct, out.dtype))
      return out, (d[:, :, 0], d[:, :, 1], d[:, :, 2])

    return jax.jit(run_packed)(jnp.stack([q, k, v], axis=2))

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


MHA = "rove_packed_causal_half_mha_partial"
TURNS_BF16 = ("rove_packed_causal_half_gqa_yarn", "rope_causal_half_mqa")  # bf16_turns only
BIDIRECTIONAL_2WG = "rope_packed_bidirectional_half_mqa_partial_yarn"  # two warpgroups only


@pytest.mark.parametrize(
  "case,variant,packed",
  [
    (c, "1wg", c == MHA)
    for c in sorted(set(CASES) - {"rove_causal_interleaved_mqa", BIDIRECTIONAL_2WG, *TURNS_BF16})
  ]
  + [("rove_causal_interleaved_mqa", "2wg", False)]
  + [(MHA, "2wg_tma_bwd2wg_bwdtma_bf16", True)]
  + [(BIDIRECTIONAL_2WG, "2wg_bwd2wg", False)]
  + [
    (MHA, "1wg_bf16", True),
    (TURNS_BF16[0], "2wg_bwd2wg_bf16", False),
    (TURNS_BF16[1], "1wg_bf16", False),
    (TURNS_BF16[1], "2wg_tma_bwd2wg_bwdtma_bf16", False),
  ],
)
def test_matches_float64_reference_with_gradients(request, case, variant, packed):
  """Every case through the one-warpgroup kernels (the third runs through dispatch below) and
  through the two-warpgroup ones: the forward by the swap matrix (MQA, interleaved), with its
  producer by slices (packed RoVE), and with the two-warpgroup backward kernels (packed RoVE by
  slices in bfloat16 pairs, forward and backward with producers that turn, q's pass-through
  dims scaled by the backward's; bidirectional by the matrix; by slices at D = 128 below; the
  two-warpgroup forward without a producer by slices is test_slice_swap's first case). The swap
  matrix where slices would run is the D = 128 test's first case; the tests against the XLA
  kernel below add theirs. The gradients check the logsumexp each forward leaves for the
  backward pass, which swaps pairs as its forward does. The MHA case reads q, k, v in place
  from one [B, T, 3, H, D] buffer (every kernel, one- and two-warpgroup), the others from q, k,
  v of their own. The last three turn q, k, v and dO in bfloat16 pairs (bf16_turns) with the
  key blocks' tables copied: RoVE with pass-through dims, one warpgroup; RoVE fully rotated
  with YaRN's factor in q's scaled tables beside dO's, two warpgroups; RoPE without documents
  (the blocks off the diagonal in their own loop), one warpgroup and two (which halve k's and
  q's rows between them), the two with producer warpgroups that turn each looped block, forward
  and backward (the two-warpgroup backward without a producer, in bfloat16 pairs, is the YaRN
  case's)."""
  if not rerun_where_the_pool_fits(request, VARIANTS[variant]):
    run_case(case, variant=variant, packed=packed)


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


def test_the_gpts_fused_variant_reaches_the_kernel(hopper_target, monkeypatch):
  """model.fused_variant picks the Hopper kernel's arguments (kernels.fused_options) for each
  layer's call: a RoVE GPT with attention_impl=fused in variant bf16 runs
  fused_hopper.kernel(bf16_turns=True), and its logits are those of the same weights through
  the XLA kernel, to bfloat16's tolerance."""
  from flax import nnx

  from rove_jax.nn.model import GPT, GPTConfig

  made, kernel = [], fused_hopper.kernel

  def spied(**kw):
    made.append(kw)
    return kernel(interpret=INTERPRET, **kw)

  monkeypatch.setattr(fused_hopper, "kernel", spied)
  cfg = GPTConfig(
    vocab_size=64,
    n_layer=1,
    n_head=2,
    d_model=2 * D,
    max_len=T // 2,
    dtype="bfloat16",
    attention_impl="fused",
    fused_variant="bf16",
  )
  toks = jnp.asarray(np.random.default_rng(3).integers(0, 64, (1, T // 2)), jnp.int32)
  logits = jax.jit(lambda t: GPT(cfg, rngs=nnx.Rngs(0))(t))(toks)
  want = GPT(cfg.with_kernel("xla"), rngs=nnx.Rngs(0))(toks)
  assert made == [dict(bf16_turns=True)]
  check("logits", logits, np.asarray(jnp.asarray(want, F32), np.float64), TOL[BF16])


@pytest.mark.parametrize(
  "kind,layout,rot_dim,lengths,variant",
  [
    ("rove", "half", 96, (100, 156), "1wg_matrix"),
    ("rove", "interleaved", 128, (100, 156), "1wg"),
    ("rove", "half", 128, (100, 156), "1wg"),
    ("rove", "half", 128, (100, 156), "2wg_bwd2wg"),
    ("rove", "interleaved", 128, None, "2wg_bwd2wg_bwdtma"),
    ("rove", "half", 128, (100, 156), "1wg_bf16"),
  ],
)
def test_head_dim_128_rotates_in_column_pieces(request, kind, layout, rot_dim, lengths, variant):
  """D = 128: every rotation (q, k, v, the output, dO, dq, dk, dv) runs a column piece at a time
  (fused_hopper_rotation): two of 64 columns by the swap matrix, pairs of 32 (r = 64) or 16 (r = 48)
  by slices; the fourth and fifth with the two-warpgroup kernels, forward and backward, whose
  rotations are in place, the fifth's dq with a producer warpgroup that copies each looped key block
  (its dk, dv runs without one at D = 128: fused_hopper_backward_pipe.with_producer); the last
  turning in bfloat16 pairs, its forward with the key blocks' tables copied into one slot. MQA,
  causal, against the float64 reference with gradients. Half layout with 96 rotated dims: pairs (i,
  i + 48) cross the matrix pieces' boundary (each piece's product reads the whole tile) and dims 96
  to 127 pass through; interleaved fully rotated, where each piece's pairs stay within it (a piece's
  product reads the piece's columns only, in place too); over packed documents or not (the
  two-warpgroup kernels' blocks away from the diagonal then run without the mask)."""
  if rerun_where_the_pool_fits(request, VARIANTS[variant]):
    return
  rng = np.random.default_rng(rot_dim)
  q = rng.standard_normal((1, T, 2, 2 * D)) * 2
  k, v = rng.standard_normal((1, T, 1, 2 * D)), rng.standard_normal((1, T, 1, 2 * D))
  ct = rng.standard_normal(q.shape)
  q, k, v = (jnp.asarray(a, BF16) for a in (q, k, v))
  rope = rj.Rope(rj.rope_frequencies(rot_dim), 1.0, layout)
  if lengths is None:
    seg, pos = None, np.arange(T)[None] + 5
  else:
    seg, pos = documents(1, lengths)
  mask = rj.Mask(causal=True, segment_ids=None if seg is None else jnp.asarray(seg), ordered=True)
  out, grads = hopper_and_grads(kind, q, k, v, ct, jnp.asarray(pos), rope, mask, variant=variant)
  want, want_grads = reference_and_grads(
    kind, q, k, v, ct, pos, rope, causal=True, seg_q=seg, seg_kv=seg
  )
  for name, g, w in zip(("out", "dq", "dk", "dv"), (out,) + tuple(grads), (want,) + want_grads):
    check(name, g, w, TOL[BF16])


def against_xla(kw, kind, n, heads, head_dim, n_rotated, lengths, factor=1.0):
  """The Hopper kernel's output (fused_hopper.kernel(**kw)) on bfloat16 q, k, v ([1, n, heads,
  head_dim], one kv head), half layout, causal over packed documents of these lengths, against
  the XLA kernel's in float32 on the same values (shapes the float64 reference does not take;
  the gradients are the shared backward pass's, checked above)."""
  rng = np.random.default_rng(n + head_dim)
  q, k, v = (
    jnp.asarray(rng.standard_normal((1, n, h, head_dim)) * s, BF16)
    for h, s in ((heads, 2), (1, 1), (1, 1))
  )
  seg = jnp.asarray(np.repeat(np.arange(len(lengths)), lengths)[None], jnp.int32)
  pos = jnp.asarray(np.concatenate([np.arange(m) for m in lengths])[None])
  rope = rj.Rope(rj.rope_frequencies(n_rotated), factor, "half")
  mask = rj.Mask(causal=True, segment_ids=seg, ordered=True)
  attend = fused_hopper.kernel(interpret=INTERPRET, **kw)
  hopper = lambda q, k, v: direct(attend, q, k, v, mask, pos, rope, KIND[kind])
  xla = lambda q, k, v: FNS[kind](
    q, k, v, q_positions=pos, kv_positions=pos, rope=rope, mask=mask, kernel="xla"
  )
  got = jax.jit(hopper)(q, k, v)
  want = xla(*(x.astype(F32) for x in (q, k, v)))
  check("out", got, np.asarray(want, np.float64), TOL[BF16])


@pytest.mark.parametrize("variant", ["2wg", "2wg_tma", "2wg_tma_bf16"])
def test_multi_warpgroup_key_pipeline(request, variant):
  """T = S = 384, causal, packed documents: programs read one to three shared key blocks, so
  the double-buffered key/value copies refill a slot (at T = 256 a program reads at most two);
  the output against the XLA kernel in float32. The last has the producer warpgroup turn each
  block before the compute warpgroups see it (fused_hopper_ws.producer_turns)."""
  if not rerun_where_the_pool_fits(request, VARIANTS[variant]):
    against_xla(VARIANTS[variant], "rove", 3 * T // 2, 1, D, D, (150, 130, 104))


@pytest.mark.parametrize(
  "kind,head_dim,n_rotated,producer", [("rove", D, D, False), ("rotated", 2 * D, 2 * D, True)]
)
def test_slice_swap(request, kind, head_dim, n_rotated, producer):
  """slice_swap=True (pairs swapped by column slices, no swap matrix) fully rotated at D = 64 and
  at D = 128 with the producer warpgroup and the output left rotated (the float64 tests above
  have 16-column pieces with pass-through dims, D = 64 with 32 dims rotated and D = 128 with
  96). Against the XLA kernel in float32, with an attention factor."""
  kw = dict(compute_wgs=2, producer=producer, slice_swap=True)
  if not rerun_where_the_pool_fits(request, kw):
    against_xla(kw, kind, T, 2, head_dim, n_rotated, (100, 156), factor=1.3)


def test_bf16_turns_round_as_the_gpu_does():
  """Interpreted, a bfloat16 turn (bf16_turns) rounds as the GPU's mul.bf16x2 and fma.rn.bf16x2
  do: b s rounded to bfloat16, then a c - b s rounded once; here in float64 with each rounding
  emulated, equal in every element. Against exact math (unrounded tables) a turned element
  stays within 2.5 x 2^-8 of its pair's norm, where float32 math rounding once stays within
  2^-8."""
  import ml_dtypes

  from rove_jax.kernels import fused_hopper_rotation as rotation

  bf16 = lambda x: np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
  rng = np.random.default_rng(0)
  a, b = bf16(rng.standard_normal(50_000)), bf16(rng.standard_normal(50_000))
  angle = rng.uniform(0, 1e4, a.shape)
  c, s = bf16(np.cos(angle)), bf16(np.sin(angle))
  turn = jax.jit(lambda *x: rotation._turn_bf16(*(y.astype(BF16) for y in x[:2]), x[2:], True))
  got = [np.asarray(g, np.float64) for g in turn(a, b, jnp.asarray(c, BF16), jnp.asarray(s, BF16))]
  np.testing.assert_array_equal(got[0], bf16(a * c - bf16(b * s)))
  np.testing.assert_array_equal(got[1], bf16(b * c + bf16(a * s)))
  exact = a * np.cos(angle) - b * np.sin(angle)
  norm = np.hypot(a, b)
  assert np.max(np.abs(got[0] - exact) / norm) < 2.5 * 2**-8
  assert np.max(np.abs(bf16(exact) - exact) / norm) < 2**-8


@pytest.mark.parametrize("variant", ["1wg", "2wg_bwd2wg_bwdtma"])
def test_rotated_output_and_rows_without_keys(request, variant):
  """rove_attention_rotated's kind under distinct q/kv segment ids, partial rotary with YaRN,
  interleaved: queries of segment 2 find no key and return 0 with zero gradients into them;
  the rest match the reference. The second through the two-warpgroup kernels, the backward's
  with a producer warpgroup that only copies (float32 turns by the swap matrix)."""
  if rerun_where_the_pool_fits(request, VARIANTS[variant]):
    return
  q, k, v, ct = inputs(1, 1, 1, BF16, seed=11)
  q_seg = np.repeat([0, 1, 2], [100, 100, 56])[None].astype(np.int32)
  kv_seg = np.repeat([0, 1, 0], [50, 106, 100])[None].astype(np.int32)
  pos = np.arange(T)[None]
  rope = yarn_rope(48, "interleaved")
  mask = rj.Mask(
    causal=True, segment_ids=jnp.asarray(q_seg), kv_segment_ids=jnp.asarray(kv_seg), ordered=True
  )
  out, grads = hopper_and_grads(
    "rotated", q, k, v, ct, jnp.asarray(pos), rope, mask, variant=variant
  )
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


def test_multi_warpgroup_limits():
  """compute_wgs, producer and slice_swap take what fused_hopper_ws runs; its lengths are
  checked per call (T, S multiples of 128: two 64-row query blocks, one shared 128-key block),
  and slice_swap's rotary layout (half, n_rotated / 2 a multiple of 16), which bf16_turns
  needs too."""
  for kw, reason in (
    (dict(compute_wgs=3), "compute_wgs must be"),
    (dict(compute_wgs=True), "compute_wgs must be"),
    (dict(compute_wgs=2, block_kv=64), "shares blocks of 128"),
    (dict(producer=True), "producer=True needs compute_wgs=2"),
    (dict(backward_wgs=3), "backward_wgs must be 1 or 2"),
    (dict(backward_producer=True), "backward_producer=True needs backward_wgs=2"),
  ):
    with pytest.raises(ValueError, match=reason):
      fused_hopper.kernel(**kw)
  # The backward producer's share of registers would spill the dk, dv kernel at D = 128 (as
  # compiled for an H200): that kernel runs without one there; dq and D = 64 keep it.
  plan = Plan(True, False, 32, True, True, 64, 64, True, backward_wgs=2, backward_producer=True)
  assert not pipe.with_producer(plan, 2 * D, queries_looped=True).backward_producer
  assert pipe.with_producer(plan, 2 * D, queries_looped=False).backward_producer
  assert pipe.with_producer(plan, D, queries_looped=True).backward_producer
  rope = rj.Rope(rj.rope_frequencies(D))
  attend = fused_hopper.kernel(interpret=True, compute_wgs=2)
  slices = fused_hopper.kernel(interpret=True, slice_swap=True)
  bf16 = fused_hopper.kernel(interpret=True, bf16_turns=True)
  interleaved, partial = (
    rj.Rope(rj.rope_frequencies(D), 1.0, "interleaved"),
    rj.Rope(rj.rope_frequencies(40), 1.0, "half"),
  )
  for T_q, T_kv, kernel_, rope_, reason in (
    (192, 256, attend, rope, "query length T=192.*128"),
    (256, 192, attend, rope, "kv length S=192"),
    (192, 256, fused_hopper.kernel(interpret=True, backward_wgs=2), rope, "T=192.*backward_wgs"),
    (256, 192, fused_hopper.kernel(interpret=True, backward_wgs=2), rope, "S=192.*backward_wgs"),
    (256, 256, slices, interleaved, "slice_swap needs the half layout.*'interleaved'"),
    (256, 256, slices, partial, "slice_swap needs.*n_rotated=40"),
    (256, 256, bf16, interleaved, "bf16_turns=True turns by slices.*'interleaved'"),
    (
      256,
      256,
      fused_hopper.kernel(interpret=True, slice_swap=False, bf16_turns=True),
      rj.Rope(rj.rope_frequencies(D), 1.0, "half"),
      "bf16_turns=True turns by slices: slice_swap=False",
    ),
  ):
    q = jnp.zeros((1, T_q, 1, D), BF16)
    k = jnp.zeros((1, T_kv, 1, D), BF16)
    pos_q, pos_kv = jnp.arange(T_q)[None], jnp.arange(T_kv)[None]
    call = kernels.KernelCall(q, k, k, rj.Mask(ordered=True), pos_q, pos_kv, 0.125, rope=rope_)
    with pytest.raises(ValueError, match=f"fused' cannot run.*{reason}"):
      kernel_.attend(call)


def test_the_packed_buffer_is_split_over_batch_and_heads_under_a_mesh():
  """fused._sharded with packed=True (the Hopper kernel reading q, k, v in place): each device
  gets its batch rows' position rows and its heads' [b, T, 3, h, D] block of the buffer, and the
  result is the unsharded one (8 CPU devices from tests/conftest.py; fewer skip the mesh)."""
  from rove_jax.kernels import fused
  from rove_jax.train import sharding

  B, H = 2, 2
  qkv = jnp.asarray(np.random.default_rng(3).standard_normal((B, T, 3, H, D)), F32)
  rows = jnp.arange(B * T, dtype=F32).reshape(B, 1, T)
  shapes = []

  def run(rows, qkv):  # per device: rows [b, 1, T], qkv [b, T, 3, h, D]
    shapes.append((rows.shape, qkv.shape))
    return qkv[:, :, 0] * 2 + qkv[:, :, 1] - qkv[:, :, 2] + rows[:, 0, :, None, None]

  want = fused._sharded(run, [rows, qkv], B, H, H, packed=True)
  assert shapes == [((B, 1, T), (B, T, 3, H, D))]
  if len(jax.devices()) < 4:
    return
  with jax.set_mesh(sharding.make_mesh(2, 1, 2, devices=jax.devices()[:4])):
    got = jax.jit(lambda r, x: fused._sharded(run, [r, x], B, H, H, packed=True))(rows, qkv)
  assert shapes[-1] == ((1, 1, T), (1, T, 3, 1, D))
  assert got.sharding.spec == jax.sharding.PartitionSpec("data", None, "tensor")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_cpu_pool_a_multi_warpgroup_program_needs_interpreted(monkeypatch):
  """The interpreter runs a program's warpgroups at once, their callbacks on XLA's CPU pool
  beside the call waiting for them; with fewer threads than warpgroups + 1 it can hang (on 2 or
  3 threads, a producer's program now and then: bench/RESULTS.md), which interpret_pool_problem
  says, naming PJRT_NPROC (bench.fused_gpu --interpret refuses then). The pool's size is read as
  XLA reads it: PJRT_NPROC, else NPROC, when a whole number; else the cores."""
  for name in mgpu_interpret.POOL_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  assert mgpu_interpret.cpu_pool_threads() == (cores, "the cores this process may use")
  monkeypatch.setenv("NPROC", "5")
  monkeypatch.setenv("PJRT_NPROC", "four")
  assert mgpu_interpret.cpu_pool_threads() == (5, "NPROC=5")
  monkeypatch.setenv("PJRT_NPROC", "3")
  assert mgpu_interpret.cpu_pool_threads() == (3, "PJRT_NPROC=3")
  assert mgpu_interpret.interpret_pool_problem(1) is None
  assert mgpu_interpret.interpret_pool_problem(2) is None
  problem = mgpu_interpret.interpret_pool_problem(3)
  assert "3 warpgroups at once on XLA's CPU thread pool, which has 3 thread(s) here" in problem
  assert "(PJRT_NPROC=3)" in problem and "Set PJRT_NPROC=4 (or more)" in problem
  assert mgpu_interpret.interpret_pool_problem(3, jitted=True) is None  # a jitted call's
  problem = mgpu_interpret.interpret_pool_problem(4, jitted=True)
  assert "4 warpgroups" in problem and "Set PJRT_NPROC=4 (or more)" in problem


def test_each_warpgroup_program_is_compiled_once_and_run_with_its_own_arguments():
  """The interpreter compiles a warpgroup's program afresh for every warpgroup at every grid
  point; interpret_params puts mgpu_interpret.ProgramCache in its place. Here a program whose
  only effect is a host callback recording its arguments runs from three threads at once, as
  the interpreter's warpgroups do: one compile, and each call sees its own thread id and values
  (nothing of the first call's baked in). Another shape compiles again; past the limit the least
  recently used goes."""
  from jax._src.pallas.mosaic.interpret import thread_map
  from jax.experimental import io_callback

  assert type(mgpu_interpret.interpret_params()).__name__ == "InterpretGPUParams"
  installed = mgpu_interpret.compile_each_program_once()
  assert installed is not None and thread_map._run_jaxpr is installed  # on this jax

  seen = []
  record = lambda i, x: seen.append((int(i), np.asarray(x).tolist()))
  body = lambda i, x: io_callback(record, None, i, x * 2.0)
  program = lambda n: jax.make_jaxpr(body)(jnp.int32(0), np.zeros(n, np.float32))
  cache = mgpu_interpret.ProgramCache(limit=2)
  three = program(3)
  with concurrent.futures.ThreadPoolExecutor(3) as pool:
    runs = [
      pool.submit(cache, three.jaxpr, three.consts, jnp.int32(i), np.full(3, i, np.float32))
      for i in range(3)
    ]
    [r.result() for r in runs]
  jax.effects_barrier()
  assert sorted(seen) == [(i, [2.0 * i] * 3) for i in range(3)]
  assert cache.compiled == 1 and len(cache) == 1
  two, four = program(2), program(4)
  cache(two.jaxpr, two.consts, jnp.int32(7), np.ones(2, np.float32))
  cache(four.jaxpr, four.consts, jnp.int32(8), np.ones(4, np.float32))
  jax.effects_barrier()
  assert seen[-2:] == [(7, [2.0, 2.0]), (8, [2.0] * 4)]
  assert cache.compiled == 3 and len(cache) == 2  # the first program dropped
  cache(three.jaxpr, three.consts, jnp.int32(9), np.zeros(3, np.float32))
  assert cache.compiled == 4
