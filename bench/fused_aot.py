"""Compile the fused kernel alone (forward and backward, bf16, packed-document mask) for one TPU
chip with libtpu, from this host; prints compile time, XLA's bytes and FLOPs, or libtpu's error
(e.g. VMEM exhausted). Checks which blocks fit VMEM at a head count.

  python -m bench.fused_aot --topology v4-8 --heads 16 --block 256 [--layout half]
      [--force-block] [--batch 2] [--length 1024] [--head-dim 64]

--force-block skips the kernel's VMEM-based block choice (fused.VMEM_BUDGET) so libtpu judges
the block as given. Needs libtpu (pip install 'rove_jax[tpu]').
"""

import argparse
import math
import time

import jax
import jax.numpy as jnp

import rove_jax as rj
from rove_jax.aot import compile as aot
from rove_jax.kernels import KernelCall, Mask, fused


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--topology", default="v5e-1")
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--block", type=int, default=fused.DEFAULT_BLOCK)
  p.add_argument("--layout", default="interleaved")
  p.add_argument("--force-block", action="store_true")
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--length", type=int, default=1024)
  p.add_argument("--head-dim", type=int, default=64)
  a = p.parse_args()
  if a.force_block:
    fused.VMEM_BUDGET = float("inf")
  B, T, H, D = a.batch, a.length, a.heads, a.head_dim
  device = aot.parse_topology(a.topology).devices()[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  rope = rj.Rope(rj.rope_frequencies(D), 1.0, a.layout)
  attend = fused.kernel(a.block, interpret=False)
  print(
    f"{a.topology}: B={B} T={T} H={H} D={D} block {a.block}, estimate "
    f"{fused.vmem_bytes(H, H, D, jnp.bfloat16, a.block, a.block) / 2**20:.2f} MiB"
  )

  def loss(q, k, v, seg, rove):
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    out = attend.attend(
      KernelCall(
        q,
        k,
        v,
        Mask(ordered=True, segment_ids=seg),
        pos,
        pos,
        1.0 / math.sqrt(D),
        rope=rope,
        kind="rove" if rove else "rope",
      )
    )
    return jnp.sum(out.astype(jnp.float32) ** 2)

  x = jax.ShapeDtypeStruct((B, T, H, D), jnp.bfloat16, sharding=sharding)
  seg = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=sharding)
  for rove in (False, True):
    start = time.time()
    grad = jax.jit(jax.grad(lambda q, k, v, s, r=rove: loss(q, k, v, s, r), argnums=(0, 1, 2)))
    try:
      cost = grad.trace(x, x, x, seg).lower().compile().cost_analysis()
      print(
        f"{'rove' if rove else 'rope'}: compiled in {time.time() - start:.1f} s, bytes "
        f"{cost['bytes accessed']:.3e}, flops {cost['flops']:.3e}"
      )
    except Exception as e:  # noqa: BLE001 - libtpu's verdict is the result
      print(f"{'rove' if rove else 'rope'}: {str(e).splitlines()[0][:300]}")


if __name__ == "__main__":
  main()
