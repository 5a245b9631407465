"""A GPT in Flax NNX whose positional encoding is a switch: RoVE, RoPE, NoPE, learned or
sinusoidal absolute embeddings, or T5 relative buckets.

Shape letters:
  B batch   T tokens in this call   L cache capacity   V vocabulary   E d_model
  H query heads   K key/value heads   D head dim   F MLP hidden width

RoVE wiring, the part to copy into your own model: project q, k, v; call
`rove_attention(q, k, v, q_positions=..., kv_positions=..., inv_freq=...)` where you would call
RoPE attention; project out. The KV cache stores R_j k_j and (RoVE) R_j v_j at their global
positions, and decoding calls the same function with `kv_prerotated=True`.

Parameters carry logical axis names in their `logical_axes` metadata (embed, vocab, heads,
kv_heads, head_dim, mlp, or None), which the sharding rules map onto a device mesh.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rove_jax import attention, rotary, scaling

from rove_jax.model_config import (DTYPES, MLPS, NORMS, POS_ENCODINGS, REMAT_POLICIES,  # noqa: F401
                                   ROTARY_ENCODINGS, GPTConfig, FROM_CONFIG, _freeze, _thaw_scaling)


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


def _param(rngs, shape, std, axes, dtype):
  return nnx.Param(jax.random.normal(rngs.params(), shape, dtype) * std, logical_axes=axes)


def _lead(v, ndim):
  """Explicit leading unit dims (the project runs with rank promotion raising)."""
  return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def _const(shape, value, axes, dtype):
  return nnx.Param(jnp.full(shape, value, dtype), logical_axes=axes)


class Norm(nnx.Module):
  """LayerNorm or RMSNorm, computed in float32."""

  def __init__(self, dim: int, cfg: GPTConfig):
    pd = DTYPES[cfg.param_dtype]
    self.kind, self.eps = cfg.norm, cfg.norm_eps
    self.scale = _const((dim,), 1.0, ("embed",), pd)
    self.bias = _const((dim,), 0.0, ("embed",), pd) if (
        cfg.norm == "layernorm" and cfg.use_bias) else None

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    if self.kind == "layernorm":
      x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    y = y * _lead(self.scale[...].astype(jnp.float32), y.ndim)
    if self.bias is not None:
      y = y + _lead(self.bias[...].astype(jnp.float32), y.ndim)
    return y.astype(x.dtype)


def t5_buckets(distance, num_buckets: int, max_distance: int):
  """T5's causal relative-position buckets for distance = q_pos - kv_pos (>= 0 is the past):
  exact buckets below num_buckets / 2, logarithmic ones up to max_distance, the last beyond."""
  n = jnp.maximum(distance, 0)
  exact = num_buckets // 2
  log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
  large = exact + (log_ratio * (num_buckets - exact)).astype(jnp.int32)
  return jnp.where(n < exact, n, jnp.minimum(large, num_buckets - 1))


def sinusoidal_embedding(positions, dim: int):
  """[..., dim]: sin(p / 10000^(2i/dim)) at 2i and cos at 2i + 1 (Vaswani et al. 2017)."""
  inv = jnp.asarray(10000.0 ** -(np.arange(0, dim, 2) / dim), jnp.float32)
  angle = positions.astype(jnp.float32)[..., None] * inv.reshape((1,) * positions.ndim + inv.shape)
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1).reshape(positions.shape + (dim,))


class Attention(nnx.Module):

  def __init__(self, cfg: GPTConfig, layer: int, *, rngs: nnx.Rngs):
    E, H, K, D = cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_dim
    pd = DTYPES[cfg.param_dtype]
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layer)
    self.cfg = cfg
    self.mode = ("rove" if cfg.is_rove_layer(layer) else
                 "rope" if cfg.pos_encoding in ROTARY_ENCODINGS else "none")
    self.wq = _param(rngs, (E, H, D), std, ("embed", "heads", "head_dim"), pd)
    self.wk = _param(rngs, (E, K, D), std, ("embed", "kv_heads", "head_dim"), pd)
    self.wv = _param(rngs, (E, K, D), std, ("embed", "kv_heads", "head_dim"), pd)
    self.wo = _param(rngs, (H, D, E), out_std, ("heads", "head_dim", "embed"), pd)
    if cfg.use_bias:
      self.bq = _const((H, D), 0.0, ("heads", "head_dim"), pd)
      self.bk = _const((K, D), 0.0, ("kv_heads", "head_dim"), pd)
      self.bv = _const((K, D), 0.0, ("kv_heads", "head_dim"), pd)
      self.bo = _const((E,), 0.0, ("embed",), pd)
    else:
      self.bq = self.bk = self.bv = self.bo = None

  def _project(self, x_BTE, pairs):
    """x @ W + b for several (W [E, n, D], b [n, D]) of equal shape in ONE matmul: the weights
    are stacked on a new axis (so a head-sharded W stays sharded per shard), which on CPU
    turns three skinny [E, H*D] products into one [E, 3*H*D] product (~4% of a train step)."""
    dt = x_BTE.dtype
    w_EPND = jnp.stack([w[...] for w, _ in pairs], axis=1).astype(dt)
    y_BTPND = jnp.einsum("bte,epnd->btpnd", x_BTE, w_EPND)
    if pairs[0][1] is not None:
      y_BTPND = y_BTPND + jnp.stack([b[...] for _, b in pairs]).astype(dt)[None, None]
    return [y_BTPND[:, :, i] for i in range(len(pairs))]

  def _qkv(self, x_BTE):
    q_w, k_w, v_w = (self.wq, self.bq), (self.wk, self.bk), (self.wv, self.bv)
    if self.cfg.n_kv_head == self.cfg.n_head:
      return self._project(x_BTE, [q_w, k_w, v_w])
    (q,) = self._project(x_BTE, [q_w])
    return [q] + self._project(x_BTE, [k_w, v_w])

  def __call__(self, x_BTE, positions_BT, *, segment_ids, inv_freq, attention_factor,
               t5_table, cache_kv, kv_positions_BL, kv_mask_BL):
    cfg = self.cfg
    q, k, v = self._qkv(x_BTE)
    def t5_bias(q_pos, kv_pos):
      buckets = t5_buckets(q_pos[:, :, None] - kv_pos[:, None, :], cfg.t5_num_buckets,
                           cfg.t5_max_distance)
      return jnp.moveaxis(t5_table[buckets], -1, 1)  # [B, t, s, H] -> [B, H, t, s]

    bias_fn = None if t5_table is None else t5_bias
    common = dict(implementation=cfg.attention_impl, chunk_size=cfg.attention_chunk)
    rotary_kw = dict(inv_freq=inv_freq, attention_factor=attention_factor,
                     layout=cfg.rope_layout, **common)
    fn = {"rove": attention.rove_attention, "rope": attention.rope_attention}.get(self.mode)

    new_kv = None
    if cache_kv is None:
      if fn is not None:
        out = fn(q, k, v, q_positions=positions_BT, kv_positions=positions_BT,
                 segment_ids=segment_ids, **rotary_kw)
      else:
        out = attention.masked_attention(q, k, v, q_positions=positions_BT,
                                         kv_positions=positions_BT, segment_ids=segment_ids,
                                         bias_fn=bias_fn, **common)
    else:
      cache_k, cache_v, start = cache_kv
      if fn is not None:  # the cache holds rotated keys (and RoVE values) at global positions
        k = rotary.rotate(k, positions_BT, inv_freq, layout=cfg.rope_layout)
        if self.mode == "rove":
          v = rotary.rotate(v, positions_BT, inv_freq, layout=cfg.rope_layout)
      cache_k = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype), (0, start, 0, 0))
      cache_v = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype), (0, start, 0, 0))
      new_kv = (cache_k, cache_v)
      kv = dict(kv_positions=kv_positions_BL, kv_mask=kv_mask_BL)
      if fn is not None:
        out = fn(q, cache_k.astype(q.dtype), cache_v.astype(q.dtype), q_positions=positions_BT,
                 kv_prerotated=True, **kv, **rotary_kw)
      else:
        out = attention.masked_attention(q, cache_k.astype(q.dtype), cache_v.astype(q.dtype),
                                         q_positions=positions_BT, bias_fn=bias_fn, **kv,
                                         **common)
    y = jnp.einsum("bthd,hde->bte", out, self.wo[...].astype(out.dtype))
    if self.bo is not None:
      y = y + _lead(self.bo[...].astype(y.dtype), y.ndim)
    return y, new_kv


class MLP(nnx.Module):

  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    E, F = cfg.d_model, cfg.d_ff
    pd = DTYPES[cfg.param_dtype]
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layer)
    self.kind = cfg.mlp
    self.w_in = _param(rngs, (E, F), std, ("embed", "mlp"), pd)
    self.w_gate = _param(rngs, (E, F), std, ("embed", "mlp"), pd) if cfg.mlp == "swiglu" else None
    self.w_out = _param(rngs, (F, E), out_std, ("mlp", "embed"), pd)
    use_bias = cfg.use_bias and cfg.mlp == "gelu"
    self.b_in = _const((F,), 0.0, ("mlp",), pd) if use_bias else None
    self.b_out = _const((E,), 0.0, ("embed",), pd) if use_bias else None

  def __call__(self, x_BTE):
    dt = x_BTE.dtype
    h = x_BTE @ self.w_in[...].astype(dt)
    if self.b_in is not None:
      h = h + _lead(self.b_in[...].astype(dt), h.ndim)
    if self.kind == "swiglu":
      h = jax.nn.silu(x_BTE @ self.w_gate[...].astype(dt)) * h
    else:
      h = jax.nn.gelu(h, approximate=True)
    y = h @ self.w_out[...].astype(dt)
    return y if self.b_out is None else y + _lead(self.b_out[...].astype(dt), y.ndim)


class Block(nnx.Module):

  def __init__(self, cfg: GPTConfig, layer: int, *, rngs: nnx.Rngs):
    self.norm1 = Norm(cfg.d_model, cfg)
    self.attn = Attention(cfg, layer, rngs=rngs)
    self.norm2 = Norm(cfg.d_model, cfg)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x, positions, segment_ids, inv_freq, attention_factor, t5_table, cache_kv,
               kv_positions, kv_mask):
    a, new_kv = self.attn(self.norm1(x), positions, segment_ids=segment_ids, inv_freq=inv_freq,
                          attention_factor=attention_factor, t5_table=t5_table,
                          cache_kv=cache_kv, kv_positions_BL=kv_positions, kv_mask_BL=kv_mask)
    x = x + a
    return x + self.mlp(self.norm2(x)), new_kv


def _block_call(block, *args):
  return block(*args)


# ---------------------------------------------------------------------------------- model


class GPT(nnx.Module):
  """Decoder-only transformer. `model(tokens)` -> logits [B, T, V] (float32);
  `model(tokens, cache=cache)` -> (logits, cache) for decoding."""

  def __init__(self, config: GPTConfig, *, rngs: nnx.Rngs):
    cfg = self.config = config
    pd = DTYPES[cfg.param_dtype]
    self.embed = _param(rngs, (cfg.vocab_size, cfg.d_model), cfg.init_std, ("vocab", "embed"), pd)
    self.pos_embed = _param(rngs, (cfg.max_len, cfg.d_model), cfg.init_std, (None, "embed"), pd) \
        if cfg.pos_encoding == "learned" else None
    self.t5_table = _param(rngs, (cfg.t5_num_buckets, cfg.n_head), cfg.init_std, (None, "heads"),
                           pd) if cfg.pos_encoding == "t5_bias" else None
    self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layer)])
    self.final_norm = Norm(cfg.d_model, cfg)
    self.lm_head = None if cfg.tie_embeddings else _param(
        rngs, (cfg.d_model, cfg.vocab_size), cfg.init_std, ("embed", "vocab"), pd)

  # -------------------------------------------------------------------------- helpers
  def rotary_frequencies(self, seq_len: int, rope_scaling=FROM_CONFIG):
    """(inv_freq, attention_factor) for this call; `rope_scaling` overrides the config's."""
    cfg = self.config
    if cfg.pos_encoding not in ROTARY_ENCODINGS:
      if rope_scaling is not FROM_CONFIG and rope_scaling is not None:
        raise ValueError(f"rope_scaling applies to rotary encodings, not {cfg.pos_encoding!r}")
      return None, 1.0
    scaling_cfg = cfg.scaling_dict if rope_scaling is FROM_CONFIG else rope_scaling
    return scaling.from_config(scaling_cfg, cfg.rot_dim, base=cfg.rope_base, max_len=cfg.max_len,
                               seq_len=seq_len)

  def init_cache(self, batch: int, max_len: int) -> KVCache:
    """An empty cache of `max_len` slots per sequence."""
    cfg = self.config
    if cfg.pos_encoding == "learned" and max_len > cfg.max_len:
      raise ValueError(f"learned position embeddings cover {cfg.max_len} positions; a cache of "
                       f"{max_len} would decode past them. Use at most {cfg.max_len}.")
    dt = DTYPES[cfg.dtype]
    shape = (batch, max_len, cfg.n_kv_head, cfg.head_dim)
    zeros = tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layer))
    return KVCache(k=zeros, v=tuple(jnp.zeros(shape, dt) for _ in range(cfg.n_layer)),
                   positions=jnp.zeros((batch, max_len), jnp.int32),
                   length=jnp.zeros((), jnp.int32))

  def embed_tokens(self, tokens_BT, positions_BT):
    """Token embeddings plus, for absolute encodings, the position embeddings: [B, T, E]."""
    cfg = self.config
    dt = DTYPES[cfg.dtype]
    x = self.embed[...].astype(dt)[tokens_BT]
    if cfg.pos_encoding == "learned":
      x = x + self.pos_embed[...].astype(dt)[positions_BT]
    elif cfg.pos_encoding == "sinusoidal":
      x = x + sinusoidal_embedding(positions_BT, cfg.d_model).astype(dt)
    return x

  def _check_positions(self, tokens_BT, positions_BT):
    cfg = self.config
    if cfg.pos_encoding != "learned":
      return
    if tokens_BT.shape[1] > cfg.max_len:
      raise ValueError(f"learned position embeddings cover {cfg.max_len} positions; got a "
                       f"sequence of {tokens_BT.shape[1]} tokens. Use a rotary, sinusoidal, "
                       f"t5_bias or nope model for longer inputs.")
    if positions_BT is not None and not isinstance(positions_BT, jax.core.Tracer):
      top = int(np.max(np.asarray(positions_BT)))
      if top >= cfg.max_len:
        raise ValueError(f"learned position embeddings cover positions 0..{cfg.max_len - 1}; "
                         f"got position {top}")

  # ---------------------------------------------------------------------------- call
  def __call__(self, tokens_BT, positions=None, segment_ids=None, *, cache: KVCache | None = None,
               rope_scaling=FROM_CONFIG):
    """Logits [B, T, V] in float32, or (logits, cache) when a cache is given.

    Args:
      tokens_BT: int tokens.
      positions: [B, T] global positions (default: 0..T-1, or continuing the cache).
      segment_ids: [B, T] document ids for packed sequences (not with a cache).
      cache: a KVCache from `init_cache`; the new tokens are written after its filled slots.
      rope_scaling: a HuggingFace-style dict (or None for plain RoPE) overriding the config's
        for this call, e.g. {"rope_type": "yarn", "factor": L / max_len,
        "original_max_position_embeddings": max_len}, for inference-time context extension.
    """
    tokens_BT = jnp.asarray(tokens_BT)
    if tokens_BT.ndim != 2:
      raise ValueError(f"tokens must be [B, T], got shape {tokens_BT.shape}")
    self._check_positions(tokens_BT, positions)
    B, T = tokens_BT.shape
    if positions is None:
      base = jnp.arange(T, dtype=jnp.int32)[None]
      positions = base if cache is None else base + cache.length
      positions = jnp.broadcast_to(positions, (B, T))
    positions = jnp.asarray(positions).astype(jnp.int32)
    if positions.shape != (B, T):
      raise ValueError(f"positions must be [B, T] = {(B, T)}, got {positions.shape}")
    x = self.embed_tokens(tokens_BT, positions)
    return self.forward_embeddings(x, positions, segment_ids, cache=cache,
                                   rope_scaling=rope_scaling)

  def forward_embeddings(self, x_BTE, positions_BT, segment_ids=None, *, cache=None,
                         rope_scaling=FROM_CONFIG):
    """The transformer from input embeddings (after `embed_tokens`) to logits."""
    cfg = self.config
    B, T, _ = x_BTE.shape
    if cache is not None and segment_ids is not None:
      raise ValueError("segment_ids (packing) cannot be combined with a KV cache")
    if cache is not None:
      L = cache.positions.shape[1]
      if T > L:
        raise ValueError(f"{T} new tokens do not fit a cache of {L} slots")
      if not isinstance(cache.length, jax.core.Tracer) and int(cache.length) + T > L:
        raise ValueError(f"the cache holds {int(cache.length)} of {L} slots; {T} more do not "
                         f"fit. Create it with init_cache(batch, max_len >= total length).")
      start = cache.length
      kv_positions = jax.lax.dynamic_update_slice(cache.positions, positions_BT, (0, start))
      kv_mask = jnp.broadcast_to(jnp.arange(L)[None] < start + T, (B, L))
      seq_len = L
    else:
      kv_positions = kv_mask = start = None
      seq_len = T
    inv_freq, factor = self.rotary_frequencies(seq_len, rope_scaling)
    t5_table = None if self.t5_table is None else self.t5_table[...].astype(jnp.float32)

    call = _block_call
    if cfg.remat != "none":
      policy = (jax.checkpoint_policies.dots_with_no_batch_dims_saveable if cfg.remat == "dots"
                else None)
      call = nnx.remat(_block_call, policy=policy)
    new_k, new_v = [], []
    x = x_BTE
    for i, block in enumerate(self.blocks):
      cache_kv = None if cache is None else (cache.k[i], cache.v[i], start)
      x, kv = call(block, x, positions_BT, segment_ids, inv_freq, factor, t5_table, cache_kv,
                   kv_positions, kv_mask)
      if kv is not None:
        new_k.append(kv[0])
        new_v.append(kv[1])
    x = self.final_norm(x)
    head = self.embed[...].T if self.lm_head is None else self.lm_head[...]
    logits = jnp.einsum("bte,ev->btv", x, head.astype(x.dtype),
                        preferred_element_type=jnp.float32)
    if cache is None:
      return logits
    return logits, KVCache(k=tuple(new_k), v=tuple(new_v), positions=kv_positions,
                           length=start + T)


