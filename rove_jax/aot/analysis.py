"""What a compiled XLA program costs, per device: the figures behind rove_jax.aot.compile's reports.

  from rove_jax.aot import analysis as hlo
  figures = hlo.analyze(jax.jit(f).lower(*args).compile(), chip, n_devices=8, tokens=B * T,
                        model_flops=..., attention_flops=..., accumulation=M)
  hlo.parse_collectives(compiled.as_text())  # {"all-reduce": {"count", "bytes"}, ...}

Memory comes from compiled.memory_analysis(): total = argument + output - alias + temp (the
generated code is reported apart). FLOPs and bytes accessed start from compiled.cost_analysis(),
which counts a while-loop body once whatever its trip count (checked on CPU and TPU: a lax.scan
of ten matmuls reports one). Two corrections follow, each stated in the report's notes:
  - the gradient-accumulation scan (a top-level loop of `accumulation` trips): both figures
    times its trip count (the optimizer update outside the loop, well under 1% of a step, is
    overcounted with them);
  - attention whose FLOPs cost_analysis misses, in hand-written kernels (custom calls:
    Pallas/Mosaic `tpu_custom_call`, Triton, cuDNN) that carry no cost estimate (the fused
    kernel carries one, which cost_analysis counts) or in the chunked kernel's loops (any other
    while loop): the analytic attention FLOPs are added (bytes accessed stay uncorrected).
Collectives are read from the compiled HLO, executions counted (a loop body's ops times its trip
count): per kind, how many run and the bytes of their results.

The roofline is a bound from these figures, not a measurement:
  step time >= max(flops / peak bf16 FLOP/s, bytes accessed / HBM bandwidth)
  MFU <= model FLOPs per device / (that time * peak)
Model FLOPs per token are PaLM's count (rove_jax.nn.flops).
"""

from __future__ import annotations

import collections
import math
import re
from typing import Optional

import numpy as np

from rove_jax.aot import gpu as aot_gpu
from rove_jax.aot import gpu_census

