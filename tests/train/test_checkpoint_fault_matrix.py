"""Every file of a real checkpoint, damaged every way: the restore either reads the state the run
saved, bitwise, or moves the damaged checkpoint aside and restores the previous one, bitwise, or
refuses with an error the command prints as a message; it never hands the loop a damaged state,
and no other checkpoint changes.

A tokenizer kept as a file in the workdir (bpe) that changed since the save, or cannot be read,
is refused by training and evaluation alike (its fingerprint is in the checkpoint metadata).

The run is test_loop_faults.py's reference (the tiny model, 8 steps, async checkpoints every 2). For
each file of its newest checkpoint (step 8) and each damage (16 bytes flipped at the start, the
middle and the end; cut to half; deleted) a copy of the run is damaged, read as rove-eval reads
it (`run_reader.read_run`, read-only), and opened the way `rove_jax.train.loop` opens it: the
resume check against the run's own config, then `Checkpointer.restore_latest`. The loop
continues from exactly what is restored (parameters, optimizer state, step, iterator state), so
a restore equal to the uninterrupted run's checkpoint continues it bitwise; test_loop_faults.py
trains on after the damages end to end and compares the losses.
"""

import collections
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest

from rove_jax.evaluation import scoring
from rove_jax.storage import lock as lock_lib
from rove_jax.train import checkpoint as ckpt_lib
from rove_jax.train import resolve, resume, run_reader
from tests.conftest import small_config
from tests.train.test_loop_faults import (
  ABANDONED_READS,
  ONE,
  SAVED,
  STEPS,
  assert_ends_as_the_reference,
  collect_abandoned_reads,
  config,
  copy_run,
  losses,
  quarantined,
  read_state,
  reference,
  step_dir,
  train,
  tree_digest,
)

__all__ = ["reference", "collect_abandoned_reads"]  # fixtures shared with test_loop_faults.py
pytestmark = ABANDONED_READS

PREVIOUS = SAVED[-2]
# What the training command prints as a message rather than a traceback (rove_jax.cli.train).
CLEAR_ERRORS = (ValueError, RuntimeError, OSError)


def _flip(path: pathlib.Path, where: str) -> None:
  data = bytearray(path.read_bytes())
  n = min(16, len(data))
  start = {"start": 0, "middle": (len(data) - n) // 2, "end": len(data) - n}[where]
  data[start : start + n] = bytes(b ^ 0xA5 for b in data[start : start + n])
  path.write_bytes(bytes(data))


DAMAGES = {
  "flip-start": lambda p: _flip(p, "start"),
  "flip-middle": lambda p: _flip(p, "middle"),
  "flip-end": lambda p: _flip(p, "end"),
  "truncate": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
  "delete": lambda p: p.unlink(),
}


def _files(workdir) -> list:
  root = step_dir(workdir, STEPS)
  return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _data_state(workdir, step) -> dict:
  return json.loads((step_dir(workdir, step) / "data" / "metadata").read_text())


def _open_as_the_loop_does(ref, workdir):
  """(step, state, data_state) restored the way the training loop resumes, or the error."""
  c = config(ref)
  meta = resolve.resolve(c).metadata()
  device = jax.sharding.SingleDeviceSharding(ONE[0])
  target = {
    name: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device)
    for name, a in ref.states[STEPS].items()
  }
  ck = ckpt_lib.Checkpointer(ckpt_lib.checkpoint_dir(str(workdir)), keep=len(SAVED) + 2)
  try:
    resume.check_resumable(ck, meta, target, workdir=str(workdir), log=lambda *a: None)
    step, state, data_state, _ = ck.restore_latest(target, report=lambda *a: None)
    return step, {k: np.asarray(v) for k, v in state.items()}, data_state
  finally:
    ck.close()


