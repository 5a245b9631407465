"""Attention benchmarks on this machine.

python -m bench.attention ratio   [--B 4 --T 1024 --H 8 --D 64 --repeats 15]
    forward+backward time of rove_attention / rope_attention (xla kernel), interleaved
    repeats in one process, medians and the ratio.
python -m bench.attention longctx [--lengths 4096,8192,16384,32768 --impl chunked]
    a forward pass of rove_attention at each length in a fresh subprocess; reports time and
    the subprocess's peak RSS, and where it stops fitting (out of memory or --max-gib).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import rove_jax as rj
from bench import peak_rss_gib
from rove_jax import kernels


def _inputs(B, T, H, K, D, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (B, T, H, D), dtype)
  k = jax.random.normal(keys[1], (B, T, K, D), dtype)
  v = jax.random.normal(keys[2], (B, T, K, D), dtype)
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  return q, k, v, pos


def ratio(args) -> dict:
  q, k, v, pos = _inputs(args.B, args.T, args.H, args.H, args.D)
  rope = rj.Rope(rj.rope_frequencies(args.D))
  kernel = kernels.chunked.kernel(args.chunk) if args.impl == "chunked" else args.impl

  def make(fn):
    def loss(q, k, v):
      out = fn(q, k, v, q_positions=pos, kv_positions=pos, rope=rope, kernel=kernel)
      return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))

  steps = {"rope": make(rj.rope_attention), "rove": make(rj.rove_attention)}
  for f in steps.values():  # compile and warm up
    jax.block_until_ready(f(q, k, v))
    jax.block_until_ready(f(q, k, v))
  times = {name: [] for name in steps}
  for _ in range(args.repeats):
    for name, f in steps.items():  # interleaved: both see the same machine noise
      t0 = time.perf_counter()
      jax.block_until_ready(f(q, k, v))
      times[name].append(time.perf_counter() - t0)
  med = {name: statistics.median(ts) for name, ts in times.items()}
  # Paired ratios (same repeat, back to back) cancel slow drifts of the machine.
  paired = sorted(r / p for r, p in zip(times["rove"], times["rope"]))
  quart = statistics.quantiles(paired, n=4)
  result = {
    "bench": "attention fwd+bwd",
    "shape": dict(B=args.B, T=args.T, H=args.H, D=args.D),
    "impl": args.impl,
    "repeats": args.repeats,
    "median_s": med,
    "ratio_rove_over_rope": med["rove"] / med["rope"],
    "paired_ratio_median": statistics.median(paired),
    "paired_ratio_iqr": [quart[0], quart[2]],
    "device": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
  }
  print("| kernel | median fwd+bwd (ms) |\n|---|---|")
  for name in steps:
    print(f"| {name} | {1e3 * med[name]:.2f} |")
  print(
    f"\nratio rove/rope = {result['ratio_rove_over_rope']:.3f}; paired ratio median "
    f"{result['paired_ratio_median']:.3f} (IQR {quart[0]:.3f}-{quart[2]:.3f}) "
    f"(B={args.B}, T={args.T}, H={args.H}, D={args.D}, {args.impl}, {args.repeats} repeats)"
  )
  return result


def _one_length(T, impl, H, D, chunk):
  q, k, v, pos = _inputs(1, T, H, H, D)
  rope = rj.Rope(rj.rope_frequencies(D))
  kernel = kernels.chunked.kernel(chunk) if impl == "chunked" else impl
  f = jax.jit(
    lambda q, k, v: rj.rove_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rope, kernel=kernel
    )
  )
  jax.block_until_ready(f(q, k, v))
  t0 = time.perf_counter()
  out = jax.block_until_ready(f(q, k, v))
  dt = time.perf_counter() - t0
  peak_gib = peak_rss_gib()
  print(
    json.dumps(
      {
        "T": T,
        "impl": impl,
        "seconds": dt,
        "tokens_per_s": T / dt,
        "peak_rss_gib": peak_gib,
        "finite": bool(np.isfinite(np.asarray(out)).all()),
      }
    )
  )


def longctx(args) -> list:
  rows = []
  for T in [int(x) for x in args.lengths.split(",")]:
    cmd = [
      sys.executable,
      "-m",
      "bench.attention",
      "_one",
      "--T",
      str(T),
      "--impl",
      args.impl,
      "--H",
      str(args.H),
      "--D",
      str(args.D),
      "--chunk",
      str(args.chunk),
    ]
    limit = int(args.max_gib * 2**30)
    proc = subprocess.run(
      cmd,
      capture_output=True,
      text=True,
      timeout=args.timeout,
      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    if proc.returncode != 0:
      rows.append({"T": T, "impl": args.impl, "error": proc.stderr.strip().splitlines()[-1:]})
      print(f"T={T}: failed ({rows[-1]['error']})")
      break
    rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    r = rows[-1]
    print(
      f"T={T:6d} {args.impl}: {r['seconds']:.2f} s, {r['tokens_per_s']:.0f} tok/s, "
      f"peak RSS {r['peak_rss_gib']:.2f} GiB, finite={r['finite']}"
    )
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("mode", choices=["ratio", "longctx", "_one"])
  p.add_argument("--B", type=int, default=4)
  p.add_argument("--T", type=int, default=1024)
  p.add_argument("--H", type=int, default=8)
  p.add_argument("--D", type=int, default=64)
  p.add_argument("--impl", default="xla")
  p.add_argument("--chunk", type=int, default=512)
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--lengths", default="4096,8192,16384,32768")
  p.add_argument("--max-gib", type=float, default=20.0)
  p.add_argument("--timeout", type=float, default=1200)
  p.add_argument("--out", help="write the result as JSON here")
  args = p.parse_args(argv)
  if args.mode == "_one":
    return _one_length(args.T, args.impl, args.H, args.D, args.chunk)
  result = ratio(args) if args.mode == "ratio" else longctx(args)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
