"""Training: the optimizer, the jitted train and eval steps, and `train`, the resumable run.

Shape letters (legend in rove_jax): B batch (per process), T sequence length,
M gradient-accumulation micro-steps, V vocabulary.

`train` is a short sequence, each part built by the module that owns it: resolve the config,
the mesh (sharding.run_mesh), lock the workdir (run_control.lock), open the checkpoints, build
the run state (`_run_state`: the optimizer, the model, the data from run_data.open_data), run
it (step_loop.py: the step and its callbacks), close. A run
resumes from the newest readable checkpoint in workdir (params, optimizer state,
step and the data iterator's position), logs to workdir/metrics.jsonl and TensorBoard, and
on SIGTERM / SIGINT finishes the current step, saves and returns. A step whose loss or
gradient is not finite leaves the state unchanged and is counted; too many in a row stop the
run with an error. In memory the state holds the blocks' parameters and moments stacked by
layer (layer_stack.py: fewer optimizer kernels); checkpoints hold them per layer.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rove_jax.nn.model import GPT, abstract_model
from rove_jax.storage import deadline
from rove_jax.train import (
  agreement,
  clipping,
  gpu_options,
  init_from,
  layer_stack,
  resolve,
  resume,
  run_checks,
  run_control,
  run_data,
  step_loop,
  tracking,
)
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import sharding as sharding_lib
from rove_jax.train.health import NonFiniteError  # noqa: F401 - what train() raises
from rove_jax.train.loss import cross_entropy, fused_cross_entropy
from rove_jax.train.metrics import MetricsLog
from rove_jax.train.result import TrainResult
from rove_jax.train.run_config import OptimConfig, RunConfig

# Weight decay applies to these matrices only; embeddings, norms, biases and the T5 table
# are not decayed.
_DECAY_NAMES = ("wqkv", "wq", "wkv", "wo", "w_in", "w_gate", "w_out", "lm_head")


@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any
  step: jax.Array


# --------------------------------------------------------------------------- components


def lr_schedule(o: OptimConfig, steps: int):
  """Linear warmup to optim.lr, then cosine decay to lr * min_lr_ratio at `steps`."""
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=o.lr,
    warmup_steps=o.warmup_steps,
    decay_steps=max(steps, o.warmup_steps + 1),
    end_value=o.lr * o.min_lr_ratio,
  )


def decay_mask(params) -> Any:
  """True for the projection matrices that get weight decay; False for the rest."""

  def keep(path, leaf):
    names = [getattr(k, "key", None) for k in path]
    return any(n in _DECAY_NAMES for n in names)

  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(o: OptimConfig, steps: int) -> optax.GradientTransformation:
  """AdamW with warmup + cosine, global-norm clipping, decay on matrices only."""
  adamw = optax.adamw(
    lr_schedule(o, steps), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask
  )
  if not (o.clip_norm and o.clip_norm > 0):
    return optax.chain(adamw)
  return optax.chain(clipping.clip_by_global_norm(o.clip_norm), adamw)


def _batch_loss(graphdef, params, batch, loss_impl: str = "xla"):
  """The mean token loss of a batch: from the logits in the compute dtype ("xla"), or with the
  output projection inside the loss kernel ("fused", rove_jax.kernels.linear_ce)."""
  model = nnx.merge(graphdef, params)
  # The pipeline's positions restart at each packed document and grow inside it.
  out = model(
    batch["inputs"],
    positions=batch.get("positions"),
    segment_ids=batch.get("segment_ids"),
    positions_ordered=True,
    logits_dtype=None,
    head=loss_impl != "fused",
  )
  if loss_impl == "fused":
    return fused_cross_entropy(out, model.head_VE(), batch["targets"], batch.get("loss_mask"))[0]
  return cross_entropy(out, batch["targets"], batch.get("loss_mask"))[0]


def new_state(tx: optax.GradientTransformation, params, layers=None) -> TrainState:
  """The train state at step 0 of the model's parameters (an nnx.State): stacked by `layers`
  (a layer_stack.LayerStack) when given, and the optimizer's state for them."""
  if layers is not None:
    params = layers.stack(params)
  return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


