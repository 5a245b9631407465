"""Prepared datasets: a corpus tokenized once (`rove-prepare`, rove_jax.data.prepare_corpus)
into memory-mapped shards that training reads without tokenizing again (source "prepared").
The directory's files and its manifest: rove_jax.data.prepared_format (read_manifest,
identity, DamagedDataset and check_tokenizer are also this module's).

A split's token stream (its shards concatenated) is what `load_tokens` makes of the same corpus
and tokenizer: the documents of `sources.iter_documents` (the corpus's own train/val split),
eot_id after each, cut at max_tokens. It is cut into shards of tokens_per_shard tokens (the
last one shorter): a document may go on in the next shard.

Checks: every open compares each shard's size with the manifest (cheap); `verify` hashes the
shards (sha256), each process its share; a training run checks every shard it reads at every
start (`shard_check`: hashed once per machine, then again only when its file changed since).
Errors name the damaged shard and the fix (rerunning the manifest's command finds and rewrites
damaged shards).

Reading: `load(path, split, tokenizer)` refuses a tokenizer whose fingerprint differs from the
manifest's and returns the split as one flat read-only token array: a np.memmap (one shard) or
a `ShardedTokens` (several). A slice reads only the pages it covers, so a training process,
which gathers only the windows of its own rows (pipeline.train_iterator), reads only those.

On Google Cloud Storage: the directory may be gs://bucket/path. The manifest is read from
there; a shard is copied once into a local cache (`paths.local_copy`: ~/.cache/rove_jax/remote
or $XDG_CACHE_HOME/rove_jax/remote, reused while the object is unchanged) and memory-mapped from
it; `verify` and `shard_check` hash those local copies, which are what training reads.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import numpy as np

from rove_jax.data import shard_check, tokenization
from rove_jax.data.prepared_format import (
  DTYPES,
  DamagedDataset,
  check_tokenizer,
  fix_hint,
  identity,
  read_manifest,
)
from rove_jax.data.shard_check import file_sha256  # noqa: F401 - also this module's
from rove_jax.data.sources import SPLITS, check_split
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import errors as storage_errors
from rove_jax.storage import paths


class ShardedTokens:
  """A read-only flat token array [N] over memory-mapped shards, read only where sliced.

  Supports what the pipeline asks of a token array: size, shape, ndim, dtype, len(), integer
  indexing and slices with step 1 (a slice within one shard is a view of its memmap, one
  across shards a copy of the pieces). np.asarray(x) reads the whole array.
  """

  ndim = 1

  def __init__(self, parts: list[np.ndarray], size: Optional[int] = None):
    if not parts:
      raise ValueError("ShardedTokens needs at least one shard")
    self._parts = list(parts)
    self._starts = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    total = int(self._starts[-1])
    self.size = total if size is None else min(int(size), total)
    self.dtype = parts[0].dtype

  @property
  def shape(self) -> tuple[int]:
    return (self.size,)

  def __len__(self) -> int:
    return self.size

  def head(self, n: int) -> "ShardedTokens":
    """The first n tokens (all if there are fewer), without reading any."""
    return ShardedTokens(self._parts, min(int(n), self.size))

  def __getitem__(self, key):
    if isinstance(key, (int, np.integer)):
      i = int(key) + (self.size if key < 0 else 0)
      if not 0 <= i < self.size:
        raise IndexError(f"index {int(key)} is out of range for {self.size} tokens")
      k = int(np.searchsorted(self._starts, i, side="right")) - 1
      return self._parts[k][i - self._starts[k]]
    if not isinstance(key, slice):
      raise TypeError(f"ShardedTokens takes an int or a slice, got {type(key).__name__}")
    start, stop, step = key.indices(self.size)
    if step != 1:
      raise IndexError("ShardedTokens slices take step 1 only")
    if stop <= start:
      return np.zeros((0,), self.dtype)
    first = int(np.searchsorted(self._starts, start, side="right")) - 1
    last = int(np.searchsorted(self._starts, stop - 1, side="right")) - 1
    pieces = [
      self._parts[k][max(start - self._starts[k], 0) : stop - self._starts[k]]
      for k in range(first, last + 1)
    ]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

  def __array__(self, dtype=None, copy=None):
    whole = np.asarray(self[0 : self.size])
    return whole if dtype is None else whole.astype(dtype)

  def __repr__(self) -> str:
    return f"ShardedTokens({self.size} {self.dtype.name} tokens in {len(self._parts)} shards)"


# --------------------------------------------------------------------------------- reading


def load(path: str, split: str, tokenizer: Tokenizer, *, max_tokens: Optional[int] = None) -> Any:
  """One split of a prepared dataset as a flat read-only token array.

  Args:
    path: the prepared directory (local, or gs://: the shards read are copied to the local
      cache once, see the module docstring).
    split: "train" or "val".
    tokenizer: the run's tokenizer; its fingerprint must be the manifest's.
    max_tokens: the first max_tokens tokens only (None: all).

  Returns:
    tokens [N]: a read-only np.memmap (one shard) or a `ShardedTokens`, uint16 or uint32.
  """
  check_split(split)
  path = paths.resolve(path, what="prepared dataset")
  return _load(path, read_manifest(path), split, tokenizer, max_tokens)


def _load(
  path: str, manifest: dict, split: str, tokenizer: Tokenizer, max_tokens: Optional[int]
) -> Any:
  check_tokenizer(manifest, tokenizer, path)
  dtype = DTYPES[manifest["dtype"]]
  shards = manifest["splits"][split]["shards"]
  if max_tokens is not None:  # only the shards the cap reaches
    keep, total = [], 0
    for shard in shards:
      if total >= max_tokens:
        break
      keep.append(shard)
      total += shard["tokens"]
    shards = keep
  parts = [np.memmap(_local(path, s), dtype=dtype, mode="r", shape=(s["tokens"],)) for s in shards]
  tokens = parts[0] if len(parts) == 1 else ShardedTokens(parts)
  if max_tokens is not None:
    tokens = tokens[:max_tokens] if len(parts) == 1 else tokens.head(max_tokens)
  _log(f"prepared dataset {path} split {split!r}: {tokens.size} tokens in {len(parts)} shards")
  return tokens


def verify(
  path: str, *, process_index: int = 0, process_count: int = 1, log=None, cache_remote: bool = True
) -> int:
  """Hashes shards of a prepared directory against their sha256 in the manifest.

  The shards (train's, then val's) are dealt round-robin over process_count processes: this
  process hashes those whose position i has i % process_count == process_index, so that the
  processes of a run share the work and together check every shard once.

  Args:
    path: the prepared directory (local or gs://).
    process_index, process_count: this process's share of the shards.
    log: a function of one string for progress lines (default: stderr).
    cache_remote: gs:// only: hash the local copies `load` memory-maps (made now if missing;
      a copy that fails is fetched again once, so a damaged cache is not taken for a damaged
      dataset); False: stream and hash the objects themselves, keeping nothing (rove-prepare).

  Returns:
    the number of shards hashed. Raises DamagedDataset naming the first bad shard and the fix.
  """
  path = paths.resolve(path, what="prepared dataset")
  return _verify(path, read_manifest(path), process_index, process_count, log or _log, cache_remote)


def _verify(path, manifest, process_index, process_count, log, cache_remote) -> int:
  shards = [s for split in SPLITS for s in manifest["splits"][split]["shards"]]
  mine = shards[process_index::process_count]
  total = sum(s["bytes"] for s in mine)
  log(
    f"verifying {len(mine)} of the {len(shards)} shards of {path} ({total / 2**20:.1f} MiB, sha256)"
  )
  for shard in mine:
    file = paths.join(path, shard["file"])
    if paths.is_remote(file) and cache_remote:
      ok = file_sha256(_local(path, shard, log)) == shard["sha256"]
      if not ok:  # perhaps only the local copy is damaged: fetch it once more
        os.remove(_local(path, shard, log))
        ok = file_sha256(_local(path, shard, log)) == shard["sha256"]
    else:
      ok = file_sha256(file) == shard["sha256"]
    if not ok:
      raise DamagedDataset(
        f"shard {file} does not match its sha256 in the manifest (its "
        f"contents changed: damaged on disk or in a copy); "
        f"{fix_hint(manifest)}"
      )
  return len(mine)


def _local(path: str, shard: dict, log=None) -> str:
  """A local file holding the shard: itself, or for gs:// its copy in the local cache."""
  return shard_check.local_file(path, shard, log or _log)


