"""The step loop of a training run and its callbacks.

`run` steps a `Run` (what run_state.build built: the sharded state, the data iterator, the jitted
steps, the open checkpoints and metrics) from its start step. The profiler wraps each step;
after it the callbacks run in this order, each deciding for itself whether the step is its
turn (`run` gives each its settings of the config once, when it builds them):

  NonFinite   counts the steps skipped as non-finite; too many in a row stop the run
  LogMetrics  every log_every steps and at the last: loss, lr, speed to metrics.jsonl; the
              progress bar
  Evaluate    every eval_every steps and at the last: the validation loss
  Checkpoint  every checkpoint_every steps before the last: the state, if it is good
  Stop        a stop signal, a failed background save or the lock taken over, on any process

A run that ends (or stops) saves its final state if it is good, then is judged: a run whose
every step was skipped learned nothing and is an error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
from jax.sharding import Mesh

from rove_jax import data as data_lib
from rove_jax import hardware
from rove_jax.nn import flops
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import clipping, resume, run_control
from rove_jax.train import health as health_lib
from rove_jax.train import sharding as sharding_lib
from rove_jax.train.health import NonFiniteError
from rove_jax.train.metrics import MetricsLog
from rove_jax.train.program import Program
from rove_jax.train.result import TrainResult
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig
from rove_jax.train.tracking import Profiler


@dataclasses.dataclass
class Run:
  """A run ready to step; `state` is replaced by each step."""

  c: RunConfig
  workdir: str
  mesh: Mesh
  ckpt: ckpt_lib.Checkpointer
  lock: Optional[resume.WriterLock]  # process 0's; None on the other processes
  log: Callable[..., None]
  data: data_lib.Data
  iterator: Any  # the training batches, its position saved with each checkpoint
  state: Any  # program.TrainState, sharded over the mesh
  start: int  # the step it starts from (a restored checkpoint's, else 0)
  restored: bool
  meta: dict  # stored with every checkpoint
  program: Program  # the model, the jitted steps, the state's layouts (stacked, saved)
  metrics_log: MetricsLog
  profiler: Profiler
  summary: dict = dataclasses.field(default_factory=dict)  # TrainResult's optional fields


def throughput(
  step_time_s: float, tokens_per_step: int, step_flops: float, n_devices: int, peak: Optional[float]
) -> dict:
  """The logged speed of a step: its time, tokens/s, model TFLOP/s per device and, where the
  devices' peak is known (rove_jax.hardware), MFU = achieved model FLOP/s / peak."""
  per_device = step_flops / step_time_s / n_devices
  out = {
    "step_time_s": step_time_s,
    "tokens_per_s": tokens_per_step / step_time_s,
    "model_tflops_per_device": per_device / 1e12,
  }
  if peak:
    out["mfu"] = per_device / peak
  return out


def mean_loss(eval_step, params, batches) -> Optional[float]:
  """The mean of eval_step's losses over `batches` (None: no batch)."""
  losses = [float(eval_step(params, b)) for b in batches]
  return float(np.mean(losses)) if losses else None


# ---------------------------------------------------------------------------- the loop


def run(r: Run) -> TrainResult:
  """Steps `r` to c.steps (or c.run_steps more, or a stop) and saves its final state if good.
  Each callback is given its settings of r.c once, here.

  Raises:
    NonFiniteError: too many non-finite steps in a row, every step skipped, or a final state
      that is not good.
    SaveError, LockError: a checkpoint save failed or the writer lock was taken over.
  """
  c = r.c
  save = Checkpoint(r, c.optim, every=c.checkpoint_every, steps=c.steps)
  nonfinite = NonFinite(r, save, limit=c.optim.max_nonfinite)
  evaluate = Evaluate(r, c.data, batches=c.eval_batches, every=c.eval_every, steps=c.steps)
  signals = run_control.StopSignal()
  stop = Stop(r, signals)
  logger = LogMetrics(r, nonfinite, c)
  hooks = (nonfinite, logger, evaluate, save)
  step = r.start
  end = c.steps if c.run_steps is None else min(c.steps, r.start + c.run_steps)
  with signals, logger, _closed_on_error(r):
    while step < end:
      batch = sharding_lib.place_batch(next(r.iterator), mesh=r.mesh)
      r.profiler.before(step + 1)
      r.state, m = r.program.train_step(r.state, batch)
      step += 1
      r.profiler.after(step, m)
      for hook in hooks:
        hook(step, m)
      if stop(step):
        break
    r.profiler.stop(r.state)  # a run that ended inside the window
    final_problem = save.final(step)
  r.metrics_log.close()
  nonfinite.judge(step)
  if final_problem is not None:
    raise save.divergence(
      f"the state at step {step}, where the run ended, is not good ({final_problem})"
    )
  return _result(r, step, logger.last, nonfinite.total)


