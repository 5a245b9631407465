"""The instruction mix of GPU kernels compiled on this host: their PTX assembled by ptxas into
machine code (SASS) and listed by cuobjdump, each instruction counted by its opcode's class.
No GPU is needed; rove_jax.aot.ptxas finds the PTX (the dumps XLA and Mosaic GPU write).

A static count: each instruction of the kernel's code once, however often it runs. The fused
kernels unroll their tile work (rotations, softmax) per thread, so the count of a class is close
to what one thread issues of it per pass through the code, and the loop body over key or query
blocks is most of it. What it tells before a timing: how many issue slots the float32, integer
and conversion work take beside the tensor-core (HGMMA) instructions, and whether the
quarter-rate units (MUFU: exp, sin, cos, reciprocals; conversions between ints and floats) are
busier than they need to be.

Needs a ptxas that reads the PTX's version (Mosaic GPU's PTX under jax 0.10 is version 9.0:
CUDA 13's ptxas) and cuobjdump with nvdisasm, from a CUDA toolkit on PATH or from the wheels
(`pip install nvidia-cuda-nvcc nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm`: CUDA 13's, which
rove_jax[gpu-aot] installs).
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import tempfile
from typing import Optional

# Opcode (the first word, without its .modifiers) -> class. Others count in "other".
CLASSES = {
  "float32": ("FFMA", "FMUL", "FADD", "FMNMX", "FSETP", "FSEL", "FSET", "FCHK"),
  "integer": (
    "LOP3",
    "SHF",
    "IADD3",
    "ISETP",
    "IMAD",
    "SEL",
    "LEA",
    "PRMT",
    "IABS",
    "IMNMX",
    "SGXT",
    "BMSK",
    "FLO",
    "POPC",
    "IMUL",
  ),  # fmt: skip
  # Between ints and floats (F2I, I2F: the quarter-rate unit; I2FP, F2IP: the ALU's) and between
  # float widths (F2FP packs two float32 into bfloat16).
  "conversion": ("F2I", "I2F", "F2F", "FRND", "F2FP", "I2FP", "F2IP"),
  # Two bfloat16 (or float16) values an instruction: packed math on the ALU.
  "packed16": ("HFMA2", "HMUL2", "HADD2", "HMNMX2", "HSETP2", "HSET2"),
  "mufu": ("MUFU",),
  "tensor": ("HGMMA", "HMMA", "WARPGROUP"),
  "shared": ("LDS", "STS", "LDSM", "STSM", "ATOMS"),
  "local": ("LDL", "STL"),
}
_CLASS_OF = {op: name for name, ops in CLASSES.items() for op in ops}
# An instruction line of cuobjdump -sass: /*0040*/  [@P0 | @!UP1 ]OPCODE[.MODS] operands ;
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
_ADDRESS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?[A-Z]")
# A branch, conditional (group 2: its predicate) or not. A loop's back edge is a branch to an
# earlier address: conditional, or unconditional with the exit test at the loop's top, but not
# one of the unconditional jumps back from the out-of-line barrier-wait stubs ptxas puts after
# EXIT.
_BRANCH = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?BRA(?:\.\S+)?\s+0x([0-9a-f]+)")
_EXIT = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?EXIT\b")
_TOOLS_HINT = (
  "counting SASS needs cuobjdump and nvdisasm on PATH or from the wheels: "
  "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
)


def opcodes(listing: str) -> collections.Counter:
  """Opcode -> count of a `cuobjdump -sass` listing (predicates and modifiers dropped)."""
  return collections.Counter(m.group(1) for m in _INSTRUCTION.finditer(listing))


def loops(listing: str) -> list:
  """The instruction lines of each loop of a listing, from the target of a backward branch (see
  _BRANCH) to the branch, the longest range first."""
  lines = [
    (int(m.group(1), 16), line) for line in listing.splitlines() if (m := _ADDRESS.search(line))
  ]
  exits = [int(m.group(1), 16) for m in _EXIT.finditer(listing)]
  first_exit = min(exits) if exits else None
  ranges = []
  for m in _BRANCH.finditer(listing):
    at, target = int(m.group(1), 16), int(m.group(3), 16)
    stub = m.group(2) is None and first_exit is not None and at > first_exit
    if target < at and not stub:
      ranges.append((target, at))
  ranges.sort(key=lambda r: r[0] - r[1])
  return ["\n".join(line for a, line in lines if lo <= a <= hi) for lo, hi in ranges]


def main_loop(listing: str) -> str:
  """The largest of `loops` ("" when there is none). In the fused kernels it is the loop over
  key (or query) blocks, so its `mix` is what one thread issues a block; where a kernel runs the
  blocks off the diagonal in a loop of their own without the mask code, the one with the mask
  (the larger) when the compiler keeps both, and `of_ptx` reports the other too."""
  return next(iter(loops(listing)), "")


def mix(ops: collections.Counter) -> dict:
  """{"instructions": total, class: count for each of CLASSES, "other": the rest}."""
  out = {"instructions": sum(ops.values()), **{name: 0 for name in CLASSES}, "other": 0}
  for op, n in ops.items():
    out[_CLASS_OF.get(op, "other")] += n
  return out


def _candidates(name: str) -> list:
  """Every executable CUDA tool of this name: PATH's first (a CUDA toolkit), then the nvidia
  wheels' (nvidia/*/bin: CUDA 13's under nvidia/cu13, nvidia-cuda-nvcc-cu12's under
  nvidia/cuda_nvcc)."""
  out = [shutil.which(name)]
  try:
    import nvidia

    for root in nvidia.__path__:
      out += sorted(glob.glob(os.path.join(root, "*", "bin", name)), reverse=True)
  except ImportError:
    pass
  return [p for p in dict.fromkeys(out) if p and os.access(p, os.X_OK)]


def _tool(name: str) -> Optional[str]:
  """The first of `_candidates`, or None."""
  return next(iter(_candidates(name)), None)


def assemble(ptx_path: str, cubin_path: str) -> None:
  """ptxas of ptx_path into cubin_path for the architecture its .target line names, with the
  first ptxas that reads the file's PTX version."""
  with open(ptx_path) as f:
    arch = next(line.split()[1] for line in f if line.startswith(".target"))
  errors = []
  for ptxas in _candidates("ptxas"):
    run = subprocess.run(
      [ptxas, f"-arch={arch}", ptx_path, "-o", cubin_path], capture_output=True, text=True
    )
    if run.returncode == 0:
      return
    first = run.stderr.strip().splitlines()[0] if run.stderr.strip() else f"exit {run.returncode}"
    errors.append(f"{ptxas}: {first}")
  raise RuntimeError(
    f"no ptxas could assemble {ptx_path} (" + "; ".join(errors or ["none found"]) + "): install "
    "a CUDA toolkit whose ptxas reads this PTX version, or nvidia-cuda-nvcc at it"
  )


