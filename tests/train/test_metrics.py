"""metrics.jsonl and the TensorBoard events of a resumed run: one history, nothing dropped
without a word."""

import json
import struct

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
