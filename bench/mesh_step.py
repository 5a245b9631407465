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

from rove_jax.train import config_schema  # noqa: E402
from rove_jax.train import loop as training  # noqa: E402
from rove_jax.train.metrics import read_metrics  # noqa: E402

MESHES = [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 4, 2), (1, 1, 8)]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--out")
  args = p.parse_args(argv)
  rows = []
  for mesh in MESHES:
    c = config_schema.base_config("tiny")
    m = c.model
    m.n_layer, m.d_model, m.n_head, m.d_ff, m.max_len = 2, 128, 8, 512, 128
    c.data.max_files, c.data.seq_len, c.data.batch_size = 100, 128, 16
    c.steps, c.log_every, c.eval_every, c.checkpoint_every = args.steps, 1, 10**6, 10**6
    c.optim.warmup_steps, c.progress, c.sample_tokens = 1, False, 0
    c.async_checkpoints = False
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    n = mesh[0] * mesh[1] * mesh[2]
    with tempfile.TemporaryDirectory() as work:
      training.train(c, work, devices=jax.devices()[:n], log=lambda *a: None)
      tps = [r["tokens_per_s"] for r in read_metrics(work) if "tokens_per_s" in r][1:]
    step_s = 16 * 128 / statistics.median(tps)
    rows.append({"mesh": mesh, "step_s": step_s})
    print(f"mesh (data, fsdp, tensor) = {mesh}: {1e3 * step_s:.0f} ms/step "
          f"(median of {len(tps)} steps, 16 x 128 tokens)")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
