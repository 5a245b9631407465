"""TensorBoard event files, written on the caller's thread: the only code that writes them.

tensorboardX's SummaryWriter hands each event to a background thread. When the disk fills, that
thread dies with a traceback on stderr and the run goes on; its queue then fills and the next
`add_scalar` blocks for good. Here the same records (tensorboardX's protos and record framing)
are written by the thread that logs, so a failed write raises OSError where the trainer turns
it into one `error:` line.
"""

from __future__ import annotations

import os
import time

from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary

FLUSH_S = 10.0  # the longest an event waits in the file's buffer before it reaches the disk


class EventFile:
  """One new events.out.tfevents.* file in `logdir`.

  Args:
    logdir: a local directory (created if absent).
    purge_step: when given, TensorBoard hides the directory's earlier events at this step and
      past it (a resumed run's abandoned steps).
  """

  def __init__(self, logdir: str, *, purge_step: int | None = None):
    os.makedirs(logdir, exist_ok=True)
    self._writer = EventsWriter(os.path.join(logdir, "events"))
    self._flushed = time.monotonic()
    if purge_step is not None:
      self._write(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

  def scalars(self, step: int, values: dict) -> None:
    """One event holding a scalar summary for each name in `values`."""
    summary = Summary(
      value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
    )
    self._write(Event(step=int(step), summary=summary))
    if time.monotonic() - self._flushed > FLUSH_S:
      self.flush()

  def _write(self, event: Event) -> None:
    event.wall_time = time.time()
    self._writer.write_event(event)

  def flush(self) -> None:
    self._writer.flush()
    self._flushed = time.monotonic()

  def close(self) -> None:
    self._writer.close()
