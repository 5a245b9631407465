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
for registers (the dx and dW accumulators are E / be tiles), not tuned on a GPU.

Under a mesh each device runs the kernels on its part, in jax.shard_map (GSPMD cannot
partition a Pallas call), laid out as the parameters are (rove_jax.train.sharding.RULES):
  tokens       split over the data-parallel axes (data, fsdp) that divide the batch;
  classes      split over the tensor axis when it divides V in blocks (vocabulary-parallel, as
               W's rows are): each device makes the logits of its classes only. Per token, the
               devices' log-sum-exps combine as one (max, then a sum of exp), and the target's
               logit comes from the device that holds its class (a sum of zeros elsewhere); dx
               is summed over the tensor axis, dW stays split as W is;
  dW's columns reduce-scattered over fsdp (E is what fsdp splits in W), summed over data: each
               device receives its own shard, not the whole sum.
Off GPU the kernels run in Pallas interpret mode (how the tests check them on CPU); TPUs are
refused.
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
  layout = _layout(B, E, V)
  reason = problem(B // layout.token_split * T, E, V // layout.class_split)
  if reason is not None:
    where = (
      "" if layout.token_split == 1 else f" ({B} sequences split over {layout.token_split} devices)"
    )
    raise ValueError(reason + where)
  plan = plan or Plan()
  run_interpreted = platform.target_platform() != "gpu" if interpret is None else interpret
  plan = plan._replace(interpret=bool(run_interpreted))
  return _nll(plan, layout, x_BTE, w_VE, targets_BT.astype(jnp.int32))


class Layout(NamedTuple):
  """How the kernels' operands are split under the active mesh (`_layout`)."""

  free: tuple = ()  # the shard_map's mesh axes (none: no mesh, run as is)
  batch: Optional[tuple] = None  # the axes the tokens (batch rows) are split over
  classes: Optional[str] = None  # the axis W's rows (the classes) are split over
  scatter: Optional[str] = None  # the batch axis dW's columns are reduce-scattered over
  token_split: int = 1  # devices a batch row's tokens are split over
  class_split: int = 1  # devices the classes are split over

  def spec(self, kind: str) -> P:
    """rows: [B, ...] token-major operands; w: W [V, E]; dw: W's gradient."""
    if kind == "rows":
      return P(self.batch)
    return P(self.classes, self.scatter if kind == "dw" else None)


def _layout(B: int, E: int, V: int) -> Layout:
  shards = kernel_mesh.shards(B, 1, 1)
  if shards is None:
    return Layout()
  mesh = jax.sharding.get_abstract_mesh()
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  batch = shards.batch or ()
  t = sizes.get(kernel_mesh.HEAD_AXIS, 1) if kernel_mesh.HEAD_AXIS in shards.free else 1
  classes = kernel_mesh.HEAD_AXIS if t > 1 and V % (t * MIN_BLOCK) == 0 else None
  fsdp = "fsdp" if "fsdp" in batch and sizes["fsdp"] > 1 and E % sizes["fsdp"] == 0 else None
  return Layout(
    free=shards.free,
    batch=shards.batch,
    classes=classes,
    scatter=fsdp,
    token_split=math.prod(sizes[a] for a in batch),
    class_split=t if classes else 1,
  )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _nll(plan, layout, x_BTE, w_VE, targets_BT):
  return _nll_fwd(plan, layout, x_BTE, w_VE, targets_BT)[0]


def _local(layout: Layout, w_VE, targets_BT):
  """The targets as this device's class indices: shifted by its first class, so a target held
  by another device matches none of its columns."""
  if layout.classes is None:
    return targets_BT
  return targets_BT - jax.lax.axis_index(layout.classes) * w_VE.shape[0]


def _nll_fwd(plan, layout, x_BTE, w_VE, targets_BT):
  def run(x, w, t):
    lse_BT, hit_BT = _forward(plan, x, w, _local(layout, w, t))
    if layout.classes is not None:  # one log-sum-exp of every device's classes
      m = jax.lax.pmax(lse_BT, layout.classes)
      lse_BT = m + jnp.log(jax.lax.psum(jnp.exp(lse_BT - m), layout.classes))
      hit_BT = jax.lax.psum(hit_BT, layout.classes)
    return lse_BT - hit_BT, lse_BT

  w_cast = w_VE.astype(x_BTE.dtype)
  rows, w = layout.spec("rows"), layout.spec("w")
  nll_BT, lse_BT = _on_shards(
    run, layout, (x_BTE, w_cast, targets_BT), (rows, w, rows), (rows,) * 2
  )
  w_dtype = jnp.zeros((0,), w_VE.dtype)  # an empty array carries W's dtype to the backward
  return nll_BT, (x_BTE, w_cast, targets_BT, lse_BT, w_dtype)


def _nll_bwd(plan, layout, residuals, g_BT):
  x_BTE, w_VE, targets_BT, lse_BT, w_dtype = residuals
  args = (x_BTE, w_VE, targets_BT, lse_BT, g_BT.astype(jnp.float32))
  rows = layout.spec("rows")
  specs = (rows, layout.spec("w"), rows, rows, rows)

  def dx(x, w, t, lse, g):
    dx = _dx(plan, x, w, _local(layout, w, t), lse, g)
    return dx if layout.classes is None else jax.lax.psum(dx, layout.classes)

  def dw(x, w, t, lse, g):
    dw = _dw(plan, x, w, _local(layout, w, t), lse, g)
    summed = tuple(a for a in layout.batch or () if a != layout.scatter)
    if summed:
      dw = jax.lax.psum(dw, summed)
    if layout.scatter is not None:
      dw = jax.lax.psum_scatter(dw, layout.scatter, scatter_dimension=1, tiled=True)
    return dw

  dx_BTE = _on_shards(dx, layout, args, specs, rows)
  dw_VE = _on_shards(dw, layout, args, specs, layout.spec("dw"))
  return dx_BTE.astype(x_BTE.dtype), dw_VE.astype(w_dtype.dtype), None


_nll.defvjp(_nll_fwd, _nll_bwd)


def _on_shards(run, layout: Layout, args, in_specs, out_specs):
  """run(*args), on each device's part under a mesh (`layout.free` not empty)."""
  if not layout.free:
    return run(*args)
  return kernel_mesh.run_sharded(run, args, in_specs, out_specs, layout.free)


def _params(plan: Plan, backward: bool):
  return plgpu.CompilerParams(
    num_warps=plan.backward_warps if backward else plan.warps, num_stages=plan.stages
  )


def _whole(a):
  return pl.BlockSpec(a.shape, lambda i: (0,) * a.ndim)


def _forward(plan: Plan, x_BTE, w_VE, targets_BT):
  """(log-sum-exp over W's classes, the target's logit: 0 when no class of W is the target),
  float32 [B, T]: one program a block of tokens."""
  B, T, E = x_BTE.shape
  N, V = B * T, w_VE.shape[0]
  bn, bv, be = _block(N, plan.bn), _block(V, plan.bv), _block(E, plan.be)
  x_NE, t_N = x_BTE.reshape(N, E), targets_BT.reshape(N)
  rows = pl.BlockSpec((bn,), lambda i: (i,))
  lse_N, hit_N = pl.pallas_call(
    functools.partial(_forward_kernel, bv, be),
    grid=(N // bn,),
    in_specs=[pl.BlockSpec((bn, E), lambda i: (i, 0)), _whole(w_VE), rows],
    out_specs=[rows, rows],
    out_shape=[jax.ShapeDtypeStruct((N,), jnp.float32)] * 2,
    compiler_params=_params(plan, False),
    interpret=plan.interpret,
    name="linear_cross_entropy_fwd",
  )(x_NE, w_VE, t_N)
  return lse_N.reshape(B, T), hit_N.reshape(B, T)


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


def _forward_kernel(bv, be, x_ref, w_ref, t_ref, lse_ref, hit_ref):
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
  lse_ref[...] = m + jnp.log(s)
  hit_ref[...] = hit


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