@contextlib.contextmanager
def _closed_on_error(r: Run):
  """Stops the profiler and closes the metrics log when the loop fails, so that what they hold
  is kept: the trace of a window the error cut short (and the next run in this process can
  trace again); on gs://, metrics.jsonl's lines since its last store (the losses before a
  divergence); TensorBoard's open event file; the W&B run. A failure to stop is logged, not
  raised: the loop's error is the one to report."""
  try:
    yield
  except BaseException:
    for what, stop in (("the profiler", r.profiler.stop), ("the metrics log", r.metrics_log.close)):
      try:
        stop()
      except Exception as e:  # noqa: BLE001 - the first error is the one to report
        r.log(f"while stopping: {what} did not stop: {ckpt_lib.describe(e)}")
    raise


def _result(r: Run, step: int, last: dict, nonfinite_steps: int) -> TrainResult:
  if r.data.loss_mask_T is None:  # a masked val loss scores some targets only: no comparison
    counts = np.bincount(np.asarray(r.data.val_tokens, np.int64), minlength=1).astype(np.float64)
    probs = counts[counts > 0] / counts.sum()
    r.summary["val_unigram_entropy"] = float(-(probs * np.log(probs)).sum())
  return TrainResult(
    **r.summary,
    workdir=r.workdir,
    start_step=r.start,
    step=step,
    last=last,
    nonfinite_steps=nonfinite_steps,
    steps_run=step - r.start,
    tokenizer=r.data.tokenizer,
    model_config=r.c.model,
    params=r.program.layers.unstack(r.state.params),
    graphdef=r.program.graphdef,
    mesh=r.mesh,
  )


# ----------------------------------------------------------------------- the callbacks


class NonFinite:
  """Counts the steps whose update was skipped as non-finite; stops a run that diverged (more
  than `limit`, optim.max_nonfinite, in a row)."""

  def __init__(self, r: Run, save: Checkpoint, *, limit: int):
    self.r, self.save, self.limit = r, save, limit
    self.in_a_row = self.total = 0
    self.learning = self.learning_skipped = 0  # steps run with a nonzero learning rate; skipped

  def __call__(self, step: int, m: dict) -> None:
    finite = bool(m["finite"])
    if float(m["lr"]) > 0:  # warmup's first step (lr 0) changes nothing, skipped or not
      self.learning += 1
      self.learning_skipped += not finite
    if finite:
      self.in_a_row = 0
      return
    self.in_a_row += 1
    self.total += 1
    self.r.log(
      f"step {step}: non-finite loss or gradient, update skipped ({self.in_a_row} in a row)"
    )
    if self.in_a_row >= self.limit:
      raise self.save.divergence(
        f"{self.in_a_row} consecutive non-finite steps (last at step {step}); stopping"
      )

  def judge(self, step: int) -> None:
    """At the end: a run whose every step (or every learning one) was skipped is an error."""
    ran = step - self.r.start
    if ran > 0 and (self.total == ran or self.learning_skipped == self.learning > 0):
      raise NonFiniteError(
        f"{self.total} of the {ran} steps run were skipped as non-finite, every one with a "
        f"nonzero learning rate: nothing was learned; lower optim.lr or check the data",
        last_good=self.save.health.good_step,
      )


class LogMetrics:
  """Every log_every steps and at the last: the step's metrics and speed, to metrics.jsonl
  and the progress bar's postfix. As a context it shows the bar (c.progress, on process 0),
  which counts every step."""

  def __init__(self, r: Run, nonfinite: NonFinite, c: RunConfig):
    self.r, self.nonfinite = r, nonfinite
    self.every, self.steps = c.log_every, c.steps
    self.tokens_per_step = c.data.batch_size * c.data.seq_len
    # Model FLOPs of a step (PaLM's count) against the devices' peak, for the logged MFU.
    self.step_flops = (
      self.tokens_per_step * flops.model_flops_per_token(c.model, "train", c.data.seq_len)[0]
    )
    self.peak = hardware.peak_flops(r.mesh.devices.flat[0].device_kind)
    self.t_last, self.step_last = time.perf_counter(), r.start
    self.last = {}
    self.show_bar = c.progress and jax.process_index() == 0
    self.bar = None

  def __enter__(self) -> LogMetrics:
    self._bar = run_control.progress(self.steps, self.r.start, self.show_bar)
    self.bar = self._bar.__enter__()
    return self

  def __exit__(self, *exc) -> None:
    self._bar.__exit__(*exc)
    self.bar = None

  def __call__(self, step: int, m: dict) -> None:
    if step == self.r.start + 1:  # throughput from here on, compile time excluded
      self.t_last, self.step_last = time.perf_counter(), step
    if step % self.every == 0 or step == self.steps:
      self._write(step, m)
    if self.bar is not None:
      self.bar.update(1)

  def _write(self, step: int, m: dict) -> None:
    now = time.perf_counter()
    last = {
      "step": step,
      "loss": float(m["loss"]),
      "lr": float(m["lr"]),
      "grad_norm": float(m["grad_norm"]),
      "nonfinite_steps": self.nonfinite.total,
    }
    if step > self.step_last:  # the first step's time is compilation: no throughput for it
      last.update(
        throughput(
          (now - self.t_last) / (step - self.step_last),
          self.tokens_per_step,
          self.step_flops,
          self.r.mesh.devices.size,
          self.peak,
        )
      )
    self.t_last, self.step_last, self.last = now, step, last
    self.r.metrics_log.write(last)
    if self.bar is not None:
      self.bar.set_postfix(
        loss=f"{last['loss']:.3f}",
        tok_s=f"{last['tokens_per_s']:.0f}" if "tokens_per_s" in last else "-",
      )


