"""The benchmark suite behind `python -m bench --suite cpu|gpu [--quick|--smoke] [--out FILE]`.

Six measurements, each comparing its alternatives inside one process (or one process per
alternative where memory is the quantity), because on a shared machine only ratios taken in
the same run mean anything:

  train    jitted train step (loss + grads + AdamW, state donated) for RoVE, RoPE and NoPE,
           interleaved repeats, medians, paired ratios against RoPE, tokens/s;
  mfu      model FLOPs per step / step time / the peak matmul FLOP/s measured in this run;
  memory   peak memory of N train steps, one fresh subprocess per encoding;
  longctx  forward of a RoVE model at long contexts, "xla" vs "chunked" attention, one fresh
           subprocess per (length, kernel) under a memory cap;
  decode   KV-cache greedy decoding tokens/s (rove_jax.nn.model.generate), compile excluded;
  compile  lower + compile time of the train step as depth grows.

Shape letters: B batch, T sequence length.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import peak_rss_gib
from bench.specs import Model, make_spec
from rove_jax.nn import model as nn_model
from rove_jax.nn.model import GPT, GPTConfig, count_params, generate
from rove_jax.train import gpu_options
from rove_jax.train import loop as training
from rove_jax.train.run_config import OptimConfig

GIB = 2**30
ENCODINGS = ("rove", "rope", "nope")
FLOPS_FORMULA = (
  "6 * N_nonembed * tokens + 6 * n_layer * T * d_model * tokens "
  "(Kaplan et al. 2020; N_nonembed excludes the token/position embedding "
  "tables, so the tied LM-head matmul and rotary arithmetic are not credited)"
)


def check_device(suite: str) -> str:
  """The device kind to run on; a clear SystemExit when the suite's device is missing."""
  if suite == "gpu":
    try:
      gpus = jax.devices("gpu")
    except RuntimeError:
      gpus = []
    if not gpus:
      raise SystemExit(
        f"--suite gpu needs a CUDA GPU visible to JAX, but this machine has only "
        f"{[d.platform for d in jax.devices()]} (jax {jax.__version__}, backend "
        f"{jax.default_backend()!r}). Run --suite cpu here, or bench/gpu_check.sh "
        f"on a GPU machine."
      )
    return gpus[0].device_kind
  return jax.devices("cpu")[0].device_kind


# ---------------------------------------------------------------------------- helpers


def _time(fn: Callable[[], object]) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def _interleaved(fns: dict, repeats: int) -> dict:
  """Per-name lists of seconds; each repeat calls every fn once, back to back, so all see the
  same machine noise and the i-th times pair up."""
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      times[name].append(_time(fn))
  return times


def _paired(a: list, b: list) -> float:
  """Median of per-repeat ratios: cancels slow drifts that a ratio of medians keeps."""
  return statistics.median(x / y for x, y in zip(a, b))


def _table(header: list, rows: list) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def _optimizer():
  """The training loop's AdamW (warmup + cosine, clipping, decay mask) from the default config."""
  return training.make_optimizer(OptimConfig(), 1000)


def _train_state(cfg: GPTConfig, tx, abstract: bool = False):
  """(graphdef, TrainState); shapes only (nothing allocated) when abstract."""

  def init():
    _, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return training.TrainState(
      params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32)
    )

  graphdef = nn_model.graphdef(cfg)
  return graphdef, (jax.eval_shape(init) if abstract else jax.jit(init)())


def _batch(B: int, T: int, vocab: int, abstract: bool = False) -> dict:
  if abstract:
    s = jax.ShapeDtypeStruct((B, T), jnp.int32)
    return {"inputs": s, "targets": s}
  tok = jax.random.randint(jax.random.key(1), (B, T + 1), 0, min(vocab, 256), jnp.int32)
  return {"inputs": tok[:, :-1], "targets": tok[:, 1:]}


def flops_per_step(cfg: GPTConfig, B: int, T: int) -> float:
  """Model FLOPs of one train step by FLOPS_FORMULA."""
  abstract = nn_model.abstract_model(cfg)
  n_embed = cfg.vocab_size * cfg.d_model + (
    cfg.max_len * cfg.d_model if cfg.pos_encoding == "learned" else 0
  )
  n_nonembed = count_params(abstract) - n_embed
  tokens = B * T
  return 6.0 * n_nonembed * tokens + 6.0 * cfg.n_layer * T * cfg.d_model * tokens


