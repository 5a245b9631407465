#!/usr/bin/env bash
# The ahead-of-time compile table of docs/scaling.md and bench/RESULTS.md: GPT-2 124M and 354M, RoVE and
# RoPE, the paper's batch (512 x 1024 tokens a step), on TPU slices with the recommended mesh and
# grad_accum (python -m bench.aot --recommend), compiled on a CPU host. Needs libtpu
# (pip install -e '.[tpu]'); about 2-5 minutes a compile on 2 cores, one at a time.
#   bash bench/aot_table.sh [OUTDIR]          (default bench/aot_results; one JSON a row)
set -uo pipefail
OUT="${1:-bench/aot_results}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
run() {  # name topology preset encoding [extra args...]
  local name=$1 topo=$2 preset=$3 enc=$4; shift 4
  [ -s "$OUT/$name.json" ] && { echo "== $name: done"; return; }
  echo "== $name: python -m bench.aot --config configs/$preset.py --topology $topo" \
       "--config.model.pos_encoding=$enc --recommend $*"
  $PY -m bench.aot --config "configs/$preset.py" --topology "$topo" \
      --config.model.pos_encoding="$enc" --recommend --markdown --json "$OUT/$name.json" "$@" \
      > "$OUT/$name.txt" 2>&1 || echo "   exit $? (see $OUT/$name.txt)"
  tail -n 3 "$OUT/$name.txt"
}
for enc in rove rope; do
  run "124m_${enc}_v5e-8"   v5e-8   gpt2_124m "$enc"
  run "354m_${enc}_v5e-16"  v5e-16  gpt2_354m "$enc"
  run "124m_${enc}_v4-32"   v4-32   gpt2_124m "$enc"
  run "354m_${enc}_v4-32"   v4-32   gpt2_354m "$enc"
done
run 124m_rove_v5e-256 v5e-256 gpt2_124m rove
run 354m_rove_v5p-128 v5p-128 gpt2_354m rove
run 124m_rove_v5e-8_eval_decode v5e-8 gpt2_124m rove --jobs eval,decode --eval-impl auto
PY="${PYTHON_GPU:-$PY}" run 124m_rove_h200-8 h200-8 gpt2_124m rove  # JAX CUDA plugin venv
# packed documents: cuDNN's packed layout (segment starts and lengths), no dense mask
PY="${PYTHON_GPU:-$PY}" run 124m_rove_h200-8_packed h200-8 gpt2_124m rove --config.data.packing=True
