"""Ahead-of-time compilation of a run's programs for a Cloud TPU slice, with no TPU attached.

  from rove_jax.aot import compile as aot
  from rove_jax.train.run_config import paper_config
  c = paper_config("gpt2_124m", lr=6e-4)
  print(aot.recommend(c, "v5e-8"))                 # a (data, fsdp, tensor) mesh and grad_accum
  report = aot.compile_job(c, "v5e-8", "train")    # or "eval", "decode"
  print(aot.format_report(report))                 # the command line: python -m bench.aot

jax.experimental.topologies describes a TPU slice as compile-only devices (libtpu must be
installed, `pip install 'rove_jax[tpu]'`; no TPU is needed), so XLA's TPU compiler lowers and
compiles on this host the programs a run executes, on the config's (data, fsdp, tensor) mesh and
under `jax.set_mesh`, so that kernels chosen at trace time see the target platform:
  train   train.program.Program's train step with the config's batch, grad_accum, dtype, remat;
  eval    the long-context evaluation forward (evaluation.scoring's token scores) at a length
          (default 16384) with YaRN past data.seq_len, one window a data-parallel shard;
  decode  one new token a sequence against a KV cache of that length.
Topology names: accelerator types (v5e-8, v4-32, v5p-128, v6e-16; v4 and v5p count TensorCores,
two a chip), chip grids (v5e:2x4, v4:2x2x4) and cpu:N, this process's first N CPU devices (no
libtpu needed, no chip figures: tests and a first look). Every figure is per device; what they
are and how the roofline bound is made: rove_jax.aot.analysis. Topology names, their chips
and devices: rove_jax.aot.topology (parse_topology, Topology, CHIPS are re-exported here).
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding

from rove_jax.aot import analysis as aot_analysis
from rove_jax.aot.analysis import format_report  # noqa: F401 (re-exported)
from rove_jax.aot.topology import (  # noqa: F401 (re-exported)
  CHIPS,
  GPU_CHIPS,
  Chip,
  GiB,
  Topology,
  known_topologies,
  parse_topology,
)
from rove_jax.nn import flops
from rove_jax.nn.model import ROTARY_ENCODINGS, abstract_model, param_count
from rove_jax.train import resolve, sharding

JOBS = flops.JOBS


# --------------------------------------------------------------------------------- programs


def _abstract(model_cfg, mesh):
  """(graphdef, abstract params, their shardings, path specs) of a model config on a mesh."""
  model = abstract_model(model_cfg)
  params = nnx.state(model, nnx.Param)
  specs = sharding.param_path_specs(params, mesh)
  return nnx.graphdef(model), params, sharding.tree_shardings(params, specs, mesh), specs


def _sds(tree, shardings):
  return jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
  )


def _train_program(c, mesh):
  # Here, not at the top: the train step loads optax, which parse_topology's users and the
  # eval and decode programs do not need.
  from rove_jax.train.program import Program

  program = Program(c, mesh)  # the trainer's own: its layers' parameters stacked
  step, state, state_sh = program.train_step, program.abstract_state, program.state_shardings
  batch_sh = sharding.batch_sharding(mesh)
  B, T = c.data.batch_size, c.data.seq_len
  keys = ("inputs", "targets") + (("positions", "segment_ids") if c.data.packing else ())
  batch = {k: jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=batch_sh) for k in keys}
  return (
    step,
    (_sds(state, state_sh), batch),
    dict(batch=B, length=T, tokens=B * T, packing=bool(c.data.packing)),
  )


def _yarn(model_cfg, length: int, train_len: int):
  """evaluation.scoring's YaRN (a RopeScaling) past the training length; None (the model
  config's own) at or below it."""
  from rove_jax.evaluation import scoring  # loads orbax and grain: only eval programs need it

  if model_cfg.pos_encoding not in ROTARY_ENCODINGS:
    return None
  return scoring.yarn_scaling(length, train_len)


def _eval_program(c, model_cfg, mesh, length, batch, impl):
  from rove_jax.evaluation import scoring  # loads orbax and grain: only eval programs need it

  impl = impl or scoring.DEFAULT_KERNEL  # evaluation's own kernel unless told
  model_cfg = model_cfg.with_kernel(impl)
  if model_cfg.pos_encoding == "learned" and length > model_cfg.max_len:
    raise ValueError(
      f"learned position embeddings cover {model_cfg.max_len} positions; "
      f"choose an evaluation length <= {model_cfg.max_len}"
    )
  graphdef, params, params_sh, _ = _abstract(model_cfg, mesh)
  scaling = _yarn(model_cfg, length, c.data.seq_len)

  def token_scores(params, tokens_BW):  # what evaluation runs
    return scoring.token_scores(nnx.merge(graphdef, params), tokens_BW, scaling)

  batch_sh = sharding.batch_sharding(mesh)
  fn = jax.jit(token_scores, in_shardings=(params_sh, batch_sh))
  tokens = jax.ShapeDtypeStruct((batch, length + 1), jnp.int32, sharding=batch_sh)
  info = dict(
    batch=batch,
    length=length,
    tokens=batch * length,
    attention_impl=impl,
    rope_scaling=None if scaling is None else scaling.to_dict(),
  )
  return fn, (_sds(params, params_sh), tokens), info


