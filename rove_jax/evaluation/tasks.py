"""The tasks rove-eval runs on one restored run, each into its report.json entry (report.py's
schema): perplexity against length, RULER (answer NLL), in-context learning, and, for a run
trained on a synthetic recall task, that task's accuracy and answer NLL against length.

`evaluate_run(run, config)` runs the tasks of an EvalConfig (rove_jax.evaluation.config, which
rove-eval builds from its command line) with the sizes of its suite, keeping each result in a
partial-results file as it comes when given one (rove_jax.evaluation.partial); `check_run` is
what it checks before any work.
"""

from __future__ import annotations

import hashlib
import time
from typing import Optional

from rove_jax import data as data_lib
from rove_jax.evaluation import icl, perplexity, prompting, recall, scoring
from rove_jax.evaluation import partial as partial_lib
from rove_jax.evaluation.config import SUITES, EvalConfig
from rove_jax.evaluation.ruler import suite as ruler
from rove_jax.nn.model import param_count

# RULER's QA tasks read local dev files; without one a task is reported as skipped.
QA_FLAGS = {
  "qa_1": ("--squad", "squad", "SQuAD", "dev-v2.0.json"),
  "qa_2": ("--hotpot", "hotpot", "HotpotQA", "hotpot_dev_distractor_v1.json"),
}
# The ICL rule, as the report states it.
ICL_CONTEXT_RULE = (
  "every prompt is scored inside the training context of {T} tokens: a prompt "
  "whose prompt + answer exceeds {T} tokens is cut from the left to fit "
  "(keeping the question and the nearest shots), for every encoding alike; "
  "no YaRN"
)

# Each task's entry in a run's report.
_REPORT_KEYS = {"ppl": "perplexity", "ruler": "ruler", "icl": "icl", "recall": "recall"}
RECALL_SETTINGS = {
  "off": ("none",),
  "on": ("yarn",),
  "both": ("none", "yarn"),
  "all": recall.SETTINGS,
}  # by --yarn


def check_run(run, config: EvalConfig, suite: Optional[dict] = None) -> None:
  """Raises ValueError, naming the run and the fix, when a task of `config` cannot score `run`:
  a length past a learned-position table, or the recall task on a run not trained on it.
  rove-eval checks every run before it scores any."""
  suite = SUITES[config.suite] if suite is None else suite
  lengths = list(config.lengths or suite_lengths(suite["multiples"], run.train_len))
  for L in lengths:
    scoring.check_length(run, L)
  if "recall" in config.tasks:
    recall.run_spec(run)
    for L in config.recall_lengths or lengths:
      scoring.check_length(run, L - 1)


def evaluate_run(
  run, config: EvalConfig, suite: Optional[dict] = None, partial=None, log=None
) -> dict:
  """One run's report entry (report.py's RUN) for the tasks of `config`.

  Args:
    run: a scoring.Run (or what evaluation.imported loads).
    config: what to evaluate and how.
    suite: the task sizes; None: SUITES[config.suite] (a dict of the same keys with smaller
      sizes serves tests).
    partial: an evaluation.partial.Partial: each task's result is stored in it as it finishes,
      and a task it already holds for this run is taken from it, not measured again.
    log: where the line naming the tasks taken from `partial` goes (None: nowhere).
  """
  suite = SUITES[config.suite] if suite is None else suite
  train_len = run.train_len  # the one training length: lengths, YaRN factors, labels
  lengths = list(config.lengths or suite_lengths(suite["multiples"], train_len))
  check_run(run, config, suite)  # before any work
  key = done = None
  if partial is not None:
    key = partial_lib.run_key(run)
    done, seconds = partial.finished(key), partial.seconds(key)
    reused = [t for t in config.tasks if _REPORT_KEYS[t] in done]
    if reused and log is not None:
      log(f"   {', '.join(reused)}: measured before, read back from {partial.path}")
  scorer = scoring.Scorer(run, implementation="chunked", chunk_size=config.chunk)
  cfg = run.model_config
  result = {
    "name": run.name,
    "workdir": run.workdir,
    "step": run.step,
    "model": {
      "pos_encoding": cfg.pos_encoding,
      "params": int(param_count(cfg)),
      "n_layer": cfg.n_layer,
      "d_model": cfg.d_model,
      "n_head": cfg.n_head,
      "max_len": cfg.max_len,
      "train_len": train_len,
    },
    "perplexity": None,
    "ruler": None,
    "icl": None,
    "recall": None,
    "seconds": {},
  }
  for task, fn in (("ppl", _perplexity), ("ruler", _ruler), ("icl", _icl), ("recall", _recall)):
    if task not in config.tasks:
      continue
    entry = _REPORT_KEYS[task]
    if done and entry in done:
      result[entry], result["seconds"][entry] = done[entry], seconds.get(entry, 0.0)
      continue
    t0 = time.perf_counter()
    result[entry] = fn(run, scorer, config, suite, lengths)
    result["seconds"][entry] = time.perf_counter() - t0
    if partial is not None:
      partial.record(key, entry, result[entry], result["seconds"][entry])
  return result