def _peak_memory() -> dict:
  """This process's peak host RSS and, on a GPU, the device allocator's peak."""
  out = {"peak_rss_gib": peak_rss_gib()}
  dev = jax.devices()[0]
  if dev.platform == "gpu":
    stats = dev.memory_stats() or {}
    out["peak_device_gib"] = stats.get("peak_bytes_in_use", float("nan")) / GIB
  return out


# ------------------------------------------------------------------------ measurements


def peak_matmul(n: int, dtype: str, repeats: int) -> dict:
  """Peak matmul FLOP/s of this device: the best of `repeats` timed [n, n] @ [n, n] products
  (best, not median: it is a ceiling, and a conservative denominator for MFU)."""
  k1, k2 = jax.random.split(jax.random.key(2))
  a = jax.random.normal(k1, (n, n), dtype)
  b = jax.random.normal(k2, (n, n), dtype)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, b))
  best = min(_time(lambda: f(a, b)) for _ in range(max(repeats, 3)))
  return {"n": n, "dtype": dtype, "best_s": best, "flops_per_s": 2.0 * n**3 / best}


def train_compare(model: Model, repeats: int, peak_flops: float) -> dict:
  """Train-step time of RoVE, RoPE and NoPE on one shape, interleaved; paired ratios, MFU."""
  tx = _optimizer()
  steps, states = {}, {}
  for enc in ENCODINGS:
    cfg = model.config(pos_encoding=enc)
    graphdef, states[enc] = _train_state(cfg, tx)
    steps[enc] = training.make_train_step(  # with the trainer's XLA options on a GPU
      graphdef, tx, 1, compiler_options=gpu_options.compiler_options(jax.devices())
    )
  batch = _batch(model.batch, model.seq, cfg.vocab_size)

  def runner(enc):
    def run():  # the state is donated: keep the returned one for the next call
      states[enc], metrics = steps[enc](states[enc], batch)
      return metrics["loss"]

    return run

  fns = {enc: runner(enc) for enc in ENCODINGS}
  for fn in fns.values():  # compile, then one warm call
    fn(), jax.block_until_ready(fn())
  times = _interleaved(fns, repeats)
  losses = {enc: float(fns[enc]()) for enc in ENCODINGS}
  flops = flops_per_step(model.config(), model.batch, model.seq)
  tokens = model.batch * model.seq
  rows = {}
  for enc in ENCODINGS:
    med = statistics.median(times[enc])
    rows[enc] = {
      "median_s": med,
      "times_s": times[enc],
      "tokens_per_s": tokens / med,
      "paired_ratio_vs_rope": _paired(times[enc], times["rope"]),
      "mfu": flops / med / peak_flops,
      "loss": losses[enc],
    }
  return {
    "model": model.name,
    "config": dict(model.overrides, preset=model.preset),
    "batch": model.batch,
    "seq": model.seq,
    "repeats": repeats,
    "flops_per_step": flops,
    "rows": rows,
    "ratio_rove_over_rope": rows["rove"]["paired_ratio_vs_rope"],
  }


def _subprocess(kind: str, payload: dict, cap_gib: float, timeout: float) -> dict:
  """Run a worker (`python -m bench.suite --worker kind JSON`) in a fresh process, so its peak
  memory is its own; under RLIMIT_AS when cap_gib > 0 (not on GPUs, whose driver reserves far
  more address space than it uses). A failure is a row with an error, not a crash."""
  # The worker sets the cap on itself: a preexec_fn would fork this multithreaded JAX process.
  cmd = [
    sys.executable,
    "-m",
    "bench.suite",
    "--worker",
    kind,
    json.dumps({**payload, "cap_gib": cap_gib}),
  ]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:.0f} s"}
  lines = proc.stdout.strip().splitlines()
  if proc.returncode != 0 or not lines:
    tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return {"error": f"exit {proc.returncode}: {tail[:300]}"}
  return json.loads(lines[-1])


