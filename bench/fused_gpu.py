"""The GPU fused kernels (rove_jax.kernels.fused_hopper, Pallas Mosaic GPU for H100/H200, and
rove_jax.kernels.fused_gpu, Pallas Triton) against cuDNN flash attention with the rotations done
by XLA around it: RoVE and RoPE, bfloat16, forward and forward + backward (dq, dk, dv), at GPT-2
124M's attention shapes (B=8, T=1024, H=12, D=64 by default; --batch 16, --length 4096 for the
others; causal, one Mask(ordered=True)). The "hopper" rows need an sm90 GPU (or --aot):
"hopper" is the default, "hopper 2wg..." its multi-warpgroup forwards, "... matrix" those with
the swap-matrix rotation, "... bf16" those turning tiles in bfloat16 pairs (HOPPER).

  python -m bench.fused_gpu [--batch 8 --length 1024 --heads 12 --head-dim 64] [--block 64]
      [--backward-block 32[,64]] [--repeats 20] [--layout half] [--out fused_gpu.json]
  python -m bench.fused_gpu --aot h200 [--ptxas] [--sass]       # compile only, no GPU
  python -m bench.fused_gpu --kernels "hopper,hopper 2wg"        # only these rows
  python -m bench.fused_gpu --interpret --tiny                  # CPU smoke run

On a GPU: each program is compiled and run twice (warm-up), then the kernels are timed
interleaved, `repeats` calls each, jax.block_until_ready after every call; it prints the median
milliseconds a call, fused / cuDNN (the median of per-repeat ratios), and how far fused's output
and gradients are from cuDNN's (max |difference| over max |cuDNN|, both bfloat16). Several
--backward-block values time the backward at each (the first is also the forward's run).
--aot compiles the same programs for an H100 or H200 with the deviceless GPU path
(rove_jax/aot/gpu.py: JAX's CUDA plugin, no GPU) and prints compile seconds, XLA's temporary
bytes and the Triton and Mosaic GPU kernels in the compiled HLO; with --ptxas also each fused
kernel's registers and spills by `ptxas -v` (rove_jax.aot.ptxas: the Triton kernel's from the
PTX XLA wrote, the Mosaic GPU kernels' from the reports Mosaic GPU writes as it compiles them,
with their threads, shared memory and the programs an SM holds from the PTX and launch it
dumps), and with --sass each fused kernel's instructions by class (rove_jax.aot.sass: its PTX
assembled and listed here; needs cuobjdump and nvdisasm).
--backward-block sets the Triton kernel's backward blocks.
--interpret runs the GPU kernels in Pallas interpret mode against the "xla" kernel (cuDNN needs
a GPU); its timings mean nothing, it checks that the script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# JAX's CUDA plugin registers without a driver only with this set (--aot); before JAX starts.
if "--aot" in sys.argv:
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
# --interpret runs the Hopper kernels' warpgroups at once on XLA's CPU pool, which needs a thread
# for each and one more (mgpu_interpret.interpret_pool_problem; main refuses a pool the
# caller made smaller); set before JAX starts its backends (importing it starts none).
if "--interpret" in sys.argv:
  from rove_jax.kernels import FUSED_FEATURES
  from rove_jax.kernels import fused_hopper_tiles as _tiles
  from rove_jax.kernels import mgpu_interpret as _interpret

  if not any(os.environ.get(v) for v in _interpret.POOL_VARIABLES):
    most = _tiles.warpgroups(dict(FUSED_FEATURES.values()))  # every feature at once
    os.environ["PJRT_NPROC"] = str(max(most + 1, os.cpu_count() or 1))
# --ptxas and --sass read the PTX XLA writes and the ptxas reports and PTX Mosaic GPU writes:
# both dump folders are set before JAX starts.
PTX_DIR = None
if "--ptxas" in sys.argv or "--sass" in sys.argv:
  import tempfile

  from rove_jax.aot import ptxas as ptxas_tool

  PTX_DIR = tempfile.mkdtemp(prefix="fused_gpu_ptx_")
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={PTX_DIR}".strip()
  os.environ.update(ptxas_tool.mosaic_dump_env(os.path.join(PTX_DIR, "mosaic")))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import rove_jax as rj  # noqa: E402
from rove_jax.kernels import (  # noqa: E402
  fused_gpu,
  fused_hopper,
  fused_hopper_backward_ws,
  fused_hopper_ws,
  fused_options,
)

FNS = {"rove": rj.rove_attention, "rope": rj.rope_attention}


def hopper_variant(label: str) -> str:
  """The model.fused_variant a Hopper label runs: "hopper 2wg+tma bf16" -> "2wg+tma+bf16"."""
  return label.removeprefix("hopper").lstrip(" +").replace(" ", "+") or "default"


# Hopper variants by label ("hopper" and the features of kernels.FUSED_FEATURES): "hopper" is
# the default (one warpgroup a program; pairs swapped by column slices in the half layout, by
# the swap matrix elsewhere); "2wg" two compute warpgroups sharing each rotated key/value block
# (rove_jax.kernels.fused_hopper_ws), "+tma" with a producer warpgroup; "+bwd2wg" the dq and
# dk, dv kernels with two warpgroups sharing each looped block (fused_hopper_backward_ws),
# "+bwdtma" with a producer warpgroup there (fused_hopper_backward_pipe);
# "matrix" the swap matrix where slices would run, forward and backward; "bf16" the looped
# blocks turned in bfloat16 pairs (the half layout's slices only). Values: fused_hopper.kernel's
# keyword arguments.
HOPPER = {
  label: fused_options(hopper_variant(label))
  for label in (
    "hopper",
    "hopper matrix",
    "hopper+bwd2wg",
    "hopper 2wg",
    "hopper 2wg+tma",
    "hopper 2wg+bwd2wg",
    "hopper 2wg matrix",
    "hopper bf16",
    "hopper 2wg+bwd2wg bf16",
    "hopper 2wg+tma bf16",
    "hopper 2wg+bwd2wg+bwdtma",
    "hopper 2wg+tma+bwd2wg+bwdtma bf16",
  )
}


def hopper_options(label: str) -> dict:
  """fused_hopper.kernel's keyword arguments for a Hopper label: any "hopper" followed by the
  features of kernels.FUSED_FEATURES (hopper_variant), not only HOPPER's. ValueError names a
  feature fused_options refuses."""
  try:
    return fused_options(hopper_variant(label))
  except ValueError as e:
    raise ValueError(f"--kernels {label!r}: {e}") from None


def why_not(options: dict, args) -> str | None:
  """Why a Hopper variant (its kernel arguments) has no row at these settings, or None: the
  multi-warpgroup kernels' own length limits, or a layout without the variant's slices."""
  T, wgs = args.length, options.get("compute_wgs", 1)
  if wgs > 1 and (problem := fused_hopper_ws.problem(T, T, wgs, fused_hopper.BLOCK_Q)):
    return problem
  if options.get("backward_wgs", 1) > 1 and (problem := fused_hopper_backward_ws.problem(T, T)):
    return problem
  if args.layout != "half" and options.get("bf16_turns"):
    return "it turns pairs by column slices, which only --layout half has"
  if args.layout != "half" and "slice_swap" in options:
    return "--layout interleaved swaps pairs by the matrix anyway: drop 'matrix'"
  return None


def variants(args) -> list:
  """[(label, backward block)] of the fused kernels: the Hopper ones (rove_jax.kernels.
  fused_hopper, Pallas Mosaic GPU, "hopper" being what kernel="fused" runs on an H100/H200),
  then the Triton kernel (rove_jax.kernels.fused_gpu, what it runs on other GPUs): "triton" at
  the first of --backward-block, "triton bwd<N>" at each other (timed forward + backward only:
  the forward is the same). Without --kernels: HOPPER's labels that these settings take (the
  multi-warpgroup ones where T is a multiple of 128, the "matrix" ones in the half layout, where
  the default slices) and every Triton row. With it: those labels, in that order, any Hopper
  variant among them; ValueError names a label that is unknown or has no row here, and why."""
  blocks = [int(b) for b in str(args.backward_block).split(",")]
  triton = dict(("triton" if i == 0 else f"triton bwd{b}", b) for i, b in enumerate(blocks))
  if not args.kernels:
    hopper = [n for n, kw in HOPPER.items() if why_not(kw, args) is None]
    return [(n, None) for n in hopper] + list(triton.items())
  rows = []
  for label in dict.fromkeys(label.strip() for label in args.kernels.split(",")):
    if label.startswith("hopper"):
      if why := why_not(hopper_options(label), args):
        raise ValueError(f"--kernels {label!r}: {why}")
      rows.append((label, None))
    elif label in triton:
      rows.append((label, triton[label]))
    else:
      raise ValueError(
        f"--kernels {label!r}: not a kernel label; the labels are 'hopper' and the features of "
        f"kernels.FUSED_FEATURES (e.g. {next(reversed(HOPPER))!r}) and, with --backward-block "
        f"{args.backward_block}, {', '.join(map(repr, triton))}"
      )
  return rows


def programs(args, baseline: str) -> dict:
  """{(encoding, kernel, pass): jitted fn(q, k, v, pos, ct)}; pass "fwd" returns the output,
  "fwd+bwd" the output and (dq, dk, dv) for the cotangent ct. The Hopper kernel is reached
  through rope_attention / rove_attention(kernel="fused") (the dispatch, which picks it on an
  sm90 target), or by fused_hopper.kernel in interpret mode (where the dispatch would pick the
  TPU kernel); the Triton kernel by fused_gpu.kernel (the dispatch no longer picks it on a
  Hopper GPU)."""
  rope = rj.Rope(rj.rope_frequencies(args.head_dim), 1.0, args.layout)
  mask = rj.Mask(causal=True, ordered=True)
  out = {}
  for enc, fn in FNS.items():
    via = lambda kernel, fn=fn: (
      lambda q, k, v, pos: fn(
        q, k, v, q_positions=pos, kv_positions=pos, rope=rope, mask=mask, kernel=kernel
      )
    )
    direct = via  # a kernels.Kernel given as kernel= is called as is, no dispatch
    for label, backward_block in variants(args) + [(baseline, None)]:
      if label == baseline:
        f = via(baseline)
      elif label == "hopper":
        f = direct(fused_hopper.kernel(interpret=True)) if args.interpret else via("fused")
      elif label.startswith("hopper"):  # the dispatch picks the default; these called directly
        interpret = True if args.interpret else None  # None: compiled on a GPU target
        f = direct(fused_hopper.kernel(interpret=interpret, **hopper_options(label)))
      else:
        f = direct(fused_gpu.kernel(args.block, backward_block, interpret=args.interpret))

      def both(q, k, v, pos, ct, f=f):
        o, vjp = jax.vjp(lambda q, k, v: f(q, k, v, pos), q, k, v)
        return o, vjp(ct)

      if not label.startswith("triton bwd"):
        out[enc, label, "fwd"] = jax.jit(lambda q, k, v, pos, ct, f=f: f(q, k, v, pos))
      out[enc, label, "fwd+bwd"] = jax.jit(both)
  return out


def operands(args, sharding=None):
  B, T, H, D = args.batch, args.length, args.heads, args.head_dim
  if sharding is not None:  # compile only: shapes
    x = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16, sharding=sharding)
    return x, x, x, jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding), x
  keys = jax.random.split(jax.random.key(0), 4)
  q, k, v, ct = (jax.random.normal(kk, (B, T, H, D), jnp.bfloat16) for kk in keys)
  return q, k, v, jnp.broadcast_to(jnp.arange(T), (B, T)), ct


def deviation(got, want) -> float:
  got, want = (np.asarray(jnp.asarray(x, jnp.float32), np.float64) for x in (got, want))
  return float(np.abs(got - want).max() / np.abs(want).max())


def measure(args) -> dict:
  baseline = "xla" if args.interpret else "cudnn"
  progs = programs(args, baseline)
  ops = operands(args)
  for fn in progs.values():  # compile and warm up
    jax.block_until_ready(fn(*ops))
    jax.block_until_ready(fn(*ops))
  times = {name: [] for name in progs}
  for _ in range(args.repeats):
    for name, fn in progs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*ops))
      times[name].append(time.perf_counter() - t0)
  rows = []
  for enc, label, pas in progs:
    if label == baseline:
      continue
    a, b = times[enc, label, pas], times[enc, baseline, pas]
    got, want = progs[enc, label, pas](*ops), progs[enc, baseline, pas](*ops)
    dev = max(deviation(g, w) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
    rows.append(
      dict(
        encoding=enc,
        kernel=label,
        pass_=pas,
        fused_ms=1e3 * statistics.median(a),
        baseline_ms=1e3 * statistics.median(b),
        ratio=statistics.median(x / y for x, y in zip(a, b)),
        max_deviation=dev,
      )
    )
  print(
    f"| encoding | kernel | pass | ms | {baseline} ms | / {baseline} | "
    f"max |difference| / max |{baseline}| |"
  )
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['encoding']} | {r['kernel']} | {r['pass_']} | {r['fused_ms']:.3f} | "
      f"{r['baseline_ms']:.3f} | {r['ratio']:.3f} | {r['max_deviation']:.1e} |"
    )
  return dict(device=jax.devices()[0].device_kind, baseline=baseline, rows=rows)


def compile_only(args) -> dict:
  from rove_jax.aot import gpu as aot_gpu

  device = aot_gpu.devices(aot_gpu.GPUS[args.aot], 1)[0]
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  ops = operands(args, sharding)
  rows = []
  progs = programs(args, "cudnn")  # outside the mesh: the rotary tables are computed here
  with jax.set_mesh(mesh):  # the dispatch then sees a GPU target (kernels.platform)
    for (enc, kernel, pas), fn in progs.items():
      t0 = time.perf_counter()
      compiled = fn.lower(*ops).compile()
      seconds = time.perf_counter() - t0
      text = compiled.as_text()
      memory = compiled.memory_analysis()
      rows.append(
        dict(
          encoding=enc,
          kernel=kernel,
          pass_=pas,
          compile_s=seconds,
          temp_bytes=int(memory.temp_size_in_bytes),
          triton_calls=text.count('custom_call_target="__gpu$xla.gpu.triton"'),
          mosaic_calls=text.count('custom_call_target="mosaic_gpu'),
          cudnn_calls=text.count('custom_call_target="__cudnn$'),
        )
      )
  print(f"compiled for {args.aot} ({device.device_kind}), no GPU:")
  print(
    "| encoding | kernel | pass | compile s | temp MiB | Triton calls | Mosaic GPU calls | "
    "cuDNN calls |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(
      f"| {r['encoding']} | {r['kernel']} | {r['pass_']} | {r['compile_s']:.1f} | "
      f"{r['temp_bytes'] / 2**20:.1f} | {r['triton_calls']} | {r['mosaic_calls']} | "
      f"{r['cudnn_calls']} |"
    )
  result = dict(target=args.aot, device=device.device_kind, rows=rows)
  if PTX_DIR is not None:
    result.update(ptxas_report(PTX_DIR, args.ptxas, args.sass))
  return result


def ptxas_report(folder: str, registers: bool, sass: bool) -> dict:
  """{"ptxas": {kernel: registers and spill bytes}} with registers, {"sass": {kernel:
  instructions by class}} with sass, of the fused kernels compiled into folder: the Triton
  kernel's from the PTX XLA wrote, the Mosaic GPU kernels' from their own reports and PTX (each
  kernel once: the programs share them). The folder is removed afterwards (Mosaic GPU's MLIR
  pass logs take tens of MB a kernel)."""
  import glob
  import shutil

  from rove_jax.aot import sass as sass_tool

  report, ptx = {}, {}
  for path in sorted(glob.glob(os.path.join(folder, "*.ptx"))):
    with open(path) as f:
      if "fused_rotary_attention_gpu" not in f.read():
        continue
    for key, stats in ptxas_tool.run_on_ptx(path).items():
      report.setdefault(key, stats)
      ptx.setdefault(key.split(" (")[0], path)
  mosaic = os.path.join(folder, "mosaic")
  report.update(ptxas_tool.read_mosaic(mosaic))
  ptx.update(ptxas_tool.mosaic_files(mosaic, ".ptx"))
  out = {}
  try:
    if registers:
      print(ptxas_tool.table(report))
      out["ptxas"] = report
    if sass:
      out["sass"] = {name: sass_tool.of_ptx(path) for name, path in ptx.items()}
      print(sass_tool.table(out["sass"]))
  finally:
    shutil.rmtree(folder, ignore_errors=True)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m bench.fused_gpu",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--length", type=int, default=1024)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--block", type=int, default=fused_gpu.DEFAULT_BLOCK)
  p.add_argument(
    "--backward-block",
    default=str(fused_gpu.DEFAULT_BACKWARD_BLOCK),
    help="the backward block, or several (32,64): each timed against cuDNN",
  )
  p.add_argument("--layout", default="half", choices=("half", "interleaved"))
  p.add_argument("--repeats", type=int, default=20)
  p.add_argument("--aot", choices=("h100", "h200"), help="compile only, for this GPU")
  p.add_argument(
    "--ptxas",
    action="store_true",
    help="with --aot: registers, spills and occupancy of the fused kernels (ptxas -v; no GPU)",
  )
  p.add_argument(
    "--sass",
    action="store_true",
    help="with --aot: the fused kernels' instructions by class (ptxas, cuobjdump; no GPU needed)",
  )
  p.add_argument(
    "--interpret", action="store_true", help="Pallas interpret mode against the xla kernel (no GPU)"
  )
  p.add_argument(
    "--kernels", help='only these rows, comma-separated labels (e.g. "hopper,hopper 2wg")'
  )
  p.add_argument("--tiny", action="store_true", help="B=1, T=128, H=2, 3 repeats")
  p.add_argument("--out", help="write the figures here as JSON")
  args = p.parse_args(argv)
  if (args.ptxas or args.sass) and not args.aot:
    p.error("--ptxas and --sass read the deviceless compile's dumps: add --aot h100 or h200")
  if args.sass:
    from rove_jax.aot import sass as sass_tool

    if problem := sass_tool.missing_tools():
      p.error(problem)
  if args.tiny:
    args.batch, args.length, args.heads, args.repeats = 1, 128, 2, 3
  try:
    rows = variants(args)  # the labels, checked before anything compiles
  except ValueError as e:
    p.error(str(e))
  if args.interpret:
    from rove_jax.kernels import fused_hopper_tiles as tiles
    from rove_jax.kernels import mgpu_interpret

    hopper = [tiles.warpgroups(hopper_options(n)) for n, _ in rows if n.startswith("hopper")]
    if problem := mgpu_interpret.interpret_pool_problem(max(hopper, default=1)):
      p.error(problem)
  if not args.aot and not args.interpret and jax.default_backend() != "gpu":
    print("error: no GPU here; use --aot h100|h200 (compile only) or --interpret", file=sys.stderr)
    return 1
  result = compile_only(args) if args.aot else measure(args)
  result.update(
    shape=dict(B=args.batch, T=args.length, H=args.heads, D=args.head_dim),
    block=args.block,
    backward_block=args.backward_block,
    layout=args.layout,
    jax=jax.__version__,
  )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
