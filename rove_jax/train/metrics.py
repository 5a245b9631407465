"""workdir/metrics.jsonl, a training run's metrics record: the only code that writes or reads it.

One JSON object a line, each with a "step": training lines {"step", "loss", "lr", "grad_norm",
"nonfinite_steps", and from the second logged line on "step_time_s", "tokens_per_s",
"model_tflops_per_device" and, on accelerators of known peak, "mfu"} and evaluation lines
{"step", "val_loss"}. A resumed run recomputes the steps after its checkpoint, so `MetricsLog`
first drops the lines past it (the log shows one history, also after a fall back to an older
checkpoint); a line that does not read (cut short by a kill, damaged, edited by hand) is
reported and moved to metrics.jsonl.unreadable, never dropped without a word. TensorBoard event files are written
beside it when tensorboardX is installed; a resumed run asks TensorBoard to hide the events
past its checkpoint, so its plots show one history too.
"""

from __future__ import annotations

import json
import os

FILE = "metrics.jsonl"
UNREADABLE = FILE + ".unreadable"  # where the lines that do not read are moved


def scalars(record: dict) -> dict:
  """The numbers of a record other than its step: what the plotting sinks take."""
  return {k: v for k, v in record.items()
          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


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
  return (f"{path}: {len(bad)} unreadable line(s) (line {shown}; a line cut by a kill or "
          f"edited by hand)")


def read_metrics(workdir: str, *, report=print) -> list[dict]:
  """The records of a run's metrics log ([] if there is none); unreadable lines are reported
  through `report` and skipped."""
  path = os.path.join(workdir, FILE)
  if not os.path.exists(path):
    return []
  with open(path, "rb") as f:
    records, bad = _parse(f)
  if bad:
    report(_describe_bad(path, bad) + ": skipped")
  return records


class MetricsLog:
  """Appends metrics records to workdir/metrics.jsonl (and TensorBoard).

  Args:
    workdir: the run's directory.
    resume_step: the step the run starts from: lines of later steps are dropped.
    enabled: False on processes other than 0 (they write nothing).
    report: where a note about moved unreadable lines goes.
    tensorboard: also write TensorBoard event files (when tensorboardX is installed).
    sinks: more destinations of every record, each with write(record) and close()
      (rove_jax.train.tracking.Wandb).
  """

  def __init__(self, workdir: str, *, resume_step: int, enabled: bool = True, report=print,
               tensorboard: bool = True, sinks=()):
    self.path = os.path.join(workdir, FILE)
    self.enabled = enabled
    self.sinks = list(sinks)
    self.tb = None
    if not enabled:
      return
    if os.path.exists(self.path):
      with open(self.path, "rb") as f:
        lines = f.readlines()
      records, bad = _parse(lines)
      if bad:
        aside = os.path.join(workdir, UNREADABLE)
        with open(aside, "ab") as f:
          f.writelines(lines[i - 1].rstrip(b"\n") + b"\n" for i in bad)
        report(_describe_bad(self.path, bad) + f": moved to {aside}")
      tmp = self.path + ".tmp"
      with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records if r["step"] <= resume_step)
      os.replace(tmp, self.path)
    if not tensorboard:
      return
    try:
      from tensorboardX import SummaryWriter
      # purge_step: TensorBoard hides the earlier events at steps past the checkpoint.
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"),
                              purge_step=resume_step + 1 if resume_step > 0 else None)
    except ImportError:  # optional: the JSONL log is the record
      self.tb = None

  def write(self, record: dict) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self.tb is not None:
      for k, v in scalars(record).items():
        self.tb.add_scalar(k, v, record["step"])
    for sink in self.sinks:
      sink.write(record)

  def close(self):
    if self.tb is not None:
      self.tb.close()
      self.tb = None
    for sink in self.sinks:
      sink.close()
    self.sinks = []
