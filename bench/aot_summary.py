"""The tables of docs/scaling.md and bench/RESULTS.md from saved `bench.aot --json` reports.

  python -m bench.aot_summary [DIR]        (default bench/aot_results, written by aot_table.sh)

Prints one row per compiled program (per-device memory against the chip's HBM, FLOPs, the
compiled-to-model FLOPs ratio, collectives, the roofline bound and, where the report has it,
the retired bench/memory_estimate.py's analytic figure; "packed": a train step on packed
documents), then RoVE / RoPE ratios of compiled FLOPs and memory for each preset and slice
compiled with both encodings (unpacked). Every figure comes from the JSON files; nothing is
recomputed but the ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

GiB = 2**30


def load(directory: str) -> list[dict]:
  rows = []
  for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
    with open(path) as f:
      saved = json.load(f)
    for r in saved["reports"]:
      rows.append(dict(r, config=saved["config"], file=os.path.basename(path)))
  return rows


def table(rows: list[dict]) -> str:
  """One row a report; the estimate column only when a report has the retired estimate."""
  estimates = any((r.get("memory_estimate") or {}).get("estimate_gib") for r in rows)
  out = [
    "| model | slice | mesh (d, f, t) | accum | job | batch x length | GiB/device (HBM, "
    "headroom) | TFLOP/device | compiled / model FLOPs | collectives: count (GiB) | "
    "step bound ms | MFU bound |" + (" estimate GiB |" if estimates else ""),
    "|" + "---|" * (13 if estimates else 12),
  ]
  for r in rows:
    mesh = r["mesh"]
    head = (
      f"| {r['config']} {r['pos_encoding']}{' packed' if r.get('packing') else ''} | "
      f"{r['accelerator']} | ({mesh['data']}, "
      f"{mesh['fsdp']}, {mesh['tensor']}) | {r['grad_accum'] if r['job'] == 'train' else '-'}"
      f" | {r['job']} | {r['batch']} x {r['length']} "
    )
    if r.get("error"):
      out.append(head + "| does not fit | | | | | |" + (" |" if estimates else ""))
      continue
    mem, roof = r["memory"]["total"], r.get("roofline") or {}
    hbm = (
      f" ({r['hbm_bytes'] / GiB:.0f}, {r['headroom_bytes'] / GiB:.2f})"
      if r.get("hbm_bytes")
      else ""
    )
    coll = (
      ", ".join(
        f"{k} {v['count']} ({v['bytes'] / GiB:.2f})"
        for k, v in r["collectives"].items()
        if v["count"]
      )
      or "none"
    )
    ratio = 1 / r["model_to_compiled"] if r.get("model_to_compiled") else float("nan")
    est = (r.get("memory_estimate") or {}).get("estimate_gib")
    out.append(
      head + f"| {mem / GiB:.2f}{hbm} | {r['flops'] / 1e12:.2f} | {ratio:.3f} | {coll} "
      f"| {roof.get('step_time_bound_s', float('nan')) * 1e3:.1f} "
      f"| {roof.get('mfu_bound', float('nan')):.3f} |"
      + (f" {'-' if est is None else f'{est:.2f}'} |" if estimates else "")
    )
  return "\n".join(out)


def ratios(rows: list[dict]) -> str:
  """RoVE / RoPE compiled FLOPs and memory per (preset, slice, job)."""
  by = {
    (r["config"], r["accelerator"], r["job"], r["pos_encoding"]): r
    for r in rows
    if not r.get("error") and not r.get("packing")
  }
  out = [
    "| model | slice | job | RoVE / RoPE FLOPs | RoVE / RoPE memory |",
    "|---|---|---|---|---|",
  ]
  for (config, acc, job, enc), rove in sorted(by.items()):
    rope = by.get((config, acc, job, "rope"))
    if enc != "rove" or rope is None:
      continue
    out.append(
      f"| {config} | {acc} | {job} | {rove['flops'] / rope['flops']:.4f} | "
      f"{rove['memory']['total'] / rope['memory']['total']:.4f} |"
    )
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
    prog="python -m bench.aot_summary",
    description=__doc__,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("dir", nargs="?", default="bench/aot_results", help="the saved reports")
  rows = load(p.parse_args(argv).dir)
  if not rows:
    print("error: no reports found (run bash bench/aot_table.sh first)", file=sys.stderr)
    return 2
  print(table(rows))
  print()
  print(ratios(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
