"""Training: optimizer, jitted train step, evaluation and the preemption-safe loop.

Shape letters (legend in rove_jax): B batch (per process), T sequence length,
M gradient-accumulation micro-steps, V vocabulary.

The loop resumes from the newest readable checkpoint in workdir (params, optimizer state,
step and the data iterator's position), logs to workdir/metrics.jsonl and TensorBoard, and
on SIGTERM / SIGINT finishes the current step, saves and returns. A step whose loss or
gradient is not finite leaves the state unchanged and is counted; too many in a row stop the
run with an error.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from rove_jax.train import agreement
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import config_schema, run_config
from rove_jax.storage import deadline
from rove_jax.train import gpu_options, health as health_lib, init_from, packing, resume
from rove_jax.train import run_control, run_data
from rove_jax.train import sharding as sharding_lib
from rove_jax.train import tracking
from rove_jax.train import clipping
from rove_jax.train.loss import cross_entropy
from rove_jax import hardware
from rove_jax.nn import flops
from rove_jax.train.metrics import MetricsLog
from rove_jax.train.result import TrainResult
from rove_jax.train.run_config import OptimConfig, RunConfig
from rove_jax.nn.model import GPT

# Weight decay applies to these matrices only; embeddings, norms, biases and the T5 table
# are not decayed.
_DECAY_NAMES = ("wqkv", "wq", "wkv", "wo", "w_in", "w_gate", "w_out", "lm_head")


@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any
  step: jax.Array


class NonFiniteError(RuntimeError):
  """The run diverged; `last_good` is the step of the newest good checkpoint (None: none)."""

  def __init__(self, message: str, *, last_good: Optional[int] = None):
    super().__init__(message)
    self.last_good = last_good


# --------------------------------------------------------------------------- components


def lr_schedule(o: OptimConfig, steps: int):
  """Linear warmup to optim.lr, then cosine decay to lr * min_lr_ratio at `steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=o.lr, warmup_steps=o.warmup_steps,
      decay_steps=max(steps, o.warmup_steps + 1), end_value=o.lr * o.min_lr_ratio)


def decay_mask(params) -> Any:
  """True for the projection matrices that get weight decay; False for the rest."""
  def keep(path, leaf):
    names = [getattr(k, "key", None) for k in path]
    return any(n in _DECAY_NAMES for n in names)
  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(o: OptimConfig, steps: int) -> optax.GradientTransformation:
  """AdamW with warmup + cosine, global-norm clipping, decay on matrices only."""
  parts = []
  if o.clip_norm and o.clip_norm > 0:
    parts.append(clipping.clip_by_global_norm(o.clip_norm))
  parts.append(optax.adamw(lr_schedule(o, steps), b1=o.b1, b2=o.b2, eps=o.eps,
                           weight_decay=o.weight_decay, mask=decay_mask))
  return optax.chain(*parts)


def _batch_loss(graphdef, params, batch):
  model = nnx.merge(graphdef, params)
  # The pipeline's positions restart at each packed document and grow inside it.
  logits = model(batch["inputs"], positions=batch.get("positions"),
                 segment_ids=batch.get("segment_ids"), positions_ordered=True, logits_dtype=None)
  return cross_entropy(logits, batch["targets"], batch.get("loss_mask"))[0]


def make_train_step(graphdef, tx: optax.GradientTransformation, grad_accum: int,
                    schedule=None, *, state_shardings=None, batch_sharding=None,
                    compiler_options=None):
  """A jitted (state, batch) -> (state, metrics) with the state donated, compiled with
  `compiler_options` (rove_jax.train.gpu_options on GPUs).

  With grad_accum = M the batch [B, T] is split into M micro-batches [B / M, T] whose
  gradients are averaged (a lax.scan), then one optimizer update is applied. A non-finite loss
  or gradient norm leaves params and optimizer state unchanged (metrics["finite"] = False).
  """
  def step(state: TrainState, batch):
    def micro(carry, mb):
      loss, grads = jax.value_and_grad(functools.partial(_batch_loss, graphdef))(state.params, mb)
      acc_loss, acc_grads = carry
      return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), None

    if grad_accum == 1:
      loss_fn = functools.partial(_batch_loss, graphdef)
      loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    else:
      split = jax.tree.map(functools.partial(_micro_batches, grad_accum, batch_sharding), batch)
      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (loss, grads), _ = jax.lax.scan(micro, (jnp.zeros((), jnp.float32), zeros), split)
      loss = loss / grad_accum
      grads = jax.tree.map(lambda g: g / grad_accum, grads)
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
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm)
              & jnp.isfinite(jnp.sum(jnp.square(probe.astype(jnp.float32)))))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = TrainState(params=keep(new_params, state.params),
                           opt_state=keep(new_opt, state.opt_state),
                           step=state.step + 1)
    metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite}
    if schedule is not None:
      metrics["lr"] = schedule(state.step)
    return new_state, metrics

  options = compiler_options or None
  if state_shardings is None:
    return jax.jit(step, donate_argnums=0, compiler_options=options)
  return jax.jit(step, donate_argnums=0, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, None), compiler_options=options)


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


def throughput(step_time_s: float, tokens_per_step: int, step_flops: float, n_devices: int,
               peak: Optional[float]) -> dict:
  """The logged speed of a step: its time, tokens/s, model TFLOP/s per device and, where the
  devices' peak is known (rove_jax.hardware), MFU = achieved model FLOP/s / peak."""
  per_device = step_flops / step_time_s / n_devices
  out = {"step_time_s": step_time_s, "tokens_per_s": tokens_per_step / step_time_s,
         "model_tflops_per_device": per_device / 1e12}
  if peak:
    out["mfu"] = per_device / peak
  return out


def make_eval_step(graphdef, compiler_options=None):
  @functools.partial(jax.jit, compiler_options=compiler_options or None)
  def eval_step(params, batch):
    return _batch_loss(graphdef, params, batch)
  return eval_step


def evaluate(eval_step, params, batches) -> Optional[float]:
  losses = [float(eval_step(params, b)) for b in batches]
  return float(np.mean(losses)) if losses else None


# ------------------------------------------------------------------------------ logging


def train(c, workdir: str, *, log=print, devices=None) -> TrainResult:
  """Trains (or resumes) the run described by config `c` in `workdir`; returns its result.

  Args:
    c: a RunConfig, or a config as written (an ml_collections ConfigDict from a config file),
      which is built into one here (`config_schema.build`: checked before any work).
    workdir: local path or gs://bucket/path.
    log: where process 0's progress lines go (the other processes log nothing).
    devices: the mesh's devices (default: all devices of all processes).

  Runs SPMD over the (data, fsdp, tensor) mesh of `c.mesh`.
  """
  c = config_schema.build(c, log=log)
  run_config.check_environment(c)
  deadline.reset()  # a stop or a storage failure of an earlier run in this process is past
  deadline.configure(c.storage_timeout)
  if jax.process_index() != 0:
    log = lambda *a, **k: None
  if "wandb" in tracking.parse_tracking(c.tracking) and jax.process_index() == 0:
    tracking.check_wandb_ready(c.wandb)  # before the workdir is created: nothing left behind
  workdir = resume.check_workdir(workdir)
  mesh = sharding_lib.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, devices=devices)
  dp = sharding_lib.data_parallel_size(mesh)
  nproc, pidx = jax.process_count(), jax.process_index()
  if c.data.batch_size % dp or c.data.batch_size % nproc:
    raise ValueError(f"data.batch_size={c.data.batch_size} is not divisible by the data-parallel "
                     f"size mesh.data * mesh.fsdp = {dp} (and the {nproc} processes)")
  # The lock comes first: opening the checkpoints for writing cleans up unfinished saves,
  # which must never happen under another trainer's feet.
  lock = resume.WriterLock(workdir)
  error = None
  if pidx == 0:
    try:
      lock.acquire(log=log)
    except resume.LockError as e:
      error = e
  if nproc > 1:  # every process stops if process 0 could not lock
    from jax.experimental import multihost_utils
    failed = multihost_utils.broadcast_one_to_all(np.array(error is not None))
    if bool(failed) and error is None:
      error = resume.LockError(f"process 0 could not lock {workdir}; see its log")
  if error is not None:
    raise error
  ckpt = None
  try:
    # every process writes where process 0 locked, with the same config, or all stop now
    agreement.confirm(workdir, c.to_dict())
    ckpt = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), keep=c.keep_checkpoints,
                                 async_save=c.async_checkpoints)
    with jax.set_mesh(mesh):  # kernels that shard themselves (TPU splash) see the mesh
      summary = _train(c, workdir, mesh, ckpt, lock if pidx == 0 else None, log)
    ckpt, closing = None, ckpt
    closing.close()  # the last save's failure is this run's error
    return summary
  finally:
    try:
      if ckpt is not None:  # already failing: that first error is the one reported
        ckpt.close_quietly(log)
    finally:
      if pidx == 0:
        run_control.release_lock(lock, log)


def _train(c: RunConfig, workdir, mesh, ckpt, lock, log) -> TrainResult:
  """The body of `train`, inside the writer lock (held by process 0: `lock`, else None) and
  with the checkpoints open."""
  nproc, pidx = jax.process_count(), jax.process_index()
  model_cfg = c.model
  schedule = lr_schedule(c.optim, c.steps)
  tx = make_optimizer(c.optim, c.steps)

  def init_state():
    _, params = nnx.split(GPT(model_cfg, rngs=nnx.Rngs(c.seed)), nnx.Param)
    return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))

  abstract_state = jax.eval_shape(init_state)
  meta = c.metadata()
  # Before data work and before any restore: a config that cannot continue the saved run is an
  # error that leaves every checkpoint where it is.
  resume.check_resumable(ckpt, meta, ckpt_lib.to_flat(abstract_state), workdir=workdir,
                         log=log)
  if ckpt.latest_step() is None and ckpt.quarantined() and not c.fresh_start:
    raise ValueError(
        f"{ckpt.directory} holds no checkpoint, but {len(ckpt.quarantined())} earlier ones of "
        f"this run were found unreadable and moved to {ckpt.quarantine_dir()}. Starting again "
        f"from step 0 would overwrite its metrics: move a checkpoint back if you can repair it, "
        f"or pass --config.fresh_start=True to start from step 0 (the moved ones stay).")

  # prepared shards checked at every start; every process's data the same, or all stop here
  data = run_data.open_data(c, workdir, resuming=ckpt.latest_step() is not None)
  for split, toks in (("training", data.train_tokens), ("validation", data.val_tokens)):
    windows = (len(toks) - 1) // c.data.seq_len
    if windows < c.data.batch_size:  # found now, not when the first evaluation comes round
      raise ValueError(f"the {split} split has {len(toks)} tokens: {windows} windows of "
                       f"data.seq_len={c.data.seq_len}, fewer than one batch of "
                       f"data.batch_size={c.data.batch_size}; use more data (data.max_files, "
                       f"data.val_fraction, data.val_path) or a smaller seq_len / batch_size")
  if c.data.packing:  # rows the attention kernel cannot take stop the run here, not as NaN
    packing.check(model_cfg, c.data.seq_len, (data.train_tokens, data.val_tokens),
                  data.tokenizer.eot_id, log=log)
  if data.tokenizer.vocab_size > model_cfg.vocab_size:
    need = -(-data.tokenizer.vocab_size // 64) * 64
    raise ValueError(f"tokenizer {data.tokenizer.name} has {data.tokenizer.vocab_size} ids but "
                     f"model.vocab_size is {model_cfg.vocab_size}; set "
                     f"--config.model.vocab_size={need}")

  # Parameters and optimizer state are created already sharded: no full copy on one device.
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: GPT(model_cfg, rngs=nnx.Rngs(c.seed))))
  path_specs = sharding_lib.param_path_specs(abstract_state.params, mesh)
  state_sh = sharding_lib.tree_shardings(abstract_state, path_specs, mesh)
  state = jax.jit(init_state, out_shardings=state_sh)()
  iterator = data.train_iterator(seq_len=c.data.seq_len, global_batch_size=c.data.batch_size,
                                 seed=c.seed, packing=c.data.packing, process_index=pidx,
                                 process_count=nproc)
  meta["tokenizer"].update(name=data.tokenizer.name, vocab_size=data.tokenizer.vocab_size,
                           eot_id=data.tokenizer.eot_id,
                           fingerprint=data.tokenizer.fingerprint)

  start = 0
  tokens_per_step = c.data.batch_size * c.data.seq_len
  target = jax.tree.map(lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                        abstract_state, state_sh)  # restores onto this run's mesh
  restored = ckpt.restore_latest(ckpt_lib.to_flat(target), report=log)
  meta["data_identity"] = data.identity
  if restored is not None:
    start, flat, data_state, saved_meta = restored
    # A tokenizer file in the workdir that changed since the save would feed the run other ids.
    resume.check_tokenizer(saved_meta, data.tokenizer, workdir=workdir)
    # So would a dataset re-prepared, or files edited, since the run began.
    resume.check_data(saved_meta, data.identity, allow_changed=c.data.allow_changed,
                      workdir=workdir, log=log)
    state = ckpt_lib.from_flat(flat, state)
    iterator.set_state(data_state)
    log(f"resumed from step {start} in {ckpt.directory}" + (
        f"; init_from={c.init_from} is ignored" if c.init_from else ""))
  elif c.init_from is not None:  # a new run from a pretrained model (train/init_from.py)
    state = state.replace(params=init_from.load_params(c, state_sh.params, log=log))
  sinks = tracking.parse_tracking(c.tracking)
  metrics_log = MetricsLog(
      workdir, resume_step=start, enabled=pidx == 0, report=log,
      tensorboard="tensorboard" in sinks,
      sinks=[tracking.Wandb(workdir, c.wandb, c.to_dict())]
      if "wandb" in sinks and pidx == 0 else [])
  profiler = tracking.Profiler(workdir, tracking.parse_profile_steps(c.profile_steps, c.steps),
                               enabled=pidx == 0, log=log)
  # Model FLOPs of a step (PaLM's count) against the devices' peak, for the logged MFU.
  step_flops = tokens_per_step * flops.model_flops_per_token(
      model_cfg, "train", c.data.seq_len)[0]
  peak = hardware.peak_flops(mesh.devices.flat[0].device_kind)
  batch_sh = sharding_lib.batch_sharding(mesh)
  options = gpu_options.compiler_options(mesh.devices.flat)
  if options:
    log(f"XLA options for this GPU: {options} (rove_jax/train/gpu_options.py)")
  train_step = make_train_step(graphdef, tx, c.optim.grad_accum, schedule,
                               state_shardings=state_sh, batch_sharding=batch_sh,
                               compiler_options=options)
  eval_step = make_eval_step(graphdef, options)
  eval_kw = dict(seq_len=c.data.seq_len, batch_size=c.data.batch_size,
                 max_batches=c.eval_batches, packing=c.data.packing, process_index=pidx,
                 process_count=nproc)
  place = functools.partial(sharding_lib.place_batch, mesh=mesh)
  param_norm = jax.jit(clipping.global_norm)
  health = health_lib.Health(max_loss_jump=c.optim.max_loss_jump,
                             max_param_growth=c.optim.max_param_growth,
                             good_step=start if restored is not None else None,
                             good_norm=float(param_norm(state.params)))

  def save(step) -> Optional[str]:
    """Checkpoints the state if it is good (health.py); else returns why it is not."""
    norm = float(param_norm(state.params))
    metrics_log.write({"step": step, "param_norm": norm})
    problem = health.verdict(norm)
    if problem is not None:
      log(f"step {step}: not saved: {problem}; {health.last_good()}")
      return problem
    ckpt.save(step, ckpt_lib.to_flat(state), iterator.get_state(), {**meta, "step": step})
    metrics_log.flush()  # the metrics of every step a resume keeps are stored with it
    health.accept(step, norm)
    return None

  def diverged(what: str) -> NonFiniteError:
    return NonFiniteError(f"{what}; {health.last_good()} (no later state was saved): rerun "
                          f"with a lower optim.lr (this run's: {c.optim.lr:g}) or check the data",
                          last_good=health.good_step)

  summary = {"start_step": start, "workdir": workdir}
  nonfinite_run = nonfinite_total = 0
  learning = learning_skipped = 0  # steps run with a nonzero learning rate; of them skipped
  t_last, step_last = time.perf_counter(), start
  last = {}
  step = start
  end = c.steps if c.run_steps is None else min(c.steps, start + c.run_steps)
  with run_control.StopSignal() as stop, run_control.progress(c.steps, start, c.progress and pidx == 0) as bar:
    while step < end:
      batch = place(next(iterator))
      profiler.before(step + 1)
      state, m = train_step(state, batch)
      step += 1
      profiler.after(step, m)
      finite = bool(m["finite"])
      health.observe(step, float(m["loss"]), finite)
      if float(m["lr"]) > 0:  # warmup's first step (lr 0) changes nothing, skipped or not
        learning += 1
        learning_skipped += not finite
      if step == start + 1:  # throughput from here on, compile time excluded
        t_last, step_last = time.perf_counter(), step
      if finite:
        nonfinite_run = 0
      else:
        nonfinite_run += 1
        nonfinite_total += 1
        log(f"step {step}: non-finite loss or gradient, update skipped "
            f"({nonfinite_run} in a row)")
        if nonfinite_run >= c.optim.max_nonfinite:
          ckpt.wait()
          raise diverged(f"{nonfinite_run} consecutive non-finite steps (last at step {step}); "
                         f"stopping")
      if step % c.log_every == 0 or step == c.steps:
        now = time.perf_counter()
        last = {"step": step, "loss": float(m["loss"]), "lr": float(m["lr"]),
                "grad_norm": float(m["grad_norm"]), "nonfinite_steps": nonfinite_total}
        if step > step_last:  # the first step's time is compilation: no throughput for it
          last.update(throughput((now - t_last) / (step - step_last), tokens_per_step,
                                 step_flops, mesh.devices.size, peak))
        t_last, step_last = now, step
        metrics_log.write(last)
        if bar is not None:
          bar.set_postfix(loss=f"{last['loss']:.3f}",
                          tok_s=f"{last['tokens_per_s']:.0f}" if "tokens_per_s" in last else "-")
      if step % c.eval_every == 0 or step == c.steps:
        val = evaluate(eval_step, state.params, map(place, data.eval_batches(**eval_kw)))
        if val is not None:
          metrics_log.write({"step": step, "val_loss": val})
          summary["val_loss"] = val
          log(f"step {step}: val_loss {val:.4f}")
      if step % c.checkpoint_every == 0 and step < c.steps:
        save(step)
      if bar is not None:
        bar.update(1)
      stop_now = stop.received is not None
      failure = run_control.failure(ckpt, lock)  # a background save that failed, a lock taken over
      if nproc > 1:  # every process must leave the loop at the same step
        from jax.experimental import multihost_utils
        flags = np.asarray(multihost_utils.process_allgather(
            np.array([stop_now, failure is not None]))).reshape(nproc, 2)
        stop_now = bool(flags[:, 0].any())
        if failure is None and flags[:, 1].any():
          failure = ckpt_lib.SaveError(f"processes {np.flatnonzero(flags[:, 1]).tolist()} "
                                       f"stopped at step {step}: see their log")
      if failure is not None:
        raise failure
      if stop_now:
        log(f"{stop.received or 'a stop signal on another process'} received: saving a "
            f"checkpoint at step {step} and exiting")
        summary["stopped_by"] = stop.received or "peer"
        break
    profiler.stop(state)  # a run that ended inside the window
    # Always end with a checkpoint of the final state, if it is good.
    final_problem = None
    if ckpt.latest_step() != step and health.good_step != step:
      final_problem = save(step)
  metrics_log.close()
  if step > start and (nonfinite_total == step - start or learning_skipped == learning > 0):
    raise NonFiniteError(
        f"{nonfinite_total} of the {step - start} steps run were skipped as non-finite, every "
        f"one with a nonzero learning rate: nothing was learned; lower optim.lr or check the "
        f"data", last_good=health.good_step)
  if final_problem is not None:
    ckpt.wait()
    raise diverged(f"the state at step {step}, where the run ended, is not good "
                   f"({final_problem})")
  if data.loss_mask_T is None:  # a masked val loss scores some targets only: no comparison
    counts = np.bincount(np.asarray(data.val_tokens, np.int64), minlength=1).astype(np.float64)
    probs = counts[counts > 0] / counts.sum()
    summary["val_unigram_entropy"] = float(-(probs * np.log(probs)).sum())
  return TrainResult(**summary, step=step, last=last, nonfinite_steps=nonfinite_total,
                     steps_run=step - start, tokenizer=data.tokenizer, model_config=model_cfg,
                     params=state.params, graphdef=graphdef, mesh=mesh)
