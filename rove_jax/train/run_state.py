"""What the step loop works on, assembled from a run's config (`build`: a step_loop.Run).

`build` makes each part with the module that owns it, each checked before the next is built:
the model, optimizer and steps (program.Program), a config that can continue the saved run
(resume), the data (run_data.open_data), the sharded state (restored, from init_from or new)
and the metrics (tracking.recorders).
"""

from __future__ import annotations

import jax

from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import resume, run_data, step_loop, tracking
from rove_jax.train.program import Program
from rove_jax.train.run_config import RunConfig


def build(c: RunConfig, workdir, mesh, ckpt, lock, log) -> step_loop.Run:
  """The run of config `c` in `workdir` on `mesh`, its checkpoints `ckpt` open and its writer
  `lock` held (process 0's; None on the others)."""
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
