"""Which keys each query sees: the `Mask` value every kernel reads, and its dense form.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values.

Key j is visible to query i iff all of these hold:
  causal          kv_pos[j] <= q_pos[i]
  segments        kv_segment_ids[j] == segment_ids[i] (packed documents)
  kv_valid        kv_valid[j] (e.g. the filled slots of a KV cache)
  window          q_pos[i] - kv_pos[j] < window (a sliding window)
Positions decide, not indices. `ordered` is a promise the flash kernels rely on to mask by index
instead: T == S, query i and key i share a position, and positions grow with the index inside
each segment (aranges, packed documents), so index-causal masking equals position-causal
masking. It is not checked (that would need the [T, S] mask).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared by identity
class Mask:
  """The visibility rules of one attention call; a pytree whose arrays are its leaves and whose
  flags are static.

  Attributes:
    causal: hide keys at later positions than the query.
    segment_ids: int [B, T] document of each query, or None (no packing).
    kv_segment_ids: int [B, S] document of each key; None: segment_ids (self-attention, T == S).
    kv_valid: bool [B, S], False for keys no query may read (empty cache slots), or None.
    ordered: the promise of the module docstring (lets flash kernels mask by index).
    window: a sliding window: key j visible only if q_pos[i] - kv_pos[j] < window; None: none.
  """

  causal: bool = dataclasses.field(default=True, metadata=dict(static=True))
  segment_ids: Optional[jax.Array] = None
  kv_segment_ids: Optional[jax.Array] = None
  kv_valid: Optional[jax.Array] = None
  ordered: bool = dataclasses.field(default=False, metadata=dict(static=True))
  window: Optional[int] = dataclasses.field(default=None, metadata=dict(static=True))

  def __post_init__(self):
    w = self.window
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
      raise ValueError(f"window must be a positive int (or None), got {w!r}")

  @property
  def self_segments(self) -> bool:
    """One set of segment ids for queries and keys (or none at all)."""
    return self.kv_segment_ids is None or self.kv_segment_ids is self.segment_ids

  def segments(self):
    """(query segment ids [B, T], key segment ids [B, S]) as arrays, or (None, None)."""
    if self.segment_ids is None:
      return None, None
    q_seg = jnp.asarray(self.segment_ids)
    return q_seg, q_seg if self.self_segments else jnp.asarray(self.kv_segment_ids)

  def check(self, B: int, T: int, S: int) -> None:
    """ValueError when the arrays do not fit queries [B, T] and keys [B, S]."""
    if self.kv_segment_ids is not None and self.segment_ids is None:
      raise ValueError(
        "kv_segment_ids without segment_ids: pass both (or segment_ids alone for self-attention)"
      )
    q_seg, kv_seg = self.segments()
    if q_seg is not None and (q_seg.shape != (B, T) or kv_seg.shape != (B, S)):
      raise ValueError(
        f"segment_ids must be [B, T] = {(B, T)} (self-attention) or, with "
        f"kv_segment_ids, ([B, T], [B, S]) = ({(B, T)}, {(B, S)}); got "
        f"{q_seg.shape}, {kv_seg.shape}"
      )
    if self.kv_valid is not None and jnp.shape(self.kv_valid) != (B, S):
      raise ValueError(
        f"kv_valid (the kv mask) must be [B, S] = {(B, S)}, got {jnp.shape(self.kv_valid)}"
      )
    if self.ordered and T != S:
      raise ValueError(
        f"Mask(ordered=True) promises self-attention over positions that grow "
        f"with the index (T == S); got T={T}, S={S}. Leave it False here."
      )

  def dense(self, q_pos_BT, kv_pos_BS) -> jax.Array:
    """The bool mask [B, T, S] for 1-D positions: True where query i may read key j."""
    q_seg, kv_seg = self.segments()
    return visible(q_pos_BT, kv_pos_BS, q_seg, kv_seg, self.kv_valid, self.causal, self.window)


def visible(
  q_pos_BT, kv_pos_BS, q_seg_BT, kv_seg_BS, kv_valid_BS, causal: bool, window: Optional[int]
) -> jax.Array:
  """bool [B, T, S] from the mask's parts (any of the arrays None); the chunked kernel calls it
  on blocks of queries and keys."""
  B, T = q_pos_BT.shape[:2]
  S = kv_pos_BS.shape[1]
  mask = jnp.ones((B, T, S), dtype=bool)
  if causal:
    mask = kv_pos_BS[:, None, :] <= q_pos_BT[:, :, None]
  if q_seg_BT is not None:
    mask = mask & (q_seg_BT[:, :, None] == kv_seg_BS[:, None, :])
  if kv_valid_BS is not None:
    mask = mask & kv_valid_BS.astype(bool)[:, None, :]
  if window is not None:
    mask = mask & (q_pos_BT[:, :, None] - kv_pos_BS[:, None, :] < window)
  return mask
