"""A census of the kernels a compiled GPU program launches, read from its optimized HLO text.

  from rove_jax.aot import gpu_census
  census = gpu_census.read(compiled.as_text(), vocab_size=50304)
  census.kernels, census.bytes, census.gemms_by_precision(), census.vocab_f32_bytes

What counts as a kernel: every instruction of a computation that runs as control flow (the entry,
while bodies and conditions, conditional branches, called computations) that is not free. Free
are the instructions that move no data on the device: parameters, constants, tuples and their
elements, bitcasts, and the control instructions themselves (while, conditional, call), whose
bodies are walked instead. A fusion, a custom call (cuBLAS, cuDNN, Triton), a copy or an
unfused op is one kernel. Instructions inside a while body count once per trip when XLA knows
the trip count (`known_trip_count`), once otherwise.

Bytes moved by a kernel: the sizes of its operands plus the sizes of its outputs, as XLA's own
HLO cost model counts a fusion's memory traffic at the boundary (operands read once, outputs
written once; what a kernel rereads from cache is not counted; a library call's scratch
workspace is not counted; an operand a fusion uses only through static slices counts as those
slices, as when it reads one layer's weights out of a stack of all layers'). One buffer given
to a kernel more than once counts once, as the Hopper fused kernel reads q, k and v in place
from one qkv array through three references to it, each its own third; a GEMM's two operands
count twice, as both are read whole. This is a model of HBM traffic, not a measurement.

A GEMM is a cuBLAS custom call, a custom fusion wrapping one (XLA 0.11's dynamic-slice fusion,
reading one layer's weights out of the stack in place) or a fusion whose backend kind names a
GEMM (Triton GEMM fusions); its precision is the element types of the dot's two operands
inside it, its FLOPs 2 * (output elements) * (contracted elements).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Optional

# Instructions that launch nothing: their data stays where it is.
FREE = frozenset(
  (
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "while",
    "conditional",
    "call",
    "after-all",
    "add-dependency",
    "opt-barrier",
    "partition-id",
    "replica-id",
    "domain",
    "copy-done",
    "send-done",
    "recv-done",
    "all-reduce-done",
    "all-gather-done",
    "collective-permute-done",
    "async-done",
    "async-update",
  )
)
_DTYPE_BITS = {
  "pred": 8,
  "s4": 4,
  "u4": 4,
  "s8": 8,
  "u8": 8,
  "f8e4m3fn": 8,
  "f8e5m2": 8,
  "bf16": 16,
  "f16": 16,
  "s16": 16,
  "u16": 16,
  "f32": 32,
  "s32": 32,
  "u32": 32,
  "f64": 64,
  "s64": 64,
  "u64": 64,
  "c64": 64,
  "c128": 128,
}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([\d,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z\-]*)\((.*)$")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_GEMM_KIND = re.compile(r'"kind":"([^"]*gemm[^"]*)"')
_FUSION_KIND = re.compile(r'"kind":"([^"]+)"')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Array:
  dtype: str
  dims: tuple

  @property
  def bytes(self) -> int:
    return math.ceil(math.prod(self.dims) * _DTYPE_BITS.get(self.dtype, 32) / 8)


def arrays(shape_text: str) -> list[Array]:
  """The arrays of an HLO shape: "bf16[8,128]{1,0}" or a tuple "(f32[2], s32[])"."""
  return [
    Array(dtype, tuple(int(d) for d in dims.split(",") if d))
    for dtype, dims in _ARRAY.findall(shape_text)
    if dtype in _DTYPE_BITS
  ]


@dataclasses.dataclass(frozen=True)
class Gemm:
  lhs: str  # element type of the dot's left operand
  rhs: str
  flops: float

  @property
  def precision(self) -> str:
    return f"{self.lhs} x {self.rhs}"


@dataclasses.dataclass(frozen=True)
class Kernel:
  name: str
  op: str  # fusion, custom-call, copy, ...
  kind: str  # the fusion kind or custom-call target ("" otherwise)
  op_name: str  # the jax operation it came from (metadata), for reading
  operands: tuple  # Arrays read
  outputs: tuple  # Arrays written
  times: int  # executions a step (a while body's trip count)
  gemm: Optional[Gemm] = None

  @property
  def bytes(self) -> int:
    return self.times * sum(a.bytes for a in self.operands + self.outputs)


@dataclasses.dataclass
class Census:
  kernels_list: list
  vocab_size: Optional[int] = None

  @property
  def kernels(self) -> int:
    return sum(k.times for k in self.kernels_list)

  @property
  def bytes(self) -> int:
    return sum(k.bytes for k in self.kernels_list)

  @property
  def vocab_f32_bytes(self) -> int:
    """Bytes moved in float32 arrays one of whose dimensions is the vocabulary size."""
    if not self.vocab_size:
      return 0
    return sum(
      k.times * a.bytes
      for k in self.kernels_list
      for a in k.operands + k.outputs
      if a.dtype == "f32" and self.vocab_size in a.dims
    )

  def gemms_by_precision(self) -> dict:
    """{"bf16 x bf16": {"count", "tflop"}, ...} over the GEMM kernels."""
    out = collections.defaultdict(lambda: {"count": 0, "tflop": 0.0})
    for k in self.kernels_list:
      if k.gemm is not None:
        out[k.gemm.precision]["count"] += k.times
        out[k.gemm.precision]["tflop"] += k.times * k.gemm.flops / 1e12
    return dict(out)

  def library_gemms(self) -> tuple[int, float]:
    """(count, FLOPs) of the GEMMs a library runs (cuBLAS custom calls, bare or wrapped in
    XLA's custom fusions): XLA's HLO cost model sees no dot in them, so counts none of it."""
    calls = [
      k
      for k in self.kernels_list
      if k.gemm is not None and (k.op == "custom-call" or k.kind == "__custom_fusion")
    ]
    return sum(k.times for k in calls), sum(k.times * k.gemm.flops for k in calls)

  def groups(self) -> list:
    """The kernels grouped by where they come from, most kernels first: (phase, kind, op,
    kernels, bytes) with phase "forward" (under jvp), "backward" (under transpose) or "other"
    (the optimizer, the finiteness check, copies XLA inserted), kind the fusion's kind
    ("loop", "__triton", ...) or the custom call's target or the instruction ("copy"), op the
    last name of the jax operation it came from (metadata), "" when it has none."""
    count, moved = collections.Counter(), collections.Counter()
    for k in self.kernels_list:
      key = signature(k)[:3]
      count[key] += k.times
      moved[key] += k.bytes
    return [key + (n, moved[key]) for key, n in sorted(count.items(), key=lambda kv: -kv[1])]

  def top(self, n: int = 20) -> list:
    """The n kernels that move the most bytes."""
    return sorted(self.kernels_list, key=lambda k: -k.bytes)[:n]

  def diff(self, base: "Census") -> list:
    """The kernels this program launches beyond `base` (another encoding's step, say), matched
    by `signature`: (signature, kernels here minus in base, bytes here minus in base) for every
    signature whose count or bytes differ, most bytes first. A kernel both programs launch
    with the same operands and outputs cancels out, so what is left is what one program adds
    or drops, e.g. the rotations RoVE adds to the RoPE step."""
    count, moved = collections.Counter(), collections.Counter()
    for sign, census in ((1, self), (-1, base)):
      for k in census.kernels_list:
        count[signature(k)] += sign * k.times
        moved[signature(k)] += sign * k.bytes
    rows = [(key, count[key], moved[key]) for key in count if count[key] or moved[key]]
    return sorted(rows, key=lambda row: (-abs(row[2]), str(row[0])))


def signature(k: Kernel) -> tuple:
  """What identifies a kernel across two compilations, whose instruction names differ: (phase,
  kind, op, operand shapes, output shapes), the first three as in `Census.groups`, shapes as
  text such as "bf16[16,1024,12,64]", the operands sorted (XLA orders a fusion's parameters
  as it meets them, which differs between programs)."""
  phase = "backward" if "transpose(" in k.op_name else "forward" if "jvp(" in k.op_name else "other"
  kind = (k.kind or "loop") if k.op == "fusion" else (k.kind or k.op)
  shapes = lambda arrs: tuple(f"{a.dtype}[{','.join(map(str, a.dims))}]" for a in arrs)
  return (
    phase,
    kind,
    k.op_name.rsplit("/", 1)[-1],
    tuple(sorted(shapes(k.operands))),
    shapes(k.outputs),
  )


def _computations(hlo: str) -> tuple[dict, Optional[str]]:
  """{computation: [(name, shape text, op, rest of line)]} and the entry's name."""
  comps, entry, current = {}, None, None
  for line in hlo.splitlines():
    head = _HEADER.match(line)
    if head and not line.startswith(" "):
      current = head[2]
      comps[current] = []
      if head[1]:
        entry = current
      continue
    if current is None or line.strip() == "}":
      continue
    m = _INSTR.match(line)
    if m:
      comps[current].append((m[1], m[2], m[3], m[4]))
  return comps, entry


def _dot(comps: dict, comp: str, seen=None) -> Optional[Gemm]:
  """The first dot inside a computation (or the computations it calls), as a Gemm."""
  seen = seen or set()
  if comp in seen or comp not in comps:
    return None
  seen.add(comp)
  shapes = {name: shape for name, shape, _, _ in comps[comp]}
  for name, shape, op, rest in comps[comp]:
    if op == "dot":
      ops = _OPERAND.findall(rest.split(")", 1)[0])
      lhs, rhs = (arrays(shapes.get(o, ""))[:1] for o in ops[:2])
      if not lhs or not rhs:
        continue
      contract = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
      k = math.prod(lhs[0].dims[int(d)] for d in contract[1].split(",") if d) if contract else 1
      out = arrays(shape)
      return Gemm(lhs[0].dtype, rhs[0].dtype, 2.0 * math.prod(out[0].dims) * k if out else 0.0)
  for _, _, _, rest in comps[comp]:
    for callee in re.findall(r"calls=%?([\w.\-]+)", rest):
      found = _dot(comps, callee, seen)
      if found is not None:
        return found
  return None


def _operand_names(rest: str) -> list:
  """The operand names of an instruction, from its rest of line (the text after "op(")."""
  return _OPERAND.findall(rest.split("), ", 1)[0] if "), " in rest else rest.rsplit(")", 1)[0])


def _is_gemm_call(op: str, target) -> bool:
  """Whether an instruction is a GEMM library call (cuBLAS); target: its _TARGET match."""
  return op == "custom-call" and target is not None and bool(re.search(r"gemm|matmul", target[1]))


def _library_gemm(rest: str, operands: tuple, shape: str) -> Optional[Gemm]:
  """A GEMM library call (cuBLAS) as a Gemm: its instruction's rest of line, operand arrays
  and output shape text."""
  lhs, rhs = (operands + (None, None))[:2]
  outputs = arrays(shape)
  contract = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', rest)
  if lhs is None or rhs is None or not outputs or not contract:
    return None
  k = math.prod(lhs.dims[int(d.strip('" '))] for d in contract[1].split(",") if d.strip())
  return Gemm(lhs.dtype, rhs.dtype, 2.0 * math.prod(outputs[0].dims) * k)


def _wrapped_gemm(comps: dict, comp: str) -> tuple[Optional[Gemm], str]:
  """The GEMM library call inside an XLA custom fusion (a dynamic-slice fusion: the call reads
  one layer's weights out of the stack of all layers' in place, with no copy) and its
  instruction's rest of line (whose metadata names the jax operation); (None, "") if none."""
  shapes = {name: shape for name, shape, _, _ in comps.get(comp, ())}
  for _, shape, op, rest in comps.get(comp, ()):
    if _is_gemm_call(op, _TARGET.search(rest)):
      ops = tuple(a for o in _operand_names(rest) for a in arrays(shapes.get(o, "")))
      return _library_gemm(rest, ops, shape), rest
  return None, ""


def _sliced_reads(comps: dict, rest: str) -> dict:
  """{operand index: the arrays it reads} for the operands of a fusion (its instruction's rest
  of line) whose every use inside is a static slice: such a kernel reads those slices, not
  the whole buffer (a layer's weights out of a stack of all layers'), as XLA's own cost model
  counts them."""
  callee = re.search(r"calls=%?([\w.\-]+)", rest)
  body = comps.get(callee[1], ()) if callee else ()
  params = {name: int(re.match(r"(\d+)", r)[1]) for name, _, op, r in body if op == "parameter"}
  uses = collections.defaultdict(list)
  for _, shape, op, r in body:
    for o in _OPERAND.findall(r.split(")", 1)[0]):
      if o in params:
        uses[o].append((op, shape))
  return {
    params[p]: [a for _, shape in u for a in arrays(shape)]
    for p, u in uses.items()
    if all(op == "slice" for op, _ in u)
  }


def read(hlo: str, vocab_size: Optional[int] = None) -> Census:
  """The census of a compiled module's optimized HLO text (`compiled.as_text()`)."""
  comps, entry = _computations(hlo)
  out = []

  def walk(comp: str, times: int, depth: int) -> None:
    shapes = {name: shape for name, shape, _, _ in comps.get(comp, ())}
    for name, shape, op, rest in comps.get(comp, ()):
      if depth < 32 and op in ("while", "conditional", "call"):
        trip = _TRIP.search(rest)
        factor = int(trip[1]) if (op == "while" and trip) else 1
        for how, callee in re.findall(r"\b(body|condition|to_apply)=%?([\w.\-]+)", rest):
          walk(callee, times * factor, depth + 1)
        branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
        for callee in branches[1].split(",") if branches else []:
          walk(callee.strip().lstrip("%"), times, depth + 1)
        continue
      if op in FREE:
        continue
      names = _operand_names(rest)
      of = lambda o: arrays(shapes.get(o, ""))
      operands = tuple(a for o in names for a in of(o))
      target, fusion_kind = _TARGET.search(rest), _FUSION_KIND.search(rest)
      kind = target[1] if target else (fusion_kind[1] if fusion_kind else "")
      gemm, library, inner = None, op == "custom-call", ""
      if _is_gemm_call(op, target):
        gemm = _library_gemm(rest, operands, shape)
      elif op == "fusion":
        callee = re.search(r"calls=%?([\w.\-]+)", rest)
        if callee and _GEMM_KIND.search(rest):
          gemm = _dot(comps, callee[1])
        elif callee and kind == "__custom_fusion":  # a library call XLA wrapped, e.g. a
          gemm, inner = _wrapped_gemm(comps, callee[1])  # cuBLAS GEMM reading a slice in place
          library = True
      outputs = tuple(arrays(shape))
      read = _sliced_reads(comps, rest) if op == "fusion" else {}
      if gemm is None:  # a buffer given twice to a kernel, not a GEMM, is read once (above)
        first = {}
        for i, o in enumerate(names):
          first.setdefault(o, i)
        operands = tuple(a for o, i in first.items() for a in read.get(i, of(o)))
      elif read:
        operands = tuple(a for i, o in enumerate(names) for a in read.get(i, of(o)))
      if library:  # a library call's scratch workspace (u8/s8 [n]) is no traffic
        outputs = tuple(a for a in outputs if not (a.dtype in ("u8", "s8") and len(a.dims) == 1))
      op_name = _OP_NAME.search(rest) or (_OP_NAME.search(inner) if library and inner else None)
      out.append(
        Kernel(name, op, kind, op_name[1] if op_name else "", operands, outputs, times, gemm)
      )

  if entry is not None:
    walk(entry, 1, 0)
  return Census(out, vocab_size)
