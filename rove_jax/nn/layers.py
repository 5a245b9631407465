"""The GPT's building blocks besides attention: parameter initialisers with logical axis names,
the dense projections, LayerNorm / RMSNorm, and the MLP with its fused bias + tanh-GELU (a
custom VJP that keeps only the matmul output for the backward pass).

Shape letters (legend in rove_jax): B batch, T tokens, E model width, F MLP width.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from rove_jax.kernels import mesh as kernel_mesh
from rove_jax.nn.act_sharding import constrain
from rove_jax.nn.model_config import DTYPES, GPTConfig


def _normal(rngs, shape, std, dtype):
  return jax.random.normal(rngs.params(), shape, dtype) * std


def _param(rngs, shape, std, axes, dtype):
  return nnx.Param(_normal(rngs, shape, std, dtype), logical_axes=axes)


def _const(shape, value, axes, dtype):
  return nnx.Param(jnp.full(shape, value, dtype), logical_axes=axes)


def _lead(v, ndim):
  """Explicit leading unit dims (the project runs with rank promotion raising)."""
  return v.reshape((1,) * (ndim - v.ndim) + v.shape)


def _heads_split() -> bool:
  """Whether the active mesh (jax.set_mesh) splits the heads: a tensor axis of size > 1."""
  mesh = jax.sharding.get_abstract_mesh()
  return (
    not mesh.empty and dict(zip(mesh.axis_names, mesh.axis_sizes)).get(kernel_mesh.HEAD_AXIS, 1) > 1
  )


def _features(h):
  """An MLP's hidden activations [..., F]: rows split as the batch, features over tensor."""
  return constrain(h, "batch", *([None] * (h.ndim - 2)), "mlp")


def _dense(x_BTE, w, b):
  """x @ w (+ b) for a weight [E, ...] whose trailing axes become the output's.

  Unless the heads are split over a tensor-parallel mesh axis, the product is taken with the
  trailing axes flattened to one and the bias added along it, so that on GPUs the bias rides in
  the GEMM's epilogue instead of being broadcast to a full [B, T, ...] tensor the GEMM then
  reads back. (Flattening [3, H, D] with H split would make GSPMD reshard the product.)
  """
  if w.ndim > 2 and _heads_split():
    y = jnp.einsum("bte,e...->bt...", x_BTE, w[...].astype(x_BTE.dtype))
    return y if b is None else y + _lead(b[...].astype(y.dtype), y.ndim)
  w_EF = w[...].astype(x_BTE.dtype)
  out_shape = x_BTE.shape[:-1] + w_EF.shape[1:]
  w_EF = w_EF.reshape(w_EF.shape[0], -1)
  y = jnp.einsum("bte,ef->btf", x_BTE, w_EF)
  if b is not None:
    y = y + _lead(b[...].astype(y.dtype).reshape(-1), y.ndim)
  return y.reshape(out_shape)


class Norm(nnx.Module):
  """LayerNorm or RMSNorm, computed in float32.

  LayerNorm's variance is E[x^2] - E[x]^2, as flax's LayerNorm computes it by default
  (use_fast_variance): the two means are sums over the same row, which XLA's GPU compiler
  takes in one pass, where E[(x - E[x])^2] needs a second pass after the mean, in the forward
  pass and again in the backward pass (bench/RESULTS.md). The price is cancellation in a row
  whose mean is far from zero: about (mean / std)^2 ulp of the variance (tests/nn/test_model.py
  bounds it). Shifting the row by its first element first would remove it, but XLA then reads
  that element in a kernel of its own, which costs back most of what one pass saves.
  """

  def __init__(self, dim: int, cfg: GPTConfig):
    pd = DTYPES[cfg.param_dtype]
    self.kind, self.eps = cfg.norm, cfg.norm_eps
    self.scale = _const((dim,), 1.0, ("embed",), pd)
    self.bias = (
      _const((dim,), 0.0, ("embed",), pd) if (cfg.norm == "layernorm" and cfg.use_bias) else None
    )

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    if self.kind == "layernorm":
      mean = jnp.mean(x32, axis=-1, keepdims=True)
      x32, var = x32 - mean, jnp.maximum(var - mean * mean, 0.0)  # >= 0 despite rounding
    y = x32 * jax.lax.rsqrt(var + self.eps)
    y = y * _lead(self.scale[...].astype(jnp.float32), y.ndim)
    if self.bias is not None:
      y = y + _lead(self.bias[...].astype(jnp.float32), y.ndim)
    return y.astype(x.dtype)


_GELU_C = math.sqrt(2.0 / math.pi)


@jax.custom_vjp
def bias_gelu(h, b):
  """tanh-GELU(h + b) for h [..., F] and a bias b [F], computed in float32, in h's dtype.

  Its backward pass keeps only h and b (the matmul's output, already in memory) and recomputes
  the tanh there: autodiff of the same formula keeps two [..., F] arrays a layer (the output
  and the tanh) for the backward pass, the largest activations of a GPT MLP.
  """
  return _bias_gelu_fwd(h, b)[0]


def _gelu_parts(h, b):
  u = h.astype(jnp.float32) + _lead(b.astype(jnp.float32), h.ndim)
  t = jnp.tanh(_GELU_C * (u + 0.044715 * u * u * u))
  return u, t


def _bias_gelu_fwd(h, b):
  u, t = _gelu_parts(h, b)
  return (0.5 * u * (1.0 + t)).astype(h.dtype), (h, b)


def _bias_gelu_bwd(res, g):
  # The barrier keeps the compiler from sharing h + b and the tanh with the forward pass, which
  # would store them in float32 for this pass instead of recomputing them here. On h alone: b
  # under it would have to be materialised, a kernel a layer where b is a slice of the layers'
  # stacked biases (train/layer_stack.py).
  h, b = res
  h = jax.lax.optimization_barrier(h)
  u, t = _gelu_parts(h, b)
  slope = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * u * u)
  # du is written once in h's dtype and the bias gradient summed from it; without the barrier
  # the compiler stores the float32 du for both uses (twice the bytes).
  du = jax.lax.optimization_barrier((g.astype(jnp.float32) * slope).astype(h.dtype))
  db = jnp.sum(du.astype(jnp.float32), axis=tuple(range(h.ndim - 1)))
  return du, db.astype(b.dtype)


bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


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
    h = _features(x_BTE @ self.w_in[...].astype(dt))
    if self.kind == "swiglu":
      if self.b_in is not None:
        h = h + _lead(self.b_in[...].astype(dt), h.ndim)
      h = jax.nn.silu(_features(x_BTE @ self.w_gate[...].astype(dt))) * h
    else:
      h = bias_gelu(h, jnp.zeros((h.shape[-1],), dt) if self.b_in is None else self.b_in[...])
    y = h @ self.w_out[...].astype(dt)
    return y if self.b_out is None else y + _lead(self.b_out[...].astype(dt), y.ndim)
