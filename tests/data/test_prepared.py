"""Prepared datasets (rove-prepare, rove_jax.data.prepared): the shards are the tokenized corpus,
processes read disjoint rows that together make the global batch, iterators and training runs
resume bitwise, and damage is found and named."""

import hashlib
import json
import os
import pathlib
import re
import shlex
import sys

import numpy as np
import pytest

from rove_jax import data
from rove_jax.cli import prepare as prepare_cli
from rove_jax.data import prepare_corpus, prepared, shard_writer, tokenization
from rove_jax.train import loop as training
from rove_jax.train import overrides, resolve
from tests.conftest import free_port, run_together, small_config, subprocess_env, write_corpus
from tests.train.test_loop import ROOT, losses


def _reference(corpus, split, tok):
  """The split as [ids of doc, eot] for every document: built here, not by rove_jax."""
  return np.concatenate(
    [np.append(tok.encode(d), tok.eot_id) for d in data.iter_documents(corpus, split)]
  )


@pytest.fixture
def small_chunks(monkeypatch):
  # Encode a few documents at a time, so shards are written while documents are still read.
  monkeypatch.setattr(shard_writer, "_ENCODE_CHUNK_CHARS", 2000)


def _counting_corpus(directory: pathlib.Path, n_files=4, numbers=400) -> str:
  """Text files of consecutive 6-digit numbers: every window of > 14 bytes occurs once."""
  directory.mkdir(parents=True)
  for f in range(n_files):
    text = " ".join(f"{i:06d}" for i in range(f * numbers, (f + 1) * numbers))
    (directory / f"n{f}.txt").write_text(text)
  return str(directory)


def test_shards_are_the_tokenized_corpus(tmp_path, small_chunks):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=12, chars=1500))
  tok = tokenization.get_tokenizer("bytes")
  out = tmp_path / "prepared"
  manifest = data.prepare_dataset(corpus, "bytes", out, tokens_per_shard=1000, progress=False)
  on_disk = json.loads((out / "manifest.json").read_text())
  assert on_disk == manifest and manifest["dtype"] == "uint16"
  assert manifest["tokenizer"]["fingerprint"] == tok.fingerprint
  assert sorted(os.listdir(out)) == sorted(
    [".writer-lock.1", "manifest.json"]
    + [s["file"] for sp in ("train", "val") for s in manifest["splits"][sp]["shards"]]
  )
  assert json.loads((out / ".writer-lock.1").read_text())["released"] is True  # rove-prepare's
  for split in ("train", "val"):
    want = _reference(corpus, split, tok)
    info = manifest["splits"][split]
    shards = info["shards"]
    assert [s["tokens"] for s in shards[:-1]] == [1000] * (len(shards) - 1)
    raw = [(out / s["file"]).read_bytes() for s in shards]
    assert [hashlib.sha256(b).hexdigest() for b in raw] == [s["sha256"] for s in shards]
    got = np.concatenate([np.frombuffer(b, "<u2") for b in raw])
    np.testing.assert_array_equal(got, want)
    assert info["tokens"] == want.size
    assert info["documents"] == len(list(data.iter_documents(corpus, split)))
    assert [s["documents"] for s in shards] == [
      int(np.sum(np.frombuffer(b, "<u2") == tok.eot_id)) for b in raw
    ]
    # The reader gives the same stream, and so does the token cache of the raw corpus.
    read = data.load_tokens(data.Corpus("prepared", str(out)), split, tok)
    np.testing.assert_array_equal(np.asarray(read), want)
    np.testing.assert_array_equal(np.asarray(data.load_tokens(corpus, split, tok)), want)
    docs = tok.decode(np.asarray(read)).split(tokenization.EOT_TEXT)
    assert docs == list(data.iter_documents(corpus, split)) + [""]
  assert len(manifest["splits"]["train"]["shards"]) > 3
  capped = prepared.load(out, "train", tok, max_tokens=2500)
  np.testing.assert_array_equal(np.asarray(capped), _reference(corpus, "train", tok)[:2500])
  # Slices that cross shard boundaries read the right tokens.
  whole = np.asarray(read)
  for a, b in ((990, 1010), (0, 3000), (1999, 2001), (2000, 2000)):
    np.testing.assert_array_equal(prepared.load(out, "val", tok)[a:b], whole[a:b])


