"""Local documents: file discovery and the readers of the text, parquet and stdlib sources.

Text files must be UTF-8 without NUL bytes: one the corpus path names itself is refused, one a
directory or glob matched is skipped with a warning (listing reads each file's first 8 KiB; a
bad byte found later fails the read, naming the file). Parquet files are checked for their
magic bytes when listed. Every read error names its file.

A `Unit` is one file (or, for the stdlib's pydoc topics, one topic): what the validation split
holds out whole, and what the token cache's key lists with its size and modification time.
"""

from __future__ import annotations

import ast
import codecs
import dataclasses
import glob as globlib
import io
import json
import os
import tokenize
import warnings
from typing import Callable, Iterator, Optional

TEXT_EXTENSIONS = (".txt", ".jsonl")
PARQUET_EXTENSIONS = (".parquet",)
STDLIB_EXTENSIONS = (".py", ".txt", ".rst", ".md")
_STDLIB_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")
_TOPICS = "pydoc_data/topics.py"
_SNIFF_BYTES = 8192  # read of each text file when listing: NUL bytes or bad UTF-8 -> binary
_TO_UTF8 = "convert it to UTF-8 text (e.g. iconv -t UTF-8) or remove it from the corpus"


@dataclasses.dataclass(frozen=True)
class Unit:
  """One file (or pydoc topic): the unit the validation split holds out."""

  key: str  # relative path, the input of the held-out hash
  docs: Callable[[], Iterator[str]]
  stamp: tuple = ()  # (size, mtime_ns): part of the token-cache key
  whole: bool = False  # exactly one document (a .txt file)


def resolve_files(pattern: str, exts: tuple[str, ...], what: str) -> tuple[list[str], bool]:
  """The sorted files a path, directory or glob names, all ending in one of exts.

  Args:
    pattern: a file, a directory (searched recursively) or a glob (`**` allowed).
    exts: the accepted file-name endings.
    what: names the corpus in error messages.

  Returns:
    (the file paths, sorted; whether pattern named one file itself rather than a directory or
    glob). Raises ValueError when nothing matches or a file has another ending.
  """
  expanded = os.path.expanduser(pattern)
  named = False
  # A path that exists is taken literally, so a directory or file whose name holds glob
  # characters (runs[1], what?) is read as named; only a path that does not exist is a glob.
  if os.path.isdir(expanded):
    files = sorted(
      os.path.join(d, f) for d, _, names in os.walk(expanded) for f in names if f.endswith(exts)
    )
    if not files:
      raise ValueError(f"{what}: the directory {pattern!r} holds no {exts} files")
  elif os.path.isfile(expanded):
    files, named = [expanded], True
  elif any(c in expanded for c in "*?["):
    files = sorted(f for f in globlib.glob(expanded, recursive=True) if os.path.isfile(f))
    if not files:
      raise ValueError(f"{what}: the glob {pattern!r} matched no files; expected {exts} files")
  else:
    raise ValueError(
      f"{what}: path {pattern!r} does not exist; expected a file, a directory "
      f"or a glob of {exts} files"
    )
  bad = [f for f in files if not f.endswith(exts)]
  if bad:
    raise ValueError(f"{what}: {bad[0]!r} is not one of {exts}; narrow the glob to those files")
  return files, named


def file_units(source: str, pattern: str, text_field: str) -> list[Unit]:
  """The units of a text or parquet corpus path (see `resolve_files`), in sorted order.

  Args:
    source: "text" or "parquet".
    pattern: the corpus path or val_path.
    text_field: the jsonl key / parquet column holding the text.

  Returns:
    one `Unit` per file, keyed by its path relative to the files' common directory. A text
    file that is not UTF-8 text (see `text_problem`) raises ValueError when pattern names it,
    and is skipped with a warning when a directory or glob matched it; a file that is not
    parquet (no PAR1 magic bytes) raises ValueError.
  """
  what = f"{source} corpus"
  exts = TEXT_EXTENSIONS if source == "text" else PARQUET_EXTENSIONS
  found, named = resolve_files(pattern, exts, what)
  files = [os.path.abspath(f) for f in found]
  if source == "text":
    files = _drop_binary(files, named, pattern, what)
  else:
    for f in files:
      _check_parquet_magic(f, what)
  # Keys relative to the files' common directory: the held-out choice survives moving the data.
  root = os.path.dirname(files[0]) if len(files) == 1 else os.path.commonpath(files)
  units = []
  for f in files:
    st = os.stat(f)
    key = os.path.relpath(f, root).replace(os.sep, "/")
    if source == "parquet":
      docs = _parquet_reader(f, text_field)
    elif f.endswith(".jsonl"):
      docs = _jsonl_reader(f, text_field)
    else:
      docs = _txt_reader(f)
    units.append(Unit(key, docs, (st.st_size, st.st_mtime_ns), whole=f.endswith(".txt")))
  return units


