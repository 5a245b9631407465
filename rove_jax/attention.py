"""RoPE and RoVE attention as pure functions over explicit positions.

Shape letters:
  B batch   T query length   S key/value length   H query heads   K key/value heads
  D head dim   A position axes

RoPE:  y_i = sum_j A_ij v_j,                A_ij = softmax_j((C R_i q_i).(C R_j k_j) / sqrt(D))
RoVE:  y_i = R_i^-1 sum_j A_ij R_j v_j  =  sum_j A_ij R_{j-i} v_j   (an attentive convolution)

The attention factor convention: C multiplies the rotated dims by the attention factor c (YaRN's
and LongRoPE's temperature) and leaves the pass-through dims of a partial rotary head alone, as
transformers multiplies cos and sin by its `attention_scaling`; at full rotary the logits are
times c^2. It is applied as c^2 on the rotated dims of q alone (`Rope.scale_query`; the same
logits), so keys from a KV cache carry no factor, and every kernel gets the scaled q and the
plain scale 1 / sqrt(D). The value and output rotations are pure rotations in both cases.

Positions are the only source of truth: a `Mask` says which keys each query sees from them
(causal by position, packed segments, valid kv slots, a sliding window; see
rove_jax.kernels.mask), so one code path serves training, packing, KV-cache decoding,
sliding-window evaluation and YaRN. A query that sees no key returns zeros.

`kernel` is a name ("auto", "xla", "cudnn", "splash", "chunked", "reference", "fused"; see
rove_jax.kernels.dispatch), a `kernels.Kernel`, e.g. from `rove_jax.kernels.select` or
`rove_jax.kernels.chunked.kernel(chunk_size)`, or a function of one `kernels.KernelCall` (the
record every kernel takes; rove_jax.kernels.call). The rotations wrap any kernel, so the flash
kernels serve RoVE unchanged. A kernel whose `rotates` is true is the exception ("fused": a
Pallas kernel that applies every rotation of the call to tiles in fast memory,
rove_jax.kernels.fused): it gets the unrotated q, k, v with the Rope, the call whole. A KV cache
stores
R_j k_j (and, RoVE, R_j v_j): a decoding step rotates its queries with `rotate_queries`, calls
`masked_attention` on the cache and, for RoVE, rotates the output back
(rove_jax.nn.attention_layer.Attention does this).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp

from rove_jax import kernels
from rove_jax.kernels import KernelCall, Mask
from rove_jax.rotary import Rope

# A kernel name (kernels.IMPLEMENTATIONS), a kernels.Kernel, or a function f(kernels.KernelCall)
# on rotated inputs.
KernelArg = Union[str, kernels.Kernel, Callable]


def rope_attention(
  q,
  k,
  v,
  *,
  q_positions,
  kv_positions,
  rope: Rope,
  mask: Optional[Mask] = None,
  kernel: KernelArg = "xla",
) -> jax.Array:
  """Attention with rotary queries and keys (RoPE).

  Args:
    q: [B, T, H, D] queries (before rotation).
    k: [B, S, K, D] keys (before rotation), H % K == 0.
    v: [B, S, K, D] values.
    q_positions: [B, T] (or [T]) positions of the queries, int or float; [B, T, A] for a Rope
      of A tables (multi-axis, bidirectional masks only).
    kv_positions: [B, S] (or [S], [B, S, A]) positions of the keys and values.
    rope: the rotary setup (tables, attention factor, layout).
    mask: which keys each query sees (default: causal by position).
    kernel: a kernel name, a kernels.Kernel or a function of a kernels.KernelCall (module
      docstring).

  Returns:
    [B, T, H, D] in q.dtype.
  """
  return _attention(_prepare(q, k, v, q_positions, kv_positions, rope, mask), kernel, "rope")


def rove_attention(
  q,
  k,
  v,
  *,
  q_positions,
  kv_positions,
  rope: Rope,
  mask: Optional[Mask] = None,
  kernel: KernelArg = "xla",
) -> jax.Array:
  """Rotary Value Embeddings: RoPE attention whose values are rotated by R_j before the kernel
  and whose output is rotated by R_i^-1 after it, so y_i = sum_j A_ij R_{j-i} v_j. Arguments
  and shapes as in `rope_attention`."""
  return _attention(_prepare(q, k, v, q_positions, kv_positions, rope, mask), kernel, "rove")


def rove_attention_rotated(
  q,
  k,
  v,
  *,
  q_positions,
  kv_positions,
  rope: Rope,
  mask: Optional[Mask] = None,
  kernel: KernelArg = "xla",
) -> jax.Array:
  """`rove_attention` before its last step: R_i y_i, the kernel's output. The caller applies
  `rope.rotate(out, q_positions, inverse=True)` itself, e.g. fused with the output projection
  under jax.checkpoint so that training keeps one [B, T, H, D] residual per layer instead of
  two (the kernel's output and the rotated one; see rove_jax.nn.attention_layer.Attention)."""
  return _attention(
    _prepare(q, k, v, q_positions, kv_positions, rope, mask), kernel, "rove_rotated"
  )


def packed_attention(
  qkv,
  *,
  kind: str,
  q_positions,
  kv_positions,
  rope: Rope,
  mask: Optional[Mask] = None,
  kernel: KernelArg = "xla",
) -> jax.Array:
  """`rope_attention` (kind "rope"), `rove_attention` ("rove") or `rove_attention_rotated`
  ("rove_rotated") of q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]: the same result.
  A kernel that reads q, k and v in place (KernelCall.qkv_BT3HD: the Hopper fused kernel) gets
  the buffer itself, so no copies of q, k and v are made for it.

  Args:
    qkv: [B, T, 3, H, D], q, k and v stacked on axis 2 (multi-head attention, K = H), e.g. one
      fused projection's output.
    kind: "rope", "rove" or "rove_rotated".
    Others: as in `rope_attention`.

  Returns:
    [B, T, H, D] in qkv.dtype.
  """
  qkv = jnp.asarray(qkv)
  if qkv.ndim != 5 or qkv.shape[2] != 3:
    raise ValueError(
      f"qkv must be [B, T, 3, H, D] (q, k, v stacked on axis 2), got shape {qkv.shape}"
    )
  if kind not in kernels.KINDS:
    raise ValueError(f"kind must be one of {kernels.KINDS}, got {kind!r}")
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  c = _prepare(q, k, v, q_positions, kv_positions, rope, mask)
  return _attention(c, kernel, kind, qkv=qkv)


def masked_attention(
  q,
  k,
  v,
  *,
  q_positions,
  kv_positions,
  mask: Optional[Mask] = None,
  kernel: KernelArg = "xla",
  bias_fn=None,
) -> jax.Array:
  """Softmax attention without rotations, masked by positions like the rotary functions: for
  position encodings that act elsewhere (NoPE, absolute embeddings), as a logit bias (T5
  buckets, ALiBi), or on keys and values rotated beforehand (a KV cache's).

  Args:
    q, k, v, q_positions, kv_positions, mask, kernel: as in `rope_attention` (positions
      [B, T] / [B, S]).
    bias_fn: optional f(q_pos [B, t], kv_pos [B, s]) -> [B, H, t, s] float32 logit bias,
      computed per block by the chunked kernel so no [T, S] array is needed.

  Returns:
    [B, T, H, D] in q.dtype.
  """
  c = _prepare(q, k, v, q_positions, kv_positions, None, mask)
  return _attention(c, kernel, None, bias_fn)


def rotate_queries(q_BTHD, q_positions, rope: Rope):
  """(C^2 R_i q_i in q.dtype, the expanded tables of q_positions): the query side of the rotary
  functions, also what a decoding step applies before attending to a KV cache."""
  q_tables = rope.tables(q_positions, q_BTHD.shape[-1], q_BTHD.dtype)
  return rope.apply(rope.scale_query(q_BTHD), q_tables).astype(q_BTHD.dtype), q_tables


# ------------------------------------------------------------------------------ internals


class _Call(NamedTuple):
  """One call's inputs, validated, with positions broadcast to [B, T(, A)] / [B, S(, A)]."""

  q: jax.Array
  k: jax.Array
  v: jax.Array
  q_pos: jax.Array
  kv_pos: jax.Array
  mask: Mask
  rope: Optional[Rope]  # None: attention without rotation (masked_attention)
  same_positions: bool  # kv_positions is q_positions: one set of tables serves both


def _prepare(q, k, v, q_positions, kv_positions, rope, mask) -> _Call:
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  same = kv_positions is q_positions
  q_positions = jnp.asarray(q_positions)
  kv_positions = q_positions if same else jnp.asarray(kv_positions)
  mask = Mask() if mask is None else mask
  _validate(q, k, v, q_positions, kv_positions, rope, mask)
  (B, T), S = q.shape[:2], k.shape[1]
  tail = q_positions.shape[2:]
  q_pos = jnp.broadcast_to(q_positions, (B, T) + tail)
  kv_pos = q_pos if same else jnp.broadcast_to(kv_positions, (B, S) + tail)
  return _Call(q, k, v, q_pos, kv_pos, mask, rope, same)


def _attention(
  c: _Call, kernel: KernelArg, kind: Optional[str], bias_fn=None, qkv=None
) -> jax.Array:
  """The one body of the attention functions: kind "rope", "rove" or "rove_rotated" with a
  Rope (kernels.KINDS), None without one. A kernel that rotates inside gets the unrotated call
  and its Rope (and qkv, the buffer q, k, v are slices of, when there is one); any other gets
  q, k (and, RoVE, v) rotated here, and for "rove" its output is rotated back by R_i^-1. The
  scale is 1 / sqrt(D): the attention factor is in q."""
  rope = c.rope
  kernel = _kernel(kernel, c, bias_fn is not None)
  q_pos, kv_pos = (
    (c.q_pos[..., 0], c.kv_pos[..., 0])
    if rope is not None and rope.multi_axis
    else (c.q_pos, c.kv_pos)
  )  # multi-axis positions mask by their first axis (_validate)
  call = KernelCall(
    c.q,
    c.k,
    c.v,
    c.mask,
    q_pos,
    kv_pos,
    1.0 / math.sqrt(c.q.shape[-1]),
    bias_fn,
    rope,
    kind or "rope",
    qkv if rope is not None else None,
  )
  if rope is None or kernel.rotates:
    return kernel.attend(call)
  q_r, k_r, v_r, q_tables = _rotate(c, values=kind != "rope")
  rotated = dict(q_BTHD=q_r, k_BSKD=k_r, v_BSKD=v_r, rope=None, qkv_BT3HD=None)
  out = kernel.attend(call._replace(**rotated))
  return rope.apply(out, q_tables, inverse=True) if kind == "rove" else out


def _kernel(kernel: KernelArg, c: _Call, bias: bool) -> kernels.Kernel:
  if isinstance(kernel, str):
    return kernels.select(kernel, q=c.q, k=c.k, mask=c.mask, bias=bias, rope=c.rope)
  return kernels.Kernel.coerce(kernel)


def _rotate(c: _Call, values: bool):
  """(C^2 R q, R k, R v if values else v, q's tables). One pair of full-width tables per
  position set, shared by q and the output and by k and v: the backward pass keeps one pair,
  not one per rotated tensor."""
  q_r, q_tables = rotate_queries(c.q, c.q_pos, c.rope)
  kv_tables = q_tables if c.same_positions else c.rope.tables(c.kv_pos, c.q.shape[-1], c.q.dtype)
  k_r = c.rope.apply(c.k, kv_tables)
  return q_r, k_r, c.rope.apply(c.v, kv_tables) if values else c.v, q_tables


def _validate(q, k, v, q_positions, kv_positions, rope, mask):
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(
      f"q, k, v must be [B, T, H, D], [B, S, K, D], [B, S, K, D]; got shapes "
      f"{q.shape}, {k.shape}, {v.shape}"
    )
  B, T, H, D = q.shape
  if k.shape != v.shape:
    raise ValueError(f"k and v must have the same shape [B, S, K, D], got {k.shape} and {v.shape}")
  if k.shape[0] != B or k.shape[3] != D:
    raise ValueError(f"k {k.shape} must share batch B={B} and head dim D={D} with q {q.shape}")
  S, K = k.shape[1], k.shape[2]
  if H % K:
    raise ValueError(
      f"query heads H={H} must be a multiple of kv heads K={K} (GQA groups "
      f"query head h onto kv head h // (H / K))"
    )
  n_rotated = 0 if rope is None else rope.n_rotated
  if n_rotated > D:
    raise ValueError(
      f"{n_rotated // 2} rotary frequencies need {n_rotated} dims but the head "
      f"dimension D is {D}; use a shorter table (partial rotary)"
    )
  multi = rope is not None and rope.multi_axis
  tail = (len(rope.inv_freq),) if multi else ()
  for name, pos, n in (("q_positions", q_positions, T), ("kv_positions", kv_positions, S)):
    want = (B, n) + tail
    if pos.shape != want and pos.shape != (n,) + tail and pos.shape != (1, n) + tail:
      raise ValueError(f"{name} must have shape {want} (or {(n,) + tail}), got {pos.shape}")
  if multi and (mask.causal or mask.window is not None or mask.ordered):
    raise ValueError(
      "causal masks, windows and ordered positions need 1-D positions; multi-axis "
      "(image/video) positions are for bidirectional attention: pass "
      "mask=Mask(causal=False)"
    )
  mask.check(B, T, S)
