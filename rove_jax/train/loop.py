"""Training: `train`, the resumable run.

`train` is a short sequence, each part built by the module that owns it: resolve the config, check
what is ready before the workdir is touched, the mesh (sharding.run_mesh), lock the workdir
(run_control.lock), open the checkpoints, build the run state (run_state.build: the model, optimizer
and steps from program.Program, the data from run_data.open_data), run it (step_loop.py: the step
and its callbacks), close. A run resumes from the newest readable checkpoint in workdir (params,
optimizer state, step and the data iterator's position), logs to workdir/metrics.jsonl and
TensorBoard, and on SIGTERM / SIGINT finishes the current step, saves and returns. A step whose loss
or gradient is not finite leaves the state unchanged and is counted; too many in a row stop the run
with an error.
"""

from __future__ import annotations

import jax

from rove_jax.train import (
  agreement,
  resolve,
  resume,
  run_control,
  run_state,
  step_loop,
  tracking,
)
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import sharding as sharding_lib
from rove_jax.train.health import NonFiniteError  # noqa: F401 - what train() raises
from rove_jax.train.result import TrainResult

# ------------------------------------------------------------------------------- the run


def train(c, workdir: str, *, log=print, devices=None, resolved: bool = False) -> TrainResult:
  """Trains (or resumes) the run described by config `c` in `workdir`; returns its result.

  Args:
    c: the RunConfig (a config file's get_config(), rove_jax.train.overrides applies
      command-line overrides); what its inputs decide is filled in here
      (rove_jax.train.resolve: checked before any work).
    workdir: local path or gs://bucket/path.
    log: where process 0's progress lines go (the other processes log nothing).
    devices: the mesh's devices (default: all devices of all processes).
    resolved: `c` is as rove_jax.train.resolve returned it, which also set its storage
      deadline (rove-train resolves before jax.distributed starts): its inputs are not read
      again.

  Runs SPMD over the (data, fsdp, tensor) mesh of `c.mesh`.
  """
  if resolved:
    c = resolve.resolved(c, "train")
  else:
    c = resolve.resolve(c, log=log)  # also sets c's storage deadline, for its reads and the run
  tracking.check_ready(c)  # before the workdir is created: nothing left behind
  if jax.process_index() != 0:  # process 0 logs, the others nothing
    log = lambda *a, **k: None
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
      run = run_state.build(c, workdir, mesh, ckpt, lock, log)
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