def _drop_binary(files: list[str], named: bool, pattern: str, what: str) -> list[str]:
  kept, skipped = [], []
  for f in files:
    problem = text_problem(f, _SNIFF_BYTES)
    if problem is None:
      kept.append(f)
    elif named:
      raise ValueError(f"{what}: {f} is not UTF-8 text ({problem}); {_TO_UTF8}")
    else:
      skipped.append(f)
      warnings.warn(
        f"{what}: skipping {f}, matched by {pattern!r}: it is not UTF-8 text "
        f"({problem}); {_TO_UTF8}",
        stacklevel=2,
      )
  if not kept:
    raise ValueError(
      f"{what}: none of the {len(skipped)} files {pattern!r} matched is UTF-8 "
      f"text (skipped {skipped[:3]}); point path at text files or convert them "
      f"to UTF-8"
    )
  return kept


def text_problem(path: str, limit: Optional[int] = None) -> Optional[str]:
  """Why a file is not UTF-8 text (a NUL byte, invalid UTF-8), or None if it is.

  Args:
    path: the file.
    limit: look at only its first limit bytes (None: all of it).

  Returns:
    None, or a short reason with the byte offset, e.g. "invalid UTF-8 at byte 12".
  """
  decoder = codecs.getincrementaldecoder("utf-8")()
  offset = 0
  with open(path, "rb") as f:
    while limit is None or offset < limit:
      chunk = f.read(1 << 20 if limit is None else min(1 << 20, limit - offset))
      pending = len(decoder.getstate()[0])  # bytes of an unfinished character
      if not chunk:
        try:
          decoder.decode(b"", final=True)
        except UnicodeDecodeError:
          return f"a truncated UTF-8 sequence at its end, byte {offset - pending}"
        return None
      nul = chunk.find(b"\x00")
      if nul >= 0:
        return f"a NUL byte at byte {offset + nul}"
      try:
        decoder.decode(chunk)
      except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {offset - pending + e.start}"
      offset += len(chunk)
  return None


def _read_text_error(path: str, error: UnicodeDecodeError) -> ValueError:
  problem = text_problem(path) or f"{error.reason}"
  return ValueError(f"text corpus: {path} is not UTF-8 text ({problem}); {_TO_UTF8}")


def _txt_reader(path: str):
  def docs():
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except UnicodeDecodeError as e:
      raise _read_text_error(path, e) from None
    if "\x00" in text:
      raise ValueError(
        f"text corpus: {path} is not text (a NUL byte at character "
        f"{text.index(chr(0))}); {_TO_UTF8}"
      )
    yield text

  return docs


def guarded(
  items,
  error: Callable[[Exception, int], Exception],
  *,
  catch=Exception,
  count: Callable[[object], int] = lambda item: 1,
) -> Iterator:
  """Yields from items; an exception of type `catch` raised while getting the next one becomes
  `error(e, n)`, n the total `count` of the items yielded before it (rows read, for a message
  that says where reading failed). Exceptions raised by the consumer are not touched."""
  items, n = iter(items), 0
  while True:
    try:
      item = next(items)
    except StopIteration:
      return
    except catch as e:
      raise error(e, n) from e
    n += count(item)
    yield item


def _jsonl_reader(path: str, field: str):
  def docs():
    with open(path, encoding="utf-8") as f:
      lines = guarded(
        enumerate(f, 1), lambda e, _: _read_text_error(path, e), catch=UnicodeDecodeError
      )
      for line_no, line in lines:
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(
            f"{path}:{line_no} is not valid JSON ({e}); fix or remove that "
            f"line (one JSON object per line)"
          ) from None
        yield text_of(row, field, f"{path}:{line_no}")

  return docs


