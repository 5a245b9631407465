"""report.json (schema below), report.md (the paper's table layout) and PNG plots.

report.json, schema_version 1:
  {"schema_version": 1, "suite": str, "created": ISO time, "runs": [RUN, ...]}
  RUN = {"name": str, "workdir": str, "step": int,
         "model": {"pos_encoding": str, "params": int, "n_layer": int, "d_model": int,
                   "n_head": int, "max_len": int, "train_len": int (optional)},
         "perplexity": null | {"protocol": {...},
                               "none": {LENGTH: {"loss", "ppl", "tokens", "windows",
                                                 "by_position": [float | null]}},
                               "yarn": {LENGTH: {...}} | {"not_applicable": str}},
         "ruler": null | {"tasks": {TASK: {LENGTH: {"nll", "exact_match", "n"}}},
                          "skipped": {TASK: reason}},
         "icl": null | {"synthetic": {"tasks": {TASK: {...}}, "accuracy": float},
                        "files": null | {"tasks": {...}, "core": float | null}},
         "seconds": {"perplexity": float, "ruler": float, "icl": float}}
  LENGTH keys are decimal strings of token counts; every number is finite.

`write` replaces report.json, report.md and the plots (PLOT_FILES, drawn by plots.py)
atomically, removes plots of an earlier report that it did not draw, and lists exactly the
plots drawn in report.md. `replace_files` is the package's atomic multi-file writer.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from typing import Optional, Union

import numpy as np

SCHEMA_VERSION = 1
# The plot files `write` draws, by key of its returned paths (the only files it ever removes).
PLOT_FILES = {"perplexity": "perplexity_vs_length.png", "ruler": "ruler_nll.png",
              "icl": "icl_accuracy.png", "figure1": "figure1_mixer.png"}


# ----------------------------------------------------------------------------- validation


def validate(report: dict) -> None:
  """Raises ValueError naming the first place where `report` breaks the schema."""
  def need(obj, key, kind, where):
    if not isinstance(obj, dict) or key not in obj:
      raise ValueError(f"report: {where} lacks {key!r}")
    if kind is not None and not isinstance(obj[key], kind):
      raise ValueError(f"report: {where}.{key} must be {kind}, got {type(obj[key]).__name__}")
    return obj[key]

  def finite(x, where):
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
      raise ValueError(f"report: {where} must be a finite number, got {x!r}")

  if need(report, "schema_version", int, "report") != SCHEMA_VERSION:
    raise ValueError(f"report: schema_version must be {SCHEMA_VERSION}")
  need(report, "suite", str, "report")
  for i, run in enumerate(need(report, "runs", list, "report")):
    w = f"runs[{i}]"
    need(run, "name", str, w)
    need(run, "step", int, w)
    model = need(run, "model", dict, w)
    for key in ("pos_encoding",):
      need(model, key, str, w + ".model")
    for key in ("params", "n_layer", "d_model", "n_head", "max_len"):
      need(model, key, int, w + ".model")
    if "train_len" in model:
      need(model, "train_len", int, w + ".model")
    ppl = need(run, "perplexity", (dict, type(None)), w)
    if ppl is not None:
      need(ppl, "protocol", dict, w + ".perplexity")
      for setting in ("none", "yarn"):
        rows = ppl.get(setting)
        if rows is None or "not_applicable" in rows:
          continue
        for length, row in rows.items():
          if not length.isdigit():
            raise ValueError(f"report: {w}.perplexity.{setting} key {length!r} is not a length")
          for key in ("loss", "ppl"):
            finite(need(row, key, None, f"{w}.perplexity.{setting}.{length}"),
                   f"{w}.perplexity.{setting}.{length}.{key}")
          need(row, "tokens", int, f"{w}.perplexity.{setting}.{length}")
    ruler = need(run, "ruler", (dict, type(None)), w)
    if ruler is not None:
      for task, by_len in need(ruler, "tasks", dict, w + ".ruler").items():
        for length, row in by_len.items():
          where = f"{w}.ruler.{task}.{length}"
          finite(need(row, "nll", None, where), where + ".nll")
          em = need(row, "exact_match", None, where)
          finite(em, where + ".exact_match")
          if not 0 <= em <= 1:
            raise ValueError(f"report: {where}.exact_match must be in [0, 1]")
    icl = need(run, "icl", (dict, type(None)), w)
    if icl is not None:
      synth = icl.get("synthetic")
      if synth is not None:
        finite(need(synth, "accuracy", None, w + ".icl.synthetic"), w + ".icl.synthetic.accuracy")


# ------------------------------------------------------------------------------- markdown


def _fmt(x, digits=2):
  return "-" if x is None else f"{x:.{digits}f}"


def train_len(run: dict) -> int:
  """The length a report's run was trained on (data.seq_len; reports written before it was
  recorded ran with seq_len == max_len)."""
  model = run["model"]
  return model.get("train_len", model["max_len"])


def markdown(report: dict, plots: Optional[list] = None) -> str:
  """The report's tables as Markdown; `plots` (file names, see `drawn_plots`) are listed at
  the end, None leaves the list out."""
  runs = report["runs"]
  lines = [f"# Evaluation report ({report['suite']} suite)", ""]
  lines.append("| run | encoding | params | step | train length |")
  lines.append("|---|---|---|---|---|")
  for r in runs:
    m = r["model"]
    lines.append(f"| {r['name']} | {m['pos_encoding']} | {m['params'] / 1e6:.1f}M | {r['step']} "
                 f"| {train_len(r)} |")
  ppl_runs = [r for r in runs if r.get("perplexity")]
  if ppl_runs:
    lengths = sorted({int(L) for r in ppl_runs for s in ("none", "yarn")
                      for L in (r["perplexity"].get(s) or {}) if L.isdigit()})
    proto = ppl_runs[0]["perplexity"]["protocol"]
    lines += ["", "## Perplexity by evaluation length",
              "", f"Protocol: {proto['mode']} windows, up to {proto['max_tokens']} target tokens "
              f"per length on the held-out split; YaRN factor = L / {proto['train_len']} for "
              f"longer L. Rows = runs, columns = lengths (tokens).", ""]
    lines.append("| run | YaRN | " + " | ".join(str(L) for L in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for r in ppl_runs:
      for setting in ("none", "yarn"):
        rows = r["perplexity"].get(setting)
        if rows is None:
          continue
        if "not_applicable" in rows:
          lines.append(f"| {r['name']} | {setting} | n/a: {rows['not_applicable']} |")
          continue
        cells = [_fmt(rows.get(str(L), {}).get("ppl")) for L in lengths]
        lines.append(f"| {r['name']} | {'+YaRN' if setting == 'yarn' else '-'} | "
                     + " | ".join(cells) + " |")
  ruler_runs = [r for r in runs if r.get("ruler")]
  if ruler_runs:
    tasks = sorted({t for r in ruler_runs for t in r["ruler"]["tasks"]})
    lengths = sorted({int(L) for r in ruler_runs for t in r["ruler"]["tasks"].values() for L in t})
    lines += ["", "## RULER: NLL of the gold answer (lower is better) / exact match", ""]
    for L in lengths:
      lines += [f"Length {L} tokens:", ""]
      lines.append("| run | " + " | ".join(tasks) + " | mean |")
      lines.append("|---|" + "---|" * (len(tasks) + 1))
      for r in ruler_runs:
        cells, nlls = [], []
        for t in tasks:
          row = r["ruler"]["tasks"].get(t, {}).get(str(L))
          if row is None:
            cells.append("-")
          else:
            nlls.append(row["nll"])
            cells.append(f"{row['nll']:.2f} / {row['exact_match']:.2f}")
        lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {_fmt(np.mean(nlls) if nlls else None)} |")
      lines.append("")
    skipped = {t: why for r in ruler_runs for t, why in r["ruler"].get("skipped", {}).items()}
    for t, why in sorted(skipped.items()):
      lines.append(f"- {t}: skipped ({why})")
  icl_runs = [r for r in runs if r.get("icl") and r["icl"].get("synthetic")]
  if icl_runs:
    tasks = sorted({t for r in icl_runs for t in r["icl"]["synthetic"]["tasks"]})
    lines += ["", "## In-context learning (synthetic tasks, greedy exact match)", ""]
    lines.append("| run | " + " | ".join(tasks) + " | mean |")
    lines.append("|---|" + "---|" * (len(tasks) + 1))
    for r in icl_runs:
      t_rows = r["icl"]["synthetic"]["tasks"]
      cells = [_fmt(t_rows.get(t, {}).get("accuracy")) for t in tasks]
      lines.append(f"| {r['name']} | " + " | ".join(cells)
                   + f" | {_fmt(r['icl']['synthetic']['accuracy'])} |")
    core = [(r["name"], r["icl"]["files"].get("core")) for r in icl_runs if r["icl"].get("files")]
    for name, value in core:
      lines.append(f"\nCore (centered accuracy, task files) for {name}: {_fmt(value, 3)}")
  if plots is not None:
    lines += ["", "Plots: " + (", ".join(plots) if plots else "none (nothing to plot)")]
  lines.append("")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------- files


def _write_data(f, data: Union[str, bytes], path: str) -> None:
  """Writes the contents meant for `path` to its temporary file f (a seam for tests)."""
  f.write(data)


def replace_files(files: dict) -> None:
  """Writes {path: str or bytes} so that each path holds either its old or its new contents.

  Every file is written to a temporary file in its own directory and flushed to disk first;
  only then are they moved over their paths with os.replace. On any error the temporary
  files are removed and nothing has been replaced.
  """
  umask = os.umask(0)
  os.umask(umask)
  temps = {}
  try:
    for path, data in files.items():
      directory, name = os.path.split(os.path.abspath(path))
      fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
      temps[path] = tmp
      os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
      binary = isinstance(data, bytes)
      with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
        _write_data(f, data, path)
        f.flush()
        os.fsync(f.fileno())
    for path, tmp in temps.items():
      os.replace(tmp, path)
  except BaseException:
    for tmp in temps.values():
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    raise


def drawn_plots(paths: dict) -> list:
  """The plot file names among `write`'s returned paths, in PLOT_FILES order."""
  return [PLOT_FILES[key] for key in PLOT_FILES if key in paths]


