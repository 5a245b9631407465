"""Training speed of two versions of the code, A/B in one run, interleaved.

  python -m bench.ab_train [--mode train|step] [--base fd1fdb1] [--head WORKTREE]
                           [--repeats 3] [--steps 20] [--batch 16] [--seq 256]
                           [--set model.d_model=256 ...] [--encoding rove] [--out F]

--mode train (default) runs `train.py` of each side, data pipeline and logging included;
--mode step times only the jitted train step of each side's own model, optimizer and
make_train_step on a fixed random batch (the model code alone; `--encoding`, and the tiny
preset's shape at --batch x --seq), which is far less noisy.
--mode interleaved builds the same step on each side, exports it (jax.export: StableHLO, the
side's own code compiled away) and times both exported steps in one process, alternating step
by step (ABBA within each pair), so that a drift of the machine lands on both sides within
milliseconds; the result is the ratio of the median step times and the same ratio per block
of --steps pairs (--repeats blocks). It needs flatbuffers (pip install -e '.[bench]').

Each side is a full checkout: `--base`/`--head` name git revisions (exported with git archive)
or WORKTREE, this checkout as it is. Every repeat trains each side once from scratch in its own
subprocess (the preset of configs/tiny.py, the stdlib corpus, `--steps` steps logged every
step, no checkpoint or evaluation until the end), in ABBA order so that a drift of the machine
weighs on both sides alike. A run's speed is the median tokens/s of its metrics.jsonl rows
after the first two (compilation and warm-up); the result is the per-repeat ratio head / base
and their geometric mean. Both sides use this interpreter (the same jax, flax and XLA).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKTREE = "WORKTREE"

# The step workers' common part, run with PYTHONPATH at a side's checkout: the layered package
# (rove_jax.train, rove_jax.nn) or the flat one of earlier versions (rove_jax.training,
# rove_jax.model); it builds `state`, the jitted `step` and a fixed random `batch`.
STEP_SETUP = """
import json, os, sys, time
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
import rove_jax
assert rove_jax.__file__.startswith(os.getcwd()), rove_jax.__file__  # this side's code
if os.path.exists("rove_jax/train/loop.py"):  # (an editable install maps missing modules
  if os.path.exists("rove_jax/train/program.py"):  # to its own tree: look first)
    from rove_jax.train import program as T  # the step's own module
  else:
    from rove_jax.train import loop as T  # where earlier versions kept it
  from rove_jax.train.run_config import OptimConfig
  from rove_jax.nn.model import GPT, GPTConfig
  optim = OptimConfig()
else:
  from rove_jax import training as T, config as C
  from rove_jax.model import GPT, GPTConfig
  optim = C.base_config("tiny").optim
batch_size, seq, steps, encoding = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = GPTConfig.tiny(max_len=seq, pos_encoding=encoding)
tx = T.make_optimizer(optim, 1000)
graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
state = T.TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))
step = T.make_train_step(graphdef, tx, 1, T.lr_schedule(optim, 1000))
tokens = np.random.default_rng(0).integers(0, 256, (batch_size, seq + 1))
batch = {"inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
         "targets": jnp.asarray(tokens[:, 1:], jnp.int32)}
"""

# --mode step: times argv[3] steps after two of warm-up.
STEP_WORKER = (
  STEP_SETUP
  + """
times = []
for i in range(steps + 2):
  t = time.perf_counter()
  state, m = step(state, batch)
  bool(m["finite"])
  times.append(time.perf_counter() - t)
print(json.dumps({"tokens_per_s": [batch_size * seq / t for t in times[2:]]}))
"""
)


# --mode interleaved: the step as a flat function of (inputs, targets, *state leaves), exported
# to argv[5] with its starting arguments in argv[6].
EXPORT_WORKER = (
  STEP_SETUP
  + """
leaves, treedef = jax.tree.flatten(state)
def flat(inputs, targets, *leaves):
  new, m = step(jax.tree.unflatten(treedef, leaves), {"inputs": inputs, "targets": targets})
  return m["finite"], *jax.tree.leaves(new)