def _evaluation_reads(ref, workdir, relative: str, damage: str) -> str:
  """What rove-eval's restore (read-only) makes of the damaged run: the newest checkpoint's
  parameters bitwise, the previous one's bitwise (saying so), or a clear error; it moves and
  deletes nothing."""
  before = tree_digest(workdir / "checkpoints")
  out = []
  abstract = lambda meta: {
    name[len(ckpt_lib.PARAMS) :]: jax.ShapeDtypeStruct(a.shape, a.dtype)
    for name, a in ref.states[STEPS].items()
    if name.startswith(ckpt_lib.PARAMS)
  }
  try:
    step, params, meta = run_reader.read_run(str(workdir), abstract, report=out.append)
  except CLEAR_ERRORS:
    result = "refused"
  else:
    assert step in (STEPS, PREVIOUS) and meta["step"] == step, (relative, damage, step)
    for name, value in params.items():
      np.testing.assert_array_equal(
        np.asarray(value),
        ref.states[step][ckpt_lib.PARAMS + name],
        err_msg=f"evaluation, {relative} {damage}: {name}",
      )
    said = any(f"checkpoint at step {STEPS} " in line for line in out)
    assert said == (step == PREVIOUS), (relative, damage, out)  # a fallback is reported
    result = "read" if step == STEPS else "read the previous"
  assert tree_digest(workdir / "checkpoints") == before, (relative, damage)  # reads only
  return result


def _outcome(ref, workdir, relative: str, damage: str) -> str:
  """The case's outcome, after asserting that it is one of the three allowed ones."""
  try:
    step, state, data_state = _open_as_the_loop_does(ref, workdir)
  except CLEAR_ERRORS as e:
    assert str(e).strip(), f"{relative} {damage}: {type(e).__name__} with no message"
    outcome = "refused"
  else:
    assert step in (STEPS, PREVIOUS), (relative, damage, step)
    for name, want in ref.states[step].items():  # never a damaged state
      np.testing.assert_array_equal(state[name], want, err_msg=f"{relative} {damage}: {name}")
    assert data_state == _data_state(ref.workdir, step), (relative, damage)
    outcome = "restored" if step == STEPS else "fell back"
    if step == PREVIOUS:  # the damaged one was moved aside whole, never deleted
      (moved,) = quarantined(workdir)
      assert moved.startswith(f"{STEPS}-"), moved
  # not a byte of the previous checkpoint changed
  assert tree_digest(step_dir(workdir, PREVIOUS)) == ref.files[PREVIOUS], (relative, damage)
  return outcome


FLIPS = ("flip-start", "flip-middle", "flip-end")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["flip", "truncate", "delete"])
def test_every_file_of_the_newest_checkpoint_damaged(reference, tmp_path, kind, capsys):
  """Every file damaged in turn; "flip" takes the three flip positions in rotation over the
  files (start, middle, end, start, ...), so each position meets a third of the files at a
  third of the cost of three full passes."""
  outcomes = collections.Counter()
  rows = []
  files = _files(reference.workdir)
  assert len(files) >= 10 and any(f.startswith("state/") for f in files), files
  for i, relative in enumerate(files):
    damage = FLIPS[i % len(FLIPS)] if kind == "flip" else kind
    workdir = copy_run(reference, tmp_path / str(i), keep=(PREVIOUS, STEPS))
    DAMAGES[damage](step_dir(workdir, STEPS) / relative)
    evaluation = _evaluation_reads(reference, workdir, relative, damage)
    outcome = _outcome(reference, workdir, relative, damage)
    outcomes[outcome] += 1
    rows.append(f"{damage:12s} {relative:60s} {outcome:10s} evaluation: {evaluation}")
    shutil.rmtree(workdir.parent)
  with capsys.disabled():
    print(f"\n{kind}: {dict(outcomes)}\n" + "\n".join(rows))
  # Damage to a file the restore reads is found (the state's files are not all read: OCDBT's
  # per-process files hold what its merged root also holds); "restored" above means the state
  # the run saved, bitwise.
  assert outcomes["fell back"] >= 4, rows


