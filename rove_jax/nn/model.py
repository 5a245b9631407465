"""A GPT in Flax NNX whose positional encoding is a switch: RoVE, RoPE, NoPE, learned or
sinusoidal absolute embeddings, or T5 relative buckets (the last three in rove_jax.nn.baselines).

Shape letters (legend in rove_jax): B batch, T tokens of this call, S key/value tokens,
L cache capacity, V vocabulary, E model width, H query heads, K key/value heads, D head dim,
F MLP width, P rotary pairs.

Its attention layer (rove_jax.nn.attention_layer.Attention) is the reference for wiring RoVE
into your own model. Parameters carry logical axis names (`logical_axes` metadata)
that rove_jax.train.sharding maps onto a device mesh.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rove_jax import scaling
from rove_jax.nn import baselines
from rove_jax.nn.act_sharding import constrain

# the attention layer and the per-call context live in rove_jax.nn.attention_layer; re-exported
from rove_jax.nn.attention_layer import Attention, Context  # noqa: F401

# generate and sample_logits live in rove_jax.nn.decoding; re-exported for `from rove_jax.nn.model
# import generate`.
from rove_jax.nn.decoding import generate, sample_logits  # noqa: F401
from rove_jax.nn.layers import MLP, Norm, _const, _dense, _lead, _normal, _param, bias_gelu  # noqa: F401
from rove_jax.nn.model_config import (  # noqa: F401
  DTYPES,
  MLPS,
  NORMS,
  POS_ENCODINGS,
  REMAT_POLICIES,
  ROTARY_ENCODINGS,
  GPTConfig,
)


@flax.struct.dataclass
class KVCache:
  """Decoding state, passed in and returned. k, v: one [B, L, K, D] per layer (rotary encodings
  store R_p k and, for RoVE, R_p v); positions [B, L] the global position of each slot; length
  the number of filled slots (shared by the batch)."""

  k: tuple
  v: tuple
  positions: jax.Array
  length: jax.Array


# --------------------------------------------------------------------------------- layers


class Block(nnx.Module):
  def __init__(self, cfg: GPTConfig, layer: int, *, rngs: nnx.Rngs):
    self.norm1 = Norm(cfg.d_model, cfg)
    self.attn = Attention(cfg, layer, rngs=rngs)
    self.norm2 = Norm(cfg.d_model, cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BTE, ctx: Context, cache_kv=None):
    x_BTE = constrain(x_BTE, "batch", None, None)  # the residual stream: split by rows only
    a_BTE, cache_kv = self.attn(self.norm1(x_BTE), ctx, cache_kv)
    x_BTE = x_BTE + a_BTE
    return x_BTE + self.mlp(self.norm2(x_BTE)), cache_kv


# ---------------------------------------------------------------------------------- model


class GPT(nnx.Module):
  """Decoder-only transformer. `model(tokens)` -> logits [B, T, V] (float32);
  `model(tokens, cache=cache)` -> (logits, cache) for decoding."""

  def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
    cfg = self.config = config
    pd = DTYPES[cfg.param_dtype]
    self.embed = _param(rngs, (cfg.vocab_size, cfg.d_model), cfg.init_std, ("vocab", "embed"), pd)
    self.pos_embed = (
      _param(rngs, (cfg.max_len, cfg.d_model), cfg.init_std, (None, "embed"), pd)
      if cfg.pos_encoding == "learned"
      else None
    )
    self.t5_table = (
      _param(rngs, (cfg.t5_num_buckets, cfg.n_head), cfg.init_std, (None, "heads"), pd)
      if cfg.pos_encoding == "t5_bias"
      else None
    )
    self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layer)])
    self.final_norm = Norm(cfg.d_model, cfg)
    self.lm_head = (
      None
      if cfg.tie_embeddings
      else _param(rngs, (cfg.d_model, cfg.vocab_size), cfg.init_std, ("embed", "vocab"), pd)
    )

  # -------------------------------------------------------------------------- helpers
  def rotary_frequencies(self, seq_len: int, rope_scaling: Optional[scaling.RopeScaling] = None):
    """(inv_freq [P], attention_factor) for this call; `rope_scaling` overrides the config's
    (None keeps it). (None, 1.0) for non-rotary encodings."""
    cfg = self.config
    if cfg.pos_encoding not in ROTARY_ENCODINGS:
      if rope_scaling is not None:
        raise ValueError(f"rope_scaling applies to rotary encodings, not {cfg.pos_encoding!r}")
      return None, 1.0
    spec = scaling.RopeScaling.coerce(rope_scaling) or cfg.rope_scaling or scaling.RopeScaling()
    return spec.frequencies(
      cfg.rot_dim, base=cfg.rope_base, max_len=cfg.max_len, seq_len=seq_len, head_dim=cfg.head_dim
    )

  def context(
    self,
    positions_BT,
    segment_ids=None,
    *,
    seq_len: Optional[int] = None,
    rope_scaling: Optional[scaling.RopeScaling] = None,
    positions_ordered: bool = False,
  ) -> Context:
    """The attention Context of a call (positions and segment ids [B, T]); rope scaling sees
    `seq_len` (default T; a cached call passes the cache length) and `rope_scaling` (as in
    `__call__`)."""
    seq_len = positions_BT.shape[1] if seq_len is None else seq_len
    inv_freq, factor = self.rotary_frequencies(seq_len, rope_scaling)
    t5_table = None if self.t5_table is None else self.t5_table[...].astype(jnp.float32)
    return Context(
      positions=positions_BT,
      segment_ids=segment_ids,
      inv_freq=inv_freq,
      attention_factor=factor,
      t5_table=t5_table,
      positions_ordered=positions_ordered,
    )

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """An empty cache of `max_len` slots per sequence."""
    cfg = self.config
    if cfg.pos_encoding == "learned" and max_len > cfg.max_len:
      raise ValueError(
        f"learned position embeddings cover {cfg.max_len} positions; a cache of "
        f"{max_len} would decode past them. Use at most {cfg.max_len}."
      )
    zeros = lambda: tuple(
      jnp.zeros((batch, max_len, cfg.n_kv_head, cfg.head_dim), DTYPES[cfg.dtype])
      for _ in range(cfg.n_layer)
    )
    return KVCache(
      k=zeros(),
      v=zeros(),
      positions=jnp.zeros((batch, max_len), jnp.int32),
      length=jnp.zeros((), jnp.int32),
    )

  def embed_tokens(self, tokens_BT, positions_BT):
    """Token embeddings plus, for absolute encodings, the position embeddings: [B, T, E]."""
    cfg = self.config
    dt = DTYPES[cfg.dtype]
    x = self.embed[...].astype(dt)[tokens_BT]
    if cfg.pos_encoding == "learned":
      x = x + baselines.learned_embedding(self.pos_embed[...].astype(dt), positions_BT)
    elif cfg.pos_encoding == "sinusoidal":
      x = x + baselines.sinusoidal_embedding(positions_BT, cfg.d_model).astype(dt)
    return x

  def head_VE(self, dtype=None):
    """The output projection's weight, one row per class, [V, E] in `dtype` (None: the
    parameter's own): the tied embedding, or the untied head transposed."""
    w = self.embed[...] if self.lm_head is None else self.lm_head[...].T
    return w if dtype is None else w.astype(dtype)

  # ---------------------------------------------------------------------------- call
  def __call__(
    self,
    tokens_BT,
    positions=None,
    segment_ids=None,
    *,
    cache: KVCache | None = None,
    rope_scaling: Optional[scaling.RopeScaling] = None,
    positions_ordered: Optional[bool] = None,
    logits_dtype: Any = jnp.float32,
    head: bool = True,
  ):
    """Logits [B, T, V] in float32, or (logits, cache) when a cache is given.

    Args:
      tokens_BT: int tokens.
      positions: [B, T] global positions (default: 0..T-1, or continuing the cache).
      segment_ids: [B, T] document ids for packed sequences (not with a cache).
      cache: a KVCache from `init_cache`; the new tokens are written after its filled slots.
      rope_scaling: a scaling.RopeScaling overriding the config's for this call, e.g.
        RopeScaling(rope_type="yarn", factor=L / max_len,
        original_max_position_embeddings=max_len) for inference-time context extension (a
        transformers-style dict is parsed into one); None keeps the config's, RopeScaling() is
        plain RoPE.
      positions_ordered: the positions grow with the index inside each segment (as the packed
        training batches' do), so the flash kernels may mask by index (see
        rove_jax.kernels.mask). Default: True exactly when positions are the default 0..T-1
        without a cache.
      logits_dtype: the output projection's result type (its products accumulate in float32
        either way); None: the model's compute dtype, which training uses (under bfloat16 the
        [B, T, V] logits are then half the bytes; rove_jax.train.loss.cross_entropy takes them
        to float32 inside its reductions).
      head: False: return the final norm's output [B, T, E] in the compute dtype instead of
        logits (no cache), for a loss that projects it itself (`head_VE`).
    """
    cfg, tokens_BT = self.config, jnp.asarray(tokens_BT)
    if positions_ordered is None:
      positions_ordered = positions is None and cache is None
    if tokens_BT.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens_BT.shape}")
    if cfg.pos_encoding == "learned":
      baselines.check_learned_positions(cfg.max_len, tokens_BT.shape[1], positions)
    B, T = tokens_BT.shape
    if positions is None:
      base = jnp.arange(T, dtype=jnp.int32)[None]
      positions = base if cache is None else base + cache.length
      positions = jnp.broadcast_to(positions, (B, T))
    positions = jnp.asarray(positions).astype(jnp.int32)
    if positions.shape != (B, T):
      raise ValueError(f"positions must be [B, T] = {(B, T)}, got {positions.shape}")
    x = self.embed_tokens(tokens_BT, positions)
    return self.forward_embeddings(
      x,
      positions,
      segment_ids,
      cache=cache,
      rope_scaling=rope_scaling,
      positions_ordered=positions_ordered,
      logits_dtype=logits_dtype,
      head=head,
    )

  def forward_embeddings(
    self,
    x_BTE,
    positions_BT,
    segment_ids=None,
    *,
    cache=None,
    rope_scaling: Optional[scaling.RopeScaling] = None,
    positions_ordered: bool = False,
    logits_dtype: Any = jnp.float32,
    head: bool = True,
  ):
    """The transformer from input embeddings (after `embed_tokens`) to logits; with head=False
    (no cache) to the final norm's output [B, T, E] instead, which the fused training loss
    (rove_jax.kernels.linear_ce) projects itself with `head_VE`."""
    cfg = self.config
    B, T, _ = x_BTE.shape
    if cache is None:
      ctx = self.context(
        positions_BT, segment_ids, rope_scaling=rope_scaling, positions_ordered=positions_ordered
      )
    else:
      if segment_ids is not None:
        raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
      L = cache.positions.shape[1]
      if T > L:
        raise ValueError(f"{T} new tokens do not fit a cache of {L} slots")
      if not isinstance(cache.length, jax.core.Tracer) and int(cache.length) + T > L:
        raise ValueError(
          f"the cache holds {int(cache.length)} of {L} slots; {T} more do not "
          f"fit. Create it with init_cache(batch, max_len >= total length)."
        )
      start = cache.length
      ctx = self.context(positions_BT, seq_len=L, rope_scaling=rope_scaling).replace(
        cache_start=start,
        kv_positions=jax.lax.dynamic_update_slice(cache.positions, positions_BT, (0, start)),
        kv_mask=jnp.broadcast_to(jnp.arange(L)[None] < start + T, (B, L)),
      )

    call = Block.__call__  # called with the block first: no wrapper frame between the layers
    if cfg.remat != "none" and cache is None:  # remat saves training memory; decoding has no
      # backward pass, and nnx.remat inside generate's lax.scan fails on the closed-over model
      policy = (
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == "dots" else None
      )
      call = nnx.remat(Block.__call__, policy=policy)
    x, new_kv = x_BTE, []
    for i, block in enumerate(self.blocks):
      x, kv = call(block, x, ctx, None if cache is None else (cache.k[i], cache.v[i]))
      new_kv.append(kv)
    x = constrain(self.final_norm(x), "batch", None, None)
    if not head and cache is None:
      return x
    logits = jnp.einsum(
      "bte,ve->btv",
      x,
      self.head_VE(x.dtype),
      preferred_element_type=x.dtype if logits_dtype is None else logits_dtype,
    )
    logits = constrain(logits, "batch", None, "vocab")
    if cache is None:
      return logits
    return logits, KVCache(
      k=tuple(k for k, _ in new_kv),
      v=tuple(v for _, v in new_kv),
      positions=ctx.kv_positions,
      length=start + T,
    )


