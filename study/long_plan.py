"""The second study's plan (study/preregistration_long.md), shared by the command
(study/long_study.py) and its write-up (study/long_writeup.py): the settings, the runs, where
each run's committed records go, and how far the study got."""

from __future__ import annotations

import os

from study import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "study", "configs", "reproduce.py")
STEPS = 2000
EVAL_EVERY = 200  # held-out loss every 200 steps: the gap-against-steps figure
CHECKPOINT_EVERY = 200
ENCODINGS = ("rove", "rope")
SWEEP_LRS = (2e-3, 4e-3, 8e-3)
SWEEP_SEEDS = (200, 201)
SEEDS = tuple(range(10, 20))
MIN_RATES, MIN_SEEDS = 3, 2
MAX_EXTENSIONS = 2
PPL_TOKENS = 16384
RULE = (
  "each encoding's rate is the one with the lowest mean, over the sweep seeds, of the "
  "final held-out loss at the training length (the last val_loss of metrics.jsonl, step "
  f"{STEPS}); a best rate at either end of the grid is refused and that encoding's grid "
  f"extended by one rate 2x past that end on the same seeds, at most {MAX_EXTENSIONS} "
  f"times, after which the study stops"
)


def name(run: dict) -> str:
  """A run's name: ENC-sSEED-lrRATE (the report file and, under sweep/ for the sweep, the
  workdir)."""
  return f"{run['encoding']}-s{run['seed']}-lr{run['lr']:g}"


def report_path(out: str, run: dict) -> str:
  return os.path.join(out, "reports", f"{run['kind']}-{name(run)}.json")


def sweep_plan(grids: dict, runs_dir: str) -> list[dict]:
  """The sweep's runs ({encoding, seed, kind "sweep", lr, workdir}) for `grids`."""
  return sweep.plan(grids, SWEEP_SEEDS, runs_dir, MIN_RATES, MIN_SEEDS)


def primary_plan(rates: dict, runs_dir: str, seeds=SEEDS) -> list[dict]:
  """The comparison's runs, pair by pair (RoVE then RoPE of each seed), at the chosen rates."""
  return [
    {
      "encoding": enc,
      "seed": seed,
      "kind": "primary",
      "lr": rates[enc],
      "workdir": os.path.join(runs_dir, f"{enc}-s{seed}-lr{rates[enc]:g}"),
    }
    for seed in seeds
    for enc in ENCODINGS
  ]


def metrics_path(out: str, run: dict) -> str:
  return os.path.join(out, "metrics", f"{run['kind']}-{name(run)}.jsonl")


def status(out: str, runs_dir: str) -> dict:
  """{"sweep": (evaluated, planned), "primary": (...)} from <out>/reports/ (the primary plan
  only once the sweep has chosen)."""
  rec = sweep.load_record(out)
  grids = {
    e: [float(x) for x in g] for e, g in ((rec or {}).get("meta", {}).get("grids") or {}).items()
  } or {e: list(SWEEP_LRS) for e in ENCODINGS}
  plans = {"sweep": sweep_plan(grids, runs_dir)}
  if rec and rec.get("chosen") and not rec.get("refused"):
    plans["primary"] = primary_plan({e: float(x) for e, x in rec["chosen"].items()}, runs_dir)
  return {
    k: (sum(os.path.exists(report_path(out, r)) for r in v), len(v)) for k, v in plans.items()
  }