class Evaluate:
  """Every eval_every steps and at the last: the validation loss over `batches` batches of
  the data section `d`'s windows, logged and kept."""

  def __init__(self, r: Run, d: DataConfig, *, batches: int, every: int, steps: int):
    self.r, self.every, self.steps = r, every, steps
    self.batches = dict(
      seq_len=d.seq_len,
      batch_size=d.batch_size,
      max_batches=batches,
      packing=d.packing,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
    )

  def __call__(self, step: int, m: dict) -> None:
    r = self.r
    if step % self.every and step != self.steps:
      return
    batches = (
      sharding_lib.place_batch(b, mesh=r.mesh) for b in r.data.eval_batches(**self.batches)
    )
    val = mean_loss(r.program.eval_step, r.state.params, batches)
    if val is not None:
      r.metrics_log.write({"step": step, "val_loss": val})
      r.summary["val_loss"] = val
      r.log(f"step {step}: val_loss {val:.4f}")


class Checkpoint:
  """Every checkpoint_every steps before the last: a checkpoint of the state, if it is good
  (health.py judges it from the steps' losses and the parameters' norm, with the optim
  section's limits)."""

  def __init__(self, r: Run, o: OptimConfig, *, every: int, steps: int):
    self.r, self.every, self.steps, self.lr = r, every, steps, o.lr
    self.param_norm = jax.jit(clipping.global_norm)
    self.health = health_lib.Health(
      max_loss_jump=o.max_loss_jump,
      max_param_growth=o.max_param_growth,
      good_step=r.start if r.restored else None,
      good_norm=float(self.param_norm(r.state.params)),
    )

  def __call__(self, step: int, m: dict) -> None:
    self.health.observe(step, float(m["loss"]), bool(m["finite"]))  # every step, saved or not
    if step % self.every == 0 and step < self.steps:
      self.save(step)

  def final(self, step: int) -> Optional[str]:
    """Where the run ends: a checkpoint of the state unless one is there already, if it is
    good; else returns why it is not."""
    if self.r.ckpt.latest_step() != step and self.health.good_step != step:
      return self.save(step)
    return None

  def save(self, step: int) -> Optional[str]:
    """Checkpoints the state if it is good; else returns why it is not."""
    r = self.r
    norm = float(self.param_norm(r.state.params))
    r.metrics_log.write({"step": step, "param_norm": norm})
    problem = self.health.verdict(norm)
    if problem is not None:
      r.log(f"step {step}: not saved: {problem}; {self.health.last_good()}")
      return problem
    r.ckpt.save(
      step,
      ckpt_lib.to_flat(r.program.to_layers(r.state)),
      r.iterator.get_state(),
      {**r.meta, "step": step},
    )
    r.metrics_log.flush()  # the metrics of every step a resume keeps are stored with it
    self.health.accept(step, norm)
    return None

  def divergence(self, what: str) -> NonFiniteError:
    """The error that ends a diverged run, once the saves in flight are done (a failed one is
    reported instead)."""
    self.r.ckpt.wait()
    return NonFiniteError(
      f"{what}; {self.health.last_good()} (no later state was saved): rerun "
      f"with a lower optim.lr (this run's: {self.lr:g}) or check "
      f"the data",
      last_good=self.health.good_step,
    )


class Stop:
  """After each step: whether the run stops. Every process leaves the loop at the same step."""

  def __init__(self, r: Run, signal: run_control.StopSignal):
    self.r, self.signal = r, signal

  def __call__(self, step: int) -> bool:
    """True to stop after `step` (a stop signal here or on another process).

    Raises:
      SaveError, LockError: a background save failed or the lock was taken over (here, or on
        another process: a SaveError naming it).
    """
    stopping = self.signal.received is not None
    failure = run_control.failure(self.r.ckpt, self.r.lock)
    said = run_control.gather_flags(stopping, failure is not None)
    if failure is None and said[:, 1].any():
      failure = ckpt_lib.SaveError(
        f"processes {np.flatnonzero(said[:, 1]).tolist()} stopped at step {step}: see their log"
      )
    if failure is not None:
      raise failure
    if not said[:, 0].any():
      return False
    self.r.log(
      f"{self.signal.received or 'a stop signal on another process'} received: saving "
      f"a checkpoint at step {step} and exiting"
    )
    self.r.summary["stopped_by"] = self.signal.received or "peer"
    return True
