"""The report.json schema (below) and its validation; the writers import it: report_md
(report.md), plots (the PNGs) and report_files (the report directory).

report.json, schema_version 2:
  {"schema_version": 2, "suite": str, "created": ISO time, "runs": [RUN, ...]}
  RUN = {"name": str, "workdir": str, "step": int,
         "model": {"pos_encoding": str, "params": int, "n_layer": int, "d_model": int,
                   "n_head": int, "max_len": int, "train_len": int},
         "perplexity": null | PERPLEXITY, "ruler": null | RULER, "icl": null | ICL,
         "recall": null | RECALL (optional),
         "seconds": {"perplexity": float, "ruler": float, "icl": float, "recall": float}}
  PERPLEXITY = {"protocol": {"mode": "non-overlapping" | "sliding", "stride_fraction",
                             "max_tokens", "train_len", "n_buckets", "yarn_factor": str,
                             "yarn_fixed_factor": float | null,
                             "text": the --data-path scored | null (the run's held-out split)},
                SETTING: {LENGTH: PPL_ROW} | {"not_applicable": str}, ...}
    SETTING: "none" (as trained), "yarn" (factor L / train_len for L > train_len),
      "yarn_fixed" (one factor, protocol.yarn_fixed_factor, at every length); the ones
      --yarn asked for (off: none; on: yarn; both: none, yarn; all: the three).
    PPL_ROW = {"loss": float, "ppl": float, "tokens": int, "windows": int,
               "by_position": [float | null], "window_nll": [float], "window_tokens": [int]}
      window_nll[i]: window i's summed target NLL (6 significant digits); window_tokens[i]: its
      targets; one entry per window, so loss = sum(window_nll) / sum(window_tokens).
  RULER = {"protocol": {"samples", "seed", "lengths": [int], "train_len", "yarn_factor": str},
           "settings": {"none" | "yarn": {"tasks": {TASK: {LENGTH: RULER_ROW}}}
                                         | {"not_applicable": str}},
           "skipped": {TASK or "TASK@LENGTH": reason}}
    "yarn": YaRN with factor L / train_len at each length L. Settings by --yarn: off none; on
      yarn; both and all none and yarn. A non-rotary encoding is always scored under "none",
      and "yarn" is {"not_applicable": why} when asked. Both settings score the same samples.
    RULER_ROW = {"nll": mean answer NLL, "exact_match": fraction, "n": int, "correct": int,
                 "sample_nll": [n floats], "sample_correct": [n of 0 | 1]}
  ICL = {"protocol": {"context": train_len, "lengths": [int], "samples", "shots": [int], "seed",
                      "rule": str},
         "synthetic": {"tasks": {TASK: SYNTHETIC_ROW}, "skipped": {TASK: reason},
                       "accuracy": mean over tasks, "prompts": int, "truncated": int},
         "files": null | {"tasks": {TASK: {"accuracy", "centered", "baseline", "n", "kind",
                                           "num_fewshot", "prompts", "truncated"}},
                          "core": float | null, "prompts": int, "truncated": int}}
    SYNTHETIC_ROW = {"by_AXIS": {V: accuracy}, "nll_by_AXIS": {V: mean answer NLL},
                     "sample_nll_by_AXIS": {V: [floats]}, "sample_correct_by_AXIS": {V: [0 | 1]},
                     "accuracy": mean over V, "n": int, "correct": int, "prompts": int,
                     "truncated": int}, AXIS "length" (V = str(tokens)) or "shots" (V = str(k)).
    prompts / truncated: prompt-answer pairs scored / cut from the left to fit the context.
  RECALL = {"protocol": {"task": the generator spec (data.path), "samples", "seed",
                         "lengths": [int], "train_len"},
            "records": [RECALL_ROW]}: a run trained on data.source=recall, on its own task
    RECALL_ROW = {"encoding", "seed", "setting": "none" | "yarn" | "yarn_fixed", "length",
                  "multiple", "rope_scaling": dict | null, "n", "accuracy", "nll",
                  "sample_correct": [n of 0 | 1], "sample_nll": [n floats]}
      (rove_jax.evaluation.recall.evaluate's records; the same samples for every run).
  LENGTH keys are decimal strings of token counts; every number is finite. Per-unit lists are
  in unit order (window, sample), the same for every run given the data and the seed.

Version 1 reports (no per-unit records, RULER without settings) are refused by `validate`;
report_md still renders them (`train_len` and `ruler_settings` read both versions).
"""

from __future__ import annotations

import math

from rove_jax import checks

SCHEMA_VERSION = 2
PPL_SETTINGS = ("none", "yarn", "yarn_fixed")
RULER_SETTINGS = ("none", "yarn")


# ----------------------------------------------------------------------------- validation


