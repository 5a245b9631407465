"""Tokenizers behind one small interface, chosen by a spec string.

Shape letters:
  N  number of tokens in one encoded text

Specs accepted by `get_tokenizer`:
  "bytes"              UTF-8 bytes 0..255 plus end-of-text 256 (vocab 257); no files, the default.
  "bpe" | "bpe:VOCAB"  byte-level BPE trained locally (HuggingFace `tokenizers`) on the training
                       split, saved to WORKDIR/tokenizer-bpe-VOCAB.json and reloaded from there,
                       so a resumed run encodes exactly as the first one did (WORKDIR may be
                       gs://bucket/path: the file goes through rove_jax.storage.paths).
  "PATH/tokenizer.json"  any HuggingFace tokenizer file (must define an end-of-text token), or
                       a directory holding one.
  "tiktoken:NAME"      a tiktoken encoding such as "tiktoken:gpt2" (the `tiktoken` extra; it
                       downloads its files on first use unless TIKTOKEN_CACHE_DIR holds them).

Every tokenizer encodes a text to int32 ids [N] *without* special tokens: a document that
contains the literal string "<|endoftext|>" is encoded as ordinary text, so the only
end-of-text ids in a token stream are the document separators the data pipeline inserts.
"""

from __future__ import annotations

import abc
import hashlib
import os
import sys
import time
from typing import Callable, Iterable, Optional, Sequence, Union

import numpy as np

from rove_jax.storage import paths

EOT_TEXT = "<|endoftext|>"
DEFAULT_BPE_VOCAB = 8192
# 256 byte symbols + the end-of-text token: the smallest vocabulary a byte-level BPE can have.
_MIN_BPE_VOCAB = 257
# End-of-text names tried, in order, on a tokenizer.json (GPT-2 / Llama-3 / T5 / Gemma styles).
_EOT_CANDIDATES = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "[SEP]")

SPEC_FORMS = (
  "bytes",
  "bpe",
  "bpe:VOCAB (e.g. bpe:8192)",
  "a path to a tokenizer.json file",
  "tiktoken:NAME (e.g. tiktoken:gpt2)",
)

Texts = Union[Iterable[str], Callable[[], Iterable[str]]]


class Tokenizer(abc.ABC):
  """Text <-> token ids. Ids are int32 in [0, vocab_size); eot_id separates documents."""

  name: str
  vocab_size: int
  eot_id: int

  @abc.abstractmethod
  def encode(self, text: str) -> np.ndarray:
    """Encodes text (special-token strings are treated as plain text).

    Returns:
      ids [N] int32.
    """

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """Encodes several texts; implementations may do it in parallel."""
    return [self.encode(t) for t in texts]

  @abc.abstractmethod
  def decode(self, ids) -> str:
    """Decodes ids (any int sequence); invalid UTF-8 becomes U+FFFD, never an exception."""

  @property
  @abc.abstractmethod
  def fingerprint(self) -> str:
    """A string that changes whenever the id mapping changes (used in token-cache keys)."""

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


# ------------------------------------------------------------------------------- bytes


class ByteTokenizer(Tokenizer):
  """UTF-8 bytes as ids 0..255 and end-of-text as 256."""

  name = "bytes"
  vocab_size = 257
  eot_id = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    ids_N = np.asarray(ids, dtype=np.int64).reshape(-1)
    bad = (ids_N < 0) | (ids_N > self.eot_id)
    if bad.any():
      raise ValueError(
        f"byte tokenizer ids must be in [0, {self.eot_id}], got {int(ids_N[bad][0])}; a model "
        f"whose vocabulary is padded past {self.vocab_size} can sample such ids: mask them"
      )
    # Decode each run between end-of-text ids on its own so a multi-byte character is never
    # stitched together across a document boundary.
    parts, start = [], 0
    for end in np.flatnonzero(ids_N == self.eot_id).tolist() + [ids_N.size]:
      parts.append(ids_N[start:end].astype(np.uint8).tobytes().decode("utf-8", errors="replace"))
      start = end + 1
    return EOT_TEXT.join(parts)

  @property
  def fingerprint(self) -> str:
    return "bytes-v1"


# ----------------------------------------------------------------------------- tokenizers