def test_a_deleted_array_file_costs_one_checkpoint_and_the_run_continues_bitwise(
  reference, tmp_path
):
  workdir = copy_run(reference, tmp_path)
  state = step_dir(workdir, STEPS) / "state"
  largest = max((p for p in state.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  largest.unlink()
  out = []
  summary = train(config(reference), workdir, out)
  assert summary.start_step == PREVIOUS, out
  assert_ends_as_the_reference(workdir, reference)
  # one history: the abandoned steps' rows were dropped, the rerun's written once
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  loss_steps = [r["step"] for r in rows if "loss" in r]
  assert loss_steps == sorted(set(loss_steps)) == sorted(reference.losses), loss_steps


# ------------------------------------------------------------ the workdir's other files


@pytest.mark.slow  # flip-end is left out: like flip-middle it hits the data, not a header
@pytest.mark.parametrize("damage", ["flip-start", "flip-middle", "truncate", "delete"])
def test_every_other_file_of_the_workdir_damaged_then_the_run_continues_bitwise(
  reference, tmp_path, damage, capfd
):
  """The token caches (tokens-*.npy and their records), metrics.jsonl and the TensorBoard
  events, all damaged at once in a run stopped after step 6: the caches are found unusable and
  rebuilt, unreadable metrics lines are moved aside with a report, and steps 7-8 are trained on
  the uninterrupted run's tokens: the same losses and the same checkpoint, bitwise."""
  workdir = copy_run(reference, tmp_path, keep=SAVED[:-1])
  # the writer lock (released) stays out: an unreadable lock counts as held until it goes stale
  files = sorted(
    p
    for p in workdir.rglob("*")
    if p.is_file()
    and ckpt_lib.CHECKPOINTS not in p.relative_to(workdir).parts
    and not p.name.startswith(lock_lib.PREFIX)
  )
  assert {p.relative_to(workdir).parts[0] for p in files} == {
    "data",
    "metrics.jsonl",
    "tensorboard",
  }, files
  for path in files:
    DAMAGES[damage](path)
  capfd.readouterr()
  out = []
  summary = train(config(reference), workdir, out)
  assert summary.start_step == PREVIOUS, out
  err = capfd.readouterr().err
  caches = [p for p in files if p.suffix == ".npy"]
  assert len(caches) == 2  # train and val
  for npy in caches:  # each damaged cache was found and rebuilt, none read
    assert (f"token cache {npy} is unusable" in err) != (damage == "delete"), err
  assert err.count("tokenizing with") == 2, err
  state = read_state(workdir, STEPS)
  for name, want in reference.states[STEPS].items():
    np.testing.assert_array_equal(state[name], want, err_msg=name)
  got = losses(workdir, report=out.append)
  trained = range(PREVIOUS + 1, STEPS + 1)
  assert {s: got.get(s) for s in trained} == {s: reference.losses[s] for s in trained}, got
  assert all(reference.losses[s] == v for s, v in got.items())  # what survived is the run's
  if len(got) < len(reference.losses) and damage != "delete":  # lines lost: said, kept aside
    assert any("metrics.jsonl" in line and "moved to" in line for line in out), out
    assert (workdir / "metrics.jsonl.unreadable").stat().st_size > 0


# --------------------------------------------------------------- the workdir's tokenizer file


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
  """A 4-step run with a BPE tokenizer, which lives as a file in the workdir."""
  root = tmp_path_factory.mktemp("bpe")
  c = small_config(
    root,
    steps=4,
    checkpoint_every=2,
    eval_every=4,
    **{"data.tokenizer": "bpe:300", "model.vocab_size": 320},
  )
  workdir = root / "run"
  train(c, workdir)
  (tok_file,) = workdir.glob("tokenizer-bpe-*.json")
  return c, workdir, tok_file


def _changed_but_valid(path: pathlib.Path) -> None:
  """Swaps two vocabulary ids: the file still loads, but maps text to other ids."""
  spec = json.loads(path.read_text())
  vocab = spec["model"]["vocab"]
  a, b = sorted(vocab, key=vocab.get)[300 - 2 : 300]
  vocab[a], vocab[b] = vocab[b], vocab[a]
  path.write_text(json.dumps(spec))


@pytest.mark.parametrize(
  "damage, message",
  [
    (_changed_but_valid, r"tokenizer-bpe-300\.json changed"),
    (
      lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
      r"could not read the tokenizer file .*tokenizer-bpe-300\.json",
    ),
  ],
)
def test_a_damaged_tokenizer_file_is_refused_by_training_and_evaluation(
  bpe_run, tmp_path, damage, message
):
  c, original, _ = bpe_run
  workdir = tmp_path / "run"
  shutil.copytree(original, workdir)
  (tok_file,) = workdir.glob("tokenizer-bpe-*.json")
  damage(tok_file)
  before = tree_digest(workdir / "checkpoints")
  with pytest.raises(ValueError, match=message):
    train(c, workdir)
  with pytest.raises(ValueError, match=message):
    scoring.load_run(str(workdir))
  assert tree_digest(workdir / "checkpoints") == before  # nothing moved or deleted
  assert not (workdir / "checkpoints_unreadable").exists()