class _Offset(tokenization.ByteTokenizer):
  """Bytes shifted past 65536: ids that do not fit in uint16."""

  name, vocab_size, eot_id = "offset-bytes", 70_257, 70_256

  def encode(self, text):
    return super().encode(text) + 70_000

  @property
  def fingerprint(self):
    return "offset-bytes-v1"


def test_large_vocabulary_gets_uint32_shards(tmp_path):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=3, chars=800))
  tok = _Offset()
  manifest = data.prepare_dataset(corpus, tok, tmp_path / "p", tokens_per_shard=500, progress=False)
  assert manifest["dtype"] == "uint32"
  got = data.load_tokens(data.Corpus("prepared", str(tmp_path / "p")), "train", tok)
  assert got.dtype == np.dtype("<u4")
  np.testing.assert_array_equal(np.asarray(got), _reference(corpus, "train", tok))


def test_bpe_dataset_brings_its_tokenizer_to_the_run(tmp_path):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  out, workdir = tmp_path / "p", tmp_path / "w"
  manifest = data.prepare_dataset(corpus, "bpe", out, vocab_size=300, progress=False)
  assert manifest["tokenizer"]["spec"] == "bpe:300"  # the spec a run names
  assert manifest["tokenizer"]["file"] == "tokenizer-bpe-300.json"
  run = data.prepare(data.Corpus("prepared", str(out)), "bpe:300", workdir=str(workdir))
  copied = workdir / "tokenizer-bpe-300.json"
  assert copied.read_bytes() == (out / "tokenizer-bpe-300.json").read_bytes()
  tok = tokenization.HFTokenizer.from_file(str(copied))
  np.testing.assert_array_equal(np.asarray(run.val_tokens), _reference(corpus, "val", tok))
  with pytest.raises(ValueError, match="set --config.data.tokenizer=bpe:300"):
    data.prepare(data.Corpus("prepared", str(out)), "bpe:400", workdir=str(tmp_path / "w2"))
  with pytest.raises(ValueError, match="tokenized with 'bpe:300'.*'bytes'"):
    data.prepare(data.Corpus("prepared", str(out)), "bytes", workdir=str(tmp_path / "w3"))


class _Recording(prepared.ShardedTokens):
  """Records the start of every slice the pipeline reads."""

  def __init__(self, tokens):
    super().__init__(tokens._parts, tokens.size)
    self.reads = []

  def __getitem__(self, key):
    if isinstance(key, slice):
      self.reads.append(key.start)
    return super().__getitem__(key)


def test_two_processes_read_disjoint_rows_that_make_the_global_batch(tmp_path):
  corpus = data.Corpus("text", _counting_corpus(tmp_path / "corpus"))
  tok = tokenization.get_tokenizer("bytes")
  T, batch, n_windows = 16, 4, 40  # 10 global batches: one epoch
  data.prepare_dataset(
    corpus,
    "bytes",
    tmp_path / "p",
    tokens_per_shard=150,
    max_train_tokens=n_windows * T + 1,
    progress=False,
  )
  tokens = data.load_tokens(data.Corpus("prepared", str(tmp_path / "p")), "train", tok)
  assert isinstance(tokens, prepared.ShardedTokens) and tokens.size == n_windows * T + 1
  kw = dict(seq_len=T, global_batch_size=batch, seed=3, num_threads=0)  # no read-ahead
  single = data.train_iterator(tokens, **kw)
  procs = [_Recording(tokens) for _ in range(2)]
  iters = [
    data.train_iterator(t, process_index=p, process_count=2, **kw) for p, t in enumerate(procs)
  ]
  for step in range(n_windows // batch):
    whole = next(single)
    parts = [next(it) for it in iters]
    for key in whole:
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), whole[key])
    for p, part in zip(procs, parts):  # each process read exactly its own two rows
      rows = [np.asarray(tokens[s : s + T + 1]) for s in p.reads[-2:]]
      assert len(p.reads) == 2 * (step + 1)
      np.testing.assert_array_equal(np.stack(rows)[:, :-1], part["inputs"])
  reads = [set(p.reads) for p in procs]
  assert len(reads[0]) == len(reads[1]) == n_windows // 2 and not reads[0] & reads[1]
  assert reads[0] | reads[1] == {i * T for i in range(n_windows)}  # the epoch, complete


