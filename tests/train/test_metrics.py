"""metrics.jsonl and the TensorBoard events of a resumed run: one history, nothing dropped
without a word."""

import errno
import json
import struct
import subprocess
import sys
import threading

import numpy as np
from tensorboardX.proto import event_pb2

from rove_jax.train import metrics


def _events(directory):
  """Every Event in the TFRecord files under `directory` (length, crc, payload, crc)."""
  out = []
  for path in sorted(directory.rglob("events.out.tfevents.*")):
    data, pos = path.read_bytes(), 0
    while pos + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[pos : pos + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[pos + 12 : pos + 12 + n])
      out.append(event)
      pos += 12 + n + 4
  return out


def test_a_resumed_log_keeps_one_history_and_moves_unreadable_lines_aside(tmp_path):
  rows = [{"step": s, "loss": 5.0 - s} for s in range(1, 7)]
  lines = [json.dumps(r).encode() + b"\n" for r in rows]
  lines.insert(3, b'{"step": 3, "lo\xa5\xf0ss\n')  # damaged: not even UTF-8
  (tmp_path / metrics.FILE).write_bytes(b"".join(lines))
  said = []
  log = metrics.MetricsLog(str(tmp_path), resume_step=4, report=said.append)
  log.write({"step": 5, "loss": 0.5})
  log.close()
  # the steps past the checkpoint are dropped, the rerun's row written once
  assert metrics.read_metrics(str(tmp_path)) == rows[:4] + [{"step": 5, "loss": 0.5}]
  assert (tmp_path / metrics.UNREADABLE).read_bytes() == b'{"step": 3, "lo\xa5\xf0ss\n'
  assert len(said) == 1 and "1 unreadable line(s) (line 4" in said[0], said
  assert f"moved to {tmp_path / metrics.UNREADABLE}" in said[0]


def test_a_resumed_run_asks_tensorboard_to_hide_the_abandoned_steps(tmp_path):
  first = metrics.MetricsLog(str(tmp_path), resume_step=0)
  for s in range(1, 7):
    first.write({"step": s, "loss": 1.0 * s})
  first.close()
  assert not [e for e in _events(tmp_path / "tensorboard") if e.HasField("session_log")]
  resumed = metrics.MetricsLog(str(tmp_path), resume_step=4)
  resumed.write({"step": 5, "loss": 9.0})
  resumed.close()
  # TensorBoard drops earlier events at steps >= a START session log's step
  starts = [
    e.step
    for e in _events(tmp_path / "tensorboard")
    if e.HasField("session_log") and e.session_log.status == e.session_log.START
  ]
  assert starts == [5], starts


def test_event_values_and_steps_are_what_was_logged_and_no_thread_is_started(tmp_path):
  before = threading.active_count()
  log = metrics.MetricsLog(str(tmp_path), resume_step=0)
  assert threading.active_count() == before  # the events are written by the logging thread
  log.write({"step": 3, "loss": 2.5, "lr": 1e-3, "note": "text", "skipped": True})
  log.write({"step": 4, "val_loss": 2.25})
  log.close()
  got = [
    (e.step, v.tag, v.simple_value)
    for e in _events(tmp_path / "tensorboard")
    for v in e.summary.value
  ]
  assert got == [(3, "loss", 2.5), (3, "lr", np.float32(1e-3)), (4, "val_loss", 2.25)], got


_FAILING_WRITE = """
import resource, signal, sys
from rove_jax.train.tb_events import EventFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
f = EventFile(sys.argv[1])
try:
  for step in range(10000):
    f.scalars(step, {"loss": 1.0})
  f.flush()
except OSError as e:
  print("raised", e.errno)
"""


def test_a_failed_event_write_raises_on_the_writing_thread(tmp_path):
  """The file system refuses a write (here: a file size limit): the error reaches the caller, and
  no traceback from another thread is printed."""
  done = subprocess.run(
    [sys.executable, "-c", _FAILING_WRITE, str(tmp_path / "tb")],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
  assert done.stdout.split() == ["raised", str(errno.EFBIG)], done.stdout
