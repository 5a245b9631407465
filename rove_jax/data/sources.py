"""Corpora: what a `Corpus` names, and its documents split into "train" and "val".

The validation split is `val_path` when given; else a deterministic held-out `val_fraction`: of
the files (chosen by a hash of each file's relative path) when there are several; of the
documents (every round(1 / val_fraction)-th, starting with the first) in a single .jsonl /
parquet file or an hf stream; of the text's tail, cut at a line break, for a single .txt file.
The held-out part is never empty and never overlaps "train". The synthetic "recall" source
(rove_jax.tasks.recall) generates both splits from its spec, the corpus path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from rove_jax.data import files, hf
from rove_jax.tasks import recall

SOURCES = ("stdlib", "text", "parquet", "hf", "recall", "prepared")
SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class Corpus:
  """Where the documents come from (see the `rove_jax.data` docstring for each source).

  Attributes:
    source: one of SOURCES.
    path: file, directory or glob (text, parquet); dataset name (hf); library root (stdlib,
      default: this interpreter's); "name=value,..." sizes (recall: `recall.RecallSpec`);
      the directory rove-prepare wrote (prepared: rove_jax.data.prepared).
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
    # sorted tuple of pairs; hf.hf_texts turns them back into what load_dataset takes.
    data_files = self.hf_data_files
    if isinstance(data_files, dict):
      data_files = tuple(sorted((str(k), _as_files(v)) for k, v in data_files.items()))
    elif data_files is not None:
      data_files = _as_files(data_files)
    object.__setattr__(self, "hf_data_files", data_files)
    if self.source in ("text", "parquet", "hf", "prepared") and not self.path:
      want = {
        "text": "a .txt/.jsonl file, directory or glob",
        "parquet": "a .parquet file, directory or glob",
        "prepared": "the directory rove-prepare wrote",
        "hf": "a dataset name such as 'HuggingFaceFW/fineweb-edu' (or 'parquet' with "
        "hf_data_files)",
      }[self.source]
      raise ValueError(f"corpus source {self.source!r} needs path: {want}")
    if self.source == "stdlib" and self.val_path is not None:
      raise ValueError(
        "the stdlib corpus holds out its validation files itself; val_path is "
        "for the text, parquet and hf sources"
      )
    if self.source == "recall":
      recall.RecallSpec.parse(self.path)  # a bad spec fails here, naming the field
      if self.val_path is not None or self.max_files is not None:
        raise ValueError(
          "the recall source generates its own validation split and has no "
          "files: leave val_path and max_files unset"
        )
    if self.source == "prepared":
      # The split and the files were fixed when the corpus was prepared.
      fixed = [
        f.name
        for f in dataclasses.fields(self)
        if f.name not in ("source", "path") and getattr(self, f.name) != f.default
      ]
      if fixed:
        raise ValueError(
          f"a prepared corpus was split and read by rove-prepare: leave {fixed} "
          f"unset (they are rove-prepare options)"
        )
    if not (isinstance(self.val_fraction, (int, float)) and 0.0 < self.val_fraction < 1.0):
      raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
    if self.source == "hf" and self.val_path is not None and self.val_path == self.hf_split:
      raise ValueError(
        f"val_path={self.val_path!r} is also hf_split, the training split; name "
        f"a separate validation split (e.g. 'validation') or drop val_path"
      )
    if self.max_files is not None:
      if self.source == "hf":
        raise ValueError(
          "max_files limits local files; for the hf source cap the tokens with max_tokens instead"
        )
      if (
        isinstance(self.max_files, bool)
        or not isinstance(self.max_files, int)
        or (self.max_files < 1)
      ):
        raise ValueError(f"max_files must be a positive int or None, got {self.max_files!r}")
    if not self.text_field:
      raise ValueError("text_field must name the jsonl key / column holding the text")


def _as_files(paths):
  if isinstance(paths, (str, os.PathLike)):
    return os.fspath(paths)
  return tuple(os.fspath(f) for f in paths)


def iter_documents(corpus: Corpus, split: str = "train") -> Iterator[str]:
  """The non-empty documents of one split, in a deterministic order.

  Args:
    corpus: the `Corpus`.
    split: "train" or "val".

  Returns:
    an iterator of strings. Listing errors (missing path, empty glob) raise here, at once.
  """
  check_split(split)
  _not_prepared(corpus)
  if corpus.source == "hf":
    texts = hf.hf_texts(corpus, split)
    if corpus.val_path is None:  # one stream for both splits: hold out every n-th document
      texts = _every_nth(texts, corpus.val_fraction, split)
    return _nonempty(texts)
  units, val_units = list_units(corpus)
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
  """The keys whose stable hash falls below fraction: at least one, never all (if > 1 key).

  Args:
    keys: unit keys (relative file paths).
    fraction: the share to hold out, in (0, 1).

  Returns:
    the held-out subset of keys; the same for the same keys on any machine.
  """
  scores = {
    k: int.from_bytes(hashlib.sha256(k.encode("utf-8")).digest()[:8], "big") / 2.0**64 for k in keys
  }
  held = {k for k, s in scores.items() if s < fraction}
  if not held:
    held = {min(scores, key=scores.get)}
  if len(held) == len(scores) > 1:
    held.discard(max(scores, key=scores.get))
  return held


def loss_mask(corpus: Corpus):
  """[T] 0/1: which target positions of a training window count in the loss, for a source
  whose windows have a fixed layout (recall with answer_loss=1: the query values,
  `recall.loss_mask`); None (every target counts) otherwise."""
  if corpus.source != "recall":
    return None
  return recall.loss_mask(recall.RecallSpec.parse(corpus.path))


def list_units(corpus: Corpus) -> tuple[list[files.Unit], Optional[list[files.Unit]]]:
  """The training units and the val_path units (None without val_path) of a local corpus."""
  _not_prepared(corpus)
  if corpus.source == "recall":
    spec = recall.RecallSpec.parse(corpus.path)
    unit = lambda split: files.Unit(
      key=f"recall/{split}/{spec.to_string()}",
      docs=lambda: recall.documents(spec, split),
      stamp=(recall.FORMAT,),
    )
    return [unit("train")], [unit("val")]
  if corpus.source == "stdlib":
    units = files.stdlib_units(corpus.path or sysconfig.get_paths()["stdlib"])
    val_units = None
  else:
    units = files.file_units(corpus.source, corpus.path, corpus.text_field)
    val_units = (
      None
      if corpus.val_path is None
      else files.file_units(corpus.source, corpus.val_path, corpus.text_field)
    )
  if corpus.max_files is not None:
    units = units[: corpus.max_files]
  if val_units is not None:
    overlap = {u.key for u in units} & {u.key for u in val_units}
    if overlap:
      raise ValueError(
        f"val_path {corpus.val_path!r} and path {corpus.path!r} share files "
        f"{sorted(overlap)[:3]}; the validation files must be separate"
      )
  return units, val_units


def _not_prepared(corpus: Corpus) -> None:
  if corpus.source == "prepared":
    raise ValueError(
      f"the prepared corpus {corpus.path!r} holds token ids, not documents: "
      f"read it with load_tokens (or rove_jax.data.prepared.load)"
    )


def check_split(split) -> None:
  """Raises ValueError unless split is one of SPLITS."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")


def _every_nth(docs: Iterable[str], fraction: float, split: str) -> Iterator[str]:
  every = max(2, round(1.0 / fraction))
  for i, doc in enumerate(docs):
    if (i % every == 0) == (split == "val"):
      yield doc


def _tail_split(unit: files.Unit, fraction: float, split: str) -> Iterator[str]:
  (text,) = list(unit.docs()) or [""]
  cut = int(len(text) * (1.0 - fraction))
  newline = text.find("\n", max(cut - 1, 0))  # a cut already at a line start stays
  if 0 <= newline < len(text) - 1:
    cut = newline + 1
  head, tail = text[:cut], text[cut:]
  if not head.strip() or not tail.strip():
    raise ValueError(
      f"the single text file {unit.key!r} ({len(text)} characters) is too short to hold out "
      f"val_fraction={fraction} of it for validation; give val_path or more files"
    )
  yield head if split == "train" else tail


def _nonempty(docs: Iterable[str]) -> Iterator[str]:
  return (d for d in docs if d and not d.isspace())


def take_chars(docs: Iterable[str], limit: int) -> Iterator[str]:
  """The documents of `docs` up to the first that reaches `limit` characters in all (the BPE
  tokenizer's training text)."""
  total = 0
  for doc in docs:
    if total >= limit:
      return
    total += len(doc)
    yield doc
