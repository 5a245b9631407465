"""Training: `train`, the resumable run.

`train` is a short sequence, each part built by the module that owns it: resolve the config,
the mesh (sharding.run_mesh), lock the workdir (run_control.lock), open the checkpoints, build
the run state (`_run_state`: the model, optimizer and steps from program.Program, the data from
run_data.open_data), run it (step_loop.py: the step and its callbacks), close. A run
resumes from the newest readable checkpoint in workdir (params, optimizer state,
step and the data iterator's position), logs to workdir/metrics.jsonl and TensorBoard, and
on SIGTERM / SIGINT finishes the current step, saves and returns. A step whose loss or
gradient is not finite leaves the state unchanged and is counted; too many in a row stop the
run with an error.
"""

from __future__ import annotations

import jax

from rove_jax.storage import deadline
from rove_jax.train import (
  agreement,
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
from rove_jax.train.program import Program
from rove_jax.train.result import TrainResult
from rove_jax.train.run_config import RunConfig

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
      run = _run_state(c, workdir, mesh, ckpt, lock, log)
      result = step_loop.run(run)
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
  deadline.reset()  # a stop or a storage failure of an earlier run in this process is past
  deadline.configure(c.storage_timeout)
  run_checks.check_environment(c)
  if jax.process_index() != 0:
    return lambda *a, **k: None
  if "wandb" in tracking.parse_tracking(c.tracking):
    tracking.check_wandb_ready(c.wandb)  # before the workdir is created: nothing left behind
  return log


def _run_state(c: RunConfig, workdir, mesh, ckpt, lock, log) -> step_loop.Run:
  """What the step loop works on, each part checked before the next is built: the model,
  optimizer and steps, a config that can continue the saved run, the data, the sharded state
  (restored, from init_from or new) and the metrics."""
  program = Program(c, mesh)
  meta = c.metadata()
  # Before data work and before any restore: a config that cannot continue the saved run is
  # an error that leaves every checkpoint where it is.
  resume.check_resumable(ckpt, meta, ckpt_lib.to_flat(program.saved), workdir=workdir, log=log)
  resume.check_fresh_start(ckpt, c.fresh_start)
  data = run_data.open_data(c, workdir, resuming=ckpt.latest_step() is not None, log=log)
  state = program.init()
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
  state, start, restored = resume.restore(
    c, ckpt, program, data, iterator, state, workdir=workdir, log=log
  )
  metrics_log, profiler = tracking.recorders(c, workdir, start, log)
  if program.options:
    log(f"XLA options for this GPU: {program.options} (rove_jax/train/gpu_options.py)")
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
    program=program,
    metrics_log=metrics_log,
    profiler=profiler,
  )
