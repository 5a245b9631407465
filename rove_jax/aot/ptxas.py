"""Registers and spills of GPU kernels compiled on this host: what `ptxas -v` reports for each
kernel, read from the PTX XLA dumps (Triton kernels) or from the reports Mosaic GPU writes
(Pallas Mosaic GPU kernels, rove_jax.kernels.fused_hopper). Neither needs a GPU: the deviceless
path (rove_jax.aot.gpu) runs ptxas on this host.

A kernel that spills registers to local memory moves them through the L1 cache and, past it,
HBM on every spill; FlashAttention-style kernels are written to spill nothing, so nonzero spill
bytes here are a speed defect to fix before any timing.

Mosaic GPU writes `<kernel>_<n>.ptxas` (with its PTX and MLIR pass log) into MOSAIC_GPU_DUMP_TO
for every kernel it compiles while MOSAIC_GPU_DUMP_PTXAS is set; both are read when the CUDA
plugin compiles, so `mosaic_dump_env` must be applied before the first Mosaic GPU compile
(in practice: before JAX starts).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Optional

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse(text: str, name: Optional[str] = None) -> dict:
  """{kernel (arch): {registers, stack_bytes, spill_store_bytes, spill_load_bytes}} of one
  `ptxas -v` report. name replaces the entry function's name (Mosaic GPU names every entry
  the same way; its file name tells the kernels apart)."""
  out, key = {}, None
  for line in text.splitlines():
    if m := _ENTRY.search(line):
      key = f"{name or m.group(1)} ({m.group(2)})"
      out[key] = dict(registers=None, stack_bytes=0, spill_store_bytes=0, spill_load_bytes=0)
    elif key and (m := _SPILL.search(line)):
      out[key].update(
        stack_bytes=int(m.group(1)),
        spill_store_bytes=int(m.group(2)),
        spill_load_bytes=int(m.group(3)),
      )
    elif key and (m := _USED.search(line)):
      out[key]["registers"] = int(m.group(1))
  return out


def mosaic_dump_env(folder: str) -> dict:
  """The environment variables that make Mosaic GPU write a ptxas report of each kernel it
  compiles into folder (made here: Mosaic GPU prints its dumps to stdout when the folder is
  missing)."""
  os.makedirs(folder, exist_ok=True)
  return {"MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_TO": folder}


def mosaic_files(folder: str, suffix: str) -> dict:
  """{kernel name: path} of the files Mosaic GPU wrote into folder with this suffix (".ptxas",
  ".ptx"), each kernel under its file name without Mosaic GPU's trailing counter; a kernel
  compiled twice gives its first file."""
  out = {}
  pattern = re.compile(r"_(\d+)" + re.escape(suffix) + "$")
  counter = lambda path: int(m.group(1)) if (m := pattern.search(path)) else -1
  for path in sorted(glob.glob(os.path.join(folder, "*" + suffix)), key=counter):
    out.setdefault(re.sub(r"_\d+$", "", os.path.basename(path)[: -len(suffix)]), path)
  return out


def read_mosaic(folder: str) -> dict:
  """`parse` of every Mosaic GPU report in folder, each kernel under its name (`mosaic_files`:
  a kernel compiled twice is reported once)."""
  out = {}
  for name, path in mosaic_files(folder, ".ptxas").items():
    with open(path) as f:
      for key, stats in parse(f.read(), name).items():
        out.setdefault(key, stats)
  return out


def run_on_ptx(path: str) -> dict:
  """`parse` of ptxas -v run on one PTX file for the architecture its .target line names
  (ptxas from nvidia-cuda-nvcc-cu12, which the deviceless path needs anyway)."""
  import nvidia.cuda_nvcc

  ptxas = os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin", "ptxas")
  with open(path) as f:
    arch = next(line.split()[1] for line in f if line.startswith(".target"))
  run = subprocess.run(
    [ptxas, "-v", f"-arch={arch}", path, "-o", os.devnull],
    capture_output=True,
    text=True,
    check=True,
  )
  return parse(run.stderr)


def table(report: dict) -> str:
  """A markdown table of a report, one row a kernel."""
  lines = [
    "| kernel | registers | spill stores (bytes) | spill loads (bytes) | stack (bytes) |",
    "|---|---|---|---|---|",
  ]
  for key, s in report.items():
    lines.append(
      f"| {key} | {s['registers']} | {s['spill_store_bytes']} | {s['spill_load_bytes']} | "
      f"{s['stack_bytes']} |"
    )
  return "\n".join(lines)
