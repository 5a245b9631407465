"""The bare attention kernels under rove_jax.attention: softmax(scale * q.k + bias) v over a
visibility mask, with GQA. Inputs are already rotated; rows that see no key give zeros.

  mask_block       the bool [B, T, S] mask from positions, segments and kv validity
  reference_kernel materialised einsum in float32 (float64 if given), the test reference
  xla_kernel       jax.nn.dot_product_attention, "xla" or "cudnn" (dense mask, or cuDNN's own
                   causal mask when positions are ordered and nothing else masks)
  cudnn_packed_kernel  cuDNN flash attention over packed documents: segment starts and lengths
                   (the packed layout cuDNN reads), no [B, T, S] array
  segment_runs     those starts and lengths from segment ids [B, T]
  chunked_kernel   blockwise online softmax in pure JAX, memory O(T * chunk)

The TPU flash kernel lives in rove_jax.splash; rove_jax.attention chooses among them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mask_block(q_pos_BT, kv_pos_BS, q_seg_BT, kv_seg_BS, kv_mask_BS, causal):
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


def zero_empty_rows(out_BTHD, mask_BTS):
  has_key_BT = jnp.any(mask_BTS, axis=-1)
  return jnp.where(has_key_BT[:, :, None, None], out_BTHD, jnp.zeros((), out_BTHD.dtype))


def reference_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, bias_BHTS=None):
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


def xla_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, impl, bias_BHTS=None, *,
               is_causal=None):
  """jax.nn.dot_product_attention ("xla" or "cudnn"). With mask_BTS None the kernel masks by
  index: causal (is_causal=True) or not at all; cuDNN then skips the blocks above the diagonal
  and no [B, T, S] array exists. Every row sees at least itself, so none is empty."""
  if bias_BHTS is not None:
    bias_BHTS = bias_BHTS.astype(q_BTHD.dtype)
  if mask_BTS is None:
    return jax.nn.dot_product_attention(q_BTHD, k_BSKD, v_BSKD, bias=bias_BHTS, scale=scale,
                                        is_causal=bool(is_causal), implementation=impl)
  out = jax.nn.dot_product_attention(q_BTHD, k_BSKD, v_BSKD, bias=bias_BHTS,
                                     mask=mask_BTS[:, None], scale=scale, implementation=impl)
  return zero_empty_rows(out, mask_BTS)


# Segments a row the packed cuDNN kernel is compiled for, per this many tokens: cuDNN launches
# work for every slot, used or not, so the bound is kept small. A row with more segments gets NaN
# (see cudnn_packed_kernel). 32 tokens a document on average is far shorter than any pretraining
# corpus's documents.
CUDNN_TOKENS_PER_SEGMENT = 32


def cudnn_max_segments(T: int) -> int:
  return max(1, -(-T // CUDNN_TOKENS_PER_SEGMENT))


def segment_runs(seg_BT, max_segments: int):
  """Packed-layout descriptors of rows of contiguous segments (runs of equal ids).

  Returns (offsets [B, M + 1], lengths [B, M], count [B]) in int32, M = max_segments: per row
  the start index of each run followed by T, and each run's length, -1 in the slots past the
  row's `count` runs (cuDNN's convention for unused slots). Rows with count > M are cut off
  (their descriptors are wrong); the caller checks count.
  """
  B, T = seg_BT.shape
  is_start = jnp.concatenate([jnp.ones((B, 1), bool), seg_BT[:, 1:] != seg_BT[:, :-1]], axis=1)
  count = jnp.sum(is_start, axis=1, dtype=jnp.int32)
  starts = jax.vmap(lambda row: jnp.nonzero(row, size=max_segments + 1, fill_value=T)[0])(
      is_start).astype(jnp.int32)  # [B, M + 1]: the run starts, then T
  slot = jnp.arange(max_segments + 1, dtype=jnp.int32)[None]
  offsets = jnp.where(slot <= count[:, None], starts, -1)
  lengths = jnp.where(slot[:, :-1] < count[:, None], starts[:, 1:] - starts[:, :-1], -1)
  return offsets, lengths, count


def cudnn_packs() -> bool:
  """Whether cuDNN's packed layout is available: jax allows it from compute capability 9.0
  (Hopper) on. rove_jax.aot.gpu answers for the GPU it compiles for."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
  return bool(cudnn_fa.check_compute_capability("9.0"))


