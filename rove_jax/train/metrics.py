"""workdir/metrics.jsonl, a training run's metrics record: the only code that writes or reads it.

One JSON object a line, each with a "step": training lines {"step", "loss", "lr", "grad_norm",
"nonfinite_steps", and from the second logged line on "step_time_s", "tokens_per_s",
"model_tflops_per_device" and, on accelerators of known peak, "mfu"} and evaluation lines
{"step", "val_loss"}. A resumed run recomputes the steps after its checkpoint, so `MetricsLog`
first drops the lines past it (the log shows one history, also after a fall back to an older
checkpoint); a line that does not read (cut short by a kill, damaged, edited by hand) is
reported and moved to metrics.jsonl.unreadable, never dropped without a word. TensorBoard event
files (rove_jax.train.tb_events) are written beside it when tensorboardX is installed; a
resumed run asks TensorBoard to hide the events past its checkpoint, so its plots show one
history too.

On gs:// (no appends on GCS) the log is kept in memory and the object rewritten whole by
`flush()`: at every checkpoint save (so the steps a resume keeps are stored with it), at most
every FLUSH_S seconds, and at close. TensorBoard writes into a local staging directory whose
event files are copied to workdir/tensorboard at each flush.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from rove_jax.storage import paths

FILE = "metrics.jsonl"
FLUSH_S = 30.0  # on gs://: the longest a logged line waits before it is stored
UNREADABLE = FILE + ".unreadable"  # where the lines that do not read are moved


def scalars(record: dict) -> dict:
  """The numbers of a record other than its step: what the plotting sinks take."""
  return {
    k: v
    for k, v in record.items()
    if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
  }


def _parse(lines) -> tuple[list[dict], list[int]]:
  """(records, 1-based numbers of the lines that are not JSON objects with a step); `lines`
  are bytes (a damaged file need not be UTF-8)."""
  records, bad = [], []
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
      record = None
    if isinstance(record, dict) and isinstance(record.get("step"), int):
      records.append(record)
    else:
      bad.append(i)
  return records, bad


def _describe_bad(path: str, bad: list[int]) -> str:
  shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
  return (
    f"{path}: {len(bad)} unreadable line(s) (line {shown}; a line cut by a kill or edited by hand)"
  )


def read_metrics(workdir: str, *, report=print) -> list[dict]:
  """The records of a run's metrics log ([] if there is none); unreadable lines are reported
  through `report` and skipped."""
  path = paths.join(paths.resolve(workdir), FILE)
  try:
    data = paths.read_bytes(path)
  except FileNotFoundError:
    return []
  records, bad = _parse(data.splitlines(keepends=True))
  if bad:
    report(_describe_bad(path, bad) + ": skipped")
  return records


class MetricsLog:
  """Appends metrics records to workdir/metrics.jsonl (and TensorBoard).

  Args:
    workdir: the run's directory (local or gs://).
    resume_step: the step the run starts from: lines of later steps are dropped.
    enabled: False on processes other than 0 (they write nothing).
    report: where a note about moved unreadable lines goes.
    tensorboard: also write TensorBoard event files (when tensorboardX is installed).
    sinks: more destinations of every record, each with write(record) and close()
      (rove_jax.train.tracking.Wandb).
  """

  def __init__(
    self,
    workdir: str,
    *,
    resume_step: int,
    enabled: bool = True,
    report=print,
    tensorboard: bool = True,
    sinks=(),
  ):
    self.workdir = workdir
    self.path = paths.join(workdir, FILE)
    self.remote = paths.is_remote(workdir)
    self.enabled = enabled
    self.sinks = list(sinks)
    self.tb = self._staging = None
    self._lines: list[str] = []
    self._flushed = time.monotonic()
    if not enabled:
      return
    try:
      lines = paths.read_bytes(self.path).splitlines(keepends=True)
    except FileNotFoundError:
      lines = None
    if lines is not None:
      records, bad = _parse(lines)
      if bad:
        aside = paths.join(workdir, UNREADABLE)
        old = paths.read_bytes(aside) if paths.exists(aside) else b""
        paths.write_atomic(aside, old + b"".join(lines[i - 1].rstrip(b"\n") + b"\n" for i in bad))
        report(_describe_bad(self.path, bad) + f": moved to {aside}")
      self._lines = [json.dumps(r) + "\n" for r in records if r["step"] <= resume_step]
      paths.write_atomic(self.path, "".join(self._lines))
    if not tensorboard:
      return
    try:
      from rove_jax.train.tb_events import EventFile
    except ImportError:  # tensorboardX is optional: the JSONL log is the record
      return
    logdir = paths.join(workdir, "tensorboard")
    if self.remote:
      self._staging = tempfile.mkdtemp(prefix="rove-jax-tensorboard-")
      for rel in paths.walk_files(logdir):  # the earlier events, so purge_step can hide some
        paths.write_atomic(
          os.path.join(self._staging, rel), paths.read_bytes(paths.join(logdir, rel))
        )
    # purge_step: TensorBoard hides the earlier events at steps past the checkpoint.
    self.tb = EventFile(
      self._staging or logdir, purge_step=resume_step + 1 if resume_step > 0 else None
    )

  def write(self, record: dict) -> None:
    if not self.enabled:
      return
    line = json.dumps(record) + "\n"
    if self.remote:
      self._lines.append(line)
      if time.monotonic() - self._flushed > FLUSH_S:
        self.flush()
    else:
      with open(self.path, "a") as f:
        f.write(line)
    values = scalars(record)
    if self.tb is not None and values:
      self.tb.scalars(record["step"], values)
    for sink in self.sinks:
      sink.write(record)

  def flush(self) -> None:
    """Stores what was logged so far (on gs://; local lines are appended as they come)."""
    self._flushed = time.monotonic()
    if not (self.enabled and self.remote):
      return
    paths.write_atomic(self.path, "".join(self._lines))
    if self._staging is not None:
      if self.tb is not None:
        self.tb.flush()
      for rel in paths.walk_files(self._staging):
        paths.write_atomic(
          paths.join(self.workdir, "tensorboard", rel),
          paths.read_bytes(os.path.join(self._staging, rel)),
        )

  def close(self):
    if self.tb is not None:
      self.tb.close()
      self.tb = None
    self.flush()  # on gs://, also copies the closed event files
    if self._staging is not None:
      shutil.rmtree(self._staging, ignore_errors=True)
      self._staging = None
    for sink in self.sinks:
      sink.close()
    self.sinks = []
