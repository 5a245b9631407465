"""The output projection and the cross-entropy in one Pallas kernel (Triton backend, GPUs):
-log softmax(x W^T)[target] per token, with the [N, V] logits never written to memory.

Shape letters: N tokens (batch x length, flattened), E model width, V vocabulary.

Why: in a GPT-2 train step the logits are the largest arrays (16 x 1024 x 50304). Written by the
projection's GEMM in bfloat16, they are then read for the log-sum-exp, read and written again
as the gradient, and read by both backward GEMMs: six passes of 1.65 GB at batch 16 x 1024.
Here each program computes its tiles of logits in registers from x and W, and keeps only a
float32 log-sum-exp per token. The price is FLOPs: the backward recomputes the logits, twice
(once for dx, once for dW, so that neither needs atomics or a [N, V] buffer): 5 N E V
multiply-adds against 3 for the unfused step.

The three kernels, each looping over the other side's blocks with E split in `be` chunks:
  forward  one program a token block [bn]: for each vocabulary block, logits [bn, bv] as a sum
           of E / be products in float32; the online log-sum-exp (running max and sum, the
           flash-attention rule) and the target's logit. Out: nll and lse, float32 [N].
  dx       one program a token block: the logits again, d = (softmax - one-hot) * g, stored
           in x's dtype for the product, dx [bn, E] += d W[block] in E / be float32
           accumulators held across the vocabulary loop.
  dW       one program a vocabulary block [bv]: the transposed logits [bv, bn] for each token
           block, d^T likewise, dW [bv, E] += d^T x[block].
What is float32: every product's accumulation, the log-sum-exp, the target logit, the softmax
and d before its cast, dx's and dW's accumulators. What is the inputs' dtype (bfloat16 under a
bfloat16 model): x, W, and d as the operand of the two gradient products, as the unfused step's
bfloat16 d is (rove_jax.train.loss).

Blocks are powers of two (Triton's tiles are): for each of N, V and E the largest power of two
that divides it, at most the plan's block, at least MIN_BLOCK. Block sizes and warps are set
for registers (the dx and dW accumulators are E / be tiles), not tuned on a GPU. Under a mesh
the tokens are split over the data-parallel axes with jax.shard_map (GSPMD cannot partition a
Pallas call), W is whole on every device, and dW is summed over those axes. Off GPU the
kernels run in Pallas interpret mode (how the tests check them on CPU); TPUs are refused.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec as P

from rove_jax.kernels import mesh as kernel_mesh
from rove_jax.kernels import platform
from rove_jax.kernels.fused_tiles import dot_nn, dot_nt, precision_for

MIN_BLOCK = 16  # Triton's smallest matmul side


class Plan(NamedTuple):
  """Blocks of the three kernels (each the largest power of two dividing its dimension, at most
  the value here) and whether they run interpreted."""

  bn: int = 32  # forward: tokens a program
  bv: int = 64  # vocabulary block of the forward and dx loops
  be: int = 128  # E chunk of every product
  bn_dx: int = 32  # dx: tokens a program (E / be accumulators of [bn_dx, be])
  bv_dw: int = 32  # dW: vocabulary rows a program (E / be accumulators of [bv_dw, be])
  bn_dw: int = 64  # dW: token block of its loop
  warps: int = 4
  backward_warps: int = 8
  stages: int = 2
  interpret: bool = False


def problem(N: int, E: int, V: int) -> Optional[str]:
  """None when the kernel runs N tokens of width E over V classes; else the reason."""
  for name, n in (
    ("tokens (batch x length, a device's)", N),
    ("model width", E),
    ("vocabulary", V),
  ):
    if n < MIN_BLOCK or n % MIN_BLOCK:
      return (
        f"the fused loss kernel needs {name} a multiple of {MIN_BLOCK} (its smallest "
        f"block), got {n}"
      )
  if platform.target_platform() == "tpu":
    return (
      "the fused loss kernel is written for GPUs (Pallas Triton); on TPU use optim.loss_impl=xla"
    )
  return None


def _block(n: int, most: int) -> int:
  b = MIN_BLOCK
  while b * 2 <= most and n % (b * 2) == 0:
    b *= 2
  return b


def token_nll(
  x_BTE, w_VE, targets_BT, *, plan: Optional[Plan] = None, interpret: Optional[bool] = None
):
  """-log softmax(x W^T)[target] per token, float32 [B, T], differentiable in x and W.

  Args:
    x_BTE: the final hidden states (the output projection's input), any float dtype.
    w_VE: the projection's weight, one row per class, any float dtype (a float32 master
      weight: the kernels read it cast to x's dtype, and its gradient comes back float32, not
      rounded to x's dtype first).
    targets_BT: int class ids in [0, V).
    plan: blocks and warps (Plan's defaults when None).
    interpret: Pallas interpret mode; None: on unless compiling for a GPU.

  Raises:
    ValueError: the sizes do not fit the kernel's blocks, or the platform is a TPU.
  """
  B, T, E = x_BTE.shape
  V = w_VE.shape[0]
  if w_VE.shape != (V, E):
    raise ValueError(f"w must be [V, E] with E = {E} (x's width), got {w_VE.shape}")
  shards = kernel_mesh.shards(B, 1, 1)
  batch = None if shards is None else shards.batch
  mesh = jax.sharding.get_abstract_mesh()
  split = 1 if batch is None else math.prod(mesh.shape[a] for a in batch)
  reason = problem(B // split * T, E, V)
  if reason is not None:
    where = "" if split == 1 else f" ({B} sequences split over {split} devices)"
    raise ValueError(reason + where)
  plan = plan or Plan()
  run_interpreted = platform.target_platform() != "gpu" if interpret is None else interpret
  plan = plan._replace(interpret=bool(run_interpreted))
  return _nll(plan, shards, x_BTE, w_VE, targets_BT.astype(jnp.int32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _nll(plan, shards, x_BTE, w_VE, targets_BT):
  return _nll_fwd(plan, shards, x_BTE, w_VE, targets_BT)[0]


def _nll_fwd(plan, shards, x_BTE, w_VE, targets_BT):
  run = lambda x, w, t: _forward(plan, x, w, t)
  w_cast = w_VE.astype(x_BTE.dtype)
  nll_BT, lse_BT = _on_shards(
    run, shards, (x_BTE, w_cast, targets_BT), ("rows", "whole", "rows"), ("rows", "rows")
  )
  w_dtype = jnp.zeros((0,), w_VE.dtype)  # an empty array carries W's dtype to the backward
  return nll_BT, (x_BTE, w_cast, targets_BT, lse_BT, w_dtype)


def _nll_bwd(plan, shards, residuals, g_BT):
  x_BTE, w_VE, targets_BT, lse_BT, w_dtype = residuals
  args = (x_BTE, w_VE, targets_BT, lse_BT, g_BT.astype(jnp.float32))
  kinds = ("rows", "whole", "rows", "rows", "rows")
  dx_BTE = _on_shards(lambda *a: _dx(plan, *a), shards, args, kinds, "rows")
  batch = None if shards is None else shards.batch

  def dw_summed(*a):
    dw = _dw(plan, *a)
    return dw if batch is None else jax.lax.psum(dw, batch)

  dw_VE = _on_shards(dw_summed, shards, args, kinds, "whole")
  return dx_BTE.astype(x_BTE.dtype), dw_VE.astype(w_dtype.dtype), None


_nll.defvjp(_nll_fwd, _nll_bwd)


def _on_shards(run, shards, args, kinds, out_kinds):
  """run(*args) on each device under a mesh (`shards`: kernel_mesh.shards; None without one):
  "rows" operands and results are split on their first dim over the batch axes, "whole" ones
  are whole on every device."""
  if shards is None:
    return run(*args)
  row = lambda ndim: P(shards.batch, *([None] * (ndim - 1)))
  in_specs = tuple(row(a.ndim) if k == "rows" else P() for k, a in zip(kinds, args))
  outs = (out_kinds,) if isinstance(out_kinds, str) else out_kinds
  out_specs = tuple(P(shards.batch) if k == "rows" else P() for k in outs)
  out_specs = out_specs[0] if isinstance(out_kinds, str) else out_specs
  return kernel_mesh.run_sharded(run, args, in_specs, out_specs, shards.free)


def _params(plan: Plan, backward: bool):
  return plgpu.CompilerParams(
    num_warps=plan.backward_warps if backward else plan.warps, num_stages=plan.stages
  )


def _whole(a):
  return pl.BlockSpec(a.shape, lambda i: (0,) * a.ndim)


def _forward(plan: Plan, x_BTE, w_VE, targets_BT):
  """(nll, lse), float32 [B, T]: one program a block of tokens."""
  B, T, E = x_BTE.shape
  N, V = B * T, w_VE.shape[0]
  bn, bv, be = _block(N, plan.bn), _block(V, plan.bv), _block(E, plan.be)
  x_NE, t_N = x_BTE.reshape(N, E), targets_BT.reshape(N)
  rows = pl.BlockSpec((bn,), lambda i: (i,))
  nll_N, lse_N = pl.pallas_call(
    functools.partial(_forward_kernel, bv, be),
    grid=(N // bn,),
    in_specs=[pl.BlockSpec((bn, E), lambda i: (i, 0)), _whole(w_VE), rows],
    out_specs=[rows, rows],
    out_shape=[jax.ShapeDtypeStruct((N,), jnp.float32)] * 2,
    compiler_params=_params(plan, False),
    interpret=plan.interpret,
    name="linear_cross_entropy_fwd",
  )(x_NE, w_VE, t_N)
  return nll_N.reshape(B, T), lse_N.reshape(B, T)


def _logits(x_ref, w_ref, rows, cols, be, precision, transposed=False):
  """float32 logits of x_ref[rows] against w_ref[cols] ([rows, cols], or [cols, rows] when
  transposed), summed over E in chunks of be."""
  E = x_ref.shape[-1]
  out = None
  for k in range(E // be):
    chunk = pl.ds(k * be, be)
    x, w = x_ref[rows, chunk], w_ref[cols, chunk]
    part = dot_nt(w, x, precision) if transposed else dot_nt(x, w, precision)
    out = part if out is None else out + part
  return out


def _forward_kernel(bv, be, x_ref, w_ref, t_ref, nll_ref, lse_ref):
  bn = x_ref.shape[0]
  V = w_ref.shape[0]
  precision = precision_for(x_ref.dtype)
  target = t_ref[...]
  everything = pl.ds(0, bn)

  def step(j, carry):
    m_prev, s_prev, hit = carry
    z = _logits(x_ref, w_ref, everything, pl.ds(j * bv, bv), be, precision)  # [bn, bv]
    cls = j * bv + jax.lax.broadcasted_iota(jnp.int32, (bn, bv), 1)
    hit = hit + jnp.sum(jnp.where(cls == target[:, None], z, 0.0), axis=1)
    m = jnp.maximum(m_prev, jnp.max(z, axis=1))
    s = s_prev * jnp.exp(m_prev - m) + jnp.sum(jnp.exp(z - m[:, None]), axis=1)
    return m, s, hit

  f32 = jnp.float32
  init = (jnp.full((bn,), -jnp.inf, f32), jnp.zeros((bn,), f32), jnp.zeros((bn,), f32))
  m, s, hit = jax.lax.fori_loop(0, V // bv, step, init)
  lse = m + jnp.log(s)
  lse_ref[...] = lse
  nll_ref[...] = lse - hit


def _dx(plan: Plan, x_BTE, w_VE, targets_BT, lse_BT, g_BT):
  """dx, float32 [B, T, E]: one program a block of tokens, looping over the vocabulary."""
  B, T, E = x_BTE.shape
  N, V = B * T, w_VE.shape[0]
  bn, bv, be = _block(N, plan.bn_dx), _block(V, plan.bv), _block(E, plan.be)
  rows = pl.BlockSpec((bn,), lambda i: (i,))
  block = pl.BlockSpec((bn, E), lambda i: (i, 0))
  dx_NE = pl.pallas_call(
    functools.partial(_dx_kernel, bv, be),
    grid=(N // bn,),
    in_specs=[block, _whole(w_VE), rows, rows, rows],
    out_specs=block,
    out_shape=jax.ShapeDtypeStruct((N, E), jnp.float32),
    compiler_params=_params(plan, True),
    interpret=plan.interpret,
    name="linear_cross_entropy_dx",
  )(x_BTE.reshape(N, E), w_VE, targets_BT.reshape(N), lse_BT.reshape(N), g_BT.reshape(N))
  return dx_NE.reshape(B, T, E)


def _dx_kernel(bv, be, x_ref, w_ref, t_ref, lse_ref, g_ref, dx_ref):
  bn, E = x_ref.shape
  V = w_ref.shape[0]
  precision = precision_for(x_ref.dtype)
  target, lse, g = t_ref[...], lse_ref[...], g_ref[...]
  everything = pl.ds(0, bn)

  def step(j, acc):
    cols = pl.ds(j * bv, bv)
    z = _logits(x_ref, w_ref, everything, cols, be, precision)  # [bn, bv]
    cls = j * bv + jax.lax.broadcasted_iota(jnp.int32, (bn, bv), 1)
    d = (jnp.exp(z - lse[:, None]) - (cls == target[:, None]).astype(jnp.float32)) * g[:, None]
    d = d.astype(x_ref.dtype)
    return tuple(
      a + dot_nn(d, w_ref[cols, pl.ds(k * be, be)], precision) for k, a in enumerate(acc)
    )

  init = tuple(jnp.zeros((bn, be), jnp.float32) for _ in range(E // be))
  acc = jax.lax.fori_loop(0, V // bv, step, init)
  for k, a in enumerate(acc):
    dx_ref[:, pl.ds(k * be, be)] = a


def _dw(plan: Plan, x_BTE, w_VE, targets_BT, lse_BT, g_BT):
  """dW, float32 [V, E] (this device's tokens only): one program a block of classes, looping
  over the tokens."""
  B, T, E = x_BTE.shape
  N, V = B * T, w_VE.shape[0]
  bv, bn, be = _block(V, plan.bv_dw), _block(N, plan.bn_dw), _block(E, plan.be)
  block = pl.BlockSpec((bv, E), lambda j: (j, 0))
  args = (x_BTE.reshape(N, E), w_VE, targets_BT.reshape(N), lse_BT.reshape(N), g_BT.reshape(N))
  return pl.pallas_call(
    functools.partial(_dw_kernel, bn, be),
    grid=(V // bv,),
    in_specs=[_whole(args[0]), block] + [_whole(a) for a in args[2:]],
    out_specs=block,
    out_shape=jax.ShapeDtypeStruct((V, E), jnp.float32),
    compiler_params=_params(plan, True),
    interpret=plan.interpret,
    name="linear_cross_entropy_dw",
  )(*args)


def _dw_kernel(bn, be, x_ref, w_ref, t_ref, lse_ref, g_ref, dw_ref):
  bv, E = w_ref.shape
  N = x_ref.shape[0]
  precision = precision_for(x_ref.dtype)
  first = pl.program_id(0) * bv
  mine = pl.ds(0, bv)

  def step(i, acc):
    rows = pl.ds(i * bn, bn)
    z_t = _logits(x_ref, w_ref, rows, mine, be, precision, transposed=True)  # [bv, bn]
    cls = first + jax.lax.broadcasted_iota(jnp.int32, (bv, bn), 0)
    hit = (cls == t_ref[rows][None, :]).astype(jnp.float32)
    d_t = (jnp.exp(z_t - lse_ref[rows][None, :]) - hit) * g_ref[rows][None, :]
    d_t = d_t.astype(x_ref.dtype)
    return tuple(
      a + dot_nn(d_t, x_ref[rows, pl.ds(k * be, be)], precision) for k, a in enumerate(acc)
    )

  init = tuple(jnp.zeros((bv, be), jnp.float32) for _ in range(E // be))
  acc = jax.lax.fori_loop(0, N // bn, step, init)
  for k, a in enumerate(acc):
    dw_ref[:, pl.ds(k * be, be)] = a