def _decode_program(c, model_cfg, mesh, length, batch):
  graphdef, params, params_sh, _ = _abstract(model_cfg, mesh)
  model = nnx.eval_shape(lambda: nnx.merge(graphdef, params))
  cache = jax.eval_shape(lambda: model.init_cache(batch, length))
  axes = {4: ("batch", None, "kv_heads", "head_dim"), 2: ("batch", None), 0: ()}
  cache_sh = jax.tree.map(
    lambda a: NamedSharding(mesh, sharding.logical_to_spec(axes[a.ndim], a.shape, mesh)), cache
  )
  scaling = _yarn(model_cfg, length, c.data.seq_len)

  def decode_step(params, tokens_B1, cache):  # one token a sequence; greedy next token
    logits, cache = nnx.merge(graphdef, params)(tokens_B1, cache=cache, rope_scaling=scaling)
    return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

  batch_sh = sharding.batch_sharding(mesh)
  fn = jax.jit(
    decode_step,
    in_shardings=(params_sh, batch_sh, cache_sh),
    out_shardings=(batch_sh, cache_sh),
    donate_argnums=2,
  )
  tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=batch_sh)
  info = dict(
    batch=batch,
    length=length,
    tokens=batch,
    rope_scaling=None if scaling is None else scaling.to_dict(),
  )
  return fn, (_sds(params, params_sh), tokens, _sds(cache, cache_sh)), info


# ------------------------------------------------------------------------------ compile_job


