"""Kernels on jax.nn.dot_product_attention: "xla" (any platform) and "cudnn" (cuDNN flash
attention on a CUDA GPU, bfloat16/float16), including cuDNN's packed-documents layout.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim, M segment slots of the packed layout.

Where the mask is promised `ordered` and nothing else masks (no kv_valid, no window, no
segments) the kernel masks by index (is_causal), so no [B, T, S] array exists and cuDNN skips
the blocks above the diagonal. On a Hopper GPU or later, "cudnn" also takes packed documents
(one set of segment ids for queries and keys) as segment starts and lengths, the packed layout
cuDNN reads, through jax's internal cuDNN call (the public one has no segment ids). Other calls
build the dense mask from positions. A sliding window always takes the dense mask: an index
window (local_window_size) equals the position window only for consecutive positions, which
`ordered` does not promise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

from rove_jax.kernels.call import Kernel, KernelCall

# Segments a row the packed cuDNN kernel is compiled for, per this many tokens: cuDNN launches
# work for every slot, used or not, so the bound is kept small. A row with more segments gets NaN
# (see `kernel`); the trainer checks its data against the bound before the first step
# (rove_jax.train.packing). 32 tokens a document on average is far shorter than any pretraining
# corpus's documents.
CUDNN_TOKENS_PER_SEGMENT = 32


def kernel(implementation: str) -> Kernel:
  """The kernel calling jax.nn.dot_product_attention with `implementation` ("xla" or "cudnn"),
  on rotated inputs (kernels.call); rows that see no key are 0.

  A packed-documents row with more segments than `cudnn_max_segments(T)` cannot be described to
  cuDNN: its output is NaN, never a wrong number. The trainer refuses such data before its first
  step (rove_jax.train.packing); direct callers bound their documents a row themselves. It is
  not routed to an exact fallback kernel with lax.cond: under a sharded batch XLA all-gathers q,
  k and v around such a cond (bench/RESULTS.md).
  """

  def attend(call: KernelCall) -> jax.Array:
    q_BTHD, k_BSKD, v_BSKD, mask, q_pos_BT, kv_pos_BS, scale, bias_fn = call[:8]
    packed = (
      implementation == "cudnn"
      and mask.segment_ids is not None
      and mask.self_segments
      and bias_fn is None
      and cudnn_packs()
    )
    by_index = (
      mask.ordered
      and mask.kv_valid is None
      and mask.window is None
      and (mask.segment_ids is None or packed)
    )
    mask_BTS = None if by_index else mask.dense(q_pos_BT, kv_pos_BS)
    bias_BHTS = None
    if bias_fn is not None:
      bias_BHTS = bias_fn(q_pos_BT, kv_pos_BS).astype(jnp.float32).astype(q_BTHD.dtype)
    if by_index and packed:
      seg_BT = mask.segments()[0]
      offsets, lengths, count = segment_runs(seg_BT, cudnn_max_segments(seg_BT.shape[1]))
      mask_type = cudnn_fa.MaskType.PADDING_CAUSAL if mask.causal else cudnn_fa.MaskType.PADDING
      out = cudnn_fa.dot_product_attention(
        q_BTHD,
        k_BSKD,
        v_BSKD,
        q_seqlen=lengths,
        kv_seqlen=lengths,
        q_offsets=offsets,
        kv_offsets=offsets,
        scale=scale,
        mask_type=mask_type,
      )
      fits_B = count <= offsets.shape[1] - 1
      return jnp.where(fits_B[:, None, None, None], out, jnp.full((), jnp.nan, out.dtype))
    if by_index:  # every row sees at least itself, so none is empty
      return jax.nn.dot_product_attention(
        q_BTHD,
        k_BSKD,
        v_BSKD,
        bias=bias_BHTS,
        scale=scale,
        is_causal=bool(mask.causal),
        implementation=implementation,
      )
    out = jax.nn.dot_product_attention(
      q_BTHD,
      k_BSKD,
      v_BSKD,
      bias=bias_BHTS,
      mask=mask_BTS[:, None],
      scale=scale,
      implementation=implementation,
    )
    return zero_empty_rows(out, mask_BTS)

  return Kernel(implementation, attend)


attend = kernel("xla").attend
attend_cudnn = kernel("cudnn").attend


def zero_empty_rows(out_BTHD, mask_BTS):
  """out with the rows of queries that see no key set to 0."""
  has_key_BT = jnp.any(mask_BTS, axis=-1)
  return jnp.where(has_key_BT[:, :, None, None], out_BTHD, jnp.zeros((), out_BTHD.dtype))


def cudnn_packs() -> bool:
  """Whether cuDNN's packed layout is available: jax allows it from compute capability 9.0
  (Hopper) on. rove_jax.aot.gpu answers for the GPU it compiles for."""
  return bool(cudnn_fa.check_compute_capability("9.0"))


def cudnn_max_segments(T: int) -> int:
  """The segment slots of the packed layout for rows of T tokens."""
  return max(1, -(-T // CUDNN_TOKENS_PER_SEGMENT))


def segment_runs(seg_BT, max_segments: int):
  """Packed-layout descriptors of rows of contiguous segments (runs of equal ids).

  Returns (offsets [B, M + 1], lengths [B, M], count [B]) in int32, M = max_segments: per row
  the start index of each run and each run's length, -1 in the slots past the row's `count` runs
  (jax's packed-layout convention: starts only, no end entry; jax appends the end itself when it
  flattens the batch into cuDNN's ragged offsets, `fused_attention_stablehlo._fix_seqlen_offsets`,
  so an end entry would be read as the start of one more segment and shift every later row's
  segments onto the tokens before them). Rows with count > M are cut off (their descriptors
  are wrong); the caller checks count.
  """
  B, T = seg_BT.shape
  is_start = jnp.concatenate([jnp.ones((B, 1), bool), seg_BT[:, 1:] != seg_BT[:, :-1]], axis=1)
  count = jnp.sum(is_start, axis=1, dtype=jnp.int32)
  starts = jax.vmap(lambda row: jnp.nonzero(row, size=max_segments + 1, fill_value=T)[0])(
    is_start
  ).astype(jnp.int32)  # [B, M + 1]: the run starts, then T
  slot = jnp.arange(max_segments + 1, dtype=jnp.int32)[None]
  # Starts only, at most M: a cut-off row must not hand the next rows' segments an extra start.
  offsets = jnp.where(slot < jnp.minimum(count, max_segments)[:, None], starts, -1)
  lengths = jnp.where(slot[:, :-1] < count[:, None], starts[:, 1:] - starts[:, :-1], -1)
  return offsets, lengths, count
