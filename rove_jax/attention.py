"""RoPE and RoVE attention as pure functions over explicit positions.

Shape letters:
  B batch   T query length   S key/value length   H query heads   K key/value heads
  G = H // K query heads per kv head (GQA/MQA)   D head dim   P rotary pairs (2P <= D)

RoPE:  y_i = sum_j A_ij v_j,                A_ij = softmax_j(c^2 (R_i q_i).(R_j k_j) / sqrt(D))
RoVE:  y_i = R_i^-1 sum_j A_ij R_j v_j  =  sum_j A_ij R_{j-i} v_j   (an attentive convolution)

c is the attention factor (YaRN's temperature); it scales the logits only. The value and output
rotations are pure rotations in both cases.

Positions are the only source of truth: kv j is visible to query i iff
kv_positions[j] <= q_positions[i] (causal), segment ids are equal (packing) and kv_mask[j] is
set (cache slots). The same code therefore serves training, packed sequences, KV-cache decoding,
sliding-window evaluation and YaRN. A query that sees no key returns zeros.
"""

from __future__ import annotations

import functools
import math
from typing import Union

import jax
import jax.numpy as jnp

from rove_jax import rotary

IMPLEMENTATIONS = ("xla", "cudnn", "chunked", "reference")

SegmentIds = Union[jax.Array, tuple[jax.Array, jax.Array], None]


# ------------------------------------------------------------------------------- public API


def rope_attention(q, k, v, *, q_positions, kv_positions, inv_freq: rotary.Frequencies,
                   causal: bool = True, attention_factor=1.0, layout: str = "interleaved",
                   segment_ids: SegmentIds = None, kv_mask=None, implementation: str = "xla",
                   chunk_size: int = 512, kv_prerotated: bool = False) -> jax.Array:
  """Attention with rotary queries and keys (RoPE).

  Args:
    q: [B, T, H, D] queries (before rotation).
    k: [B, S, K, D] keys (before rotation), H % K == 0.
    v: [B, S, K, D] values.
    q_positions: [B, T] positions of the queries (int or float); [B, T, A] with A frequency
      tables for multi-axis RoPE.
    kv_positions: [B, S] (or [B, S, A]) positions of the keys and values.
    inv_freq: frequency table [P] (e.g. from `rope_frequencies` or a `scaling` function), or a
      sequence of A tables.
    causal: mask kv j unless kv_positions[j] <= q_positions[i] (1-D positions only).
    attention_factor: multiplies q and k, i.e. the logits by attention_factor**2 (YaRN).
    layout: rotary pairing, "interleaved" or "half".
    segment_ids: [B, T] when T == S (packed self-attention) or a pair ([B, T], [B, S]); a query
      sees only keys of its own segment.
    kv_mask: [B, S] bool, False for invalid kv slots (e.g. empty cache entries).
    implementation: "xla" (jax.nn.dot_product_attention), "cudnn" (flash attention on a CUDA
      GPU), "chunked" (blockwise online softmax, memory O(T * chunk_size)), "reference"
      (materialized einsum, for tests).
    chunk_size: block length of the "chunked" kernel.
    kv_prerotated: k is already R_{kv_pos} k (for RoVE also v is R_{kv_pos} v), as a KV cache
      stores them; only q (and RoVE's output) are rotated here.

  Returns:
    [B, T, H, D] in q.dtype.
  """
  return _attention(q, k, v, q_positions, kv_positions, inv_freq,
                    mode="rope", causal=causal,
                    attention_factor=attention_factor, layout=layout, segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    kv_prerotated=kv_prerotated)


def rove_attention(q, k, v, *, q_positions, kv_positions, inv_freq: rotary.Frequencies,
                   causal: bool = True, attention_factor=1.0, layout: str = "interleaved",
                   segment_ids: SegmentIds = None, kv_mask=None, implementation: str = "xla",
                   chunk_size: int = 512, kv_prerotated: bool = False) -> jax.Array:
  """Rotary Value Embeddings: RoPE attention whose values are rotated by R_j before the kernel
  and whose output is rotated by R_i^-1 after it, so y_i = sum_j A_ij R_{j-i} v_j.

  Same arguments and shapes as `rope_attention`. The rotations wrap any kernel, so the cuDNN
  flash path and the chunked kernel serve RoVE unchanged.
  """
  return _attention(q, k, v, q_positions, kv_positions, inv_freq,
                    mode="rove", causal=causal,
                    attention_factor=attention_factor, layout=layout, segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    kv_prerotated=kv_prerotated)


