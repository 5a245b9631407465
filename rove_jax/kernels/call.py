"""The kernel boundary: one typed record per attention call, and the kernel object that takes it.

Shape letters (legend in rove_jax): B batch, T queries, S keys/values, H query heads,
K key/value heads, D head dim.

Every kernel is `Kernel.attend(call: KernelCall) -> [B, T, H, D]` in q's dtype, whose rows that
see no key are 0. Most kernels take q, k, v already rotated (rove_jax.attention rotates them and,
for RoVE, rotates the output back). A kernel whose `rotates` is true takes them unrotated with
the call's Rope and applies every rotation of the call itself, in fast memory (the fused
kernels); `kind` says which.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import jax

from rove_jax.kernels.mask import Mask

KINDS = ("rope", "rove", "rove_rotated")  # what a rotating kernel applies (KernelCall.kind)


class KernelCall(NamedTuple):
  """One attention call as a kernel receives it.

  Fields:
    q_BTHD, k_BSKD, v_BSKD: queries [B, T, H, D], keys and values [B, S, K, D], H % K == 0;
      rotated unless the kernel rotates inside.
    mask: which keys each query sees (kernels.Mask).
    q_pos_BT, kv_pos_BS: the positions the mask compares, [B, T] and [B, S].
    scale: the logit scale, 1 / sqrt(D) from rove_jax.attention (the attention factor is in q).
    bias_fn: optional f(q_pos [B, t], kv_pos [B, s]) -> [B, H, t, s] logit bias.
    rope: for a kernel that rotates inside, the rotary.Rope it applies; None otherwise.
    kind: for a kernel that rotates inside, one of KINDS: "rope" (q and k), "rove" (v by R_j
      and the output by R_i^-1 too) or "rove_rotated" (v, the output left as R_i y_i).
    qkv_BT3HD: for a kernel that rotates inside, the [B, T, 3, H, D] buffer q, k and v are
      the slices [:, :, 0], [:, :, 1], [:, :, 2] of, when they are (one projection's output:
      rove_jax.attention.packed_attention): such a kernel may read them there in place rather
      than from copies (the Hopper fused kernel does). None otherwise.
  """

  q_BTHD: jax.Array
  k_BSKD: jax.Array
  v_BSKD: jax.Array
  mask: Mask
  q_pos_BT: jax.Array
  kv_pos_BS: jax.Array
  scale: float
  bias_fn: Optional[Callable] = None
  rope: Any = None
  kind: str = "rope"
  qkv_BT3HD: Optional[jax.Array] = None


@dataclasses.dataclass(frozen=True)
class Kernel:
  """An attention kernel: `attend(call)` -> [B, T, H, D] in q's dtype.

  rotates: it takes unrotated q, k, v and `call.rope`, and applies the rotations `call.kind`
  names itself; otherwise it takes them rotated and ignores rope and kind.
  half_pairs: it rotates the half layout's pairs (m, m + r) more cheaply than the interleaved
  layout's (2m, 2m + 1) (the Hopper fused kernel: column slices against a swap-matrix
  product), so a caller that can rename its head dims (rotary.half_order) should hand it the
  half layout.
  """

  name: str
  attend: Callable[[KernelCall], jax.Array]
  rotates: bool = False
  half_pairs: bool = False

  @classmethod
  def coerce(cls, kernel) -> "Kernel":
    """A Kernel as is; a plain function f(call) as a kernel on rotated inputs."""
    if isinstance(kernel, cls):
      return kernel
    if not callable(kernel):
      raise ValueError(
        f"kernel must be a name, a kernels.Kernel or a function of a "
        f"kernels.KernelCall, got {type(kernel).__name__}: {kernel!r}"
      )
    return cls(getattr(kernel, "__name__", "custom"), kernel)
