"""cuDNN over packed documents: the segment descriptors (starts and lengths) and the wiring that
hands them to cuDNN instead of a dense [B, T, S] mask.

No GPU here: the descriptors are checked against a numpy reference, and the wiring against a
stand-in for jax's cuDNN entry point that does what cuDNN is given: jax's own conversion of the
[B, M] descriptors into cuDNN's flat ragged ones (`_fix_seqlen_offsets`, which drops the -1
slots, adds each row's offset in the batch and appends the end), then float64 attention inside
each flat segment, causal within it. A token claimed by two segments is reported: that is how
descriptors that do not match jax's convention corrupt a neighbouring row (its outputs and,
through the same descriptors in the backward pass, its gradients). The GPU itself runs the same
path in bench/gpu_check.sh (tests/core/test_attention.py -k cudnn).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

import rove_jax as rj
from rove_jax.kernels import platform, xla


def runs_reference(seg, M):
  """Per row: the starts of the runs of equal ids and their lengths (at most M), -1 padded."""
  B, T = seg.shape
  offsets, lengths, counts = np.full((B, M + 1), -1), np.full((B, M), -1), []
  for b in range(B):
    starts = [t for t in range(T) if t == 0 or seg[b, t] != seg[b, t - 1]]
    counts.append(len(starts))
    bounds = starts + [T]
    for m in range(min(len(starts), M)):
      offsets[b, m] = bounds[m]
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


def token_strides(q, k) -> tuple[int, int]:
  """(query, key/value) stride of a token in the flat offsets jax's descriptor conversion makes:
  the query's heads x head dim for q; for k and v the same up to jax 0.11 (GQA's forward agreed
  with that reading on an H200 with jax 0.11), the kv heads' from jax 0.12 on. Read off jax's
  own conversion of one row with two one-token segments."""
  with jax.ensure_compile_time_eval():  # also when called while a jit traces
    one, two = jnp.array([[1, 1]]), jnp.array([[0, 1, -1]])
    _, _, q_off, kv_off = cudnn_fa._fix_seqlen_offsets(one, one, two, two, q, k)
    return int(q_off[0, 1]), int(kv_off[0, 1])


def ragged_attention_f64(
  q, k, v, q_seqlen, kv_seqlen, q_offsets, kv_offsets, scale, causal, strides=None
):
  """cuDNN's packed layout on flat descriptors, in float64: segment s holds the tokens from
  offsets[s] / (stride of a token: `strides`, default token_strides) on, seqlen[s] of them, of
  the batch flattened to [B * T]. Returns (out [B, T, H, D] float64, how many segments wrote
  each token [B, T])."""
  B, T, H, D = q.shape
  K = k.shape[2]
  q_stride, kv_stride = token_strides(q, k) if strides is None else strides
  qf, kf, vf = (np.asarray(x, np.float64).reshape(B * T, -1, D) for x in (q, k, v))
  q_seqlen, kv_seqlen, q_offsets, kv_offsets = (
    np.ravel(x) for x in (q_seqlen, kv_seqlen, q_offsets, kv_offsets)
  )  # jax keeps the [B, M] shapes, flat order
  out, writes = np.zeros((B * T, H, D)), np.zeros(B * T, np.int64)
  for s in range(len(q_seqlen)):
    n, m = int(q_seqlen[s]), int(kv_seqlen[s])
    if n <= 0:
      continue
    a, c = int(q_offsets[s]) // q_stride, int(kv_offsets[s]) // kv_stride
    kk = np.repeat(kf[c : c + m], H // K, axis=1)
    vv = np.repeat(vf[c : c + m], H // K, axis=1)
    logits = np.einsum("thd,shd->hts", qf[a : a + n], kk) * scale
    if causal:
      logits = np.where(np.arange(m)[None, None] <= np.arange(n)[None, :, None], logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    out[a : a + n] = np.einsum("hts,shd->thd", p / p.sum(-1, keepdims=True), vv)
    writes[a : a + n] += 1
  return out.reshape(B, T, H, D), writes.reshape(B, T)


def packed_stand_in(calls, writes=None):
  """jax's cuDNN attention on the CPU: jax's descriptor conversion, then the flat segments."""

  def fake(
    q,
    k,
    v,
    bias=None,
    mask=None,
    q_seqlen=None,
    kv_seqlen=None,
    q_offsets=None,
    kv_offsets=None,
    *,
    scale,
    mask_type,
    **_,
  ):
    calls.append(mask_type)
    assert bias is None and mask is None and q_offsets is not None
    flat = cudnn_fa._fix_seqlen_offsets(q_seqlen, kv_seqlen, q_offsets, kv_offsets, q, k)
    causal = mask_type == cudnn_fa.MaskType.PADDING_CAUSAL
    strides = token_strides(q, k)

    def run(q, k, v, *flat):
      out, count = ragged_attention_f64(q, k, v, *flat, scale, causal, strides)
      if writes is not None:
        writes.append(count)
      return out.astype(np.float32)

    out = jax.pure_callback(run, jax.ShapeDtypeStruct(q.shape, jnp.float32), q, k, v, *flat)
    return out.astype(q.dtype)

  return fake


@pytest.fixture
def hopper(monkeypatch):
  """A Hopper GPU as far as rove_jax's kernel choice can tell, and the stand-in for cuDNN:
  returns (mask types of the calls, per-token segment counts of each call)."""
  calls, writes = [], []
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(xla, "cudnn_packs", lambda: True)
  monkeypatch.setattr(cudnn_fa, "dot_product_attention", packed_stand_in(calls, writes))
  return calls, writes


def packed_positions(seg):
  T = seg.shape[1]
  starts = np.maximum.accumulate(
    np.where(np.diff(seg, prepend=-1, axis=1) != 0, np.arange(T), 0), axis=1
  )
  return np.arange(T) - starts  # positions restart in every document, as the pipeline's do


@pytest.mark.parametrize("fn", [rj.rove_attention, rj.rope_attention])
@pytest.mark.parametrize("docs", [1, 2, 4])  # 4 > cudnn_max_segments(64) = 2 in the last row
def test_packed_documents_reach_cudnn_as_starts_and_lengths(fn, docs, hopper, rng):
  B, T, H, K, D = 3, 64, 4, 2, 16
  q, k, v = (jnp.asarray(rng.standard_normal((B, T, n, D)), jnp.bfloat16) for n in (H, K, K))
  seg = random_segments(rng, B, T, min(docs, 2))
  seg[-1] = random_segments(rng, 1, T, docs)[0]
  pos = packed_positions(seg)
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(D)))
  ordered = rj.Mask(segment_ids=seg, ordered=True)
  f = jax.jit(lambda q, k, v: fn(q, k, v, kernel="cudnn", mask=ordered, **kw))
  hlo = f.lower(q, k, v).as_text()
  assert f"pred[{B},{T},{T}]" not in hlo and f"pred[{B},1,{T},{T}]" not in hlo  # no dense mask
  calls, writes = hopper
  assert calls and set(calls) == {cudnn_fa.MaskType.PADDING_CAUSAL}
  want = np.asarray(
    fn(
      *(x.astype(jnp.float32) for x in (q, k, v)),
      kernel="reference",
      mask=rj.Mask(segment_ids=seg),
      **kw,
    )
  )
  got = np.asarray(f(q, k, v), np.float32)
  fits = docs <= xla.cudnn_max_segments(T)
  assert writes[-1].max() == 1  # no token in two segments
  np.testing.assert_allclose(got[:-1], want[:-1], atol=3e-2)
  if fits:
    np.testing.assert_allclose(got[-1], want[-1], atol=3e-2)
  else:  # too many documents to describe: NaN, never a wrong number
    assert np.isnan(got[-1]).all()
  if docs > 1:  # the stand-in is not vacuous: ignoring the segments changes the result
    plain = fn(*(x.astype(jnp.float32) for x in (q, k, v)), kernel="reference", **kw)
    assert float(jnp.max(jnp.abs(plain[0] - want[0]))) > 0.3


@pytest.mark.parametrize("docs", [[3, 1, 4], [2, 9, 3], [1, 1, 1], [4, 2, 1]])
def test_each_row_keeps_its_own_tokens_in_cudnns_flat_layout(docs, hopper, rng):
  """The rows of one batch become cuDNN's flat segments without overlap, whatever the rows
  before them hold (one document, several, or more than the layout takes: [2, 9, 3] has a
  cut-off row in the middle): every token of a row that fits is written once, by its own
  document, and equals the float64 reference of the same packing."""
  B, T, H, K, D = 3, 64, 4, 2, 16
  M = xla.cudnn_max_segments(T)
  q, k, v = (jnp.asarray(rng.standard_normal((B, T, n, D)), jnp.bfloat16) for n in (H, K, K))
  seg = np.concatenate([random_segments(rng, 1, T, n) for n in docs])
  pos = packed_positions(seg)
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(D)))
  got = np.asarray(
    jax.jit(
      lambda q, k, v: rj.rove_attention(
        q, k, v, kernel="cudnn", mask=rj.Mask(segment_ids=seg, ordered=True), **kw
      )
    )(q, k, v),
    np.float64,
  )
  want = np.asarray(
    rj.rove_attention(
      *(x.astype(jnp.float32) for x in (q, k, v)),
      kernel="reference",
      mask=rj.Mask(segment_ids=seg),
      **kw,
    )
  )
  _, writes = hopper
  for b, n in enumerate(docs):
    if n <= M:
      assert (writes[-1][b] == 1).all(), (b, writes[-1][b])
      np.testing.assert_allclose(got[b], want[b], atol=3e-2)
    else:
      assert np.isnan(got[b]).all() and writes[-1][b].max() <= 1


def test_an_end_entry_in_the_offsets_would_overlap_the_next_row(rng):
  """The check above can fail: descriptors with each row's end T after its starts (the layout
  before this fix) make cuDNN's flat segments of the second row start on the first's tokens
  (the wrong gradients an H200 showed, row 1 token 0)."""
  B, T, H, D, M = 3, 16, 2, 8, 4
  q = jnp.asarray(rng.standard_normal((B, T, H, D)), jnp.bfloat16)
  seg = np.concatenate([random_segments(rng, 1, T, n) for n in (3, 1, 2)])
  offsets, lengths, count = (np.asarray(x) for x in xla.segment_runs(seg, M))
  with_end = offsets.copy()
  with_end[np.arange(B), count] = T
  for offs, overlaps in ((offsets, False), (with_end, True)):
    flat = cudnn_fa._fix_seqlen_offsets(
      *(jnp.asarray(x) for x in (lengths, lengths, offs, offs)), q, q
    )
    _, writes = ragged_attention_f64(q, q, q, *(np.asarray(x) for x in flat), 1.0, True)
    assert (writes.max() > 1) == overlaps


def test_packed_path_needs_hopper_and_one_set_of_segments(monkeypatch, rng):
  """Before Hopper, with separate query and key segments, or with a bias, the dense mask."""
  monkeypatch.setattr(platform, "target_platform", lambda: "gpu")
  monkeypatch.setattr(cudnn_fa, "dot_product_attention", packed_stand_in([]))
  seen = []
  monkeypatch.setattr(
    jax.nn,
    "dot_product_attention",
    lambda q, k, v, mask=None, **kw: seen.append(mask) or jnp.zeros_like(q),
  )
  q = jnp.zeros((1, 16, 2, 8), jnp.bfloat16)
  seg = np.repeat([[0, 1]], 8, axis=1)
  pos = np.arange(16)[None]
  kw = dict(q_positions=pos, kv_positions=pos, rope=rj.Rope(rj.rope_frequencies(8)), kernel="cudnn")
  monkeypatch.setattr(xla, "cudnn_packs", lambda: False)
  rj.rope_attention(q, q, q, mask=rj.Mask(segment_ids=seg, ordered=True), **kw)
  monkeypatch.setattr(xla, "cudnn_packs", lambda: True)
  rj.rope_attention(
    q, q, q, mask=rj.Mask(segment_ids=seg, kv_segment_ids=seg.copy(), ordered=True), **kw
  )
  rj.masked_attention(
    q,
    q,
    q,
    q_positions=pos,
    kv_positions=pos,
    kernel="cudnn",
    mask=rj.Mask(segment_ids=seg, ordered=True),
    bias_fn=lambda q_pos, kv_pos: jnp.zeros((1, 2, 16, 16)),
  )
  assert len(seen) == 3 and all(m is not None and m.shape == (1, 1, 16, 16) for m in seen)
