"""Forward+backward step time of the GPT for several positional encodings, interleaved.

  python -m bench.model_step [--preset tiny --batch 16 --seq 256 --repeats 10
                              --encodings rove,rope,nope --out FILE]

Each encoding's loss-and-gradient function is jitted once; the timed repeats cycle through the
encodings so all see the same machine noise; medians, paired ratios against RoPE, tokens/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx

from rove_jax.nn.model import GPT, GPTConfig


def loss_fn(model, tokens):
  logits = model(tokens[:, :-1])
  logp = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def main(argv=None):
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--preset", default="tiny")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--repeats", type=int, default=10)
  p.add_argument("--encodings", default="rove,rope,nope")
  p.add_argument("--out")
  args = p.parse_args(argv)
  encs = args.encodings.split(",")
  tokens = jax.random.randint(jax.random.key(0), (args.batch, args.seq + 1), 0, 256)
  steps = {}
  for enc in encs:
    cfg = getattr(GPTConfig, args.preset)(pos_encoding=enc)
    model = GPT(cfg, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, tokens, graphdef=graphdef):
      return jax.value_and_grad(lambda s: loss_fn(nnx.merge(graphdef, s), tokens))(state)

    jax.block_until_ready(step(state, tokens))
    steps[enc] = (step, state)
  times = {e: [] for e in encs}
  for _ in range(args.repeats):
    for enc, (step, state) in steps.items():
      t0 = time.perf_counter()
      jax.block_until_ready(step(state, tokens))
      times[enc].append(time.perf_counter() - t0)
  med = {e: statistics.median(ts) for e, ts in times.items()}
  ntok = args.batch * args.seq
  print("| encoding | median step (ms) | tokens/s | paired ratio vs rope |\n|---|---|---|---|")
  result = {
    "preset": args.preset,
    "batch": args.batch,
    "seq": args.seq,
    "repeats": args.repeats,
    "device": jax.devices()[0].device_kind,
    "rows": {},
  }
  for e in encs:
    paired = (
      statistics.median(a / b for a, b in zip(times[e], times["rope"]))
      if "rope" in times
      else float("nan")
    )
    result["rows"][e] = {
      "median_s": med[e],
      "tokens_per_s": ntok / med[e],
      "paired_ratio_vs_rope": paired,
    }
    print(f"| {e} | {1e3 * med[e]:.1f} | {ntok / med[e]:.0f} | {paired:.3f} |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
