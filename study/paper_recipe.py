"""The paper-scale recipe of reproduce.py: GPT-2 124M or 354M on FineWeb-Edu at context 1024,
one run per positional encoding and seed, evaluated with the paper's protocol (RoVE, arXiv
2606.11275, section 4).

  python reproduce.py --scale gpt2_124m|gpt2_354m --data '/data/fineweb-edu/*.parquet'
      [--icl-tasks SPECS.json] [--squad FILE] [--hotpot FILE] [--encodings rove,rope]
      [--seeds 0] [--sweep-lrs R,R,R,R] [--sweep-seeds 100,101,102] [--sweep-steps N]
      [--topology v4-32] [--runs-dir DIR] [--out DIR] [--dry-run]

The plan tunes first (study/paper_sweep.py, study/sweep.py's rule): each rotary encoding at
every rate of --sweep-lrs (default 5, spaced by 2x around the preset's lr; '' skips it) on the
--sweep-seeds, lr_sweep.md written to --out, a best rate at its grid's edge stopping the recipe.
Then, for each encoding x seed at its chosen rate, one train.py command with the preset's paper
config (configs/PRESET.py; rove_jax/train/run_config.py:paper_config labels what is assumed),
the data, and the mesh and grad_accum bench/aot_results records for --topology (the sweep's
alike); then one rove-eval over these runs: perplexity from 512 to 16384 tokens without and
with YaRN, RULER by NLL, DCLM Core few-shot accuracy from local task files (--icl-tasks). The
cost, from the compiled figures, ends in the expected device-hours of sweep and comparison:
bounds, not measurements.
--dry-run prints the plan and exits 0 (the data is only checked to exist); otherwise the
commands run in order (a rerun resumes each run from its newest checkpoint), report in --out.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import shlex
import subprocess
import sys
import time

from rove_jax.nn.model_config import POS_ENCODINGS
from rove_jax.train import overrides
from rove_jax.train.metrics import read_metrics
from study import paper_sweep

# rove_jax.data (its package loads grain), rove_jax.cli.eval, rove_jax.aot.compile and
# rove_jax.nn.model (flax, optax, orbax) are imported inside the --scale recipe's functions:
# reproduce.py's small-scale path imports this module for load_config and git_commit only.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AOT_DIR = os.path.join(ROOT, "bench", "aot_results")
PRESETS = ("gpt2_124m", "gpt2_354m")
PAPER_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)  # the paper's Table 1 columns
PAPER_RULER = (4096, 8192)
EXAMPLE_DATA = "/data/fineweb-edu/sample/10BT/*.parquet"


def parse_args(argv) -> argparse.Namespace:
  """Parses and checks the --scale command line; errors exit 2 before any work.

  Sets args.seed_list, args.encoding_list, args.data_files (the matched shards, not read),
  args.runs_dir and args.out (defaults from the preset).
  """
  p = argparse.ArgumentParser(
    prog="reproduce.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument("--scale", required=True, choices=PRESETS, help="the paper's model size")
  p.add_argument(
    "--data",
    metavar="PATH_GLOB",
    help=f"FineWeb-Edu parquet shards you have (a file, directory or glob, e.g. "
    f"'{EXAMPLE_DATA}'); nothing is downloaded. Needed to run; a --dry-run "
    f"without it plans for {EXAMPLE_DATA!r}",
  )
  p.add_argument(
    "--icl-tasks",
    metavar="SPECS.json",
    help="DCLM Core task specs (LLM-Foundry JSONL files, local); without it Core is skipped",
  )
  p.add_argument("--squad", metavar="FILE", help="local SQuAD dev JSON for RULER qa_1")
  p.add_argument("--hotpot", metavar="FILE", help="local HotpotQA dev JSON for RULER qa_2")
  p.add_argument("--encodings", default="rove,rope", help="comma-separated (default rove,rope)")
  p.add_argument("--seeds", default="0", help="comma-separated (default one seed: a cost choice)")
  paper_sweep.add_flags(p)
  p.add_argument(
    "--topology",
    help="slice to train on (v5e-16, v4-32, h200-8, ...): the mesh, "
    "grad_accum and cost come from its compiled figures "
    "(default: the cheapest compiled one for the preset)",
  )
  p.add_argument("--runs-dir", help="training workdirs (default runs/PRESET)")
  p.add_argument("--out", help="report directory (default results_PRESET)")
  p.add_argument(
    "--aot-dir",
    default=AOT_DIR,
    help="the compiled figures (python -m bench.aot --json); default bench/aot_results",
  )
  p.add_argument(
    "--dry-run",
    action="store_true",
    help="print the plan, its cost and its assumptions; run nothing",
  )
  args = p.parse_args(argv)
  try:
    args.seed_list = list(dict.fromkeys(int(s) for s in args.seeds.split(",") if s.strip()))
  except ValueError:
    p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
  if not args.seed_list:
    p.error("--seeds: give at least one seed")
  args.encoding_list = list(
    dict.fromkeys(e.strip() for e in args.encodings.split(",") if e.strip())
  )
  bad = [e for e in args.encoding_list if e not in POS_ENCODINGS]
  if bad or not args.encoding_list:
    p.error(f"--encodings: unknown {bad}; choose from {POS_ENCODINGS}")
  paper_sweep.check_flags(p, args, load_config(args.scale))
  from rove_jax.data import files  # heavy: see the note above ROOT

  if args.data is None and not args.dry_run:
    p.error(
      f"--data is required to run the plan: the FineWeb-Edu parquet shards you have, e.g. "
      f"--data '{EXAMPLE_DATA}' (a --dry-run plans without it)"
    )
  args.data = os.path.expanduser(args.data or EXAMPLE_DATA)
  try:
    args.data_files, _ = files.resolve_files(args.data, files.PARQUET_EXTENSIONS, "--data")
  except ValueError as e:
    if not args.dry_run:
      p.error(f"{e}; give the FineWeb-Edu parquet shards you have, e.g. --data '{EXAMPLE_DATA}'")
    args.data_files = None  # a dry run plans for shards it need not see
  from rove_jax.cli import eval as cli  # heavy: see the note above ROOT

  cli.check_task_files(p, args)  # the evaluation's input files, now, not after days of training
  if args.topology:
    args.topology_name = _topology_name(p, args.topology, args.aot_dir, args.scale)
  args.runs_dir = args.runs_dir or os.path.join("runs", args.scale)
  args.out = args.out or f"results_{args.scale}"
  if os.path.abspath(args.out) == os.path.join(ROOT, "results"):
    p.error("--out results is the small-scale study's write-up; choose another directory")
  return args


def _topology_name(p, given: str, aot_dir: str, preset: str) -> str:
  """--topology as the compiled reports name it ("v4-32" -> "v4:2x2x4"); an error if unknown."""
  for r in compiled_rows(aot_dir, preset):
    if given.lower() in {str(r.get(k)).lower() for k in ("name", "topology", "accelerator")}:
      return r["topology"]
  # A topology nothing was compiled for yet: check its name (heavy: see the note above ROOT).
  from rove_jax.aot import compile as aot

  try:
    return aot.parse_topology(given).name
  except ValueError as e:
    p.error(f"--topology: {e}")


def load_config(preset: str):
  """A RunConfig: configs/PRESET.py for a preset's name, or the config file at that path."""
  path = preset if preset.endswith(".py") else os.path.join(ROOT, "configs", f"{preset}.py")
  return overrides.load_file(path)


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


