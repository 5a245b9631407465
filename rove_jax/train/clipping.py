"""Global-norm gradient clipping whose norm costs few kernels on a GPU.

optax.clip_by_global_norm sums each leaf's squares in a kernel of its own; a GPT-2 124M has 147
leaves, 98 of them biases and norm scales of at most 3072 elements, and their reductions were a
tenth of the kernels of the compiled GPU step (bench/RESULTS.md). Here the small leaves are
summed as one concatenated array: in the trainer's state (train/layer_stack.py) these are the
stacks of every layer's biases and norm scales, [L, 3072] at most for GPT-2 124M. The
transformation keeps optax's state (optax.EmptyState), so checkpoints written with either
restore into the other.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

# Leaves up to this many elements (biases, norm scales, their layer stacks) are summed as one
# array for the norm.
SMALL_LEAF = 1 << 16


def global_norm(tree) -> jax.Array:
  """The L2 norm of every leaf together, in float32 (what gradient clipping and the step's
  metrics read). The small leaves are concatenated into one array first: one reduction instead
  of one kernel each (a GPT-2 layer has eight of them)."""
  leaves = [x.astype(jnp.float32) for x in jax.tree.leaves(tree)]
  small = [x.ravel() for x in leaves if x.size <= SMALL_LEAF]
  squares = [jnp.sum(jnp.square(x)) for x in leaves if x.size > SMALL_LEAF]
  if small:
    squares.append(jnp.sum(jnp.square(jnp.concatenate(small))))
  return jnp.sqrt(sum(squares)) if squares else jnp.zeros((), jnp.float32)


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
  """optax.clip_by_global_norm with `global_norm` (the same state, optax.EmptyState, so
  checkpoints of either restore into the other): updates scaled by max_norm / norm when the
  norm exceeds max_norm."""

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    norm = global_norm(updates)
    keep = norm < max_norm
    return jax.tree.map(
      lambda t: jnp.where(keep, t, (t / norm.astype(t.dtype)) * max_norm), updates
    ), state

  return optax.GradientTransformation(init, update)
