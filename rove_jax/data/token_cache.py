"""Documents -> one flat token array per split, cached on disk as tokens-*.npy.

Token arrays put tokenizer.eot_id after every document. A cache file is named by a hash of
everything that decides its contents (corpus, split, tokenizer fingerprint, max_tokens, the
files with their sizes and times, the Python version for the stdlib), so editing the data or
switching tokenizers never reads stale tokens.

Beside each tokens-*.npy sits its record, tokens-*.json: the full cache key, the number of
tokens, their dtype, the file's size and the sha256 of the token bytes. Loading checks the
record against the file's size, .npy header and digest (one read of the file, far cheaper than
tokenizing it again), so damaged tokens are never trained on; a missing, damaged or mismatched
cache is reported on stderr, naming the file and the problem, and rebuilt from the sources (readers
that pass write_cache=False tokenize in memory instead and write nothing). Both files
are written atomically (`paths.write_atomic`: a temporary file renamed locally, one upload on
GCS), the record after the data, so a build killed half-way never leaves a cache that
validates.

The cache directory may be local or gs://bucket/path (a workdir on GCS): a local cache is
memory-mapped (np.load mmap_mode="r"); a remote one is downloaded whole, checked the same way
and loaded from its bytes.

The record's sha256 is also the split's identity (`load_tokens_and_sha256`,
`pipeline.Data.identity`): equal tokens, equal digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import sys
import time
from typing import Any, Iterable, Optional

import numpy as np

from rove_jax.data import prepared
from rove_jax.data.sources import Corpus, check_split, iter_documents, list_units
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import paths

_CACHE_FORMAT = 1  # part of the cache key: bumping it renames (rebuilds) every cache
_RECORD_FORMAT = 2  # 2: the record holds the sha256 of the tokens
_ENCODE_CHUNK_CHARS = 1 << 20  # texts handed to encode_batch at once (parallel in tokenizers)


def load_tokens(
  corpus: Corpus,
  split: str,
  tokenizer: Tokenizer,
  *,
  cache_dir: Optional[str] = None,
  max_tokens: Optional[int] = None,
  write_cache: bool = True,
) -> np.ndarray:
  """Tokenizes a split into one flat array, eot_id after each document, cached on disk.

  Args:
    corpus: the `Corpus`.
    split: "train" or "val".
    tokenizer: a `tokenization.Tokenizer`.
    cache_dir: where to keep tokens-*.npy (keyed by corpus, files, split, tokenizer and
      max_tokens), a local path or gs:// URL; a later call reads it instead of tokenizing.
      None: no cache.
    max_tokens: stop after this many tokens (needed for huge hf streams).
    write_cache: False for readers of another process's directory (evaluation of a training
      workdir): a valid cache is read, but a missing or unusable one is neither built nor
      replaced; the split is tokenized in memory and nothing is written.

  Returns:
    tokens [N]: uint16 when tokenizer.vocab_size <= 65536, else int32 (read-only: a memmap of a
    local cache, the loaded bytes of a remote one). Batches convert windows to int32. A
    "prepared" corpus is read from its shards (`prepared.load`: uint16 or uint32, a memmap or
    a `prepared.ShardedTokens`).
  """
  if corpus.source == "prepared":  # tokenized already: memory-mapped, no cache
    _check_request(split, max_tokens)
    return prepared.load(corpus.path, split, tokenizer, max_tokens=max_tokens)
  return load_tokens_and_sha256(
    corpus, split, tokenizer, cache_dir=cache_dir, max_tokens=max_tokens, write_cache=write_cache
  )[0]


def load_tokens_and_sha256(
  corpus: Corpus,
  split: str,
  tokenizer: Tokenizer,
  *,
  cache_dir: Optional[str] = None,
  max_tokens: Optional[int] = None,
  write_cache: bool = True,
) -> tuple[np.ndarray, str]:
  """`load_tokens` and the hex sha256 of the tokens' bytes (native uint16 / int32, in order):
  the digest the cache record stores (checked against the file when read), or computed when
  the split was tokenized without a cache. Not for a "prepared" corpus, whose identity is its
  manifest's (`prepared.identity`).

  Args:
    corpus, split, tokenizer, cache_dir, max_tokens, write_cache: as for `load_tokens`.

  Returns:
    (tokens [N], sha256 hex string).
  """
  _check_request(split, max_tokens)
  if corpus.source == "prepared":
    raise ValueError(
      "a prepared corpus is read with load_tokens (its identity is "
      "prepared.identity of its manifest)"
    )
  label = f"{corpus.source} corpus {corpus.path or '(stdlib)'} split {split!r}"
  dtype = token_dtype(tokenizer)
  path = key = None
  if cache_dir is not None:
    cache_dir = paths.resolve(cache_dir, what="token cache directory")
    key = cache_key(corpus, split, tokenizer, max_tokens)
    path = paths.join(cache_dir, f"tokens-{corpus.source}-{split}-{key[:20]}.npy")
    if paths.exists(path):
      tokens, digest, problem = _read_cache(path, key, dtype)
      if problem is None:
        log(f"{label}: {tokens.size} cached tokens from {path}")
        return tokens, digest
      action = (
        "rebuilding it from the sources"
        if write_cache
        else "tokenizing the sources in memory (the cache is left as it is)"
      )
      log(f"WARNING: token cache {path} is unusable: {problem}; {action}")
  tokens = _tokenize(iter_documents(corpus, split), tokenizer, max_tokens, label)
  if tokens.size == 0:
    raise ValueError(
      f"{label} is empty: no non-empty documents were found; check path and "
      f"text_field={corpus.text_field!r}"
    )
  if path is None or not write_cache:
    return tokens, tokens_sha256(tokens)
  return _write_cache(
    path, tokens, {"key": key, "tokenizer": tokenizer.fingerprint, "corpus": label}
  )


def _check_request(split, max_tokens) -> None:
  check_split(split)
  if max_tokens is not None and (
    isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1
  ):
    raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}")


def tokens_sha256(tokens: np.ndarray) -> str:
  """The hex sha256 of a token array's bytes (C order, its own dtype)."""
  return hashlib.sha256(memoryview(np.ascontiguousarray(tokens)).cast("B")).hexdigest()


