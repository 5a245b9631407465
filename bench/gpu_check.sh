#!/usr/bin/env bash
# GPU check for rove-jax on one CUDA GPU (written for an H200); ends within BUDGET seconds (470).
#   bash bench/gpu_check.sh        (from the repository root; $OUT defaults to ./gpu_out)
#   SECTIONS="fused-hopper-tests fused-hopper-bench" bash bench/gpu_check.sh   (those sections only)
# Sections, in order of what matters most; each runs under its own cap or what is left of the
# budget, whichever is less, logs its exit status and never stops the ones after it:
# 1. devices and versions;
# 2. make test-gpu: every test marked gpu (cuDNN == XLA in bf16: dense mask, causal fast path,
#    packed documents forward and gradients) and the fused GPU kernel's numerics compiled here;
#    then the kernel "auto" picks for a bf16 call (expected: cudnn);
# 3. the side-by-side: nanoGPT's recipe in PyTorch (bench/peers/torch_gpt.py: torch.compile,
#    bf16 autocast, flash SDPA, fused AdamW, clip 1.0, vocab 50304) against rove-jax's train step
#    (RoPE, RoVE) at GPT-2 124M, batch 16 x 1024, in one call, tokens/s ratios and every side's
#    MFU by one formula over one measured peak (python -m bench.peer_ratio --shape gpt2_124m);
# 4. python -m bench --suite gpu: 124M and 354M train steps RoVE/RoPE/NoPE with MFU (its JSON is
#    written after each model), peak memory, long-context forwards, decoding, compile times;
# 5. the trainer's XLA options for GPUs against XLA's defaults (RoPE step, same call);
# 6. the fused Hopper kernel (Mosaic GPU): numerics compiled, timings against cuDNN;
# 7. the fused output projection and loss (optim.loss_impl=fused) against the default, 124M;
# 8. the fused GPU kernel against cuDNN (python -m bench.fused_gpu);
# 9. a 16k-token evaluation forward of the 124M RoVE model through cuDNN.
# Everything is teed to $OUT/gpu_check.log, each section's output also to $OUT/<section>.log;
# $OUT/sections.tsv lists every section with its exit status and seconds.
#
# What it needs (bench/README.md, "GPU check"): jax with CUDA (jax[cuda12] up to 0.10,
# jax[cuda13] from 0.11), flax, optax, orbax-checkpoint, chex, pytest, torch with CUDA (the
# peer), and rove-jax's own dependencies; wheels the machine lacks travel in ./.whl and are
# installed into /tmp/site below (no network needed).
set -uo pipefail

ALL_SECTIONS="devices test-gpu auto-kernel peer suite xla-options fused-hopper-tests \
fused-hopper-bench fused-loss fused-attention-step fused-gpu forward-16k"
# SECTIONS (names from ALL_SECTIONS, separated by spaces or commas) runs those sections only.
SECTIONS="${SECTIONS:-$ALL_SECTIONS}"
SECTIONS="${SECTIONS//,/ }"
for name in $SECTIONS; do
  case " $ALL_SECTIONS " in
    *" $name "*) ;;
    *) echo "gpu_check.sh: unknown section '$name' in SECTIONS; the sections are: $ALL_SECTIONS" >&2
       exit 2 ;;
  esac
done
BUDGET="${BUDGET:-470}"
if ! [[ "$BUDGET" =~ ^[1-9][0-9]*$ ]]; then
  echo "gpu_check.sh: BUDGET must be a whole number of seconds, got '$BUDGET'" >&2
  exit 2
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"

OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
start=$SECONDS
printf 'section\tstatus\tseconds\n' > "$OUT/sections.tsv"
stamp() { echo "== [$((SECONDS - start)) s] $*"; }
# cap N: N, or the seconds left of BUDGET if fewer (at least 1).
cap() { local left=$((BUDGET - (SECONDS - start))); ((left < $1)) || left=$1; ((left > 0)) || left=1; echo "$left"; }
# section NAME CAP COMMAND...: runs COMMAND under `timeout`, logs it; a failure is recorded
# and the check goes on. Skipped when the budget is spent.
section() {
  local name=$1 limit t0=$SECONDS rc
  limit=$(cap "$2")
  shift 2
  case " $SECTIONS " in
    *" $name "*) ;;
    *) printf '%s\tnot-selected\t0\n' "$name" >> "$OUT/sections.tsv"; return 0 ;;
  esac
  if ((SECONDS - start >= BUDGET)); then
    stamp "$name: SKIPPED (budget of $BUDGET s spent)"
    printf '%s\tskipped\t0\n' "$name" >> "$OUT/sections.tsv"
    return 0
  fi
  stamp "$name (cap ${limit} s)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  if ((rc == 124 || rc == 137)); then
    stamp "$name: TIMED OUT after ${limit} s"
  elif ((rc != 0)); then
    stamp "$name: FAILED (exit $rc)"
  else
    stamp "$name: ok"
  fi
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/sections.tsv"
  return 0
}

