"""Device meshes, logical-axis rules and data placement for SPMD training.

The mesh has three axes:
  data    pure data parallelism (parameters replicated)
  fsdp    data parallelism with parameters and optimizer state sharded (ZeRO-3 style)
  tensor  Megatron-style tensor parallelism over heads, kv_heads, mlp and vocab

Parameters carry logical axis names (rove_jax.nn.model); RULES maps each to mesh axes. The batch is
split over (data, fsdp). Everything else is left to XLA's sharding propagation under `jax.jit`
with explicit in/out shardings. A logical axis whose size does not divide by its mesh axes is
replicated instead (and reported by `describe`), so small models still run on large meshes.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# logical axis -> mesh axis (or None: replicated)
RULES: Mapping[Optional[str], Any] = {
  "batch": BATCH_AXES,
  "embed": "fsdp",
  "vocab": "tensor",
  "heads": "tensor",
  "kv_heads": "tensor",
  "mlp": "tensor",
  "head_dim": None,
  None: None,
}


def mesh_shape(data: int, fsdp: int, tensor: int, n_devices: int) -> tuple[int, int, int]:
  """Resolves one -1 axis to fill the devices; errors name the mismatch."""
  sizes = [data, fsdp, tensor]
  for name, value in zip(MESH_AXES, sizes):
    if not (isinstance(value, (int, np.integer)) and (value >= 1 or value == -1)):
      raise ValueError(f"mesh.{name} must be a positive int or -1, got {value!r}")
  fill = [i for i, v in enumerate(sizes) if v == -1]
  if len(fill) > 1:
    raise ValueError(
      f"at most one mesh axis may be -1, got mesh (data, fsdp, tensor) = {tuple(sizes)}"
    )
  known = int(np.prod([v for v in sizes if v != -1]))
  if fill:
    if n_devices % known:
      raise ValueError(
        f"mesh (data, fsdp, tensor) = {tuple(sizes)}: {n_devices} devices are not "
        f"divisible by {known}"
      )
    sizes[fill[0]] = n_devices // known
  elif known != n_devices:
    raise ValueError(
      f"mesh (data, fsdp, tensor) = {tuple(sizes)} needs {known} devices but "
      f"{n_devices} are available; make the product equal the device count or "
      f"set one axis to -1"
    )
  return tuple(int(s) for s in sizes)


def make_mesh(
  data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Optional[Sequence[jax.Device]] = None
) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices (of all processes) or the given ones."""
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(data, fsdp, tensor, len(devices))
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def run_mesh(mesh, batch_size: int, devices=None) -> Mesh:
  """The mesh of a run's MeshConfig `mesh` over `devices` (default: all), checked against its
  global batch: data.batch_size must split over the data-parallel axes and the processes."""
  out = make_mesh(mesh.data, mesh.fsdp, mesh.tensor, devices=devices)
  dp, nproc = data_parallel_size(out), jax.process_count()
  if batch_size % dp or batch_size % nproc:
    raise ValueError(
      f"data.batch_size={batch_size} is not divisible by the data-parallel "
      f"size mesh.data * mesh.fsdp = {dp} (and the {nproc} processes)"
    )
  return out


def logical_to_spec(
  logical_axes: Sequence[Optional[str]], shape: Sequence[int], mesh: Mesh, rules: Mapping = RULES
) -> P:
  """PartitionSpec for an array with these logical axes; indivisible dims stay replicated."""
  spec = []
  used = set()
  for name, dim in zip(logical_axes, shape):
    if name not in rules:
      raise ValueError(
        f"no sharding rule for logical axis {name!r}; known: {sorted(k for k in rules if k)}"
      )
    target = rules[name]
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    axes = tuple(a for a in axes if a not in used and mesh.shape[a] > 1)
    size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    if not axes or dim % size:
      spec.append(None)
      continue
    used.update(axes)
    spec.append(axes[0] if len(axes) == 1 else axes)
  return P(*spec)


def param_specs(abstract_params, mesh: Mesh, rules: Mapping = RULES):
  """A PartitionSpec for every parameter, from its `logical_axes` metadata."""
  from flax import nnx

  def spec(var):
    axes = var.get_metadata().get("logical_axes")
    if axes is None:
      raise ValueError(
        "a parameter has no logical_axes metadata; every model parameter must name its axes"
      )
    return logical_to_spec(axes, var.shape, mesh, rules)

  return jax.tree.map(spec, abstract_params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def tree_shardings(tree, param_paths_to_spec: dict, mesh: Mesh):
  """NamedShardings for any tree holding parameter-shaped leaves (params, Adam moments):
  a leaf whose path ends with a parameter's path and has its shape gets that parameter's
  spec; everything else (step counters, scalars) is replicated."""

  def pick(path, leaf):
    key = jax.tree_util.keystr(path)
    for ppath, (shape, spec) in param_paths_to_spec.items():
      if key.endswith(ppath) and tuple(leaf.shape) == shape:
        return NamedSharding(mesh, spec)
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(pick, tree)


def param_path_specs(abstract_params, mesh: Mesh, rules: Mapping = RULES) -> dict:
  """{path string: (shape, spec)} of the parameters, longest paths first."""
  specs = jax.tree.leaves(
    param_specs(abstract_params, mesh, rules), is_leaf=lambda x: isinstance(x, P)
  )
  leaves = jax.tree_util.tree_flatten_with_path(abstract_params)[0]  # full paths (.value)
  if len(specs) != len(leaves):
    raise ValueError("parameter tree and its specs do not line up")
  out = {}
  for (path, leaf), spec in zip(leaves, specs):
    out[jax.tree_util.keystr(path)] = (tuple(leaf.shape), spec)
  return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def data_parallel_size(mesh: Mesh) -> int:
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def place_batch(batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict:
  """This process's rows -> global arrays split over (data, fsdp)."""
  sharding = batch_sharding(mesh)
  out = {}
  for k, v in batch.items():
    v = np.asarray(v)
    global_shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
    out[k] = jax.make_array_from_process_local_data(sharding, v, global_shape)
  return out


def describe(specs_by_path: dict, mesh: Mesh) -> str:
  """A table of parameter shardings, for logs."""
  lines = [f"mesh {dict(mesh.shape)}"]
  for path, (shape, spec) in sorted(specs_by_path.items()):
    lines.append(f"  {path:60s} {str(shape):20s} {spec}")
  return "\n".join(lines)


def initialize_distributed(
  coordinator_address: Optional[str] = None,
  num_processes: Optional[int] = None,
  process_id: Optional[int] = None,
) -> None:
  """Starts multi-process JAX: explicit flags, or auto-detection (TPU pods, SLURM) when none
  are given and the environment looks like a cluster. CPU processes use gloo collectives."""
  explicit = [coordinator_address, num_processes, process_id]
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError(
        "multi-process training needs all of --coordinator_address, "
        "--num_processes and --process_id (or none of them, to auto-detect)"
      )
    if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
      coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )
    return
  if auto_detect_cluster():
    jax.distributed.initialize()


def auto_detect_cluster() -> bool:
  """True where jax.distributed.initialize() can find the cluster by itself: a multi-task SLURM
  job, a Cloud TPU VM (pod slices), Open MPI, or ROVE_JAX_DISTRIBUTED=1."""
  env = os.environ
  if env.get("ROVE_JAX_DISTRIBUTED") == "1":
    return True
  if int(env.get("SLURM_NTASKS", "1") or 1) > 1:
    return True
  if int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1:
    return True
  return any(
    k in env
    for k in ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "TPU_ACCELERATOR_TYPE")
  )
