"""Text corpora -> token streams -> resumable grain batches.

Shape letters:
  G  global batch size (all processes)      B  per-process batch = G / process_count
  T  sequence length (seq_len)              W  window length = T + 1
  N  tokens in a flat token array

Public API:
  Corpus(source, path=None, ...)                  frozen description of a corpus (see below)
  iter_documents(corpus, split) -> Iterator[str]  the documents of the "train" or "val" split
  load_tokens(corpus, split, tokenizer, *, cache_dir=None, max_tokens=None) -> tokens [N]
  train_iterator(tokens, *, seq_len, global_batch_size, seed, ...) -> grain DatasetIterator
  eval_batches(tokens, *, seq_len, batch_size, max_batches=None, ...) -> Iterator[batch]
  make_batch(windows_BW, *, packing=False, eot_id=None) -> batch   windows [B, W] -> batch dict
  held_out_keys(keys, fraction) -> set[str]       which files the validation split holds out
  prepare(corpus, tokenizer, *, workdir, ...) -> Data(tokenizer, train_tokens, val_tokens)

Sources:
  "stdlib"   the running interpreter's standard library: its *.py sources plus its docs (the
             pydoc topics text, .txt/.rst/.md files), tens of MB, no download. Site-packages,
             virtualenvs, __pycache__ and empty files are skipped; files are read in sorted
             relative-path order. `path` may name another library root.
  "text"     .txt files (one document each) and .jsonl files (one document per line, the
             `text_field` of each object), from a file, a directory or a glob.
  "parquet"  parquet shards (file, directory or glob) with a `text_field` column, read one
             row-group batch at a time (FineWeb-Edu shards, for instance).
  "hf"       `datasets.load_dataset(path, hf_config, split=hf_split, streaming=True)`; the `hf`
             extra. For local files use path="parquet" (or "json") and hf_data_files.

Validation split: `val_path` when given (files for text/parquet, a split name for hf); else a
deterministic held-out `val_fraction`: of the files, chosen by a hash of each file's relative
path, when there are several; of the documents (every round(1 / val_fraction)-th, starting with
the first) in a single .jsonl / parquet file or an hf stream; of the text's tail, cut at a line
break, for a single .txt file. The held-out part is never empty and never overlaps "train".

Token arrays put tokenizer.eot_id after every document. A window is tokens[i*T : i*T + W] (so
consecutive windows share one token and every token is a target once); a batch is a dict of
int32 arrays: inputs [B, T] = window[:-1], targets [B, T] = window[1:] and, with packing=True,
segment_ids [B, T] (the number of end-of-text tokens before each input in its row: a new
document starts after each one) and positions [B, T] (restarting at 0 in each document, and
at the start of the row).

Resuming: the training iterator's state (`get_state()`, JSON-serializable) counts global steps,
so restoring it with `set_state` replays exactly the batches the run would have seen, even with
a different process_count. The state also records seq_len, global_batch_size, seed and packing,
and `set_state` refuses a state written by a different pipeline.
"""

from __future__ import annotations

import ast
import dataclasses
import glob as globlib
import hashlib
import io
import json
import os
import sys
import sysconfig
import time
import tokenize
import uuid
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import grain
import numpy as np

from rove_jax import tokenization
from rove_jax.tokenization import Tokenizer

SOURCES = ("stdlib", "text", "parquet", "hf")
SPLITS = ("train", "val")
TEXT_EXTENSIONS = (".txt", ".jsonl")
PARQUET_EXTENSIONS = (".parquet",)
STDLIB_EXTENSIONS = (".py", ".txt", ".rst", ".md")
_STDLIB_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")
_TOPICS = "pydoc_data/topics.py"
_CACHE_FORMAT = 1
_ENCODE_CHUNK_CHARS = 1 << 20  # texts handed to encode_batch at once (parallel in tokenizers)