def masked_attention(q, k, v, *, q_positions, kv_positions, causal: bool = True,
                     segment_ids: SegmentIds = None, kv_mask=None, bias_fn=None,
                     implementation: str = "xla", chunk_size: int = 512) -> jax.Array:
  """Softmax attention without rotations, masked by positions like the rotary functions.

  For position encodings that act elsewhere (NoPE, learned or sinusoidal absolute embeddings)
  or as a logit bias (T5 relative buckets, ALiBi).

  Args:
    q, k, v, q_positions, kv_positions, causal, segment_ids, kv_mask, implementation,
      chunk_size: as in `rope_attention` (positions [B, T] / [B, S]).
    bias_fn: optional f(q_pos [B, t], kv_pos [B, s]) -> [B, H, t, s] float32 logit bias,
      computed per block by the chunked kernel so no [T, S] array is needed.

  Returns:
    [B, T, H, D] in q.dtype.
  """
  return _attention(q, k, v, q_positions, kv_positions, None, mode="none", causal=causal,
                    attention_factor=1.0, layout="interleaved", segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    bias_fn=bias_fn)


def dot_product_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, *, scale,
                          implementation: str = "xla", chunk_size: int = 512,
                          mask_parts=None, bias_fn=None) -> jax.Array:
  """softmax(scale * q.k + mask) v with GQA, the kernel under both rotary attentions.

  Args:
    q_BTHD, k_BSKD, v_BSKD: already rotated as the caller wants.
    mask_BTS: bool [B, T, S], True where query i may read kv j (rows with no True give 0).
    scale: logit scale.
    implementation: see `rope_attention`.
    mask_parts: the (q_pos, kv_pos, q_seg, kv_seg, kv_mask, causal) pieces the mask is made
      of; the chunked kernel builds its mask per block from them (and needs them), and
      bias_fn reads the positions from them.
    bias_fn: optional f(q_pos, kv_pos) -> [B, H, t, s] logit bias (see `masked_attention`).
  """
  bias = None
  if bias_fn is not None and implementation != "chunked":
    bias = bias_fn(mask_parts[0], mask_parts[1]).astype(jnp.float32)
  if implementation == "reference":
    return _reference_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, bias)
  if implementation in ("xla", "cudnn"):
    return _xla_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, implementation, bias)
  if implementation == "chunked":
    if mask_parts is None:
      raise ValueError("the chunked kernel builds its mask per block: pass mask_parts")
    return _chunked_kernel(q_BTHD, k_BSKD, v_BSKD, mask_parts, scale, chunk_size, bias_fn)
  raise ValueError(f"unknown attention implementation {implementation!r}; expected one of "
                   f"{IMPLEMENTATIONS}")


def attention_mask(q_positions_BT, kv_positions_BS, *, causal: bool = True,
                   segment_ids: SegmentIds = None, kv_mask_BS=None) -> jax.Array:
  """The bool visibility mask [B, T, S] from positions, segments and kv validity."""
  q_seg, kv_seg = _split_segments(segment_ids)
  return _mask_block(q_positions_BT, kv_positions_BS, q_seg, kv_seg, kv_mask_BS, causal)


# ------------------------------------------------------------------------------ internals


