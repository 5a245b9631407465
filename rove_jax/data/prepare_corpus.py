"""Tokenizes a corpus once into a prepared directory (format: rove_jax.data.prepared_format);
the rove-prepare command (rove_jax.cli.prepare) drives `prepare_dataset`. This module decides
what to do with --out (start, resume, keep, repair or replace) and writes the manifest;
rove_jax.data.shard_writer tokenizes each split into its shards.

--out may be local or gs://bucket/path (the `[gcs]` extra); the corpus sources stay local.
Files go through rove_jax.storage.paths: shards are written atomically (`paths.write_atomic`)
and progress.json, rewritten whole after each shard, records the shards done and where the
next one starts (document index, tokens of it already written); manifest.json comes last. A
rerun of the same command therefore resumes an interrupted preparation (tokenizers are
deterministic: the result is the same bytes), and hashes a finished one, rewriting it if a
shard was damaged. A directory holding another dataset is refused unless overwrite.

One process prepares a directory at a time: `prepare_dataset` holds its writer lock
(rove_jax.storage.lock; the .writer-lock.N files stay) from before it changes anything to the
end, so a second one on the same out stops at once with a LockError naming the first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import sys
from typing import Optional, Union

import numpy as np

from rove_jax.data import prepared, prepared_format, shard_writer, tokenization
from rove_jax.data.sources import SPLITS, Corpus, iter_documents, list_units, take_chars
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import lock as lock_lib
from rove_jax.storage import paths

DEFAULT_TOKENS_PER_SHARD = 100_000_000
_NAMES = r"(manifest\.json|progress\.json|(train|val)-\d{5,}\.bin|tokenizer-bpe-\d+\.json)"
# The dataset's files and the temporary files of their atomic writes: NAME.tmp-* (earlier
# versions) and .NAME.tmp-* (paths.write_atomic).
_OURS = re.compile(rf"^({_NAMES}|{_NAMES}\.tmp-.*|\.{_NAMES}\.tmp-.*)$")
# The writer lock's files and its clock probes: the lock's, never removed with the dataset.
_LOCK_FILES = re.compile(r"^(\.writer-lock\.\d+|\.clock-probe-.*)$")


def prepare_dataset(
  corpus: Corpus,
  tokenizer: Union[str, Tokenizer],
  out: str,
  *,
  tokens_per_shard: int = DEFAULT_TOKENS_PER_SHARD,
  max_train_tokens: Optional[int] = None,
  max_val_tokens: Optional[int] = None,
  vocab_size: Optional[int] = None,
  bpe_train_chars: int = 1_000_000_000,
  overwrite: bool = False,
  progress: bool = True,
  log=None,
) -> dict:
  """Tokenizes corpus's train and val splits into the prepared directory out (or resumes).

  Args:
    corpus: the `Corpus` (any source but "prepared" and "recall").
    tokenizer: a `tokenization.get_tokenizer` spec (a "bpe" spec trains on the train split
      and keeps its file in out), or a `Tokenizer`.
    out: the directory to write: a local path or gs://bucket/path.
    tokens_per_shard: tokens of every shard but each split's last.
    max_train_tokens, max_val_tokens: keep only the first this many tokens of a split.
    vocab_size, bpe_train_chars: for a "bpe" spec (see `pipeline.prepare`).
    overwrite: replace a dataset of another corpus or tokenizer found in out.
    progress: show a progress bar (tqdm) per split.
    log: a function of one string for progress lines (default: stderr).

  Returns:
    the manifest (also written to out/manifest.json).

  Raises:
    ValueError: bad arguments or --out (a file, a directory of other files, another dataset).
    rove_jax.storage.lock.LockError: another process is preparing out.
  """
  log = log or prepared._log
  _check_args(corpus, tokens_per_shard, max_train_tokens, max_val_tokens)
  out = paths.resolve(out, what="--out")
  _check_out(out)
  caps = {"train": max_train_tokens, "val": max_val_tokens}
  source = _source_digest(corpus, tokens_per_shard, caps)  # lists the files: bad paths fail here
  # A tokenizer that needs no training is built now: a bad spec fails before any file changes.
  spec, bpe_size = _canonical_spec(tokenizer, vocab_size)
  tok = (
    None
    if bpe_size
    else (tokenizer if isinstance(tokenizer, Tokenizer) else tokenization.get_tokenizer(tokenizer))
  )
  foreign = sorted(f for f in paths.listdir(out) if not (_OURS.match(f) or _LOCK_FILES.match(f)))
  if foreign:
    raise ValueError(
      f"--out {out} holds files that are not a prepared dataset's "
      f"({foreign[:3]}); choose an empty or new directory"
    )
  # Before anything in out changes: a second rove-prepare on out stops here, naming the first.
  writer = lock_lib.WriterLock(out, what="prepared dataset")
  writer.acquire(log=log)
  try:
    return _prepare_locked(
      corpus,
      out,
      tok,
      spec,
      bpe_size,
      source,
      caps,
      writer,
      tokens_per_shard=tokens_per_shard,
      bpe_train_chars=bpe_train_chars,
      overwrite=overwrite,
      progress=progress,
      log=log,
    )
  finally:
    writer.release()


def _prepare_locked(
  corpus,
  out,
  tok,
  spec,
  bpe_size,
  source,
  caps,
  writer,
  *,
  tokens_per_shard,
  bpe_train_chars,
  overwrite,
  progress,
  log,
) -> dict:
  """prepare_dataset's work, with out's writer lock held."""
  manifest, journal = (
    _read_json(out, prepared_format.MANIFEST),
    _read_json(out, prepared_format.PROGRESS),
  )
  done = manifest or journal
  same = (
    bool(done)
    and done.get("request", {}).get("source") == source
    and (done.get("tokenizer", {}).get("spec") == spec)
  )
  if manifest and not same and not overwrite:
    raise ValueError(
      f"--out {out} holds a prepared dataset of another corpus, tokenizer or "
      f"shard size (made by: {manifest.get('command')}); choose another --out or "
      f"pass --overwrite to replace it"
    )
  if not same:  # leftovers no record vouches for, or another dataset: start afresh
    if _ours(out):
      log(
        f"{out}: removing the files of "
        + (
          "the dataset it held"
          if manifest
          else "an unfinished preparation of other data"
          if journal
          else "an unfinished preparation"
        )
      )
    _remove_ours(out, keep_tokenizer=False)
    manifest = journal = None
  for f in _ours(out):  # temporary files of a killed run (none are this process's: the lock)
    if ".tmp-" in f:
      paths.remove(paths.join(out, f))

  if tok is None:  # bpe: trained on the train split into out once, then reused
    tok = tokenization.get_tokenizer(
      spec,
      workdir=out,
      train_texts=lambda: take_chars(iter_documents(corpus, "train"), bpe_train_chars),
    )
  request = {"source": source, "tokenizer": tok.fingerprint}
  if manifest:
    if manifest["request"] == request and _intact(out, log):
      log(f"{out} already holds this dataset, every shard checked against its sha256")
      return manifest
    log(f"{out}: rewriting the dataset (a damaged shard or another tokenizer file)")
    _remove_ours(out, keep_tokenizer=True)
    journal = None
  if journal and journal.get("request") != request:  # the bpe file changed: redo the shards
    _remove_ours(out, keep_tokenizer=True)
    journal = None
  dtype_name = prepared_format.shard_dtype(tok.vocab_size)
  state = journal or {
    "request": request,
    "tokenizer": {"spec": spec},
    "splits": {
      s: {"shards": [], "tokens": 0, "next_doc": 0, "skip": 0, "done": False} for s in SPLITS
    },
  }
  if journal:
    log(
      f"{out}: resuming an unfinished preparation "
      + ", ".join(f"{s}: {len(v['shards'])} shards done" for s, v in state["splits"].items())
    )

  def save_state():
    writer.check()  # a process that lost the lock (stalled past its lease) writes no more
    _write_json(out, prepared_format.PROGRESS, state)

  save_state()
  for split in SPLITS:
    st = state["splits"][split]
    if not st["done"]:
      shard_writer.write_split(
        iter_documents(corpus, split),
        tok,
        out,
        split,
        st,
        save_state,
        tokens_per_shard=tokens_per_shard,
        cap=caps[split],
        dtype=prepared_format.DTYPES[dtype_name],
        progress=progress,
        log=log,
      )
    if st["tokens"] == 0:
      raise ValueError(
        f"the {split} split of {corpus.source} corpus {corpus.path!r} is empty: "
        f"no non-empty documents; check path and text_field="
        f"{corpus.text_field!r}"
      )
  manifest = {
    "format": prepared_format.FORMAT,
    "version": prepared_format.VERSION,
    "request": request,
    "command": command_line(corpus, spec, out, tokens_per_shard, caps),
    "corpus": dataclasses.asdict(corpus),
    "tokenizer": {
      "spec": spec,
      "name": tok.name,
      "fingerprint": tok.fingerprint,
      "vocab_size": int(tok.vocab_size),
      "eot_id": int(tok.eot_id),
      "file": paths.basename(tokenization.bpe_cache_path(out, bpe_size)) if bpe_size else None,
    },
    "dtype": dtype_name,
    "tokens_per_shard": int(tokens_per_shard),
    "max_tokens": caps,
    "splits": {
      s: {
        "tokens": st["tokens"],
        "shards": st["shards"],
        "documents": sum(sh["documents"] for sh in st["shards"]),
      }
      for s, st in state["splits"].items()
    },
  }
  writer.check()
  _write_json(out, prepared_format.MANIFEST, manifest)
  paths.remove(paths.join(out, prepared_format.PROGRESS))
  log(
    f"prepared {out}: "
    + ", ".join(
      f"{s} {v['tokens']} tokens ({v['documents']} documents, {len(v['shards'])} shards)"
      for s, v in manifest["splits"].items()
    )
    + f", {dtype_name}"
  )
  return manifest


def _check_out(out: str) -> None:
  """Raises ValueError when --out cannot be a directory: it, or a parent of it, is a file."""
  parent = out  # GCS has no directories: only out itself can be an object in the way
  while (
    not paths.is_remote(out) and not os.path.exists(parent) and os.path.dirname(parent) != parent
  ):
    parent = os.path.dirname(parent)
  if paths.isfile(parent):
    where = "is a file" if parent == out else f"is below {parent}, which is a file"
    raise ValueError(
      f"--out {out} {where}; a prepared dataset is a directory: choose another --out"
    )


def _write_json(out: str, name: str, obj) -> None:
  # Written whole (GCS has no append): readers see the old record or the new one.
  paths.write_atomic(paths.join(out, name), json.dumps(obj, indent=1))


def _read_json(out: str, name: str) -> Optional[dict]:
  try:
    obj = json.loads(paths.read_bytes(paths.join(out, name)))
  except (OSError, ValueError):
    return None  # missing or torn: treated as absent (the shards it listed are redone)
  return obj if isinstance(obj, dict) else None


def _ours(out: str) -> list[str]:
  """The names in out that belong to a prepared dataset (not its writer lock's files)."""
  return [f for f in paths.listdir(out) if _OURS.match(f)]


def _remove_ours(out: str, *, keep_tokenizer: bool) -> None:
  for f in _ours(out):
    if not (keep_tokenizer and f.startswith("tokenizer-")):
      paths.remove(paths.join(out, f))


def _intact(out: str, log) -> bool:
  try:
    prepared.verify(out, log=log, cache_remote=False)
  except prepared.DamagedDataset as e:
    log(f"WARNING: {e}")
    return False
  return True


def _source_digest(corpus: Corpus, tokens_per_shard: int, caps: dict) -> str:
  desc = {
    "version": prepared_format.VERSION,
    "corpus": dataclasses.asdict(corpus),
    "tokens_per_shard": int(tokens_per_shard),
    "max_tokens": caps,
  }
  if corpus.source == "stdlib":
    desc["python"] = sys.version
  if corpus.source == "hf":
    iter_documents(corpus, "train")  # opens the stream: a bad name fails here
  else:  # which files, their sizes and times: editing the data makes another dataset
    units, val_units = list_units(corpus)
    desc["files"] = [(u.key, u.stamp) for u in units + (val_units or [])]
  blob = json.dumps(desc, sort_keys=True, default=list).encode("utf-8")
  return hashlib.sha256(blob).hexdigest()


def _canonical_spec(tokenizer, vocab_size) -> tuple[str, Optional[int]]:
  """(the spec the manifest records, the bpe vocabulary size or None): "bpe" and vocab_size
  become "bpe:SIZE", the spec a run on the dataset names; a Tokenizer object gives its name."""
  if isinstance(tokenizer, Tokenizer):
    return tokenizer.name, None
  if not isinstance(tokenizer, str) or not (tokenizer == "bpe" or tokenizer.startswith("bpe:")):
    return tokenizer, None
  size = vocab_size if vocab_size is not None else tokenization.DEFAULT_BPE_VOCAB
  if tokenizer.startswith("bpe:"):
    try:
      size = int(tokenizer[4:])
    except ValueError:
      raise ValueError(
        f"tokenizer {tokenizer!r}: VOCAB must be an integer, e.g. bpe:8192"
      ) from None
    if vocab_size is not None and vocab_size != size:
      raise ValueError(
        f"tokenizer {tokenizer!r} and vocab_size={vocab_size} disagree; give the size once"
      )
  tokenization._check_bpe_vocab(size)
  return f"bpe:{size}", size


def _check_args(corpus, tokens_per_shard, *caps) -> None:
  if corpus.source in ("prepared", "recall"):
    raise ValueError(
      f"source {corpus.source!r} cannot be prepared: "
      + (
        "it is prepared already"
        if corpus.source == "prepared"
        else "the recall source generates its windows (and loss mask) itself; train on it directly"
      )
    )
  for name, value in (
    ("tokens_per_shard", tokens_per_shard),
    ("max_train_tokens", caps[0]),
    ("max_val_tokens", caps[1]),
  ):
    if value is None and name != "tokens_per_shard":
      continue
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}")


def command_line(corpus: Corpus, spec: str, out: str, tokens_per_shard: int, caps: dict) -> str:
  """The rove-prepare command line that prepares corpus with spec into out."""
  default = Corpus(source=corpus.source, path=corpus.path)
  args = ["rove-prepare", "--source", corpus.source]
  for field in (
    "path",
    "val_path",
    "text_field",
    "val_fraction",
    "max_files",
    "hf_config",
    "hf_split",
  ):
    value = getattr(corpus, field)
    if value is not None and (field == "path" or value != getattr(default, field)):
      args += [f"--{field.replace('_', '-')}", str(value)]
  files = corpus.hf_data_files
  if files is not None:
    args += [
      "--hf-data-files",
      *([files] if isinstance(files, str) else [f for f in files if isinstance(f, str)]),
    ]
  args += ["--tokenizer", spec, "--out", out, "--tokens-per-shard", str(tokens_per_shard)]
  for split, cap in caps.items():
    if cap is not None:
      args += [f"--max-{split}-tokens", str(cap)]
  return " ".join(shlex.quote(a) for a in args)
