"""The prepared-dataset format (rove_jax.data.prepared reads it, rove_jax.data.prepare_corpus
writes it): its constants and file names, the manifest read and checked, and what a run records
to know a dataset again.

A prepared directory holds:
  manifest.json        written last: it vouches for every shard it lists
  train-00000.bin ...  a split's tokens in order, raw little-endian uint16 (uint32 when the
  val-00000.bin ...    tokenizer has more than 65536 ids), eot_id after every document
  tokenizer-bpe-*.json the tokenizer a "bpe" spec trained (that spec only)
  progress.json        only while it is being prepared: what is done, for resuming

manifest.json:
  format "rove_jax.prepared", version 1
  request      {"source": sha256 of the corpus fields, its files' sizes and times,
               tokens_per_shard and max_tokens; "tokenizer": the tokenizer's fingerprint}
  command      the rove-prepare command line that makes (or repairs) this directory
  corpus       the `Corpus` fields
  tokenizer    {spec, name, fingerprint, vocab_size, eot_id, file (bpe: its file, else null)}
  dtype        "uint16" | "uint32" (little-endian)
  tokens_per_shard, max_tokens {"train": int | null, "val": int | null}
  splits       {"train" | "val": {tokens, documents, shards: [{file, tokens, documents,
               bytes, sha256}]}}; "documents" counts the documents that end in it (its eot ids)

`read_manifest` checks the manifest's structure and compares each shard's size with it (no
hashing); `check_tokenizer` refuses a tokenizer whose fingerprint differs from the manifest's;
errors are `DamagedDataset` and name the fix (`fix_hint`: rerun the manifest's command).

Identity: `identity(manifest, path)` is what a run records to know its data again: the sha256
of the manifest's description of the contents (dtype, tokenizer, every shard's sha256), which
re-preparing from other text changes even when the token counts stay the same.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Optional

import numpy as np

from rove_jax.data.sources import SPLITS
from rove_jax.data.tokenization import Tokenizer
from rove_jax.storage import errors as storage_errors
from rove_jax.storage import paths

FORMAT = "rove_jax.prepared"
VERSION = 1
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
SHARD_RE = re.compile(r"^(train|val)-\d{5,}\.bin$")


def shard_dtype(vocab_size: int) -> str:
  """ "uint16" when every id of a vocab_size vocabulary fits, else "uint32"."""
  return "uint16" if int(vocab_size) <= 1 << 16 else "uint32"


def shard_name(split: str, index: int) -> str:
  """The file name of shard `index` of `split`: train-00000.bin, ..."""
  return f"{split}-{index:05d}.bin"


class DamagedDataset(ValueError):
  """A prepared directory whose manifest or shards do not match (missing, resized, changed)."""


def read_manifest(path: str) -> dict[str, Any]:
  """The manifest of the prepared directory `path` (local or gs://), its structure checked, and
  each listed shard's size compared with the file (no hashing).

  Args:
    path: the prepared directory.

  Returns:
    the manifest dict.

  Raises:
    DamagedDataset: no or a malformed manifest, or a shard missing or of the wrong size; the
      message names the file and the fix.
  """
  path = paths.resolve(path, what="prepared dataset")
  mpath = paths.join(path, MANIFEST)
  if not paths.isdir(path):
    what = "holds no objects" if paths.is_remote(path) else "is not a directory"
    raise ValueError(
      f"prepared dataset {path!r} {what}; make one with rove-prepare "
      f"(python -m rove_jax.cli.prepare --help)"
    )
  try:
    manifest = json.loads(paths.read_bytes(mpath))
  except FileNotFoundError:
    unfinished = paths.exists(paths.join(path, PROGRESS))
    raise DamagedDataset(
      f"{path} holds no {MANIFEST}: "
      + (
        "its preparation was interrupted (progress.json is there); rerun the same "
        "rove-prepare command to finish it"
        if unfinished
        else "it is not a prepared dataset; make one with rove-prepare"
      )
    ) from None
  except (OSError, ValueError) as e:
    raise storage_errors.input_error(
      e,
      f"{mpath} is unreadable ({type(e).__name__}: {e}); prepare the "
      f"dataset again with rove-prepare --overwrite",
      DamagedDataset,
    ) from None
  problem = _manifest_problem(manifest)
  if problem:
    raise DamagedDataset(
      f"{mpath}: {problem}; prepare the dataset again with rove-prepare "
      f"--overwrite (or a rove_jax that reads this format)"
    )
  itemsize = DTYPES[manifest["dtype"]].itemsize
  sizes = paths.file_sizes(path)  # one listing, not one request a shard
  for split in SPLITS:
    for shard in manifest["splits"][split]["shards"]:
      file = paths.join(path, shard["file"])
      try:
        size = sizes[shard["file"]]
      except KeyError:
        raise DamagedDataset(f"shard {file} is missing; {fix_hint(manifest)}") from None
      if size != shard["tokens"] * itemsize or size != shard["bytes"]:
        raise DamagedDataset(
          f"shard {file} has {size} bytes, the manifest says {shard['bytes']} "
          f"({shard['tokens']} tokens): truncated or overwritten; "
          f"{fix_hint(manifest)}"
        )
  return manifest


def identity(manifest: dict, path: str) -> dict[str, str]:
  """What a run records to recognise a prepared dataset: equal for the same token streams,
  different when the dataset was prepared again from other text or with another tokenizer.

  Args:
    manifest: its manifest (`read_manifest`).
    path: the prepared directory.

  Returns:
    {"source": "prepared", "manifest_sha256": the sha256 of the canonical JSON (sorted keys, no
    spaces) of the manifest's dtype, tokenizer and splits (every shard's tokens, bytes and
    sha256), "path": the resolved directory}.
  """
  contents = {k: manifest[k] for k in ("dtype", "tokenizer", "splits")}
  blob = json.dumps(contents, sort_keys=True, separators=(",", ":")).encode("utf-8")
  return {
    "source": "prepared",
    "manifest_sha256": hashlib.sha256(blob).hexdigest(),
    "path": paths.resolve(path, what="prepared dataset"),
  }


def _manifest_problem(m) -> Optional[str]:
  if not isinstance(m, dict) or m.get("format") != FORMAT:
    return f"not a {FORMAT} manifest"
  if m.get("version") != VERSION:
    return f"format version {m.get('version')!r}, this rove_jax reads version {VERSION}"
  if m.get("dtype") not in DTYPES:
    return f"dtype {m.get('dtype')!r} is not one of {sorted(DTYPES)}"
  tok = m.get("tokenizer")
  if not isinstance(tok, dict) or not all(k in tok for k in ("spec", "fingerprint", "eot_id")):
    return "no tokenizer record (spec, fingerprint, eot_id)"
  splits = m.get("splits")
  if not isinstance(splits, dict) or set(splits) != set(SPLITS):
    return f"splits must be {list(SPLITS)}"
  for split in SPLITS:
    s = splits[split]
    shards = s.get("shards") if isinstance(s, dict) else None
    if not shards or not isinstance(shards, list):
      return f"split {split!r} lists no shards"
    for shard in shards:
      if not isinstance(shard, dict) or not all(
        k in shard for k in ("file", "tokens", "bytes", "sha256")
      ):
        return f"split {split!r} has a shard record without file, tokens, bytes and sha256"
      if (
        not isinstance(shard["file"], str)
        or not SHARD_RE.match(shard["file"])
        or (not shard["file"].startswith(split + "-"))
      ):
        return f"split {split!r} lists a shard file named {shard['file']!r}"
      if not isinstance(shard["tokens"], int) or shard["tokens"] < 1:
        return f"shard {shard['file']} has tokens={shard['tokens']!r}"
    if sum(sh["tokens"] for sh in shards) != s.get("tokens"):
      return (
        f"split {split!r}: its shards hold {sum(sh['tokens'] for sh in shards)} tokens, "
        f"the split says {s.get('tokens')!r}"
      )
  return None


def fix_hint(manifest: dict) -> str:
  """How to repair a damaged prepared directory: rerun the command that made it."""
  command = manifest.get("command")
  return (
    "rerun the command that prepared it, which finds and rewrites damaged shards"
    + (f": {command}" if command else "")
    + " (or restore the directory from a copy)"
  )


def check_tokenizer(manifest: dict, tokenizer: Tokenizer, path: str) -> None:
  """Raises ValueError when `tokenizer` maps text to other ids than the dataset's tokenizer."""
  want = manifest["tokenizer"]
  if tokenizer.fingerprint == want["fingerprint"]:
    return
  raise ValueError(
    f"the prepared dataset {path} was tokenized with {want['spec']!r} (fingerprint "
    f"{want['fingerprint'][:19]}), not with the tokenizer {tokenizer.name!r} given (fingerprint "
    f"{tokenizer.fingerprint[:19]}): its ids would mean other text. Set the tokenizer to "
    f"{want['spec']!r} (--config.data.tokenizer), or prepare the corpus again with yours"
  )
