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

The in-process measurements and the driver (`run`) are here; memory and longctx, which need a
fresh process each, are in bench/isolated.py, and what the measurements share (timing, the
train state and batch, model FLOPs, peak memory) in bench/measure.py.

Shape letters: B batch, T sequence length.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Optional

import jax
import jax.numpy as jnp
from flax import nnx

from bench.isolated import long_context, memory_compare
from bench.measure import (
  FLOPS_FORMULA,
  flops_per_step,
  interleaved,
  optimizer,
  paired_ratio,
  random_batch,
  time_call,
  train_state,
)
from bench.specs import Model, make_spec
from rove_jax.nn.model import GPT, generate
from rove_jax.train import gpu_options, program

ENCODINGS = ("rove", "rope", "nope")


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


def _table(header: list, rows: list) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


# ------------------------------------------------------------------------ measurements


def peak_matmul(n: int, dtype: str, repeats: int) -> dict:
  """Peak matmul FLOP/s of this device: the best of `repeats` timed [n, n] @ [n, n] products
  (best, not median: it is a ceiling, and a conservative denominator for MFU)."""
  k1, k2 = jax.random.split(jax.random.key(2))
  a = jax.random.normal(k1, (n, n), dtype)
  b = jax.random.normal(k2, (n, n), dtype)
  f = jax.jit(jnp.matmul)
  jax.block_until_ready(f(a, b))
  best = min(time_call(lambda: f(a, b)) for _ in range(max(repeats, 3)))
  return {"n": n, "dtype": dtype, "best_s": best, "flops_per_s": 2.0 * n**3 / best}


def train_compare(model: Model, repeats: int, peak_flops: float) -> dict:
  """Train-step time of RoVE, RoPE and NoPE on one shape, interleaved; paired ratios, MFU."""
  tx = optimizer()
  steps, states = {}, {}
  for enc in ENCODINGS:
    cfg = model.config(pos_encoding=enc)
    graphdef, states[enc] = train_state(cfg, tx)
    steps[enc] = program.make_train_step(  # with the trainer's XLA options on a GPU
      graphdef, tx, 1, compiler_options=gpu_options.compiler_options(jax.devices())
    )
  batch = random_batch(model.batch, model.seq, cfg.vocab_size)

  def runner(enc):
    def run():  # the state is donated: keep the returned one for the next call
      states[enc], metrics = steps[enc](states[enc], batch)
      return metrics["loss"]

    return run

  fns = {enc: runner(enc) for enc in ENCODINGS}
  for fn in fns.values():  # compile, then one warm call
    fn(), jax.block_until_ready(fn())
  times = interleaved(fns, repeats)
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
      "paired_ratio_vs_rope": paired_ratio(times[enc], times["rope"]),
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
  times = interleaved(fns, repeats)
  rows = {
    enc: {
      "median_s": statistics.median(ts),
      "tokens_per_s": model.batch * new / statistics.median(ts),
      "paired_ratio_vs_rope": paired_ratio(ts, times["rope"]),
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
  tx = optimizer()
  rows = []
  for depth in depths:
    cfg = model.config(n_layer=depth)
    graphdef, state = train_state(cfg, tx, abstract=True)
    step = program.make_train_step(graphdef, tx, 1)
    t0 = time.perf_counter()
    lowered = step.lower(state, random_batch(model.batch, model.seq, cfg.vocab_size, abstract=True))
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


if __name__ == "__main__":
  raise SystemExit("bench.suite is driven by `python -m bench --suite cpu|gpu`")
