"""The GPT's attention layer (`Attention`) and what every layer's attention reads from one
model call (`Context`).

Shape letters (legend in rove_jax): B batch, T tokens of this call, S key/value tokens,
L cache capacity, E model width, H query heads, K key/value heads, D head dim, P rotary pairs.

`Attention` is the reference for wiring RoVE into your own model: project q, k, v; (decoding:
write the cache); call `rove_attention` where you would call RoPE attention; project out. The
KV cache stores R_j k_j and (RoVE) R_j v_j at their global positions j; a decoding step rotates
its queries (`attention.rotate_queries`), attends to the cache with `masked_attention` and, for
RoVE, rotates the output back.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from rove_jax import attention, kernels, rotary
from rove_jax.nn import baselines
from rove_jax.nn.act_sharding import constrain
from rove_jax.nn.layers import _const, _dense, _lead, _normal, _param
from rove_jax.nn.model_config import DTYPES, ROTARY_ENCODINGS, GPTConfig


@flax.struct.dataclass
class Context:
  """What every layer's attention reads from one model call (built once, shared by layers).
  The rotary fields hold the frequencies after any rope_scaling (None, 1.0 if not rotary)."""

  positions: jax.Array  # [B, T] global positions of this call's tokens
  segment_ids: Optional[jax.Array] = None  # [B, T] documents of packed sequences
  inv_freq: Optional[jax.Array] = None  # [P] rotary frequencies
  attention_factor: Any = 1.0  # multiplies q and k (YaRN's temperature)
  t5_table: Optional[jax.Array] = None  # [buckets, H] T5 bias table, float32
  cache_start: Optional[jax.Array] = None  # decoding: the first cache slot this call writes
  kv_positions: Optional[jax.Array] = None  # decoding: [B, L] positions of the cache slots
  kv_mask: Optional[jax.Array] = None  # decoding: [B, L] filled slots
  # Positions grow with the index in each segment (no cache): flash kernels mask by index.
  positions_ordered: bool = flax.struct.field(pytree_node=False, default=False)


class Attention(nnx.Module):
  """Causal self-attention with RoVE, RoPE or (rotary=None) plain masked attention.

  The q, k, v projections are stored fused, so one matmul makes all three: `wqkv` [E, 3, H, D]
  (and `bqkv` [3, H, D]) when K == H; for GQA, `wq` [E, H, D] and `wkv` [E, 2, K, D] (`bq`,
  `bkv`). Index 0, 1, 2 of the stacked axis is q, k, v.
  """

  def __init__(self, cfg: GPTConfig, layer: int, *, rngs: nnx.Rngs):
    E, H, K, D = cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim
    pd = DTYPES[cfg.param_dtype]
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layer)
    self.cfg = cfg
    self.rotary = (
      "rove"
      if cfg.is_rove_layer(layer)
      else "rope"
      if cfg.pos_encoding in ROTARY_ENCODINGS
      else None
    )
    has_qkv_bias = cfg.use_bias or cfg.qkv_bias
    bias = lambda shape, axes: _const(shape, 0.0, axes, pd) if has_qkv_bias else None
    q_EHD, k_EKD, v_EKD = (_normal(rngs, (E, n, D), std, pd) for n in (H, K, K))
    if K == H:
      self.wqkv = nnx.Param(
        jnp.stack([q_EHD, k_EKD, v_EKD], axis=1), logical_axes=("embed", None, "heads", "head_dim")
      )
      self.bqkv = bias((3, H, D), (None, "heads", "head_dim"))
      self.wq = self.bq = self.wkv = self.bkv = None
    else:
      self.wqkv = self.bqkv = None
      self.wq = nnx.Param(q_EHD, logical_axes=("embed", "heads", "head_dim"))
      self.wkv = nnx.Param(
        jnp.stack([k_EKD, v_EKD], axis=1), logical_axes=("embed", None, "kv_heads", "head_dim")
      )
      self.bq = bias((H, D), ("heads", "head_dim"))
      self.bkv = bias((2, K, D), (None, "kv_heads", "head_dim"))
    self.wo = _param(rngs, (H, D, E), out_std, ("heads", "head_dim", "embed"), pd)
    self.bo = _const((E,), 0.0, ("embed",), pd) if cfg.use_bias else None

  def __call__(self, x_BTE, ctx: Context, cache_kv=None):
    """x [B, T, E] -> (y [B, T, E], the layer's cache (k [B, L, K, D], v) or None)."""
    qkv_BT3HD = self._qkv_stacked(x_BTE)
    q_BTHD, k_BTKD, v_BTKD = self.qkv(x_BTE, qkv_BT3HD)
    if cache_kv is not None:
      return self.decode(q_BTHD, k_BTKD, v_BTKD, ctx, cache_kv)
    rope, bias_fn = self.rope(ctx), self.bias_fn(ctx)
    mask = kernels.Mask(
      segment_ids=ctx.segment_ids, ordered=ctx.positions_ordered, window=self.window
    )
    kernel = self.kernel(q_BTHD, k_BTKD, mask, rope, bias_fn is not None)
    kw = dict(q_positions=ctx.positions, kv_positions=ctx.positions, mask=mask, kernel=kernel)
    if rope is not None and kernel.rotates and kernel.half_pairs and rope.layout != "half":
      return self._in_half_layout(x_BTE, rope, kw), None
    if rope is None:
      out_BTHD = attention.masked_attention(q_BTHD, k_BTKD, v_BTKD, bias_fn=bias_fn, **kw)
    elif self.rotary == "rove" and not kernel.rotates:
      # R_i^-1 then the output projection. y = R_i^-1 o is kept for the projection's weight
      # gradient (one [B, T, H, D] residual more than RoPE); recomputing it in the backward pass
      # under a checkpoint cost a second pass over o and a rerun of the projection.
      o_BTHD = attention.rove_attention_rotated(q_BTHD, k_BTKD, v_BTKD, rope=rope, **kw)
      y = _rotated_out(
        o_BTHD,
        ctx.positions,
        ctx.inv_freq,
        self.wo[...],
        None if self.bo is None else self.bo[...],
        layout=self.cfg.rope_layout,
      )
      return y, None
    elif qkv_BT3HD is not None:  # the same, on the one projection's output as it is
      out_BTHD = attention.packed_attention(qkv_BT3HD, kind=self.rotary, rope=rope, **kw)
    else:  # RoPE, or RoVE on a kernel that applies every rotation inside
      attend = attention.rove_attention if self.rotary == "rove" else attention.rope_attention
      out_BTHD = attend(q_BTHD, k_BTKD, v_BTKD, rope=rope, **kw)
    return _dense_out(out_BTHD, self.wo, self.bo), None

  def _in_half_layout(self, x_BTE, rope, kw):
    """The call on a kernel that rotates the half layout's pairs more cheaply (kernels.Kernel.
    half_pairs: the Hopper fused kernel) with this interleaved rotary: the projections' head
    dims put in rotary.half_order (q, k and v's outputs, the output projection's inputs:
    rotary.in_half_order), the same attention with the dims renamed. It is the weights that are
    reordered ([E, 3, H, D] and [H, D, E], in the kernels that cast them for the products), not
    the activations, which the kernel reads in place as the projection writes them."""
    half = dataclasses.replace(rope, layout="half")
    pick = lambda p, axis=-1: (
      None if p is None else rotary.in_half_order(p[...], half.n_rotated, axis)
    )
    qkv_BT3HD = self._qkv_stacked(x_BTE, pick)
    if qkv_BT3HD is not None:
      out_BTHD = attention.packed_attention(qkv_BT3HD, kind=self.rotary, rope=half, **kw)
    else:
      attend = attention.rove_attention if self.rotary == "rove" else attention.rope_attention
      out_BTHD = attend(*self.qkv(x_BTE, pick=pick), rope=half, **kw)
    return _dense_out(out_BTHD, pick(self.wo, 1), self.bo)

  def decode(self, q_BTHD, k_BTKD, v_BTKD, ctx: Context, cache_kv):
    """A call against the KV cache: writes R_j k_j (and, RoVE, R_j v_j) at the global positions
    j, attends to the whole cache and returns (y [B, T, E], the updated cache)."""
    rope = self.rope(ctx)
    if rope is not None:
      k_BTKD = rope.rotate(k_BTKD, ctx.positions)
      v_BTKD = rope.rotate(v_BTKD, ctx.positions) if self.rotary == "rove" else v_BTKD
    cache_kv = tuple(
      jax.lax.dynamic_update_slice(c, new.astype(c.dtype), (0, ctx.cache_start, 0, 0))
      for c, new in zip(cache_kv, (k_BTKD, v_BTKD))
    )
    k_BLKD, v_BLKD = (c.astype(q_BTHD.dtype) for c in cache_kv)
    if rope is not None:
      q_BTHD, q_tables = attention.rotate_queries(q_BTHD, ctx.positions, rope)
    bias_fn = self.bias_fn(ctx)
    mask = kernels.Mask(kv_valid=ctx.kv_mask, window=self.window)
    out_BTHD = attention.masked_attention(
      q_BTHD,
      k_BLKD,
      v_BLKD,
      q_positions=ctx.positions,
      kv_positions=ctx.kv_positions,
      mask=mask,
      kernel=self.kernel(q_BTHD, k_BLKD, mask, None, bias_fn is not None),
      bias_fn=bias_fn,
    )
    if self.rotary == "rove":
      out_BTHD = rope.apply(out_BTHD, q_tables, inverse=True)
    return _dense_out(out_BTHD, self.wo, self.bo), cache_kv

  def _qkv_stacked(self, x_BTE, pick=lambda p: p):
    """The fused projection's output [B, T, 3, H, D] (K == H), else None; pick(param) gives
    the weight and bias it multiplies by (the params as they are by default)."""
    if self.wqkv is None:
      return None
    y = _dense(x_BTE, pick(self.wqkv), pick(self.bqkv))
    return constrain(y, "batch", None, None, "heads", None)

  def qkv(self, x_BTE, qkv_BT3HD=None, pick=lambda p: p):
    """The projections q [B, T, H, D], k [B, T, K, D], v [B, T, K, D] (the slices of qkv_BT3HD,
    `_qkv_stacked`'s output, when given), with the weights and biases pick(param) gives."""
    if self.wqkv is not None:
      if qkv_BT3HD is None:
        qkv_BT3HD = self._qkv_stacked(x_BTE, pick)
      return qkv_BT3HD[:, :, 0], qkv_BT3HD[:, :, 1], qkv_BT3HD[:, :, 2]
    q_BTHD = constrain(_dense(x_BTE, pick(self.wq), pick(self.bq)), "batch", None, "heads", None)
    kv_BT2KD = _dense(x_BTE, pick(self.wkv), pick(self.bkv))
    kv_BT2KD = constrain(kv_BT2KD, "batch", None, None, "heads", None)
    return q_BTHD, kv_BT2KD[:, :, 0], kv_BT2KD[:, :, 1]

  @property
  def window(self) -> Optional[int]:
    """The sliding window of the config's mask (None: none)."""
    return self.cfg.sliding_window or None

  def rope(self, ctx: Context):
    """This layer's rotary setup in this call (None without rotary)."""
    if not self.rotary:
      return None
    return rotary.Rope(ctx.inv_freq, ctx.attention_factor, self.cfg.rope_layout)

  def kernel(self, q_BTHD, k_BSKD, mask, rope, bias: bool) -> kernels.Kernel:
    """The attention kernel of a call: the config's attention_impl, chunk size and fused
    variant, with dispatch's fallback for calls a by-index kernel cannot take
    (rove_jax.kernels.dispatch). rope is the call's Rope, None where the call rotates nothing
    (decoding's masked_attention on rotated queries and cache)."""
    return kernels.select(
      self.cfg.attention_impl,
      q=q_BTHD,
      k=k_BSKD,
      mask=mask,
      bias=bias,
      rope=rope,
      fallback=True,
      settings=kernels.Settings(self.cfg.attention_chunk, self.cfg.fused_variant),
    )

  def bias_fn(self, ctx: Context):
    """The T5 logit bias f(q_pos, kv_pos) -> [B, H, t, s], or None without a T5 table."""
    if ctx.t5_table is None:
      return None
    return functools.partial(
      baselines.t5_bias,
      ctx.t5_table,
      num_buckets=self.cfg.t5_num_buckets,
      max_distance=self.cfg.t5_max_distance,
    )

  # ----------------------------------------------------- for analysis (Figure 1), not training
  def weights(self, x_BTE, ctx: Context):
    """The attention probabilities [B, H, T, T] of a self-attention call on x (no cache): the
    logits the kernels compute (rotated q and k, attention factor, T5 bias, mask), softmaxed.
    The q.k products run in the activation dtype and are then cast to float32, so under
    bfloat16 they differ from the kernels' (which compute in float32) by bf16 rounding."""
    q_BTHD, k_BTKD, _ = self.qkv(x_BTE)
    rope = self.rope(ctx)
    if rope is not None:
      q_BTHD = rope.rotate(rope.scale_query(q_BTHD), ctx.positions).astype(k_BTKD.dtype)
      k_BTKD = rope.rotate(k_BTKD, ctx.positions)
    k_BTHD = jnp.repeat(k_BTKD, q_BTHD.shape[2] // k_BTKD.shape[2], axis=2)
    scale = 1.0 / math.sqrt(q_BTHD.shape[-1])
    logits_BHTS = jnp.einsum("bthd,bshd->bhts", q_BTHD, k_BTHD).astype(jnp.float32) * scale
    bias_fn = self.bias_fn(ctx)
    if bias_fn is not None:
      logits_BHTS = logits_BHTS + bias_fn(ctx.positions, ctx.positions).astype(jnp.float32)
    mask_BTS = kernels.Mask(segment_ids=ctx.segment_ids, window=self.window).dense(
      ctx.positions, ctx.positions
    )
    return jax.nn.softmax(jnp.where(mask_BTS[:, None], logits_BHTS, -jnp.inf), axis=-1)

  def value_projection(self):
    """(w [E, K, D], b [K, D] or None): v = x @ w + b, the value path's only parameters."""
    w, b = (self.wqkv, self.bqkv) if self.wqkv is not None else (self.wkv, self.bkv)
    return w[...][:, -1], None if b is None else b[...][-1]  # v is last on the stacked axis


def _rotated_out(o_BTHD, positions, inv_freq, w_HDE, b_E, *, layout):
  """RoVE's R_i^-1 on the kernel output o, then the output projection."""
  y_BTHD = rotary.rotate(o_BTHD, positions, inv_freq, inverse=True, layout=layout)
  return _dense_out(y_BTHD, w_HDE, b_E)


def _dense_out(x_BTHD, w_HDE, b_E):
  y = jnp.einsum("bthd,hde->bte", x_BTHD, w_HDE[...].astype(x_BTHD.dtype))
  return y if b_E is None else y + _lead(b_E[...].astype(y.dtype), y.ndim)