def count_params(model_or_state) -> int:
  """Number of parameters (works on nnx.eval_shape results: nothing allocated)."""
  state = nnx.state(model_or_state, nnx.Param)
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(state)))


def param_count(config: GPTConfig) -> int:
  """Parameter count of a config, from shapes only."""
  return count_params(nnx.eval_shape(lambda: GPT(config, rngs=nnx.Rngs(0))))


# ------------------------------------------------------------------------------- decoding


def sample_logits(logits_BV, key, *, temperature: float, top_k: Optional[int],
                  valid_vocab: Optional[int] = None):
  """Greedy when temperature == 0, else softmax(logits / temperature) restricted to top_k.
  Ids >= valid_vocab (padding of the embedding table) are never chosen."""
  if valid_vocab is not None and valid_vocab < logits_BV.shape[-1]:
    ids = jnp.arange(logits_BV.shape[-1])[None]
    logits_BV = jnp.where(ids < valid_vocab, logits_BV, -jnp.inf)
  if temperature == 0:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits_BV = logits_BV.astype(jnp.float32) / temperature
  if top_k is not None:
    kth = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV, axis=-1).astype(jnp.int32)


@functools.lru_cache(maxsize=16)
def _generate_fn(graphdef, max_new_tokens, temperature, top_k, valid_vocab, scaling_key):
  rope_scaling = FROM_CONFIG if scaling_key == "_unset" else _thaw_scaling(scaling_key)

  @jax.jit
  def run(state, prompt_BP, cache, rng):
    model = nnx.merge(graphdef, state)
    logits, cache = model(prompt_BP, cache=cache, rope_scaling=rope_scaling)
    keys = jax.random.split(rng, max_new_tokens)
    sample = functools.partial(sample_logits, temperature=temperature, top_k=top_k,
                               valid_vocab=valid_vocab)
    first = sample(logits[:, -1], keys[0])

    def step(carry, key):
      token_B, cache = carry
      logits, cache = model(token_B[:, None], cache=cache, rope_scaling=rope_scaling)
      nxt = sample(logits[:, -1], key)
      return (nxt, cache), token_B

    (last, _), emitted = jax.lax.scan(step, (first, cache), keys[1:])
    return jnp.concatenate([emitted.T, last[:, None]], axis=1)

  return run


