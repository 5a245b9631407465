"""rove-jax's train step against a nanoGPT-shaped PyTorch peer, side by side on this machine.

  python -m bench.peer_ratio --torch-python /path/to/venv-with-torch/bin/python
                             [--rounds 2 --steps 8 --encodings learned,rove --out F]
                             [--xla-flags NAME='--xla_cpu_...=...' ...] [--no-torch]
  python -m bench.peer_ratio --shape gpt2_124m --torch-python python3 --encodings rope,rove

Shapes (--shape): "tiny" (the default; 6 layers, d_model 384, 6 heads, vocab 320, batch 16 x
256, float32, on the CPU) and "gpt2_124m" (nanoGPT's GPT-2 124M: 12 layers, d_model 768, 12
heads, vocab 50304, batch 16 x 1024, bfloat16 on a CUDA GPU: the peer with bf16 autocast,
flash SDPA, fused AdamW and torch.compile; rove-jax with its trainer's XLA options for GPUs).
Both sides run a full train step (forward, backward, global-norm clipping, AdamW) and read the
loss on the host after every step, as rove-jax's loop does. The peer is bench/peers/torch_gpt.py
(learned positions, like nanoGPT); the JAX side is rove_jax.train.loop's jitted train step for
each of `--encodings` (learned is the like-for-like row; an encoding with "+fused", e.g.
rope+fused, takes the fused output projection and loss, optim.loss_impl=fused; one with
"+fused_attention" the attention kernel "fused", model.attention_impl=fused, on a Hopper GPU
the Mosaic GPU kernel that rotates inside, and with it the Hopper kernel's variant features
(model.fused_variant, kernels.FUSED_FEATURES), e.g. "rove+fused_attention+2wg+tma+bf16";
suffixes combine). Every side
runs in its own subprocess, `--rounds` times, interleaved, each timing `--steps` steps after 3
warm-up steps; a side's speed is the median over all its timed steps. Ratios are JAX / torch
tokens/s.

MFU, on a GPU: every side by one formula over one peak, tokens/s x model FLOPs per token
(rove_jax.nn.flops, PaLM's count with attention, of the RoPE model of the shape) / the best bf16
[8192, 8192] matmul FLOP/s measured by JAX on the same GPU in this run (before and after the
sides).

`--xla-flags NAME=FLAGS` (repeatable) adds, for each encoding, a JAX side run with XLA_FLAGS set
to FLAGS, interleaved with the rest: how XLA compiler options move the step, as ratios against
the default side of the same encoding in the same run. `--no-torch` leaves the peer out (flag
ratios only).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAPES = {
  "tiny": dict(layers=6, d_model=384, heads=6, vocab=320, batch=16, seq=256),
  "gpt2_124m": dict(layers=12, d_model=768, heads=12, vocab=50304, batch=16, seq=1024),
}
GPU_SHAPES = ("gpt2_124m",)  # bfloat16 on a CUDA GPU; the others float32 on the CPU
SHAPE = SHAPES["tiny"]


# An --encodings entry's suffixes: "+NAME" sets (field, value) of the JAX side; besides these,
# each of kernels.FUSED_FEATURES joins the fused attention's variant.
SUFFIXES = {
  "fused": ("loss_impl", "fused"),
  "fused_attention": ("attention_impl", "fused"),
}


def side_options(encoding: str) -> tuple:
  """(pos_encoding, loss_impl, attention_impl, fused_variant) of an --encodings entry such as
  "rope", "rove+fused", "rove+fused_attention" or "rove+fused_attention+2wg+tma+bf16"
  (SUFFIXES, then the Hopper kernel's variant features, which need +fused_attention)."""
  from rove_jax.kernels import FUSED_FEATURES, fused_options

  name, *suffixes = encoding.split("+")
  opts = {"loss_impl": "xla", "attention_impl": "auto"}
  features = []
  for suffix in suffixes:
    if suffix in FUSED_FEATURES:
      features.append(suffix)
      continue
    if suffix not in SUFFIXES:
      raise ValueError(
        f"--encodings: {encoding}: unknown suffix +{suffix}; the suffixes are "
        f"{', '.join('+' + s for s in (*SUFFIXES, *FUSED_FEATURES))}"
      )
    field, value = SUFFIXES[suffix]
    opts[field] = value
  variant = "+".join(features) or "default"
  if features and opts["attention_impl"] != "fused":
    raise ValueError(
      f"--encodings: {encoding}: +{variant} is the fused kernel's variant; add +fused_attention"
    )
  try:
    fused_options(variant)
  except ValueError as e:
    raise ValueError(f"--encodings: {encoding}: {e}") from None
  return name, opts["loss_impl"], opts["attention_impl"], variant


def model_config(
  shape: str, encoding: str, attention_impl: str = "auto", fused_variant: str = "default"
):
  from rove_jax.nn.model import GPTConfig

  sh = SHAPES[shape]
  return GPTConfig(
    vocab_size=sh["vocab"],
    n_layer=sh["layers"],
    n_head=sh["heads"],
    d_model=sh["d_model"],
    max_len=sh["seq"],
    pos_encoding=encoding,
    dtype="bfloat16" if shape in GPU_SHAPES else "float32",
    attention_impl=attention_impl,
    fused_variant=fused_variant,
  )


def peak_side(n: int = 8192, repeats: int = 10) -> dict:
  """The best bf16 [n, n] @ [n, n] FLOP/s of this process's device."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, a))
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(f(a, a))
    best = min(best, time.perf_counter() - t)
  return {
    "side": "peak",
    "flops_per_s": 2.0 * n**3 / best,
    "device": str(jax.devices()[0].device_kind),
  }


def jax_side(encoding: str, steps: int, warmup: int = 3, shape: str = "tiny") -> dict:
  """Times rove_jax's train step on random tokens; run in a subprocess (`--side`). encoding:
  an --encodings entry (`side_options`)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from rove_jax.nn.model import GPT
  from rove_jax.train import gpu_options, program
  from rove_jax.train.run_config import OptimConfig

  sh = SHAPES[shape]
  name, loss_impl, attention_impl, variant = side_options(encoding)
  cfg = model_config(shape, name, attention_impl, variant)
  tx = program.make_optimizer(OptimConfig(lr=1e-3, warmup_steps=0), 1000)
  graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  state = program.TrainState(
    params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32)
  )
  step = program.make_train_step(
    graphdef,
    tx,
    1,
    compiler_options=gpu_options.compiler_options(jax.devices()),
    loss_impl=loss_impl,
  )
  tokens = np.random.default_rng(0).integers(0, sh["vocab"], (sh["batch"], sh["seq"] + 1))
  batch = {
    "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
    "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
  }
  for _ in range(warmup):
    state, m = step(state, batch)
    float(m["loss"])
  speeds = []
  for _ in range(steps):
    t = time.perf_counter()
    state, m = step(state, batch)
    float(m["loss"])  # the loop syncs on the metrics every step, as here
    speeds.append(sh["batch"] * sh["seq"] / (time.perf_counter() - t))
  return {
    "side": f"jax-{encoding}",
    "devices": str(jax.devices()[0].device_kind),
    "tokens_per_s": speeds,
  }