def _bound_hours(row: dict, steps: int) -> float:
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
      sum(_bound_hours(r, steps) * r["devices"] for r in found) / len(found),
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
  from rove_jax.evaluation import tasks as eval_tasks  # heavy: see the note above ROOT

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


def cost_lines(plan, args) -> list[str]:
  """Training cost: compiled-figure bounds where bench/aot_results has them, else 6 N x tokens."""
  steps, topo = plan["steps"], plan["topology"]
  tokens = steps * plan["batch"] * plan["seq_len"]
  out = [
    f"Cost of training ({steps:,} steps x {plan['batch']} x {plan['seq_len']} = "
    f"{tokens:,} tokens a run; evaluation not included):"
  ]
  hours = dev_hours = flops = 0.0
  n_seeds, missing = len(args.seed_list), []
  topo_name = args.topology or next(
    (r["name"] for r in plan["rows"] if r["topology"] == topo), "TOPOLOGY"
  )
  for enc in args.encoding_list:
    r = next(run for run in plan["runs"] if run["encoding"] == enc)["compiled"]
    if r is None:
      missing.append(enc)
      continue
    bound, h = r["roofline"]["step_time_bound_s"], _bound_hours(r, steps)
    f = steps * r["flops"] * r["devices"]
    hours += n_seeds * h
    dev_hours += n_seeds * h * r["devices"]
    flops += n_seeds * f
    out.append(
      f"  {enc} on {r['name']} ({r['devices']} devices): step >= {bound:.4f} s "
      f"({r['roofline'].get('bound_by', '?')}-bound) x {steps:,} steps >= {h:.2f} h a "
      f"run, >= {h * r['devices']:.1f} device-hours; {f:.3e} FLOPs a run "
      f"({steps:,} steps x {r['flops']:.4e} FLOPs/step/device x {r['devices']} devices)"
      f" [{r['file']}]"
    )
  if hours:
    covered = n_seeds * (len(args.encoding_list) - len(missing))
    out.append(
      f"  compiled-figure bounds, not measurements (XLA's FLOPs and bytes over the "
      f"chip's peak: real steps are slower). The plan's {covered} run(s) with "
      f"compiled figures: >= {hours:.2f} h in sequence, >= {dev_hours:.1f} "
      f"device-hours, {flops:.3e} FLOPs"
    )
  if missing:
    from rove_jax.nn.model import param_count  # heavy: see the note above ROOT

    n = param_count(plan["config"].model)
    where = f"for {topo_name}" if topo else "for any topology"
    for enc in missing:
      out.append(
        f"  {enc}: no compiled figures {where} in {os.path.relpath(args.aot_dir)}; "
        f"analytic 6 N x tokens = 6 x {n:,} x {tokens:,} = {6 * n * tokens:.3e} FLOPs "
        f"a run (no time bound without a compiled step). Produce them with"
      )
      out.append(
        f"    python -m bench.aot --config configs/{plan['preset']}.py --topology "
        f"{topo_name} --config.model.pos_encoding={enc} --recommend --json "
        f"bench/aot_results/{plan['preset'][5:]}_{enc}_{topo_name}.json"
      )
  return out + paper_sweep.cost_lines(plan, args, dev_hours, missing)