def generate(model: GPT, prompt, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, rng=None, valid_vocab: Optional[int] = None,
             rope_scaling=FROM_CONFIG):
  """Prompt [B, P] -> [B, P + max_new_tokens]: a jitted prefill, then a lax.scan of one-token
  decoding steps against the KV cache.

  temperature 0 is greedy (deterministic); top_k restricts sampling to the k likeliest tokens;
  valid_vocab excludes the padded ids a tokenizer never produces (e.g. 257 for bytes).
  """
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must be [B, P] with P >= 1, got shape {prompt.shape}")
  if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
    raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
  if temperature < 0:
    raise ValueError(f"temperature must be >= 0, got {temperature}")
  if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
    raise ValueError(f"top_k must be in [1, vocab_size={model.config.vocab_size}], got {top_k}")
  if temperature > 0 and rng is None:
    raise ValueError("sampling (temperature > 0) needs rng=jax.random.key(...)")
  B, P = prompt.shape
  cache = model.init_cache(B, P + max_new_tokens)
  graphdef, state = nnx.split(model)
  scaling_key = "_unset" if rope_scaling is FROM_CONFIG else _freeze(rope_scaling)
  fn = _generate_fn(graphdef, max_new_tokens, float(temperature), top_k, valid_vocab,
                    scaling_key)
  rng = jax.random.key(0) if rng is None else rng
  return jnp.concatenate([prompt, fn(state, prompt, cache, rng)], axis=1)
