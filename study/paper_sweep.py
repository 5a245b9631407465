"""The paper-scale recipe's learning-rate sweep (reproduce.py --scale ... --sweep-lrs): its
flags, its runs in the plan, their cost, and its execution before the comparison.

The rule and its record are the small-scale study's (study/sweep.py): each rotary encoding
trains at every rate of its grid (by default 5 rates spaced by 2x around the preset's own rate)
on sweep seeds that are not the comparison's; its rate is the one of lowest mean final held-out
loss, refused at either end of the grid. lr_sweep.md and lr_sweep.json go to --out before any
comparison run trains, and the comparison runs train at their encoding's chosen rate, in
workdirs named after it. A grid whose best rate is at an edge stops the recipe before the
comparison: the compute of a comparison at a rate the grid does not bracket would be spent on a
question the sweep did not answer.
"""

from __future__ import annotations

import os
import shlex

from study import sweep

PLACEHOLDER = "<chosen by the sweep>"  # the comparison's lr in the printed plan
WORKDIR_TAG = "-lr<chosen>"  # a comparison workdir's end until its encoding's rate is known
GRID_FACTORS = (0.25, 0.5, 1, 2, 4)  # the default grid: spaced by 2x around the config's lr


def add_flags(p) -> None:
  """The sweep's flags on the --scale parser."""
  p.add_argument(
    "--sweep-lrs",
    default=None,
    help=f"tune each rotary encoding's learning rate first (study/sweep.py): a "
    f"grid of at least {sweep.MIN_RATES} rates, 'r1,r2,...' or "
    f"'rove=...;rope=...' (default: {len(GRID_FACTORS)} rates spaced by 2x "
    f"around the preset's lr); '' trains at the preset's lr, untuned",
  )
  p.add_argument(
    "--sweep-seeds",
    default="100,101,102",
    help=f"the sweep's seeds (at least {sweep.MIN_SEEDS}), none of them in --seeds "
    f"(default 100,101,102)",
  )
  p.add_argument(
    "--sweep-steps",
    type=int,
    default=None,
    help="the sweep runs' training steps (default: the preset's; fewer is cheaper, "
    "but the optimum of a shorter horizon may differ)",
  )


def default_grid(lr: float) -> str:
  """GRID_FACTORS times `lr` (exact: each factor is a power of two), as --sweep-lrs spells it."""
  return ",".join(str(lr * f) for f in GRID_FACTORS)


def check_flags(p, args, config) -> None:
  """Sets args.sweep_grids ({encoding: rates}, {} without a sweep), args.sweep_seed_list and
  args.sweep_steps; a bad grid, seed list or step count exits 2 (p.error) before any work,
  with study.sweep's own checks and messages."""
  if args.sweep_lrs is None:
    args.sweep_lrs = default_grid(config.optim.lr)
  args.sweep_grids, args.sweep_seed_list = {}, []
  if args.sweep_lrs.strip():
    try:
      args.sweep_grids, args.sweep_seed_list = sweep.from_flags(
        args.sweep_lrs, args.sweep_seeds, args.encoding_list, args.seed_list
      )
    except ValueError as e:
      p.error(str(e))
  warmup = config.optim.warmup_steps
  if args.sweep_steps is None:
    args.sweep_steps = config.steps
  elif not warmup < args.sweep_steps <= config.steps:
    p.error(
      f"--sweep-steps: more than the preset's {warmup} warmup steps and at most its "
      f"{config.steps} steps, got {args.sweep_steps}"
    )


def runs(args, steps: int, command) -> list[dict]:
  """The sweep's runs (study.sweep.plan: every encoding x rate x sweep seed, workdirs
  <runs-dir>/sweep/ENC-sSEED-lrRATE), each with its train command: `command(encoding, seed,
  workdir)` (the comparison's config, data, mesh and grad_accum) plus the rate, and the sweep's
  steps when they are not the config's `steps`."""
  out = []
  for r in sweep.plan(args.sweep_grids, args.sweep_seed_list, args.runs_dir):
    cmd = command(r["encoding"], r["seed"], r["workdir"]) + [f"--config.optim.lr={r['lr']}"]
    if args.sweep_steps != steps:
      cmd.append(f"--config.steps={args.sweep_steps}")
    out.append({**r, "train": cmd})
  return out