def _worker_train_memory(p: dict) -> dict:
  model = Model(**{**p["model"], "overrides": tuple(map(tuple, p["model"]["overrides"]))})
  cfg = model.config(pos_encoding=p["encoding"])
  tx = _optimizer()
  graphdef, state = _train_state(cfg, tx)
  step = training.make_train_step(graphdef, tx, 1)
  batch = _batch(model.batch, model.seq, cfg.vocab_size)
  for _ in range(p["steps"]):
    state, metrics = step(state, batch)
  return {"encoding": p["encoding"], "loss": float(metrics["loss"]), **_peak_memory()}


def memory_compare(model: Model, steps: int, timeout: float) -> dict:
  rows = {}
  for enc in ("rove", "rope"):
    rows[enc] = _subprocess(
      "train_memory",
      {"model": dataclasses.asdict(model), "encoding": enc, "steps": steps},
      0.0,
      timeout,
    )
  key = "peak_device_gib" if "peak_device_gib" in rows["rope"] else "peak_rss_gib"
  ratio = (
    rows["rove"][key] / rows["rope"][key] if all(key in r for r in rows.values()) else float("nan")
  )
  return {
    "model": model.name,
    "batch": model.batch,
    "seq": model.seq,
    "steps": steps,
    "measure": key,
    "rows": rows,
    "ratio_rove_over_rope": ratio,
  }


def _xla_attention_bytes(cfg: GPTConfig, T: int) -> float:
  """A lower bound on the xla kernel's working set at one layer: the float32 [H, T, T] scores,
  the probabilities and the mask each materialised once."""
  return 3.0 * cfg.n_head * T * T * 4