def token_dtype(tokenizer: Tokenizer) -> np.dtype:
  """uint16 when the tokenizer's ids fit in it, else int32."""
  return np.dtype(np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32)


def record_path(path: str) -> str:
  """The record (tokens-*.json) that vouches for the token cache file path (tokens-*.npy)."""
  return os.path.splitext(path)[0] + ".json"


def _read_cache(path: str, key: str, dtype) -> tuple[Any, Optional[str], Optional[str]]:
  """(tokens, sha256, None) from a cache its record vouches for, else (None, None, problem).
  A local file is memory-mapped; a remote one is downloaded once, then checked and loaded from
  those bytes."""
  blob = None
  if paths.is_remote(path):
    try:
      blob = paths.read_bytes(path)
    except OSError as e:
      return None, None, f"it could not be read ({type(e).__name__}: {e})"
  record = {}
  problem = cache_problem(path, key, dtype, blob=blob, record_out=record)
  if problem is not None:
    return None, None, problem
  try:
    if blob is None:
      tokens = np.load(path, mmap_mode="r")
    else:
      tokens = np.load(io.BytesIO(blob))
      tokens.flags.writeable = False  # read-only, as a memory-mapped cache is
  except (OSError, ValueError) as e:
    return None, None, f"it could not be read ({type(e).__name__}: {e})"
  return tokens, record["sha256"], None


