"""Where a training run's metrics go besides metrics.jsonl, and the profiler window.

`recorders` builds a run's metrics log and profiler from its config; `check_ready` checks,
before any work, that its sinks can start. config.tracking names the sinks, comma-separated:
"tensorboard" (tensorboardX event files in workdir/tensorboard, the default), "wandb" (Weights
& Biases, the `wandb` extra), or "none". metrics.jsonl is always written: it is the record the
other sinks copy.

Weights & Biases: config.wandb.{project, entity, name, group, mode}. mode "offline" writes the
run under workdir/wandb for a later `wandb sync` (pods without internet, tests); "online"
needs `wandb login` or WANDB_API_KEY. The run's id is kept in workdir/wandb-id.txt, so a
resumed run (also after a fall back to an older checkpoint) continues the same W&B run. Each
record is logged with the training step as the metric `train/step`, which the charts use as
their x axis: W&B's own step only ever grows, and a rerun of abandoned steps would otherwise
be dropped.

Profiling: config.profile_steps = "START:END" traces training steps START to END (1-based,
both included, compile excluded when START > 1) with jax.profiler into workdir/profile, which
TensorBoard's profile plugin opens (`tensorboard --logdir workdir/profile`, with the
tensorboard-plugin-profile package). Only process 0 writes a trace.

On a gs:// workdir the W&B id is kept there as well, W&B's own files go to a local directory
(~/.cache/rove_jax/wandb), and the trace is written locally and copied to workdir/profile
when it stops.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import uuid
from typing import Optional

import jax

from rove_jax.storage import paths
from rove_jax.train import metrics

SINKS = ("tensorboard", "wandb")
WANDB_MODES = ("online", "offline", "disabled")
WANDB_ID_FILE = "wandb-id.txt"
PROFILE_DIR = "profile"


def parse_tracking(value) -> tuple[str, ...]:
  """The sinks of config.tracking ("tensorboard,wandb" -> ("tensorboard", "wandb"))."""
  if not isinstance(value, str):
    raise ValueError(
      f"tracking must be a string such as 'tensorboard', 'wandb', "
      f"'tensorboard,wandb' or 'none', got {value!r}"
    )
  names = tuple(n.strip() for n in value.split(",") if n.strip())
  if names == ("none",):
    return ()
  unknown = [n for n in names if n not in SINKS]
  if unknown or not names or len(set(names)) != len(names):
    raise ValueError(
      f"tracking={value!r}: give sinks out of {SINKS} separated by commas, or "
      f"'none' (metrics.jsonl is always written)"
    )
  return names


def check_ready(c) -> None:
  """Before any work: the sinks of run config `c` can start. tracking=wandb needs the wandb
  package (on every process, so that all stop together) and, on process 0 (the one that
  records), what `check_wandb_ready` asks.

  Raises:
    ValueError: what is missing, and how to install or configure it.
  """
  if "wandb" not in parse_tracking(c.tracking):
    return
  if importlib.util.find_spec("wandb") is None:
    raise ValueError(
      "tracking=wandb needs the wandb package: pip install 'rove-jax[wandb]' "
      "(or pip install wandb), or leave wandb out of --config.tracking"
    )
  if jax.process_index() == 0:
    check_wandb_ready(c.wandb)


def check_wandb_ready(settings) -> None:
  """Before any work (nothing is written yet): for mode "online", an API key is configured
  (WANDB_API_KEY or `wandb login`'s netrc entry); `check_ready` checked the package.

  Raises:
    ValueError: online without a key (names `wandb login` and the offline mode).
  """
  if settings.mode != "online":
    return
  import wandb

  if not wandb.login(prompt=False, verify=False):  # reads the key only: no prompt, no request
    raise ValueError(
      "tracking=wandb with wandb.mode=online needs a W&B API key: run `wandb "
      "login` (or set WANDB_API_KEY), or log offline with "
      "--config.wandb.mode=offline and upload later with `wandb sync`"
    )


def parse_profile_steps(value, steps: int) -> Optional[tuple[int, int]]:
  """(START, END) of config.profile_steps "START:END", or None when unset."""
  if value is None:
    return None
  try:
    start, end = (int(part) for part in str(value).split(":"))
  except ValueError:
    start = end = None
  if start is None or not 1 <= start <= end <= steps:
    raise ValueError(
      f"profile_steps={value!r}: give START:END with 1 <= START <= END <= "
      f"steps={steps} (training steps, 1-based, both traced; START > 1 leaves "
      f"the first step's compilation out of the trace)"
    )
  return start, end


def recorders(c, workdir: str, start: int, log) -> tuple[metrics.MetricsLog, "Profiler"]:
  """(the metrics log, the profiler) of run config `c` resuming at `start`: metrics.jsonl and
  the sinks of c.tracking, the window of c.profile_steps; process 0 records, the others not."""
  first = jax.process_index() == 0
  sinks = parse_tracking(c.tracking)
  profiler = Profiler(
    workdir, parse_profile_steps(c.profile_steps, c.steps), enabled=first, log=log
  )
  metrics_log = metrics.MetricsLog(
    workdir,
    resume_step=start,
    enabled=first,
    report=log,
    tensorboard="tensorboard" in sinks,
    sinks=[Wandb(workdir, c)] if "wandb" in sinks and first else [],
  )
  return metrics_log, profiler


class Wandb:
  """A Weights & Biases run that mirrors metrics.jsonl (`write`, `close`)."""

  def __init__(self, workdir: str, c):
    """`c`: the RunConfig; its wandb section names the run, the whole is its W&B config."""
    settings = c.wandb
    try:
      import wandb
    except ImportError:
      raise ImportError(
        "tracking=wandb needs the wandb package: pip install 'rove-jax[wandb]' "
        "(or pip install wandb)"
      ) from None
    id_path = paths.join(workdir, WANDB_ID_FILE)
    try:
      run_id = paths.read_text(id_path).strip()
    except FileNotFoundError:
      run_id = uuid.uuid4().hex[:16]
      paths.write_atomic(id_path, run_id + "\n")
    local = (
      workdir
      if not paths.is_remote(workdir)
      else os.path.join(os.path.expanduser("~/.cache/rove_jax/wandb"), run_id)
    )
    os.makedirs(local, exist_ok=True)
    self.run = wandb.init(
      project=settings.project,
      entity=settings.entity,
      group=settings.group,
      name=settings.name or paths.basename(workdir),
      id=run_id,
      resume="allow",
      mode=settings.mode,
      dir=local,
      config=c.to_dict(),
    )
    self.run.define_metric("train/step")
    self.run.define_metric("*", step_metric="train/step")

  def write(self, record: dict) -> None:
    self.run.log({"train/step": record["step"], **metrics.scalars(record)})

  def close(self) -> None:
    self.run.finish()


class Profiler:
  """Starts a jax.profiler trace before step START and stops it after step END."""

  def __init__(
    self, workdir: str, window: Optional[tuple[int, int]], *, enabled: bool = True, log=print
  ):
    self.window = window if enabled else None
    self.directory = paths.join(workdir, PROFILE_DIR)
    self._local = self.directory if not paths.is_remote(workdir) else None
    self.log = log
    self.active = False

  def before(self, step: int) -> None:
    """Called before training step `step` (1-based) runs."""
    if self.window is not None and step == self.window[0]:
      if self._local is None:  # gs://: traced locally, copied up at stop
        self._local = tempfile.mkdtemp(prefix="rove-jax-profile-")
      jax.profiler.start_trace(self._local)
      self.active = True

  def after(self, step: int, outputs) -> None:
    """Called after step `step` ran; `outputs` are waited for before the trace stops."""
    if self.active and step == self.window[1]:
      self.stop(outputs)
      self.log(
        f"profile of steps {self.window[0]}-{self.window[1]} written to "
        f"{self.directory} (tensorboard --logdir {self.directory})"
      )

  def stop(self, outputs=None) -> None:
    if self.active:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self.active = False
      if self._local != self.directory:
        paths.copy_tree(self._local, self.directory)
        shutil.rmtree(self._local, ignore_errors=True)