def test_iterator_resumes_bitwise_across_process_counts(tmp_path):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=6, chars=2000))
  data.prepare_dataset(corpus, "bytes", tmp_path / "p", tokens_per_shard=900, progress=False)
  run = data.prepare(
    data.Corpus("prepared", str(tmp_path / "p")), "bytes", workdir=str(tmp_path / "w")
  )
  kw = dict(seq_len=32, global_batch_size=4, seed=7, packing=True)
  it = run.train_iterator(**kw)
  for _ in range(5):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # what a checkpoint stores
  after = [next(it) for _ in range(3)]
  again = run.train_iterator(**kw)
  again.set_state(state)
  halves = [run.train_iterator(process_index=p, process_count=2, **kw) for p in range(2)]
  for h in halves:
    h.set_state(state)
  for want in after:
    got = next(again)
    split = [next(h) for h in halves]
    for key in want:  # inputs, targets, segment_ids, positions
      np.testing.assert_array_equal(got[key], want[key])
      np.testing.assert_array_equal(np.concatenate([s[key] for s in split]), want[key])
  # The same batches as the raw corpus would give: the prepared tokens are its tokens.
  raw = data.prepare(corpus, "bytes", workdir=str(tmp_path / "raw"))
  np.testing.assert_array_equal(
    next(raw.train_iterator(**kw))["inputs"], next(run.train_iterator(**kw))["inputs"]
  )


def test_interrupted_prepare_resumes_to_the_same_bytes(tmp_path, small_chunks, monkeypatch):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=16, chars=1500))
  clean = data.prepare_dataset(
    corpus, "bytes", tmp_path / "clean", tokens_per_shard=800, progress=False
  )
  read = []

  def dies_after_9(corpus, split):
    for i, doc in enumerate(data.iter_documents(corpus, split)):
      if i == 9:
        raise KeyboardInterrupt
      read.append(doc)
      yield doc

  monkeypatch.setattr(prepare_corpus, "iter_documents", dies_after_9)
  out = tmp_path / "p"
  with pytest.raises(KeyboardInterrupt):
    data.prepare_dataset(corpus, "bytes", out, tokens_per_shard=800, progress=False)
  assert not (out / "manifest.json").exists()  # nothing vouches for a partial dataset
  with pytest.raises(prepared.DamagedDataset, match="interrupted.*rerun"):
    prepared.read_manifest(out)
  journal = json.loads((out / "progress.json").read_text())["splits"]["train"]
  assert journal["shards"] and journal["skip"] > 0  # stopped inside a document
  monkeypatch.undo()
  lines = []
  resumed = data.prepare_dataset(
    corpus, "bytes", out, tokens_per_shard=800, progress=False, log=lines.append
  )
  assert any("resuming" in line for line in lines), lines
  assert resumed["splits"] == clean["splits"]  # every shard's sha256 and counts
  assert not (out / "progress.json").exists()


def test_damage_is_found_and_named(tmp_path):
  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  out = tmp_path / "p"
  manifest = data.prepare_dataset(corpus, "bytes", out, tokens_per_shard=600, progress=False)
  tok = tokenization.get_tokenizer("bytes")
  prepared_corpus = data.Corpus("prepared", str(out))
  shard = out / manifest["splits"]["train"]["shards"][1]["file"]
  named = f"shard {re.escape(str(shard))}"
  good = shard.read_bytes()
  shard.write_bytes(good[:-2])  # truncated: every open sees it
  with pytest.raises(prepared.DamagedDataset, match=f"{named} has 1198 bytes.*rerun"):
    data.load_tokens(prepared_corpus, "train", tok)
  shard.write_bytes(bytes([good[0] ^ 1]) + good[1:])  # same size, one bit changed
  data.load_tokens(prepared_corpus, "train", tok)  # the cheap check cannot see it
  with pytest.raises(prepared.DamagedDataset, match=f"{named} does not match its sha256"):
    prepared.verify(out)
  # Hashing is shared out: shard 1 belongs to process 1 of 2, so process 0 finds nothing.
  n_shards = sum(len(manifest["splits"][s]["shards"]) for s in ("train", "val"))
  assert prepared.verify(out, process_index=0, process_count=2) == (n_shards + 1) // 2
  with pytest.raises(prepared.DamagedDataset, match="sha256"):
    prepared.verify(out, process_index=1, process_count=2)
  assert prepare_cli.main(["--check", "--out", str(out)]) == 2
  # Rerunning the command rewrites the damaged shard.
  assert prepare_cli.main(shlex.split(manifest["command"])[1:] + ["--no-progress"]) == 0
  assert shard.read_bytes() == good and prepare_cli.main(["--check", "--out", str(out)]) == 0
  with pytest.raises(ValueError, match="tokenized with 'bytes'.*--config.data.tokenizer"):
    data.load_tokens(prepared_corpus, "val", _Offset())
  (out / "manifest.json").unlink()
  with pytest.raises(prepared.DamagedDataset, match="not a prepared dataset"):
    data.load_tokens(prepared_corpus, "val", tok)


