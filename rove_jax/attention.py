"""RoPE and RoVE attention as pure functions over explicit positions.

Shape letters:
  B batch   T query length   S key/value length   H query heads   K key/value heads
  G = H // K query heads per kv head (GQA/MQA)   D head dim   P rotary pairs (2P <= D)

RoPE:  y_i = sum_j A_ij v_j,                A_ij = softmax_j((C R_i q_i).(C R_j k_j) / sqrt(D))
RoVE:  y_i = R_i^-1 sum_j A_ij R_j v_j  =  sum_j A_ij R_{j-i} v_j   (an attentive convolution)

The attention factor convention: C multiplies the rotated dims by the attention factor c (YaRN's
and LongRoPE's temperature) and leaves the pass-through dims of a partial rotary head alone, as
transformers multiplies cos and sin by its `attention_scaling`; at full rotary the logits are
times c^2. It is applied as c^2 on the rotated dims of q alone (the same logits), so keys from a
KV cache (kv_prerotated) carry no factor, and every kernel gets the scaled q and the plain scale
1 / sqrt(D). The value and output rotations are pure rotations in both cases.

Positions are the only source of truth: kv j is visible to query i iff
kv_positions[j] <= q_positions[i] (causal), segment ids are equal (packing) and kv_mask[j] is
set (cache slots). The same code therefore serves training, packed sequences, KV-cache decoding,
sliding-window evaluation and YaRN. A query that sees no key returns zeros.

Kernels (`implementation`): "xla" (jax.nn.dot_product_attention), "cudnn" (cuDNN flash attention
on a CUDA GPU), "splash" (the Pallas splash flash kernel on TPU, rove_jax.splash), "chunked"
(blockwise online softmax in pure JAX), "reference" (materialised einsum, for tests) and
"auto", which picks one per call (`resolve_implementation`). The flash kernels know causality and
packing by index, not by position: a caller whose positions grow with the index inside each
segment (plain aranges, packed documents; T == S) says so with `positions_ordered=True`, and
then "cudnn" and "xla" use their own causal masks ("cudnn" on a Hopper GPU also packed documents,
by their starts and lengths) and "splash" its mask objects, with no [B, T, S] array. Without the
promise every kernel but "splash" builds the mask from positions.
"""

from __future__ import annotations

import functools
import math
from typing import Union

import jax
import jax.numpy as jnp

from rove_jax import kernels, rotary

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "chunked", "reference")
# "auto" on CPU picks the chunked kernel (memory linear in length) from this many keys.
AUTO_CHUNKED_MIN_KV = 8192
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))  # cuDNN flash runs in these

SegmentIds = Union[jax.Array, tuple[jax.Array, jax.Array], None]


# ------------------------------------------------------------------------------- public API


