"""What the paper-scale recipe (study/paper_recipe.py) prints and writes: the plan as text
(its train and rove-eval commands, what the evaluation measures, the training cost as
compiled-figure bounds or 6 N x tokens, and what is assumed beyond the paper), and, after a
run, --out/README.md (each run's final losses and training time, rove-eval's report, the plan).
"""

from __future__ import annotations

import glob
import os
import shlex

from rove_jax.train.metrics import read_metrics
from study import paper_sweep
from study.paper_plan import PAPER_LENGTHS, bound_hours


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
    bound, h = r["roofline"]["step_time_bound_s"], bound_hours(r, steps)
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
    from rove_jax.nn.model import param_count  # heavy: see paper_recipe's note

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