def cudnn_packed_kernel(q_BTHD, k_BSKD, v_BSKD, seg_BT, scale, causal):
  """cuDNN flash attention over packed documents (self-attention, T == S, each segment a
  contiguous run, causal by index inside it), described to cuDNN by segment starts and lengths
  (`segment_runs`), so no [B, T, S] mask or bias exists and cuDNN skips what no query sees.

  The descriptors have a static number of slots, `cudnn_max_segments(T)`. A row with more
  segments cannot be described: its output is NaN, never a wrong number, so a training step
  on it is skipped as non-finite (rove_jax.train.loop). (A lax.cond to an exact fallback kernel
  was tried: under a sharded batch XLA all-gathered q, k and v around it, 4.7 GB a layer.)
  """
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
  offsets, lengths, count = segment_runs(seg_BT, cudnn_max_segments(seg_BT.shape[1]))
  mask_type = cudnn_fa.MaskType.PADDING_CAUSAL if causal else cudnn_fa.MaskType.PADDING
  out = cudnn_fa.dot_product_attention(
      q_BTHD, k_BSKD, v_BSKD, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
      kv_offsets=offsets, scale=scale, mask_type=mask_type)
  fits_B = count <= offsets.shape[1] - 1
  return jnp.where(fits_B[:, None, None, None], out, jnp.full((), jnp.nan, out.dtype))


def chunked_kernel(q_BTHD, k_BSKD, v_BSKD, mask_parts, scale, chunk, bias_fn=None, *,
                   positions_ordered=False):
  """Blockwise attention with an online softmax (flash-attention style) in pure JAX.

  Queries are processed chunk by chunk (lax.map) and, for each, keys chunk by chunk (lax.scan)
  with running max / sum / accumulator in float32, so memory is O(T * chunk) rather than
  O(T * S). Blocks a query chunk cannot see (all keys later than all queries) are skipped: by
  block index when positions are ordered (see rove_jax.attention), else by testing the block's
  mask, a reduction over the whole batch (one all-reduce a block pair when it is sharded).
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
  kv_pos_p, kv_seg_p = pad(kv_pos, pad_s), pad(kv_seg, pad_s)
  kv_valid_p = pad(kv_valid, pad_s, False)
  q_p, q_pos_p, q_seg_p = pad(q_BTHD, pad_t), pad(q_pos, pad_t), pad(q_seg, pad_t)

  def to_blocks(x, n, c):  # [B, n*c, ...] -> [n, B, c, ...]
    return jnp.moveaxis(x.reshape((B, n, c) + x.shape[2:]), 1, 0)

  kb = (to_blocks(k_p, nk, ck), to_blocks(v_p, nk, ck), to_blocks(kv_pos_p, nk, ck),
        to_blocks(kv_seg_p, nk, ck), to_blocks(kv_valid_p, nk, ck), jnp.arange(nk))
  compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)

  def one_query_block(args):
    q_bc, qpos_bc, qseg_bc, qi = args
    q_bckgd = q_bc.astype(compute).reshape(B, cq, K, G, D) * scale

    def step(carry, kv_block):
      m, l, acc = carry
      k_b, v_b, kpos_b, kseg_b, kval_b, ki = kv_block
      mask = mask_block(qpos_bc, kpos_b, qseg_bc, kseg_b, kval_b, causal)  # [B, cq, ck]

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
        visible = ki * ck <= qi * cq + cq - 1 if positions_ordered else jnp.any(mask)
        new = jax.lax.cond(visible, compute_block, lambda _: (m, l, acc), None)
      else:
        new = compute_block(None)
      return new, None

    init = (jnp.full((B, K, G, cq), -jnp.inf, compute), jnp.zeros((B, K, G, cq), compute),
            jnp.zeros((B, K, G, cq, D), compute))
    (m, l, acc), _ = jax.lax.scan(step, init, kb)
    out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # rows that saw nothing stay 0
    return jnp.moveaxis(out, 3, 1).reshape(B, cq, H, D)  # [B,K,G,c,D] -> [B,c,K,G,D]

  qb = (to_blocks(q_p, nq, cq), to_blocks(q_pos_p, nq, cq), to_blocks(q_seg_p, nq, cq),
        jnp.arange(nq))
  out_nBcHD = jax.lax.map(one_query_block, qb)
  out = jnp.moveaxis(out_nBcHD, 0, 1).reshape(B, nq * cq, H, D)[:, :T]
  return out.astype(q_BTHD.dtype)
