"""What the GPT train step moves on an NVIDIA GPU, compiled here without one.

  python -m bench.gpu_step [--preset gpt2_124m] [--batch 16] [--seq 1024] [--gpu h200]
      [--encodings rove,rope,nope] [--no-gpu-options] [--json OUT] [--markdown] [--dump-hlo DIR]
      [--breakdown N] [--diff] [--attention IMPL] [--fused-variant V] [--loss-impl xla|fused]

Compiles the trainer's own step (rove_jax.train.program.make_train_step: loss, gradients, global-
norm clipping, AdamW, the finiteness check; bfloat16 compute, float32 master weights, attention
"auto", which is cuDNN flash attention on the GPU) for one GPU through the deviceless path
(rove_jax/aot/gpu.py names the wheels it needs), one program per encoding, and prints per
encoding from the optimized HLO (rove_jax.aot.gpu_census): kernels launched, bytes moved
(operands + outputs of each kernel), the bytes of float32 arrays of vocabulary width, GEMMs by
operand precision with their TFLOP, and the compiler's peak temporary memory; then RoVE / RoPE.
--breakdown N adds, per encoding, the N largest groups of kernels by phase (forward, backward,
other: the optimizer and XLA's copies), kind and jax operation (gpu_census.Census.groups).
--diff adds, per encoding other than RoPE, the kernels it launches beyond RoPE's step, matched
by operation and shapes (gpu_census.Census.diff): what the encoding itself costs.
--attention names the attention kernel (model.attention_impl; default "auto"), --fused-variant
the Hopper fused kernel's variant with --attention fused (model.fused_variant, e.g. 2wg+tma+bf16).
The XLA options are the trainer's for GPUs (rove_jax.train.gpu_options) unless --no-gpu-options.
--loss-impl fused compiles the step with the output projection and the loss in one Pallas kernel
(optim.loss_impl=fused, rove_jax/kernels/linear_ce.py), which never writes the logits.

These are the compiler's figures, not timings: python -m bench --suite gpu (bench/gpu_check.sh)
times the same step on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

# JAX's CUDA plugin registers without a driver only with this set; it must precede JAX's start.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")

GB = 1e9
GiB = 2**30


def step_config(
  preset: str,
  batch: int,
  seq: int,
  encoding: str,
  attention: str = "auto",
  loss_impl: str = "xla",
  fused_variant: str = "default",
):
  """The paper's run config for a preset at one GPU's batch: bf16, no accumulation, the
  attention kernel `attention` (model.attention_impl) in `fused_variant` (model.fused_variant),
  the loss `loss_impl` (optim.loss_impl)."""
  from rove_jax.train import overrides, run_config

  return overrides.apply(
    run_config.paper_config(preset, lr=6e-4),
    {
      "model.pos_encoding": encoding,
      "data.batch_size": batch,
      "data.seq_len": seq,
      "optim.grad_accum": 1,
      "model.attention_impl": attention,
      "model.fused_variant": fused_variant,
      "optim.loss_impl": loss_impl,
    },
  )


def measure(
  preset: str,
  batch: int,
  seq: int,
  encoding: str,
  gpu: str,
  *,
  gpu_options: bool = True,
  hlo_dir=None,
  attention: str = "auto",
  log=lambda line: None,
  loss_impl: str = "xla",
  fused_variant: str = "default",
) -> dict:
  """Compiles one encoding's step for `gpu` and returns its census as a dict."""
  from rove_jax.aot import compile as aot
  from rove_jax.aot import gpu_census

  c = step_config(preset, batch, seq, encoding, attention, loss_impl, fused_variant)
  with tempfile.TemporaryDirectory() as tmp:
    kernel = "" if attention == "auto" else f"_{attention}"
    kernel += "" if fused_variant == "default" else f"_{fused_variant.replace('+', '_')}"
    loss = "" if loss_impl == "xla" else f"_{loss_impl}_loss"
    path = os.path.join(hlo_dir or tmp, f"{preset}_{encoding}_{gpu}{kernel}{loss}.hlo")
    saved = os.environ.get("ROVE_JAX_GPU_OPTIONS")
    if not gpu_options:
      os.environ["ROVE_JAX_GPU_OPTIONS"] = "off"
    try:
      report = aot.compile_job(c, f"{gpu}-1", "train", log=log, hlo_path=path)
    finally:
      if saved is None:
        os.environ.pop("ROVE_JAX_GPU_OPTIONS", None)
      else:
        os.environ["ROVE_JAX_GPU_OPTIONS"] = saved
    with open(path) as f:
      census = gpu_census.read(f.read(), vocab_size=report.get("vocab_size") or _vocab(c))
  mem = report["memory"]
  return {
    "encoding": encoding,
    "preset": preset,
    "batch": batch,
    "seq": seq,
    "gpu": gpu,
    "gpu_options": gpu_options,
    "loss_impl": loss_impl,
    "fused_variant": fused_variant,
    "kernels": census.kernels,
    "bytes": census.bytes,
    "vocab_f32_bytes": census.vocab_f32_bytes,
    "gemms": census.gemms_by_precision(),
    "temp_bytes": mem["temp"],
    "total_bytes": mem["total"],
    "compile_s": report["compile_s"],
    "groups": census.groups(),
    "census": census,
  }


def _vocab(c) -> int:
  return c.model.vocab_size


