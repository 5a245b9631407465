"""bench/aot_summary.py: the compiled table and the RoVE / RoPE ratios from saved reports."""

import json

from bench import aot_summary

GiB = 2**30


def report(enc, memory_gib, tflop, *, packing=False, estimate=None):
  r = {
    "job": "train",
    "accelerator": "v4-32",
    "mesh": {"data": 16, "fsdp": 1, "tensor": 1},
    "grad_accum": 2,
    "batch": 512,
    "length": 1024,
    "pos_encoding": enc,
    "packing": packing,
    "memory": {"total": memory_gib * GiB},
    "flops": tflop * 1e12,
    "model_to_compiled": 0.5,
    "hbm_bytes": 32 * GiB,
    "headroom_bytes": (32 - memory_gib) * GiB,
    "collectives": {
      "all-reduce": {"count": 7, "bytes": 0.6 * GiB},
      "all-gather": {"count": 0, "bytes": 0},
    },
    "roofline": {"step_time_bound_s": 0.25, "mfu_bound": 0.4},
  }
  if estimate is not None:
    r["memory_estimate"] = {"estimate_gib": estimate}
  return r


def write(tmp_path, name, *reports):
  (tmp_path / f"{name}.json").write_text(
    json.dumps({"config": "gpt2_124m", "reports": list(reports)})
  )


def test_ratios_pair_rove_with_rope_and_leave_packed_rows_out(tmp_path):
  write(tmp_path, "a", report("rove", 10.0, 28.2))
  write(tmp_path, "b", report("rope", 8.0, 28.0))
  write(tmp_path, "c", report("rove", 4.0, 1.0, packing=True))
  rows = aot_summary.load(str(tmp_path))
  table = aot_summary.table(rows)
  assert "| gpt2_124m rove packed | v4-32 |" in table
  assert "| 10.00 (32, 22.00) | 28.20 | 2.000 | all-reduce 7 (0.60) | 250.0 | 0.400 |" in table
  assert "estimate" not in table  # no report carries the retired estimate
  ratio_row = aot_summary.ratios(rows).splitlines()[2]
  assert ratio_row == "| gpt2_124m | v4-32 | train | 1.0071 | 1.2500 |"
  write(tmp_path, "d", report("rope", 8.0, 28.0, estimate=24.0))
  assert "estimate GiB" in aot_summary.table(aot_summary.load(str(tmp_path)))
