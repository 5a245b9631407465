"""rove-prepare (python -m rove_jax.cli.prepare): tokenize a corpus once into a prepared
directory; the work and the format are rove_jax.data.prepare_corpus's and
rove_jax.data.prepared's.

  rove-prepare --source text --path corpus/ --tokenizer bpe:8192 --out prepared/
  rove-prepare --source parquet --path 'fineweb-edu/*.parquet' \\
      --tokenizer tiktoken:gpt2 --out fineweb-gpt2/ --tokens-per-shard 100000000
  rove-prepare --check --out prepared/       (hash every shard against the manifest)

Train on it with --config.data.source=prepared --config.data.path=prepared/ (the tokenizer and
vocabulary size come from its manifest).

Failures end with one line `error: ...` on stderr and exit status 2 (bad input: arguments,
paths, a damaged or foreign dataset) or 1 (I/O and environment: disk, permissions, a missing
package, an offline tokenizer download, another rove-prepare); ROVE_JAX_TRACEBACK=1 adds the
traceback.
"""

from __future__ import annotations

import argparse
import errno
import sys
from typing import Optional, Sequence

from rove_jax.cli.errors import fail, missing_package
from rove_jax.data import prepared
from rove_jax.data.prepare_corpus import DEFAULT_TOKENS_PER_SHARD, prepare_dataset
from rove_jax.data.sources import SOURCES, Corpus
from rove_jax.storage import paths


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="rove-prepare",
    description="Tokenize a corpus once into memory-mapped shards with a "
    "manifest; train on it with --config.data.source=prepared --config.data.path=OUT.",
  )
  p.add_argument("--out", required=True, help="the prepared directory to write (or --check)")
  p.add_argument(
    "--check",
    action="store_true",
    help="only hash every shard of --out against its manifest, then exit",
  )
  p.add_argument(
    "--source", choices=[s for s in SOURCES if s not in ("prepared", "recall")], default="text"
  )
  p.add_argument(
    "--path", help="file, directory or glob (text, parquet); hf dataset name; library root (stdlib)"
  )
  p.add_argument("--val-path", help="explicit validation files, or hf split")
  p.add_argument("--text-field", default="text", help="jsonl key / parquet or hf column")
  p.add_argument(
    "--val-fraction",
    type=float,
    default=0.02,
    help="share held out for validation when --val-path is not given",
  )
  p.add_argument("--max-files", type=int, help="use only the first N files")
  p.add_argument("--hf-config", help="hf dataset configuration")
  p.add_argument("--hf-split", default="train", help="hf split of the training documents")
  p.add_argument("--hf-data-files", nargs="+", help="hf data_files (local parquet/json files)")
  p.add_argument(
    "--tokenizer",
    default="bytes",
    help="bytes | bpe | bpe:VOCAB | path/to/tokenizer.json | tiktoken:NAME",
  )
  p.add_argument("--vocab-size", type=int, help="for --tokenizer bpe")
  p.add_argument(
    "--bpe-train-chars",
    type=int,
    default=1_000_000_000,
    help="characters of training text a bpe tokenizer is trained on",
  )
  p.add_argument("--tokens-per-shard", type=int, default=DEFAULT_TOKENS_PER_SHARD)
  p.add_argument("--max-train-tokens", type=int)
  p.add_argument("--max-val-tokens", type=int)
  p.add_argument(
    "--overwrite",
    action="store_true",
    help="replace a dataset of another corpus or tokenizer in --out",
  )
  p.add_argument("--no-progress", action="store_true", help="no progress bars")
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  """The rove-prepare command.

  Args:
    argv: the arguments (default: sys.argv[1:]).

  Returns:
    the exit status: 0 done; 2 bad input (arguments, --out, a damaged or foreign dataset);
    1 I/O or environment (disk, permissions, a missing package, an offline tokenizer download,
    another rove-prepare writing --out); 130 interrupted. Failures print one line
    `error: ...` on stderr.
  """
  args = parser().parse_args(argv)
  try:
    if args.check:
      out = paths.resolve(args.out, what="--out")
      n = prepared.verify(out, cache_remote=False)
      print(f"{out}: all {n} shards match the manifest")
      return 0
    corpus = Corpus(
      source=args.source,
      path=args.path,
      val_path=args.val_path,
      text_field=args.text_field,
      val_fraction=args.val_fraction,
      max_files=args.max_files,
      hf_config=args.hf_config,
      hf_data_files=args.hf_data_files,
      hf_split=args.hf_split,
    )
    prepare_dataset(
      corpus,
      args.tokenizer,
      args.out,
      tokens_per_shard=args.tokens_per_shard,
      max_train_tokens=args.max_train_tokens,
      max_val_tokens=args.max_val_tokens,
      vocab_size=args.vocab_size,
      bpe_train_chars=args.bpe_train_chars,
      overwrite=args.overwrite,
      progress=not args.no_progress,
    )
  except KeyboardInterrupt:
    return fail("interrupted; rerun the same command to resume where it stopped", 130)
  except ValueError as e:  # DamagedDataset too
    return fail(str(e), 2)
  except ImportError as e:  # paths.MissingExtra (gcsfs), tokenizers, tiktoken, pyarrow
    return fail(missing_package(e), 1)
  except OSError as e:
    return fail(_os_error(e, args.out), 1)
  except RuntimeError as e:  # LockError, tiktoken's download: their messages name the fix
    return fail(str(e), 1)
  return 0


def _os_error(e: OSError, out: str) -> str:
  if e.errno in (errno.ENOSPC, errno.EDQUOT):
    return f"{type(e).__name__}: {e}; free disk space or choose another --out than {out}"
  if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
    return f"{type(e).__name__}: {e}; check its permissions (--out {out} must be writable)"
  return f"{type(e).__name__}: {e}"


def run() -> None:
  """The console-script entry point: main() as the exit status."""
  sys.exit(main())


if __name__ == "__main__":
  run()
