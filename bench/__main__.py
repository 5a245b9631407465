"""Benchmark suite: python -m bench --suite cpu|gpu [--out FILE] [--quick | --smoke]

Prints markdown tables (train step RoVE/RoPE/NoPE with MFU, peak memory, long-context forward,
KV-cache decoding, compile time vs depth) and writes every number as JSON to --out.
The work is in bench/suite.py (with bench/isolated.py and bench/measure.py); see its docstring
for what each part measures.
"""

from __future__ import annotations

import argparse
import os


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="python -m bench",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--suite", required=True, choices=["cpu", "gpu"])
  p.add_argument("--out", help="write all results here as JSON")
  p.add_argument(
    "--quick",
    action="store_true",
    help="tiny shapes and few repeats (about 3 minutes on 2 CPU cores)",
  )
  p.add_argument(
    "--smoke",
    action="store_true",
    help="cpu suite at the smallest shapes: checks that every section runs and "
    "prints (under a minute); its figures mean nothing",
  )
  args = p.parse_args(argv)
  if args.smoke and args.suite != "cpu":
    p.error("--smoke is for --suite cpu; the gpu suite's smallest run is --quick")
  if args.suite == "gpu":
    # Set before JAX starts: without it the parent grabs 75% of the GPU and the memory and
    # long-context subprocesses could not allocate; peak_bytes_in_use stays meaningful.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  from bench import suite  # JAX initialises here, after the environment is set

  suite.run(args.suite, args.quick, args.out, smoke=args.smoke)


if __name__ == "__main__":
  main()
