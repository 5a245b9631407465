"""How a Pallas kernel (splash, fused) runs under an active mesh: GSPMD cannot partition a
Mosaic custom call, so each device is given its shard explicitly with `jax.shard_map`. The
batch dim is split over the data-parallel axes that divide it, the heads over the tensor axis
when it divides them (an MQA kernel's single kv head is read whole by every shard)."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
from jax.sharding import PartitionSpec as P

BATCH_AXES = ("data", "fsdp")  # the mesh axes the batch dim is split over
HEAD_AXIS = "tensor"  # the mesh axis the heads are split over


class Shards(NamedTuple):
  """The free mesh axes and the per-device specs of a kernel call's operands."""

  free: tuple  # the mesh axes not already manual (the shard_map's axis_names)
  batch: Optional[tuple]  # the axes the batch dim is split over (None: not split)
  q: P  # [B, T, H, D]
  kv: P  # [B, S, K, D]


def shards(B: int, H: int, K: int) -> Optional[Shards]:
  """The shards of a call with batch B, H query heads and K kv heads under the active mesh;
  None without a mesh, or inside a shard_map over all of it (run the kernel as is)."""
  mesh = jax.sharding.get_abstract_mesh()
  free = () if mesh.empty else tuple(a for a in mesh.axis_names if a not in mesh.manual_axes)
  if not free:
    return None
  sizes = dict(zip(mesh.axis_names, mesh.axis_sizes))
  batch = dividing(B, BATCH_AXES, free, sizes) or None
  heads = kv_heads = None
  t = sizes.get(HEAD_AXIS, 1) if HEAD_AXIS in free else 1
  if t > 1 and H % t == 0 and (K % t == 0 or K == 1):
    heads = HEAD_AXIS
    kv_heads = HEAD_AXIS if K % t == 0 else None  # MQA: every shard reads the one kv head
  return Shards(free, batch, P(batch, None, heads, None), P(batch, None, kv_heads, None))


def dividing(n: int, axes, free, sizes: dict) -> tuple:
  """The axes of `axes`, in order, that are free (not manual) and whose sizes multiplied so far
  divide n: the mesh axes a dim of size n is split over."""
  out, split = [], 1
  for axis in axes:
    if axis in free and n % (split * sizes[axis]) == 0:
      out.append(axis)
      split *= sizes[axis]
  return tuple(out)


def run_sharded(run, args, specs, out_spec, free):
  """run(*args) per device shard (`specs` for args, `out_spec` for the result)."""
  return jax.shard_map(
    run, in_specs=specs, out_specs=out_spec, axis_names=frozenset(free), check_vma=False
  )(*args)
