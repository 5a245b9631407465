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
  a kernel compiled twice is reported once), with what the kernel's launch asks where its PTX
  and MLIR pass log were dumped beside the report: threads a program (the PTX's .maxntid),
  dynamic shared memory (the launch's size in the log) and the programs an sm_90 SM then holds
  (`programs_per_sm`)."""
  out = {}
  ptx, logs = mosaic_files(folder, ".ptx"), mosaic_files(folder, ".mlir-passes.log")
  for name, path in mosaic_files(folder, ".ptxas").items():
    with open(path) as f:
      for key, stats in parse(f.read(), name).items():
        if key in out:
          continue
        if name in ptx and name in logs:
          threads, smem = _launch(ptx[name], logs[name])
          stats.update(threads=threads, smem_bytes=smem)
          stats["programs_per_sm"] = programs_per_sm(stats["registers"], smem, threads)
        out[key] = stats
  return out


_MAXNTID = re.compile(r"\.maxntid (\d+), (\d+), (\d+)")
_LAUNCH = re.compile(r"gpu\.launch_func .*dynamic_shared_memory_size (%\w+)")


def _launch(ptx_path: str, log_path: str):
  """(threads a program, dynamic shared memory bytes) of a Mosaic GPU kernel: the PTX's
  .maxntid, and the constant the last launch in its MLIR pass log (the final IR) passes as
  dynamic_shared_memory_size. None for what is not found."""
  with open(ptx_path) as f:
    m = _MAXNTID.search(f.read())
  threads = int(m.group(1)) * int(m.group(2)) * int(m.group(3)) if m else None
  with open(log_path) as f:
    log = f.read()
  launches = list(_LAUNCH.finditer(log))
  if not launches:
    return threads, None
  var = re.escape(launches[-1].group(1))
  values = re.findall(
    var + r" = (?:llvm\.mlir|arith)\.constant\(?(\d+) : i32", log[: launches[-1].start()]
  )
  return threads, int(values[-1]) if values else None


# An sm_90 SM (H100, H200): registers, shared memory for its programs, and what each program
# reserves besides its own (the CUDA occupancy rules: registers go to warps in 256s).
SM90 = dict(registers=65536, smem_bytes=233472, smem_reserved=1024, warps=64, programs=32)


def programs_per_sm(registers, smem_bytes, threads, sm=SM90):
  """How many programs (CUDA blocks) of a kernel an SM holds at once by its registers a thread,
  dynamic shared memory and threads a program; None when any is unknown."""
  if registers is None or smem_bytes is None or not threads:
    return None
  warps = -(-threads // 32)
  per_warp = -(-registers * 32 // 256) * 256
  return min(
    sm["programs"],
    sm["warps"] // warps,
    sm["registers"] // (per_warp * warps),
    sm["smem_bytes"] // (smem_bytes + sm["smem_reserved"]),
  )


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
  """A markdown table of a report, one row a kernel; the launch's columns are empty where the
  report has none (Triton kernels)."""
  lines = [
    "| kernel | registers | spill stores (bytes) | spill loads (bytes) | stack (bytes) | "
    "threads | shared memory (bytes) | programs an SM |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for key, s in report.items():
    launch = " | ".join(
      "" if s.get(k) is None else str(s[k]) for k in ("threads", "smem_bytes", "programs_per_sm")
    )
    lines.append(
      f"| {key} | {s['registers']} | {s['spill_store_bytes']} | {s['spill_load_bytes']} | "
      f"{s['stack_bytes']} | {launch} |"
    )
  return "\n".join(lines)