# ------------------------------------------------------------------ shapes, no arrays
# The one place the model is built abstractly: restores, exports, compiles, counts and the
# scoring programs take its graph and parameter shapes from here.


def abstract_model(config: GPTConfig) -> GPT:
  """The GPT of a config with shapes and dtypes in place of arrays (nnx.eval_shape: nothing is
  allocated or initialised)."""
  return nnx.eval_shape(lambda: GPT(config, rngs=nnx.Rngs(0)))


def abstract_params(config: GPTConfig) -> nnx.State:
  """The parameter tree of the GPT a config builds, shapes and dtypes only: the target of a
  restore, a file's names and shapes to check against."""
  return nnx.state(abstract_model(config), nnx.Param)


def graphdef(config: GPTConfig) -> nnx.GraphDef:
  """The GPT's structure without its parameters: `nnx.merge(graphdef(c), params)` is the model."""
  return nnx.graphdef(abstract_model(config))


def build(config: GPTConfig, params) -> GPT:
  """The GPT of a config holding the given parameters (nothing is initialised randomly)."""
  return nnx.merge(graphdef(config), params)


def count_params(model_or_state) -> int:
  """Number of parameters (works on nnx.eval_shape results: nothing allocated)."""
  state = nnx.state(model_or_state, nnx.Param)
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def param_count(config: GPTConfig) -> int:
  """Parameter count of a config, from shapes only."""
  return count_params(abstract_model(config))