args = (batch["inputs"], batch["targets"], *leaves)
exp = jax.export.export(jax.jit(flat))(*args)
open(sys.argv[5], "wb").write(exp.serialize())
np.savez(sys.argv[6], *[np.asarray(a) for a in args])
"""
)


def export(rev: str, into: pathlib.Path) -> pathlib.Path:
  """A checkout of `rev` (WORKTREE: this one, as it is)."""
  if rev == WORKTREE:
    return ROOT
  into.mkdir(parents=True)
  archive = subprocess.run(
    ["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True
  ).stdout
  subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
  return into


def run_once(tree: pathlib.Path, workdir: pathlib.Path, args) -> float:
  """Trains in a subprocess; the median tokens/s of its logged rows after the first two."""
  cmd = [
    sys.executable,
    "train.py",
    "--config",
    "configs/tiny.py",
    "--workdir",
    str(workdir),
    f"--config.steps={args.steps}",
    "--config.log_every=1",
    f"--config.eval_every={args.steps}",
    f"--config.checkpoint_every={args.steps}",
    "--config.eval_batches=1",
    "--config.progress=False",
    "--config.sample_tokens=0",
    f"--config.data.batch_size={args.batch}",
    f"--config.data.seq_len={args.seq}",
    f"--config.model.max_len={args.seq}",
    "--config.optim.warmup_steps=2",
    f"--config.data.max_train_tokens={args.max_tokens}",
    f"--config.data.max_val_tokens={args.max_tokens // 10}",
    *[f"--config.{kv}" for kv in args.set],
  ]
  env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
  if proc.returncode:
    raise RuntimeError(f"{tree}: train.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r][2:]
  if not speeds:
    raise RuntimeError(f"{workdir}: no tokens_per_s rows past the first two; raise --steps")
  return statistics.median(speeds)


def _worker(tree: pathlib.Path, code: str, args, steps: int, *extra: str) -> str:
  """Runs a step worker on `tree`'s code in a subprocess; its stdout."""
  env = {**os.environ, "PYTHONPATH": str(tree), "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(
    [sys.executable, "-c", code, str(args.batch), str(args.seq), str(steps), args.encoding, *extra],
    cwd=tree,
    env=env,
    capture_output=True,
    text=True,
  )
  if proc.returncode:
    raise RuntimeError(f"{tree}: the step worker failed:\n{proc.stderr[-3000:]}")
  return proc.stdout


def step_once(tree: pathlib.Path, args) -> float:
  """The median tokens/s of the jitted train step of `tree`'s code, in a subprocess."""
  out = _worker(tree, STEP_WORKER, args, args.steps)
  return statistics.median(json.loads(out.strip().splitlines()[-1])["tokens_per_s"])


def export_step(tree: pathlib.Path, out: pathlib.Path, args):
  """Exports `tree`'s train step and its first arguments into out.{hlo,npz}."""
  _worker(tree, EXPORT_WORKER, args, 0, str(out) + ".hlo", str(out) + ".npz")