class HFTokenizer(Tokenizer):
  """A HuggingFace `tokenizers.Tokenizer` (from a tokenizer.json or trained by `train_bpe`)."""

  def __init__(self, tokenizer, *, name: str, eot_token: Optional[str] = None):
    self._tok = tokenizer
    # Documents are plain text: a literal "<|endoftext|>" inside one must not become the
    # separator id (tokenizers >= 0.19; older versions lack the switch and match specials).
    if hasattr(self._tok, "encode_special_tokens"):
      self._tok.encode_special_tokens = True
    self.name = name
    self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    candidates = (eot_token,) if eot_token else _EOT_CANDIDATES
    for candidate in candidates:
      eot = tokenizer.token_to_id(candidate)
      if eot is not None:
        self.eot_id = int(eot)
        self.eot_token = candidate
        break
    else:
      raise ValueError(
        f"tokenizer {name!r} has no end-of-text token: tried {list(candidates)}; add one of "
        f"them as a special token to the tokenizer.json"
      )
    self._fingerprint = "hf-" + hashlib.sha256(tokenizer.to_str().encode("utf-8")).hexdigest()

  @classmethod
  def from_file(cls, path: str, *, name: Optional[str] = None) -> "HFTokenizer":
    tokenizers = _import_tokenizers(f"loading {path}")
    try:
      tok = tokenizers.Tokenizer.from_file(os.fspath(path))
    except Exception as e:  # the Rust side raises a bare Exception for malformed files
      raise ValueError(f"could not read the tokenizer file {path!r}: {e}") from e
    return cls(tok, name=name or os.fspath(path))

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    # One call into Rust, which encodes the batch on all cores.
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

  def decode(self, ids) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
    return self._tok.decode(ids, skip_special_tokens=False)

  @property
  def fingerprint(self) -> str:
    return self._fingerprint

  def to_json(self) -> str:
    """The tokenizer.json text (what `from_file` reads back)."""
    return self._tok.to_str()

  @classmethod
  def from_json(cls, text: str, *, name: str) -> "HFTokenizer":
    tokenizers = _import_tokenizers(f"loading {name}")
    try:
      return cls(tokenizers.Tokenizer.from_str(text), name=name)
    except Exception as e:  # the Rust side raises a bare Exception for malformed files
      raise ValueError(f"could not read the tokenizer file {name!r}: {e}") from e


def train_bpe(texts: Iterable[str], vocab_size: int, *, show_progress: bool = False):
  """Trains a byte-level BPE (GPT-2 style pre-tokenization, no normalization) on texts.

  Args:
    texts: training documents; read once.
    vocab_size: target size including the 256 byte symbols and "<|endoftext|>" (id 0). A small
      corpus may yield fewer merges, hence a smaller vocabulary.

  Returns:
    a `tokenizers.Tokenizer`. Training is deterministic for the same texts and vocab_size.
  """
  _check_bpe_vocab(vocab_size)
  tokenizers = _import_tokenizers("training a bpe tokenizer")
  from tokenizers import decoders, models, pre_tokenizers, trainers

  tok = tokenizers.Tokenizer(models.BPE())
  # add_prefix_space=False keeps decode(encode(s)) == s exactly.
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=int(vocab_size),
    special_tokens=[EOT_TEXT],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=show_progress,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  return tok


def bpe_cache_path(workdir: str, vocab_size: int) -> str:
  """Where the `bpe:VOCAB` tokenizer of a run lives: WORKDIR/tokenizer-bpe-VOCAB.json (a local
  path or a gs:// URL, as workdir is)."""
  return paths.join(os.fspath(workdir), f"tokenizer-bpe-{int(vocab_size)}.json")


def _load_bpe_file(path: str, name: str) -> HFTokenizer:
  """The tokenizer saved at path (local: read by `tokenizers` itself; gs://: its bytes)."""
  if not paths.is_remote(path):
    return HFTokenizer.from_file(path, name=name)
  return HFTokenizer.from_json(paths.read_text(path), name=name)


# ------------------------------------------------------------------------------ tiktoken