def comparison_run(run: dict, args) -> dict:
  """A comparison run of a swept encoding as planned: its lr the visible placeholder and its
  workdir ending in WORKDIR_TAG until `settle` knows the rate; other runs unchanged."""
  if run["encoding"] not in args.sweep_grids:
    return run
  workdir = run["workdir"] + WORKDIR_TAG
  train = [workdir if a == run["workdir"] else a for a in run["train"]]
  return {
    **run,
    "workdir": workdir,
    "tuned": True,
    "train": train + [f"--config.optim.lr={PLACEHOLDER}"],
  }


def settle(plan: dict, chosen: dict) -> None:
  """Puts each swept encoding's chosen rate into its comparison runs (the lr flag, the workdir
  <runs-dir>/ENC-sSEED-lrRATE) and into the eval command's workdirs."""
  moved = {}
  for run in plan["runs"]:
    if not run.get("tuned"):
      continue
    rate = chosen[run["encoding"]]
    workdir = run["workdir"][: -len(WORKDIR_TAG)] + f"-lr{rate:g}"
    swap = {
      run["workdir"]: workdir,
      f"--config.optim.lr={PLACEHOLDER}": f"--config.optim.lr={rate}",
    }
    moved[run["workdir"]] = workdir
    run.update(workdir=workdir, lr=rate, tuned=False, train=[swap.get(a, a) for a in run["train"]])
  plan["eval"] = [moved.get(a, a) for a in plan["eval"]]


def plan_lines(plan: dict, args) -> list[str]:
  """The printed plan's sweep section, listed before the comparison; [] without a sweep."""
  todo = plan["sweep"]
  if not todo:
    return [
      "",
      f"No learning-rate sweep (--sweep-lrs '', or no rotary encoding): every run "
      f"trains at the preset's lr {plan['config'].optim.lr:g}",
    ]
  grids = "; ".join(f"{e} at {', '.join(f'{x:g}' for x in r)}" for e, r in args.sweep_grids.items())
  L = [
    "",
    f"Learning-rate sweep first ({len(todo)} runs, in order; study/sweep.py): {grids}, "
    f"seeds {', '.join(map(str, args.sweep_seed_list))} (not the comparison's), "
    f"{args.sweep_steps:,} steps",
  ]
  if args.sweep_steps != plan["steps"]:
    L.append(
      f"  --sweep-steps {args.sweep_steps:,} is shorter than the comparison's "
      f"{plan['steps']:,} steps: the optimum of a shorter horizon may differ from the "
      f"full run's, and the comparison trains at it all the same"
    )
  L.append(
    f"  rule: {sweep.RULE}. {os.path.join(args.out, sweep.MD)} is written before any "
    f"comparison run trains; a best rate at its grid's edge stops the recipe there"
  )
  for i, run in enumerate(todo):
    L.append(
      f"  [{i + 1}/{len(todo)}] {run['encoding']} seed {run['seed']} lr {run['lr']:g} -> "
      f"{run['workdir']}"
    )
    L.append(f"    {shlex.join(run['train'])}")
  return L


def comparison_note(args) -> str:
  """The comparison's heading's note on its learning rate."""
  if not args.sweep_grids:
    return ""
  return (
    f"; {', '.join(args.sweep_grids)} at the rate the sweep chooses, shown as "
    f"--config.optim.lr={PLACEHOLDER} and a workdir ending {WORKDIR_TAG} until then"
  )


