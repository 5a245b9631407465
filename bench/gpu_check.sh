#!/usr/bin/env bash
# GPU check for rove-jax on one CUDA GPU (written for an H200); about 8 minutes.
#   bash bench/gpu_check.sh        (from the repository root; $OUT defaults to ./gpu_out)
# 1. the cuDNN == XLA bf16 attention tests, the causal fast path (an ordered Mask: cuDNN's own
#    mask, no [B, T, S] array) and packed documents (cuDNN's packed layout: segment starts and
#    lengths) included, and kernel selection ("auto" picks cudnn in bf16);
# 2. the fused kernel for GPUs (rove_jax.kernels.fused_gpu, Pallas Triton), never run on a GPU
#    before: its numerics tests compiled on this GPU (tests/core/test_kernels_fused_gpu.py with
#    FUSED_GPU_COMPILED=1) and python -m bench.fused_gpu, fused against cuDNN for RoVE and RoPE,
#    bf16, forward and forward + backward at 124M attention shapes (the backward at blocks of 32
#    and of 64); a failure here is logged and the check goes on;
# 3. python -m bench --suite gpu: GPT-2 124M (context 1024, bf16, cuDNN flash attention) and
#    354M train steps RoVE/RoPE/NoPE with MFU against the measured bf16 matmul peak, peak device
#    memory, 4k/8k/16k forwards (xla, chunked), decoding, compile time vs depth;
# 4. a 16k-token evaluation forward of the 124M RoVE model through the cuDNN kernel.
# Everything is teed to $OUT/gpu_check.log; the suite's JSON is saved after every section.
# Each section's timeout is its own cap or what is left of BUDGET seconds, whichever is less,
# so the whole check ends within the 8 minutes a lent GPU gives it.
set -euo pipefail

# The image lacks grain and ml-collections; they travel as wheels in ./.whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD

OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
start=$SECONDS
BUDGET="${BUDGET:-470}"
stamp() { echo "== [$((SECONDS - start)) s] $*"; }
# cap N: N, or the seconds left of BUDGET if fewer (at least 1).
cap() { local left=$((BUDGET - (SECONDS - start))); ((left < $1)) || left=$1; ((left > 0)) || left=1; echo "$left"; }

stamp "devices"
python3 -c 'import jax; print(jax.__version__, jax.devices())'
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv || true

stamp "cuDNN == XLA bf16 attention tests (dense mask, causal fast path, packed documents), kernel selection"
timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider tests/core/test_attention.py -k cudnn
python3 - <<'PY'
import jax, jax.numpy as jnp
from rove_jax import kernels
q = jax.ShapeDtypeStruct((1, 1024, 12, 64), jnp.bfloat16)
got = kernels.choose("auto", q=q, k=q, mask=kernels.Mask(ordered=True))
print("auto on this GPU in bf16 ->", got, "(expected cudnn)")
assert got == "cudnn", got
PY

stamp "fused GPU kernel (Pallas Triton): numerics compiled on this GPU against float64 references"
FUSED_GPU_COMPILED=1 timeout "$(cap 150)" python3 -m pytest -q -p no:cacheprovider \
  tests/core/test_kernels_fused_gpu.py || echo "== fused GPU numerics: FAILED or timed out (rc $?)"

stamp "fused GPU kernel vs cuDNN, RoVE and RoPE, bf16, B=8 T=1024 H=12 D=64, fwd and fwd+bwd"
timeout "$(cap 120)" python3 -m bench.fused_gpu --backward-block 32,64 --repeats 20 \
  --out "$OUT/fused_gpu.json" || echo "== fused GPU timings: FAILED or timed out (rc $?)"

# --- fused Hopper kernel (Pallas Mosaic GPU), self-contained: its numerics tests compiled on
# this GPU (FUSED_HOPPER_COMPILED=1 turns interpret mode off) and its timings against cuDNN at
# 124M shapes (B=8/16, T=1024/4096), RoVE and RoPE, forward and forward + backward. Needs an
# sm90 GPU; a failure is logged and the check goes on.
stamp "fused Hopper kernel (Mosaic GPU): numerics compiled, then vs cuDNN at 124M shapes"
FUSED_HOPPER_COMPILED=1 timeout "$(cap 120)" python3 -m pytest -q -p no:cacheprovider \
  tests/core/test_kernels_fused_hopper.py || echo "== fused Hopper numerics: FAILED or timed out (rc $?)"
for shape in "8 1024" "16 1024" "8 4096" "16 4096"; do
  set -- $shape
  timeout "$(cap 60)" python3 -m bench.fused_gpu --batch "$1" --length "$2" --repeats 10 \
    --out "$OUT/fused_hopper_b$1_t$2.json" || echo "== fused Hopper timings B=$1 T=$2: FAILED or timed out (rc $?)"
done
# --- end of the fused Hopper section

stamp "benchmark suite (gpu)"
timeout "$(cap 330)" python3 -m bench --suite gpu --out "$OUT/bench_gpu.json"

stamp "16k-token evaluation forward, 124M RoVE bf16, cuDNN kernel"
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "$(cap 90)" python3 -m bench.suite --worker long_forward \
  '{"model": {"name": "gpt2_124m", "preset": "gpt2_124m", "overrides": [["dtype", "bfloat16"]], "batch": 1, "seq": 0}, "T": 16384, "kernel": "cudnn", "cap_gib": 0}' \
  | tee "$OUT/forward_16k_cudnn.json"

stamp "done"