def _attention(q, k, v, q_positions, kv_positions, inv_freq, *, mode, causal, attention_factor,
               layout, segment_ids, kv_mask, implementation, chunk_size, kv_prerotated=False,
               bias_fn=None):
  """mode "rope" | "rove" | "none": validation, rotations around the kernel, masks."""
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  same_positions = kv_positions is q_positions
  q_positions = jnp.asarray(q_positions)
  kv_positions = q_positions if same_positions else jnp.asarray(kv_positions)
  rotary_mode = mode != "none"
  multi_axis = rotary_mode and rotary.is_multi_axis(inv_freq)
  _validate(q, k, v, q_positions, kv_positions, inv_freq, causal=causal, layout=layout,
            segment_ids=segment_ids, kv_mask=kv_mask, implementation=implementation,
            chunk_size=chunk_size)
  B, T, H, D = q.shape
  S = k.shape[1]
  pos_tail = q_positions.shape[2:]
  q_pos = jnp.broadcast_to(q_positions, (B, T) + pos_tail)
  kv_pos = q_pos if same_positions else jnp.broadcast_to(kv_positions, (B, S) + pos_tail)

  q_r, k_r, v_r = q, k, v
  if rotary_mode:
    rot = functools.partial(rotary.apply_rotary, layout=layout)
    # One (cos, sin) table per position set, shared by q/output and by k/v.
    q_cos, q_sin = rotary.rotary_tables(q_pos, inv_freq)
    q_r = rot(q, q_cos, q_sin)
    if not kv_prerotated:
      kv_cos, kv_sin = (q_cos, q_sin) if same_positions else rotary.rotary_tables(kv_pos, inv_freq)
      k_r = rot(k, kv_cos, kv_sin)
      v_r = rot(v, kv_cos, kv_sin) if mode == "rove" else v

  if isinstance(attention_factor, jax.Array):
    scale = attention_factor.astype(jnp.float32) ** 2 / math.sqrt(D)
  else:
    scale = float(attention_factor) ** 2 / math.sqrt(D)
  q_seg, kv_seg = _split_segments(segment_ids)
  # Causal masking compares scalar positions; multi-axis positions are for bidirectional use.
  mask_q_pos = q_pos[..., 0] if multi_axis else q_pos
  mask_kv_pos = kv_pos[..., 0] if multi_axis else kv_pos
  parts = (mask_q_pos, mask_kv_pos, q_seg, kv_seg, kv_mask, causal)
  mask = None if implementation == "chunked" else _mask_block(*parts)
  out = dot_product_attention(q_r, k_r, v_r, mask, scale=scale, implementation=implementation,
                              chunk_size=chunk_size, mask_parts=parts, bias_fn=bias_fn)
  if mode == "rove":
    out = rot(out, q_cos, q_sin, inverse=True)
  return out


def _split_segments(segment_ids):
  if segment_ids is None:
    return None, None
  if isinstance(segment_ids, (tuple, list)):
    q_seg, kv_seg = segment_ids
    return jnp.asarray(q_seg), jnp.asarray(kv_seg)
  segment_ids = jnp.asarray(segment_ids)
  return segment_ids, segment_ids


def _mask_block(q_pos_BT, kv_pos_BS, q_seg_BT, kv_seg_BS, kv_mask_BS, causal):
  B, T = q_pos_BT.shape[:2]
  S = kv_pos_BS.shape[1]
  mask = jnp.ones((B, T, S), dtype=bool)
  if causal:
    mask = kv_pos_BS[:, None, :] <= q_pos_BT[:, :, None]
  if q_seg_BT is not None:
    mask = mask & (q_seg_BT[:, :, None] == kv_seg_BS[:, None, :])
  if kv_mask_BS is not None:
    mask = mask & kv_mask_BS.astype(bool)[:, None, :]
  return mask


def _zero_empty_rows(out_BTHD, mask_BTS):
  has_key_BT = jnp.any(mask_BTS, axis=-1)
  return jnp.where(has_key_BT[:, :, None, None], out_BTHD, jnp.zeros((), out_BTHD.dtype))