def _check_parquet_magic(path: str, what: str) -> None:
  # Cheap (8 bytes): a truncated download or a non-parquet file fails here, before any work.
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(4)
    f.seek(max(size - 4, 0))
    tail = f.read(4)
  if size < 12 or head not in (b"PAR1", b"PARE") or tail != head:
    raise ValueError(
      f"{what}: {path} is not a parquet file ({size} bytes, starting "
      f"{head!r} and ending {tail!r}, not with the magic bytes b'PAR1'): a "
      f"truncated download or another format; re-download it or remove it"
    )


def _parquet_reader(path: str, field: str):
  def docs():
    try:
      import pyarrow as pa
      import pyarrow.parquet as pq
    except ImportError as e:
      raise ImportError("the parquet source needs pyarrow: pip install 'rove_jax[data]'") from e
    fix = "the file is damaged or not parquet: re-download it or remove it"
    try:
      pf = pq.ParquetFile(path)
      schema = pf.schema_arrow
    except Exception as e:  # pyarrow's errors name no file
      raise ValueError(
        f"parquet file {path} could not be opened ({type(e).__name__}: {e}); {fix}"
      ) from e
    if field not in schema.names:
      raise ValueError(
        f"parquet file {path} has no column text_field={field!r}; its columns "
        f"are {schema.names}; set text_field"
      )
    kind = schema.field(field).type
    is_view = getattr(pa.types, "is_string_view", lambda _: False)  # pyarrow >= 16
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or is_view(kind)):
      raise ValueError(
        f"parquet file {path}: column text_field={field!r} holds {kind}, not "
        f"text; set text_field to the text column"
      )
    # Row-group batches: a multi-GB shard never sits in memory at once.
    batches = guarded(
      pf.iter_batches(batch_size=1024, columns=[field]),
      lambda e, rows: ValueError(
        f"parquet file {path}: reading column {field!r} failed after "
        f"{rows} rows ({type(e).__name__}: {e}); {fix}"
      ),
      count=lambda batch: batch.num_rows,
    )
    for batch in batches:
      for text in batch.column(0).to_pylist():
        if text is not None:
          yield text

  return docs


def text_of(row, field: str, where: str) -> str:
  """row[field] as a string ("" for None); a clear error for a missing or non-text field."""
  if not isinstance(row, dict) or field not in row:
    keys = sorted(row) if isinstance(row, dict) else type(row).__name__
    raise ValueError(f"{where} has no text_field={field!r} (found {keys}); set text_field")
  text = row[field]
  if text is not None and not isinstance(text, str):
    raise ValueError(f"{where}: text_field={field!r} holds {type(text).__name__}, not text")
  return text or ""


# ----------------------------------------------------------------------------------- stdlib


def stdlib_units(root: str) -> list[Unit]:
  """The standard library under root: its sources and docs, one unit per file or pydoc topic.

  Args:
    root: the library root (the directory holding os.py, for instance).

  Returns:
    units sorted by relative path; site-packages, virtualenvs, __pycache__ and empty files are
    skipped.
  """
  root = os.path.abspath(os.path.expanduser(root))
  if not os.path.isdir(root):
    raise ValueError(
      f"stdlib corpus: the library root {root!r} does not exist; expected the "
      f"directory holding the standard library's .py files"
    )
  units = []
  for dirpath, dirnames, filenames in os.walk(root):
    # A virtualenv (pyvenv.cfg) or installed packages are not the standard library.
    dirnames[:] = sorted(
      d
      for d in dirnames
      if d not in _STDLIB_SKIP_DIRS and not os.path.exists(os.path.join(dirpath, d, "pyvenv.cfg"))
    )
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
        units += [
          Unit(f"{key}::{t}", lambda text=text: iter([text]), stamp)
          for t, text in sorted(topics.items())
        ]
      else:
        units.append(Unit(key, lambda p=path: _read_stdlib_file(p), stamp))
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
        isinstance(t, ast.Name) and t.id == "topics" for t in node.targets
      ):
        topics = ast.literal_eval(node.value)
        if isinstance(topics, dict) and all(isinstance(v, str) for v in topics.values()):
          return {str(k): v for k, v in topics.items()}
  except (SyntaxError, ValueError, UnicodeDecodeError):
    pass
  return None  # an unexpected layout: read it as ordinary source