def missing_tools() -> Optional[str]:
  """None when ptxas, cuobjdump and nvdisasm are at hand; else what to install."""
  if _tool("ptxas") is None:
    return "counting SASS needs ptxas: a CUDA toolkit on PATH, or pip install nvidia-cuda-nvcc"
  if _tool("cuobjdump") is None or _tool("nvdisasm") is None:
    return _TOOLS_HINT
  return None


SECOND_LOOP_MIN = 100  # instructions: below it a second loop is a barrier-wait stub's


def of_ptx(ptx_path: str) -> dict:
  """`mix` of the machine code of one PTX file, with the mix of its `main_loop` under "loop"
  and of each next largest loop with at least SECOND_LOOP_MIN instructions (the unmasked loop
  beside a masked one, a producer warpgroup's) under "loop 2", "loop 3", ... (`with_loops`)."""
  problem = missing_tools()
  if problem:
    raise RuntimeError(problem)
  cuobjdump, nvdisasm = _tool("cuobjdump"), _tool("nvdisasm")
  with tempfile.TemporaryDirectory() as tmp:
    cubin = os.path.join(tmp, "kernel.cubin")
    assemble(ptx_path, cubin)
    env = dict(os.environ, PATH=os.path.dirname(nvdisasm) + os.pathsep + os.environ["PATH"])
    run = subprocess.run(
      [cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True, env=env
    )
  return with_loops(run.stdout)


def with_loops(listing: str) -> dict:
  """of_ptx's dict of a listing: "loop" the longest loop's mix, and "loop 2", "loop 3", ...
  each further loop's from SECOND_LOOP_MIN instructions, longest first (a kernel with a
  producer warpgroup has its loop beside the compute warpgroups' masked and unmasked ones)."""
  found = [mix(opcodes(body)) for body in loops(listing)]
  out = dict(mix(opcodes(listing)), loop=found[0] if found else mix(opcodes("")))
  more = [m for m in found[1:] if m["instructions"] >= SECOND_LOOP_MIN]
  out.update({f"loop {i}": m for i, m in enumerate(more, start=2)})
  return out


def table(report: dict) -> str:
  """A markdown table of {kernel: of_ptx's dict}: a row for the whole kernel and, where it has
  them, rows for its main loop (one pass: a key or query block) and its further loops."""
  cols = ["instructions", *CLASSES, "other"]
  lines = ["| kernel | part | " + " | ".join(cols) + " |", "|---" * (len(cols) + 2) + "|"]
  for name, m in report.items():
    loops_ = [k for k in m if k == "loop" or k.startswith("loop ")]
    parts = [("all", m)] + [(part, m[part]) for part in loops_ if m[part].get("instructions")]
    for part, counts in parts:
      lines.append(f"| {name} | {part} | " + " | ".join(str(counts[c]) for c in cols) + " |")
  return "\n".join(lines)