# --------------------------------------------------------------------------------- corpus


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Where the documents come from (see the module docstring for each source).

  Attributes:
    source: one of SOURCES.
    path: file, directory or glob (text, parquet); dataset name (hf); library root (stdlib,
      default: this interpreter's).
    val_path: explicit validation files (text, parquet) or split name (hf).
    text_field: the jsonl key / parquet column / hf column holding the text.
    val_fraction: share held out for validation when val_path is not given.
    max_files: use only the first max_files files in sorted order (stdlib: each pydoc topic
      counts as one), e.g. for quick tests; text, parquet and stdlib only.
    hf_config: the hf dataset configuration (`name=` of load_dataset), e.g. "sample-10BT".
    hf_data_files: `data_files=` of load_dataset: files, or {split: files} (local parquet or
      json files, for instance).
    hf_split: the hf split the training documents come from.
  """
  source: str = "stdlib"
  path: Optional[str] = None
  val_path: Optional[str] = None
  text_field: str = "text"
  val_fraction: float = 0.02
  max_files: Optional[int] = None
  hf_config: Optional[str] = None
  hf_data_files: Union[None, str, Sequence[str], dict[str, Any]] = None
  hf_split: str = "train"

  def __post_init__(self):
    if self.source not in SOURCES:
      raise ValueError(f"unknown corpus source {self.source!r}; expected one of {SOURCES}")
    for name in ("path", "val_path"):
      value = getattr(self, name)
      if value is not None:
        object.__setattr__(self, name, os.fspath(value))
    # Kept hashable (a frozen dataclass): a list becomes a tuple, a {split: files} dict a
    # sorted tuple of pairs; _hf_documents turns them back into what load_dataset takes.
    files = self.hf_data_files
    if isinstance(files, dict):
      files = tuple(sorted((str(k), _as_files(v)) for k, v in files.items()))
    elif files is not None:
      files = _as_files(files)
    object.__setattr__(self, "hf_data_files", files)
    if self.source in ("text", "parquet", "hf") and not self.path:
      want = {"text": "a .txt/.jsonl file, directory or glob",
              "parquet": "a .parquet file, directory or glob",
              "hf": "a dataset name such as 'HuggingFaceFW/fineweb-edu' (or 'parquet' with "
                    "hf_data_files)"}[self.source]
      raise ValueError(f"corpus source {self.source!r} needs path: {want}")
    if self.source == "stdlib" and self.val_path is not None:
      raise ValueError("the stdlib corpus holds out its validation files itself; val_path is "
                       "for the text, parquet and hf sources")
    if not (isinstance(self.val_fraction, (int, float)) and 0.0 < self.val_fraction < 1.0):
      raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
    if self.source == "hf" and self.val_path is not None and self.val_path == self.hf_split:
      raise ValueError(f"val_path={self.val_path!r} is also hf_split, the training split; name "
                       f"a separate validation split (e.g. 'validation') or drop val_path")
    if self.max_files is not None:
      if self.source == "hf":
        raise ValueError("max_files limits local files; for the hf source cap the tokens "
                         "with max_tokens instead")
      if isinstance(self.max_files, bool) or not isinstance(self.max_files, int) or (
          self.max_files < 1):
        raise ValueError(f"max_files must be a positive int or None, got {self.max_files!r}")
    if not self.text_field:
      raise ValueError("text_field must name the jsonl key / column holding the text")


def _as_files(files):
  if isinstance(files, (str, os.PathLike)):
    return os.fspath(files)
  return tuple(os.fspath(f) for f in files)


@dataclasses.dataclass(frozen=True)
class _Unit:
  """One file (or pydoc topic): the unit the validation split holds out."""
  key: str                                # relative path, the input of the held-out hash
  docs: Callable[[], Iterator[str]]
  stamp: tuple = ()                       # (size, mtime_ns): part of the token-cache key
  whole: bool = False                     # exactly one document (a .txt file)


def iter_documents(corpus: Corpus, split: str = "train") -> Iterator[str]:
  """The non-empty documents of one split, in a deterministic order.

  Args:
    corpus: the `Corpus`.
    split: "train" or "val".

  Returns:
    an iterator of strings. Listing errors (missing path, empty glob) raise here, at once.
  """
  _check_split(split)
  if corpus.source == "hf":
    return _nonempty(_hf_documents(corpus, split))
  units, val_units = _list_units(corpus)
  if val_units is not None:
    chosen = units if split == "train" else val_units
    return _nonempty(d for u in chosen for d in u.docs())
  if len(units) > 1:
    held = held_out_keys([u.key for u in units], corpus.val_fraction)
    chosen = [u for u in units if (u.key in held) == (split == "val")]
    return _nonempty(d for u in chosen for d in u.docs())
  if units[0].whole:
    return _nonempty(_tail_split(units[0], corpus.val_fraction, split))
  return _nonempty(_every_nth(units[0].docs(), corpus.val_fraction, split))


def held_out_keys(keys: Sequence[str], fraction: float) -> set[str]:
  """The keys whose stable hash falls below fraction: at least one, never all (if > 1 key)."""
  scores = {k: int.from_bytes(hashlib.sha256(k.encode("utf-8")).digest()[:8], "big") / 2.0**64
            for k in keys}
  held = {k for k, s in scores.items() if s < fraction}
  if not held:
    held = {min(scores, key=scores.get)}
  if len(held) == len(scores) > 1:
    held.discard(max(scores, key=scores.get))
  return held


def _every_nth(docs: Iterable[str], fraction: float, split: str) -> Iterator[str]:
  every = max(2, round(1.0 / fraction))
  for i, doc in enumerate(docs):
    if (i % every == 0) == (split == "val"):
      yield doc


def _tail_split(unit: _Unit, fraction: float, split: str) -> Iterator[str]:
  (text,) = list(unit.docs()) or [""]
  cut = int(len(text) * (1.0 - fraction))
  newline = text.find("\n", max(cut - 1, 0))  # a cut already at a line start stays
  if 0 <= newline < len(text) - 1:
    cut = newline + 1
  head, tail = text[:cut], text[cut:]
  if not head.strip() or not tail.strip():
    raise ValueError(
        f"the single text file {unit.key!r} ({len(text)} characters) is too short to hold out "
        f"val_fraction={fraction} of it for validation; give val_path or more files")
  yield head if split == "train" else tail


def _nonempty(docs: Iterable[str]) -> Iterator[str]:
  return (d for d in docs if d and not d.isspace())


def _check_split(split) -> None:
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


# ----------------------------------------------------------------------------- local files


def _list_units(corpus: Corpus) -> tuple[list[_Unit], Optional[list[_Unit]]]:
  if corpus.source == "stdlib":
    units = _stdlib_units(corpus.path or sysconfig.get_paths()["stdlib"])
    val_units = None
  else:
    exts = TEXT_EXTENSIONS if corpus.source == "text" else PARQUET_EXTENSIONS
    units = _file_units(corpus, corpus.path, exts)
    val_units = None if corpus.val_path is None else _file_units(corpus, corpus.val_path, exts)
  if corpus.max_files is not None:
    units = units[:corpus.max_files]
  if val_units is not None:
    overlap = {u.key for u in units} & {u.key for u in val_units}
    if overlap:
      raise ValueError(f"val_path {corpus.val_path!r} and path {corpus.path!r} share files "
                       f"{sorted(overlap)[:3]}; the validation files must be separate")
  return units, val_units


def _resolve_files(pattern: str, exts: tuple[str, ...], what: str) -> list[str]:
  expanded = os.path.expanduser(pattern)
  if any(c in expanded for c in "*?["):
    files = sorted(f for f in globlib.glob(expanded, recursive=True) if os.path.isfile(f))
    if not files:
      raise ValueError(f"{what}: the glob {pattern!r} matched no files; expected {exts} files")
  elif os.path.isdir(expanded):
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(expanded) for f in names
                   if f.endswith(exts))
    if not files:
      raise ValueError(f"{what}: the directory {pattern!r} holds no {exts} files")
  elif os.path.isfile(expanded):
    files = [expanded]
  else:
    raise ValueError(f"{what}: path {pattern!r} does not exist; expected a file, a directory "
                     f"or a glob of {exts} files")
  bad = [f for f in files if not f.endswith(exts)]
  if bad:
    raise ValueError(f"{what}: {bad[0]!r} is not one of {exts}; narrow the glob to those files")
  return files


def _file_units(corpus: Corpus, pattern: str, exts) -> list[_Unit]:
  files = [os.path.abspath(f) for f in _resolve_files(pattern, exts, f"{corpus.source} corpus")]
  # Keys relative to the files' common directory: the held-out choice survives moving the data.
  root = os.path.dirname(files[0]) if len(files) == 1 else os.path.commonpath(files)
  units = []
  for f in files:
    st = os.stat(f)
    key = os.path.relpath(f, root).replace(os.sep, "/")
    if corpus.source == "parquet":
      docs = _parquet_reader(f, corpus.text_field)
    elif f.endswith(".jsonl"):
      docs = _jsonl_reader(f, corpus.text_field)
    else:
      docs = _txt_reader(f)
    units.append(_Unit(key, docs, (st.st_size, st.st_mtime_ns), whole=f.endswith(".txt")))
  return units


def _txt_reader(path: str):
  def docs():
    with open(path, encoding="utf-8", errors="replace") as f:
      yield f.read()
  return docs


def _jsonl_reader(path: str, field: str):
  def docs():
    with open(path, encoding="utf-8", errors="replace") as f:
      for line_no, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{line_no} is not valid JSON ({e})") from None
        yield _field(row, field, f"{path}:{line_no}")
  return docs


def _parquet_reader(path: str, field: str):
  def docs():
    try:
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ImportError("the parquet source needs pyarrow: pip install 'rove_jax[data]'") from e
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if field not in names:
      raise ValueError(f"parquet file {path} has no column text_field={field!r}; its columns "
                       f"are {names}")
    # Row-group batches: a multi-GB shard never sits in memory at once.
    for batch in pf.iter_batches(batch_size=1024, columns=[field]):
      for text in batch.column(0).to_pylist():
        if text is not None:
          yield text
  return docs


def _field(row, field: str, where: str) -> str:
  if not isinstance(row, dict) or field not in row:
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ValueError(f"{where} has no text_field={field!r} (found {keys}); set text_field")
  text = row[field]
  if text is not None and not isinstance(text, str):
    raise ValueError(f"{where}: text_field={field!r} holds {type(text).__name__}, not text")
  return text or ""


# ----------------------------------------------------------------------------------- stdlib


def _stdlib_units(root: str) -> list[_Unit]:
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise ValueError(f"stdlib corpus: the library root {root!r} does not exist; expected the "
                     f"directory holding the standard library's .py files")
  units = []
  for dirpath, dirnames, filenames in os.walk(root):
    # A virtualenv (pyvenv.cfg) or installed packages are not the standard library.
    dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not os.path.exists(
        os.path.join(dirpath, d, "pyvenv.cfg")))
    for name in filenames:
      if not (name.endswith(STDLIB_EXTENSIONS) or name.startswith("README")):
        continue
      path = os.path.join(dirpath, name)
      st = os.stat(path)
      if st.st_size == 0:
        continue
      key = os.path.relpath(path, root).replace(os.sep, "/")
      stamp = (st.st_size, st.st_mtime_ns)
      topics = _pydoc_topics(path) if key == _TOPICS else None
      if topics:
        # The topics module is prose stored in string literals: use the prose, one document
        # (and one held-out unit) per topic.
        units += [_Unit(f"{key}::{t}", lambda text=text: iter([text]), stamp)
                  for t, text in sorted(topics.items())]
      else:
        units.append(_Unit(key, lambda p=path: _read_stdlib_file(p), stamp))
  units.sort(key=lambda u: u.key)
  if not units:
    raise ValueError(f"stdlib corpus: no {STDLIB_EXTENSIONS} files under {root!r}")
  return units


def _read_stdlib_file(path: str) -> Iterator[str]:
  with open(path, "rb") as f:
    data = f.read()
  try:
    if path.endswith(".py"):  # honour PEP 263 coding cookies
      encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    else:
      encoding = "utf-8-sig"
    text = data.decode(encoding)
  except (SyntaxError, UnicodeDecodeError, LookupError):
    # Deliberately mis-encoded test fixtures (test/bad_coding*.py, cjkencodings/*.txt): skip.
    return iter(())
  return iter([text])


def _pydoc_topics(path: str) -> Optional[dict[str, str]]:
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    for node in tree.body:
      if isinstance(node, ast.Assign) and any(
          isinstance(t, ast.Name) and t.id == "topics" for t in node.targets):
        topics = ast.literal_eval(node.value)
        if isinstance(topics, dict) and all(isinstance(v, str) for v in topics.values()):
          return {str(k): v for k, v in topics.items()}
  except (SyntaxError, ValueError, UnicodeDecodeError):
    pass
  return None  # an unexpected layout: read it as ordinary source


# --------------------------------------------------------------------------------------- hf


def _hf_documents(corpus: Corpus, split: str) -> Iterator[str]:
  try:
    import datasets
  except ImportError as e:
    raise ImportError("the 'hf' source needs the datasets package: "
                      "pip install 'rove_jax[hf]'") from e
  explicit = corpus.val_path is not None  # a named validation split: nothing is held out
  hf_split = corpus.val_path if explicit and split == "val" else corpus.hf_split
  data_files = corpus.hf_data_files
  if isinstance(data_files, tuple) and data_files and isinstance(data_files[0], tuple):
    data_files = {k: list(v) if isinstance(v, tuple) else v for k, v in data_files}
  elif isinstance(data_files, tuple):
    data_files = list(data_files)
  try:
    stream = datasets.load_dataset(corpus.path, corpus.hf_config, split=hf_split,
                                   data_files=data_files, streaming=True)
  except Exception as e:  # not found / offline / bad split: one clear boundary error
    raise ValueError(
        f"hf corpus: could not open dataset path={corpus.path!r} hf_config={corpus.hf_config!r} "
        f"split={hf_split!r} hf_data_files={corpus.hf_data_files!r} "
        f"({type(e).__name__}: {e})") from e
  where = f"hf dataset {corpus.path!r} split {hf_split!r}"
  texts = (_field(row, corpus.text_field, where) for row in stream)
  return texts if explicit else _every_nth(texts, corpus.val_fraction, split)


# ----------------------------------------------------------------------------------- tokens


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
  _check_split(split)
  if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(
      max_tokens, (int, np.integer)) or max_tokens < 1):
    raise ValueError(f"max_tokens must be a positive int or None, got {max_tokens!r}")
  label = f"{corpus.source} corpus {corpus.path or '(stdlib)'} split {split!r}"
  path = None
  if cache_dir is not None:
    key = _cache_key(corpus, split, tokenizer, max_tokens)
    path = os.path.join(os.fspath(cache_dir), f"tokens-{corpus.source}-{split}-{key[:20]}.npy")
    if os.path.isfile(path):
      tokens = np.load(path, mmap_mode="r")
      _log(f"{label}: {tokens.size} cached tokens from {path}")
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


def _tokenize(docs: Iterable[str], tokenizer: Tokenizer, max_tokens, label) -> np.ndarray:
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
  eot = np.array([tokenizer.eot_id], dtype=dtype)
  chunks, pending, pending_chars = [], [], 0
  n_docs = n_chars = n_tokens = 0
  start = last_log = time.perf_counter()
  _log(f"{label}: tokenizing with {tokenizer.name} ...")

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
        _log(f"{label}: {n_docs} documents, {n_chars / 1e6:.1f} M characters, {n_tokens} tokens")
      if max_tokens is not None and n_tokens >= max_tokens:
        break
  if pending:
    flush()
  tokens = np.concatenate(chunks) if chunks else np.zeros((0,), dtype)
  if max_tokens is not None:
    tokens = tokens[:max_tokens]
  _log(f"{label}: {n_docs} documents, {n_chars / 1e6:.1f} M characters -> {tokens.size} tokens "
       f"in {time.perf_counter() - start:.1f} s")
  return tokens


def _cache_key(corpus: Corpus, split: str, tokenizer: Tokenizer, max_tokens) -> str:
  desc: dict[str, Any] = {"format": _CACHE_FORMAT, "corpus": dataclasses.asdict(corpus),
                          "split": split, "tokenizer": tokenizer.fingerprint,
                          "max_tokens": max_tokens}
  if corpus.source == "stdlib":
    desc["python"] = sys.version
  if corpus.source != "hf":
    # Which files, their sizes and times: editing the data invalidates the cache.
    units, val_units = _list_units(corpus)
    desc["files"] = [(u.key, u.stamp) for u in units + (val_units or [])]
  blob = json.dumps(desc, sort_keys=True, default=list).encode("utf-8")
  return hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------------------------- batches


def train_iterator(tokens, *, seq_len: int, global_batch_size: int, seed: int,
                   process_index: int = 0, process_count: int = 1, packing: bool = False,
                   eot_id: Optional[int] = None, num_threads: int = 2) -> grain.DatasetIterator:
  """An endless, shuffled, checkpointable iterator of this process's training batches.

  Windows (see the module docstring) are shuffled with seed and every epoch is reshuffled.
  Global step s takes the next G shuffled windows; process p gets rows [p*B, (p+1)*B) of them
  and reads only those.

  Args:
    tokens: [N] flat token array (e.g. from `load_tokens`), N >= seq_len + 1.
    seq_len: T, tokens per row.
    global_batch_size: G, rows per step over all processes (divisible by process_count).
    seed: shuffle seed, an int in [0, 2**32).
    process_index, process_count: this process and how many read the data
      (jax.process_index(), jax.process_count()).
    packing: also return segment_ids and positions (needs eot_id).
    eot_id: the tokenizer's end-of-text id.
    num_threads: grain reader threads prefetching batches.

  Returns:
    a grain `DatasetIterator` of dicts of int32 arrays: inputs [B, T], targets [B, T]
    (+ segment_ids [B, T], positions [B, T] with packing). get_state() / set_state() resume it.
  """
  tokens = _check_tokens(tokens, seq_len)
  lo, hi = _process_rows(global_batch_size, process_index, process_count)
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
    raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
  _check_packing(packing, eot_id)
  n_windows = (tokens.size - 1) // seq_len
  # grain reseeds epoch e with seed + e, so seeds 0 and 1 would share shuffles one epoch
  # apart; hashing the user's seed first decorrelates neighbouring seeds.
  shuffle_seed = int.from_bytes(hashlib.sha256(f"rove_jax/{int(seed)}".encode()).digest()[:4],
                                "big")
  ds = grain.MapDataset.range(n_windows).shuffle(seed=shuffle_seed).repeat()
  ds = ds.batch(global_batch_size, drop_remainder=True)  # batches of window indices [G]
  ds = ds.map(_WindowBatch(tokens, seq_len, lo, hi, packing, eot_id))
  read = grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(2, 2 * num_threads))
  inner = iter(ds.to_iter_dataset(read))
  pipeline = {"seq_len": int(seq_len), "global_batch_size": int(global_batch_size),
              "seed": int(seed), "packing": bool(packing), "n_windows": int(n_windows)}
  return _CheckedIterator(inner, pipeline)


class _WindowBatch:
  """Maps the G window indices of a step to this process's batch dict."""

  def __init__(self, tokens, seq_len, lo, hi, packing, eot_id):
    self.tokens, self.seq_len, self.lo, self.hi = tokens, seq_len, lo, hi
    self.packing, self.eot_id = packing, eot_id

  def __call__(self, windows_G: np.ndarray) -> dict[str, np.ndarray]:
    starts_B = np.asarray(windows_G[self.lo:self.hi], dtype=np.int64) * self.seq_len
    return make_batch(_gather(self.tokens, starts_B, self.seq_len + 1),
                      packing=self.packing, eot_id=self.eot_id)


class _CheckedIterator(grain.DatasetIterator):
  """grain's iterator, with a state that also records (and checks) the pipeline settings."""

  def __init__(self, inner: grain.DatasetIterator, pipeline: dict[str, Any]):
    super().__init__(inner)
    self._inner = inner
    self._pipeline = pipeline

  def __next__(self):
    return next(self._inner)

  def get_state(self) -> dict[str, Any]:
    return {"grain": self._inner.get_state(), "pipeline": dict(self._pipeline)}

  def set_state(self, state: dict[str, Any]) -> None:
    if not isinstance(state, dict) or "grain" not in state or "pipeline" not in state:
      raise ValueError("not a rove_jax data-iterator state (expected keys 'grain' and "
                       f"'pipeline'), got {type(state).__name__} "
                       f"{sorted(state) if isinstance(state, dict) else ''}")
    saved = state["pipeline"]
    diffs = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in self._pipeline.items()
             if saved.get(k) != v]
    if diffs:
      raise ValueError("the saved data-iterator state belongs to a different pipeline ("
                       + "; ".join(diffs) + "); resume with the same data settings or start "
                       "a fresh run")
    self._inner.set_state(state["grain"])

  def __str__(self) -> str:
    return f"rove_jax.data.train_iterator({self._pipeline})"


