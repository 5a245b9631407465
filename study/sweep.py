"""The learning-rate sweep that tunes each rotary encoding before the comparison: its plan, the
rule that picks each encoding's rate, and <out>/lr_sweep.md (with lr_sweep.json), written
before any comparison run trains (reproduce.py --sweep-lrs).

Plan: every encoding of the sweep at every rate of its grid (at least MIN_RATES rates) on every
sweep seed (at least MIN_SEEDS; seed s is one pair across the encodings), the study's training
length and steps. The sweep seeds are not the comparison's: the chosen rate's sweep loss is the
minimum over the grid (biased low by the choice), so the comparison trains fresh seeds.

Rule (`choose`): an encoding's rate is the one with the lowest mean, over the sweep seeds, of
the final held-out loss at the training length (the last `val_loss` of the run's
metrics.jsonl). It must lie strictly inside the grid: a best rate at either end says the grid
does not bracket the optimum, and the rule refuses it (EdgeError) until the grid is extended
past that end and the sweep rerun (finished runs are kept).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Sequence

MIN_RATES = 4
MIN_SEEDS = 3
RULE = (
  "each encoding's rate is the one with the lowest mean, over the sweep seeds, of the "
  "final held-out loss at the training length (the last val_loss of metrics.jsonl); a "
  "best rate at either end of the grid is refused: the grid is extended past that end "
  "and the sweep rerun"
)
MD, JSON = "lr_sweep.md", "lr_sweep.json"


class EdgeError(ValueError):
  """The best rate of a grid is at its end: the grid does not bracket the optimum."""


def check_grid(
  rates: Sequence[float],
  seeds: Sequence[int],
  what: str = "the sweep",
  min_rates: int = MIN_RATES,
  min_seeds: int = MIN_SEEDS,
) -> None:
  """Refuses (ValueError) a grid of fewer than `min_rates` distinct rates, rates outside
  (0, 1), or fewer than `min_seeds` distinct seeds (the second study, study/long_study.py,
  sweeps 3 rates on 2 seeds)."""
  if len(set(rates)) != len(rates) or len(rates) < min_rates:
    raise ValueError(
      f"{what}: needs at least {min_rates} distinct learning rates so that the "
      f"best can lie strictly inside the grid, got {list(rates)}"
    )
  if any(not 0 < lr < 1 for lr in rates):
    raise ValueError(f"{what}: learning rates must be in (0, 1), got {list(rates)}")
  if len(set(seeds)) != len(seeds) or len(seeds) < min_seeds:
    raise ValueError(
      f"{what}: needs at least {min_seeds} distinct seeds (seed pairs) a rate, got {list(seeds)}"
    )


def parse_rates(text: str, encodings: Sequence[str]) -> dict:
  """{encoding: sorted rates} from "r1,r2,..." (every encoding the same grid) or
  "enc=r1,r2,...;enc=..." (a grid each; encodings not named are not swept).

  Raises:
    ValueError: on a number that does not parse or an encoding not in `encodings`.
  """
  if "=" not in text:
    grids = {e: text for e in encodings}
  else:
    grids = {}
    for part in filter(str.strip, text.split(";")):
      enc, _, rates = part.partition("=")
      if enc.strip() not in encodings:
        raise ValueError(f"--sweep-lrs: {enc.strip()!r} is not one of {list(encodings)}")
      grids[enc.strip()] = rates
  try:
    return {e: sorted(float(x) for x in g.split(",") if x.strip()) for e, g in grids.items()}
  except ValueError:
    raise ValueError(
      f"--sweep-lrs must be comma-separated numbers (or enc=...;enc=...), got {text!r}"
    ) from None


def from_flags(
  rates_text: str, seeds_text: str, encodings: Sequence[str], comparison_seeds: Sequence[int]
) -> tuple[dict, list]:
  """(grids, sweep seeds) from reproduce.py's --sweep-lrs and --sweep-seeds: the rotary
  encodings of `encodings` are swept.

  Raises:
    ValueError: a grid or seed list `check_grid` refuses, or sweep seeds that are also
      comparison seeds (the chosen rate's sweep loss is a minimum over the grid, biased low).
  """
  try:
    seeds = [int(x) for x in seeds_text.split(",") if x.strip()]
  except ValueError:
    raise ValueError(
      f"--sweep-seeds must be comma-separated integers, got {seeds_text!r}"
    ) from None
  grids = parse_rates(rates_text, [e for e in encodings if e != "nope"])
  for enc, rates in grids.items():
    check_grid(rates, seeds, f"--sweep-lrs ({enc})")
  shared = sorted(set(seeds) & set(comparison_seeds))
  if shared:
    raise ValueError(
      f"--sweep-seeds {shared} are also comparison --seeds: the chosen rate's "
      f"sweep loss is a minimum over the grid, so the comparison needs fresh "
      f"seeds"
    )
  return grids, seeds


def workdir(runs_dir: str, encoding: str, seed: int, lr: float) -> str:
  return os.path.join(runs_dir, "sweep", f"{encoding}-s{seed}-lr{lr:g}")


def plan(
  grids: dict,
  seeds: Sequence[int],
  runs_dir: str,
  min_rates: int = MIN_RATES,
  min_seeds: int = MIN_SEEDS,
) -> list[dict]:
  """The sweep's runs, {encoding, seed, kind: "sweep", lr, workdir}: every encoding x rate of
  its grid x seed (check_grid on each grid first, with these minimums)."""
  for enc, rates in grids.items():
    check_grid(rates, seeds, f"the {enc} sweep", min_rates, min_seeds)
  return [
    {
      "encoding": enc,
      "seed": seed,
      "kind": "sweep",
      "lr": lr,
      "workdir": workdir(runs_dir, enc, seed, lr),
    }
    for enc, rates in grids.items()
    for lr in rates
    for seed in seeds
  ]


def final_val_loss(rows: Optional[Sequence[dict]]) -> Optional[float]:
  """The last held-out loss of a run's metrics rows (the highest step's), None without one."""
  val = [(r["step"], r["val_loss"]) for r in rows or () if "val_loss" in r]
  return max(val)[1] if val else None


def losses(runs: Sequence[dict], curves: dict) -> dict:
  """{encoding: {lr: [final held-out loss per seed, in seed order]}} of the sweep's runs.

  Raises:
    ValueError: a run without a held-out loss (its metrics.jsonl has no val_loss row).
  """
  out: dict = {}
  for r in sorted(runs, key=lambda r: (r["encoding"], r["lr"], r["seed"])):
    loss = final_val_loss(curves.get(r["workdir"]))
    if loss is None:
      raise ValueError(
        f"sweep run {r['workdir']} has no held-out loss (val_loss) in its metrics.jsonl"
      )
    out.setdefault(r["encoding"], {}).setdefault(r["lr"], []).append(loss)
  return out


def _mean(xs) -> float:
  return sum(xs) / len(xs)


def choose(by_rate: dict, what: str = "the sweep", min_rates: int = MIN_RATES) -> float:
  """The rule (module docstring): the rate of lowest mean loss, strictly inside the grid.

  Args:
    by_rate: {lr: [final held-out loss per seed]} of one encoding.
    what: names the encoding in the error.

  Raises:
    EdgeError: the best rate is the grid's smallest or largest.
    ValueError: fewer than `min_rates` rates.
  """
  rates = sorted(by_rate)
  if len(rates) < min_rates:
    raise ValueError(f"{what}: {len(rates)} rates, the rule needs at least {min_rates}")
  best = min(rates, key=lambda lr: _mean(by_rate[lr]))
  if best in (rates[0], rates[-1]):
    side, step = (
      ("smallest", rates[0] / rates[1]) if best == rates[0] else ("largest", rates[-1] / rates[-2])
    )
    raise EdgeError(
      f"{what}: the best learning rate {best:g} (mean held-out loss "
      f"{_mean(by_rate[best]):.4f}) is the {side} of the grid "
      f"{', '.join(f'{x:g}' for x in rates)}; the optimum may lie beyond it. "
      f"Extend the grid past that end (e.g. add {best * step:.3g}) and rerun the "
      f"sweep; no rate is chosen and no comparison run trains"
    )
  return best


def decide(table: dict, min_rates: int = MIN_RATES) -> tuple[dict, dict]:
  """({encoding: chosen rate}, {encoding: refusal message}) for every encoding of `losses`."""
  chosen, refused = {}, {}
  for enc, by_rate in table.items():
    try:
      chosen[enc] = choose(by_rate, f"the {enc} sweep", min_rates)
    except EdgeError as e:
      refused[enc] = str(e)
  return chosen, refused


def markdown(table: dict, seeds: Sequence[int], chosen: dict, refused: dict, meta: dict) -> str:
  """lr_sweep.md: the rule, the table of mean (and per-seed) losses, the choice or refusal."""
  L = [
    "# Learning-rate sweep\n",
    f"Written by `{meta.get('command', 'python reproduce.py --sweep-lrs ...')}` at commit "
    f"{meta.get('commit', '?')}, before any comparison run trained. Seeds "
    f"{', '.join(map(str, seeds))} (one pair across the encodings each; not the "
    f"comparison's seeds), {meta.get('steps', '?')} steps, the study's training length.\n",
    f"Rule: {meta.get('rule', RULE)}.\n",
  ]
  return "\n".join(L + table_lines(table, chosen, refused)) + "\n"


def table_lines(table: dict, chosen: dict, refused: dict) -> list[str]:
  """The sweep's table (mean and per-seed final held-out loss of every encoding and rate, the
  chosen rate marked) and a line per encoding with its choice or refusal."""
  L = ["| encoding | learning rate | mean final held-out loss | per seed |", "|---|---|---|---|"]
  for enc, by_rate in table.items():
    for lr in sorted(by_rate):
      mark = " (chosen)" if chosen.get(enc) == lr else ""
      L.append(
        f"| {enc} | {lr:g}{mark} | {_mean(by_rate[lr]):.4f} | "
        + ", ".join(f"{x:.4f}" for x in by_rate[lr])
        + " |"
      )
  L.append("")
  for enc in table:
    L.append(
      f"- {enc}: "
      + (
        f"{chosen[enc]:g}, strictly inside its grid"
        if enc in chosen
        else f"refused. {refused[enc]}"
      )
    )
  return L


def section(record: Optional[dict]) -> list[str]:
  """results/README.md's sweep section from the record `write` stores in lr_sweep.json (and
  reproduce.py copies into the write-up's meta); [] without one."""
  if not record or not record.get("losses"):
    return []
  table = {e: {float(lr): v for lr, v in t.items()} for e, t in record["losses"].items()}
  chosen = {e: float(lr) for e, lr in (record.get("chosen") or {}).items()}
  meta = record.get("meta") or {}
  return [
    "## Learning-rate sweep\n",
    f"Each rotary encoding trains at its own learning rate, chosen by a sweep written to "
    f"[{MD}]({MD}) before any comparison run trained (`{meta.get('command', '?')}` at "
    f"commit {meta.get('commit', '?')}): every rate of the grid on the sweep seeds "
    f"{', '.join(map(str, record.get('seeds') or []))} (fresh seeds, not the "
    f"comparison's: the chosen rate's sweep loss is a minimum over the grid, biased low), "
    f"{meta.get('steps', '?')} steps. Rule: {record.get('rule', RULE)}.\n",
    *table_lines(table, chosen, record.get("refused") or {}),
    "",
  ]


