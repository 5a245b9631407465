"""Faults around a training run's checkpoints: corrupt and truncated files, incompatible configs,
a second trainer, a reader beside the writer, a failing machine, no readable checkpoint, and
SIGKILLs at random moments.

Every test checks that no good checkpoint was lost (each one left, or written again, equals the
uninterrupted run's checkpoint of the same step bitwise: parameters, optimizer state and step)
and, where the run continues, that it ends bitwise equal to the uninterrupted run with the same
losses. The uninterrupted run is trained once per session (`reference`): 8 steps of the tiny
model, async checkpoints every 2 steps, all of them kept. Most tests copy its workdir, damage
the copy and train on it in-process; only the SIGKILL test runs train.py in a subprocess.
"""

import asyncio
import fcntl
import gc
import hashlib
import json
import math
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from orbax.checkpoint._src.path import atomicity

from rove_jax.nn.model import abstract_params
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import lock as lock_lib
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import loop as training
from rove_jax.train import overrides as overrides_lib
from rove_jax.train import resolve, resume, run_reader
from rove_jax.train.metrics import read_metrics
from tests.conftest import small_config, subprocess_env, write_corpus

ROOT = pathlib.Path(__file__).resolve().parents[2]
ONE = jax.devices()[:1]
STEPS, EVERY = 8, 2
SAVED = list(range(EVERY, STEPS + 1, EVERY))  # [2, 4, 6, 8]
ZSTD_MAGIC = bytes.fromhex("28b52ffd")  # how every zstd frame begins (RFC 8878)
TMP = atomicity.TMP_DIR_SUFFIX  # ".orbax-checkpoint-tmp": a save in progress
# When one array of a damaged checkpoint cannot be read, orbax abandons the reads of the others:
# their coroutines (reads, metadata lookups) raise as they are collected or were never awaited,
# and their callbacks find the event loop closed.
# The fixture collects them before the test ends, so what they raise meets this filter instead
# of landing in a later, unrelated test.
ABANDONED_READS = [
  pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
  pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning"),
]
pytestmark = ABANDONED_READS


@pytest.fixture(autouse=True)
def collect_abandoned_reads():
  yield
  gc.collect()


# ------------------------------------------------------------------------------ helpers


def read_state(workdir, step) -> dict:
  """{entry: numpy array} of the whole train state saved at `step`, read without writing."""
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), read_only=True)
  try:
    flat = ck.manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))[
      "state"
    ]
  finally:
    ck.close()
  return {k: np.asarray(v) for k, v in flat.items()}


def step_dir(workdir, step) -> pathlib.Path:
  return pathlib.Path(workdir) / ckpt_lib.CHECKPOINTS / str(step)


def steps_in(workdir) -> list[int]:
  ckdir = pathlib.Path(workdir) / ckpt_lib.CHECKPOINTS
  if not ckdir.is_dir():
    return []
  return sorted(int(p.name) for p in ckdir.iterdir() if p.name.isdigit())


def quarantined(workdir) -> list[str]:
  qdir = pathlib.Path(workdir) / (ckpt_lib.CHECKPOINTS + "_unreadable")
  return sorted(p.name for p in qdir.iterdir()) if qdir.exists() else []


def losses(workdir, report=print) -> dict:
  return {r["step"]: r["loss"] for r in read_metrics(str(workdir), report=report) if "loss" in r}


def assert_same_state(got: dict, want: dict, what: str):
  assert got.keys() == want.keys(), what
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")


def assert_ends_as_the_reference(workdir, ref):
  """Every checkpoint of the uninterrupted run is there, bitwise equal to it: the same files
  (a copy left alone) or, when written again, the same restored state; so are the losses."""
  assert steps_in(workdir) == SAVED
  for s in SAVED:
    if tree_digest(step_dir(workdir, s)) != ref.files[s]:
      assert_same_state(read_state(workdir, s), ref.states[s], f"checkpoint {s}")
  assert losses(workdir) == ref.losses  # the same batches in the same order
  assert lock_lib.holder(str(workdir)) is None  # released


def tree_digest(directory) -> dict:
  """{relative path: sha256} of every file under `directory`: to prove nothing changed."""
  root = pathlib.Path(directory)
  return {
    str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(root.rglob("*"))
    if p.is_file()
  }