def eval_batches(tokens, *, seq_len: int, batch_size: int, max_batches: Optional[int] = None,
                 process_index: int = 0, process_count: int = 1, packing: bool = False,
                 eot_id: Optional[int] = None) -> Iterator[dict[str, np.ndarray]]:
  """Deterministic evaluation batches: windows in order, no shuffle, a partial last batch
  dropped.

  Args:
    tokens: [N] flat validation tokens.
    seq_len: T.
    batch_size: global rows per batch (divisible by process_count); each process yields its
      rows [p*B, (p+1)*B) as in `train_iterator`.
    max_batches: stop after this many batches (None: all full batches).
    packing, eot_id: as in `train_iterator`.

  Returns:
    an iterator of batch dicts (see `train_iterator`); always the same ones for the same args.
  """
  tokens = _check_tokens(tokens, seq_len)
  lo, hi = _process_rows(batch_size, process_index, process_count)
  _check_packing(packing, eot_id)
  if max_batches is not None and (isinstance(max_batches, bool) or not isinstance(
      max_batches, (int, np.integer)) or max_batches < 1):
    raise ValueError(f"max_batches must be a positive int or None, got {max_batches!r}")
  n_windows = (tokens.size - 1) // seq_len
  n_batches = n_windows // batch_size
  if n_batches == 0:
    raise ValueError(
        f"{tokens.size} validation tokens make {n_windows} windows of seq_len={seq_len}, fewer "
        f"than batch_size={batch_size}: lower batch_size or seq_len, or hold out more data")
  if max_batches is not None:
    n_batches = min(n_batches, int(max_batches))

  def batches():
    for b in range(n_batches):
      starts_B = (b * batch_size + np.arange(lo, hi, dtype=np.int64)) * seq_len
      yield make_batch(_gather(tokens, starts_B, seq_len + 1), packing=packing, eot_id=eot_id)
  return batches()


