"""cuDNN over packed documents: the segment descriptors (starts and lengths) and the wiring that
hands them to cuDNN instead of a dense [B, T, S] mask.

No GPU here: the descriptors are checked against a numpy reference, and the wiring against a
stand-in for jax's cuDNN entry point that applies the packed layout as jax documents it (a
token of row b belongs to slot m when offsets[b, m] <= t < offsets[b, m] + lengths[b, m];
PADDING_CAUSAL masks across slots and above the diagonal). The GPU itself runs the same path in
bench/gpu_check.sh (tests/core/test_attention.py -k cudnn).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

import rove_jax as rj
from rove_jax.kernels import platform, reference, xla


def runs_reference(seg, M):
  """Per row: the starts of the runs of equal ids, then T, and the runs' lengths, -1 padded."""
  B, T = seg.shape
  offsets, lengths, counts = np.full((B, M + 1), -1), np.full((B, M), -1), []
  for b in range(B):
    starts = [t for t in range(T) if t == 0 or seg[b, t] != seg[b, t - 1]]
    counts.append(len(starts))
    bounds = (starts + [T])[:M + 1]
    offsets[b, :len(bounds)] = bounds
    for m in range(min(len(starts), M)):
      lengths[b, m] = bounds[m + 1] - bounds[m]
  return offsets, lengths, np.array(counts)


def random_segments(rng, B, T, docs):
  """Rows of `docs` contiguous documents of random lengths (ids as the pipeline makes them)."""
  rows = []
  for _ in range(B):
    cuts = np.sort(rng.choice(np.arange(1, T), size=docs - 1, replace=False))
    rows.append(np.searchsorted(cuts, np.arange(T), side="right"))
  return np.array(rows, np.int32)


@pytest.mark.parametrize("docs, M", [(1, 4), (3, 4), (4, 4), (7, 4), (5, 8)])
def test_segment_runs_match_a_reference(docs, M, rng):
  seg = random_segments(rng, 3, 40, docs)
  seg[0] = np.sort(rng.integers(0, 3, 40))  # ids need not start at 0 or be consecutive
  got = [np.asarray(x) for x in jax.jit(xla.segment_runs, static_argnums=1)(seg, M)]
  for a, b in zip(got, runs_reference(seg, M)):
    np.testing.assert_array_equal(a, b)


def packed_stand_in(calls):
  """jax's cuDNN attention, as its docstring specifies the packed layout, on the CPU."""
  def fake(q, k, v, bias=None, mask=None, q_seqlen=None, kv_seqlen=None, q_offsets=None,
           kv_offsets=None, *, scale, mask_type, **_):
    calls.append(mask_type)
    assert bias is None and mask is None and q_offsets is not None
    T = q.shape[1]
    t = jnp.arange(T)[None, None, :]
    start, length = q_offsets[:, :-1, None], q_seqlen[:, :, None]
    in_slot = (start <= t) & (t < start + length) & (length > 0)  # [B, M, T]
    slot = jnp.where(in_slot.any(1), jnp.argmax(in_slot, axis=1), -1)  # [B, T]
    mask = (slot[:, :, None] == slot[:, None, :]) & (slot[:, :, None] >= 0)
    if mask_type == cudnn_fa.MaskType.PADDING_CAUSAL:
      mask = mask & (t <= jnp.arange(T)[None, :, None])
    return reference.softmax_attention(q, k, v, mask, scale)
  return fake


@pytest.fixture
def hopper(monkeypatch):
  """A Hopper GPU as far as rove_jax's kernel choice can tell, and the stand-in for cuDNN."""
  calls = []
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(xla, "cudnn_packs", lambda: True)
  monkeypatch.setattr(cudnn_fa, "dot_product_attention", packed_stand_in(calls))
  return calls


@pytest.mark.parametrize("fn", [rj.rove_attention, rj.rope_attention])
@pytest.mark.parametrize("docs", [1, 2, 4])  # 4 > cudnn_max_segments(64) = 2 in the last row
def test_packed_documents_reach_cudnn_as_starts_and_lengths(fn, docs, hopper, rng):
  B, T, H, K, D = 3, 64, 4, 2, 16
  q, k, v = (jnp.asarray(rng.standard_normal((B, T, n, D)), jnp.bfloat16) for n in (H, K, K))
  seg = random_segments(rng, B, T, min(docs, 2))
  seg[-1] = random_segments(rng, 1, T, docs)[0]
  starts = np.maximum.accumulate(np.where(np.diff(seg, prepend=-1, axis=1) != 0,
                                          np.arange(T), 0), axis=1)
  pos = np.arange(T) - starts  # positions restart in every document, as the pipeline's do
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(D)))
  ordered = rj.Mask(segment_ids=seg, ordered=True)
  f = jax.jit(lambda q, k, v: fn(q, k, v, kernel="cudnn", mask=ordered, **kw))
  hlo = f.lower(q, k, v).as_text()
  assert f"pred[{B},{T},{T}]" not in hlo and f"pred[{B},1,{T},{T}]" not in hlo  # no dense mask
  assert hopper and set(hopper) == {cudnn_fa.MaskType.PADDING_CAUSAL}
  want = np.asarray(fn(*(x.astype(jnp.float32) for x in (q, k, v)), kernel="reference",
                       mask=rj.Mask(segment_ids=seg), **kw))
  got = np.asarray(f(q, k, v), np.float32)
  fits = docs <= xla.cudnn_max_segments(T)
  np.testing.assert_allclose(got[:-1], want[:-1], atol=3e-2)
  if fits:
    np.testing.assert_allclose(got[-1], want[-1], atol=3e-2)
  else:  # too many documents to describe: NaN, never a wrong number
    assert np.isnan(got[-1]).all()
  if docs > 1:  # the stand-in is not vacuous: ignoring the segments changes the result
    plain = fn(*(x.astype(jnp.float32) for x in (q, k, v)), kernel="reference", **kw)
    assert float(jnp.max(jnp.abs(plain[0] - want[0]))) > 0.3


def test_packed_path_needs_hopper_and_one_set_of_segments(monkeypatch, rng):
  """Before Hopper, with separate query and key segments, or with a bias, the dense mask."""
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(cudnn_fa, "dot_product_attention", packed_stand_in([]))
  seen = []
  monkeypatch.setattr(jax.nn, "dot_product_attention", lambda q, k, v, mask=None, **kw:
                      seen.append(mask) or jnp.zeros_like(q))
  q = jnp.zeros((1, 16, 2, 8), jnp.bfloat16)
  seg = np.repeat([[0, 1]], 8, axis=1)
  pos = np.arange(16)[None]
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(8)),
            kernel="cudnn")
  monkeypatch.setattr(xla, "cudnn_packs", lambda: False)
  rj.rope_attention(q, q, q, mask=rj.Mask(segment_ids=seg, ordered=True), **kw)
  monkeypatch.setattr(xla, "cudnn_packs", lambda: True)
  rj.rope_attention(q, q, q, mask=rj.Mask(segment_ids=seg, kv_segment_ids=seg.copy(),
                                          ordered=True), **kw)
  rj.masked_attention(q, q, q, q_positions=pos, kv_positions=pos, kernel="cudnn",
                      mask=rj.Mask(segment_ids=seg, ordered=True),
                      bias_fn=lambda q_pos, kv_pos: jnp.zeros((1, 2, 16, 16)))
  assert len(seen) == 3 and all(m is not None and m.shape == (1, 1, 16, 16) for m in seen)
