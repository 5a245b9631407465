"""Data faults: damaged token caches are rebuilt, binary and corrupt source files are named."""

import json

import numpy as np
import pytest

from rove_jax import data
from rove_jax.data import files, hf, token_cache, tokenization
from tests.conftest import write_corpus

BYTES = tokenization.ByteTokenizer()


def _cached(tmp_path, capsys):
  """A text corpus, its train tokens and its token cache (tokens-*.npy, tokens-*.json)."""
  corpus = data.Corpus("text", write_corpus(tmp_path / "c", n_files=4, chars=800))
  tokens = np.array(data.load_tokens(corpus, "train", BYTES, cache_dir=tmp_path / "cache"))
  (npy,) = (tmp_path / "cache").glob("tokens-text-train-*.npy")
  (record,) = (tmp_path / "cache").glob("tokens-text-train-*.json")
  assert record.stem == npy.stem
  capsys.readouterr()
  return corpus, tokens, npy, record


def _reload(corpus, tmp_path, capsys):
  tokens = data.load_tokens(corpus, "train", BYTES, cache_dir=tmp_path / "cache")
  return np.array(tokens), capsys.readouterr().err


def test_valid_cache_is_reused_without_tokenizing(tmp_path, capsys):
  corpus, tokens, npy, record = _cached(tmp_path, capsys)
  rec = json.loads(record.read_text())
  assert rec["tokens"] == tokens.size and rec["dtype"] == "uint16"
  assert rec["bytes"] == npy.stat().st_size and rec["key"].startswith(npy.stem.split("-")[-1])
  again, err = _reload(corpus, tmp_path, capsys)
  np.testing.assert_array_equal(again, tokens)
  assert "tokenizing" not in err and "WARNING" not in err and f"cached tokens from {npy}" in err


def test_truncated_cache_is_rebuilt_with_identical_tokens(tmp_path, capsys):
  corpus, tokens, npy, _ = _cached(tmp_path, capsys)
  original = npy.read_bytes()
  npy.write_bytes(original[:-100])  # the user's "mmap length is greater than file size"
  again, err = _reload(corpus, tmp_path, capsys)
  np.testing.assert_array_equal(again, tokens)
  assert f"token cache {npy} is unusable" in err and "truncated" in err
  assert "tokenizing" in err
  assert npy.read_bytes() == original  # same name, same bytes


