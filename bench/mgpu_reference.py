"""The yardstick for the Hopper fused kernels' loops: JAX's own flash attention in Pallas Mosaic
GPU (jax.experimental.pallas.ops.gpu.attention_mgpu: FlashAttention-3's design, two compute
warpgroups of 64 query rows and a producer warpgroup, no rotation), its causal forward compiled
for an H100 or H200 without a GPU, and its instructions by class, the main loop's among them, as
`python -m bench.fused_gpu --aot h200 --sass` reports the fused kernels'.

  python -m bench.mgpu_reference [--aot h200] [--batch 8 --length 1024 --heads 12 --head-dim 64]
      [--block-kv 128] [--backward] [--out F]

Its float16 inputs: the kernel casts p to float16 for the p.v product (bfloat16 q, k, v are
refused), which issues the same instructions a bfloat16 kernel would. Reading it beside the
fused kernels' loops (a 128-key block, both): what the fused kernel adds to a flash-attention
loop, and what its loop's flash core and overhead cost against one written by JAX's authors.
--backward compiles its backward pass too ("dq" and "dk_dv"; it names neither), with two
compute warpgroups of 64 rows sharing each looped block of 64 and a producer warpgroup: the
fused kernels' blocks with backward_wgs=2. It takes no causal mask, so the forward is then
compiled without one too, and its loops compare with the fused kernels' unmasked loops. Needs
JAX's CUDA plugin and the CUDA tools `--sass` needs (rove_jax[gpu-aot]).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile

# JAX's CUDA plugin registers without a driver only with this set; the dumps' folder before
# JAX starts.
os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
from rove_jax.aot import ptxas as ptxas_tool  # noqa: E402

DUMPS = tempfile.mkdtemp(prefix="mgpu_reference_")
os.environ.update(ptxas_tool.mosaic_dump_env(os.path.join(DUMPS, "mosaic")))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


class _RuntimeVersion:
  """attention_mgpu asks the CUDA runtime its version (it refuses causal masks under 12.8 to
  12.9.1, a ptxas miscompilation); a host without a GPU has no runtime to ask. The CUDA 13
  tools assemble here, so 13.0 answers."""

  @staticmethod
  def cuda_runtime_get_version() -> int:
    return 13000


def compile_reference(args) -> dict:
  """{"ptxas": registers, spills, shared memory; "sass": instructions by class, loops among
  them} of the reference kernel compiled for args.aot at args' shape."""
  import shutil

  from jax.experimental.pallas.ops.gpu import attention_mgpu

  from rove_jax.aot import gpu as aot_gpu
  from rove_jax.aot import sass

  attention_mgpu.cuda_versions = _RuntimeVersion
  device = aot_gpu.devices(aot_gpu.GPUS[args.aot], 1)[0]
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shape = (args.batch, args.length, args.heads, args.head_dim)
  qkv = [jax.ShapeDtypeStruct(shape, jnp.float16, sharding=sharding)] * 3
  blocks = dict(block_q_dq=64, block_kv_dq=64, block_q_dkv=64, block_kv_dkv=64)
  config = attention_mgpu.TuningConfig(
    block_q=64,
    block_kv=args.block_kv,
    max_concurrent_steps=2,
    causal=not args.backward,  # its backward pass has no causal mask
    **(dict(blocks, compute_wgs_bwd=2) if args.backward else {}),
  )
  forward = lambda q, k, v: attention_mgpu.attention(q, k, v, config)
  total = lambda q, k, v: forward(q, k, v).astype(jnp.float32).sum()
  run = jax.grad(total, (0, 1, 2)) if args.backward else forward
  with jax.set_mesh(mesh):
    jax.jit(run).lower(*qkv).compile()
  folder = os.path.join(DUMPS, "mosaic")
  try:
    _name_backward_kernels(folder)
    report = ptxas_tool.read_mosaic(folder)
    ptx = ptxas_tool.mosaic_files(folder, ".ptx")
    counts = {name: sass.of_ptx(path) for name, path in ptx.items()}
  finally:
    shutil.rmtree(DUMPS, ignore_errors=True)
  print(ptxas_tool.table(report))
  print(sass.table(counts))
  return dict(ptxas=report, sass=counts)


# A TMA copy from shared to global memory (an output tile's store), in PTX.
_TMA_STORE = re.compile(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared")


def _name_backward_kernels(folder: str) -> None:
  """Renames the dumps of the reference's two unnamed backward kernels ("anonymous_N.*") by
  their outputs: "dk_dv" stores two tiles a program, "dq" one."""
  for ptx in glob.glob(os.path.join(folder, "anonymous_*.ptx")):
    with open(ptx) as f:
      name = "dk_dv" if len(_TMA_STORE.findall(f.read())) == 2 else "dq"
    stem = ptx[: -len(".ptx")]
    for path in glob.glob(stem + ".*"):
      os.rename(path, path.replace("anonymous", name))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m bench.mgpu_reference",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("--aot", choices=("h100", "h200"), default="h200", help="compile for this GPU")
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--length", type=int, default=1024)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--head-dim", type=int, default=64)
  p.add_argument("--block-kv", type=int, default=128, help="its key block (64, 128 or 256)")
  p.add_argument(
    "--backward", action="store_true", help="its backward kernels too (without a causal mask)"
  )
  p.add_argument("--out", help="write the figures here as JSON")
  args = p.parse_args(argv)
  from rove_jax.aot import sass

  if problem := sass.missing_tools():
    p.error(problem)
  result = compile_reference(args)
  result.update(shape=vars(args), jax=jax.__version__)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
