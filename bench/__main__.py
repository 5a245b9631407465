"""Benchmark suite: python -m bench --suite cpu|gpu [--out FILE] [--quick]

Prints markdown tables (train step RoVE/RoPE/NoPE with MFU, peak memory, long-context forward,
KV-cache decoding, compile time vs depth) and writes every number as JSON to --out.
The work is in bench/suite.py; see its docstring for what each part measures.
"""

from __future__ import annotations

import argparse
import os


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--suite", required=True, choices=["cpu", "gpu"])
  p.add_argument("--out", help="write all results here as JSON")
  p.add_argument("--quick", action="store_true",
                 help="tiny shapes and few repeats (about 3 minutes on 2 CPU cores)")
  args = p.parse_args(argv)
  if args.suite == "gpu":
    # Set before JAX starts: without it the parent grabs 75% of the GPU and the memory and
    # long-context subprocesses could not allocate; peak_bytes_in_use stays meaningful.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  from bench import suite  # JAX initialises here, after the environment is set

  suite.run(args.suite, args.quick, args.out)


if __name__ == "__main__":
  main()
