"""Tracking and profiling of a training run: Weights & Biases (offline), the throughput and MFU
in every training record, and a jax.profiler trace of a window of steps."""

import glob
import gzip
import json
import os
import pathlib
import struct

import jax
import pytest

from rove_jax import hardware
from rove_jax.nn import flops
from rove_jax.train import loop as training
from rove_jax.train import step_loop, tracking
from rove_jax.train.metrics import read_metrics
from tests.conftest import small_config


def _wandb_history(path) -> list[dict]:
  """The history rows of an offline .wandb file: a ':W&B' header, then a LevelDB log (32 KiB
  blocks of records: crc32c, length, type (1 full, 2 first, 3 middle, 4 last), payload) whose
  payloads are wandb's Record protobufs."""
  from wandb.proto import wandb_internal_pb2 as pb

  data, rows = open(path, "rb").read(), []
  assert data[:4] == b":W&B", data[:8]
  pos, block, pending = 7, 1 << 15, b""
  while pos + 7 <= len(data):
    left = block - pos % block
    _, n, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
    if left < 7 or (kind == 0 and n == 0):  # block trailer / padding
      pos += left
      continue
    pending += data[pos + 7 : pos + 7 + n]
    pos += 7 + n
    if kind in (1, 4):
      record = pb.Record()
      record.ParseFromString(pending)
      pending = b""
      if record.WhichOneof("record_type") == "history":
        rows.append(
          {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
        )
  return rows


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("tracked")
  c = small_config(
    root,
    steps=4,
    checkpoint_every=2,
    eval_every=4,
    tracking="tensorboard,wandb",
    profile_steps="2:3",
    **{"wandb.mode": "offline"},
  )
  workdir = root / "run"
  out = []
  training.train(c, str(workdir), log=out.append, devices=jax.devices()[:1])
  return c, workdir, out


def test_every_training_record_carries_step_time_throughput_and_model_flops(tracked_run):
  c, workdir, _ = tracked_run
  rows = [r for r in read_metrics(str(workdir)) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  per_token = flops.model_flops_per_token(c.model, "train", 32)[0]
  assert per_token == 6 * flops.matmul_params(c.model) + 12 * 1 * 32 * 32
  for r in rows[1:]:  # the first step's time is its compilation
    tokens = c.data.batch_size * c.data.seq_len
    assert r["step_time_s"] > 0
    assert r["tokens_per_s"] == pytest.approx(tokens / r["step_time_s"], rel=1e-12)
    assert r["model_tflops_per_device"] == pytest.approx(
      r["tokens_per_s"] * per_token / 1e12, rel=1e-12
    )  # one CPU device
    assert "mfu" not in r  # a CPU has no known peak
  assert "step_time_s" not in rows[0]


def test_mfu_is_model_flops_over_the_devices_peak():
  assert hardware.chip_name("TPU v5 lite") == "v5e" and hardware.chip_name("cpu") is None
  assert hardware.peak_flops("NVIDIA H200") == 989e12
  got = step_loop.throughput(0.5, 1000, 4e15, 8, hardware.peak_flops("TPU v4"))
  assert got["tokens_per_s"] == 2000 and got["model_tflops_per_device"] == 1000
  assert got["mfu"] == pytest.approx(1e15 / 275e12)


def test_wandb_offline_run_mirrors_metrics_jsonl(tracked_run):
  _, workdir, _ = tracked_run
  (path,) = glob.glob(str(workdir / "wandb" / "offline-run-*" / "run-*.wandb"))
  run_id = (workdir / tracking.WANDB_ID_FILE).read_text().strip()
  assert path.endswith(f"run-{run_id}.wandb")
  logged = [{k: v for k, v in r.items() if not k.startswith("_")} for r in _wandb_history(path)]
  want = [{"train/step": r.pop("step"), **r} for r in read_metrics(str(workdir))]
  assert logged == want


def test_profile_window_writes_a_trace_tensorboard_opens(tracked_run):
  _, workdir, out = tracked_run
  (run_dir,) = glob.glob(str(workdir / "profile" / "plugins" / "profile" / "*"))
  (xplane,) = glob.glob(run_dir + "/*.xplane.pb")
  assert os.path.getsize(xplane) > 1000
  (trace,) = glob.glob(run_dir + "/*.trace.json.gz")
  events = json.loads(gzip.decompress(open(trace, "rb").read()))["traceEvents"]
  # the train step's dispatches (each recorded by two nested tracers): steps 2 and 3
  calls = {round(e["ts"] / 1e3) for e in events if e.get("name") == "PjitFunction(step)"}
  assert len(calls) == 2, calls
  assert any("profile of steps 2-3 written to" in line for line in out), out


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"tracking": "tensorbord"}, "give sinks out of"),
    ({"tracking": "wandb", "wandb.mode": "cloud"}, "wandb.mode must be one of"),
    ({"profile_steps": "5:2"}, "1 <= START <= END <= steps=8"),
    ({"profile_steps": "3"}, "give START:END"),
  ],
)
def test_bad_tracking_settings_are_refused_before_training(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    small_config(tmp_path, **overrides)


def test_wandb_missing_is_named_with_the_install_command(tmp_path, monkeypatch):
  real = tracking.importlib.util.find_spec
  monkeypatch.setattr(
    tracking.importlib.util,
    "find_spec",
    lambda name, *a: None if name == "wandb" else real(name, *a),
  )
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"pip install 'rove-jax\[wandb\]'"):
    training.train(small_config(tmp_path, tracking="wandb"), str(workdir), log=lambda *a: None)
  assert not workdir.exists()  # before any work


def test_wandb_online_without_a_key_is_one_line_before_any_work(tmp_path):
  """The walkthrough's W&B flags on a machine that never ran `wandb login`: one line naming
  the two ways out, exit 2, and no workdir (before: a 50-line traceback, checkpoints/ and
  wandb-id.txt left behind)."""
  import subprocess
  import sys

  from tests.conftest import subprocess_env

  root = pathlib.Path(__file__).resolve().parents[2]
  env = subprocess_env(devices=1, HOME=str(tmp_path / "home"))
  env.pop("WANDB_API_KEY", None)
  workdir = tmp_path / "run"
  done = subprocess.run(
    [
      sys.executable,
      str(root / "train.py"),
      "--config",
      "tiny",
      "--workdir",
      str(workdir),
      "--config.tracking=tensorboard,wandb",
      "--config.wandb.project=rove-jax",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2, done.stderr[-2000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
  assert "`wandb login`" in lines[0] and "--config.wandb.mode=offline" in lines[0]
  assert not workdir.exists()