def suite_lengths(multiples, train_len: int) -> list:
  """int(m * train_len) for each multiple, in order, without repeats."""
  return list(dict.fromkeys(int(m * train_len) for m in multiples))


def _perplexity(run, scorer, config: EvalConfig, suite, lengths) -> dict:
  if config.data_path:
    source = "parquet" if config.data_path.endswith(".parquet") else "text"
    corpus = data_lib.Corpus(source=source, path=config.data_path)
    tokens = data_lib.load_tokens(corpus, "train", run.tokenizer)
  else:
    tokens = run.val_tokens()
  max_tokens = suite["ppl_tokens"] if config.ppl_tokens is None else config.ppl_tokens
  result = perplexity.evaluate(
    scorer,
    tokens,
    lengths,
    yarn=config.yarn,
    max_tokens=max_tokens,
    stride_fraction=config.stride,
    yarn_fixed_factor=config.yarn_fixed_factor,
    progress=config.progress,
  )
  result["protocol"]["text"] = config.data_path  # None: the run's held-out split
  return result


# RULER samples by (tokenizer fingerprint, haystack digest, --squad, --hotpot): runs that share
# them (every --compare run on one corpus and tokenizer) are scored on samples generated once.
_RULER_SAMPLES: dict = {}


def ruler_settings(yarn: str) -> tuple:
  """The RULER settings of --yarn: off "none", on "yarn", both and all "none" and "yarn"."""
  return {"off": ("none",), "on": ("yarn",)}.get(yarn, ("none", "yarn"))


def _ruler(run, scorer, config: EvalConfig, suite, lengths) -> dict:
  """report.py's RULER entry: every (task, length) cell under each setting, same samples."""
  cfg, train_len = run.model_config, run.train_len
  r_lengths = list(config.ruler_lengths or suite_lengths(suite["ruler_multiples"], train_len))
  if cfg.pos_encoding == "learned":
    r_lengths = [L for L in r_lengths if L <= cfg.max_len] or [cfg.max_len]
  wanted = ruler_settings(config.yarn)
  settings, fns = {}, {}
  if "none" in wanted or not scorer.rotary:  # YaRN has nothing to rescale: the run as trained
    fns["none"] = lambda L: scorer.score_fn()
  if "yarn" in wanted and scorer.rotary:
    fns["yarn"] = lambda L: scorer.score_fn(scorer.yarn_scaling(L))  # None: as trained
  elif "yarn" in wanted:
    settings["yarn"] = {
      "not_applicable": f"pos_encoding={cfg.pos_encoding!r} has no rotary frequencies to rescale"
    }
  settings = {**{name: {"tasks": {}} for name in fns}, **settings}
  out = {
    "protocol": {
      "samples": suite["ruler_samples"],
      "seed": config.seed,
      "lengths": r_lengths,
      "train_len": train_len,
      "yarn_factor": "L / train_len for L > train_len, else none",
    },
    "settings": settings,
    "skipped": {},
  }
  tasks = ruler_tasks(suite)
  for task in [t for t in tasks if t in QA_FLAGS and getattr(config, QA_FLAGS[t][1]) is None]:
    flag, _, name, example = QA_FLAGS[task]
    out["skipped"][task] = (
      f"needs {flag} FILE: a local {name} dev JSON file (e.g. {example}); none was given"
    )
  tasks = [t for t in tasks if t not in out["skipped"]]
  haystack = _haystack_texts(run)
  cache = _RULER_SAMPLES.setdefault(
    (
      run.tokenizer.fingerprint,
      hashlib.sha256("\0".join(haystack).encode()).hexdigest(),
      config.squad,
      config.hotpot,
    ),
    {},
  )
  for L in r_lengths:
    for task in tasks:
      try:
        res = ruler.evaluate_settings(
          fns,
          run.tokenizer,
          tasks=[task],
          lengths=[L],
          samples_per_task=suite["ruler_samples"],
          seed=config.seed,
          haystack_texts=haystack,
          squad_path=config.squad,
          hotpot_path=config.hotpot,
          progress=config.progress,
          sample_cache=cache,
        )
      except ValueError as e:  # e.g. a length below the task's fixed parts
        out["skipped"][f"{task}@{L}"] = str(e)
        continue
      for setting, got in res["settings"].items():
        for name, rows in got["tasks"].items():
          settings[setting]["tasks"].setdefault(name, {}).update(rows)
      out["skipped"].update(res["skipped"])
  return out