section devices 20 bash -c 'python3 -c "import jax, jaxlib; print(\"jax\", jax.__version__, \"jaxlib\", jaxlib.__version__, jax.devices())"; python3 -c "import torch; print(\"torch\", torch.__version__, torch.cuda.is_available())"; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv'

section test-gpu 120 make test-gpu GPU_PYTHON=python3

section auto-kernel 20 python3 - <<'PY'
import jax, jax.numpy as jnp
from rove_jax import kernels
q = jax.ShapeDtypeStruct((1, 1024, 12, 64), jnp.bfloat16)
got = kernels.choose("auto", q=q, k=q, mask=kernels.Mask(ordered=True))
print("auto on this GPU in bf16 ->", got, "(expected cudnn)")
assert got == "cudnn", got
PY

section peer 150 python3 -m bench.peer_ratio --shape gpt2_124m --torch-python python3 \
  --encodings rope,rove --rounds 1 --steps 10 --out "$OUT/peer_124m.json"

section suite 160 python3 -m bench --suite gpu --out "$OUT/bench_gpu.json"

section xla-options 60 python3 -m bench.peer_ratio --shape gpt2_124m --no-torch --encodings rope \
  --rounds 1 --steps 10 \
  --xla-flags xla_defaults='--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_latency_hiding_scheduler=false' \
  --out "$OUT/xla_options_124m.json"

# The fused Hopper kernel (Pallas Mosaic GPU): its numerics compiled on this GPU
# (FUSED_HOPPER_COMPILED=1 turns interpret mode off), then against cuDNN at 124M shapes (B=8/16,
# T=1024/4096), RoVE and RoPE, forward and forward + backward: the default ("hopper", pairs
# swapped by column slices), the two-warpgroup forward and backward kernels ("hopper
# 2wg+bwd2wg"), both turning tiles in bfloat16 pairs ("bf16"), and the two-warpgroup kernels
# with producer warpgroups that copy and turn, forward and backward, in bfloat16 pairs ("hopper
# 2wg+tma+bwd2wg+bwdtma bf16"; bench/fused_gpu.py HOPPER), the Triton kernel left to fused-gpu.
# Needs an sm90 GPU (bench/README.md: SECTIONS runs it alone). About 24 of the 28 tests compile
# a forward and a backward pass (about 5 s each when compiled without a GPU).
# -v: each test's name and outcome is in the log as it ends, should the cap cut the run short.
section fused-hopper-tests 200 env FUSED_HOPPER_COMPILED=1 python3 -m pytest -v \
  -p no:cacheprovider tests/core/test_kernels_fused_hopper.py

section fused-hopper-bench 220 bash -c 'for shape in "8 1024" "16 1024" "8 4096" "16 4096"; do
  set -- $shape
  python3 -m bench.fused_gpu --batch "$1" --length "$2" --repeats 10 \
    --kernels "hopper,hopper bf16,hopper 2wg+bwd2wg,hopper 2wg+bwd2wg bf16,hopper 2wg+tma+bwd2wg+bwdtma bf16" \
    --out "'"$OUT"'/fused_hopper_b$1_t$2.json" || echo "fused Hopper B=$1 T=$2: exit $?"
done'

# The fused output projection and loss (optim.loss_impl=fused, rove_jax/kernels/linear_ce.py)
# against the default: the 124M RoPE step's tokens/s, each side compiled in its own process.
section fused-loss 100 python3 -m bench.peer_ratio --shape gpt2_124m --no-torch \
  --encodings rope,rope+fused --rounds 1 --steps 10 --out "$OUT/fused_loss_124m.json"

# The 124M train step with the fused attention kernel (model.attention_impl=fused: on Hopper the
# Mosaic GPU kernel, reading q, k, v in place from the projection's output), RoVE in the default
# variant, turning tiles in bfloat16 pairs, and with two compute warpgroups and producers that
# turn, forward and backward (model.fused_variant), against the default step (cuDNN) with RoPE;
# the goal: RoVE's fused step no slower. (Fused RoPE moves fused RoVE's bytes; fused-hopper-bench times both.)
section fused-attention-step 190 python3 -m bench.peer_ratio --shape gpt2_124m --no-torch \
  --encodings rope,rove+fused_attention,rove+fused_attention+bf16,rove+fused_attention+2wg+tma+bwd2wg+bwdtma+bf16 \
  --rounds 1 --steps 10 --out "$OUT/fused_attention_124m.json"

# The Triton fused kernel (what kernel="fused" runs on GPUs other than Hopper), its backward
# blocks of 32 and 64, against cuDNN; the Hopper variants are fused-hopper-bench's.
section fused-gpu 40 python3 -m bench.fused_gpu --backward-block 32,64 --repeats 20 \
  --kernels "triton,triton bwd64" --out "$OUT/fused_gpu.json"

section forward-16k 40 env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m bench.isolated \
  --worker long_forward \
  '{"model": {"name": "gpt2_124m", "preset": "gpt2_124m", "overrides": [["dtype", "bfloat16"]], "batch": 1, "seq": 0}, "T": 16384, "kernel": "cudnn", "cap_gib": 0}'

stamp "done"
column -t "$OUT/sections.tsv" 2>/dev/null || cat "$OUT/sections.tsv"