def make_train_step(
  graphdef,
  tx: optax.GradientTransformation,
  grad_accum: int,
  schedule=None,
  *,
  layers=None,
  state_shardings=None,
  batch_sharding=None,
  compiler_options=None,
  loss_impl: str = "xla",
):
  """A jitted (state, batch) -> (state, metrics) with the state donated, compiled with
  `compiler_options` (rove_jax.train.gpu_options on GPUs), its loss by `loss_impl`
  (OptimConfig.loss_impl: `_batch_loss`). With `layers` (a
  layer_stack.LayerStack) the state's parameters are stacked (`new_state(tx, params, layers)`):
  the model gets them unstacked and the optimizer sees their gradients stacked.

  With grad_accum = M the batch [B, T] is split into M micro-batches [B / M, T] whose
  gradients are averaged (a lax.scan), then one optimizer update is applied. A non-finite loss
  or gradient norm leaves params and optimizer state unchanged (metrics["finite"] = False).
  """

  def step(state: TrainState, batch):
    params = state.params if layers is None else layers.unstack(state.params)
    loss_fn = functools.partial(_batch_loss, graphdef, loss_impl=loss_impl)

    def micro(carry, mb):
      loss, grads = jax.value_and_grad(loss_fn)(params, mb)
      acc_loss, acc_grads = carry
      return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), None

    if grad_accum == 1:
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    else:
      split = jax.tree.map(functools.partial(_micro_batches, grad_accum, batch_sharding), batch)
      zeros = jax.tree.map(jnp.zeros_like, params)
      (loss, grads), _ = jax.lax.scan(micro, (jnp.zeros((), jnp.float32), zeros), split)
      loss = loss / grad_accum
      grads = jax.tree.map(lambda g: g / grad_accum, grads)
    if layers is not None:  # the concatenation fuses into the optimizer's update
      grads = layers.stack(grads)
    # The norm clipping computes too (clipping.clip_by_global_norm): compiled once.
    grad_norm = clipping.global_norm(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    # An update that overflows the parameters is rejected like a non-finite gradient. AdamW's
    # step is lr times a normalised direction for every parameter alike, so an overflow shows in
    # the smallest parameter array as in all: its new values decide, and the choice between new
    # and old state fuses into each other parameter's update instead of waiting on a norm of all
    # of them (a pass over every parameter and a kernel each).
    probe = min(jax.tree.leaves(new_params), key=lambda x: x.size)
    finite = (
      jnp.isfinite(loss)
      & jnp.isfinite(grad_norm)
      & jnp.isfinite(jnp.sum(jnp.square(probe.astype(jnp.float32))))
    )
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = TrainState(
      params=keep(new_params, state.params),
      opt_state=keep(new_opt, state.opt_state),
      step=state.step + 1,
    )
    metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite}
    if schedule is not None:
      metrics["lr"] = schedule(state.step)
    return new_state, metrics

  options = compiler_options or None
  if state_shardings is None:
    return jax.jit(step, donate_argnums=0, compiler_options=options)
  return jax.jit(
    step,
    donate_argnums=0,
    in_shardings=(state_shardings, batch_sharding),
    out_shardings=(state_shardings, None),
    compiler_options=options,
  )


