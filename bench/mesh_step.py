"""Train-step time of a small RoVE GPT on 8 simulated CPU devices, per mesh.

  python -m bench.mesh_step [--steps 8] [--out FILE]

The 8 devices share this machine's cores, so the figures are a sanity check of the sharded
code paths (collectives, resharding), not a speed measurement.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402

from rove_jax.nn.model_config import GPTConfig  # noqa: E402
from rove_jax.train import loop as training  # noqa: E402
from rove_jax.train.metrics import read_metrics  # noqa: E402
from rove_jax.train.run_config import (  # noqa: E402
  DataConfig,
  MeshConfig,
  OptimConfig,
  RunConfig,
)

MESHES = [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2), (1, 1, 8)]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--out")
  args = p.parse_args(argv)
  rows = []
  for mesh in MESHES:
    c = RunConfig(
      model=GPTConfig.tiny(n_layer=2, d_model=128, n_head=8, d_ff=512, max_len=128),
      data=DataConfig(max_files=100, seq_len=128, batch_size=16),
      optim=OptimConfig(warmup_steps=1),
      mesh=MeshConfig(*mesh),
      steps=args.steps,
      log_every=1,
      eval_every=10**6,
      checkpoint_every=10**6,
      progress=False,
      sample_tokens=0,
      async_checkpoints=False,
    )
    n = mesh[0] * mesh[1] * mesh[2]
    with tempfile.TemporaryDirectory() as work:
      training.train(c, work, devices=jax.devices()[:n], log=lambda *a: None)
      tps = [r["tokens_per_s"] for r in read_metrics(work) if "tokens_per_s" in r][1:]
    step_s = 16 * 128 / statistics.median(tps)
    rows.append({"mesh": mesh, "step_s": step_s})
    print(
      f"mesh (data, fsdp, tensor) = {mesh}: {1e3 * step_s:.0f} ms/step "
      f"(median of {len(tps)} steps, 16 x 128 tokens)"
    )
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