def _run(cmd, env=None) -> dict:
  proc = subprocess.run(
    cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
  )
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--torch-python", help="the python of a venv with torch")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--encodings", default="learned,rove")
  p.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
  p.add_argument(
    "--xla-flags",
    action="append",
    default=[],
    metavar="NAME=FLAGS",
    help="an extra JAX side per encoding with XLA_FLAGS=FLAGS (repeatable)",
  )
  p.add_argument("--no-torch", action="store_true", help="JAX sides only")
  p.add_argument("--side", help=argparse.SUPPRESS)  # internal: one JAX side, JSON on stdout
  p.add_argument("--out")
  args = p.parse_args(argv)
  if args.side:
    print(
      json.dumps(
        peak_side() if args.side == "peak" else jax_side(args.side, args.steps, shape=args.shape)
      )
    )
    return {}
  for enc in args.encodings.split(","):
    try:
      side_options(enc)
    except ValueError as e:
      p.error(str(e))
  gpu = args.shape in GPU_SHAPES
  shape = SHAPES[args.shape]
  variants = {"": ""}
  for spec in args.xla_flags:
    name, sep, flags = spec.partition("=")
    if not sep or not name or not flags.strip().startswith("--"):
      p.error(f"--xla-flags {spec!r}: expected NAME=--xla_flag=value [--xla_flag2=...]")
    variants[name] = flags.strip()
  if not args.torch_python and not args.no_torch:
    p.error(
      "--torch-python is needed: a venv with torch (pip install torch), kept apart from rove-jax's"
    )
  torch_cmd = [
    args.torch_python,
    str(ROOT / "bench" / "peers" / "torch_gpt.py"),
    *[f"--{k.replace('_', '-')}={v}" for k, v in shape.items()],
    f"--steps={args.steps}",
  ] + (["--device=cuda", "--bf16"] if gpu else [])
  sides, envs = ({} if args.no_torch else {"torch": torch_cmd}), {}
  platform = {} if gpu else {"JAX_PLATFORMS": "cpu"}
  for enc in args.encodings.split(","):
    for vname, flags in variants.items():
      name = f"jax-{enc}" + (f"[{vname}]" if vname else "")
      sides[name] = [
        sys.executable,
        "-m",
        "bench.peer_ratio",
        "--side",
        enc,
        f"--steps={args.steps}",
        f"--shape={args.shape}",
      ]
      envs[name] = {**platform, **({"XLA_FLAGS": flags} if flags else {})}
  peak_cmd = [sys.executable, "-m", "bench.peer_ratio", "--side", "peak"]
  peaks = [_run(peak_cmd)["flops_per_s"]] if gpu else []
  speeds = {name: [] for name in sides}
  for r in range(args.rounds):
    names = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for name in names:
      got = _run(sides[name], env=envs.get(name, platform))
      speeds[name] += got["tokens_per_s"]
      print(
        f"round {r + 1}/{args.rounds} {name:12s} median "
        f"{statistics.median(got['tokens_per_s']):8.1f} tokens/s",
        file=sys.stderr,
        flush=True,
      )
  if gpu:
    peaks.append(_run(peak_cmd)["flops_per_s"])
  medians = {name: statistics.median(v) for name, v in speeds.items()}
  result = {
    "shape": dict(shape, name=args.shape),
    "median_tokens_per_s": medians,
    "xla_flags": variants,
    "tokens_per_s": speeds,
  }
  if gpu:
    from rove_jax.nn import flops

    per_token = flops.model_flops_per_token(
      model_config(args.shape, "rope"), "train", shape["seq"]
    )[0]
    result.update(
      peak_flops_per_s=max(peaks),
      peak_samples=peaks,
      model_flops_per_token=per_token,
      mfu={n: m * per_token / max(peaks) for n, m in medians.items()},
    )
  if "torch" in medians:
    result["ratio_vs_torch"] = {n: medians[n] / medians["torch"] for n in medians if n != "torch"}
  result["ratio_vs_default_flags"] = {
    n: medians[n] / medians[n.split("[")[0]] for n in medians if "[" in n
  }
  for name in medians:
    line = f"{name}: {medians[name]:.0f} tokens/s"
    if "torch" in medians and name != "torch":
      line += f", {result['ratio_vs_torch'][name]:.3f}x torch.compile ({medians['torch']:.0f})"
    if "mfu" in result:
      line += f", MFU {result['mfu'][name]:.3f}"
    if name in result["ratio_vs_default_flags"]:
      line += f", {result['ratio_vs_default_flags'][name]:.3f}x default XLA flags"
    print(line)
  if "mfu" in result:
    print(
      f"MFU = tokens/s x {result['model_flops_per_token'] / 1e6:.1f} MFLOP a token / "
      f"{result['peak_flops_per_s'] / 1e12:.1f} TFLOP/s (the best bf16 matmul measured here)"
    )
  if "jax-rove" in medians and "jax-rope" in medians:
    result["rove_over_rope_time"] = medians["jax-rope"] / medians["jax-rove"]
    print(f"RoVE / RoPE step time: {result['rove_over_rope_time']:.3f}")
  for enc in ("rope", "rove"):  # the fused attention kernel's step against the default RoPE's
    name = f"jax-{enc}+fused_attention"
    if name in medians and "jax-rope" in medians:
      result[f"{enc}_fused_attention_over_rope_time"] = medians["jax-rope"] / medians[name]
      print(f"{name} / jax-rope step time: {medians['jax-rope'] / medians[name]:.3f}")
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
  return result


if __name__ == "__main__":
  main()