def write(
  out_dir: str, table: dict, seeds: Sequence[int], chosen: dict, refused: dict, meta: dict
) -> str:
  """Writes <out_dir>/lr_sweep.md and lr_sweep.json; returns the markdown's path. A record of
  the same decision (the same losses, choice and settings) is left as it is: its commit is the
  one that made the decision, before any comparison run, and a later invocation that resumes
  the study must not restamp it."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, MD)
  record = {
    "rule": meta.get("rule", RULE),
    "seeds": list(seeds),
    "meta": meta,
    "chosen": chosen,
    "refused": refused,
    "losses": {e: {f"{lr:g}": v for lr, v in t.items()} for e, t in table.items()},
  }
  old = load_record(out_dir)
  if old is not None and os.path.exists(path) and _decision(old) == _decision(record):
    return path
  with open(path, "w") as f:
    f.write(markdown(table, seeds, chosen, refused, meta))
  with open(os.path.join(out_dir, JSON), "w") as f:
    json.dump(record, f, indent=2)
  return path


def _decision(record: dict) -> dict:
  """A record as JSON would hold it, without the commit that wrote it."""
  plain = json.loads(json.dumps(record))
  plain["meta"].pop("commit", None)
  return plain


def load_record(out_dir: str) -> Optional[dict]:
  """The content of <out_dir>/lr_sweep.json, None without one."""
  path = os.path.join(out_dir, JSON)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def load_choice(out_dir: str) -> dict:
  """{encoding: chosen rate} from an earlier sweep's <out_dir>/lr_sweep.json.

  Raises:
    SystemExit: no such file, or an encoding's rate was refused.
  """
  path = os.path.join(out_dir, JSON)
  if not os.path.exists(path):
    raise SystemExit(
      f"no learning-rate sweep in {path}: run `python reproduce.py --sweep-lrs ...` first"
    )
  with open(path) as f:
    data = json.load(f)
  if data.get("refused"):
    raise SystemExit(
      f"{path}: the sweep chose no rate for {sorted(data['refused'])}; extend the grid and rerun it"
    )
  return {e: float(lr) for e, lr in data["chosen"].items()}


def recorded(out_dir: str, grids: dict, seeds: Sequence[int], steps: int) -> Optional[dict]:
  """{encoding: chosen rate} of the sweep <out_dir>/lr_sweep.json records when it is this
  sweep (the same grids, seeds and training steps) and chose a rate for every encoding; else
  None."""
  path = os.path.join(out_dir, JSON)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    data = json.load(f)
  same = (
    data.get("seeds") == list(seeds)
    and (data.get("meta") or {}).get("steps") == steps
    and {e: sorted(float(x) for x in t) for e, t in (data.get("losses") or {}).items()}
    == {e: sorted(float(x) for x in r) for e, r in grids.items()}
  )
  if not same or data.get("refused") or set(data.get("chosen") or {}) != set(grids):
    return None
  return {e: float(lr) for e, lr in data["chosen"].items()}


def tune(
  grids: dict,
  seeds: Sequence[int],
  runs_dir: str,
  out_dir: str,
  train: Callable[[list], None],
  meta: dict,
  log: Callable[[str], None] = print,
  reuse: bool = False,
) -> dict:
  """The sweep: trains `plan`'s runs with `train` (resuming finished ones), applies the rule,
  writes lr_sweep.md and lr_sweep.json to out_dir, and returns {encoding: chosen rate}. With
  `reuse`, a sweep out_dir already records (`recorded`: a committed results/lr_sweep.json) is
  not trained again: its choice is returned and its table kept as written.

  Raises:
    SystemExit: a best rate at its grid's edge (after lr_sweep.md records the refusal).
  """
  done = recorded(out_dir, grids, seeds, meta.get("steps")) if reuse else None
  if done is not None:
    log(
      f"learning-rate sweep: {os.path.join(out_dir, JSON)} records this sweep (same grids, "
      f"seeds and steps) and its choice {done}; not trained again"
    )
    return done
  runs = plan(grids, seeds, runs_dir)
  log(
    f"learning-rate sweep: {len(runs)} runs, "
    + "; ".join(f"{e} at {', '.join(f'{x:g}' for x in r)}" for e, r in grids.items())
    + f", seeds {', '.join(map(str, seeds))}"
  )
  train(runs)
  chosen, refused = record_choice(runs, seeds, out_dir, meta, log)
  if refused:
    raise SystemExit("\n".join(refused.values()))
  return chosen


def record_choice(
  runs: Sequence[dict],
  seeds: Sequence[int],
  out_dir: str,
  meta: dict,
  log: Callable[[str], None] = print,
) -> tuple[dict, dict]:
  """The rule on trained sweep runs (each {encoding, seed, lr, workdir}): their final held-out
  losses (`losses` of each workdir's metrics.jsonl), `decide`, and lr_sweep.md and
  lr_sweep.json written to out_dir; returns (chosen, refused) as `decide` does. Shared by the
  small-scale study (`tune`) and the paper-scale recipe (study/paper_sweep.py).

  Raises:
    ValueError: a run without a held-out loss.
  """
  from rove_jax.train.metrics import read_metrics

  table = losses(runs, {r["workdir"]: read_metrics(r["workdir"]) for r in runs})
  chosen, refused = decide(table)
  log(f"wrote {write(out_dir, table, seeds, chosen, refused, meta)}")
  return chosen, refused
