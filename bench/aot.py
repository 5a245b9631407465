"""Compile a run's train step, long-context evaluation and decoding step for a TPU slice, here.

  python -m bench.aot --config configs/gpt2_124m.py --topology v5e-8 \\
      [--config.mesh.fsdp=2 --config.optim.grad_accum=8 ...] [--recommend] \\
      [--jobs train,eval,decode] [--eval-len 16384] [--decode-len N] [--eval-impl chunked] \\
      [--batch N] [--json OUT] [--markdown] [--dump-hlo DIR]

No TPU is needed, only libtpu (pip install 'rove_jax[tpu]'). No GPU is needed for
--topology h100-8 / h200-8 (N GPUs: 1-8 or whole hosts of 8), only JAX's CUDA plugin and ptxas
(rove_jax/aot/gpu.py names the wheels). --topology cpu:N uses this host's CPU devices, local the
devices this process runs on. --config and --config.a.b=value overrides work as for train.py
(the same parser, rove_jax.cli.train). --recommend applies the mesh and grad_accum of
rove_jax.aot.compile.recommend (a --config.mesh.* or --config.optim.grad_accum on the command
line wins). For each job it
prints the per-device memory against the chip's HBM, FLOPs (compiled and model), bytes
accessed, collectives and a roofline bound on step time and MFU (bounds from the compiler's
figures, not measurements; see rove_jax/aot/analysis.py). A program that does not fit
the chip's HBM is reported as such (XLA's TPU compiler refuses it). --json writes every figure,
--markdown prints rows for bench/RESULTS.md, --dump-hlo the compiled HLO. Progress goes to
stderr with elapsed seconds: a TPU compile takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# JAX's CUDA plugin registers without a driver only with this set (compile-only GPU topologies);
# it must be set before JAX starts.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def load_config(argv: list[str]):
  """The run config of `--config FILE [--config.a.b=value ...]`, read as rove-train reads it;
  returns (config, the config file's name)."""
  from rove_jax.cli import train as train_cli
  from rove_jax.train import overrides

  argv = train_cli._rewrite_config_flag(["bench.aot"] + argv)
  given = overrides.split(argv[1:])
  rest = [a for a in argv[1:] if not a.startswith("--config.")]
  spec = train_cli.config_arg(argv)
  if spec is None:
    raise ValueError(
      "--config is required: a config file (configs/gpt2_124m.py) or a packaged config's name"
    )
  extra = [a for a in rest if a not in ("--config", spec, f"--config={spec}")]
  if extra:
    raise ValueError(f"unexpected arguments {extra}; every setting is a flag")
  c = overrides.apply(overrides.load_file(spec), given)
  return c, os.path.basename(spec.split(":")[0]).removesuffix(".py")


def markdown(name: str, reports: list[dict]) -> str:
  """Rows for bench/RESULTS.md (bench.aot_summary's table)."""
  from bench import aot_summary

  return aot_summary.table([dict(r, config=name) for r in reports])


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m bench.aot",
    description=__doc__,
    allow_abbrev=False,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument(
    "--topology",
    required=True,
    help="v5e-8, v5e-256, v4-32, v5p-128, v6e-16, v5e:2x4, v4:2x2x4 or cpu:N",
  )
  p.add_argument("--jobs", default="train", help="comma-separated: train, eval, decode")
  p.add_argument("--eval-len", type=int, default=16384, help="evaluation length (and cache)")
  p.add_argument("--decode-len", type=int, help="KV-cache length of decode (default eval-len)")
  p.add_argument("--eval-impl", help="attention kernel of eval (default: evaluation's own)")
  p.add_argument("--batch", type=int, help="eval/decode sequences (default: data-parallel size)")
  p.add_argument(
    "--recommend",
    action="store_true",
    help="use aot.recommend's mesh and grad_accum unless given as --config.*",
  )
  p.add_argument("--json", help="write every figure here")
  p.add_argument("--dump-hlo", metavar="DIR", help="write each job's compiled HLO text here")
  p.add_argument("--markdown", action="store_true", help="print rows for bench/RESULTS.md")
  args, rest = p.parse_known_args(argv)
  t0 = time.perf_counter()
  log = lambda line: print(
    f"[{time.perf_counter() - t0:7.1f} s] {line}", file=sys.stderr, flush=True
  )
  jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
  try:
    from rove_jax.aot import compile as aot
    from rove_jax.train import overrides

    bad = [j for j in jobs if j not in aot.JOBS]
    if bad:
      raise ValueError(f"--jobs: unknown {bad}; choose from {aot.JOBS}")
    topology = aot.parse_topology(args.topology)
    c, name = load_config(rest)
    if args.recommend:
      rec = aot.recommend(c, topology)
      explicit = " ".join(rest)
      chosen = {}
      if "--config.mesh." not in explicit:
        chosen.update({f"mesh.{axis}": size for axis, size in rec["mesh"].items()})
      if "--config.optim.grad_accum" not in explicit:
        chosen["optim.grad_accum"] = rec["grad_accum"]
      c = overrides.apply(c, chosen)
      log(
        f"recommended mesh {rec['mesh']}, grad_accum {rec['grad_accum']} (state "
        f"{rec['state_bytes_per_device'] / 2**30:.2f} GiB, activations "
        f"{rec['activation_bytes_per_device'] / 2**30:.2f} GiB a device; rule: "
        f"rove_jax.aot.compile.recommend)"
      )
    if args.dump_hlo:
      os.makedirs(args.dump_hlo, exist_ok=True)
    reports = []
    for job in jobs:
      r = aot.compile_job(
        c,
        topology,
        job,
        eval_len=args.eval_len,
        decode_len=args.decode_len,
        eval_impl=args.eval_impl,
        batch=args.batch,
        log=log,
        hlo_path=args.dump_hlo and os.path.join(args.dump_hlo, f"{job}.hlo"),
      )
      reports.append(r)
      print(aot.format_report(r), end="\n\n", flush=True)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except ImportError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if args.markdown:
    print(markdown(name, reports))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(
        {"argv": sys.argv if argv is None else argv, "config": name, "reports": reports},
        f,
        indent=2,
        default=str,
      )
    log(f"wrote {args.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