def write(report: dict, out_dir: str, *, figure1=None) -> dict:
  """Validates and writes report.json, report.md and the plots.

  Everything is rendered in memory, then replaced together (`replace_files`): a failure
  leaves the previous report and plots as they were. Then the PLOT_FILES this report did not
  draw are removed (no other file), so out_dir's plots are those report.md lists.

  Args:
    report: the report (validated first).
    out_dir: the report directory (created if missing).
    figure1: (model, tokens, title) for `plots.figure1`, or None.

  Returns:
    {"json": path, "md": path, and a path per plot drawn, keyed as in PLOT_FILES}.
  """
  from rove_jax.evaluation import plots  # matplotlib and the model code, only when drawing
  validate(report)
  text = json.dumps(report, indent=2)
  images = {key: fn(report) for key, fn in (("perplexity", plots.perplexity),
                                           ("ruler", plots.ruler), ("icl", plots.icl))}
  if figure1 is not None:
    model, tokens, title = figure1
    images["figure1"] = plots.figure1(model, tokens, title=title)
  images = {key: data for key, data in images.items() if data is not None}
  os.makedirs(out_dir, exist_ok=True)
  paths = {"json": os.path.join(out_dir, "report.json"), "md": os.path.join(out_dir, "report.md")}
  paths.update({key: os.path.join(out_dir, PLOT_FILES[key]) for key in images})
  files = {paths[key]: data for key, data in images.items()}
  files[paths["md"]] = markdown(report, plots=drawn_plots(paths))
  files[paths["json"]] = text  # last: report.json is what other tools read
  replace_files(files)
  for key in PLOT_FILES.keys() - images.keys():
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(out_dir, PLOT_FILES[key]))
  return paths