def compile_job(
  c,
  topology,
  job: str = "train",
  *,
  eval_len: int = 16384,
  eval_impl: Optional[str] = None,
  decode_len: Optional[int] = None,
  batch: Optional[int] = None,
  log: Optional[Callable[[str], None]] = None,
  hlo_path: Optional[str] = None,
  resolved: bool = False,
) -> dict:
  """Lowers and compiles one program of run config `c` for a topology; returns its figures.

  Args:
    c: a RunConfig (a configs/*.py get_config(), run_config.paper_config), resolved here
      unless `resolved`.
    topology: a name for parse_topology ("v5e-8", "v4:2x2x4", "cpu:4") or a Topology.
    job: "train" (the config's batch, grad_accum, dtype, remat), "eval" (the forward and
      token scores of `batch` windows of eval_len tokens, YaRN past data.seq_len) or "decode"
      (one token for each of `batch` sequences against a KV cache of decode_len slots).
    eval_len: evaluation length; decode_len defaults to it.
    eval_impl: attention kernel of the evaluation forward (default: evaluation's own).
    batch: eval / decode sequences (default: the data-parallel size, one per shard).
    log: called with progress lines.
    hlo_path: where to write the compiled HLO text (for a closer look), if given.
    resolved: `c` is as rove_jax.train.resolve returned it (rove-train's dry run): its inputs
      are not read again.

  Raises:
    ValueError: a mesh that does not fit the topology, a batch that does not split over it,
      an unknown job or topology. ImportError: a TPU topology without libtpu.
  """
  if job not in JOBS:
    raise ValueError(f"unknown job {job!r}; choose from {JOBS}")
  c = resolve.resolved(c, "compile_job") if resolved else resolve.resolve(c)
  topology, model_cfg = parse_topology(topology), c.model
  log = log or (lambda line: None)
  devices = topology.devices()
  try:
    mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=devices)
  except ValueError as e:
    raise ValueError(f"topology {topology.name} has {len(devices)} devices: {e}") from None
  dp, B, M = sharding.data_parallel_size(mesh), c.data.batch_size, c.optim.grad_accum
  notes = []
  if job == "train":
    if B % dp or B % M:
      raise ValueError(
        f"data.batch_size={B} must divide by the data-parallel size mesh.data * "
        f"mesh.fsdp = {dp} and by optim.grad_accum={M}"
      )
    if (B // M) % dp:
      notes.append(f"a micro-batch of {B // M} rows does not split over {dp} data shards")
    fn, args, info = _train_program(c, mesh)
  elif (batch or dp) % dp:
    raise ValueError(
      f"{job} batch {batch} does not split over the data-parallel size {dp}; "
      f"choose a multiple of {dp}"
    )
  elif job == "eval":
    fn, args, info = _eval_program(c, model_cfg, mesh, eval_len, batch or dp, eval_impl)
  else:
    fn, args, info = _decode_program(c, model_cfg, mesh, decode_len or eval_len, batch or dp)
  log(
    f"{job}: lowering and compiling for {topology.name} ({topology.accelerator_type}), mesh "
    f"{dict(mesh.shape)}"
  )
  report = dict(
    job=job,
    topology=topology.name,
    accelerator=topology.accelerator_type,
    devices=topology.n_devices,
    mesh=dict(mesh.shape),
    grad_accum=M,
    dtype=model_cfg.dtype,
    remat=model_cfg.remat,
    pos_encoding=model_cfg.pos_encoding,
    attention_impl=model_cfg.attention_impl,
  )
  report.update(info)
  t0 = time.perf_counter()
  with jax.set_mesh(mesh):
    lowered = fn.lower(*args)
    t1 = time.perf_counter()
    try:
      compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - XLA raises no specific type for running out of HBM
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      log(f"{job}: does not fit ({time.perf_counter() - t1:.1f} s)")
      return dict(
        report,
        lower_s=t1 - t0,
        compile_s=time.perf_counter() - t1,
        fits=False,
        error=" ".join(str(e).split("\n")[0].split()[:40]),
        notes=notes,
      )
  report.update(lower_s=t1 - t0, compile_s=time.perf_counter() - t1)
  log(f"{job}: compiled in {report['compile_s']:.1f} s (lowering {t1 - t0:.1f} s)")
  if hlo_path:
    with open(hlo_path, "w") as f:
      f.write(compiled.as_text())
  per_token, attention = flops.model_flops_per_token(model_cfg, job, info["length"])
  report.update(
    aot_analysis.analyze(
      compiled,
      topology.chip,
      n_devices=topology.n_devices,
      tokens=info["tokens"],
      model_flops=per_token,
      attention_flops=attention,
      accumulation=M if job == "train" else 1,
    )
  )
  report["notes"] = notes + report.pop("analysis_notes")
  return report


# ------------------------------------------------------------------------- recommendation


def recommend(c, topology, *, usable: float = 0.9) -> dict:
  """A (data, fsdp, tensor) mesh and grad_accum for run config `c` on a TPU topology.

  The rule (an estimate to check with compile_job):
    mesh: data parallelism alone while the training state (float32 parameters, gradients and
      Adam's two moments: 16 bytes a parameter) takes at most half of a chip's HBM; else the
      smallest power-of-two fsdp that brings a chip's share under half. tensor stays 1: at GPT-2
      widths Megatron tensor parallelism's per-layer all-reduces cost more than they save.
    grad_accum: the smallest M dividing the per-device batch whose micro-batch activations fit
      what the state leaves of `usable` x HBM: per token n_layer (34 E + 5 H T) bytes without
      remat, n_layer 2 E with remat="full" (Korthikanti et al. 2022, bfloat16; float32 doubles
      them), plus 8 V for the float32 logits and their gradient.
  """
  c = resolve.resolve(c)
  topology, model_cfg = parse_topology(topology), c.model
  if topology.chip is None:
    raise ValueError(f"recommend needs a TPU topology's HBM figure; {topology.name} has none")
  n, hbm, B, T = topology.n_devices, topology.chip.hbm_bytes, c.data.batch_size, c.data.seq_len
  if B % n:
    raise ValueError(
      f"data.batch_size={B} does not split over the {n} devices of "
      f"{topology.name}; choose a multiple of {n}"
    )
  state = 16 * param_count(model_cfg)
  fsdp = 1
  while state / fsdp > hbm / 2 and fsdp < n and n % (2 * fsdp) == 0:
    fsdp *= 2
  E, H, V, L = model_cfg.d_model, model_cfg.n_head, model_cfg.vocab_size, model_cfg.n_layer
  per_layer = 2 * E if model_cfg.remat == "full" else 34 * E + 5 * H * T
  per_token = L * per_layer * (2 if model_cfg.dtype == "float32" else 1) + 8 * V
  budget = usable * hbm - state / fsdp
  rows = B // n
  M = next(
    (m for m in range(1, rows + 1) if rows % m == 0 and rows // m * T * per_token <= budget), rows
  )
  activations = rows // M * T * per_token
  return dict(
    mesh=dict(data=n // fsdp, fsdp=fsdp, tensor=1),
    grad_accum=M,
    state_bytes_per_device=state / fsdp,
    activation_bytes_per_device=activations,
    fits=state / fsdp + activations <= usable * hbm,
    rule=recommend.__doc__,
  )