def _icl(run, scorer, config: EvalConfig, suite, lengths) -> dict:
  """report.py's ICL entry: synthetic tasks (and task files) inside the training context."""
  progress, train_len = config.progress, run.train_len
  fn = scorer.score_fn()
  icl_lengths = tuple(suite_lengths(suite["icl_length_multiples"], train_len))
  synthetic = {"tasks": {}, "skipped": {}}
  for task in icl.synthetic_tasks():
    fit = prompting.ContextFit(fn, train_len)
    try:
      res = icl.run_synthetic(
        fit,
        run.tokenizer,
        tasks=[task],
        shots=suite["icl_shots"],
        lengths=icl_lengths,
        samples=suite["icl_samples"],
        seed=config.seed,
        progress=progress,
      )
    except ValueError as e:  # e.g. a passkey context shorter than its fixed text
      synthetic["skipped"][task] = str(e)
      continue
    for row in res["tasks"].values():
      row.update(prompts=fit.prompts, truncated=fit.truncated)
    synthetic["tasks"].update(res["tasks"])
  rows = synthetic["tasks"].values()
  synthetic["accuracy"] = float(sum(t["accuracy"] for t in rows) / len(rows)) if rows else 0.0
  synthetic["prompts"] = sum(t["prompts"] for t in rows)
  synthetic["truncated"] = sum(t["truncated"] for t in rows)
  files = None
  specs = config.icl_specs
  if specs is None and config.icl_tasks:
    specs = icl.load_specs(config.icl_tasks)
  if specs:
    tasks = {}
    for spec in specs:  # one at a time: a count of cut prompts per task
      fit = prompting.ContextFit(fn, train_len)
      try:
        row = icl.run_task_files(fit, run.tokenizer, [spec], seed=config.seed, progress=progress)[
          "tasks"
        ][spec.name]
      except ValueError as e:  # e.g. an answer longer than the training context
        raise ValueError(f"ICL task {spec.name!r} ({spec.path}): {e}") from None
      tasks[spec.name] = {**row, "prompts": fit.prompts, "truncated": fit.truncated}
    files = {
      "tasks": tasks,
      "core": icl.core_score(tasks),
      "prompts": sum(t["prompts"] for t in tasks.values()),
      "truncated": sum(t["truncated"] for t in tasks.values()),
    }
  protocol = {
    "context": train_len,
    "lengths": list(icl_lengths),
    "samples": suite["icl_samples"],
    "shots": list(suite["icl_shots"]),
    "seed": config.seed,
    "rule": ICL_CONTEXT_RULE.format(T=train_len),
  }
  return {"protocol": protocol, "synthetic": synthetic, "files": files}


def ruler_tasks(suite: dict) -> tuple:
  """The RULER tasks of a suite (None: all of them, the QA tasks included)."""
  return tuple(suite["ruler_tasks"] or ruler.TASKS + ruler.QA_TASKS)


def _haystack_texts(run, max_chars: int = 400_000):
  """Essay-style haystack text: documents of the run's held-out split."""
  tokens = run.val_tokens()
  text = run.tokenizer.decode(tokens[:max_chars])
  eot = run.tokenizer.decode([run.tokenizer.eot_id])
  return [t for t in text.split(eot) if t.strip()] or [text]


def _recall(run, scorer, config: EvalConfig, suite, lengths) -> dict:
  """report.py's RECALL entry: a recall-trained run on its own task (the generator spec it was
  trained on, rove_jax.evaluation.recall) at --recall-lengths (default: the suite's lengths),
  the same test samples for every run, under the --yarn settings."""
  spec = recall.run_spec(run)  # ValueError for a run not trained on the recall source
  r_lengths = list(config.recall_lengths or lengths)
  n = suite["recall_samples"] if config.recall_samples is None else config.recall_samples
  samples = recall.test_set(spec, r_lengths, n, eot_id=run.tokenizer.eot_id, seed=config.seed)
  records = recall.evaluate(
    scorer, samples, settings=RECALL_SETTINGS[config.yarn], fixed_factor=config.yarn_fixed_factor
  )
  return {
    "protocol": {
      "task": spec.to_string(),
      "samples": n,
      "seed": config.seed,
      "lengths": [int(L) for L in r_lengths],
      "train_len": run.train_len,
    },
    "records": records,
  }