def eval_lines(plan, args) -> list[str]:
  """What the rove-eval command measures, as this checkout's rove-eval does it."""
  seq, r_lengths, ev = plan["seq_len"], plan["ruler_lengths"], plan["eval"]
  yarn = ev[ev.index("--yarn") + 1]
  fixed = (
    f" and yarn_fixed (one factor, {PAPER_LENGTHS[-1] // seq}, at every length)"
    if yarn == "all"
    else ""
  )
  L = [
    f"  - perplexity at {', '.join(map(str, PAPER_LENGTHS))} tokens on each run's held-out "
    f"shards, up to {plan['ppl_tokens']:,} tokens a length, --yarn {yarn}: without YaRN, "
    f"with YaRN (factor = length / {seq}){fixed}"
  ]
  L.append(
    f"  - RULER by answer NLL at {', '.join(map(str, r_lengths))} tokens (the paper's "
    f"4k/8k), {plan['ruler_samples']} samples a task and length, under "
    f"{plan['ruler_under']}"
  )
  for flag, task in (("--squad", "qa_1"), ("--hotpot", "qa_2")):
    if not getattr(args, flag[2:]):
      L.append(
        f"  - RULER {task}: skipped, no {flag} FILE (a local dev JSON; nothing is downloaded)"
      )
  inside = f"inside the {seq}-token training context (prompts cut from the left to fit)"
  if args.icl_tasks:
    L.append(
      f"  - Core: the task files listed in {args.icl_tasks}, few-shot, {inside}: "
      f"centered accuracy and the Core score (plus rove-eval's synthetic ICL tasks)"
    )
  else:
    L.append(
      "  - Core: SKIPPED: no --icl-tasks SPECS.json. DCLM Core's task files (LLM-Foundry "
      "JSONL) are not bundled and nothing is downloaded; only rove-eval's synthetic ICL "
      "tasks run"
    )
  return L


