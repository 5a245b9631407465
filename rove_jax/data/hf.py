"""The "hf" source: documents streamed by `datasets.load_dataset(..., streaming=True)`."""

from __future__ import annotations

from typing import Iterator

from rove_jax.data.files import guarded, text_of


def hf_texts(corpus, split: str) -> Iterator[str]:
  """The texts of the hf split that holds `split`'s documents, streamed.

  Args:
    corpus: a `Corpus` with source "hf".
    split: "train" or "val". With val_path, "val" reads that hf split; without it both read
      hf_split, and the caller holds out every n-th document.

  Returns:
    an iterator of strings (possibly empty ones). Opening the dataset fails here, at once, with
    a ValueError naming path, config, split and data files.
  """
  try:
    import datasets
  except ImportError as e:
    raise ImportError(
      "the 'hf' source needs the datasets package: pip install 'rove_jax[hf]'"
    ) from e
  hf_split = (
    corpus.val_path if corpus.val_path is not None and split == "val" else (corpus.hf_split)
  )
  data_files = corpus.hf_data_files
  # Corpus keeps data_files hashable (tuples); load_dataset takes lists and dicts.
  if isinstance(data_files, tuple) and data_files and isinstance(data_files[0], tuple):
    data_files = {k: list(v) if isinstance(v, tuple) else v for k, v in data_files}
  elif isinstance(data_files, tuple):
    data_files = list(data_files)
  try:
    stream = datasets.load_dataset(
      corpus.path, corpus.hf_config, split=hf_split, data_files=data_files, streaming=True
    )
  except Exception as e:  # not found / offline / bad split: one clear boundary error
    raise ValueError(
      f"hf corpus: could not open dataset path={corpus.path!r} hf_config={corpus.hf_config!r} "
      f"split={hf_split!r} hf_data_files={corpus.hf_data_files!r} "
      f"({type(e).__name__}: {e})"
    ) from e
  where = f"hf dataset {corpus.path!r} split {hf_split!r}"
  return _texts(stream, corpus, where)


def _texts(stream, corpus, where: str) -> Iterator[str]:
  # A damaged data file or a dropped connection, mid-stream: one error naming where.
  rows = guarded(
    stream,
    lambda e, n: ValueError(
      f"{where}: reading failed after {n} rows ({type(e).__name__}: {e}); check the files of "
      f"hf_data_files={corpus.hf_data_files!r} (re-download a damaged one) or the connection"
    ),
  )
  for row in rows:
    yield text_of(row, corpus.text_field, where)