def cache_problem(
  path: str, key: str, dtype, *, blob: Optional[bytes] = None, record_out: Optional[dict] = None
) -> Optional[str]:
  """Why the cache file path cannot be used for key, or None when its record vouches for it.

  Args:
    path: a tokens-*.npy file (local path or gs:// URL).
    key: the full `cache_key` its tokens must have been built for.
    dtype: the token dtype the tokenizer needs.
    blob: the file's bytes when the caller has read them already (a remote cache); None: the
      file is read from path.
    record_out: a dict that receives the record when the cache is usable.

  Returns:
    None, or what is wrong (missing or mismatched record, wrong size, .npy header or digest of
    the token bytes).
  """
  rec_path = record_path(path)
  try:
    record = json.loads(paths.read_bytes(rec_path))
  except FileNotFoundError:
    return (
      f"its record {rec_path} is missing (it is written last, so the build was "
      f"interrupted, or the cache predates these records)"
    )
  except (OSError, ValueError) as e:
    return f"its record {rec_path} is unreadable ({type(e).__name__}: {e})"
  if not isinstance(record, dict):
    return f"its record {rec_path} is not a JSON object"
  want = {"format": _RECORD_FORMAT, "key": key, "dtype": np.dtype(dtype).name}
  for name, value in want.items():
    if record.get(name) != value:
      return f"its record {rec_path} has {name}={record.get(name)!r}, expected {value!r}"
  n = record.get("tokens")
  try:
    size = len(blob) if blob is not None else paths.size(path)
  except OSError as e:
    return f"it could not be read ({type(e).__name__}: {e})"
  if record.get("bytes") != size:
    return (
      f"the file has {size} bytes but its record says {record.get('bytes')!r} (truncated "
      f"or overwritten)"
    )
  try:
    with io.BytesIO(blob) if blob is not None else paths.open_read(path) as f:
      version = np.lib.format.read_magic(f)
      read_header = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
      }.get(version)
      if read_header is None:
        return f"its .npy format version {version} is not one np.save writes here"
      shape, fortran, file_dtype = read_header(f)
      data_start = f.tell()
  except (OSError, ValueError) as e:
    return f"its .npy header is unreadable ({type(e).__name__}: {e})"
  if shape != (n,) or fortran or file_dtype != np.dtype(dtype):
    return f"its .npy header says {file_dtype} {shape}, its record {record.get('dtype')} ({n},)"
  if data_start + n * np.dtype(dtype).itemsize != size:
    return f"{size} bytes cannot hold the header and {n} {np.dtype(dtype).name} tokens"
  try:
    digest = (
      hashlib.sha256(memoryview(blob)[data_start:]).hexdigest()
      if blob is not None
      else prepared.file_sha256(path, data_start)
    )
  except OSError as e:
    return f"it could not be read ({type(e).__name__}: {e})"
  if digest != record.get("sha256"):
    return "its tokens fail the sha256 in its record (the file was damaged or overwritten)"
  if record_out is not None:
    record_out.update(record)
  return None


def _write_cache(path: str, tokens: np.ndarray, record: dict[str, Any]) -> tuple[Any, str]:
  """Writes tokens and then their record; returns (the cached tokens, their sha256)."""
  rec_path = record_path(path)
  digest = tokens_sha256(tokens)
  try:
    paths.makedirs(paths.dirname(path))
    # A stale record must not vouch for a file that a killed build leaves behind.
    paths.remove(rec_path)
    size = paths.write_atomic(path, lambda f: np.save(f, tokens))
    record = {
      "format": _RECORD_FORMAT,
      **record,
      "tokens": int(tokens.size),
      "dtype": tokens.dtype.name,
      "bytes": size,
      "sha256": digest,
    }
    paths.write_atomic(rec_path, json.dumps(record, indent=1))
  except OSError as e:
    raise OSError(
      f"could not write the token cache {path} ({type(e).__name__}: {e}); free disk "
      f"space or make its directory writable, or use another workdir"
    ) from e
  if paths.is_remote(path):  # the array in hand is what was uploaded
    tokens.flags.writeable = False
    return tokens, digest
  return np.load(path, mmap_mode="r"), digest


def cache_key(corpus: Corpus, split: str, tokenizer: Tokenizer, max_tokens) -> str:
  """The hex sha256 of what decides a split's tokens (see the module docstring)."""
  desc: dict[str, Any] = {
    "format": _CACHE_FORMAT,
    "corpus": dataclasses.asdict(corpus),
    "split": split,
    "tokenizer": tokenizer.fingerprint,
    "max_tokens": max_tokens,
  }
  if corpus.source == "stdlib":
    desc["python"] = sys.version
  if corpus.source != "hf":
    # Which files, their sizes and times: editing the data invalidates the cache.
    units, val_units = list_units(corpus)
    desc["files"] = [(u.key, u.stamp) for u in units + (val_units or [])]
  blob = json.dumps(desc, sort_keys=True, default=list).encode("utf-8")
  return hashlib.sha256(blob).hexdigest()


def _tokenize(docs: Iterable[str], tokenizer: Tokenizer, max_tokens, label) -> np.ndarray:
  dtype = token_dtype(tokenizer)
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
  log(
    f"{label}: {n_docs} documents, {n_chars / 1e6:.1f} M characters -> {tokens.size} tokens "
    f"in {time.perf_counter() - start:.1f} s"
  )
  return tokens


def log(message: str) -> None:
  """Progress on stderr, tagged [rove_jax.data]."""
  print(f"[rove_jax.data] {message}", file=sys.stderr, flush=True)
