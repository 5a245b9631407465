"""Per-device memory estimates for the GPT presets on (data, fsdp, tensor) meshes.

  python -m bench.memory_estimate [--presets gpt2_124m,gpt2_354m] [--devices 8]
                                  [--batch-per-device 16] [--seq 1024] [--out FILE]

Parameters, gradients and Adam moments are counted exactly from the presets' parameter
shapes (jax.eval_shape, nothing allocated) and the sharding rules of rove_jax.sharding: each
array's bytes divided by the mesh axes its PartitionSpec uses. Activations saved for the
backward pass are estimated per layer and token as 34 E + 5 H T bytes in bf16 without
rematerialisation (Korthikanti et al., 2022) and 2 E bytes (the block input) with
remat="full", divided by the tensor axis for the parts Megatron-style tensor parallelism
splits; plus the float32 logits and their gradient (2 x 4 V bytes a token / tensor).
These are estimates for planning; XLA's buffer assignment adds workspace on top.
"""

from __future__ import annotations

import argparse
import json

GIB = 2**30


def estimate(preset: str, mesh_shape, batch_per_device: int, seq: int) -> dict:
  import jax
  import numpy as np
  from flax import nnx

  from rove_jax import sharding
  from rove_jax.model import GPT, GPTConfig

  cfg = getattr(GPTConfig, preset)()
  abstract = nnx.state(nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  data, fsdp, tensor = mesh_shape
  mesh = jax.sharding.AbstractMesh((data, fsdp, tensor), sharding.MESH_AXES)
  specs = sharding.param_path_specs(abstract, mesh)
  n_params = 0
  per_device_params = 0.0
  for shape, spec in specs.values():
    size = int(np.prod(shape))
    n_params += size
    split = 1
    for entry in spec:
      for axis in ((entry,) if isinstance(entry, str) else (entry or ())):
        split *= mesh.shape[axis]
    per_device_params += size / split
  state = per_device_params * 4 * 4  # float32 params, grads, Adam mu and nu
  E, H, V, L = cfg.d_model, cfg.n_head, cfg.vocab_size, cfg.n_layer
  tokens = batch_per_device * seq
  act_full = L * tokens * (34 * E + 5 * H * seq) / tensor
  act_remat = L * tokens * 2 * E
  logits = tokens * V * 4 * 2 / tensor
  return {
      "preset": preset, "params": n_params, "mesh": {"data": data, "fsdp": fsdp, "tensor": tensor},
      "batch_per_device": batch_per_device, "seq": seq,
      "state_gib": state / GIB,
      "activations_gib": act_full / GIB, "activations_remat_gib": act_remat / GIB,
      "logits_gib": logits / GIB,
      "total_gib": (state + act_full + logits) / GIB,
      "total_remat_gib": (state + act_remat + logits) / GIB,
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--presets", default="gpt2_124m,gpt2_354m")
  p.add_argument("--devices", type=int, default=8)
  p.add_argument("--batch-per-device", type=int, default=16)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--out")
  args = p.parse_args(argv)
  n = args.devices
  meshes = [(n, 1, 1), (1, n, 1), (n // 2, 2, 1), (n // 2, 1, 2), (1, n // 2, 2), (1, 1, n)]
  rows = [estimate(pr, m, args.batch_per_device, args.seq)
          for pr in args.presets.split(",") for m in meshes if all(x >= 1 for x in m)]
  print(f"Per-device memory, {n} devices, {args.batch_per_device} x {args.seq} tokens per device "
        f"(bf16 activations, float32 params + grads + Adam):\n")
  print("| preset | mesh (data, fsdp, tensor) | params+grads+Adam | activations | "
        "activations, remat=full | logits | total | total, remat=full |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    m = r["mesh"]
    print(f"| {r['preset']} ({r['params'] / 1e6:.1f}M) | ({m['data']}, {m['fsdp']}, {m['tensor']}) "
          f"| {r['state_gib']:.2f} GiB | {r['activations_gib']:.2f} GiB "
          f"| {r['activations_remat_gib']:.2f} GiB | {r['logits_gib']:.2f} GiB "
          f"| {r['total_gib']:.2f} GiB | {r['total_remat_gib']:.2f} GiB |")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=2)


if __name__ == "__main__":
  main()