def make_batch(windows_BW, *, packing: bool = False,
               eot_id: Optional[int] = None) -> dict[str, np.ndarray]:
  """Splits windows [B, T + 1] into inputs/targets (+ segment_ids/positions with packing)."""
  windows_BW = np.asarray(windows_BW, dtype=np.int32)
  batch = {"inputs": windows_BW[:, :-1], "targets": windows_BW[:, 1:]}
  if packing:
    inputs_BT = batch["inputs"]
    eot_BT = (inputs_BT == eot_id).astype(np.int32)
    # Exclusive cumsum: a token's segment counts the end-of-text tokens strictly before it.
    batch["segment_ids"] = (np.cumsum(eot_BT, axis=1) - eot_BT).astype(np.int32)
    t_T = np.arange(inputs_BT.shape[1], dtype=np.int32)
    after_eot_BT = np.zeros_like(inputs_BT)
    after_eot_BT[:, 1:] = np.where(eot_BT[:, :-1] == 1, t_T[None, 1:], 0)
    start_BT = np.maximum.accumulate(after_eot_BT, axis=1)  # where each token's document began
    batch["positions"] = (t_T[None, :] - start_BT).astype(np.int32)
  return batch


def _gather(tokens, starts_B: np.ndarray, width: int) -> np.ndarray:
  # One contiguous slice per row: cheap on a memmap, reads only these rows' pages.
  return np.stack([np.asarray(tokens[s:s + width], dtype=np.int32) for s in starts_B.tolist()])