def interleaved(paths: dict, args) -> dict:
  """Step times of both exported steps in this process, alternating ABBA step by step."""
  import jax
  import numpy as np

  steps, state = {}, {}
  for side, path in paths.items():
    steps[side] = jax.jit(
      jax.export.deserialize(bytearray(pathlib.Path(str(path) + ".hlo").read_bytes())).call
    )
    with np.load(str(path) + ".npz") as z:
      args_ = [jax.numpy.asarray(z[f"arr_{i}"]) for i in range(len(z.files))]
    state[side] = (args_[:2], args_[2:])

  def one(side):
    batch, leaves = state[side]
    t = time.perf_counter()
    finite, *leaves = steps[side](*batch, *leaves)
    bool(finite)
    dt = time.perf_counter() - t
    state[side] = (batch, leaves)
    return dt

  for side in paths:  # compile and warm up
    one(side), one(side)
  times = {side: [] for side in paths}
  for i in range(args.repeats * args.steps):
    for side in ("base", "head") if i % 2 == 0 else ("head", "base"):
      times[side].append(one(side))
    if (i + 1) % args.steps == 0:
      base, head = (statistics.median(times[s][i + 1 - args.steps :]) for s in ("base", "head"))
      print(
        f"block {(i + 1) // args.steps}/{args.repeats}: head / base {base / head:.3f}",
        file=sys.stderr,
        flush=True,
      )
  return times


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--mode", choices=("train", "step", "interleaved"), default="train")
  p.add_argument("--encoding", default="rove", help="--mode step: the model's pos_encoding")
  p.add_argument("--base", default="fd1fdb1")
  p.add_argument("--head", default=WORKTREE)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=256)
  p.add_argument("--max-tokens", type=int, default=2_000_000)
  p.add_argument("--set", action="append", default=[], help="a config override KEY=VALUE")
  p.add_argument("--out")
  args = p.parse_args(argv)
  if args.mode == "interleaved" and importlib.util.find_spec("flatbuffers") is None:
    p.error(
      "--mode interleaved serializes jax.export steps and needs flatbuffers: "
      "pip install -e '.[bench]'"
    )
  if args.steps < 4 or args.repeats < 1:
    p.error("--steps must be >= 4 (two rows are warm-up) and --repeats >= 1")
  with tempfile.TemporaryDirectory(prefix="ab-train-") as tmp:
    tmp = pathlib.Path(tmp)
    trees = {"base": export(args.base, tmp / "base"), "head": export(args.head, tmp / "head")}
    speeds, pooled = {"base": [], "head": []}, None
    if args.mode == "interleaved":
      paths = {side: tmp / f"step-{side}" for side in trees}
      for side in trees:
        export_step(trees[side], paths[side], args)
      times = interleaved(paths, args)
      tokens = args.batch * args.seq
      for r in range(args.repeats):  # per block: tokens/s of the median step
        block = slice(r * args.steps, (r + 1) * args.steps)
        for side in speeds:
          speeds[side].append(tokens / statistics.median(times[side][block]))
      pooled = statistics.median(times["base"]) / statistics.median(times["head"])
      print(
        f"all {len(times['base'])} pairs: head / base {pooled:.4f} "
        f"(median step {statistics.median(times['base']) * 1e3:.1f} ms base, "
        f"{statistics.median(times['head']) * 1e3:.1f} ms head)",
        file=sys.stderr,
      )
    else:
      for r in range(args.repeats):
        order = ("base", "head") if r % 2 == 0 else ("head", "base")  # ABBA
        for side in order:
          speeds[side].append(
            step_once(trees[side], args)
            if args.mode == "step"
            else run_once(trees[side], tmp / f"run-{side}-{r}", args)
          )
          print(
            f"repeat {r + 1}/{args.repeats} {side:4s} {speeds[side][-1]:8.1f} tokens/s",
            file=sys.stderr,
            flush=True,
          )
  ratios = [h / b for h, b in zip(speeds["head"], speeds["base"])]
  result = {
    "mode": args.mode,
    "base": args.base,
    "head": args.head,
    "batch": args.batch,
    "seq": args.seq,
    "encoding": args.encoding if args.mode != "train" else None,
    "steps": args.steps,
    "set": args.set,
    "tokens_per_s": speeds,
    "ratios": ratios,
    "geomean_ratio": math.exp(statistics.fmean(math.log(x) for x in ratios)),
    "pooled_ratio": pooled,
  }
  print(
    f"head / base tokens/s: {result['geomean_ratio']:.3f} (per repeat "
    f"{', '.join(f'{x:.3f}' for x in ratios)}); base {statistics.median(speeds['base']):.0f}, "
    f"head {statistics.median(speeds['head']):.0f} tokens/s (medians)"
  )
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1))
  return result


if __name__ == "__main__":
  main()
