"""rove-jax's train step against a nanoGPT-shaped PyTorch peer, side by side on this machine.

  python -m bench.peer_ratio --torch-python /path/to/venv-with-torch/bin/python
                             [--rounds 2 --steps 8 --encodings learned,rove --out F]
                             [--xla-flags NAME='--xla_cpu_...=...' ...] [--no-torch]

The same shape on both sides: the tiny preset (6 layers, d_model 384, 6 heads, vocab 320),
batch 16 x 256, float32, a full train step (forward, backward, global-norm clipping, AdamW).
The peer is bench/peers/torch_gpt.py under torch.compile (learned positions, like nanoGPT); the
JAX side is rove_jax.train.loop's jitted train step for each of `--encodings` (learned is the
like-for-like row). Every side runs in its own subprocess, `--rounds` times, interleaved, each
timing `--steps` steps after 3 warm-up steps; a side's speed is the median over all its timed
steps. Ratios are JAX / torch tokens/s. Both use all cores the machine gives (2 threads here).

`--xla-flags NAME=FLAGS` (repeatable) adds, for each encoding, a JAX side run with XLA_FLAGS set
to FLAGS, interleaved with the rest: how XLA CPU compiler options move the step, as ratios
against the default side of the same encoding in the same run. `--no-torch` leaves the peer out
(flag ratios only).
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
SHAPE = dict(layers=6, d_model=384, heads=6, vocab=320, batch=16, seq=256)


def jax_side(encoding: str, steps: int, warmup: int = 3) -> dict:
  """Times rove_jax's train step on random tokens; run in a subprocess (`--side`)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from rove_jax.nn.model import GPT, GPTConfig
  from rove_jax.train import config_schema, loop

  cfg = GPTConfig(vocab_size=SHAPE["vocab"], n_layer=SHAPE["layers"], n_head=SHAPE["heads"],
                  d_model=SHAPE["d_model"], max_len=SHAPE["seq"], pos_encoding=encoding)
  c = config_schema.base_config("tiny")
  c.optim.lr, c.optim.warmup_steps = 1e-3, 0
  tx = loop.make_optimizer(c.optim, 1000)
  graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  state = loop.TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))
  step = loop.make_train_step(graphdef, tx, 1)
  tokens = np.random.default_rng(0).integers(0, SHAPE["vocab"], (SHAPE["batch"], SHAPE["seq"] + 1))
  batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
           "targets": jnp.asarray(tokens[:, 1:], jnp.int32)}
  for _ in range(warmup):
    state, m = step(state, batch)
    float(m["loss"])
  speeds = []
  for _ in range(steps):
    t = time.perf_counter()
    state, m = step(state, batch)
    float(m["loss"])  # the loop syncs on the metrics every step, as here
    speeds.append(SHAPE["batch"] * SHAPE["seq"] / (time.perf_counter() - t))
  return {"side": f"jax-{encoding}", "devices": str(jax.devices()[0].device_kind),
          "tokens_per_s": speeds}


def _run(cmd, env=None) -> dict:
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                        env={**os.environ, **(env or {})})
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--torch-python", help="the python of a venv with torch")
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--encodings", default="learned,rove")
  p.add_argument("--xla-flags", action="append", default=[], metavar="NAME=FLAGS",
                 help="an extra JAX side per encoding with XLA_FLAGS=FLAGS (repeatable)")
  p.add_argument("--no-torch", action="store_true", help="JAX sides only")
  p.add_argument("--side", help=argparse.SUPPRESS)  # internal: one JAX side, JSON on stdout
  p.add_argument("--out")
  args = p.parse_args(argv)
  if args.side:
    print(json.dumps(jax_side(args.side, args.steps)))
    return {}
  variants = {"": ""}
  for spec in args.xla_flags:
    name, sep, flags = spec.partition("=")
    if not sep or not name or not flags.strip().startswith("--"):
      p.error(f"--xla-flags {spec!r}: expected NAME=--xla_flag=value [--xla_flag2=...]")
    variants[name] = flags.strip()
  if not args.torch_python and not args.no_torch:
    p.error("--torch-python is needed: a venv with torch (pip install torch), kept apart "
            "from rove-jax's")
  torch_cmd = [args.torch_python, str(ROOT / "bench" / "peers" / "torch_gpt.py"),
               *[f"--{k.replace('_', '-')}={v}" for k, v in SHAPE.items()],
               f"--steps={args.steps}"]
  sides, envs = ({} if args.no_torch else {"torch": torch_cmd}), {}
  for enc in args.encodings.split(","):
    for vname, flags in variants.items():
      name = f"jax-{enc}" + (f"[{vname}]" if vname else "")
      sides[name] = [sys.executable, "-m", "bench.peer_ratio", "--side", enc,
                     f"--steps={args.steps}"]
      envs[name] = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
  speeds = {name: [] for name in sides}
  for r in range(args.rounds):
    names = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for name in names:
      got = _run(sides[name], env=envs.get(name, {"JAX_PLATFORMS": "cpu"}))
      speeds[name] += got["tokens_per_s"]
      print(f"round {r + 1}/{args.rounds} {name:12s} median "
            f"{statistics.median(got['tokens_per_s']):8.1f} tokens/s", file=sys.stderr,
            flush=True)
  medians = {name: statistics.median(v) for name, v in speeds.items()}
  result = {"shape": SHAPE, "median_tokens_per_s": medians, "xla_flags": variants,
            "tokens_per_s": speeds}
  if "torch" in medians:
    result["ratio_vs_torch"] = {n: medians[n] / medians["torch"] for n in medians if n != "torch"}
  result["ratio_vs_default_flags"] = {
      n: medians[n] / medians[n.split("[")[0]] for n in medians if "[" in n}
  for name in medians:
    line = f"{name}: {medians[name]:.0f} tokens/s"
    if "torch" in medians and name != "torch":
      line += f", {result['ratio_vs_torch'][name]:.3f}x torch.compile ({medians['torch']:.0f})"
    if name in result["ratio_vs_default_flags"]:
      line += f", {result['ratio_vs_default_flags'][name]:.3f}x default XLA flags"
    print(line)
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
  return result


if __name__ == "__main__":
  main()
