"""The training loss: mean token cross-entropy from logits of any float type, float32 inside.

Shape letters (legend in rove_jax): B batch, T tokens, V vocabulary.

What is bfloat16 and what is float32 under a bfloat16 model: the [B, T, V] logits are written by
the output projection in bfloat16 (its products accumulate in float32 inside the matmul); every
logit is taken to float32 where it is read, so the max, the sum of exponentials, the
log-sum-exp, the target's logit and the mean loss are float32; the gradient of the logits
(softmax - one-hot, scaled) is computed in float32 and stored in bfloat16 for the two matmuls of
the output projection's backward pass. The logits are the largest arrays of a GPT-2 step (V =
50304), and each pass over them in float32 moved twice the bytes (bench/RESULTS.md, the GPU
step). tests/train/test_loss.py bounds the difference to an all-float32 loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits_BTV, targets_BT, mask_BT=None):
  """Mean token cross-entropy in float32 (and the token count), from logits of any float type.

  The logits stay in their own type in memory (bfloat16 under a bfloat16 model: half the bytes
  of the largest arrays of a GPT step); every element is taken to float32 inside the kernels
  that read it, so the max, the sum of exponentials, the log-sum-exp and the target's logit
  are float32 (`token_nll`).
  """
  return masked_mean(token_nll(logits_BTV, targets_BT.astype(jnp.int32)), mask_BT)


def fused_cross_entropy(x_BTE, w_VE, targets_BT, mask_BT=None):
  """`cross_entropy` of the logits x W^T, computed without writing them: the output
  projection and the loss in one kernel (rove_jax.kernels.linear_ce; optim.loss_impl=fused).
  x [B, T, E] is the final norm's output in the compute dtype and W [V, E] the projection's
  weight (the float32 master weight: the kernel reads it in x's dtype, and W's gradient comes
  back in float32); the logits are float32 inside the kernel, so the loss is that of unrounded
  logits."""
  from rove_jax.kernels import linear_ce  # Pallas: imported when the fused loss is chosen

  return masked_mean(linear_ce.token_nll(x_BTE, w_VE, targets_BT), mask_BT)


def masked_mean(nll_BT, mask_BT=None):
  """(mean of the per-token losses over the tokens the mask keeps, token count)."""
  if mask_BT is None:
    return jnp.mean(nll_BT), nll_BT.size
  mask = mask_BT.astype(jnp.float32)
  return jnp.sum(nll_BT * mask) / jnp.maximum(jnp.sum(mask), 1.0), jnp.sum(mask)


@jax.custom_vjp
def token_nll(logits_BTV, targets_BT):
  """-log softmax(logits)[target] per token, float32 [B, T].

  Written as log-sum-exp minus the target's logit, picked by a comparison with the vocabulary
  index (an elementwise select inside the reductions, not a gather). The gradient is written
  out, softmax - one-hot in one fusion that recomputes exp(logit - lse) from the logits, so no
  [B, T, V] float32 array is kept between the passes (autodiff of log-sum-exp keeps its
  exponentials, a float32 copy of the logits), and it comes out in the logits' type.
  """
  return _token_nll_fwd(logits_BTV, targets_BT)[0]


def _hits(logits_BTV, targets_BT):
  vocab_V = jnp.arange(logits_BTV.shape[-1], dtype=jnp.int32)
  return vocab_V.reshape(1, 1, -1) == targets_BT[..., None]


def logsumexp_one_pass(x):
  """log sum exp over the last axis in one reduction: each partial result is (running max m,
  sum of exp(x - m)), and two combine as (max, s_a exp(m_a - max) + s_b exp(m_b - max)), the
  online softmax's rule; the logits are read once instead of twice (max, then the sum)."""

  def combine(a, b):
    (ma, sa), (mb, sb) = a, b
    m = jnp.maximum(ma, mb)
    return m, sa * jnp.exp(ma - m) + sb * jnp.exp(mb - m)

  lowest = jnp.finfo(x.dtype).min  # not -inf: two empty partials must combine to (lowest, 0)
  m, s = jax.lax.reduce(
    (x, jnp.ones_like(x)),
    (jnp.asarray(lowest, x.dtype), jnp.zeros((), x.dtype)),
    combine,
    (x.ndim - 1,),
  )
  return m + jnp.log(s)


def _token_nll_fwd(logits_BTV, targets_BT):
  x = logits_BTV.astype(jnp.float32)
  lse_BT = logsumexp_one_pass(x)
  target_BT = jnp.sum(jnp.where(_hits(logits_BTV, targets_BT), x, 0.0), axis=-1)
  return lse_BT - target_BT, (logits_BTV, targets_BT, lse_BT)


def _token_nll_bwd(res, g_BT):
  logits_BTV, targets_BT, lse_BT = res
  p = jnp.exp(logits_BTV.astype(jnp.float32) - lse_BT[..., None])
  d = (p - _hits(logits_BTV, targets_BT).astype(jnp.float32)) * g_BT[..., None]
  return d.astype(logits_BTV.dtype), None


token_nll.defvjp(_token_nll_fwd, _token_nll_bwd)