def _reference_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, bias_BHTS=None):
  """Materialized softmax attention in float32 (float64 if given), the test reference."""
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)
  q_BTKGD = q_BTHD.astype(compute).reshape(B, T, K, H // K, D)
  logits_BKGTS = jnp.einsum("btkgd,bskd->bkgts", q_BTKGD, k_BSKD.astype(compute)) * scale
  if bias_BHTS is not None:
    logits_BKGTS = logits_BKGTS + bias_BHTS.astype(compute).reshape(B, K, H // K, T, S)
  logits_BKGTS = jnp.where(mask_BTS[:, None, None], logits_BKGTS, -jnp.inf)
  row_max = jnp.max(logits_BKGTS, axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  p = jnp.exp(logits_BKGTS - row_max)
  denom = jnp.sum(p, axis=-1, keepdims=True)
  weights = p / jnp.where(denom > 0, denom, 1.0)
  out_BTKGD = jnp.einsum("bkgts,bskd->btkgd", weights, v_BSKD.astype(compute))
  return out_BTKGD.reshape(B, T, H, D).astype(q_BTHD.dtype)


def _xla_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, impl, bias_BHTS=None):
  if bias_BHTS is not None:
    bias_BHTS = bias_BHTS.astype(q_BTHD.dtype)
  out = jax.nn.dot_product_attention(q_BTHD, k_BSKD, v_BSKD, bias=bias_BHTS,
                                     mask=mask_BTS[:, None], scale=scale, implementation=impl)
  return _zero_empty_rows(out, mask_BTS)


def _chunked_kernel(q_BTHD, k_BSKD, v_BSKD, mask_parts, scale, chunk, bias_fn=None):
  """Blockwise attention with an online softmax (flash-attention style) in pure JAX.

  Queries are processed chunk by chunk (lax.map) and, for each, keys chunk by chunk (lax.scan)
  with running max / sum / accumulator in float32, so memory is O(T * chunk) rather than
  O(T * S). Blocks a query chunk cannot see (all keys later than all queries) are skipped.
  """
  q_pos, kv_pos, q_seg, kv_seg, kv_valid, causal = mask_parts
  B, T, H, D = q_BTHD.shape
  S, K = k_BSKD.shape[1], k_BSKD.shape[2]
  G = H // K
  cq, ck = min(chunk, T), min(chunk, S)
  nq, nk = -(-T // cq), -(-S // ck)
  pad_t, pad_s = nq * cq - T, nk * ck - S

  def pad(x, n, value=0):
    if n == 0:
      return x
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, n)
    return jnp.pad(x, widths, constant_values=value)

  kv_valid = jnp.ones((B, S), bool) if kv_valid is None else kv_valid.astype(bool)
  if q_seg is None:
    q_seg, kv_seg = jnp.zeros((B, T), jnp.int32), jnp.zeros((B, S), jnp.int32)
  # Padded keys are invalid; padded queries are computed and dropped.
  k_p, v_p = pad(k_BSKD, pad_s), pad(v_BSKD, pad_s)
  kv_pos_p, kv_seg_p, kv_valid_p = pad(kv_pos, pad_s), pad(kv_seg, pad_s), pad(kv_valid, pad_s, False)
  q_p, q_pos_p, q_seg_p = pad(q_BTHD, pad_t), pad(q_pos, pad_t), pad(q_seg, pad_t)

  def to_blocks(x, n, c):  # [B, n*c, ...] -> [n, B, c, ...]
    return jnp.moveaxis(x.reshape((B, n, c) + x.shape[2:]), 1, 0)

  kb = (to_blocks(k_p, nk, ck), to_blocks(v_p, nk, ck), to_blocks(kv_pos_p, nk, ck),
        to_blocks(kv_seg_p, nk, ck), to_blocks(kv_valid_p, nk, ck))
  compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)

  def one_query_block(args):
    q_bc, qpos_bc, qseg_bc = args
    q_bckgd = q_bc.astype(compute).reshape(B, cq, K, G, D) * scale

    def step(carry, kv_block):
      m, l, acc = carry
      k_b, v_b, kpos_b, kseg_b, kval_b = kv_block
      mask = _mask_block(qpos_bc, kpos_b, qseg_bc, kseg_b, kval_b, causal)  # [B, cq, ck]

      def compute_block(_):
        s = jnp.einsum("bckgd,bskd->bkgcs", q_bckgd, k_b.astype(compute))
        if bias_fn is not None:
          s = s + bias_fn(qpos_bc, kpos_b).astype(compute).reshape(B, K, G, cq, ck)
        s = jnp.where(mask[:, None, None], s, -jnp.inf)
        # The running max only stabilises exp(); the result does not depend on it, so it is a
        # constant for autodiff (all of it, or the rescaling terms would not cancel).
        m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(s, axis=-1)))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.exp(s - m_safe[..., None])
        correction = jnp.exp(m - m_safe)
        l_new = l * correction + jnp.sum(p, axis=-1)
        acc_new = acc * correction[..., None] + jnp.einsum("bkgcs,bskd->bkgcd", p,
                                                           v_b.astype(compute))
        return m_new, l_new, acc_new

      if causal:
        # Skip blocks in which every key is later than every query (about half of them).
        visible = jnp.any(mask)
        new = jax.lax.cond(visible, compute_block, lambda _: (m, l, acc), None)
      else:
        new = compute_block(None)
      return new, None

    init = (jnp.full((B, K, G, cq), -jnp.inf, compute), jnp.zeros((B, K, G, cq), compute),
            jnp.zeros((B, K, G, cq, D), compute))
    (m, l, acc), _ = jax.lax.scan(step, init, kb)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # rows that saw nothing stay 0
    return jnp.moveaxis(out, 3, 1).reshape(B, cq, H, D)  # [B,K,G,c,D] -> [B,c,K,G,D]

  qb = (to_blocks(q_p, nq, cq), to_blocks(q_pos_p, nq, cq), to_blocks(q_seg_p, nq, cq))
  out_nBcHD = jax.lax.map(one_query_block, qb)
  out = jnp.moveaxis(out_nBcHD, 0, 1).reshape(B, nq * cq, H, D)[:, :T]
  return out.astype(q_BTHD.dtype)


