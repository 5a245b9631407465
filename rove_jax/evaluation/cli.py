"""rove-eval (or `python -m eval` from a checkout): perplexity vs length (+/- YaRN), RULER
NLL and in-context learning for trained runs, written as report.json, report.md and plots.

  rove-eval --workdir runs/X [--suite quick|full] [--lengths 256,512,...]
            [--yarn off|on|both] [--tasks ppl,ruler,icl] [--compare runs/Y runs/Z]
            [--out DIR] [--squad FILE] [--hotpot FILE] [--icl-tasks SPECS.json]

Lengths default to multiples of the training length, the run's data.seq_len (quick: 1x 4x
16x; full: 1x 2x 4x 8x 16x); YaRN factors and the report's labels use the same length.
The report goes to <first workdir>/eval/ unless --out is given.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

SUITES = {
    "quick": {"multiples": (1, 4, 16), "ppl_tokens": 8192, "ruler_multiples": (4, 16),
              "ruler_tasks": ("niah_single_1", "niah_multikey_1", "vt", "cwe"),
              "ruler_samples": 2, "icl_samples": 8, "icl_shots": (0, 2, 8),
              "icl_length_multiples": (1, 2)},
    "full": {"multiples": (1, 2, 4, 8, 16), "ppl_tokens": 65536, "ruler_multiples": (4, 8, 16),
             "ruler_tasks": None, "ruler_samples": 5, "icl_samples": 32,
             "icl_shots": (0, 1, 2, 4, 8), "icl_length_multiples": (1, 2, 4)},
}
TASKS = ("ppl", "ruler", "icl")


def parse_args(argv):
  p = argparse.ArgumentParser(prog="rove-eval", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", required=True, help="a training workdir (checkpoints/ inside)")
  p.add_argument("--compare", nargs="*", default=[], help="more workdirs for the same tables")
  p.add_argument("--suite", choices=tuple(SUITES), default="quick")
  p.add_argument("--lengths", help="comma-separated token counts (default: suite multiples of "
                                   "the training length)")
  p.add_argument("--yarn", choices=("off", "on", "both"), default="both")
  p.add_argument("--tasks", default="ppl,ruler,icl")
  p.add_argument("--out", help="report directory (default: WORKDIR/eval)")
  p.add_argument("--data-path", help="score perplexity on this text/parquet source instead of "
                                     "the run's held-out split")
  p.add_argument("--stride", type=float, help="sliding-window perplexity with stride = "
                                              "fraction of the length (default: non-overlapping)")
  p.add_argument("--squad", help="local SQuAD dev JSON for RULER qa_1")
  p.add_argument("--hotpot", help="local HotpotQA dev JSON for RULER qa_2")
  p.add_argument("--icl-tasks", help="JSON list of ICL task specs (LLM-Foundry JSONL files)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--chunk", type=int, default=512, help="attention block length")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
  bad = [t for t in args.task_list if t not in TASKS]
  if bad:
    p.error(f"unknown --tasks {bad}; choose from {TASKS}")
  if args.lengths:
    try:
      args.lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
      p.error(f"--lengths must be comma-separated integers, got {args.lengths!r}")
    if any(L < 2 for L in args.lengths):
      p.error("--lengths must be >= 2 tokens")
  return args


def evaluate_run(run, args, suite) -> dict:
  from rove_jax.evaluation import perplexity, scoring
  from rove_jax.model import FROM_CONFIG, param_count
  progress = not args.no_progress
  train_len = run.train_len  # the one training length: lengths, YaRN factors, labels
  lengths = args.lengths or [m * train_len for m in suite["multiples"]]
  scorer = scoring.Scorer(run, implementation="chunked", chunk_size=args.chunk)
  for L in lengths:  # before any work: a learned-position model cannot go past its table
    scorer.check_length(L)
  cfg = run.model_config
  result = {"name": run.name, "workdir": run.workdir, "step": run.step,
            "model": {"pos_encoding": cfg.pos_encoding, "params": int(param_count(cfg)),
                      "n_layer": cfg.n_layer, "d_model": cfg.d_model, "n_head": cfg.n_head,
                      "max_len": cfg.max_len, "train_len": train_len},
            "perplexity": None, "ruler": None, "icl": None, "seconds": {}}
  if "ppl" in args.task_list:
    t0 = time.perf_counter()
    if args.data_path:
      from rove_jax import data as data_lib
      source = "parquet" if args.data_path.endswith(".parquet") else "text"
      corpus = data_lib.Corpus(source=source, path=args.data_path)
      tokens = data_lib.load_tokens(corpus, "train", run.tokenizer)
    else:
      tokens = run.val_tokens()
    result["perplexity"] = perplexity.evaluate(
        scorer, tokens, lengths, yarn=args.yarn, max_tokens=suite["ppl_tokens"],
        stride_fraction=args.stride, progress=progress)
    result["seconds"]["perplexity"] = time.perf_counter() - t0
  if "ruler" in args.task_list:
    from rove_jax.evaluation import ruler
    t0 = time.perf_counter()
    tasks = suite["ruler_tasks"] or ruler.TASKS
    r_lengths = [m * train_len for m in suite["ruler_multiples"]]
    if cfg.pos_encoding == "learned":
      r_lengths = [L for L in r_lengths if L <= cfg.max_len] or [cfg.max_len]
    haystack = _haystack_texts(run)
    merged = {"tasks": {}, "skipped": {}, "yarn": args.yarn != "off" and scorer.rotary}
    for L in r_lengths:
      # YaRN past the training length unless --yarn off (the run's own setting otherwise).
      scaling = scorer.yarn_scaling(L) if args.yarn != "off" and scorer.rotary else None
      fn = scorer.score_fn(FROM_CONFIG if scaling is None else scaling)
      for task in tasks:
        try:
          res = ruler.evaluate(fn, run.tokenizer, tasks=[task], lengths=[L],
                               samples_per_task=suite["ruler_samples"], seed=args.seed,
                               haystack_texts=haystack, squad_path=args.squad,
                               hotpot_path=args.hotpot, progress=progress)
        except ValueError as e:  # e.g. a length below the task's fixed parts
          merged["skipped"][f"{task}@{L}"] = str(e)
          continue
        for name, rows in res["tasks"].items():
          merged["tasks"].setdefault(name, {}).update(rows)
        merged["skipped"].update(res.get("skipped", {}))
    result["ruler"] = merged
    result["seconds"]["ruler"] = time.perf_counter() - t0
  if "icl" in args.task_list:
    from rove_jax.evaluation import icl
    t0 = time.perf_counter()
    fn = scorer.score_fn()
    lengths_icl = tuple(m * train_len for m in suite["icl_length_multiples"])
    if cfg.pos_encoding == "learned":
      lengths_icl = tuple(L for L in lengths_icl if L <= cfg.max_len) or (cfg.max_len,)
    synthetic = {"tasks": {}, "skipped": {}}
    for task in icl.synthetic_tasks():
      try:
        res = icl.run_synthetic(fn, run.tokenizer, tasks=[task], shots=suite["icl_shots"],
                                lengths=lengths_icl, samples=suite["icl_samples"],
                                seed=args.seed, progress=progress)
      except ValueError as e:  # e.g. a passkey context shorter than its fixed text
        synthetic["skipped"][task] = str(e)
        continue
      synthetic["tasks"].update(res["tasks"])
    accs = [t["accuracy"] for t in synthetic["tasks"].values()]
    synthetic["accuracy"] = float(sum(accs) / len(accs)) if accs else 0.0
    files = None
    if args.icl_tasks:
      specs = icl.load_specs(args.icl_tasks)
      files = icl.run_task_files(fn, run.tokenizer, specs, seed=args.seed, progress=progress,
                                 max_tokens=cfg.max_len if cfg.pos_encoding == "learned" else None)
    result["icl"] = {"synthetic": synthetic, "files": files}
    result["seconds"]["icl"] = time.perf_counter() - t0
  return result


def _haystack_texts(run, max_chars: int = 400_000):
  """Essay-style haystack text: documents of the run's held-out split."""
  tokens = run.val_tokens()
  text = run.tokenizer.decode(tokens[: max_chars])
  return [t for t in text.split(run.tokenizer.decode([run.tokenizer.eot_id])) if t.strip()] or [text]


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  from rove_jax.evaluation import report as report_lib
  from rove_jax.evaluation import scoring
  suite = SUITES[args.suite]
  workdirs = [args.workdir, *args.compare]
  try:
    runs = [scoring.load_run(w) for w in workdirs]  # every run restorable before any scoring
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  results = []
  try:
    for run in runs:
      print(f"== {run.name}: {run.model_config.pos_encoding}, step {run.step}", file=sys.stderr)
      results.append(evaluate_run(run, args, suite))
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  rep = {"schema_version": report_lib.SCHEMA_VERSION, "suite": args.suite,
         "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "runs": results}
  out_dir = args.out or os.path.join(runs[0].workdir, "eval")
  figure1 = None
  first = runs[0]
  if first.model_config.pos_encoding in ("rove", "rope"):
    from flax import nnx

    from rove_jax.model import GPT
    model = nnx.merge(nnx.graphdef(nnx.eval_shape(lambda: GPT(first.model_config,
                                                              rngs=nnx.Rngs(0)))), first.params)
    sample = first.val_tokens()[:12]
    figure1 = (model, sample, f"{first.name}: layer 0, head 0, {len(sample)} held-out tokens")
  paths = report_lib.write(rep, out_dir, figure1=figure1)
  print(report_lib.markdown(rep))
  print(f"\nwrote {', '.join(sorted(paths.values()))}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