def rewrite_one_value(workdir, step) -> pathlib.Path:
  """Adds 1e-3 to one entry of the checkpoint's largest array, written through tensorstore into
  its OCDBT database: storage that reads back cleanly, with a value the run never saved, which
  only the checkpoint's own checksums can tell. Returns the database manifest it rewrote."""
  state = (step_dir(workdir, step) / "state").resolve()
  names = json.loads((state / "_METADATA").read_text())["tree_metadata"]
  sizes = {
    v["key_metadata"][0]["key"]: math.prod(v["value_metadata"]["write_shape"])
    for v in names.values()
  }
  kvstore = {"driver": "ocdbt", "base": f"file://{state}/", "path": max(sizes, key=sizes.get)}
  array = ts.open({"driver": "zarr", "kvstore": kvstore}).result()
  first = array[(0,) * array.rank]
  first.write(first.read().result() + np.float32(1e-3)).result()
  return state / "manifest.ocdbt"


def break_a_compressed_chunk(workdir, step) -> pathlib.Path:
  """Zeroes the magic number of the first zstd frame in the largest data file of the
  checkpoint's state: tensorstore refuses to decompress what that frame holds. (Bytes flipped
  at an arbitrary offset are found by tensorstore or by the checksums depending on where the
  file's layout puts them, which varies between saves.)"""
  state = step_dir(workdir, step) / "state"
  target = max((p for p in state.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  data = bytearray(target.read_bytes())
  at = data.find(ZSTD_MAGIC)
  assert at >= 0, f"no zstd frame in {target}"
  data[at : at + len(ZSTD_MAGIC)] = bytes(len(ZSTD_MAGIC))
  target.write_bytes(bytes(data))
  return target


def truncate_meta(workdir, step) -> pathlib.Path:
  """Cuts the `meta` item's JSON file (orbax's JsonCheckpointHandler writes it as
  `<step>/meta/metadata`) to half its length."""
  target = step_dir(workdir, step) / "meta" / "metadata"
  text = target.read_bytes()
  assert text.startswith(b'{"model"'), text[:40]  # the run's metadata, not orbax's own
  target.write_bytes(text[: len(text) // 2])
  return target


def skip_a_batch_in_iterator_state(workdir, step) -> pathlib.Path:
  """Rewrites the `data` item (the grain iterator state, JSON) one batch further on: valid
  JSON that only its checksum tells from the saved state."""
  target = step_dir(workdir, step) / "data" / "metadata"
  state = json.loads(target.read_text())
  state["grain"]["next_index"] += 1
  target.write_text(json.dumps(state))
  return target


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run: its config, workdir, every checkpoint's state, files and losses.

  Trained once per session: under pytest-xdist the first worker to take the file lock trains
  it and the others reuse it (as conftest's `trained_run`). Tests only copy it.
  """
  base = tmp_path_factory.getbasetemp()
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  workdir, corpus = root / "faults-reference", root / "faults-reference-corpus"
  # the corpus is written once: the workers' runs read it
  c = small_config(
    tmp_path_factory.mktemp("faults-config"),
    steps=STEPS,
    checkpoint_every=EVERY,
    keep_checkpoints=len(SAVED) + 2,
    eval_every=STEPS,
    **{"data.path": str(corpus)},
  )  # evaluated at the end
  assert c.async_checkpoints  # the faults below happen around background saves
  with open(root / "faults-reference.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not (workdir / "TRAINED").exists():
      for d in (workdir, corpus):  # a worker that died mid-training
        shutil.rmtree(d, ignore_errors=True)
      write_corpus(corpus)
      summary = training.train(c, str(workdir), devices=ONE, log=lambda *a: None)
      assert summary.start_step == 0 and summary.step == STEPS
      (workdir / "TRAINED").write_text("the run is complete\n")
  assert steps_in(workdir) == SAVED
  states = {s: read_state(workdir, s) for s in SAVED}
  assert any(
    not np.array_equal(states[6][k], states[8][k])  # the steps differ
    for k in states[8]
    if k.startswith(ckpt_lib.PARAMS)
  )
  files = {s: tree_digest(step_dir(workdir, s)) for s in SAVED}
  return types.SimpleNamespace(
    config=c, workdir=workdir, states=states, files=files, losses=losses(workdir)
  )


def config(ref, **overrides):
  """A copy of the reference config with dotted-key overrides."""
  return overrides_lib.apply(ref.config, overrides)


def copy_run(ref, tmp_path, *, keep=tuple(SAVED)) -> pathlib.Path:
  """A copy of the reference workdir holding only the checkpoints `keep` (a run stopped after
  its last save of those)."""
  workdir = tmp_path / "run"
  shutil.copytree(ref.workdir, workdir, ignore=shutil.ignore_patterns("TRAINED"))
  for s in set(SAVED) - set(keep):
    shutil.rmtree(step_dir(workdir, s))
  return workdir


def train(c, workdir, out=None):
  return training.train(
    c, str(workdir), devices=ONE, log=(lambda *a: None) if out is None else out.append
  )


@pytest.mark.parametrize(
  "damage, cause",
  [
    (rewrite_one_value, "CorruptCheckpoint: 1 arrays fail their checksums"),
    (truncate_meta, "JSONDecodeError"),
  ],
  ids=["one-value-rewritten", "truncated-meta-json"],
)
def test_damaged_newest_checkpoint_is_moved_aside_and_the_previous_resumes(
  reference, tmp_path, damage, cause
):
  workdir = copy_run(reference, tmp_path)
  damaged = damage(workdir, STEPS)
  bad_bytes = damaged.read_bytes()
  out = []
  summary = train(config(reference), workdir, out)
  reported = [l for l in out if "cannot be restored" in l]
  assert len(reported) == 1 and f"checkpoint at step {STEPS} " in reported[0], out
  assert cause in reported[0], reported  # what found the damage
  assert any(f"resumed from step {STEPS - EVERY} " in l for l in out), out
  assert summary.start_step == STEPS - EVERY
  # only the damaged checkpoint was moved aside, as it was; the older ones stayed
  moved = quarantined(workdir)
  assert len(moved) == 1 and moved[0].startswith(f"{STEPS}-"), moved
  kept = (
    workdir / "checkpoints_unreadable" / moved[0] / damaged.relative_to(step_dir(workdir, STEPS))
  )
  assert kept.read_bytes() == bad_bytes
  reason = (workdir / "checkpoints_unreadable" / moved[0] / ckpt_lib.REASON_FILE).read_text()
  assert reason.startswith(f"step {STEPS} moved here ") and cause in reason, reason
  assert reason.count("\n") == 1
  for s in SAVED[:-1]:  # not a byte of the older ones changed
    assert tree_digest(step_dir(workdir, s)) == reference.files[s], s
  assert_ends_as_the_reference(workdir, reference)


def test_incompatible_config_moves_nothing_and_the_original_config_continues(reference, tmp_path):
  workdir = copy_run(reference, tmp_path, keep=(2, 4))
  before = tree_digest(workdir / ckpt_lib.CHECKPOINTS)
  for override, field in (
    ({"optim.clip_norm": 0.0}, "optim.clip_norm"),
    ({"data.tokenizer": "bpe"}, "data.tokenizer"),
  ):
    with pytest.raises(resume.IncompatibleRun, match=field) as info:
      train(config(reference, **override), workdir, out=[])
    assert "step 4" in str(info.value) and str(workdir) in str(info.value)
    assert tree_digest(workdir / ckpt_lib.CHECKPOINTS) == before  # nothing restored or moved
    assert not (workdir / "checkpoints_unreadable").exists()
    assert lock_lib.holder(str(workdir)) is None
  out = []
  train(config(reference), workdir, out)
  assert any("resumed from step 4 " in l for l in out), out
  assert_ends_as_the_reference(workdir, reference)


def test_a_live_lock_holder_stops_a_second_trainer_and_a_dead_ones_lock_is_taken_over(
  reference, tmp_path
):
  workdir = copy_run(reference, tmp_path, keep=(2, 4))
  # The holder, a live process on this host, is in the middle of writing checkpoint 6.
  in_flight = workdir / ckpt_lib.CHECKPOINTS / f"6{TMP}"
  in_flight.mkdir()
  (in_flight / "partial").write_bytes(b"\0" * 64)
  holder = subprocess.Popen(["sleep", "120"])
  try:
    lock = workdir / f"{lock_lib.PREFIX}1"
    record = {
      "host": socket.gethostname(),
      "pid": holder.pid,
      "pid_start": lock_lib._start_time(holder.pid),
      "pid_namespace": lock_lib._pid_namespace(),
      "started": "earlier",
      "argv": ["train.py"],
    }
    lock.write_text(json.dumps(record))
    before = tree_digest(workdir)
    with pytest.raises(
      resume.LockError, match=re.escape(f"pid {holder.pid} on host {socket.gethostname()}")
    ):
      train(config(reference), workdir, out=[])
    assert tree_digest(workdir) == before  # its save in progress and its lock untouched
  finally:
    holder.kill()
    holder.wait()
  # the holder died without removing its lock: the next run takes it over
  out = []
  train(config(reference), workdir, out)
  assert any("taking over the writer lock" in l and str(holder.pid) in l for l in out), out
  assert any("resumed from step 4 " in l for l in out), out
  assert not in_flight.exists()  # the dead writer's unfinished save was cleaned up
  assert_ends_as_the_reference(workdir, reference)


def test_reader_during_async_saves_leaves_every_checkpoint_intact(reference, tmp_path, monkeypatch):
  """read_run in a thread opens the checkpoints while each save is in flight (its temporary
  directory exists and is not renamed yet): a reader that cleaned up temporary directories
  would delete the trainer's and fail its save."""
  workdir = tmp_path / "run"
  ckdir = pathlib.Path(ckpt_lib.checkpoint_dir(workdir))
  requests = queue.Queue()
  finalize = atomicity.AtomicRenameTemporaryPath.finalize

  async def finalize_after_a_read(self):
    if pathlib.Path(self.get_final()).parent == ckdir:  # a step, not an item inside one
      read = threading.Event()
      requests.put((int(pathlib.Path(self.get_final()).name), read))
      await asyncio.to_thread(read.wait, 60)
    return await finalize(self)

  monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", finalize_after_a_read)
  abstract = lambda meta: abstract_params(GPTConfig.from_dict(meta["model"]))
  reads, errors = [], []

  def reader():
    while (request := requests.get()) is not None:
      saving, read = request
      tmp = ckdir / f"{saving}{TMP}"
      try:
        there = tmp.is_dir()
        try:
          step, params, _ = run_reader.read_run(str(workdir), abstract, report=errors.append)
        except ValueError as e:  # the first save: nothing finished to read yet
          step, params = None, str(e)
        reads.append((saving, there and tmp.is_dir(), step, params))
      except Exception as e:  # noqa: BLE001 - reported by the test below
        errors.append(repr(e))
      finally:
        read.set()

  thread = threading.Thread(target=reader, daemon=True)
  thread.start()
  try:
    train(config(reference), workdir)
  finally:
    requests.put(None)
    thread.join(timeout=60)
  assert not errors, errors
  assert [r[0] for r in reads] == SAVED  # one read during each save
  assert all(survived for _, survived, _, _ in reads), reads  # the tmp dir was left alone
  for saving, _, step, params in reads:
    if saving == SAVED[0]:
      assert step is None and "no finished checkpoint" in params
      continue
    assert step == saving - EVERY  # the newest finished one
    got = {ckpt_lib.PARAMS + k: np.asarray(v) for k, v in ckpt_lib.to_flat(params).items()}
    assert_same_state(got, {k: reference.states[step][k] for k in got}, f"read of {step}")
  assert_ends_as_the_reference(workdir, reference)


def test_out_of_memory_during_restore_moves_nothing(reference, tmp_path, monkeypatch):
  workdir = copy_run(reference, tmp_path, keep=(2, 4))
  restore = ocp.CheckpointManager.restore
  failed = []

  def restore_once_out_of_memory(self, step, *a, args=None, **kw):
    if args is not None and "state" in args and not failed:
      failed.append(step)
      raise MemoryError("simulated: the restored arrays do not fit")
    return restore(self, step, *a, args=args, **kw)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore_once_out_of_memory)
  before = tree_digest(workdir / ckpt_lib.CHECKPOINTS)
  out = []
  with pytest.raises(ckpt_lib.RestoreEnvironmentError) as info:
    train(config(reference), workdir, out)
  message = str(info.value)
  assert failed == [4] and not any("cannot be restored" in l for l in out), out
  assert "step 4" in message and "not the checkpoint's own" in message
  assert "MemoryError" in message and "nothing was moved" in message
  assert tree_digest(workdir / ckpt_lib.CHECKPOINTS) == before
  assert not (workdir / "checkpoints_unreadable").exists()
  assert lock_lib.holder(str(workdir)) is None


def test_every_checkpoint_unreadable_then_only_fresh_start_restarts(reference, tmp_path):
  workdir = copy_run(reference, tmp_path)
  damages = {
    8: (rewrite_one_value, "1 arrays fail their checksums"),
    6: (skip_a_batch_in_iterator_state, "data iterator state fails its checksum"),
    4: (truncate_meta, "JSONDecodeError"),
    2: (break_a_compressed_chunk, "ZSTD_decompressStream() failed"),
  }
  for s, (damage, _) in damages.items():
    damage(workdir, s)
  out = []
  with pytest.raises(RuntimeError, match=r"none of the checkpoints \[2, 4, 6, 8\].*moved to"):
    train(config(reference), workdir, out)
  reported = re.findall(r"checkpoint at step (\d+) cannot be restored \((.*)\)", "\n".join(out))
  assert [int(s) for s, _ in reported] == list(reversed(SAVED)), out  # each once, newest first
  for s, why in reported:
    assert damages[int(s)][1] in why, (s, why)
  assert steps_in(workdir) == []
  moved = quarantined(workdir)
  assert sorted(int(m.split("-")[0]) for m in moved) == SAVED  # all kept, none deleted
  # a rerun refuses to start over (it would overwrite the run's metrics) ...
  metrics = (workdir / "metrics.jsonl").read_bytes()
  with pytest.raises(ValueError, match=r"fresh_start=True") as info:
    train(config(reference), workdir, out=[])
  assert "step 0" in str(info.value) and "moved to" in str(info.value)
  assert (workdir / "metrics.jsonl").read_bytes() == metrics and steps_in(workdir) == []
  # ... unless told to: from step 0, the moved checkpoints stay where they are
  out = []
  summary = train(config(reference, fresh_start=True), workdir, out)
  assert summary.start_step == 0 and not any("resumed" in l for l in out), out
  assert quarantined(workdir) == moved
  assert_ends_as_the_reference(workdir, reference)


def flat(d, prefix="") -> dict:
  out = {}
  for k, v in d.items():
    out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


def cli_overrides(c) -> list[str]:
  """--config.KEY=VALUE flags that turn configs/tiny.py into the config `c`."""
  want = flat(resolve.resolve(c).to_dict())
  have = flat(resolve.resolve(overrides_lib.load_file(str(ROOT / "configs" / "tiny.py"))).to_dict())
  changed = sorted(k for k in want if want[k] != have.get(k))
  assert all(want[k] is not None for k in changed), changed  # values a flag can give
  return [f"--config.{k}={want[k]}" for k in changed]


def newest(steps) -> int:
  return steps[-1] if steps else 0


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_is_bitwise_equal(reference, tmp_path):
  """train.py is killed twice, each time a seeded random delay after a seeded random step of
  its own (a kill during a checkpoint write is tested in test_loop.py); then the run is
  resumed in-process and must end as the uninterrupted one."""
  workdir = tmp_path / "run"
  metrics = workdir / "metrics.jsonl"
  cmd = [
    sys.executable,
    str(ROOT / "train.py"),
    "--config",
    str(ROOT / "configs" / "tiny.py"),
    "--workdir",
    str(workdir),
    *cli_overrides(reference.config),
  ]
  env = subprocess_env(
    devices=1, JAX_DEFAULT_MATMUL_PRECISION="highest", JAX_NUMPY_RANK_PROMOTION="raise"
  )  # as here: the same programs
  rng = np.random.default_rng(21)
  kills = []
  for _ in range(2):
    start = newest(steps_in(workdir))
    at_step, delay = int(rng.integers(start + 1, STEPS)), float(rng.uniform(0.0, 0.05))
    launched, seen = time.time_ns(), [None]

    def reached():  # this run's own log lines (it first drops those past its checkpoint)
      try:
        stat = metrics.stat()
      except FileNotFoundError:
        return False
      if stat.st_mtime_ns < launched or seen[0] == (stat.st_mtime_ns, stat.st_size):
        return False
      seen[0] = (stat.st_mtime_ns, stat.st_size)  # parsed only when it changed
      return max(losses(workdir, report=lambda *a: None), default=0) >= at_step

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
      deadline = time.time() + 300
      while not reached():
        assert proc.poll() is None, f"train.py exited ({proc.returncode}) before step {at_step}"
        assert time.time() < deadline, f"train.py did not reach step {at_step}"
        time.sleep(0.005)
      time.sleep(delay)
      os.kill(proc.pid, signal.SIGKILL)
      assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
      proc.kill()
    kills.append((start, at_step, round(delay, 3), steps_in(workdir)))
    for s in steps_in(workdir):  # every finished checkpoint is a good one
      assert_same_state(read_state(workdir, s), reference.states[s], f"checkpoint {s}")
  if steps_in(workdir):  # the flags gave train.py the reference's config
    ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(workdir), read_only=True)
    meta = ck.read_meta(newest(steps_in(workdir)))
    ck.close()
    assert meta["config"] == resolve.resolve(reference.config).metadata()["config"]
  out = []
  summary = train(config(reference), workdir, out)
  assert any("taking over the writer lock" in l for l in out), out  # the killed run's
  assert summary.start_step == newest(kills[-1][3])
  assert_ends_as_the_reference(workdir, reference)
  print("kills (resumed from, killed after step, delay s, checkpoints left):", kills)
