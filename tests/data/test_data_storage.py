"""The data layer on Google Cloud Storage (the session's GCS API server, tests/gcs_server.py):
prepared datasets written to and read from gs://, token caches and bpe files in a gs://
workdir, the identity of a run's data, and rove-prepare's writer lock and one-line errors."""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from rove_jax import data
from rove_jax.cli import prepare as prepare_cli
from rove_jax.data import pipeline, prepared, token_cache, tokenization
from rove_jax.storage import lock as lock_lib
from rove_jax.storage import paths
from tests import gcs_server
from tests.conftest import write_corpus

BYTES = tokenization.ByteTokenizer()


@pytest.fixture(autouse=True)
def local_cache(tmp_path, monkeypatch) -> pathlib.Path:
  """The local copies of gs:// shards go under tmp_path, not the user's cache."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
  return tmp_path / "xdg-cache"


def _objects(bucket: str, prefix: str) -> list[str]:
  return [o[len(prefix) + 1 :] for o in gcs_server.objects(bucket) if o.startswith(prefix + "/")]


def _swapped_corpus(src: str, dst: pathlib.Path) -> str:
  """The corpus at src with 'x' and 'y' swapped: the same files, sizes, split and token count,
  other tokens."""
  dst.mkdir(parents=True)
  for f in sorted(pathlib.Path(src).iterdir()):
    (dst / f.name).write_text(f.read_text().translate(str.maketrans("xy", "yx")))
  return str(dst)


def test_prepared_dataset_on_gcs_reads_as_the_local_one(tmp_path, gcs_bucket, capsys, local_cache):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=6, chars=1500))
  local = data.prepare_dataset(
    corpus, "bytes", tmp_path / "p", tokens_per_shard=1000, progress=False
  )
  out = f"{gcs_bucket}/ds"
  assert (
    prepare_cli.main(
      [
        "--source",
        "text",
        "--path",
        corpus.path,
        "--out",
        out,
        "--tokens-per-shard",
        "1000",
        "--no-progress",
      ]
    )
    == 0
  )
  remote = prepared.read_manifest(out)
  assert remote["splits"] == local["splits"]  # every shard's tokens, bytes and sha256
  shards = [s["file"] for sp in data.SPLITS for s in local["splits"][sp]["shards"]]
  assert _objects(gcs_bucket, "ds") == sorted([".writer-lock.1", "manifest.json"] + shards)
  capsys.readouterr()
  for split in data.SPLITS:
    want = np.asarray(prepared.load(tmp_path / "p", split, BYTES))
    got = data.load_tokens(data.Corpus("prepared", out), split, BYTES)
    assert np.array_equal(np.asarray(got), want) and want.size == local["splits"][split]["tokens"]
  err = capsys.readouterr().err
  assert err.count(f"copying {out}/") == len(shards)  # each shard copied to the local cache once
  for split in data.SPLITS:
    prepared.load(out, split, BYTES)
  assert "copying" not in capsys.readouterr().err  # and memory-mapped from there afterwards
  assert prepared.verify(out) == len(shards)
  # A damaged local copy is not taken for a damaged dataset: it is fetched again.
  (copy,) = local_cache.rglob(shards[0])
  intact = copy.read_bytes()
  copy.write_bytes(bytes([intact[0] ^ 1]) + intact[1:])
  assert prepared.verify(out) == len(shards) and copy.read_bytes() == intact
  # The same contents: the same manifest sha256, wherever the dataset lives.
  assert prepared.identity(remote, out) == {
    **prepared.identity(local, str(tmp_path / "p")),
    "path": out,
  }
  # A shard changed in the bucket (same size) is found by hashing, named with the fix.
  victim = f"{out}/{shards[1]}"
  good = paths.read_bytes(victim)
  time.sleep(0.01)  # another modification time: the local copy of the old object is not reused
  paths.write_atomic(victim, bytes([good[0] ^ 1]) + good[1:])
  with pytest.raises(
    prepared.DamagedDataset, match=f"shard {victim} does not match its sha256.*rerun the command"
  ):
    prepared.verify(out)
  capsys.readouterr()
  assert prepare_cli.main(["--check", "--out", out]) == 2
  assert (
    capsys.readouterr()
    .err.splitlines()[-1]
    .startswith(f"error: shard {victim} does not match its sha256")
  )
  # Rerunning the command rewrites it.
  assert (
    prepare_cli.main(
      [
        "--source",
        "text",
        "--path",
        corpus.path,
        "--out",
        out,
        "--tokens-per-shard",
        "1000",
        "--no-progress",
      ]
    )
    == 0
  )
  assert paths.read_bytes(victim) == good and prepared.verify(out) == len(shards)


def test_token_cache_in_a_gcs_workdir_is_written_once_then_reused(tmp_path, gcs_bucket, capsys):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  workdir = f"{gcs_bucket}/run"
  first = data.prepare(corpus, "bytes", workdir=workdir)
  assert "tokenizing" in capsys.readouterr().err
  cache = _objects(gcs_bucket, "run")
  assert len(cache) == 4 and all(c.startswith("data/tokens-text-") for c in cache)
  written = {c: paths.mtime(f"{workdir}/{c}") for c in cache}
  second = data.prepare(corpus, "bytes", workdir=workdir)
  err = capsys.readouterr().err
  assert "tokenizing" not in err and err.count(f"cached tokens from {workdir}/data/") == 2
  assert {c: paths.mtime(f"{workdir}/{c}") for c in cache} == written  # nothing rewritten
  here = data.prepare(corpus, "bytes", workdir=str(tmp_path / "w"))
  for split in ("train_tokens", "val_tokens"):
    assert np.array_equal(getattr(second, split), getattr(here, split))
    assert np.array_equal(getattr(first, split), getattr(here, split))
    assert not getattr(second, split).flags.writeable
  assert first.identity == second.identity == here.identity
  (record,) = [c for c in cache if c.startswith("data/tokens-text-train-") and c.endswith(".json")]
  assert (
    second.identity["train_sha256"] == json.loads(paths.read_text(f"{workdir}/{record}"))["sha256"]
  )
  # A damaged object is found by its record and rebuilt with the same tokens.
  npy = f"{workdir}/{record[: -len('.json')]}.npy"
  paths.write_atomic(npy, paths.read_bytes(npy)[:-10])
  capsys.readouterr()
  third = data.prepare(corpus, "bytes", workdir=workdir)
  err = capsys.readouterr().err
  assert f"token cache {npy} is unusable" in err and "truncated" in err and "rebuilding" in err
  assert np.array_equal(third.train_tokens, here.train_tokens)
  assert (
    token_cache.cache_problem(
      npy, json.loads(paths.read_text(f"{workdir}/{record}"))["key"], np.uint16
    )
    is None
  )


def test_bpe_files_live_in_gcs_datasets_and_workdirs(tmp_path, gcs_bucket, capsys):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  workdir = f"{gcs_bucket}/run"
  first = data.prepare(corpus, "bpe:300", workdir=workdir)
  assert "training the bpe:300 tokenizer" in capsys.readouterr().err
  again = data.prepare(corpus, "bpe:300", workdir=workdir)
  assert f"reusing the bpe:300 tokenizer at {workdir}/tokenizer-bpe-300.json" in (
    capsys.readouterr().err
  )
  assert again.tokenizer.fingerprint == first.tokenizer.fingerprint
  assert np.array_equal(again.train_tokens, first.train_tokens)
  # A bpe dataset on gs:// trains its tokenizer there and brings it to a run's gs:// workdir.
  out = f"{gcs_bucket}/ds"
  manifest = data.prepare_dataset(corpus, "bpe", out, vocab_size=300, progress=False)
  assert manifest["tokenizer"]["file"] == "tokenizer-bpe-300.json"
  run = data.prepare(data.Corpus("prepared", out), "bpe:300", workdir=f"{gcs_bucket}/run2")
  assert paths.read_bytes(f"{gcs_bucket}/run2/tokenizer-bpe-300.json") == paths.read_bytes(
    f"{out}/tokenizer-bpe-300.json"
  )
  want = data.load_tokens(corpus, "val", run.tokenizer)
  assert run.tokenizer.fingerprint == manifest["tokenizer"]["fingerprint"]
  assert np.array_equal(np.asarray(run.val_tokens), want)


def test_identity_is_the_same_for_the_same_data_and_names_a_re_preparation(tmp_path, gcs_bucket):
  a = data.Corpus("text", write_corpus(tmp_path / "a", n_files=5, chars=1200))
  b = data.Corpus("text", _swapped_corpus(a.path, tmp_path / "b"))
  out = f"{gcs_bucket}/ds"
  data.prepare_dataset(a, "bytes", out, tokens_per_shard=1000, progress=False)
  one = data.prepare(data.Corpus("prepared", out), "bytes", workdir=str(tmp_path / "w1"))
  two = data.prepare(data.Corpus("prepared", out), "bytes", workdir=str(tmp_path / "w2"))
  assert one.identity == two.identity and set(one.identity) == {"source", "manifest_sha256", "path"}
  assert one.identity["path"] == out and json.loads(json.dumps(one.identity)) == one.identity
  assert pipeline.describe_identity_change(one.identity, two.identity) == ""
  data.prepare_dataset(b, "bytes", out, tokens_per_shard=1000, overwrite=True, progress=False)
  three = data.prepare(data.Corpus("prepared", out), "bytes", workdir=str(tmp_path / "w3"))
  assert three.train_tokens.size == one.train_tokens.size  # as many tokens, other ones
  assert not np.array_equal(np.asarray(three.train_tokens), np.asarray(one.train_tokens))
  old, new = one.identity["manifest_sha256"], three.identity["manifest_sha256"]
  assert old != new
  assert pipeline.describe_identity_change(one.identity, three.identity) == (
    f"the prepared dataset {out} was re-prepared (manifest sha256 {old[:8]}... -> {new[:8]}...)"
  )
  capped = data.prepare(
    data.Corpus("prepared", out), "bytes", workdir=str(tmp_path / "w4"), max_train_tokens=3000
  )
  assert capped.identity["max_tokens"] == {"train": 3000, "val": None}
  assert pipeline.describe_identity_change(three.identity, capped.identity) == (
    "its train split's token cap changed from None to 3000"
  )
  # The other sources: the sha256 of the token arrays (the cache record's, or computed).
  ta = data.prepare(a, "bytes", workdir=str(tmp_path / "ta"))
  tb = data.prepare(b, "bytes", workdir=str(tmp_path / "tb"))
  assert ta.identity == {
    "source": "text",
    "train_sha256": token_cache.tokens_sha256(data.load_tokens(a, "train", BYTES)),
    "val_sha256": token_cache.tokens_sha256(data.load_tokens(a, "val", BYTES)),
  }
  assert ta.identity == data.prepare(a, "bytes", workdir=str(tmp_path / "ta")).identity
  assert ta.identity["val_sha256"] != tb.identity["val_sha256"]
  assert pipeline.describe_identity_change(ta.identity, tb.identity) == (
    f"the training tokens of the text corpus changed (sha256 {ta.identity['train_sha256'][:8]}"
    f"... -> {tb.identity['train_sha256'][:8]}...); the validation tokens of the text corpus "
    f"changed (sha256 {ta.identity['val_sha256'][:8]}... -> {tb.identity['val_sha256'][:8]}"
    f"...)"
  )
  assert pipeline.describe_identity_change(ta.identity, one.identity).startswith(
    f"the data source changed from the text corpus (training tokens sha256 "
    f"{ta.identity['train_sha256'][:8]}...) to the prepared dataset {out}"
  )


# ------------------------------------------------------------------------- the command

_HOLD = """
import os, sys, time
from rove_jax.cli import prepare as prepare_cli
from rove_jax.data import shard_writer
real = shard_writer.write_split
def held(*args, **kwargs):  # the lock is held now: say so, wait for the test's go
  open(sys.argv[1], "w").close()
  deadline = time.monotonic() + 120
  while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.05)
  return real(*args, **kwargs)
