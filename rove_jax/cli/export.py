"""rove-export (python -m rove_jax.cli.export): the newest verified checkpoint of a training
workdir, for inference (what is written: rove_jax.train.export).

    rove-export --workdir runs/tiny --out exports/tiny [--format auto]
    rove-export --workdir runs/tiny --out gs://bucket/exports/tiny   # the [gcs] extra

Exit status: 0 when the export is written; 2 for bad input (an unknown format, a workdir that
does not exist or holds no readable checkpoint, a model the format cannot hold, an existing
export without --overwrite); 1 for an I/O failure (--out is a file or not writable, the disk is
full, a storage error, gcsfs missing for a gs:// path). Failures end with one line
`rove-export: error: ...` on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from rove_jax.cli import platforms
from rove_jax.cli.errors import fail
from rove_jax.nn import pretrained
from rove_jax.storage import paths
from rove_jax.train import export

PROG = "rove-export"


def failure_status(e: BaseException) -> Optional[int]:
  """The exit status of an expected failure (1: I/O or a missing package; 2: bad input), or
  None for an unexpected exception (a bug: its traceback is kept)."""
  if isinstance(e, (OSError, ImportError)) or paths.is_storage_error(e):
    return 1
  if isinstance(e, ValueError):
    return 2
  return None


def main(argv: Optional[list] = None) -> int:
  parser = argparse.ArgumentParser(
    prog=PROG,
    description="Export the newest verified checkpoint of a training workdir as "
    "safetensors + config.json (GPT-2's format where it fits).",
  )
  parser.add_argument(
    "--workdir", required=True, help="the training run's --workdir (local or gs://bucket/path)"
  )
  parser.add_argument(
    "--out", required=True, help="the directory to write (local or gs://bucket/path)"
  )
  parser.add_argument(
    "--format",
    default="auto",
    choices=pretrained.FORMATS,
    help="auto: GPT-2's where the model fits it, else rove-jax's",
  )
  parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
  args = parser.parse_args(argv)
  platforms.skip_absent_accelerators()
  try:
    done = export.export_run(
      args.workdir,
      args.out,
      format=args.format,
      overwrite=args.overwrite,
      report=lambda msg: print(msg, file=sys.stderr),
    )
  except Exception as e:  # noqa: BLE001 -- sorted by failure_status; others re-raised
    status = failure_status(e)
    if status is None:
      raise
    return fail(str(e) or type(e).__name__, status, prefix=f"{PROG}: error")
  print(
    f"exported step {done['step']} of {args.workdir} in {done['format']} format to "
    f"{paths.dirname(done['config'])}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