def cost_lines(plan: dict, args, comparison_hours: float, missing: list) -> list[str]:
  """The sweep's cost (its runs x sweep steps, from the comparison's compiled rows) and the
  total line: device-hours as compiled-figure bounds, never a number for an encoding without
  figures."""
  steps, out, hours = args.sweep_steps, [], 0.0
  tokens = steps * plan["batch"] * plan["seq_len"]
  if plan["sweep"]:
    out.append(
      f"Cost of the learning-rate sweep ({steps:,} steps x {plan['batch']} x "
      f"{plan['seq_len']} = {tokens:,} tokens a run):"
    )
  for enc, rates in args.sweep_grids.items():
    n = len(rates) * len(args.sweep_seed_list)
    r = next(run for run in plan["runs"] if run["encoding"] == enc)["compiled"]
    if r is None:
      from rove_jax.nn.model import param_count  # heavy: see paper_recipe's note

      f = 6 * param_count(plan["config"].model) * tokens
      out.append(
        f"  {enc}: {n} runs, no compiled figures (see the bench.aot command above): no "
        f"device-hours; analytic 6 N x tokens = {f:.3e} FLOPs a run, {n * f:.3e} in all"
      )
      continue
    h = steps * r["roofline"]["step_time_bound_s"] / 3600
    hours += n * h * r["devices"]
    out.append(
      f"  {enc}: {len(rates)} rates x {len(args.sweep_seed_list)} seeds = {n} runs "
      f"x >= {h:.2f} h on {r['name']} ({r['devices']} devices) >= "
      f"{n * h * r['devices']:.1f} device-hours [{r['file']}]"
    )
  counted = [e for e in args.encoding_list if e not in missing]
  if not counted:
    return out + [
      f"expected device-hours: unknown: no compiled figures for "
      f"{', '.join(missing)} (produce them with the bench.aot command above)"
    ]
  sweep_part = f"sweep {hours:.1f}" if plan["sweep"] else "sweep 0.0 (none)"
  line = (
    f"expected device-hours: {sweep_part} + comparison {comparison_hours:.1f} = "
    f"{hours + comparison_hours:.1f} (compiled-figure bounds, not measurements)"
  )
  if missing:
    line += (
      f"; {', '.join(counted)} only: {', '.join(missing)} has no compiled figures and "
      f"its runs are not counted"
    )
  return out + [line]


def tune(plan: dict, args, meta: dict, train, log=print) -> dict:
  """Trains the sweep runs with `train(runs)` (train.py resumes finished ones), applies
  study.sweep's rule to their final held-out losses, writes lr_sweep.md and lr_sweep.json into
  --out, and returns {encoding: chosen rate} ({} without a sweep).

  Raises:
    SystemExit: a best rate at its grid's edge (after lr_sweep.md records it), naming the fix;
      nothing of the comparison has trained.
  """
  if not plan["sweep"]:
    return {}
  log(f"learning-rate sweep: {len(plan['sweep'])} runs before the comparison")
  train(plan["sweep"])
  record = {"command": meta["command"], "commit": meta["commit"], "steps": args.sweep_steps}
  try:
    chosen, refused = sweep.record_choice(
      plan["sweep"], args.sweep_seed_list, args.out, record, log
    )
  except ValueError as e:  # a run that logged no held-out loss: its config evaluates none
    raise SystemExit(
      f"{e}; the sweep's rule needs a held-out loss from every run (--config.eval_every)"
    ) from None
  if refused:
    raise SystemExit(
      "\n".join(refused.values()) + f"\nThe fix: rerun `{meta['command']}` with "
      f"--sweep-lrs extended past that end; the finished sweep runs are kept "
      f"(train.py resumes them) and {os.path.join(args.out, sweep.MD)} records "
      f"this sweep"
    )
  log("learning-rate sweep chose " + ", ".join(f"{e} {lr:g}" for e, lr in chosen.items()))
  return chosen


def readme_lines(plan: dict, out: str) -> list[str]:
  """--out/README.md's sweep section (study.sweep.section of lr_sweep.json); [] without one."""
  return sweep.section(sweep.load_record(out)) if plan["sweep"] else []
