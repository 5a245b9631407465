"""The reference kernel: softmax attention materialised as einsums, for tests.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, G = H // K, D head dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rove_jax.kernels.call import KernelCall


def attend(call: KernelCall) -> jax.Array:
  """softmax(scale * q.k + bias) v over the call's mask (built dense from the positions) in
  float32 (float64 for float64 inputs), GQA; rows that see no key give 0.

  Returns:
    [B, T, H, D] in q.dtype.
  """
  mask_BTS = call.mask.dense(call.q_pos_BT, call.kv_pos_BS)
  bias_BHTS = None
  if call.bias_fn is not None:
    bias_BHTS = call.bias_fn(call.q_pos_BT, call.kv_pos_BS).astype(jnp.float32)
  return softmax_attention(call.q_BTHD, call.k_BSKD, call.v_BSKD, mask_BTS, call.scale, bias_BHTS)


def softmax_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, bias_BHTS=None) -> jax.Array:
  """The same over a dense bool mask [B, T, S] and an optional bias [B, H, T, S]."""
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