def rope_attention(q, k, v, *, q_positions, kv_positions, inv_freq: rotary.Frequencies,
                   causal: bool = True, attention_factor=1.0, layout: str = "interleaved",
                   segment_ids: SegmentIds = None, kv_mask=None, implementation: str = "xla",
                   chunk_size: int = 512, kv_prerotated: bool = False,
                   positions_ordered: bool = False) -> jax.Array:
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
    attention_factor: c, multiplying the rotated dims of q and k (YaRN, LongRoPE; see the
      module docstring): the logits times c**2 at full rotary. A float or a traced scalar.
    layout: rotary pairing, "interleaved" or "half".
    segment_ids: [B, T] when T == S (packed self-attention) or a pair ([B, T], [B, S]); a query
      sees only keys of its own segment.
    kv_mask: [B, S] bool, False for invalid kv slots (e.g. empty cache entries).
    implementation: "auto" (see `resolve_implementation`), "xla" (jax.nn.dot_product_attention),
      "cudnn" (flash attention on a CUDA GPU), "splash" (flash attention on TPU; needs
      positions_ordered), "chunked" (blockwise online softmax, memory O(T * chunk_size)),
      "reference" (materialized einsum, for tests).
    chunk_size: block length of the "chunked" kernel.
    kv_prerotated: k is already R_{kv_pos} k (for RoVE also v is R_{kv_pos} v), as a KV cache
      stores them; only q (and RoVE's output) are rotated here.
    positions_ordered: a promise that T == S, that query i and kv i share a position and that
      positions increase with the index inside each segment (aranges, packed documents), so
      index-causal masking equals position-causal masking; lets the flash kernels use their own
      masks. Positions still drive the rotations. Not checked (it would need the [T, S] mask).

  Returns:
    [B, T, H, D] in q.dtype.
  """
  return _attention(q, k, v, q_positions, kv_positions, inv_freq,
                    mode="rope", causal=causal,
                    attention_factor=attention_factor, layout=layout, segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    kv_prerotated=kv_prerotated, positions_ordered=positions_ordered)


def rove_attention(q, k, v, *, q_positions, kv_positions, inv_freq: rotary.Frequencies,
                   causal: bool = True, attention_factor=1.0, layout: str = "interleaved",
                   segment_ids: SegmentIds = None, kv_mask=None, implementation: str = "xla",
                   chunk_size: int = 512, kv_prerotated: bool = False,
                   positions_ordered: bool = False, rotate_output: bool = True) -> jax.Array:
  """Rotary Value Embeddings: RoPE attention whose values are rotated by R_j before the kernel
  and whose output is rotated by R_i^-1 after it, so y_i = sum_j A_ij R_{j-i} v_j.

  Same arguments and shapes as `rope_attention`. The rotations wrap any kernel, so the cuDNN
  flash path and the chunked kernel serve RoVE unchanged. rotate_output=False returns R_i y_i,
  the kernel's output before the inverse rotation: the caller applies
  `rotary.rotate(out, q_positions, inv_freq, inverse=True)` itself, e.g. fused with the output
  projection under jax.checkpoint so that training keeps one [B, T, H, D] residual per layer
  instead of two (the kernel's output and the rotated one; see model.Attention).
  """
  return _attention(q, k, v, q_positions, kv_positions, inv_freq,
                    mode="rove", causal=causal,
                    attention_factor=attention_factor, layout=layout, segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    kv_prerotated=kv_prerotated, positions_ordered=positions_ordered,
                    rotate_output=rotate_output)


def masked_attention(q, k, v, *, q_positions, kv_positions, causal: bool = True,
                     segment_ids: SegmentIds = None, kv_mask=None, bias_fn=None,
                     implementation: str = "xla", chunk_size: int = 512,
                     positions_ordered: bool = False) -> jax.Array:
  """Softmax attention without rotations, masked by positions like the rotary functions.

  For position encodings that act elsewhere (NoPE, learned or sinusoidal absolute embeddings)
  or as a logit bias (T5 relative buckets, ALiBi).

  Args:
    q, k, v, q_positions, kv_positions, causal, segment_ids, kv_mask, implementation,
      chunk_size, positions_ordered: as in `rope_attention` (positions [B, T] / [B, S]).
    bias_fn: optional f(q_pos [B, t], kv_pos [B, s]) -> [B, H, t, s] float32 logit bias,
      computed per block by the chunked kernel so no [T, S] array is needed.

  Returns:
    [B, T, H, D] in q.dtype.
  """
  return _attention(q, k, v, q_positions, kv_positions, None, mode="none", causal=causal,
                    attention_factor=1.0, layout="interleaved", segment_ids=segment_ids,
                    kv_mask=kv_mask, implementation=implementation, chunk_size=chunk_size,
                    bias_fn=bias_fn, positions_ordered=positions_ordered)


def dot_product_attention(q_BTHD, k_BSKD, v_BSKD, mask_BTS, *, scale,
                          implementation: str = "xla", chunk_size: int = 512,
                          mask_parts=None, bias_fn=None,
                          positions_ordered: bool = False) -> jax.Array:
  """softmax(scale * q.k + mask) v with GQA, the kernel under both rotary attentions.

  Args:
    q_BTHD, k_BSKD, v_BSKD: already rotated as the caller wants.
    mask_BTS: bool [B, T, S], True where query i may read kv j (rows with no True give 0); None
      where the kernel masks by index (positions_ordered) or per block ("chunked", "splash").
    scale: logit scale.
    implementation: a concrete kernel (see `rope_attention`; "auto" is resolved by the caller).
    mask_parts: the (q_pos, kv_pos, q_seg, kv_seg, kv_mask, causal) pieces the mask is made
      of; the chunked and splash kernels build their masks from them (and need them), and
      bias_fn reads the positions from them.
    bias_fn: optional f(q_pos, kv_pos) -> [B, H, t, s] logit bias (see `masked_attention`).
    positions_ordered: see `rope_attention`.
  """
  if implementation in ("chunked", "splash") and mask_parts is None:
    raise ValueError(f"the {implementation} kernel builds its mask from the positions and "
                     f"segments: pass mask_parts")
  bias = None
  if bias_fn is not None and implementation != "chunked":
    bias = bias_fn(mask_parts[0], mask_parts[1]).astype(jnp.float32)
  if implementation == "reference":
    return kernels.reference_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, bias)
  if implementation == "cudnn" and mask_BTS is None and mask_parts[2] is not None and bias is None:
    _, _, q_seg, _, _, causal = mask_parts  # packed documents; see _attention's by_index
    return kernels.cudnn_packed_kernel(q_BTHD, k_BSKD, v_BSKD, q_seg, scale, causal)
  if implementation in ("xla", "cudnn"):
    causal = None
    if mask_BTS is None:  # index masking: only when positions are ordered and nothing else masks
      causal = bool(mask_parts[5])
    return kernels.xla_kernel(q_BTHD, k_BSKD, v_BSKD, mask_BTS, scale, implementation, bias,
                              is_causal=causal)
  if implementation == "chunked":
    return kernels.chunked_kernel(q_BTHD, k_BSKD, v_BSKD, mask_parts, scale, chunk_size, bias_fn,
                                  positions_ordered=positions_ordered)
  if implementation == "splash":
    from rove_jax import splash  # Pallas imports cost time; only splash users pay them
    _, _, q_seg, kv_seg, kv_valid, causal = mask_parts
    if not positions_ordered or kv_valid is not None or bias is not None:
      raise ValueError("the splash kernel masks by index: it needs positions_ordered=True and "
                       "no kv_mask or bias; use implementation='auto' or 'xla' for other calls")
    return splash.splash_attention(q_BTHD, k_BSKD, v_BSKD, scale=scale, causal=causal,
                                   q_segment_ids=q_seg, kv_segment_ids=kv_seg)
  raise ValueError(f"unknown attention implementation {implementation!r}; expected one of "
                   f"{IMPLEMENTATIONS}")


def target_platform() -> str:
  """The platform being compiled for: that of the mesh set by `jax.set_mesh` (so ahead-of-time
  compiles for a TPU topology from a CPU host choose TPU kernels), else JAX's default backend.
  "cpu", "gpu" or "tpu"."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  platform = jax.default_backend() if device is None else device.platform
  return "gpu" if platform in ("cuda", "rocm") else platform


def resolve_implementation(implementation: str, *, T: int, S: int, H: int, K: int, D: int,
                           dtype, causal: bool, positions_ordered: bool, kv_mask: bool = False,
                           bias: bool = False, platform: str | None = None) -> str:
  """The kernel `implementation` names for one call; "auto" becomes:

  - TPU: "splash" for ordered positions (training, prefill, evaluation windows) whose shapes it
    supports, with no kv_mask or bias; "xla" otherwise (decoding steps, general positions);
  - GPU: "cudnn" for ordered positions in bfloat16/float16 with head dim <= 128, a multiple of
    8, no kv_mask or bias; "xla" otherwise;
  - CPU: "chunked" from AUTO_CHUNKED_MIN_KV keys on (memory O(T * chunk)), else "xla".
  """
  if implementation != "auto":
    return implementation
  platform = target_platform() if platform is None else platform
  plain = positions_ordered and not kv_mask and not bias
  if platform == "tpu":
    from rove_jax import splash
    ok = plain and splash.unsupported_reason(T, S, H, K, D, causal=causal) is None
    return "splash" if ok else "xla"
  if platform == "gpu":
    half = jnp.dtype(dtype) in _CUDNN_DTYPES
    return "cudnn" if plain and half and D <= 128 and D % 8 == 0 else "xla"
  return "chunked" if S >= AUTO_CHUNKED_MIN_KV else "xla"


def attention_mask(q_positions_BT, kv_positions_BS, *, causal: bool = True,
                   segment_ids: SegmentIds = None, kv_mask_BS=None) -> jax.Array:
  """The bool visibility mask [B, T, S] from positions, segments and kv validity."""
  q_seg, kv_seg = _split_segments(segment_ids)
  return kernels.mask_block(q_positions_BT, kv_positions_BS, q_seg, kv_seg, kv_mask_BS, causal)


# ------------------------------------------------------------------------------ internals


def _attention(q, k, v, q_positions, kv_positions, inv_freq, *, mode, causal, attention_factor,
               layout, segment_ids, kv_mask, implementation, chunk_size, kv_prerotated=False,
               bias_fn=None, positions_ordered=False, rotate_output=True):
  """mode "rope" | "rove" | "none": validation, rotations around the kernel, masks (RoVE's
  output rotated back by R_i^-1 unless rotate_output is False)."""
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  same_positions = kv_positions is q_positions
  q_positions = jnp.asarray(q_positions)
  kv_positions = q_positions if same_positions else jnp.asarray(kv_positions)
  rotary_mode = mode != "none"
  multi_axis = rotary_mode and rotary.is_multi_axis(inv_freq)
  _validate(q, k, v, q_positions, kv_positions, inv_freq, causal=causal, layout=layout,
            segment_ids=segment_ids, kv_mask=kv_mask, implementation=implementation,
            chunk_size=chunk_size, positions_ordered=positions_ordered)
  B, T, H, D = q.shape
  S, K = k.shape[1], k.shape[2]
  implementation = resolve_implementation(
      implementation, T=T, S=S, H=H, K=K, D=D, dtype=q.dtype, causal=causal,
      positions_ordered=positions_ordered, kv_mask=kv_mask is not None, bias=bias_fn is not None)
  _check_kernel(implementation, q, T=T, S=S, H=H, K=K, D=D, causal=causal,
                positions_ordered=positions_ordered)
  pos_tail = q_positions.shape[2:]
  q_pos = jnp.broadcast_to(q_positions, (B, T) + pos_tail)
  kv_pos = q_pos if same_positions else jnp.broadcast_to(kv_positions, (B, S) + pos_tail)

  q_r, k_r, v_r = q, k, v
  if rotary_mode:
    # One pair of full-width tables per position set, shared by q and the output and by k
    # and v: the backward pass keeps one pair, not one per rotated tensor.
    expand = functools.partial(rotary.expand_tables, head_dim=D, layout=layout, dtype=q.dtype)
    rot = functools.partial(rotary.apply_expanded, layout=layout)
    q_tab = expand(*rotary.rotary_tables(q_pos, inv_freq))
    q_r = rot(factor_on_rotated(q, attention_factor, 2 * rotary.n_frequencies(inv_freq)),
              q_tab).astype(q.dtype)
    if not kv_prerotated:
      kv_tab = q_tab if same_positions else expand(*rotary.rotary_tables(kv_pos, inv_freq))
      k_r = rot(k, kv_tab)
      v_r = rot(v, kv_tab) if mode == "rove" else v

  scale = 1.0 / math.sqrt(D)  # the attention factor is in q_r
  q_seg, kv_seg = _split_segments(segment_ids)
  # Causal masking compares scalar positions; multi-axis positions are for bidirectional use.
  mask_q_pos = q_pos[..., 0] if multi_axis else q_pos
  mask_kv_pos = kv_pos[..., 0] if multi_axis else kv_pos
  parts = (mask_q_pos, mask_kv_pos, q_seg, kv_seg, kv_mask, causal)
  # Index masks where the kernel has them and nothing position-specific is left to mask:
  # cuDNN also takes packed documents by their starts and lengths (one set of segment ids for
  # queries and keys, a Hopper GPU or later).
  cudnn_packed = (implementation == "cudnn" and q_seg is not None and kv_seg is q_seg
                  and bias_fn is None and kernels.cudnn_packs())
  by_index = (implementation in ("chunked", "splash") or
              (implementation in ("xla", "cudnn") and positions_ordered and kv_mask is None
               and (q_seg is None or cudnn_packed)))
  mask = None if by_index else kernels.mask_block(*parts)
  out = dot_product_attention(q_r, k_r, v_r, mask, scale=scale, implementation=implementation,
                              chunk_size=chunk_size, mask_parts=parts, bias_fn=bias_fn,
                              positions_ordered=positions_ordered)
  if mode == "rove" and rotate_output:
    out = rot(out, q_tab, inverse=True)
  return out


def factor_on_rotated(q_BTHD, attention_factor, n_rotated: int):
  """q with its first n_rotated dims (those the rotation turns) times attention_factor**2: the
  convention of the module docstring (also used by the model's Figure-1 weights). Scaling
  commutes with the rotation of those dims, so it is applied before it, in float32, and q is
  rounded to its dtype once, after the rotation. A static factor of 1 returns q unchanged."""
  if not isinstance(attention_factor, jax.Array) and float(attention_factor) == 1.0:
    return q_BTHD
  D = q_BTHD.shape[-1]
  c2 = jnp.asarray(attention_factor, jnp.float32) ** 2
  c2_D = jnp.where(jnp.arange(D) < n_rotated, c2, jnp.float32(1.0))
  compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)
  return q_BTHD.astype(compute) * c2_D.astype(compute).reshape((1,) * (q_BTHD.ndim - 1) + (D,))


def _split_segments(segment_ids):
  if segment_ids is None:
    return None, None
  if isinstance(segment_ids, (tuple, list)):
    q_seg, kv_seg = segment_ids
    return jnp.asarray(q_seg), jnp.asarray(kv_seg)
  segment_ids = jnp.asarray(segment_ids)
  return segment_ids, segment_ids


def _validate(q, k, v, q_positions, kv_positions, inv_freq, *, causal, layout, segment_ids,
              kv_mask, implementation, chunk_size, positions_ordered=False):
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
  if positions_ordered and (T != S or multi):
    raise ValueError(f"positions_ordered=True promises self-attention over 1-D positions that "
                     f"grow with the index (T == S); got T={T}, S={S}"
                     f"{' and multi-axis positions' if multi else ''}. Leave it False here.")
  if implementation == "chunked" and not (isinstance(chunk_size, int) and chunk_size > 0):
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def _check_kernel(implementation, q, *, T, S, H, K, D, causal, positions_ordered):
  """Errors for a concrete kernel that cannot run this call (after "auto" is resolved)."""
  if implementation == "cudnn":
    platform = target_platform()
    if platform != "gpu":
      raise ValueError(f"implementation='cudnn' needs a CUDA GPU but the target platform here "
                       f"is {platform!r}; use 'auto', 'xla' or 'chunked'")
    if q.dtype not in _CUDNN_DTYPES:
      raise ValueError(f"implementation='cudnn' runs in bfloat16/float16, got q.dtype={q.dtype}; "
                       f"cast q, k, v (e.g. the model's dtype='bfloat16')")
  if implementation == "splash":
    from rove_jax import splash
    if not positions_ordered:
      raise ValueError("implementation='splash' masks by index: pass positions_ordered=True "
                       "(positions that grow with the index, T == S), or use 'auto', which "
                       "falls back to 'xla' for other calls")
    reason = splash.unsupported_reason(T, S, H, K, D, causal=causal)
    if reason is not None:
      raise ValueError(f"implementation='splash' cannot run this call: {reason}; use 'auto' "
                       f"(falls back to 'xla') or 'chunked'")