shard_writer.write_split = held
sys.exit(prepare_cli.main(sys.argv[3:]))
"""


def test_two_concurrent_rove_prepare_runs_one_gets_a_lock_error(tmp_path, gcs_bucket):
  corpus = write_corpus(tmp_path / "corpus", n_files=4, chars=1200)
  out = f"{gcs_bucket}/ds"
  args = [
    "--source",
    "text",
    "--path",
    corpus,
    "--out",
    out,
    "--tokens-per-shard",
    "700",
    "--no-progress",
  ]
  holding, go = tmp_path / "holding", tmp_path / "go"
  first = subprocess.Popen(
    [sys.executable, "-c", _HOLD, str(holding), str(go), *args],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 120
    while not holding.exists():
      assert first.poll() is None and time.monotonic() < deadline, first.communicate()
      time.sleep(0.05)
    second = subprocess.run(
      [sys.executable, "-m", "rove_jax.cli.prepare", *args],
      capture_output=True,
      text=True,
      timeout=120,
    )
    go.touch()
    _, err_first = first.communicate(timeout=120)
  finally:
    first.kill()
  assert first.returncode == 0, err_first
  assert second.returncode == 1 and second.stdout == ""
  (line,) = second.stderr.strip().splitlines()
  assert line.startswith(
    f"error: prepared dataset {out} is being written by pid {first.pid} on host "
  ), line
  assert "Stop that process or choose another prepared dataset" in line
  # The first run was not disturbed: its dataset is complete and is the corpus's tokens.
  corpus_ = data.Corpus("text", corpus)
  assert prepared.verify(out) == len(_objects(gcs_bucket, "ds")) - 2  # lock, manifest
  for split in data.SPLITS:
    assert np.array_equal(
      np.asarray(prepared.load(out, split, BYTES)), data.load_tokens(corpus_, split, BYTES)
    )


def test_out_that_is_a_file_is_one_line_and_exit_2(tmp_path):
  corpus = write_corpus(tmp_path / "corpus", n_files=2, chars=400)
  (tmp_path / "notes.txt").write_text("mine\n")
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.prepare",
      "--source",
      "text",
      "--path",
      corpus,
      "--out",
      str(tmp_path / "notes.txt"),
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert done.returncode == 2 and done.stdout == ""
  assert done.stderr.splitlines() == [
    f"error: --out {tmp_path / 'notes.txt'} is a file; a prepared dataset is a directory: "
    f"choose another --out"
  ]
  assert (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize(
  "case", ["below a file", "gcs object", "no gcsfs", "lock held", "tiktoken offline"]
)
def test_command_failures_are_one_line_with_their_exit_code(
  tmp_path, gcs_bucket, capsys, monkeypatch, case
):
  corpus = write_corpus(tmp_path / "corpus", n_files=2, chars=400)
  out, tokenizer = str(tmp_path / "p"), "bytes"
  held = None
  if case == "below a file":
    (tmp_path / "notes.txt").write_text("mine\n")
    out = str(tmp_path / "notes.txt" / "p")
    code, want = 2, f"error: --out {out} is below {tmp_path / 'notes.txt'}, which is a file"
  elif case == "gcs object":
    out = f"{gcs_bucket}/ds"
    paths.write_atomic(out, b"an object")
    code, want = 2, f"error: --out {out} is a file; a prepared dataset is a directory"
  elif case == "no gcsfs":
    real = paths.importlib.util.find_spec
    monkeypatch.setattr(
      paths.importlib.util,
      "find_spec",
      lambda name, *a: None if name == "gcsfs" else real(name, *a),
    )
    out = f"{gcs_bucket}/ds"
    code, want = (
      1,
      (
        f"error: --out {out} is on Google Cloud Storage, which needs gcsfs: "
        f"pip install 'rove_jax[gcs]'"
      ),
    )
  elif case == "lock held":
    held = lock_lib.WriterLock(out, what="prepared dataset")
    held.acquire()
    code, want = 1, f"error: prepared dataset {out} is being written by pid {os.getpid()}"
  else:
    tiktoken = pytest.importorskip("tiktoken")

    def offline(name):
      raise ConnectionError(f"could not reach the server for {name}")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    tokenizer = "tiktoken:gpt2"
    code, want = 1, "error: tiktoken could not load the files of encoding 'gpt2' (ConnectionError"
  capsys.readouterr()
  try:
    got = prepare_cli.main(
      [
        "--source",
        "text",
        "--path",
        corpus,
        "--out",
        out,
        "--tokenizer",
        tokenizer,
        "--no-progress",
      ]
    )
  finally:
    if held is not None:
      held.release()
  err = capsys.readouterr().err
  assert got == code and len(err.splitlines()) == 1 and err.startswith(want), err
  if case == "lock held":  # nothing was written: the lock is still the only file
    assert sorted(os.listdir(out)) == [".writer-lock.1"]