class TiktokenTokenizer(Tokenizer):
  """A `tiktoken.Encoding` (e.g. GPT-2's 50257-token BPE)."""

  def __init__(self, encoding, *, name: Optional[str] = None):
    self._enc = encoding
    self.name = name or f"tiktoken:{encoding.name}"
    self.vocab_size = int(encoding.n_vocab)
    eot = getattr(encoding, "eot_token", None)
    if eot is None:
      raise ValueError(f"tiktoken encoding {encoding.name!r} has no end-of-text token")
    self.eot_id = int(eot)

  def encode(self, text: str) -> np.ndarray:
    # encode_ordinary: special-token strings are plain text (see the module docstring).
    return np.asarray(self._enc.encode_ordinary(text), dtype=np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    return [np.asarray(ids, dtype=np.int32) for ids in self._enc.encode_ordinary_batch(list(texts))]

  def decode(self, ids) -> str:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
    return self._enc.decode(ids, errors="replace")

  @property
  def fingerprint(self) -> str:
    return f"tiktoken-{self._enc.name}-{self.vocab_size}"


def load_tiktoken(name: str) -> TiktokenTokenizer:
  """Loads a named tiktoken encoding, with errors that say what to install or provide."""
  try:
    import tiktoken
  except ImportError as e:
    raise ImportError(
      f"tokenizer 'tiktoken:{name}' needs the tiktoken package: pip install 'rove_jax[tiktoken]'"
    ) from e
  try:
    encoding = tiktoken.get_encoding(name)
  except ValueError as e:  # unknown encoding name
    raise ValueError(f"tiktoken has no encoding {name!r}: {e}") from e
  except Exception as e:  # network / file errors from the download
    raise RuntimeError(
      f"tiktoken could not load the files of encoding {name!r} ({type(e).__name__}: {e}); "
      f"it downloads them on first use, so run once with network access or point "
      f"TIKTOKEN_CACHE_DIR at a directory that holds them"
    ) from e
  return TiktokenTokenizer(encoding, name=f"tiktoken:{name}")


# ------------------------------------------------------------------------------- factory


def get_tokenizer(
  spec: str = "bytes",
  *,
  workdir: Optional[str] = None,
  train_texts: Optional[Texts] = None,
  vocab_size: Optional[int] = None,
) -> Tokenizer:
  """Builds the tokenizer named by spec (see the module docstring for the forms).

  Args:
    spec: "bytes", "bpe", "bpe:VOCAB", a path to a tokenizer.json, or "tiktoken:NAME".
    workdir: for "bpe": the directory holding the trained tokenizer file.
    train_texts: for "bpe" when no trained file exists yet: the training documents, or a
      zero-argument callable returning them (called only if training is needed).
    vocab_size: for "bpe": the vocabulary size (default 8192; "bpe:VOCAB" sets it too).

  Returns:
    a `Tokenizer`.
  """
  if not isinstance(spec, str) or not spec:
    raise ValueError(
      f"tokenizer spec must be a non-empty string, got {spec!r}; expected "
      f"one of: {', '.join(SPEC_FORMS)}"
    )
  if spec == "bytes":
    return ByteTokenizer()
  if spec == "bpe" or spec.startswith("bpe:"):
    return _get_bpe(spec, workdir=workdir, train_texts=train_texts, vocab_size=vocab_size)
  if spec.startswith("tiktoken:"):
    name = spec[len("tiktoken:") :]
    if not name:
      raise ValueError("tokenizer spec 'tiktoken:' lacks an encoding name, e.g. tiktoken:gpt2")
    return load_tiktoken(name)
  if paths.is_remote(spec) and spec.endswith(".json"):  # e.g. a pretrained model's, on GCS
    return HFTokenizer.from_json(paths.read_text(spec), name=spec)
  if os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "tokenizer.json")):
    spec = os.path.join(spec, "tokenizer.json")  # a HuggingFace model directory
  if spec.endswith(".json") or os.path.isfile(spec):
    if not os.path.isfile(spec):
      raise ValueError(
        f"tokenizer file {spec!r} does not exist; expected a path to a HuggingFace tokenizer.json"
      )
    return HFTokenizer.from_file(spec)
  raise ValueError(f"unknown tokenizer spec {spec!r}; expected one of: {', '.join(SPEC_FORMS)}")


def _get_bpe(spec, *, workdir, train_texts, vocab_size) -> HFTokenizer:
  size = DEFAULT_BPE_VOCAB
  if spec.startswith("bpe:"):
    text = spec[len("bpe:") :]
    try:
      size = int(text)
    except ValueError:
      raise ValueError(
        f"tokenizer spec {spec!r}: VOCAB must be an integer, e.g. bpe:8192"
      ) from None
    if vocab_size is not None and int(vocab_size) != size:
      raise ValueError(
        f"tokenizer spec {spec!r} and vocab_size={vocab_size} disagree; give the size once"
      )
  elif vocab_size is not None:
    size = int(vocab_size)
  _check_bpe_vocab(size)
  if workdir is None:
    raise ValueError(
      f"tokenizer {spec!r} is trained once and cached in the run directory: pass workdir"
    )
  path = bpe_cache_path(workdir, size)
  name = f"bpe:{size}"
  if paths.isfile(path):
    _log(f"reusing the {name} tokenizer at {path}")
    return _load_bpe_file(path, name)
  if train_texts is None:
    raise ValueError(
      f"tokenizer {spec!r} is not trained yet (no {path}) and no train_texts "
      f"were given to train it on"
    )
  texts = train_texts() if callable(train_texts) else train_texts
  _log(f"training the {name} tokenizer (byte-level BPE) ...")
  start = time.perf_counter()
  tok = train_bpe(texts, size, show_progress=sys.stderr.isatty())
  # Atomic publish (a temporary file renamed locally, one upload on GCS): a crash mid-write
  # must not leave a truncated file that a resume would load.
  paths.write_atomic(path, tok.to_str(pretty=True))
  _log(
    f"trained {name} (vocab {tok.get_vocab_size()}) in {time.perf_counter() - start:.1f} s "
    f"-> {path}"
  )
  # Reload from the file so a first run and a resumed run use byte-identical tokenizers.
  return _load_bpe_file(path, name)


def _check_bpe_vocab(vocab_size) -> None:
  if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
    raise ValueError(f"bpe vocab_size must be an int, got {vocab_size!r}")
  if vocab_size <= _MIN_BPE_VOCAB:
    raise ValueError(
      f"bpe vocab_size must be > {_MIN_BPE_VOCAB} (256 bytes + end-of-text), got {vocab_size}"
    )


def _import_tokenizers(why: str):
  try:
    import tokenizers
  except ImportError as e:
    raise ImportError(f"{why} needs the tokenizers package: pip install 'rove_jax[data]'") from e
  return tokenizers


def _log(message: str) -> None:
  print(f"[rove_jax.data.tokenization] {message}", file=sys.stderr, flush=True)
