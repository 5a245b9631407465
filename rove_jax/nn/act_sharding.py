"""How the GPT's activations are split when a mesh is active (`jax.set_mesh`, as the trainer
traces its steps): the batch over the data-parallel axes, heads, MLP features and classes over
the tensor axis, the same axes rove_jax.kernels.mesh splits a kernel call over and the trainer
splits the parameters over (rove_jax.train.sharding.RULES). Without a mesh `constrain` returns
its input: decoding and evaluation on one device are untouched.

Why: under fsdp a weight is split on its embedding dim and the batch over the same axis. Left to
itself, GSPMD compiled `x @ W` by moving x onto W's split, contracting the split dim, and
all-reducing the whole [B, T, F] product on every device (for GPT-2 124M on 8 GPUs with fsdp=8:
100 all-reduces a step, [512, 1024, 3072] among them). With the activations' batch split pinned
it gathers the weight instead, which is what fully sharded data parallelism means.
"""

from __future__ import annotations

from typing import Optional

import jax
from jax.sharding import PartitionSpec as P

from rove_jax.kernels import mesh as kernel_mesh

# logical name of an activation dim -> the mesh axes it is split over, in order
AXES = {
  "batch": kernel_mesh.BATCH_AXES,
  "heads": (kernel_mesh.HEAD_AXIS,),
  "mlp": (kernel_mesh.HEAD_AXIS,),
  "vocab": (kernel_mesh.HEAD_AXIS,),
  None: (),
}


def constrain(x: jax.Array, *names: Optional[str]) -> jax.Array:
  """x with each dim split over the mesh axes its name maps to (AXES; None: not split), under
  the active mesh; x itself without one. A mesh axis that is missing, manual (inside
  shard_map) or does not divide the dim is left out of that dim's split."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  free = [a for a in mesh.axis_names if a not in mesh.manual_axes]
  if not free:
    return x
  if len(names) != x.ndim:
    raise ValueError(f"constrain: {len(names)} names for an array of {x.ndim} dims")
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  spec = []
  for name, n in zip(names, x.shape):
    axes = kernel_mesh.dividing(n, AXES[name], free, sizes)
    spec.append(axes if len(axes) > 1 else (axes[0] if axes else None))
  return jax.lax.with_sharding_constraint(x, P(*spec))
