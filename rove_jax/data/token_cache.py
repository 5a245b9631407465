"""Documents -> one flat token array per split, cached on disk as tokens-*.npy.

Token arrays put tokenizer.eot_id after every document. A cache file is named by a hash of
everything that decides its contents (corpus, split, tokenizer fingerprint, max_tokens, the
files with their sizes and times, the Python version for the stdlib), so editing the data or
switching tokenizers never reads stale tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
import uuid
from typing import Any, Iterable, Optional

import numpy as np

from rove_jax.data.sources import Corpus, check_split, iter_documents, list_units
from rove_jax.tokenization import Tokenizer

_CACHE_FORMAT = 1
_ENCODE_CHUNK_CHARS = 1 << 20  # texts handed to encode_batch at once (parallel in tokenizers)


def load_tokens(corpus: Corpus, split: str, tokenizer: Tokenizer, *,
                cache_dir: Optional[str] = None, max_tokens: Optional[int] = None) -> np.ndarray:
  """Tokenizes a split into one flat array, eot_id after each document, cached on disk.

  Args:
    corpus: the `Corpus`.
    split: "train" or "val".
    tokenizer: a `tokenization.Tokenizer`.
    cache_dir: where to keep tokens-*.npy (keyed by corpus, files, split, tokenizer and
      max_tokens); a later call memory-maps it instead of tokenizing. None: no cache.
    max_tokens: stop after this many tokens (needed for huge hf streams).

  Returns:
    tokens [N]: uint16 when tokenizer.vocab_size <= 65536, else int32 (a read-only memmap when
    cached). Batches convert windows to int32.
  """
  check_split(split)
  if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
      max_tokens, (int, np.integer)) or max_tokens < 1):
    raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}")
  label = f"{corpus.source} corpus {corpus.path or '(stdlib)'} split {split!r}"
  path = None
  if cache_dir is not None:
    key = cache_key(corpus, split, tokenizer, max_tokens)
    path = os.path.join(os.fspath(cache_dir), f"tokens-{corpus.source}-{split}-{key[:20]}.npy")
    if os.path.isfile(path):
      tokens = np.load(path, mmap_mode="r")
      log(f"{label}: {tokens.size} cached tokens from {path}")
      return tokens
  tokens = _tokenize(iter_documents(corpus, split), tokenizer, max_tokens, label)
  if tokens.size == 0:
    raise ValueError(f"{label} is empty: no non-empty documents were found; check path and "
                     f"text_field={corpus.text_field!r}")
  if path is None:
    return tokens
  os.makedirs(os.path.dirname(path), exist_ok=True)
  # Atomic publish: concurrent processes or a crash never expose a half-written file.
  tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
  with open(tmp, "wb") as f:
    np.save(f, tokens)
  os.replace(tmp, path)
  return np.load(path, mmap_mode="r")


def cache_key(corpus: Corpus, split: str, tokenizer: Tokenizer, max_tokens) -> str:
  """The hex sha256 of what decides a split's tokens (see the module docstring)."""
  desc: dict[str, Any] = {"format": _CACHE_FORMAT, "corpus": dataclasses.asdict(corpus),
                          "split": split, "tokenizer": tokenizer.fingerprint,
                          "max_tokens": max_tokens}
  if corpus.source == "stdlib":
    desc["python"] = sys.version
  if corpus.source != "hf":
    # Which files, their sizes and times: editing the data invalidates the cache.
    units, val_units = list_units(corpus)
    desc["files"] = [(u.key, u.stamp) for u in units + (val_units or [])]
  blob = json.dumps(desc, sort_keys=True, default=list).encode("utf-8")
  return hashlib.sha256(blob).hexdigest()


def _tokenize(docs: Iterable[str], tokenizer: Tokenizer, max_tokens, label) -> np.ndarray:
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
  eot = np.array([tokenizer.eot_id], dtype=dtype)
  chunks, pending, pending_chars = [], [], 0
  n_docs = n_chars = n_tokens = 0
  start = last_log = time.perf_counter()
  log(f"{label}: tokenizing with {tokenizer.name} ...")

  def flush():
    nonlocal n_tokens
    pieces = []
    for ids in tokenizer.encode_batch(pending):
      pieces += [ids.astype(dtype), eot]
    chunks.append(np.concatenate(pieces))
    n_tokens += chunks[-1].size
    pending.clear()

  for doc in docs:
    pending.append(doc)
    pending_chars += len(doc)
    n_docs += 1
    n_chars += len(doc)
    if pending_chars >= _ENCODE_CHUNK_CHARS:
      flush()
      pending_chars = 0
      if time.perf_counter() - last_log > 10:
        last_log = time.perf_counter()
        log(f"{label}: {n_docs} documents, {n_chars / 1e6:.1f} M characters, {n_tokens} tokens")
      if max_tokens is not None and n_tokens >= max_tokens:
        break
  if pending:
    flush()
  tokens = np.concatenate(chunks) if chunks else np.zeros((0,), dtype)
  if max_tokens is not None:
    tokens = tokens[:max_tokens]
  log(f"{label}: {n_docs} documents, {n_chars / 1e6:.1f} M characters -> {tokens.size} tokens "
      f"in {time.perf_counter() - start:.1f} s")
  return tokens


def log(message: str) -> None:
  """Progress on stderr, tagged [rove_jax.data]."""
  print(f"[rove_jax.data] {message}", file=sys.stderr, flush=True)
