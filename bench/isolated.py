"""The benchmark suite's measurements that need a fresh process each, so that a peak is the
measured work's own: peak memory of N train steps (one subprocess per encoding) and the
forward pass of a RoVE model at long contexts, "xla" against "chunked" attention (one
subprocess per length and kernel, under an address-space cap on the CPU). The parent runs

  python -m bench.isolated --worker train_memory|long_forward JSON

and reads the child's last line of output (JSON); a failed child is a row with an error.
bench/suite.py calls memory_compare and long_context.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.measure import GIB, optimizer, peak_memory, random_batch, time_call, train_state
from bench.specs import Model
from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.train import program


def _subprocess(kind: str, payload: dict, cap_gib: float, timeout: float) -> dict:
  """Run a worker (`python -m bench.isolated --worker kind JSON`) in a fresh process, so its peak
  memory is its own; under RLIMIT_AS when cap_gib > 0 (not on GPUs, whose driver reserves far
  more address space than it uses). A failure is a row with an error, not a crash."""
  # The worker sets the cap on itself: a preexec_fn would fork this multithreaded JAX process.
  cmd = [
    sys.executable,
    "-m",
    "bench.isolated",
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
  tx = optimizer()
  graphdef, state = train_state(cfg, tx)
  step = program.make_train_step(graphdef, tx, 1)
  batch = random_batch(model.batch, model.seq, cfg.vocab_size)
  for _ in range(p["steps"]):
    state, metrics = step(state, batch)
  return {"encoding": p["encoding"], "loss": float(metrics["loss"]), **peak_memory()}


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
  dt = time_call(lambda: f(state, tok))
  out = np.asarray(f(state, tok), np.float32)
  return {
    "T": T,
    "kernel": p["kernel"],
    "seconds": dt,
    "tokens_per_s": T / dt,
    "finite": bool(np.isfinite(out).all()),
    **peak_memory(),
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
    raise SystemExit("bench.isolated is driven by `python -m bench --suite cpu|gpu`")