def _validate(q, k, v, q_positions, kv_positions, inv_freq, *, causal, layout, segment_ids,
              kv_mask, implementation, chunk_size):
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"unknown attention implementation {implementation!r}; expected one of "
                     f"{IMPLEMENTATIONS}")
  rotary._check_layout(layout)
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f"q, k, v must be [B, T, H, D], [B, S, K, D], [B, S, K, D]; got shapes "
                     f"{q.shape}, {k.shape}, {v.shape}")
  B, T, H, D = q.shape
  if k.shape != v.shape:
    raise ValueError(f"k and v must have the same shape [B, S, K, D], got {k.shape} and {v.shape}")
  if k.shape[0] != B or k.shape[3] != D:
    raise ValueError(f"k {k.shape} must share batch B={B} and head dim D={D} with q {q.shape}")
  K = k.shape[2]
  if H % K:
    raise ValueError(f"query heads H={H} must be a multiple of kv heads K={K} (GQA groups "
                     f"query head h onto kv head h // (H / K))")
  n_pairs = 0 if inv_freq is None else rotary.n_frequencies(inv_freq)
  if 2 * n_pairs > D:
    raise ValueError(f"{n_pairs} rotary frequencies need 2 * {n_pairs} = {2 * n_pairs} dims but "
                     f"the head dimension D is {D}; use a shorter table (partial rotary)")
  S = k.shape[1]
  multi = inv_freq is not None and rotary.is_multi_axis(inv_freq)
  tail = (len(inv_freq),) if multi else ()
  for name, pos, n in (("q_positions", q_positions, T), ("kv_positions", kv_positions, S)):
    want = (B, n) + tail
    if pos.shape != want and pos.shape != (n,) + tail and pos.shape != (1, n) + tail:
      raise ValueError(f"{name} must have shape {want} (or {(n,) + tail}), got {pos.shape}")
  if multi and causal:
    raise ValueError("causal masking needs 1-D positions; multi-axis (image/video) positions "
                     "are for bidirectional attention: pass causal=False")
  q_seg, kv_seg = _split_segments(segment_ids)
  if q_seg is not None and (q_seg.shape != (B, T) or kv_seg.shape != (B, S)):
    raise ValueError(f"segment_ids must be [B, T] = {(B, T)} (self-attention) or a pair "
                     f"([B, T], [B, S]) = ({(B, T)}, {(B, S)}); got {q_seg.shape}, {kv_seg.shape}")
  if kv_mask is not None and jnp.shape(kv_mask) != (B, S):
    raise ValueError(f"kv_mask must be [B, S] = {(B, S)}, got {jnp.shape(kv_mask)}")
  if implementation == "cudnn":
    if jax.default_backend() != "gpu":
      raise ValueError(f"implementation='cudnn' needs a CUDA GPU but JAX's backend here is "
                       f"{jax.default_backend()!r}; use 'xla' or 'chunked'")
    if q.dtype not in (jnp.bfloat16, jnp.float16):
      raise ValueError(f"implementation='cudnn' runs in bfloat16/float16, got q.dtype={q.dtype}; "
                       f"cast q, k, v (e.g. the model's dtype='bfloat16')")
  if implementation == "chunked" and not (isinstance(chunk_size, int) and chunk_size > 0):
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