def _micro_batches(M: int, batch_sharding, x):
  """[B, ...] -> [M, B / M, ...]: micro-batch m holds rows m, M + m, 2 M + m, ... so that each
  device's contiguous share of the batch splits into M local pieces and every micro-batch stays
  split over the data axes (a plain reshape to [M, B / M] would put the sharding on the M axis
  and replicate each micro-batch on every device)."""
  split = x.reshape((x.shape[0] // M, M) + x.shape[1:]).swapaxes(0, 1)
  if batch_sharding is None:
    return split
  spec = P(None, *batch_sharding.spec)
  return jax.lax.with_sharding_constraint(split, NamedSharding(batch_sharding.mesh, spec))


def make_eval_step(graphdef, compiler_options=None, layers=None, loss_impl: str = "xla"):
  """A jitted (params, batch) -> mean loss; params stacked by `layers` when given."""

  @functools.partial(jax.jit, compiler_options=compiler_options or None)
  def eval_step(params, batch):
    return _batch_loss(
      graphdef, params if layers is None else layers.unstack(params), batch, loss_impl
    )

  return eval_step


# ------------------------------------------------------------------------------- the run


def train(c, workdir: str, *, log=print, devices=None) -> TrainResult:
  """Trains (or resumes) the run described by config `c` in `workdir`; returns its result.

  Args:
    c: the RunConfig (a config file's get_config(), rove_jax.train.overrides applies
      command-line overrides); what its inputs decide is filled in here
      (rove_jax.train.resolve: checked before any work).
    workdir: local path or gs://bucket/path.
    log: where process 0's progress lines go (the other processes log nothing).
    devices: the mesh's devices (default: all devices of all processes).

  Runs SPMD over the (data, fsdp, tensor) mesh of `c.mesh`.
  """
  c = resolve.resolve(c, log=log)
  log = _check(c, log)
  workdir = resume.check_workdir(workdir)
  mesh = sharding_lib.run_mesh(c.mesh, c.data.batch_size, devices)
  lock = run_control.lock(workdir, log)
  ckpt = None
  try:
    # every process writes where process 0 locked, with the same config, or all stop now
    agreement.confirm(workdir, c)
    ckpt = ckpt_lib.Checkpointer(
      ckpt_lib.checkpoint_dir(workdir), keep=c.keep_checkpoints, async_save=c.async_checkpoints
    )
    with jax.set_mesh(mesh):  # kernels that shard themselves (TPU splash) see the mesh
      result = step_loop.run(_run_state(c, workdir, mesh, ckpt, lock, log))
    ckpt, closing = None, ckpt
    closing.close()  # the last save's failure is this run's error
    return result
  finally:
    try:
      if ckpt is not None:  # already failing: that first error is the one reported
        ckpt.close_quietly(log)
    finally:
      if lock is not None:
        run_control.release_lock(lock, log)


def _check(c: RunConfig, log):
  """What is checked before the workdir is touched; returns this process's log (the other
  processes than 0 log nothing)."""
  run_checks.check_environment(c)
  deadline.reset()  # a stop or a storage failure of an earlier run in this process is past
  deadline.configure(c.storage_timeout)
  if jax.process_index() != 0:
    return lambda *a, **k: None
  if "wandb" in tracking.parse_tracking(c.tracking):
    tracking.check_wandb_ready(c.wandb)  # before the workdir is created: nothing left behind
  return log


def _run_state(c: RunConfig, workdir, mesh, ckpt, lock, log) -> step_loop.Run:
  """What the step loop works on, each part checked before the next is built: the model and
  optimizer, a config that can continue the saved run, the data, the sharded state (restored,
  from init_from or new), the metrics and the steps to compile."""
  tx = make_optimizer(c.optim, c.steps)
  graphdef, layers, abstract_state, init_state = _model(c, tx)
  saved = _Saved(layers, abstract_state, mesh)
  state_sh = saved.state_shardings
  meta = c.metadata()
  _check_resumable(c, ckpt, meta, saved.state, workdir, log)
  data = run_data.open_data(c, workdir, resuming=ckpt.latest_step() is not None, log=log)
  # Parameters and optimizer state are created already sharded: no full copy on one device.
  state = jax.jit(init_state, out_shardings=state_sh)()
  pidx, nproc = jax.process_index(), jax.process_count()
  iterator = data.train_iterator(
    seq_len=c.data.seq_len,
    global_batch_size=c.data.batch_size,
    seed=c.seed,
    packing=c.data.packing,
    process_index=pidx,
    process_count=nproc,
  )
  tok = data.tokenizer
  meta["tokenizer"].update(
    name=tok.name, vocab_size=tok.vocab_size, eot_id=tok.eot_id, fingerprint=tok.fingerprint
  )
  meta["data_identity"] = data.identity
  state, start, restored = _restore(c, workdir, ckpt, data, iterator, state, saved, log)
  metrics_log, profiler = _recorders(c, workdir, start, log)
  train_step, eval_step = _steps(c, graphdef, tx, layers, state_sh, mesh, log)
  return step_loop.Run(
    c=c,
    workdir=workdir,
    mesh=mesh,
    ckpt=ckpt,
    lock=lock,
    log=log,
    data=data,
    iterator=iterator,
    state=state,
    start=start,
    restored=restored,
    meta=meta,
    graphdef=graphdef,
    layers=layers,
    to_checkpoint=saved.to_layers,
    train_step=train_step,
    eval_step=eval_step,
    metrics_log=metrics_log,
    profiler=profiler,
  )


def _recorders(c: RunConfig, workdir, start: int, log):
  """(the metrics log, the profiler) of a run resuming at `start`; process 0 records."""
  pidx = jax.process_index()
  sinks = tracking.parse_tracking(c.tracking)
  metrics_log = MetricsLog(
    workdir,
    resume_step=start,
    enabled=pidx == 0,
    report=log,
    tensorboard="tensorboard" in sinks,
    sinks=[tracking.Wandb(workdir, c)] if "wandb" in sinks and pidx == 0 else [],
  )
  profiler = tracking.Profiler(
    workdir, tracking.parse_profile_steps(c.profile_steps, c.steps), enabled=pidx == 0, log=log
  )
  return metrics_log, profiler


def _steps(c: RunConfig, graphdef, tx, layers, state_sh, mesh, log):
  """(the jitted train step, the jitted evaluation step), with the XLA options for this GPU."""
  options = gpu_options.compiler_options(mesh.devices.flat)
  if options:
    log(f"XLA options for this GPU: {options} (rove_jax/train/gpu_options.py)")
  train_step = make_train_step(
    graphdef,
    tx,
    c.optim.grad_accum,
    lr_schedule(c.optim, c.steps),
    layers=layers,
    state_shardings=state_sh,
    batch_sharding=sharding_lib.batch_sharding(mesh),
    compiler_options=options,
    loss_impl=c.optim.loss_impl,
  )
  return train_step, make_eval_step(graphdef, options, layers, c.optim.loss_impl)


def _model(c: RunConfig, tx: optax.GradientTransformation):
  """(graphdef, layer stack, the train state's shapes, init): the GPT built abstractly once
  for all three, and `init`, which builds it for real and returns its train state, the layers'
  parameters stacked (jitted onto the mesh by the caller)."""
  new_model = lambda: GPT(c.model, rngs=nnx.Rngs(c.seed))
  graphdef, abstract_params = nnx.split(abstract_model(c.model), nnx.Param)
  layers = layer_stack.LayerStack(abstract_params)
  abstract_state = jax.eval_shape(lambda p: new_state(tx, p, layers), abstract_params)
  return (
    graphdef,
    layers,
    abstract_state,
    lambda: new_state(tx, nnx.state(new_model(), nnx.Param), layers),
  )


class _Saved:
  """The train state in the checkpoints' layout (the model's per-layer parameters and
  moments, layer_stack.LayerStack.to_layers): its shapes and shardings on the mesh, the
  shardings of the stacked state, and the conversions between the two, jitted."""

  def __init__(self, layers: layer_stack.LayerStack, abstract_state, mesh: Mesh):
    self.state = jax.eval_shape(layers.to_layers, abstract_state)
    path_specs = sharding_lib.param_path_specs(self.state.params, mesh)
    self.shardings = sharding_lib.tree_shardings(self.state, path_specs, mesh)
    self.state_shardings = sharding_lib.tree_shardings(
      abstract_state, layers.path_specs(path_specs), mesh
    )
    # to_layers copies the state once on the devices while a save starts (orbax then copies
    # it to the host); from_layers stacks a restored one. Nothing stacked: nothing to do.
    on_mesh = lambda f, sh: jax.jit(f, out_shardings=sh) if layers.active else f
    self.to_layers = on_mesh(layers.to_layers, self.shardings)
    self.from_layers = on_mesh(layers.from_layers, self.state_shardings)
    self.stack_params = on_mesh(layers.stack, self.state_shardings.params)

  def target(self):
    """What a checkpoint restores into: shapes with this run's shardings."""
    return jax.tree.map(
      lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), self.state, self.shardings
    )


def _check_resumable(c: RunConfig, ckpt, meta: dict, abstract_state, workdir, log) -> None:
  """Before data work and before any restore: a config that cannot continue the saved run is an
  error that leaves every checkpoint where it is."""
  resume.check_resumable(ckpt, meta, ckpt_lib.to_flat(abstract_state), workdir=workdir, log=log)
  if ckpt.latest_step() is None and ckpt.quarantined() and not c.fresh_start:
    raise ValueError(
      f"{ckpt.directory} holds no checkpoint, but {len(ckpt.quarantined())} earlier ones of "
      f"this run were found unreadable and moved to {ckpt.quarantine_dir()}. Starting again "
      f"from step 0 would overwrite its metrics: move a checkpoint back if you can repair it, "
      f"or pass --config.fresh_start=True to start from step 0 (the moved ones stay)."
    )


def _restore(c: RunConfig, workdir, ckpt, data, iterator, state, saved: _Saved, log):
  """(state, start step, restored?): the newest readable checkpoint's state, with the data
  iterator set to its position; else, for a new run, init_from's parameters or `state`."""
  target = saved.target()  # restores onto this run's mesh, in the checkpoints' layout
  restored = ckpt.restore_latest(ckpt_lib.to_flat(target), report=log)
  if restored is None:
    if c.init_from is not None:  # a new run from a pretrained model (train/init_from.py)
      state = state.replace(
        params=saved.stack_params(init_from.load_params(c, saved.shardings.params, log=log))
      )
    return state, 0, False
  start, flat, data_state, saved_meta = restored
  # A tokenizer file in the workdir that changed since the save would feed the run other ids.
  resume.check_tokenizer(saved_meta, data.tokenizer, workdir=workdir)
  # So would a dataset re-prepared, or files edited, since the run began.
  resume.check_data(
    saved_meta, data.identity, allow_changed=c.data.allow_changed, workdir=workdir, log=log
  )
  state = saved.from_layers(ckpt_lib.from_flat(flat, target))
  iterator.set_state(data_state)
  log(
    f"resumed from step {start} in {ckpt.directory}"
    + (f"; init_from={c.init_from} is ignored" if c.init_from else "")
  )
  return state, start, True