def test_bad_input_fails_before_work(tmp_path, capsys):
  corpus_dir = write_corpus(tmp_path / "corpus", n_files=3, chars=800)
  out = tmp_path / "p"
  cases = [
    (["--source", "text", "--path", str(tmp_path / "missing")], "does not exist"),
    (["--source", "text", "--path", corpus_dir, "--tokenizer", "bpe:12"], "> 257"),
    (
      ["--source", "text", "--path", corpus_dir, "--tokens-per-shard", "0"],
      "tokens_per_shard must be a positive int",
    ),
  ]
  for args, message in cases:
    assert prepare_cli.main(args + ["--out", str(out), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
  assert not out.exists() or not os.listdir(out)
  (tmp_path / "busy").mkdir()
  (tmp_path / "busy" / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match="not a prepared dataset's"):
    data.prepare_dataset(data.Corpus("text", corpus_dir), "bytes", tmp_path / "busy")
  data.prepare_dataset(data.Corpus("text", corpus_dir), "bytes", out, progress=False)
  other = data.Corpus("text", corpus_dir, val_fraction=0.5)
  with pytest.raises(ValueError, match="another corpus.*--overwrite"):
    data.prepare_dataset(other, "bytes", out, progress=False)
  with pytest.raises(ValueError, match=r"leave \['val_fraction'\] unset"):
    data.Corpus("prepared", str(out), val_fraction=0.5)
  with pytest.raises(ValueError, match="holds token ids, not documents"):
    next(data.iter_documents(data.Corpus("prepared", str(out))))


def test_prepared_data_supplies_the_tokenizer_and_vocabulary_size(tmp_path):
  """--config.data.source=prepared --config.data.path=DIR is all a run needs: the manifest
  names the tokenizer, and a vocabulary too small for its ids grows to fit (rounded up to 64);
  settings given must agree with the dataset."""
  import jax

  corpus = data.Corpus("text", write_corpus(tmp_path / "corpus", n_files=4, chars=1200))
  out = tmp_path / "p"
  manifest = data.prepare_dataset(corpus, "bpe", out, vocab_size=400, progress=False)
  ids = manifest["tokenizer"]["vocab_size"]  # what BPE learned from this corpus, up to 400
  need = -(-ids // 64) * 64
  c = small_config(
    tmp_path, steps=2, **{"data.source": "prepared", "data.path": str(out), "model.vocab_size": 256}
  )
  assert c.data.tokenizer is None and 256 < ids  # no tokenizer named; a vocabulary too small
  said = []
  built = resolve.resolve(c, log=said.append)
  assert built.data.tokenizer == "bpe:400" and built.model.vocab_size == need
  assert said == [
    f"model.vocab_size={need}: the prepared dataset's tokenizer 'bpe:400' has {ids} ids"
  ]
  result = training.train(c, str(tmp_path / "run"), devices=jax.devices()[:1], log=lambda *a: None)
  assert result.step == 2 and result.tokenizer.vocab_size == ids
  assert result.model_config.vocab_size == need
  c = overrides.apply(c, {"data.tokenizer": "bpe:400", "model.vocab_size": 512})  # agreeing
  assert resolve.resolve(c).model.vocab_size == 512
  c = overrides.apply(c, {"model.vocab_size": 256})
  with pytest.raises(
    ValueError,
    match=rf"model.vocab_size=256 is smaller than the {ids} ids.*"
    rf"--config.model.vocab_size={need}",
  ):
    resolve.resolve(c)
  c = overrides.apply(c, {"data.tokenizer": "bytes"})
  with pytest.raises(
    ValueError,
    match=r"data.tokenizer='bytes' but the prepared dataset .* was "
    r"tokenized with 'bpe:400'; leave data.tokenizer unset",
  ):
    resolve.resolve(c)


def test_a_run_trains_on_prepared_data_and_resumes_bitwise(tmp_path):
  """Steps 1-2 on a prepared dataset, then 3-4 resumed: the losses of a straight run on the raw
  corpus, bit for bit (the same tokens, batches and programs)."""
  import jax

  from rove_jax.evaluation import scoring

  c = small_config(tmp_path, steps=4)
  raw = c.data.corpus()
  data.prepare_dataset(raw, "bytes", tmp_path / "p", tokens_per_shard=3000, progress=False)
  one = jax.devices()[:1]
  training.train(c, str(tmp_path / "raw"), devices=one, log=lambda *a: None)
  c = overrides.apply(c, {"data.source": "prepared", "data.path": str(tmp_path / "p")})
  out, resumed = [], tmp_path / "resumed"
  training.train(overrides.apply(c, {"run_steps": 2}), str(resumed), devices=one, log=out.append)
  training.train(c, str(resumed), devices=one, log=out.append)
  assert any("resumed from step 2" in line for line in out), out
  want = losses(tmp_path / "raw")
  assert sorted(want) == [1, 2, 3, 4] and losses(resumed) == want
  # Evaluation reads the run's validation split from the prepared shards.
  val = scoring.load_run(str(resumed)).val_tokens()
  np.testing.assert_array_equal(
    np.asarray(val), _reference(raw, "val", tokenization.get_tokenizer("bytes"))
  )


@pytest.mark.slow
def test_two_process_run_on_prepared_data_resumes_on_one(tmp_path):
  """Two jax.distributed processes train steps 1-2 on a prepared dataset, each reading its half
  of every global batch; one process resumes steps 3-4 from their checkpoint. The losses are
  those of one process training on the raw corpus."""
  import jax

  c = small_config(tmp_path, steps=4, **{"data.batch_size": 8, "mesh.data": 2})
  data.prepare_dataset(
    c.data.corpus(), "bytes", tmp_path / "p", tokens_per_shard=3000, progress=False
  )
  two = jax.devices()[:2]
  training.train(c, str(tmp_path / "raw"), devices=two, log=lambda *a: None)
  args = [
    "--config.model.n_layer=1",
    "--config.model.d_model=32",
    "--config.model.n_head=2",
    "--config.model.d_ff=64",
    "--config.model.max_len=32",
    "--config.data.source=prepared",
    f"--config.data.path={tmp_path / 'p'}",
    "--config.data.seq_len=32",
    "--config.data.batch_size=8",
    "--config.steps=4",
    "--config.run_steps=2",
    "--config.optim.warmup_steps=2",
    "--config.optim.lr=0.001",
    "--config.log_every=1",
    "--config.eval_every=4",
    "--config.eval_batches=2",
    "--config.checkpoint_every=4",
    "--config.progress=False",
    "--config.sample_tokens=0",
    "--config.mesh.data=2",
  ]
  port = free_port()
  outs = run_together(
    [
      [
        sys.executable,
        str(ROOT / "train.py"),
        "--config",
        str(ROOT / "configs" / "tiny.py"),
        "--workdir",
        str(tmp_path / "run"),
        *args,
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ]
      for i in range(2)
    ],
    subprocess_env(devices=1, JAX_PLATFORMS="cpu"),
  )
  assert all("verifying" in o for o in outs)  # each process hashed its share of the shards
  c = overrides.apply(c, {"data.source": "prepared", "data.path": str(tmp_path / "p")})
  log = []
  training.train(c, str(tmp_path / "run"), devices=two, log=log.append)
  assert any("resumed from step 2" in line for line in log), log
  want, got = losses(tmp_path / "raw"), losses(tmp_path / "run")
  assert sorted(got) == sorted(want) == [1, 2, 3, 4]
  for step in want:
    assert abs(got[step] - want[step]) <= 1e-5 * want[step], (step, got, want)
