"""The paper-scale recipe's plan (study/paper_recipe.py): the compiled figures it draws on
(bench/aot_results: each preset's train-step reports that compiled and fit), the topology
(given, or the compiled one covering the most encodings, then the fewest device-hours), each
run's train command with that topology's mesh and grad_accum, the sweep's runs
(study/paper_sweep.py) and the one rove-eval command over the comparison runs.
"""

from __future__ import annotations

import glob
import json
import os

from study import paper_sweep
from study.checkout import ROOT, load_config

PAPER_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)  # the paper's Table 1 columns
PAPER_RULER = (4096, 8192)


def compiled_rows(aot_dir: str, preset: str) -> list[dict]:
  """The train-step reports of `preset` in aot_dir's JSON files that compiled and fit, each
  with "file" and "name" (the --topology it was compiled for) added."""
  rows = []
  for path in sorted(glob.glob(os.path.join(aot_dir, "*.json"))):
    try:
      with open(path) as f:
        saved = json.load(f)
    except (OSError, ValueError):
      continue
    if saved.get("config") != preset:
      continue
    argv = saved.get("argv", [])
    name = next((a.split("=", 1)[1] for a in argv if a.startswith("--topology=")), None)
    name = name or next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--topology"), None)
    for r in saved.get("reports", []):
      if r.get("job") == "train" and not r.get("error") and r.get("fits") is not False:
        rows.append(dict(r, file=os.path.relpath(path), name=name or r.get("topology")))
  return rows


def bound_hours(row: dict, steps: int) -> float:
  """Hours of `steps` train steps at the compiled row's step-time bound."""
  return steps * row["roofline"]["step_time_bound_s"] / 3600


def _default_topology(rows, encodings, steps):
  """The compiled topology covering most of `encodings`, then with the fewest device-hours."""
  by = {}
  for r in rows:
    if r["pos_encoding"] in encodings and (r.get("roofline") or {}).get("step_time_bound_s"):
      by.setdefault(r["topology"], {})[r["pos_encoding"]] = r
  if not by:
    return None

  def score(topo):
    found = by[topo].values()
    return (
      -len(found),
      sum(bound_hours(r, steps) * r["devices"] for r in found) / len(found),
      topo,
    )

  return min(by, key=score)


def build_plan(args) -> dict:
  """The runs (each with its train command and compiled figures) and the eval command."""
  c = load_config(args.scale)
  steps, batch, seq = c.steps, c.data.batch_size, c.data.seq_len
  rows = [
    r
    for r in compiled_rows(args.aot_dir, args.scale)  # the config's batch only
    if (r.get("batch"), r.get("length")) == (batch, seq)
  ]
  topo = getattr(args, "topology_name", None)
  chosen_by = "given" if topo else "default"
  if not topo:
    topo = _default_topology(rows, args.encoding_list, steps)
  here = {r["pos_encoding"]: r for r in rows if r["topology"] == topo}
  cfg_path = os.path.relpath(os.path.join(ROOT, "configs", f"{args.scale}.py"))
  train_py = os.path.relpath(os.path.join(ROOT, "train.py"))
  mesh = {
    e: here.get(e) or next(iter(here.values()), None)  # RoVE adds no parameters
    for e in args.encoding_list
  }

  def command(enc, seed, workdir):  # comparison and sweep runs alike
    mesh_row = mesh[enc]
    cmd = [
      "python",
      train_py,
      "--config",
      cfg_path,
      "--workdir",
      workdir,
      f"--config.model.pos_encoding={enc}",
      f"--config.seed={seed}",
      f"--config.data.path={args.data}",
    ]
    if mesh_row:
      cmd += [f"--config.mesh.{k}={mesh_row['mesh'][k]}" for k in ("data", "fsdp", "tensor")]
      cmd.append(f"--config.optim.grad_accum={mesh_row['grad_accum']}")
      if mesh_row.get("remat") and mesh_row["remat"] != c.model.remat:
        cmd.append(f"--config.model.remat={mesh_row['remat']}")
    return cmd

  runs = [
    paper_sweep.comparison_run(
      {
        "encoding": enc,
        "seed": seed,
        "workdir": wd,
        "train": command(enc, seed, wd),
        "compiled": here.get(enc),
        "mesh_from": mesh[enc] and mesh[enc]["pos_encoding"],
      },
      args,
    )
    for enc in args.encoding_list
    for seed in args.seed_list
    for wd in [os.path.join(args.runs_dir, f"{enc}-s{seed}")]
  ]
  from rove_jax.evaluation import tasks as eval_tasks  # heavy: see paper_recipe's note

  full = eval_tasks.SUITES["full"]
  eval_dir = os.path.join(args.out, "eval")
  ev = ["python", "-m", "rove_jax.cli.eval", "--workdir", runs[0]["workdir"]]
  if len(runs) > 1:
    ev += ["--compare"] + [r["workdir"] for r in runs[1:]]
  ev += [
    "--suite",
    "full",
    "--lengths",
    ",".join(map(str, PAPER_LENGTHS)),
    "--ruler-lengths",
    ",".join(map(str, PAPER_RULER)),
    "--yarn",
    "all",
    "--tasks",
    "ppl,ruler,icl",
    "--out",
    eval_dir,
  ]
  for flag, value in (
    ("--icl-tasks", args.icl_tasks),
    ("--squad", args.squad),
    ("--hotpot", args.hotpot),
  ):
    if value:
      ev += [flag, value]
  return {
    "preset": args.scale,
    "steps": steps,
    "batch": batch,
    "seq_len": seq,
    "config": c,
    "topology": topo,
    "topology_chosen": chosen_by,
    "rows": rows,
    "runs": runs,
    "sweep": paper_sweep.runs(args, steps, command),
    "eval": ev,
    "eval_dir": eval_dir,
    "ruler_lengths": list(PAPER_RULER),
    "ppl_tokens": full["ppl_tokens"],
    "ruler_samples": full["ruler_samples"],
    "ruler_under": (
      " and ".join(eval_tasks.ruler_settings("all")) + " (YaRN factor = length / training length)"
    ),
  }