GiB = 2**30

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# Custom-call targets of hand-written kernels, whose FLOPs cost_analysis cannot see.
KERNEL_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "__cudnn$fmha")
_OP = re.compile(
  r"=\s*(?P<shape>.*?)\s(?P<kind>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_ARRAY = re.compile(r"\b(pred|[a-z]+(\d+)[a-z0-9]*)\[([\d,]*)\]")
_CALLEE = re.compile(
  r"\b(body|calls|to_apply|condition|true_computation|false_computation)="
  r"%?([\w.\-]+)"
)
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


def array_bytes(shape_text: str) -> list[int]:
  """Bytes of each array in an HLO shape ("bf16[8,128]{1,0}", or a tuple of them)."""
  return [b for b, _ in _arrays(shape_text)]


def _arrays(shape_text: str) -> list[tuple[int, int]]:
  out = []  # (bytes, rank)
  for dtype, bits, dims in _ARRAY.findall(shape_text):
    sizes = [int(d) for d in dims.split(",") if d]
    out.append(
      (math.ceil(int(np.prod(sizes)) * (8 if dtype == "pred" else int(bits)) / 8), len(sizes))
    )
  return out


def _module(hlo: str):
  """(collectives, calls, loops, entry) per computation of an HLO module's text: collectives
  [(kind, bytes)], calls [(callee, times a call runs it)], loops [trip count or None]. A loop's
  trip count is XLA's known_trip_count or, where the backend prints none (TPU), N of a
  condition `counter < N` on one s32 constant (lax.scan and fori_loop count from 0)."""
  ops, calls, loops = (collections.defaultdict(list) for _ in range(3))
  consts, less, whiles = collections.defaultdict(list), set(), []
  comp = entry = None
  for line in hlo.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      comp = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      entry = comp if line.startswith("ENTRY") else entry
      continue
    if comp is None:
      continue
    m = _OP.search(line)
    if m:
      arrays = _arrays(m["shape"])
      if m["start"] and m["kind"] != "all-reduce":  # (operands, outputs[, u32[] contexts])
        arrays = [a for a in arrays if a[1]]
        arrays = arrays[len(arrays) // 2 :]
      ops[comp].append((m["kind"], sum(b for b, _ in arrays)))
    consts[comp] += [int(n) for n in re.findall(r"= s32\[\]\S* constant\((\d+)\)", line)]
    if " compare(" in line and "direction=LT" in line:
      less.add(comp)
    branches = re.search(r"branch_computations=\{([^}]*)\}", line)
    callees = _CALLEE.findall(line) + [
      ("branch", b.strip().lstrip("%")) for b in (branches[1].split(",") if branches else [])
    ]
    if " while(" in line:
      known = _TRIP.search(line)
      whiles.append((comp, dict((h, c) for h, c in callees), int(known[1]) if known else None))
    calls[comp] += [(callee, 1) for how, callee in callees if how != "body"]
  for comp, callee, trip in whiles:
    cond = callee.get("condition")
    if trip is None and cond in less and len(consts[cond]) == 1:
      trip = consts[cond][0]
    loops[comp].append(trip)
    calls[comp].append((callee.get("body"), trip or 1))
  return ops, calls, loops, entry


def _walk(calls, entry, visit):
  def go(comp, times, depth):
    visit(comp, times, depth)
    for callee, factor in calls.get(comp, ()) if depth < 64 else ():
      go(callee, times * factor, depth + 1)

  if entry is not None:
    go(entry, 1, 0)


def parse_collectives(hlo: str) -> dict:
  """{kind: {"count", "bytes"}} of the collectives a compiled HLO module runs.

  Executions are counted: an op in a while body with a known trip count counts that many
  times. Bytes are the op's result arrays'; the -start forms of all-gather and
  collective-permute return (operands, outputs[, u32[] contexts]), of which the outputs count.
  """
  ops, calls, _, entry = _module(hlo)
  out = {k: {"count": 0, "bytes": 0} for k in COLLECTIVES}

  def visit(comp, times, depth):
    for kind, size in ops.get(comp, ()):
      out[kind]["count"] += times
      out[kind]["bytes"] += times * size

  _walk(calls, entry, visit)
  return out


def while_loops(hlo: str) -> list[tuple[Optional[int], int]]:
  """(trip count or None, nesting depth in computations) of each while loop in the module."""
  _, calls, loops, entry = _module(hlo)
  out = []
  _walk(calls, entry, lambda comp, times, depth: out.extend((t, depth) for t in loops[comp]))
  return out


def custom_calls(hlo: str) -> dict:
  """{custom_call_target: count} in an HLO module's text."""
  return dict(collections.Counter(re.findall(r'custom_call_target="([^"]+)"', hlo)))


def uncosted_kernels(hlo: str) -> dict:
  """{target: count} of the attention kernels (KERNEL_TARGETS custom calls) whose FLOPs XLA's
  cost_analysis cannot see: those without a Pallas cost estimate (a `"cost_estimate":
  {"flops": "N"}` with N > 0 in their backend config, which cost_analysis adds up)."""
  out = collections.Counter()
  for line in hlo.splitlines():
    target = re.search(r'custom_call_target="([^"]+)"', line)
    if target is None or not target[1].startswith(KERNEL_TARGETS):
      continue
    estimate = re.search(r'cost_estimate\\?"\s*:\s*\{\\?"flops\\?"\s*:\s*\\?"?(\d+)', line)
    if estimate is None or int(estimate[1]) == 0:
      out[target[1]] += 1
  return dict(out)


def roofline(
  flops: float, bytes_accessed: float, chip, model_flops: Optional[float] = None
) -> dict:
  """A lower bound on the step time and an upper bound on MFU from per-device figures."""
  compute_s, memory_s = flops / chip.peak_flops, bytes_accessed / chip.hbm_bandwidth
  step_s = max(compute_s, memory_s)
  out = {
    "compute_s": compute_s,
    "memory_s": memory_s,
    "step_time_bound_s": step_s,
    "bound_by": "compute" if compute_s >= memory_s else "memory",
  }
  if model_flops is not None and step_s > 0:
    out["mfu_bound"] = model_flops / (step_s * chip.peak_flops)
  return out


def analyze(
  compiled,
  chip,
  *,
  n_devices: int,
  tokens: int,
  model_flops: float,
  attention_flops: float,
  accumulation: int = 1,
) -> dict:
  """Per-device figures of a compiled program: memory, FLOPs, bytes, collectives, roofline.

  Args:
    compiled: a jax.stages.Compiled.
    chip: an aot.Chip (HBM, peak, bandwidth), or None (cpu: no roofline, no fit).
    n_devices, tokens: devices the program runs on; tokens one run processes (all devices).
    model_flops, attention_flops: model FLOPs of one token, and their attention part.
    accumulation: trip count of the gradient-accumulation scan (1: none).
  """
  m = compiled.memory_analysis()
  memory = {
    k: int(getattr(m, f"{k}_size_in_bytes"))
    for k in ("argument", "output", "alias", "temp", "generated_code")
  }
  memory["total"] = memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}
  notes = []
  hlo_model = not cost
  if hlo_model:  # the CUDA plugin implements no cost_analysis
    cost = aot_gpu.gpu_costs(compiled)
    notes.append(
      "flops and bytes accessed from XLA's HLO cost model on the CPU client (the "
      "compiler has no cost_analysis)"
      if cost
      else "no FLOPs or bytes: the compiler "
      "has no cost_analysis and its HLO cost model was unavailable"
    )
  xla_flops, xla_bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
  hlo = compiled.as_text()
  calls, loops = custom_calls(hlo), while_loops(hlo)
  scale = accumulation if accumulation > 1 and (accumulation, 0) in loops else 1
  if scale > 1:
    loops.remove((accumulation, 0))
    notes.append(
      f"cost_analysis counts a loop body once: flops and bytes accessed are its "
      f"figures times the {scale} gradient-accumulation steps"
    )
  flops, accessed = xla_flops * scale, xla_bytes * scale
  kernels = uncosted_kernels(hlo)  # kernels with a cost estimate are in cost_analysis already
  if kernels or loops:
    flops += attention_flops * tokens / n_devices
    why = (
      f"custom-call kernels {kernels}"
      if kernels
      else f"{len(loops)} while loops (e.g. the chunked attention kernel's)"
    )
    notes.append(
      f"{why}: cost_analysis misses their FLOPs; flops add the analytic attention "
      f"FLOPs, bytes accessed are uncorrected"
    )
  if hlo_model:
    n_gemms, gemm_flops = gpu_census.read(hlo).library_gemms()
    if n_gemms:
      flops += gemm_flops
      notes.append(
        f"{n_gemms} cuBLAS GEMMs: the HLO cost model sees no FLOPs in a library call; flops "
        f"add theirs ({gemm_flops:.3e}) as read from the HLO (rove_jax.aot.gpu_census)"
      )
  windowed = len(re.findall(r"\bwhile\([^\n]*body=%?[\w.]*windowed_dot_general", hlo))
  if windowed:
    notes.append(
      f"{windowed} of XLA's collective matmuls (windowed_dot_general loops, which overlap an "
      f"all-gather or reduce-scatter with the matmul): cost_analysis counts each loop's body "
      f"once, so flops and bytes accessed undercount them"
    )
  out = dict(
    memory=memory,
    xla_flops=xla_flops,
    xla_bytes_accessed=xla_bytes,
    flops=flops,
    bytes_accessed=accessed,
    model_flops_per_token=model_flops,
    compiled_flops_per_token=flops * n_devices / tokens,
    model_to_compiled=model_flops * tokens / (flops * n_devices) if flops else None,
    collectives=parse_collectives(hlo),
    custom_calls=calls,
    while_loops=len(loops),
    analysis_notes=notes,
    roofline=None,
    fits=None,
  )
  ratio = out["model_to_compiled"]
  if ratio and not 0.5 <= ratio <= 1.05:  # 0: no model FLOPs given
    notes.append(
      f"compiled FLOPs are {1 / ratio:.2f}x the model FLOPs: "
      + (
        "work repeated across devices (a batch not split as the mesh says), recomputed, or "
        "elementwise work the model count leaves out"
        if ratio < 0.5
        else "cost_analysis misses work that this analysis did not correct"
      )
    )
  if chip is not None:
    out.update(
      hbm_bytes=chip.hbm_bytes,
      fits=memory["total"] <= chip.hbm_bytes,
      headroom_bytes=chip.hbm_bytes - memory["total"],
      roofline=roofline(flops, accessed, chip, model_flops * tokens / n_devices),
    )
  return out


def format_report(r: dict) -> str:
  """A readable summary of an aot.compile_job report."""
  gib = lambda b: f"{b / GiB:.2f} GiB" if abs(b) >= GiB / 10 else f"{b / 2**20:.2f} MiB"
  mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
  lines = [
    f"{r['job']} on {r['topology']} ({r['accelerator']}), mesh {mesh}, grad_accum "
    f"{r['grad_accum']}: batch {r['batch']} x {r['length']}, {r['dtype']}, remat "
    f"{r['remat']}, attention {r.get('attention_impl')}",
    f"  compile         {r['compile_s']:.1f} s (lowering {r['lower_s']:.1f} s)",
  ]
  if r.get("error"):
    return "\n".join(lines + [f"  DOES NOT FIT    {r['error']}"])
  mem = r["memory"]
  lines.append(
    f"  memory/device   {gib(mem['total'])} = argument {gib(mem['argument'])} + "
    f"output {gib(mem['output'])} - alias {gib(mem['alias'])} + temp "
    f"{gib(mem['temp'])} (generated code {gib(mem['generated_code'])})"
  )
  if r.get("hbm_bytes"):
    lines.append(
      f"  HBM             {gib(r['hbm_bytes'])}: "
      f"{'fits' if r['fits'] else 'DOES NOT FIT'}, headroom "
      f"{gib(r['headroom_bytes'])}"
    )
  lines.append(
    f"  FLOPs/device    {r['flops']:.4g} (XLA cost_analysis {r['xla_flops']:.4g}); per "
    f"token {r['compiled_flops_per_token'] / 1e6:.1f} M compiled, "
    f"{r['model_flops_per_token'] / 1e6:.1f} M model (model/compiled "
    f"{r['model_to_compiled'] or 0:.3f})"
  )
  lines.append(f"  bytes accessed  {r['bytes_accessed']:.4g}")
  coll = [
    f"{k} {v['count']} ({gib(v['bytes'])})" for k, v in r["collectives"].items() if v["count"]
  ]
  lines.append(f"  collectives     {', '.join(coll) or 'none'}")
  if r.get("roofline"):
    f = r["roofline"]
    lines.append(
      f"  roofline bound  step >= {f['step_time_bound_s'] * 1e3:.2f} ms ({f['bound_by']}"
      f"-bound: compute {f['compute_s'] * 1e3:.2f} ms, HBM {f['memory_s'] * 1e3:.2f} "
      f"ms), MFU <= {f.get('mfu_bound', 0):.3f} (a bound, not a measurement)"
    )
  lines += [f"  note: {n}" for n in r["notes"]]
  return "\n".join(lines)
