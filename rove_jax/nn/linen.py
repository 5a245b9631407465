"""RoPE / RoVE self-attention as a Flax Linen module, for Linen codebases.

Drop-in for a Linen transformer block: where the block builds its self-attention module,
build `RotarySelfAttention(num_heads=..., pos_encoding="rove")` instead. It calls the same pure
functions as the NNX model (`rove_jax.attention`), so numbers agree across the two.

Shape letters (legend in rove_jax): B batch, T length, E features, H heads, K kv heads,
D head dim.
"""

from __future__ import annotations

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from rove_jax import attention, rotary, scaling
from rove_jax.kernels import Mask


class RotarySelfAttention(nn.Module):
  """Causal (or bidirectional) self-attention with RoPE or RoVE.

  Attributes:
    num_heads: query heads H.
    num_kv_heads: key/value heads K (None: H).
    head_dim: D (None: features // num_heads).
    pos_encoding: "rove" or "rope".
    rope_base, rotary_fraction, layout, rope_scaling: the rotary setup (rope_scaling a
      scaling.RopeScaling or a transformers-style dict, see rove_jax.scaling).
    causal: mask future positions.
    implementation: "auto" | "xla" | "cudnn" | "splash" | "chunked" | "reference" (see
      rove_jax.kernels.dispatch; "auto" picks splash on TPU, cudnn on GPU in bf16, xla on CPU).
    use_bias: biases on the projections.
    dtype: compute dtype; parameters stay in param_dtype.
  """

  num_heads: int
  num_kv_heads: Optional[int] = None
  head_dim: Optional[int] = None
  pos_encoding: str = "rove"
  rope_base: float = 10000.0
  rotary_fraction: float = 1.0
  layout: str = "interleaved"
  rope_scaling: Any = None
  causal: bool = True
  implementation: str = "auto"
  use_bias: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Any = nn.initializers.normal(0.02)

  @nn.compact
  def __call__(self, x_BTE, positions=None, segment_ids=None):
    """x [B, T, E] -> [B, T, E]; positions [B, T] default to 0..T-1 (then the flash kernels
    mask by index; explicit positions are taken as general, see rove_jax.kernels.mask)."""
    if self.pos_encoding not in ("rove", "rope"):
      raise ValueError(
        f"RotarySelfAttention: pos_encoding must be 'rove' or 'rope', got {self.pos_encoding!r}"
      )
    B, T, E = x_BTE.shape
    H = self.num_heads
    K = self.num_kv_heads or H
    D = self.head_dim or E // H
    if self.head_dim is None and E % H:
      raise ValueError(
        f"RotarySelfAttention: features {E} not divisible by num_heads {H}; set head_dim"
      )
    rot_dim = int(round(D * self.rotary_fraction))
    inv_freq, factor = scaling.from_config(
      self.rope_scaling, rot_dim, base=self.rope_base, seq_len=T
    )
    ordered = positions is None
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32)[None], (B, T))

    def dense(name, heads):
      return nn.DenseGeneral(
        (heads, D),
        use_bias=self.use_bias,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=self.kernel_init,
        name=name,
      )

    q = dense("query", H)(x_BTE)
    k = dense("key", K)(x_BTE)
    v = dense("value", K)(x_BTE)
    fn = attention.rove_attention if self.pos_encoding == "rove" else attention.rope_attention
    out_BTHD = fn(
      q,
      k,
      v,
      q_positions=positions,
      kv_positions=positions,
      rope=rotary.Rope(inv_freq, factor, self.layout),
      mask=Mask(causal=self.causal, segment_ids=segment_ids, ordered=ordered),
      kernel=self.implementation,
    )
    return nn.DenseGeneral(
      E,
      axis=(-2, -1),
      use_bias=self.use_bias,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      kernel_init=self.kernel_init,
      name="out",
    )(out_BTHD)