@pytest.mark.parametrize(
  "damage, reason",
  [
    ("missing", "is missing"),
    ("garbled", "is unreadable"),
    ("other key", "has key="),
    ("token count", "header says uint16 ({n},), its record uint16 ({m},)"),
    ("header", ".npy header"),
    ("flipped tokens", "fail the sha256"),
    ("record from before digests", "has format=1"),
  ],
)
def test_cache_whose_record_is_missing_or_disagrees_is_rebuilt(tmp_path, capsys, damage, reason):
  corpus, tokens, npy, record = _cached(tmp_path, capsys)
  rec = json.loads(record.read_text())
  if damage == "missing":
    record.unlink()
  elif damage == "garbled":
    record.write_text('{"format": 1, "key": ')
  elif damage == "other key":
    record.write_text(json.dumps({**rec, "key": "0" * 64}))
  elif damage == "token count":
    record.write_text(json.dumps({**rec, "tokens": rec["tokens"] - 1}))
  elif damage == "flipped tokens":  # same size and header: only the digest sees it
    data = bytearray(npy.read_bytes())
    data[len(data) // 2] ^= 0x01
    npy.write_bytes(bytes(data))
  elif damage == "record from before digests":
    record.write_text(json.dumps({k: v for k, v in {**rec, "format": 1}.items() if k != "sha256"}))
  else:  # same size, but not an .npy header
    npy.write_bytes(b"\0" * rec["bytes"])
  again, err = _reload(corpus, tmp_path, capsys)
  np.testing.assert_array_equal(again, tokens)
  reason = reason.format(n=rec["tokens"], m=rec["tokens"] - 1)
  assert f"token cache {npy} is unusable" in err and reason in err and "rebuilding" in err
  assert json.loads(record.read_text()) == rec  # a fresh record vouches for the rebuilt file
  assert token_cache.cache_problem(str(npy), rec["key"], np.uint16) is None


def test_failed_rebuild_leaves_no_cache_that_validates(tmp_path, capsys, monkeypatch):
  corpus, tokens, npy, record = _cached(tmp_path, capsys)
  npy.write_bytes(npy.read_bytes()[:-10])
  real_save = np.save

  def save_half_then_die(f, array):
    real_save(f, array[: array.size // 2])
    raise KeyboardInterrupt  # a kill while the data is written

  monkeypatch.setattr(np, "save", save_half_then_die)
  with pytest.raises(KeyboardInterrupt):
    _reload(corpus, tmp_path, capsys)
  monkeypatch.undo()
  assert not record.exists()  # the stale record no longer vouches for the damaged file
  assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [npy.name]  # no temp files
  again, err = _reload(corpus, tmp_path, capsys)
  np.testing.assert_array_equal(again, tokens)
  assert "is missing" in err


def test_write_cache_false_reads_a_valid_cache_and_never_writes(tmp_path, capsys):
  """Readers of a training workdir: a valid cache is read; a damaged or missing one is made up
  for in memory and the directory is left exactly as it was."""
  corpus, tokens, npy, record = _cached(tmp_path, capsys)
  cache = tmp_path / "cache"

  def read():
    got = data.load_tokens(corpus, "train", BYTES, cache_dir=cache, write_cache=False)
    return np.array(got), capsys.readouterr().err

  def listing():
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(cache.iterdir())}

  got, err = read()
  np.testing.assert_array_equal(got, tokens)
  assert f"cached tokens from {npy}" in err and "tokenizing" not in err
  npy.write_bytes(npy.read_bytes()[:-100])
  before = listing()
  got, err = read()
  np.testing.assert_array_equal(got, tokens)
  assert f"token cache {npy} is unusable" in err and "the cache is left as it is" in err
  assert "rebuilding" not in err and listing() == before
  npy.unlink()
  record.unlink()
  got, err = read()
  np.testing.assert_array_equal(got, tokens)
  assert "tokenizing" in err and list(cache.iterdir()) == []
  got = data.load_tokens(corpus, "train", BYTES, cache_dir=tmp_path / "new", write_cache=False)
  np.testing.assert_array_equal(got, tokens)
  assert not (tmp_path / "new").exists()


def test_binary_txt_named_explicitly_is_refused(tmp_path):
  binary = tmp_path / "model.txt"
  binary.write_bytes(np.random.default_rng(0).bytes(4000))
  with pytest.raises(ValueError, match=rf"{binary} is not UTF-8 text \(.*byte.*convert it"):
    data.iter_documents(data.Corpus("text", str(binary)))
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("caf\xe9 au lait\n".encode("latin-1"))  # no NUL, still not UTF-8
  with pytest.raises(ValueError, match=rf"{latin1} is not UTF-8 text \(invalid UTF-8 at byte 3\)"):
    data.iter_documents(data.Corpus("text", str(latin1)))


def test_binary_file_matched_by_a_directory_is_skipped_with_a_warning(tmp_path):
  root = write_corpus(tmp_path / "c", n_files=3, chars=400)
  texts = [
    d for split in data.SPLITS for d in data.iter_documents(data.Corpus("text", root), split)
  ]
  (tmp_path / "c" / "doc1.5.txt").write_bytes(b"PK\x03\x04\x00\x00binary zip")
  corpus = data.Corpus("text", root)
  with pytest.warns(UserWarning, match=r"skipping .*doc1.5.txt, .*a NUL byte at byte 4"):
    got = list(data.iter_documents(corpus, "train")) + list(data.iter_documents(corpus, "val"))
  assert sorted(got) == sorted(texts) and len(got) == 3
  (tmp_path / "b").mkdir()
  (tmp_path / "b" / "x.txt").write_bytes(b"\xff\xfe\x00h\x00i")
  with (
    pytest.warns(UserWarning),
    pytest.raises(ValueError, match=r"none of the 1 files .*b/\*' matched is UTF-8 text.*x.txt"),
  ):
    data.iter_documents(data.Corpus("text", str(tmp_path / "b" / "*")))


def test_bad_utf8_past_the_sniffed_head_is_named_when_read(tmp_path):
  path = tmp_path / "long.txt"
  path.write_bytes(b"a" * 10_000 + "\u00e9".encode("utf-8") + b"\xff tail")
  assert files.text_problem(str(path), limit=8192) is None  # the listing sniff passes
  assert files.text_problem(str(path)) == "invalid UTF-8 at byte 10002"
  with pytest.raises(ValueError, match=rf"{path} is not UTF-8 text \(invalid UTF-8 at byte 10002"):
    list(data.iter_documents(data.Corpus("text", str(path)), "train"))
  rows = tmp_path / "rows.jsonl"
  rows.write_bytes(b'{"text": "ok"}\n' * 1000 + b'{"text": "\xc3("}\n')
  with pytest.raises(ValueError, match=rf"{rows} is not UTF-8 text \(invalid UTF-8 at byte 15010"):
    list(data.iter_documents(data.Corpus("text", str(rows)), "train"))


def test_corrupt_parquet_errors_name_the_file(tmp_path):
  pa = pytest.importorskip("pyarrow", reason="the parquet source needs pyarrow")
  pq = pytest.importorskip("pyarrow.parquet", reason="the parquet source needs pyarrow")
  good = tmp_path / "good.parquet"
  pq.write_table(
    pa.table({"text": [f"row {i} " * 40 for i in range(100)], "n": list(range(100))}),
    good,
    row_group_size=10,
  )
  (tmp_path / "junk").mkdir()
  junk = tmp_path / "junk" / "part-0.parquet"
  junk.write_bytes(good.read_bytes()[:-300])  # a truncated download
  with pytest.raises(ValueError, match=rf"{junk} is not a parquet file.*re-download it"):
    data.iter_documents(data.Corpus("parquet", str(tmp_path / "junk")))
  damaged = tmp_path / "damaged.parquet"
  raw = bytearray(good.read_bytes())
  raw[1500:1900] = b"\xff" * 400  # a damaged data page, magic bytes intact
  damaged.write_bytes(bytes(raw))
  with pytest.raises(
    ValueError, match=rf"(?s)parquet file {damaged}: reading column 'text'.*re-download"
  ):
    list(data.iter_documents(data.Corpus("parquet", str(damaged)), "train"))
  with pytest.raises(ValueError, match=rf"{good}: column text_field='n' holds int64, not text"):
    list(data.iter_documents(data.Corpus("parquet", str(good), text_field="n"), "train"))


def test_hf_stream_errors_name_the_dataset():
  corpus = data.Corpus("hf", "parquet", hf_data_files="/data/shard-7.parquet")

  def stream():
    yield {"text": "first"}
    raise OSError("Parquet magic bytes not found in footer")

  texts = hf._texts(stream(), corpus, "hf dataset 'parquet' split 'train'")
  assert next(texts) == "first"
  with pytest.raises(
    ValueError,
    match=r"split 'train': reading failed after 1 rows \(OSError: "
    r"Parquet magic.*shard-7.parquet",
  ):
    next(texts)


def test_unwritable_cache_dir_is_named(tmp_path):
  corpus = data.Corpus("text", write_corpus(tmp_path / "c", n_files=2, chars=200))
  (tmp_path / "file").write_text("a file where the cache directory should be\n")
  with pytest.raises(OSError, match=r"could not write the token cache .*file/tokens-text-train"):
    data.load_tokens(corpus, "train", BYTES, cache_dir=tmp_path / "file")


def test_guarded_reading_names_how_far_it_got_and_leaves_the_consumer_alone():
  def batches():
    yield [1, 2, 3]
    yield [4, 5]
    raise OSError("a torn page")

  def error(e, n):
    return ValueError(f"failed after {n} rows ({e})")

  got = files.guarded(batches(), error, count=len)
  assert next(got) == [1, 2, 3] and next(got) == [4, 5]
  with pytest.raises(ValueError, match=r"failed after 5 rows \(a torn page\)") as info:
    next(got)
  assert isinstance(info.value.__cause__, OSError)
  # Only errors of the kind asked for are turned, and only those raised while reading.
  with pytest.raises(OSError, match="a torn page"):
    list(files.guarded(batches(), error, catch=UnicodeDecodeError))
  with pytest.raises(KeyError):
    for _ in files.guarded(batches(), error):
      raise KeyError("the consumer's own")