def check_for_run(
  path: str,
  manifest: dict,
  *,
  process_index: int = 0,
  process_count: int = 1,
  allow_changed: bool = False,
) -> None:
  """Checks every shard a run reads (`shard_check.check`: each hashed once per machine, then
  again only when its file changed).

  Raises:
    DamagedDataset: a shard does not match its sha256, unless allow_changed (then a warning is
      logged for each); the message names the first and the fix.
  """
  _, bad = shard_check.check(
    path, manifest, process_index=process_index, process_count=process_count, log=_log
  )
  for shard in bad:
    file = paths.join(path, shard["file"])
    if allow_changed:
      _log(
        f"WARNING: shard {file} does not match its sha256 in the manifest; training on it "
        f"as it is (data.allow_changed=True)"
      )
      continue
    copy = " (a fresh local copy of it too)" if paths.is_remote(file) else ""
    raise DamagedDataset(
      f"shard {file}{copy} does not match its sha256 in the manifest: it changed after "
      f"rove-prepare wrote it. To train on what the run began with, {fix_hint(manifest)}; "
      f"to train on it as it is, pass --config.data.allow_changed=True"
    )


def for_run(
  path: str,
  spec: str,
  *,
  workdir: str,
  verify_shards: bool = True,
  allow_changed: bool = False,
  process_index: int = 0,
  process_count: int = 1,
  max_train_tokens: Optional[int] = None,
  max_val_tokens: Optional[int] = None,
) -> tuple[Tokenizer, Any, Any, dict]:
  """A training run's tokenizer, token arrays and data identity from a prepared directory.

  A "bpe" spec's tokenizer file is copied from the dataset into workdir when workdir has none
  (evaluation and resumed runs load it from there); the tokenizer must then be the dataset's.
  The manifest is read once: the arrays and the identity describe the same dataset.

  Args:
    path: the prepared directory (local or gs://).
    spec: the run's tokenizer spec (data.tokenizer).
    workdir: the run directory (local or gs://).
    verify_shards: check every shard first (`check_for_run`).
    allow_changed: a shard that does not match its sha256 is a warning, not an error.
    process_index, process_count: this process and how many there are.
    max_train_tokens, max_val_tokens: caps, as for `load_tokens`.

  Returns:
    (tokenizer, train tokens, val tokens, identity): `identity(manifest, path)`, plus
    "max_tokens": {"train": cap, "val": cap} when a cap is set (it shortens the streams).
  """
  path = paths.resolve(path, what="prepared dataset")
  workdir = paths.resolve(workdir, what="workdir")
  manifest = read_manifest(path)
  want = manifest["tokenizer"]
  file = want.get("file")
  if file and _bpe_file(spec) == file and not paths.exists(paths.join(workdir, file)):
    paths.write_atomic(paths.join(workdir, file), paths.read_bytes(paths.join(path, file)))
    _log(f"copied the dataset's tokenizer {file} from {path} into {workdir}")

  def not_trained():
    raise ValueError(
      f"the prepared dataset {path} was tokenized with {want['spec']!r}; a run on "
      f"it needs that tokenizer: set --config.data.tokenizer={want['spec']}"
    )

  tok = tokenization.get_tokenizer(spec, workdir=workdir, train_texts=not_trained)
  check_tokenizer(manifest, tok, path)
  if verify_shards:
    check_for_run(
      path,
      manifest,
      process_index=process_index,
      process_count=process_count,
      allow_changed=allow_changed,
    )
  train = _load(path, manifest, "train", tok, max_train_tokens)
  val = _load(path, manifest, "val", tok, max_val_tokens)
  ident = identity(manifest, path)
  if max_train_tokens is not None or max_val_tokens is not None:
    ident["max_tokens"] = {"train": max_train_tokens, "val": max_val_tokens}
  return tok, train, val, ident