def format_plan(plan, args) -> str:
  """The plan as printed: commands, what is measured, the cost and what is assumed."""
  n_runs, topo, seq = len(plan["runs"]), plan["topology"], plan["seq_len"]
  seeds = ", ".join(map(str, args.seed_list))
  L = [
    f"Paper-scale recipe: {plan['preset']}, encodings {', '.join(args.encoding_list)}, "
    f"seeds {seeds}" + (" (dry run: nothing is trained or evaluated)" if args.dry_run else ""),
    f"data: {len(args.data_files)} parquet file(s) match {args.data!r} (checked to exist, not read)"
    if args.data_files is not None
    else f"data: {args.data!r}, not found here (a dry run plans without it; a run needs it)",
  ]
  if topo:
    others = sorted({r["name"] for r in plan["rows"] if r["topology"] != topo})
    names = {r["topology"]: r["name"] for r in plan["rows"]}
    how = (
      "given by --topology"
      if plan["topology_chosen"] == "given"
      else "default: the compiled topology covering the most encodings, then the fewest "
      "device-hours"
    )
    L.append(
      f"topology: {names.get(topo, args.topology or topo)} ({how})"
      + (f"; also compiled: {', '.join(others)}" if others else "")
    )
    if not any(run["mesh_from"] for run in plan["runs"]):
      L.append(
        f"  no compiled figures for it in {os.path.relpath(args.aot_dir)}: the mesh is "
        "train.py's default (data-parallel over every device, grad_accum 1), which may "
        "not fit; see the bench.aot command below, or add --config.dry_run=True to a "
        "train command to compile it on the slice"
      )
  else:
    L.append(
      "topology: none compiled for this preset; the mesh is train.py's default "
      "(data-parallel over every device, grad_accum 1)"
    )
  L += paper_sweep.plan_lines(plan, args)
  L += [
    "",
    f"Training ({n_runs} run(s), in order; a rerun resumes each from its newest "
    f"checkpoint{paper_sweep.comparison_note(args)}):",
  ]
  for i, run in enumerate(plan["runs"]):
    L.append(f"  [{i + 1}/{n_runs}] {run['encoding']} seed {run['seed']} -> {run['workdir']}")
    L.append(f"    {shlex.join(run['train'])}")
    if run["mesh_from"] and run["mesh_from"] != run["encoding"]:
      L.append(
        f"    (mesh and grad_accum from the {run['mesh_from']} compile: no "
        f"{run['encoding']} one for this topology)"
      )
  L += [
    "",
    f"Evaluation (one rove-eval over the comparison runs; report in {plan['eval_dir']}):",
    f"    {shlex.join(plan['eval'])}",
  ]
  L += eval_lines(plan, args)
  L += [""] + cost_lines(plan, args)
  L += [
    "",
    "Assumed (not stated by the paper):",
    f"  - everything in configs/{plan['preset']}.py but model size, FineWebEdu-10B and "
    f"context {seq}: GPT-2 tokenizer, batch {plan['batch']} x {seq}, {plan['steps']:,} "
    f"steps, lr {plan['config'].optim.lr:g}"
    + (" (the sweep's grid around it)" if args.sweep_grids else "")
    + f", {plan['config'].optim.warmup_steps} warmup "
    f"steps, weight decay {plan['config'].optim.weight_decay:g}, AdamW betas, bf16 "
    f"(rove_jax/train/run_config.py:paper_config)",
    (
      f"  - one seed ({seeds}): a cost choice, every seed adds a full run per encoding; "
      f"--seeds 0,1 gives a spread over seeds"
      if len(args.seed_list) == 1
      else f"  - {len(args.seed_list)} seeds ({seeds}), each a full run per encoding"
    ),
    "  - evaluation: rove-eval's full suite (perplexity tokens a length, RULER tasks and "
    "samples, Core shots as the task specs give them); the paper's counts are not given",
    "  - the cost above: compiled-figure bounds for the topology, not measurements",
  ]
  if topo and not topo.startswith(("h100", "h200", "cpu")):
    L.append(
      "  - a slice of several hosts (most TPU slices past 8 chips, v4 and v5p past 4): "
      "run each train command on every host at once (jax.distributed detects TPU pods); "
      "reproduce.py runs the commands on this machine only"
    )
  return "\n".join(L)


def git_commit() -> str:
  """The checkout's HEAD, marked when tracked files other than results/ (what reproduce.py
  itself rewrites) have uncommitted changes: reproduce.py's record of the code that trained,
  evaluated or wrote."""
  try:
    head = subprocess.run(
      ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
      cwd=ROOT,
      capture_output=True,
      text=True,
    ).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown (not a git checkout)"


