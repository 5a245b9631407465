"""Tokenizers: exact round trips, ids against independent references, caching, errors."""

import os
import sys

import numpy as np
import pytest

from rove_jax.data import tokenization
from rove_jax.data.tokenization import EOT_TEXT

TEXT = "héllo wörld — naïve café, 日本語 🎉\n\tdef f(x):\n    return x ** 2  # ok\n"

CORPUS = [
  "the quick brown fox jumps over the lazy dog. " * 3,
  "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
  "Grüße aus Köln! Ça va? 東京は大きい。",
  "the lazy dog sleeps; the quick fox runs away from the dog.\n",
] * 5


# ------------------------------------------------------------------------------------ bytes


def test_bytes_ids_are_utf8_bytes_and_round_trip():
  tok = tokenization.get_tokenizer("bytes")
  assert (tok.name, tok.vocab_size, tok.eot_id) == ("bytes", 257, 256)
  ids = tok.encode(TEXT)
  assert ids.dtype == np.int32
  np.testing.assert_array_equal(ids, list(TEXT.encode("utf-8")))
  assert tok.decode(ids) == TEXT
  assert tok.decode(ids.tolist()) == TEXT
  assert tok.encode("").size == 0 and tok.decode([]) == ""


def test_bytes_decode_invalid_utf8_is_replaced():
  tok = tokenization.ByteTokenizer()
  assert tok.decode([0xFF, ord("h"), ord("i")]) == "\ufffdhi"
  euro = list("€".encode("utf-8"))  # 3 bytes
  assert tok.decode(euro[:2] + [ord("!")]) == "\ufffd!"
  # A character cut by an end-of-text id is not glued back together across the boundary.
  assert tok.decode(euro[:1] + [256] + euro[1:]) == "\ufffd" + EOT_TEXT + "\ufffd\ufffd"
  assert tok.decode([ord("a"), 256, ord("b")]) == f"a{EOT_TEXT}b"


def test_bytes_decode_rejects_out_of_range_ids():
  with pytest.raises(ValueError, match=r"ids must be in \[0, 256\], got 300"):
    tokenization.ByteTokenizer().decode([1, 300])


def test_literal_eot_text_is_plain_text():
  tok = tokenization.ByteTokenizer()
  assert tok.eot_id not in tok.encode(f"a{EOT_TEXT}b")


# -------------------------------------------------------------------------------------- bpe


def test_bpe_trains_round_trips_and_is_cached(tmp_path):
  tok = tokenization.get_tokenizer("bpe:300", workdir=tmp_path, train_texts=CORPUS)
  path = tmp_path / "tokenizer-bpe-300.json"
  assert path.is_file()
  assert tok.name == "bpe:300"
  assert tok.vocab_size == 300  # 256 bytes + EOT + 43 merges fit this corpus
  assert tok.eot_id == 0 and tok.decode([tok.eot_id]) == EOT_TEXT
  for text in CORPUS[:4] + [TEXT, ""]:
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and (ids >= 0).all() and (ids < tok.vocab_size).all()
    assert tok.decode(ids) == text
  # Merges learned from the corpus compress it well below one token per byte.
  n_bytes = sum(len(t.encode()) for t in CORPUS)
  n_tokens = sum(tok.encode(t).size for t in CORPUS)
  assert n_tokens < 0.6 * n_bytes
  # A literal "<|endoftext|>" in a document is text, not the separator.
  assert tok.eot_id not in tok.encode(f"x {EOT_TEXT} y")
  assert tok.decode(tok.encode(f"x {EOT_TEXT} y")) == f"x {EOT_TEXT} y"

  def must_not_train():
    raise AssertionError("a cached tokenizer must not be retrained")

  again = tokenization.get_tokenizer(
    "bpe", workdir=tmp_path, vocab_size=300, train_texts=must_not_train
  )
  assert again.fingerprint == tok.fingerprint
  np.testing.assert_array_equal(again.encode(TEXT), tok.encode(TEXT))
  batch = again.encode_batch(CORPUS[:3])
  for ids, text in zip(batch, CORPUS[:3]):
    np.testing.assert_array_equal(ids, tok.encode(text))


def test_bpe_training_is_deterministic(tmp_path):
  a = tokenization.get_tokenizer("bpe:320", workdir=tmp_path / "a", train_texts=CORPUS)
  b = tokenization.get_tokenizer(
    "bpe:320", workdir=tmp_path / "b", train_texts=lambda: iter(CORPUS)
  )
  assert (tmp_path / "a" / "tokenizer-bpe-320.json").read_bytes() == (
    tmp_path / "b" / "tokenizer-bpe-320.json"
  ).read_bytes()
  assert a.fingerprint == b.fingerprint


def test_bpe_errors(tmp_path):
  with pytest.raises(ValueError, match="pass workdir"):
    tokenization.get_tokenizer("bpe", train_texts=CORPUS)
  with pytest.raises(ValueError, match="not trained yet .* no train_texts"):
    tokenization.get_tokenizer("bpe:512", workdir=tmp_path)
  with pytest.raises(ValueError, match="VOCAB must be an integer"):
    tokenization.get_tokenizer("bpe:big", workdir=tmp_path, train_texts=CORPUS)
  with pytest.raises(ValueError, match=r"vocab_size must be > 257 .* got 100"):
    tokenization.get_tokenizer("bpe:100", workdir=tmp_path, train_texts=CORPUS)
  with pytest.raises(ValueError, match="disagree"):
    tokenization.get_tokenizer("bpe:512", workdir=tmp_path, vocab_size=1024)