def table(rows: list[dict]) -> str:
  """Markdown rows, one per encoding, then RoVE / RoPE."""
  out = [
    "| encoding | kernels | bytes moved (GB) | f32 vocab-wide (GB) | GEMMs by precision "
    "(count, TFLOP) | peak temp (GiB) |",
    "|---|---|---|---|---|---|",
  ]
  for r in rows:
    gemms = "; ".join(f"{k}: {v['count']}, {v['tflop']:.2f}" for k, v in sorted(r["gemms"].items()))
    out.append(
      f"| {r['encoding']} | {r['kernels']} | {r['bytes'] / GB:.2f} | "
      f"{r['vocab_f32_bytes'] / GB:.2f} | {gemms} | {r['temp_bytes'] / GiB:.2f} |"
    )
  by = {r["encoding"]: r for r in rows}
  if "rove" in by and "rope" in by:
    a, b = by["rove"], by["rope"]
    out.append(
      f"| RoVE / RoPE | {a['kernels'] / b['kernels']:.3f} | "
      f"{a['bytes'] / b['bytes']:.4f} | | | {a['temp_bytes'] / b['temp_bytes']:.3f} |"
    )
  return "\n".join(out)


def breakdown(row: dict, n: int) -> str:
  """Markdown rows of one encoding's n largest kernel groups."""
  out = [
    f"{row['encoding']}: {row['kernels']} kernels",
    "",
    "| phase | kind | operation | kernels | GB |",
    "|---|---|---|---|---|",
  ]
  for phase, kind, op, count, moved in row["groups"][:n]:
    out.append(f"| {phase} | {kind} | {op or '-'} | {count} | {moved / GB:.2f} |")
  return "\n".join(out)


def diff(rows: list[dict], base: str = "rope") -> str:
  """Markdown rows of the kernels each encoding launches beyond `base`'s step
  (gpu_census.Census.diff): phase, kind, operation, operands -> outputs, kernels, GB."""
  by = {r["encoding"]: r for r in rows}
  out = []
  for r in rows:
    if r["encoding"] == base or base not in by:
      continue
    changes = r["census"].diff(by[base]["census"])
    out += [
      "",
      f"{r['encoding']} - {base}: {r['kernels'] - by[base]['kernels']:+d} kernels, "
      f"{(r['bytes'] - by[base]['bytes']) / GB:+.3f} GB",
      "",
      "| phase | kind | operation | operands -> outputs | kernels | GB |",
      "|---|---|---|---|---|---|",
    ]
    for (phase, kind, op, ins, outs), n, moved in changes:
      out.append(
        f"| {phase} | {kind} | {op or '-'} | {', '.join(ins)} -> {', '.join(outs)} | "
        f"{n:+d} | {moved / GB:+.3f} |"
      )
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m bench.gpu_step",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--preset", default="gpt2_124m", help="gpt2_124m, gpt2_354m, small, tiny")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--gpu", default="h200", choices=["h100", "h200"])
  p.add_argument("--encodings", default="rove,rope,nope")
  p.add_argument(
    "--no-gpu-options",
    action="store_true",
    help="compile without the trainer's XLA options for GPUs",
  )
  p.add_argument("--json", help="write every figure here")
  p.add_argument("--markdown", action="store_true", help="print the table as markdown only")
  p.add_argument("--dump-hlo", metavar="DIR", help="keep each compiled HLO text here")
  p.add_argument(
    "--breakdown",
    type=int,
    default=0,
    metavar="N",
    help="print each encoding's N largest groups of kernels",
  )
  p.add_argument(
    "--loss-impl",
    default="xla",
    choices=["xla", "fused"],
    help="the step's output projection and loss (optim.loss_impl)",
  )
  p.add_argument(
    "--attention",
    default="auto",
    metavar="IMPL",
    help="the attention kernel (model.attention_impl), e.g. fused",
  )
  p.add_argument(
    "--fused-variant",
    default="default",
    metavar="V",
    help="with --attention fused, the Hopper kernel's variant (model.fused_variant)",
  )
  p.add_argument(
    "--diff",
    action="store_true",
    help="print the kernels each encoding launches beyond RoPE's step",
  )
  args = p.parse_args(argv)
  t0 = time.perf_counter()
  log = lambda line: print(
    f"[{time.perf_counter() - t0:7.1f} s] {line}", file=sys.stderr, flush=True
  )
  if args.dump_hlo:
    os.makedirs(args.dump_hlo, exist_ok=True)
  rows = []
  try:
    for enc in [e.strip() for e in args.encodings.split(",") if e.strip()]:
      rows.append(
        measure(
          args.preset,
          args.batch,
          args.seq,
          enc,
          args.gpu,
          gpu_options=not args.no_gpu_options,
          hlo_dir=args.dump_hlo,
          attention=args.attention,
          log=log,
          loss_impl=args.loss_impl,
          fused_variant=args.fused_variant,
        )
      )
      log(f"{enc}: {rows[-1]['kernels']} kernels, {rows[-1]['bytes'] / GB:.2f} GB")
  except (ImportError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not args.markdown:
    options = "none" if args.no_gpu_options else "the trainer's (rove_jax/train/gpu_options.py)"
    print(
      f"{args.preset}, batch {args.batch} x {args.seq}, bf16, one {args.gpu.upper()}, "
      f"attention {args.attention}"
      + (f" ({args.fused_variant})" if args.fused_variant != "default" else "")
      + f", XLA options: {options}, loss: {args.loss_impl}"
    )
  print(table(rows))
  for r in rows if args.breakdown else ():
    print("\n" + breakdown(r, args.breakdown))
  if args.diff:
    print(diff(rows))
  if args.json:
    with open(args.json, "w") as f:
      json.dump([{k: v for k, v in r.items() if k != "census"} for r in rows], f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