def validate(report: dict) -> None:
  """Raises ValueError naming the first place where `report` breaks the schema."""
  version = need(report, "schema_version", int, "report")
  if version == 1:
    raise ValueError(
      "report: schema_version 1 is the layout before per-window and per-sample "
      "records, yarn_fixed and RULER's YaRN settings; this reader needs "
      f"schema_version {SCHEMA_VERSION}: rerun rove-eval to rewrite the report"
    )
  if version != SCHEMA_VERSION:
    raise ValueError(f"report: schema_version must be {SCHEMA_VERSION}, got {version}")
  need(report, "suite", str, "report")
  for i, run in enumerate(need(report, "runs", list, "report")):
    w = f"runs[{i}]"
    need(run, "name", str, w)
    need(run, "step", int, w)
    model = need(run, "model", dict, w)
    need(model, "pos_encoding", str, w + ".model")
    for key in ("params", "n_layer", "d_model", "n_head", "max_len"):
      need(model, key, int, w + ".model")
    if "train_len" in model:
      need(model, "train_len", int, w + ".model")
    ppl = need(run, "perplexity", (dict, type(None)), w)
    if ppl is not None:
      _validate_perplexity(ppl, w + ".perplexity")
    ruler = need(run, "ruler", (dict, type(None)), w)
    if ruler is not None:
      _validate_ruler(ruler, w + ".ruler")
    rec = run.get("recall")
    if rec is not None:
      need(rec, "protocol", dict, w + ".recall")
      for j, row in enumerate(need(rec, "records", list, w + ".recall")):
        for key in ("accuracy", "nll"):
          finite(need(row, key, None, f"{w}.recall.records[{j}]"), f"{w}.recall.{key}")
    icl = need(run, "icl", (dict, type(None)), w)
    if icl is not None and icl.get("synthetic") is not None:
      synth = icl["synthetic"]
      finite(need(synth, "accuracy", None, w + ".icl.synthetic"), w + ".icl.synthetic.accuracy")
      for task, row in need(synth, "tasks", dict, w + ".icl.synthetic").items():
        finite(
          need(row, "accuracy", None, f"{w}.icl.synthetic.{task}"),
          f"{w}.icl.synthetic.{task}.accuracy",
        )


def need(obj, key, kind, where):
  """obj[key], which must exist and (unless kind is None) be an instance of kind."""
  if not isinstance(obj, dict) or key not in obj:
    raise ValueError(f"report: {where} lacks {key!r}")
  if kind is not None and not isinstance(obj[key], kind):
    raise ValueError(f"report: {where}.{key} must be {kind}, got {type(obj[key]).__name__}")
  return obj[key]


def finite(x, where) -> None:
  """Raises unless x is a finite int or float (not a bool)."""
  if not checks.is_finite(x, numpy=False):
    raise ValueError(f"report: {where} must be a finite number, got {x!r}")


def _validate_perplexity(ppl: dict, w: str) -> None:
  need(ppl, "protocol", dict, w)
  for setting in PPL_SETTINGS:
    rows = ppl.get(setting)
    if rows is None or "not_applicable" in rows:
      continue
    for length, row in rows.items():
      where = f"{w}.{setting}.{length}"
      if not length.isdigit():
        raise ValueError(f"report: {w}.{setting} key {length!r} is not a length")
      for key in ("loss", "ppl"):
        finite(need(row, key, None, where), f"{where}.{key}")
      tokens = need(row, "tokens", int, where)
      nll, counts = need(row, "window_nll", list, where), need(row, "window_tokens", list, where)
      if len(nll) != len(counts) or sum(counts) != tokens:
        raise ValueError(
          f"report: {where}: window_nll and window_tokens must have one entry a "
          f"window and window_tokens must sum to tokens={tokens}"
        )
      for j, x in enumerate(nll):
        finite(x, f"{where}.window_nll[{j}]")
      if tokens and not math.isclose(sum(nll) / tokens, row["loss"], rel_tol=1e-4):
        raise ValueError(f"report: {where}: sum(window_nll) / tokens is not the loss")


def _validate_ruler(ruler: dict, w: str) -> None:
  need(ruler, "skipped", dict, w)
  for setting, entry in need(ruler, "settings", dict, w).items():
    if setting not in RULER_SETTINGS:
      raise ValueError(f"report: {w}.settings has {setting!r}; settings are {RULER_SETTINGS}")
    if "not_applicable" in entry:
      continue
    for task, by_len in need(entry, "tasks", dict, f"{w}.settings.{setting}").items():
      for length, row in by_len.items():
        where = f"{w}.settings.{setting}.tasks.{task}.{length}"
        finite(need(row, "nll", None, where), where + ".nll")
        em = need(row, "exact_match", None, where)
        finite(em, where + ".exact_match")
        if not 0 <= em <= 1:
          raise ValueError(f"report: {where}.exact_match must be in [0, 1]")
        n = need(row, "n", int, where)
        nll, right = need(row, "sample_nll", list, where), need(row, "sample_correct", list, where)
        if len(nll) != n or len(right) != n or any(c not in (0, 1) for c in right):
          raise ValueError(
            f"report: {where}: sample_nll and sample_correct need n={n} entries, "
            f"sample_correct of 0 or 1"
          )
        for j, x in enumerate(nll):
          finite(x, f"{where}.sample_nll[{j}]")
        if need(row, "correct", int, where) != sum(right):
          raise ValueError(f"report: {where}.correct must be sum(sample_correct)")


# -------------------------------------------------------------------------------- reading


def train_len(run: dict) -> int:
  """The length a report's run was trained on (data.seq_len; reports written before it was
  recorded ran with seq_len == max_len)."""
  model = run["model"]
  return model.get("train_len", model["max_len"])


def ruler_settings(ruler: dict) -> dict:
  """A RULER entry's {setting: {"tasks": ...} or {"not_applicable": why}}; a version-1 entry
  (one "tasks" map, "yarn": whether YaRN was used) as its one setting."""
  if "settings" in ruler:
    return ruler["settings"]
  return {"yarn" if ruler.get("yarn") else "none": {"tasks": ruler.get("tasks", {})}}