def _worker_long_forward(p: dict) -> dict:
  model = Model(**{**p["model"], "overrides": tuple(map(tuple, p["model"]["overrides"]))})
  T = p["T"]
  cfg = model.config(attention_impl=p["kernel"], max_len=max(T, 256))
  gpt = GPT(cfg, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(gpt)
  f = jax.jit(lambda s, tok: nnx.merge(graphdef, s)(tok)[:, -1])
  tok = jax.random.randint(jax.random.key(3), (1, T), 0, 256, jnp.int32)
  jax.block_until_ready(f(state, tok))  # compile (excluded)
  dt = _time(lambda: f(state, tok))
  out = np.asarray(f(state, tok), np.float32)
  return {
    "T": T,
    "kernel": p["kernel"],
    "seconds": dt,
    "tokens_per_s": T / dt,
    "finite": bool(np.isfinite(out).all()),
    **_peak_memory(),
  }


def long_context(
  model: Model, lengths: tuple, kernels: tuple, cap_gib: float, timeout: float
) -> dict:
  budget = cap_gib * GIB
  if cap_gib <= 0:  # GPU: the device's own memory is the cap
    budget = (jax.devices()[0].memory_stats() or {}).get("bytes_limit", float("inf"))
  rows = []
  for T in lengths:
    for kernel in kernels:
      need = _xla_attention_bytes(model.config(), T)
      if kernel == "xla" and need > 0.8 * budget:
        rows.append(
          {
            "T": T,
            "kernel": kernel,
            "skipped": f"xla needs >= {need / GIB:.1f} GiB "
            f"for one layer's [H, T, T] scores; cap {budget / GIB:.1f} GiB",
          }
        )
        continue
      r = _subprocess(
        "long_forward",
        {"model": dataclasses.asdict(model), "T": T, "kernel": kernel},
        cap_gib,
        timeout,
      )
      rows.append({"T": T, "kernel": kernel, **r})
  return {
    "model": model.name,
    "config": dict(model.overrides, preset=model.preset),
    "batch": 1,
    "cap_gib": cap_gib,
    "rows": rows,
  }


def decode_compare(model: Model, prompt_len: int, new: int, repeats: int) -> dict:
  """Greedy KV-cache decoding tokens/s, RoVE vs RoPE; the first call of each compiles."""
  prompt = jax.random.randint(jax.random.key(4), (model.batch, prompt_len), 0, 256, jnp.int32)
  models = {
    enc: GPT(model.config(pos_encoding=enc, max_len=max(prompt_len + new, 256)), rngs=nnx.Rngs(0))
    for enc in ("rove", "rope")
  }
  fns = {enc: (lambda m=m: generate(m, prompt, new, temperature=0.0)) for enc, m in models.items()}
  for fn in fns.values():
    jax.block_until_ready(fn())
  times = _interleaved(fns, repeats)
  rows = {
    enc: {
      "median_s": statistics.median(ts),
      "tokens_per_s": model.batch * new / statistics.median(ts),
      "paired_ratio_vs_rope": _paired(ts, times["rope"]),
    }
    for enc, ts in times.items()
  }
  return {
    "model": model.name,
    "batch": model.batch,
    "prompt": prompt_len,
    "new_tokens": new,
    "repeats": repeats,
    "rows": rows,
    "ratio_rove_over_rope": rows["rove"]["paired_ratio_vs_rope"],
    "note": "time per generate() call: prefill of the prompt + new-1 cached decode steps",
  }


def compile_times(model: Model, depths: tuple) -> dict:
  """Lower + compile of the train step (abstract inputs, nothing allocated) per depth."""
  tx = _optimizer()
  rows = []
  for depth in depths:
    cfg = model.config(n_layer=depth)
    graphdef, state = _train_state(cfg, tx, abstract=True)
    step = training.make_train_step(graphdef, tx, 1)
    t0 = time.perf_counter()
    lowered = step.lower(state, _batch(model.batch, model.seq, cfg.vocab_size, abstract=True))
    t1 = time.perf_counter()
    lowered.compile()
    t2 = time.perf_counter()
    rows.append({"n_layer": depth, "lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0})
  return {"model": model.name, "batch": model.batch, "seq": model.seq, "rows": rows}


# ------------------------------------------------------------------------------- driver


def run(suite: str, quick: bool, out: Optional[str] = None, log=print, smoke: bool = False) -> dict:
  """Run a suite; print markdown tables through `log`; return (and write) all results."""
  spec = make_spec(suite, quick, smoke)
  quick = spec.quick
  device = check_device(suite)
  t_start = time.perf_counter()
  timeout = 600.0 if quick else 1800.0
  res = {
    "suite": suite,
    "quick": quick,
    "smoke": spec.smoke,
    "device": device,
    "jax": jax.__version__,
    "spec": dataclasses.asdict(spec),
    "flops_formula": FLOPS_FORMULA,
  }
  size = " --smoke (figures meaningless)" if spec.smoke else " --quick" if quick else ""
  log(f"# rove-jax benchmarks: suite {suite}{size} on {device} (jax {jax.__version__})\n")

  def save():  # after every section: a run stopped by a time limit keeps what it measured
    if out:
      with open(out, "w") as f:
        json.dump(res, f, indent=2)

  res["peak_matmul"] = pk = peak_matmul(spec.matmul_n, spec.matmul_dtype, spec.repeats + 2)
  log(
    f"Measured peak matmul: {pk['flops_per_s'] / 1e9:.1f} GFLOP/s ({pk['n']}^3 {pk['dtype']}, "
    f"best of repeats)\n"
  )

  res["train"] = []
  samples = [pk["flops_per_s"]]
  for i, m in enumerate(spec.train_models):
    # The peak again right before each later model, the best so far as the denominator: a
    # machine that slowed down during one measurement (shared hosts) must not inflate MFU
    # past 1. (The first model follows the first measurement directly.)
    if i:
      again = peak_matmul(spec.matmul_n, spec.matmul_dtype, spec.repeats + 2)
      samples.append(again["flops_per_s"])
      if again["flops_per_s"] > pk["flops_per_s"]:
        res["peak_matmul"] = pk = again
    res["peak_matmul"]["samples_flops_per_s"] = samples
    t = train_compare(m, spec.repeats, pk["flops_per_s"])
    res["train"].append(t)
    log(f"## Train step: {m.name}, batch {m.batch} x {m.seq}, {t['repeats']} interleaved repeats")
    log(
      _table(
        ["encoding", "median step (ms)", "tokens/s", "paired ratio vs rope", "MFU"],
        [
          [
            e,
            f"{1e3 * r['median_s']:.1f}",
            f"{r['tokens_per_s']:.0f}",
            f"{r['paired_ratio_vs_rope']:.3f}",
            f"{r['mfu']:.3f}",
          ]
          for e, r in t["rows"].items()
        ],
      )
    )
    log(
      f"RoVE/RoPE = {t['ratio_rove_over_rope']:.3f}; {t['flops_per_step'] / 1e9:.2f} GFLOP/step\n"
    )
    save()  # after each model: a later model that runs out of time loses only itself
  log(f"MFU = model FLOPs per step / median step time / measured peak; FLOPs = {FLOPS_FORMULA}")
  log(
    f"Peak matmul measurements this run: "
    f"{', '.join(f'{x / 1e9:.0f}' for x in samples)} GFLOP/s; MFU uses the best"
    + (
      " (they differ by more than 20%: the machine's speed changed during the run, so "
      "compare ratios, not absolute figures)"
      if min(samples) < 0.8 * max(samples)
      else ""
    )
    + "\n"
  )

  save()
  res["memory"] = mem = memory_compare(spec.memory_model, spec.memory_steps, timeout)
  log(
    f"## Peak memory: {mem['steps']} train steps of {mem['model']} "
    f"(batch {mem['batch']} x {mem['seq']}), one subprocess per encoding"
  )
  log(
    _table(
      ["encoding", f"{mem['measure']}"],
      [
        [e, f"{r[mem['measure']]:.3f}" if mem["measure"] in r else r.get("error")]
        for e, r in mem["rows"].items()
      ],
    )
  )
  log(f"RoVE/RoPE = {mem['ratio_rove_over_rope']:.3f}\n")

  save()
  res["longctx"] = lc = long_context(
    spec.long_model, spec.long_lengths, spec.long_kernels, spec.long_cap_gib, timeout
  )
  log(
    f"## Long-context forward: {lc['model']} RoVE, batch 1, one subprocess per row"
    + (f", RLIMIT_AS {lc['cap_gib']:.0f} GiB" if lc["cap_gib"] > 0 else "")
  )
  lrows = []
  for r in lc["rows"]:
    if "tokens_per_s" in r:
      mem_s = f"{r.get('peak_device_gib', r['peak_rss_gib']):.2f}"
      lrows.append([r["T"], r["kernel"], f"{r['tokens_per_s']:.0f}", mem_s, r["finite"]])
    else:
      lrows.append([r["T"], r["kernel"], "-", "-", r.get("skipped") or r.get("error")])
  log(_table(["T", "kernel", "tokens/s", "peak memory (GiB)", "finite / note"], lrows) + "\n")

  save()
  res["decode"] = dc = decode_compare(
    spec.decode_model, spec.decode_prompt, spec.decode_new, spec.repeats
  )
  log(
    f"## Decoding: {dc['model']}, greedy, batch {dc['batch']}, prompt {dc['prompt']}, "
    f"{dc['new_tokens']} new tokens, compile excluded"
  )
  log(
    _table(
      ["encoding", "median (ms)", "tokens/s", "paired ratio vs rope"],
      [
        [
          e,
          f"{1e3 * r['median_s']:.1f}",
          f"{r['tokens_per_s']:.0f}",
          f"{r['paired_ratio_vs_rope']:.3f}",
        ]
        for e, r in dc["rows"].items()
      ],
    )
    + "\n"
  )

  save()
  res["compile"] = cc = compile_times(spec.compile_model, spec.compile_depths)
  log(f"## Train-step compile time: {cc['model']}, batch {cc['batch']} x {cc['seq']}")
  log(
    _table(
      ["n_layer", "lower (s)", "compile (s)", "total (s)"],
      [
        [r["n_layer"], f"{r['lower_s']:.2f}", f"{r['compile_s']:.2f}", f"{r['total_s']:.2f}"]
        for r in cc["rows"]
      ],
    )
    + "\n"
  )

  res["seconds"] = time.perf_counter() - t_start
  log(f"Suite time: {res['seconds']:.0f} s")
  save()
  if out:
    log(f"Wrote {out}")
  return res


def _worker_main(argv):
  kind, payload = argv[0], json.loads(argv[1])
  if payload.get("cap_gib", 0) > 0:  # before the worker allocates anything sizeable
    limit = int(payload["cap_gib"] * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  fn = {"train_memory": _worker_train_memory, "long_forward": _worker_long_forward}[kind]
  print(json.dumps(fn(payload)))


if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "--worker":
    _worker_main(sys.argv[2:])
  else:
    raise SystemExit("bench.suite is driven by `python -m bench --suite cpu|gpu`")