def _check_tokens(tokens, seq_len) -> np.ndarray:
  if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive int, got seq_len={seq_len!r}")
  if not isinstance(tokens, np.ndarray):
    tokens = np.asarray(tokens)
  if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
    raise ValueError(f"tokens must be a flat integer array [N], got {tokens.dtype} "
                     f"{tokens.shape}")
  if tokens.size < seq_len + 1:
    raise ValueError(f"{tokens.size} tokens cannot fill one window of seq_len + 1 = "
                     f"{seq_len + 1}; lower seq_len or use more data")
  return tokens


def _process_rows(global_batch_size, process_index, process_count) -> tuple[int, int]:
  for name, value, low in (("global_batch_size", global_batch_size, 1),
                           ("process_count", process_count, 1),
                           ("process_index", process_index, 0)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
      raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
  if not process_index < process_count:
    raise ValueError(f"process_index={process_index} must be < process_count={process_count}")
  if global_batch_size % process_count:
    raise ValueError(
        f"global_batch_size={global_batch_size} is not divisible by process_count="
        f"{process_count}; use a multiple of {process_count}")
  per_process = global_batch_size // process_count
  return process_index * per_process, (process_index + 1) * per_process


def _check_packing(packing, eot_id) -> None:
  if packing and eot_id is None:
    raise ValueError("packing=True needs eot_id (the tokenizer's end-of-text id) to find "
                     "document boundaries")


# ---------------------------------------------------------------------------------- prepare


@dataclasses.dataclass(frozen=True, eq=False)
class Data:
  """A run's tokenizer and token arrays, from `prepare`."""
  tokenizer: Tokenizer
  train_tokens: np.ndarray
  val_tokens: np.ndarray

  def train_iterator(self, **kwargs) -> grain.DatasetIterator:
    """`train_iterator(self.train_tokens, eot_id=tokenizer.eot_id, **kwargs)`."""
    return train_iterator(self.train_tokens, eot_id=self.tokenizer.eot_id, **kwargs)

  def eval_batches(self, **kwargs) -> Iterator[dict[str, np.ndarray]]:
    """`eval_batches(self.val_tokens, eot_id=tokenizer.eot_id, **kwargs)`."""
    return eval_batches(self.val_tokens, eot_id=self.tokenizer.eot_id, **kwargs)


def prepare(corpus: Corpus, tokenizer: str = "bytes", *, workdir: str,
            vocab_size: Optional[int] = None, max_train_tokens: Optional[int] = None,
            max_val_tokens: Optional[int] = None,
            bpe_train_chars: int = 1_000_000_000) -> Data:
  """Builds (or reloads from workdir) a run's tokenizer and train/val token arrays.

  Args:
    corpus: the `Corpus`.
    tokenizer: a `tokenization.get_tokenizer` spec; "bpe" trains on the train split once and
      keeps the file in workdir.
    workdir: the run directory; tokens are cached in workdir/data.
    vocab_size: for "bpe".
    max_train_tokens, max_val_tokens: caps (see `load_tokens`).
    bpe_train_chars: BPE training reads at most this many characters of training text.

  Returns:
    `Data`; call data.train_iterator(seq_len=..., global_batch_size=..., seed=...) and
    data.eval_batches(seq_len=..., batch_size=...).
  """
  workdir = os.fspath(workdir)
  tok = tokenization.get_tokenizer(
      tokenizer, workdir=workdir, vocab_size=vocab_size,
      train_texts=lambda: _take_chars(iter_documents(corpus, "train"), bpe_train_chars))
  cache_dir = os.path.join(workdir, "data")
  train = load_tokens(corpus, "train", tok, cache_dir=cache_dir, max_tokens=max_train_tokens)
  val = load_tokens(corpus, "val", tok, cache_dir=cache_dir, max_tokens=max_val_tokens)
  return Data(tok, train, val)


def _take_chars(docs: Iterable[str], limit: int) -> Iterator[str]:
  total = 0
  for doc in docs:
    if total >= limit:
      return
    total += len(doc)
    yield doc


def _log(message: str) -> None:
  print(f"[rove_jax.data] {message}", file=sys.stderr, flush=True)