# ------------------------------------------------------------------------- tokenizer.json


def _write_tokenizer_json(path, special):
  """A byte-level BPE built directly with the tokenizers API (not through rove_jax)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(
    CORPUS,
    trainer=trainers.BpeTrainer(
      vocab_size=280,
      special_tokens=special,
      show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ),
  )
  tok.save(str(path))
  return tok


def test_tokenizer_json_path(tmp_path):
  path = tmp_path / "tokenizer.json"
  ref = _write_tokenizer_json(path, ["<pad>", "</s>"])
  tok = tokenization.get_tokenizer(str(path))
  assert tok.eot_id == ref.token_to_id("</s>") == 1  # found by its Llama/T5-style name
  assert tok.vocab_size == ref.get_vocab_size()
  ids = tok.encode(TEXT)
  np.testing.assert_array_equal(ids, ref.encode(TEXT).ids)
  assert tok.decode(ids) == TEXT
  assert tok.decode(np.concatenate([ids, [tok.eot_id]])) == TEXT + "</s>"
  from_dir = tokenization.get_tokenizer(str(tmp_path))  # a model directory holding the file
  assert from_dir.fingerprint == tok.fingerprint


def test_tokenizer_json_errors(tmp_path):
  with pytest.raises(ValueError, match="tokenizer file .*missing.json.* does not exist"):
    tokenization.get_tokenizer(str(tmp_path / "missing.json"))
  no_eot = tmp_path / "no_eot.json"
  _write_tokenizer_json(no_eot, [])
  with pytest.raises(ValueError, match="no end-of-text token"):
    tokenization.get_tokenizer(str(no_eot))
  broken = tmp_path / "broken.json"
  broken.write_text("{not json")
  with pytest.raises(ValueError, match="could not read the tokenizer file"):
    tokenization.get_tokenizer(str(broken))


def test_unknown_spec_lists_the_accepted_forms():
  with pytest.raises(
    ValueError,
    match=r"unknown tokenizer spec 'wordpiece'.*bytes.*bpe.*"
    r"tokenizer\.json.*tiktoken:NAME",
  ):
    tokenization.get_tokenizer("wordpiece")
  with pytest.raises(ValueError, match="non-empty string"):
    tokenization.get_tokenizer("")


# --------------------------------------------------------------------------------- tiktoken


def _tiny_tiktoken_encoding():
  tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is not installed (optional extra)")
  ranks = {bytes([i]): i for i in range(256)}
  ranks[b"th"], ranks[b"he"], ranks[b"the"] = 256, 257, 258
  pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
  return tiktoken.Encoding(
    name="tiny", pat_str=pattern, mergeable_ranks=ranks, special_tokens={EOT_TEXT: 259}
  )


def test_tiktoken_wrapper_round_trips_a_local_encoding():
  tok = tokenization.TiktokenTokenizer(_tiny_tiktoken_encoding())
  assert (tok.name, tok.vocab_size, tok.eot_id) == ("tiktoken:tiny", 260, 259)
  assert tok.encode("the").tolist() == [258]
  ids = tok.encode(TEXT + EOT_TEXT)
  assert tok.eot_id not in ids
  assert tok.decode(ids) == TEXT + EOT_TEXT
  assert tok.decode(list("€".encode())[:2]) == "\ufffd"


@pytest.mark.skipif(
  not os.environ.get("ROVE_JAX_NETWORK_TESTS"),
  reason="tiktoken:gpt2 downloads its files; set ROVE_JAX_NETWORK_TESTS=1",
)
def test_tiktoken_gpt2():
  pytest.importorskip("tiktoken")
  tok = tokenization.get_tokenizer("tiktoken:gpt2")
  assert (tok.vocab_size, tok.eot_id) == (50257, 50256)
  assert tok.encode("hello world").tolist() == [31373, 995]
  assert tok.decode(tok.encode(TEXT)) == TEXT


def test_tiktoken_errors_are_clear(monkeypatch):
  tiktoken = pytest.importorskip("tiktoken", reason="tiktoken is not installed (optional extra)")

  def offline(name):
    raise ConnectionError("no route to host")

  monkeypatch.setattr(tiktoken, "get_encoding", offline)
  with pytest.raises(
    RuntimeError, match="could not load the files of encoding 'gpt2'.*TIKTOKEN_CACHE_DIR"
  ):
    tokenization.get_tokenizer("tiktoken:gpt2")
  with pytest.raises(ValueError, match="lacks an encoding name"):
    tokenization.get_tokenizer("tiktoken:")


def test_tiktoken_missing_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "tiktoken", None)  # makes `import tiktoken` fail
  with pytest.raises(ImportError, match=r"pip install 'rove_jax\[tiktoken\]'"):
    tokenization.get_tokenizer("tiktoken:gpt2")
