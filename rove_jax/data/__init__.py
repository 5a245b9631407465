"""Text corpora -> token streams -> resumable grain batches.

One concern a module:
  sources.py      Corpus, the train/val split, iter_documents, held_out_keys
  files.py        local files: discovery, the .txt/.jsonl/parquet readers, the stdlib corpus
  hf.py           the hf source: datasets.load_dataset(..., streaming=True)
  token_cache.py  load_tokens: documents -> flat token array, cached as tokens-*.npy with a
                  tokens-*.json record that is checked on load (a damaged cache is rebuilt)
  pipeline.py     train_iterator (grain), eval_batches, make_batch, prepare -> Data (with its
                  identity)
  identity.py     what Data.identity holds; describe_identity_change: what changed, in words
  prepared.py     the "prepared" source: a corpus tokenized once into memory-mapped shards,
                  read and verified
  prepared_format.py  its format: file names, the manifest read and checked, its identity
  shard_check.py  a run's check of those shards at every start: each hashed once per machine,
                  then again only when its file changed (records in the local cache)
  prepare_corpus.py  writes one: prepare_dataset, the rove-prepare command
                  (also `python -m rove_jax.cli.prepare`, prepare.py)
  shard_writer.py    its work on one split: tokenized into shards, resumable

Storage: what a run writes or reads back goes through rove_jax.storage.paths, so a workdir
(token cache, bpe tokenizer file) and a prepared dataset may be local or gs://bucket/path; a
prepared dataset's shards on gs:// are copied once to a local cache and memory-mapped there.
The corpus sources a user names (text, parquet, stdlib files) are read from local disk.

Shape letters (here):
  B  per-process batch = global_batch_size / process_count
  T  sequence length (seq_len)              W  window length = T + 1
  N  tokens in a flat token array

Public API:
  Corpus(source, path=None, ...)                  frozen description of a corpus (see below)
  iter_documents(corpus, split) -> Iterator[str]  the documents of the "train" or "val" split
  load_tokens(corpus, split, tokenizer, *, cache_dir=None, max_tokens=None, write_cache=True)
      -> tokens [N]
  train_iterator(tokens, *, seq_len, global_batch_size, seed, ...) -> grain DatasetIterator
  eval_batches(tokens, *, seq_len, batch_size, max_batches=None, ...) -> Iterator[batch]
  make_batch(windows_BW, *, packing=False, eot_id=None, loss_mask_T=None) -> batch
      windows [B, W] -> batch dict
  held_out_keys(keys, fraction) -> set[str]       which files the validation split holds out
  prepare(corpus, tokenizer, *, workdir, ...) -> Data(tokenizer, train_tokens, val_tokens,
      loss_mask_T, identity)
      identity: a small JSON dict, equal for the same token streams, different when they
      differ; pipeline.describe_identity_change(saved, now) -> str says what changed
  prepare_dataset(corpus, tokenizer, out, *, tokens_per_shard, ...) -> manifest
      tokenizes a corpus once into the prepared directory out (rove-prepare), holding its
      writer lock (rove_jax.storage.lock)

Sources:
  "stdlib"   the running interpreter's standard library: its *.py sources plus its docs (the
             pydoc topics text, .txt/.rst/.md files), tens of MB, no download. Site-packages,
             virtualenvs, __pycache__ and empty files are skipped; files are read in sorted
             relative-path order. `path` may name another library root.
  "text"     .txt files (one document each) and .jsonl files (one document per line, the
             `text_field` of each object), from a file, a directory or a glob. UTF-8 only: a
             binary file is refused when named, skipped with a warning when matched.
  "parquet"  parquet shards (file, directory or glob) with a `text_field` column, read one
             row-group batch at a time (FineWeb-Edu shards, for instance).
  "hf"       `datasets.load_dataset(path, hf_config, split=hf_split, streaming=True)`; the `hf`
             extra. For local files use path="parquet" (or "json") and hf_data_files.
  "prepared" the directory `rove-prepare` wrote (local or gs://) from one of the sources
             above: its train and val token shards, read without tokenizing; the tokenizer
             must be the one it was made with (see prepared.py).

The validation split, windows, packing and resuming are described in sources.py and
pipeline.py.
"""

from rove_jax import extras

extras.require("train", "rove_jax.data")

from rove_jax.data.files import PARQUET_EXTENSIONS, STDLIB_EXTENSIONS, TEXT_EXTENSIONS
from rove_jax.data.pipeline import Data, eval_batches, make_batch, prepare, train_iterator
from rove_jax.data.prepare_corpus import prepare_dataset
from rove_jax.data.sources import SOURCES, SPLITS, Corpus, held_out_keys, iter_documents
from rove_jax.data.token_cache import load_tokens

__all__ = [
  "Corpus",
  "SOURCES",
  "SPLITS",
  "TEXT_EXTENSIONS",
  "PARQUET_EXTENSIONS",
  "STDLIB_EXTENSIONS",
  "iter_documents",
  "held_out_keys",
  "load_tokens",
  "train_iterator",
  "eval_batches",
  "make_batch",
  "prepare",
  "Data",
  "prepare_dataset",
]