def execute(plan, args, text: str, argv) -> int:
  """Trains the sweep and writes lr_sweep.md (paper_sweep.tune; an edge stops here), then every
  comparison run at its chosen rate (resuming), evaluates those and writes --out/README.md."""
  t0, started = time.perf_counter(), datetime.datetime.now(datetime.timezone.utc)
  meta = {
    "command": "python reproduce.py " + shlex.join(argv),
    "commit": git_commit(),
    "started": started.isoformat(timespec="seconds"),
  }
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "plan.txt"), "w") as f:
    f.write(text + "\n")
  chosen = paper_sweep.tune(
    plan, args, meta, lambda runs: _train(runs, meta), log=lambda line: print(line, flush=True)
  )
  paper_sweep.settle(plan, chosen)  # lr_sweep.md is written: the comparison trains at its rates
  _train(plan["runs"], meta)
  print("evaluating:", shlex.join(plan["eval"]), flush=True)
  env = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
  }
  rc = subprocess.call([sys.executable] + plan["eval"][1:], env=env)
  if rc != 0:
    raise SystemExit(
      f"evaluation failed (exit {rc}); the trained runs are kept: rerun `{meta['command']}`"
    )
  meta["wall_seconds"] = time.perf_counter() - t0
  path = write_readme(args.out, plan, text, meta)
  print(f"wrote {path} in {meta['wall_seconds'] / 3600:.2f} h")
  return 0


def _train(runs, meta) -> None:
  """Trains `runs` in order (train.py resumes or skips a finished one); records train_seconds."""
  for i, run in enumerate(runs):
    print(
      f"[{i + 1}/{len(runs)}] {run['encoding']} seed {run['seed']} -> {run['workdir']}", flush=True
    )
    t = time.perf_counter()
    rc = subprocess.call([sys.executable] + run["train"][1:])
    run["train_seconds"] = time.perf_counter() - t
    if rc != 0:
      raise SystemExit(
        f"training {run['workdir']} failed (exit {rc}); rerun `{meta['command']}` to resume it"
      )


def write_readme(out: str, plan, text: str, meta: dict) -> str:
  """--out/README.md: what ran, each run's training, rove-eval's report.md and the plan."""
  encodings = " vs ".join(dict.fromkeys(r["encoding"] for r in plan["runs"]))
  L = [
    f"# Paper-scale run: {plan['preset']}, {encodings}\n",
    f"- Command: `{meta['command']}`",
    f"- Commit: {meta['commit']}",
    f"- Started: {meta['started']}; wall time {meta['wall_seconds'] / 3600:.2f} h",
    f"- Topology of the mesh and cost figures: {plan['topology'] or 'none'}",
    "",
    *paper_sweep.readme_lines(plan, out),
    "## Runs\n",
    "| run | encoding | seed | final train loss | final held-out loss | training wall (h) |",
    "|---|---|---|---|---|---|",
  ]
  for run in plan["runs"]:
    rows = read_metrics(run["workdir"])
    tr = [r["loss"] for r in rows if "loss" in r]
    va = [r["val_loss"] for r in rows if "val_loss" in r]
    secs = run.get("train_seconds")
    L.append(
      f"| {run['workdir']} | {run['encoding']} | {run['seed']} | "
      f"{f'{tr[-1]:.4f}' if tr else '-'} | {f'{va[-1]:.4f}' if va else '-'} | "
      f"{f'{secs / 3600:.2f}' if secs else '-'} |"
    )
  rel = os.path.relpath(plan["eval_dir"], out)
  L += [
    "",
    f"rove-eval's report follows ([{rel}/report.md]({rel}/report.md); raw numbers in "
    f"[{rel}/report.json]({rel}/report.json)).\n",
  ]
  try:
    with open(os.path.join(plan["eval_dir"], "report.md")) as f:
      L += ["#" + line if line.startswith("#") else line for line in f.read().splitlines()]
  except OSError as e:
    L.append(f"(no report.md: {e.strerror})")
  for png in sorted(glob.glob(os.path.join(plan["eval_dir"], "*.png"))):
    L.append(f"\n![{os.path.basename(png)}]({rel}/{os.path.basename(png)})")
  L += ["", "## The plan, its cost bounds and assumptions\n", "```text", text, "```", ""]
  path = os.path.join(out, "README.md")
  with open(path, "w") as f:
    f.write("\n".join(L))
  return path


def main(argv) -> int:
  """`python reproduce.py --scale ...`: prints the plan; unless --dry-run, runs it."""
  args = parse_args(argv)
  plan = build_plan(args)
  text = format_plan(plan, args)
  print(text, flush=True)
  if args.dry_run:
    return 0
  return execute(plan, args, text, argv)
