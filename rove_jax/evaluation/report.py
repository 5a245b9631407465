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

`write` replaces report.json, report.md and the plots (PLOT_FILES) atomically, removes plots of
an earlier report that it did not draw, and lists exactly the plots drawn in report.md.
"""

from __future__ import annotations

import contextlib
import io
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


# ---------------------------------------------------------------------------------- plots


def _plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


Target = Union[str, io.BytesIO]  # a file path (written atomically) or an in-memory buffer


def _save(fig, target: Target, dpi: int) -> Target:
  """Saves a figure as PNG to `target` and closes it."""
  buf = io.BytesIO()
  try:
    fig.savefig(buf, format="png", dpi=dpi)
  finally:
    _plt().close(fig)
  if isinstance(target, str):
    replace_files({target: buf.getvalue()})
  else:
    target.write(buf.getvalue())
  return target


def plot_perplexity(report: dict, path: Target) -> Optional[Target]:
  runs = [r for r in report["runs"] if r.get("perplexity")]
  if not runs:
    return None
  plt = _plt()
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for r in runs:
    for setting, style in (("none", "-"), ("yarn", "--")):
      rows = r["perplexity"].get(setting)
      if not rows or "not_applicable" in rows:
        continue
      lengths = sorted(int(L) for L in rows)
      ax.plot(lengths, [rows[str(L)]["ppl"] for L in lengths], style, marker="o",
              label=f"{r['name']} ({r['model']['pos_encoding']}{' + YaRN' if setting == 'yarn' else ''})")
  ax.axvline(train_len(runs[0]), color="gray", lw=0.8, ls=":")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  ax.set_xlabel("evaluation length (tokens)")
  ax.set_ylabel("perplexity")
  ax.set_title("Perplexity vs length (dotted: training length)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  return _save(fig, path, 120)


def _bars(runs, tasks, value, path, *, ylabel, title, ylim=None) -> Target:
  """Grouped bars: one group per task, one bar per run."""
  plt = _plt()
  fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(tasks) * len(runs)), 4))
  width = 0.8 / len(runs)
  for i, r in enumerate(runs):
    ax.bar(np.arange(len(tasks)) + i * width, [value(r, t) for t in tasks], width,
           label=r["name"])
  ax.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2)
  ax.set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
  if ylim:
    ax.set_ylim(*ylim)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  ax.legend(fontsize=7)
  fig.tight_layout()
  return _save(fig, path, 120)


def plot_ruler(report: dict, path: Target) -> Optional[Target]:
  runs = [r for r in report["runs"] if r.get("ruler") and r["ruler"]["tasks"]]
  if not runs:
    return None
  tasks = sorted({t for r in runs for t in r["ruler"]["tasks"]})

  def mean_nll(r, t):
    rows = r["ruler"]["tasks"].get(t, {})
    return np.mean([row["nll"] for row in rows.values()]) if rows else np.nan

  return _bars(runs, tasks, mean_nll, path, ylabel="answer NLL (mean over lengths)",
               title="RULER")


def plot_icl(report: dict, path: Target) -> Optional[Target]:
  runs = [r for r in report["runs"] if r.get("icl") and r["icl"].get("synthetic")]
  if not runs:
    return None
  tasks = sorted({t for r in runs for t in r["icl"]["synthetic"]["tasks"]})
  accuracy = lambda r, t: r["icl"]["synthetic"]["tasks"].get(t, {}).get("accuracy", np.nan)
  return _bars(runs, tasks, accuracy, path, ylabel="accuracy",
               title="In-context learning (synthetic)", ylim=(0, 1))


def layer_attention(model, tokens_T, *, layer: int = 0, head: int = 0) -> dict:
  """What one head of a model does to a token sequence, read through the model's own code.

  The attention probabilities come from `Attention.weights` (the model's projections, rotary
  frequencies after the config's rope_scaling, attention factor, layout, T5 bias and mask),
  the value matrix from `Attention.value_projection`.

  Args:
    model: a rove_jax GPT.
    tokens_T: [T] token ids (positions 0..T-1).
    layer, head: which attention head.

  Returns:
    {"a": A [T, T] probabilities, "w_v": [D, E] value matrix (column-vector convention of
    rove_jax.analysis), "b_v": [D] or None, "x": [T, E] the layer's attention input,
    "inv_freq": [P] the frequencies the layer rotates with (for a non-rotary model, plain
    RoPE's of the whole head, to show what RoVE would do), "layout": the rotary layout}.
  """
  import jax.numpy as jnp

  from rove_jax import rotary
  cfg = model.config
  tokens = jnp.asarray(tokens_T, jnp.int32)[None]
  pos = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
  block = model.blocks[layer]
  x_BTE = block.norm1(model.embed_tokens(tokens, pos))
  ctx = model.context(pos)
  a_BHTS = block.attn.weights(x_BTE, ctx)
  w_EKD, b_KD = block.attn.value_projection()
  kv_head = head // (cfg.n_head // cfg.n_kv_head)
  inv_freq = ctx.inv_freq if ctx.inv_freq is not None else rotary.rope_frequencies(
      cfg.head_dim, base=cfg.rope_base)
  return {"a": np.asarray(a_BHTS[0, head], np.float32),
          "w_v": np.asarray(w_EKD[:, kv_head].T, np.float32),
          "b_v": None if b_KD is None else np.asarray(b_KD[kv_head], np.float32),
          "x": np.asarray(x_BTE[0], np.float32), "inv_freq": np.asarray(inv_freq),
          "layout": cfg.rope_layout}


def figure1_mixers(head_view: dict, *, pairs: Optional[int] = None,
                   features: Optional[int] = None) -> dict:
  """RoPE's mixer A (x) W_V and RoVE's [A_ij R_{j-i} W_V] for a `layer_attention` result.

  Args:
    head_view: the dict `layer_attention` returns.
    pairs: show only the head dims of the first (fastest-turning) `pairs` rotary pairs, taken
      whole in the model's layout (so each shown dim keeps its rotation partner); None: all D.
    features: show only the first `features` input features; None: all E.

  Returns:
    {"rope", "rove": [T * d, T * e] mixers, "dims": the d head dims shown}. With pairs and
    features None, y = mixer @ x.ravel() is the head's attention output (before the output
    projection; value bias aside) as [T, D] raveled.
  """
  from rove_jax import analysis
  a, w_v, inv = head_view["a"], head_view["w_v"], head_view["inv_freq"]
  n_pairs = len(inv)
  if pairs is None:
    dims = np.arange(w_v.shape[0])
  else:
    inv = inv[:min(pairs, n_pairs)]
    k = len(inv)
    dims = (np.arange(2 * k) if head_view["layout"] == "interleaved" else
            np.concatenate([np.arange(k), n_pairs + np.arange(k)]))
  w_v = w_v[dims][:, :features]
  pos = np.arange(a.shape[0])
  mix = lambda rove: np.asarray(analysis.mixer_matrix(a, w_v, pos, pos, inv, rove=rove,
                                                      layout=head_view["layout"]))
  return {"rope": mix(False), "rove": mix(True), "dims": dims}


def plot_figure1(model, tokens_T, path: Target, *, title: str, layer: int = 0,
                 head: int = 0) -> Target:
  """The paper's Figure 1 for a trained layer: RoPE's mixer A (x) W_V next to RoVE's
  block-Toeplitz mixer [A_ij R_{j-i} W_V], on the same attention weights."""
  plt = _plt()
  view = layer_attention(model, tokens_T, layer=layer, head=head)
  T = len(tokens_T)
  # The four fastest-turning rotary pairs against the first 8 input features: small enough to
  # see the per-token blocks, and where the rotations differ most.
  features = min(8, view["w_v"].shape[1])
  m = figure1_mixers(view, pairs=4, features=features)
  rope, rove, dims = m["rope"], m["rove"], len(m["dims"])
  fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
  vmax = float(np.percentile(np.abs(rope), 99.5)) or 1.0
  for ax, mat, name in ((axes[0], rope, "RoPE: A \u2297 W_V"),
                        (axes[1], rove, "RoVE: [A_ij R_{j-i} W_V] (block Toeplitz up to A)")):
    ax.imshow(mat, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel(f"input: {T} tokens x first {features} features")
    ax.set_ylabel(f"output: {T} tokens x {dims} head dims (first {dims // 2} rotary pairs)")
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return _save(fig, path, 110)


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
    figure1: (model, tokens, title) for `plot_figure1`, or None.

  Returns:
    {"json": path, "md": path, and a path per plot drawn, keyed as in PLOT_FILES}.
  """
  validate(report)
  text = json.dumps(report, indent=2)
  images = {}
  for key, fn in (("perplexity", plot_perplexity), ("ruler", plot_ruler), ("icl", plot_icl)):
    buf = fn(report, io.BytesIO())
    if buf is not None:
      images[key] = buf.getvalue()
  if figure1 is not None:
    model, tokens, title = figure1
    images["figure1"] = plot_figure1(model, tokens, io.BytesIO(), title=title).getvalue()
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