def run_vocabulary(
  path: str, tokenizer: Optional[str], vocab_size: int, *, dry_run: bool = False, log=None
) -> tuple[str, int]:
  """(tokenizer, vocabulary size) of a run on the prepared dataset at `path`: its tokenizer when
  `tokenizer` (data.tokenizer) is unset, and with it a vocabulary large enough for its ids
  (rounded up to a multiple of 64); a tokenizer given that is not the dataset's is an error.
  A dry run (which compiles for a slice from a host that need not see the data) keeps its
  settings when the manifest cannot be read.

  Raises:
    ValueError: an unreadable manifest, another tokenizer, or a given tokenizer whose ids do not
      fit vocab_size: one line naming data.path or the field.
  """
  from rove_jax.nn.model_config import padded_vocab_size

  try:
    manifest = read_manifest(path)
  except (ValueError, OSError) as e:
    if dry_run:
      return tokenizer, vocab_size
    raise storage_errors.input_error(e, f"data.path={path}: {e}") from None
  want = manifest["tokenizer"]
  if tokenizer is not None and tokenizer != want["spec"]:
    raise ValueError(
      f"data.tokenizer={tokenizer!r} but the prepared dataset {path} was "
      f"tokenized with {want['spec']!r}; leave data.tokenizer unset (the dataset "
      f"supplies it) or prepare the corpus again with {tokenizer!r}"
    )
  ids = int(want["vocab_size"])
  need = padded_vocab_size(ids)
  if vocab_size < ids:
    if tokenizer is not None:
      raise ValueError(
        f"model.vocab_size={vocab_size} is smaller than the {ids} ids of the "
        f"prepared dataset's tokenizer {want['spec']!r}; set "
        f"--config.model.vocab_size={need} or leave data.tokenizer unset"
      )
    (log or _log)(
      f"model.vocab_size={need}: the prepared dataset's tokenizer {want['spec']!r} has {ids} ids"
    )
    vocab_size = need
  return want["spec"], vocab_size


def _bpe_file(spec: str) -> Optional[str]:
  if spec == "bpe":
    size = tokenization.DEFAULT_BPE_VOCAB
  elif spec.startswith("bpe:") and spec[4:].isdigit():
    size = int(spec[4:])
  else:
    return None
  return paths.basename(tokenization.bpe_cache_path(".", size))


def _log(message: str) -> None:
  print(f"[rove_jax.data] {message}", file=sys.stderr, flush=True)
