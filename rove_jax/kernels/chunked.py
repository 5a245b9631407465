"""The chunked kernel: blockwise attention with an online softmax (flash-attention style) in
pure JAX, memory O(T * chunk) rather than O(T * S), for long contexts on any platform.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.

Queries are processed chunk by chunk (lax.map) and, for each, keys chunk by chunk (lax.scan)
with running max / sum / accumulator in float32. Under a causal mask or a window, blocks a query
chunk cannot see are skipped: by block index when the mask is causal and `ordered` (all keys
later than all queries), else by testing the block's mask, a reduction over the whole batch (one
all-reduce a block pair when it is sharded).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rove_jax.kernels.call import Kernel, KernelCall
from rove_jax.kernels.mask import visible

DEFAULT_CHUNK = 512


def kernel(chunk_size: int = DEFAULT_CHUNK) -> Kernel:
  """The chunked kernel with blocks of `chunk_size` queries and keys, on rotated inputs
  (kernels.call); rows that see no key are 0. The call's bias_fn is evaluated block by block,
  so no [T, S] array exists."""
  if isinstance(chunk_size, bool) or not (isinstance(chunk_size, int) and chunk_size > 0):
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")

  def attend(call: KernelCall) -> jax.Array:
    q_BTHD, k_BSKD, v_BSKD, mask, q_pos_BT, kv_pos_BS, scale, bias_fn = call[:8]
    B, T, H, D = q_BTHD.shape
    S, K = k_BSKD.shape[1], k_BSKD.shape[2]
    G = H // K
    cq, ck = min(chunk_size, T), min(chunk_size, S)
    nq, nk = -(-T // cq), -(-S // ck)
    pad_t, pad_s = nq * cq - T, nk * ck - S
    causal, window = mask.causal, mask.window

    def pad(x, n, value=0):
      if n == 0:
        return x
      widths = [(0, 0)] * x.ndim
      widths[1] = (0, n)
      return jnp.pad(x, widths, constant_values=value)

    kv_valid = jnp.ones((B, S), bool) if mask.kv_valid is None else mask.kv_valid.astype(bool)
    q_seg, kv_seg = mask.segments()
    if q_seg is None:
      q_seg, kv_seg = jnp.zeros((B, T), jnp.int32), jnp.zeros((B, S), jnp.int32)
    # Padded keys are invalid; padded queries are computed and dropped.
    k_p, v_p = pad(k_BSKD, pad_s), pad(v_BSKD, pad_s)
    kv_pos_p, kv_seg_p = pad(kv_pos_BS, pad_s), pad(kv_seg, pad_s)
    kv_valid_p = pad(kv_valid, pad_s, False)
    q_p, q_pos_p, q_seg_p = pad(q_BTHD, pad_t), pad(q_pos_BT, pad_t), pad(q_seg, pad_t)

    def to_blocks(x, n, c):  # [B, n*c, ...] -> [n, B, c, ...]
      return jnp.moveaxis(x.reshape((B, n, c) + x.shape[2:]), 1, 0)

    kb = (
      to_blocks(k_p, nk, ck),
      to_blocks(v_p, nk, ck),
      to_blocks(kv_pos_p, nk, ck),
      to_blocks(kv_seg_p, nk, ck),
      to_blocks(kv_valid_p, nk, ck),
      jnp.arange(nk),
    )
    compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)

    def one_query_block(args):
      q_bc, qpos_bc, qseg_bc, qi = args
      q_bckgd = q_bc.astype(compute).reshape(B, cq, K, G, D) * scale

      def step(carry, kv_block):
        m, l, acc = carry
        k_b, v_b, kpos_b, kseg_b, kval_b, ki = kv_block
        mask_bcs = visible(qpos_bc, kpos_b, qseg_bc, kseg_b, kval_b, causal, window)

        def compute_block(_):
          s = jnp.einsum("bckgd,bskd->bkgcs", q_bckgd, k_b.astype(compute))
          if bias_fn is not None:
            s = s + bias_fn(qpos_bc, kpos_b).astype(compute).reshape(B, K, G, cq, ck)
          s = jnp.where(mask_bcs[:, None, None], s, -jnp.inf)
          # The running max only stabilises exp(); the result does not depend on it, so it is a
          # constant for autodiff (all of it, or the rescaling terms would not cancel).
          m_new = jnp.maximum(m, jax.lax.stop_gradient(jnp.max(s, axis=-1)))
          m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
          p = jnp.exp(s - m_safe[..., None])
          correction = jnp.exp(m - m_safe)
          l_new = l * correction + jnp.sum(p, axis=-1)
          acc_new = acc * correction[..., None] + jnp.einsum(
            "bkgcs,bskd->bkgcd", p, v_b.astype(compute)
          )
          return m_new, l_new, acc_new

        # Skip blocks no query of the chunk sees (under a causal mask, those whose every key is
        # later than every query: about half of them).
        if causal and mask.ordered:
          visible_block = ki * ck <= qi * cq + cq - 1
        elif causal or window is not None:
          visible_block = jnp.any(mask_bcs)
        else:
          return compute_block(None), None
        return jax.lax.cond(visible_block, compute_block, lambda _: (m, l, acc), None), None

      init = (
        jnp.full((B, K, G, cq), -jnp.inf, compute),
        jnp.zeros((B, K, G, cq), compute),
        jnp.zeros((B, K, G, cq, D), compute),
      )
      (m, l, acc), _ = jax.lax.scan(step, init, kb)
      out = acc / jnp.where(l > 0, l, 1.0)[..., None]  # rows that saw nothing stay 0
      return jnp.moveaxis(out, 3, 1).reshape(B, cq, H, D)  # [B,K,G,c,D] -> [B,c,K,G,D]

    qb = (
      to_blocks(q_p, nq, cq),
      to_blocks(q_pos_p, nq, cq),
      to_blocks(q_seg_p, nq, cq),
      jnp.arange(nq),
    )
    out_nBcHD = jax.lax.map(one_query_block, qb)
    out = jnp.moveaxis(out_nBcHD, 0, 1).reshape(B, nq * cq, H, D)[:, :T]
    return out.astype(q_BTHD.dtype)

  return Kernel("chunked", attend)


attend = kernel()
