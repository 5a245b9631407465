"""The report's figures, each rendered to PNG bytes (matplotlib, Agg backend), and the curve
conventions and helpers that study/plots.py's write-up figures share.

The writers own the files: report_files.write places perplexity / ruler / icl / figure1 next to
report.json, atomically. A function returns None when the report holds nothing it could draw;
the *_figure functions return the open matplotlib figure instead of PNG bytes (for callers that
add to it, and for tests).

Curves against evaluation length follow one convention: runs are grouped by encoding
(run["model"]["pos_encoding"]), one fixed colour per encoding (ENCODING_COLORS), one line style
per YaRN setting (SETTING_STYLES: none solid, yarn dashed, yarn_fixed dotted); the line is the
mean over seeds and the shaded band the seed spread, min-max over seeds (no band with one
seed; the intervals over evaluation units are in results/README.md's tables).
matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import io
from typing import Optional, Sequence

import numpy as np

from rove_jax import analysis, extras
from rove_jax.evaluation.report import train_len

ENCODING_COLORS = {
  "rove": "tab:red",
  "rope": "tab:blue",
  "nope": "tab:gray",
  "learned": "tab:green",
  "sinusoidal": "tab:purple",
  "t5_bias": "tab:orange",
}
ENCODING_NAMES = {
  "rove": "RoVE",
  "rope": "RoPE",
  "nope": "NoPE",
  "learned": "learned",
  "sinusoidal": "sinusoidal",
  "t5_bias": "T5 bias",
}
SETTING_STYLES = {"none": "-", "yarn": "--", "yarn_fixed": ":"}
SETTING_NAMES = {
  "none": "no YaRN",
  "yarn": "YaRN, factor L / T",
  "yarn_fixed": "YaRN, one fixed factor",
}
# Encodings and settings outside the fixed maps, in sorted order of those present in a figure.
_EXTRA_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black")
_EXTRA_STYLES = ("-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (1, 1)))
_BAND_LABELS = {"range": "band: min-max over seeds"}


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend (no display needed); without the eval
  extra, an error naming it."""
  extras.require("eval", "rove_jax.evaluation's plots")
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def png(fig, dpi: int) -> bytes:
  """The figure as PNG bytes; the figure is closed."""
  buf = io.BytesIO()
  try:
    fig.savefig(buf, format="png", dpi=dpi)
  finally:
    pyplot().close(fig)
  return buf.getvalue()


def legend(ax) -> None:
  """A small legend, drawn only when the axes hold labelled artists (matplotlib warns on an
  empty one)."""
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7)


# ------------------------------------------------------------------- curves against length


def _styles(keys, fixed: dict, extra: tuple) -> dict:
  """{key: fixed[key]}, keys outside `fixed` taking `extra` in sorted order (cycled)."""
  others = sorted(k for k in set(keys) if k not in fixed)
  return {
    **{k: fixed[k] for k in keys if k in fixed},
    **{k: extra[i % len(extra)] for i, k in enumerate(others)},
  }


def _cell(items, key: str, transform):
  """(line value, band lower, band upper, band kind) of one (encoding, setting, length) cell
  from its seeds' items: the mean over seeds and their min-max (None with one seed). The band
  is the seed spread only: an interval over evaluation units would show the spread of window
  or sample difficulty, which is shared by every run and cancels in the paired comparisons of
  study/stats.py (the tables carry those intervals)."""
  transform = transform or (lambda x: x)
  values = np.array([float(item[key]) for item in items])
  center = float(transform(values.mean()))
  if len(values) < 2:
    return center, None, None, None
  return center, float(transform(values.min())), float(transform(values.max())), "range"


def _draw_curves(ax, series: dict, key: str, *, transform=None) -> set:
  """One line per (encoding, setting) of `series` ({(encoding, setting): {length: [items]}}),
  the mean over seeds of item[key] (under `transform`), with its band. Lines and bands carry
  the gid "encoding/setting". Returns the band kinds drawn."""
  colors = _styles([e for e, _ in series], ENCODING_COLORS, _EXTRA_COLORS)
  styles = _styles([s for _, s in series], SETTING_STYLES, _EXTRA_STYLES)
  kinds = set()
  for (encoding, setting), by_length in sorted(series.items()):
    lengths = sorted(by_length)
    cells = [_cell(by_length[L], key, transform) for L in lengths]
    center = [c[0] for c in cells]
    gid = f"{encoding}/{setting}"
    ax.plot(
      lengths,
      center,
      linestyle=styles[setting],
      color=colors[encoding],
      marker="o",
      ms=3,
      lw=1.4,
      gid=gid,
    )
    if any(c[3] for c in cells):
      lower = [c[0] if c[1] is None else c[1] for c in cells]
      upper = [c[0] if c[2] is None else c[2] for c in cells]
      band = ax.fill_between(lengths, lower, upper, color=colors[encoding], alpha=0.18, lw=0)
      band.set_gid(gid)
      kinds.update(c[3] for c in cells if c[3])
  return kinds


def _length_axis(ax, lengths) -> None:
  """Log2 x axis with a labelled tick at every evaluated length."""
  from matplotlib.ticker import NullLocator

  ax.set_xscale("log", base=2)
  lengths = sorted(set(lengths))
  if lengths:
    ax.set_xticks(lengths)
    ax.set_xticklabels(
      [f"{L // 1024}k" if L >= 1024 and L % 1024 == 0 else str(L) for L in lengths], fontsize=7
    )
    ax.xaxis.set_minor_locator(NullLocator())
  ax.set_xlabel("evaluation length (tokens)")


def _train_lines(ax, lengths) -> list:
  """A thin gray vertical line at each training length; its legend handles."""
  from matplotlib.lines import Line2D

  for T in sorted(set(lengths)):
    ax.axvline(T, color="0.6", lw=0.8, zorder=0, gid="train_len")
  return [Line2D([], [], color="0.6", lw=0.8, label="training length")] if lengths else []


def _curve_legend(ax, series: dict, kinds: set, extra=()) -> None:
  """One legend entry per encoding (colour) and per setting (style), then the band kinds."""
  from matplotlib.lines import Line2D
  from matplotlib.patches import Patch

  if not series:
    return
  colors = _styles([e for e, _ in series], ENCODING_COLORS, _EXTRA_COLORS)
  styles = _styles([s for _, s in series], SETTING_STYLES, _EXTRA_STYLES)
  encodings, settings = _ordered(colors, ENCODING_COLORS), _ordered(styles, SETTING_STYLES)
  handles = [
    Line2D([], [], color=colors[e], lw=2, label=ENCODING_NAMES.get(e, e)) for e in encodings
  ]
  handles += [
    Line2D([], [], color="black", ls=styles[s], lw=1.2, label=SETTING_NAMES.get(s, s))
    for s in settings
  ]
  handles += [Patch(color="0.5", alpha=0.3, label=_BAND_LABELS[k]) for k in sorted(kinds)]
  ax.legend(handles=handles + list(extra), fontsize=7)


def _ordered(keys, known: dict) -> list:
  """`keys` in the order of `known`, then the others sorted."""
  order = list(known)
  return sorted(keys, key=lambda k: (order.index(k) if k in order else len(order), k))


def _ppl_settings(ppl: dict) -> list:
  """The scored settings of a perplexity entry: known ones in SETTING_STYLES order, then any
  other entry keyed by lengths."""
  return _ordered(
    [
      k
      for k in ppl
      if k != "protocol"
      and isinstance(ppl[k], dict)
      and ppl[k]
      and "not_applicable" not in ppl[k]
      and all(str(L).isdigit() for L in ppl[k])
    ],
    SETTING_STYLES,
  )


def perplexity_figure(report: dict):
  """`perplexity`'s figure (open), or None."""
  runs = [r for r in report["runs"] if r.get("perplexity")]
  if not runs:
    return None
  series = {}
  for r in runs:
    for setting in _ppl_settings(r["perplexity"]):
      for L, row in r["perplexity"][setting].items():
        cell = series.setdefault((r["model"]["pos_encoding"], setting), {})
        cell.setdefault(int(L), []).append(row)
  fig, ax = pyplot().subplots(figsize=(7, 4.5), layout="constrained")  # laid out when drawn
  kinds = _draw_curves(ax, series, "loss", transform=np.exp)
  _length_axis(ax, [L for cells in series.values() for L in cells])
  extra = _train_lines(ax, [train_len(r) for r in runs])
  ax.set_yscale("log")
  _perplexity_ticks(ax)
  ax.set_ylabel("perplexity (exp of the mean loss over seeds)")
  ax.set_title("Perplexity vs evaluation length")
  ax.grid(alpha=0.3, which="major")
  _curve_legend(ax, series, kinds, extra)
  return fig


# Mantissas of the labelled perplexity ticks, densest first: the first set that gives at most
# MAX_Y_TICKS ticks in the axis' range is used, so a range that ends a little past a power of
# ten (5 to 16) still has labelled ticks above it (12, 15).
Y_TICK_MANTISSAS = (
  (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9),
  (1, 1.5, 2, 3, 4, 5, 6, 8),
  (1, 2, 3, 5),
  (1, 2, 5),
  (1,),
)
MAX_Y_TICKS = 10


def perplexity_ticks(low: float, high: float) -> list:
  """Labelled ticks of a log perplexity axis over [low, high]: plain numbers at the densest
  mantissas of Y_TICK_MANTISSAS that give at most MAX_Y_TICKS of them (at least the powers of
  ten inside the range). A range too narrow for two of those (13.8 to 14.1) gets evenly
  spaced ticks at a step of 1, 2 or 5 times a power of ten instead."""
  decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
  for mantissas in Y_TICK_MANTISSAS:
    ticks = [
      m * 10.0**e
      for e in decades
      for m in mantissas
      if low <= m * 10.0**e * (1 + 1e-9) and m * 10.0**e <= high * (1 + 1e-9)
    ]
    if len(ticks) <= MAX_Y_TICKS:
      break
  return ticks if len(ticks) >= 2 else _even_ticks(low, high)


def _even_ticks(low: float, high: float) -> list:
  """Two to MAX_Y_TICKS ticks in [low, high] at the finest step of 1, 2 or 5 x 10^k."""
  top = int(np.ceil(np.log10(high - low)))
  for e in range(top - 2, top + 1):
    for m in (1, 2, 5):
      step = m * 10.0**e
      first, last = np.ceil(low / step - 1e-9), np.floor(high / step + 1e-9)
      if 2 <= last - first + 1 <= MAX_Y_TICKS:
        return [round(k * step, 12) for k in range(int(first), int(last) + 1)]
  return [low, high]


def _perplexity_ticks(ax) -> None:
  from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

  ax.autoscale_view()
  low, high = ax.get_ylim()
  ax.yaxis.set_major_locator(FixedLocator(perplexity_ticks(low, high)))
  ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 15, not 1.5 x 10^1
  ax.yaxis.set_minor_locator(NullLocator())


def perplexity(report: dict) -> Optional[bytes]:
  """Perplexity against evaluation length: a line per encoding and YaRN setting, the mean
  over seeds (exp of the mean loss), a band for the seed spread (module docstring)."""
  fig = perplexity_figure(report)
  return None if fig is None else png(fig, 120)


# --------------------------------------------------------------------- retrieval and RULER


RECORD_KEYS = ("encoding", "seed", "setting", "length", "accuracy", "nll")


def retrieval_figure(
  records: Sequence[dict],
  *,
  title: str = "Retrieval vs evaluation length",
  train_lengths: Sequence[int] = (),
):
  """Accuracy (left) and answer NLL (right) against evaluation length, the curve conventions
  of the module docstring, as an open figure (RULER's plot here, the retrieval study's in
  study/plots.py).

  Args:
    records: one dict per (encoding, seed, setting, length), e.g. `ruler_records`' or the
      retrieval study's:
      encoding: str, the pos_encoding ("rove", "rope", ...): the colour;
      seed: int or str, the run within the encoding (lines are means over seeds);
      setting: str, "none", "yarn" or "yarn_fixed" (others get further styles): the style;
      length: int, evaluation length in tokens;
      accuracy: float in [0, 1]; nll: float, mean answer NLL;
      other keys (e.g. per-sample lists) are ignored. A cell's band is the min-max over its
      seeds (the intervals over samples are in the study's tables).
    title: the figure's title.
    train_lengths: training lengths to mark with a vertical line.

  Returns:
    The figure, or None when `records` is empty.

  Raises:
    ValueError: a record lacking one of RECORD_KEYS, or two records with the same encoding,
      setting, length and seed.
  """
  series, seen = {}, set()
  for i, rec in enumerate(records):
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
      raise ValueError(f"records[{i}] lacks {missing}; each record needs {list(RECORD_KEYS)}")
    key = (rec["encoding"], rec["setting"], int(rec["length"]), rec["seed"])
    if key in seen:
      raise ValueError(f"records[{i}] repeats encoding, setting, length and seed {key}")
    seen.add(key)
    series.setdefault(key[:2], {}).setdefault(key[2], []).append(rec)
  if not series:
    return None
  fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), layout="constrained")
  kinds = _draw_curves(axes[0], series, "accuracy")
  kinds |= _draw_curves(axes[1], series, "nll")
  lengths = [L for cells in series.values() for L in cells]
  extra = []
  for ax in axes:
    _length_axis(ax, lengths)
    extra = _train_lines(ax, list(train_lengths))
    ax.grid(alpha=0.3)
  axes[0].set(ylim=(-0.02, 1.02), ylabel="accuracy (exact match)", title="accuracy")
  axes[1].set(ylabel="answer NLL (nats, mean per sample)", title="answer NLL (lower is better)")
  _curve_legend(axes[1], series, kinds, extra)
  fig.suptitle(title, fontsize=10)
  return fig


def _ruler_settings(ruler: dict) -> dict:
  """{setting: {task: {LENGTH: row}}} of a RULER entry: version 2's ruler["settings"], or a
  version-1 (or flattened) {"tasks": ...} map as "none" ("yarn" if ruler["yarn"])."""
  if "settings" in ruler:
    return {s: v["tasks"] for s, v in ruler["settings"].items() if v.get("tasks")}
  return {"yarn" if ruler.get("yarn") else "none": ruler.get("tasks") or {}}


def ruler_records(report: dict) -> list:
  """The report's RULER as retrieval records: per run, setting and length, the mean over the
  tasks that every run scored at that setting and length (so encodings are compared on the
  same tasks); per-sample lists concatenated over those tasks, in task order."""
  runs = [(i, r) for i, r in enumerate(report["runs"]) if r.get("ruler")]
  cells = {}  # (setting, length) -> {run index: {task: row}}
  for i, r in runs:
    for setting, tasks in _ruler_settings(r["ruler"]).items():
      for task, rows in tasks.items():
        for L, row in rows.items():
          cells.setdefault((setting, int(L)), {}).setdefault(i, {})[task] = row
  records = []
  for (setting, L), by_run in sorted(cells.items()):
    common = sorted(set.intersection(*(set(t) for t in by_run.values())))
    for i, task_rows in sorted(by_run.items()):
      rows = [task_rows[t] for t in common]
      if not rows:
        continue
      rec = {
        "encoding": report["runs"][i]["model"]["pos_encoding"],
        "seed": i,
        "setting": setting,
        "length": L,
        "accuracy": float(np.mean([row["exact_match"] for row in rows])),
        "nll": float(np.mean([row["nll"] for row in rows])),
      }
      for key in ("sample_correct", "sample_nll"):
        if all(row.get(key) for row in rows):
          rec[key] = [x for row in rows for x in row[key]]
      records.append(rec)
  return records


def ruler_figure(report: dict):
  """`ruler`'s figure (open), or None."""
  train = [train_len(r) for r in report["runs"] if r.get("ruler")]
  return retrieval_figure(
    ruler_records(report), train_lengths=train, title="RULER: mean over the tasks every run scored"
  )


def ruler(report: dict) -> Optional[bytes]:
  """RULER exact match and answer NLL against length (mean over tasks), a line per encoding
  and setting with the seed spread as a band; None when no run scored a RULER task."""
  fig = ruler_figure(report)
  return None if fig is None else png(fig, 120)


def _bars(runs, tasks, value, *, ylabel, title, ylim=None) -> bytes:
  """Grouped bars: one group per task, one bar per run."""
  fig, ax = pyplot().subplots(figsize=(max(6, 0.7 * len(tasks) * len(runs)), 4))
  width = 0.8 / len(runs)
  for i, r in enumerate(runs):
    ax.bar(np.arange(len(tasks)) + i * width, [value(r, t) for t in tasks], width, label=r["name"])
  ax.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2)
  ax.set_xticklabels(tasks, rotation=45, ha="right", fontsize=7)
  if ylim:
    ax.set_ylim(*ylim)
  ax.set_ylabel(ylabel)
  ax.set_title(title)
  legend(ax)
  fig.tight_layout()
  return png(fig, 120)


def icl(report: dict) -> Optional[bytes]:
  """Each synthetic ICL task's accuracy, one bar per run."""
  runs = [r for r in report["runs"] if r.get("icl") and r["icl"].get("synthetic")]
  if not runs:
    return None
  tasks = sorted({t for r in runs for t in r["icl"]["synthetic"]["tasks"]})
  accuracy = lambda r, t: r["icl"]["synthetic"]["tasks"].get(t, {}).get("accuracy", np.nan)
  return _bars(
    runs, tasks, accuracy, ylabel="accuracy", title="In-context learning (synthetic)", ylim=(0, 1)
  )


def figure1(model, tokens_T, *, title: str, layer: int = 0, head: int = 0) -> bytes:
  """The paper's Figure 1 for a trained layer: RoPE's mixer A (x) W_V next to RoVE's
  block-Toeplitz mixer [A_ij R_{j-i} W_V], on the same attention weights."""
  view = analysis.layer_attention(model, tokens_T, layer=layer, head=head)
  T = len(tokens_T)
  # The four fastest-turning rotary pairs against the first 8 input features: small enough to
  # see the per-token blocks, and where the rotations differ most.
  features = min(8, view["w_v"].shape[1])
  m = analysis.figure1_mixers(view, pairs=4, features=features)
  rope, rove, dims = m["rope"], m["rove"], len(m["dims"])
  fig, axes = pyplot().subplots(1, 2, figsize=(10, 4.5))
  vmax = float(np.percentile(np.abs(rope), 99.5)) or 1.0
  for ax, mat, name in (
    (axes[0], rope, "RoPE: A \u2297 W_V"),
    (axes[1], rove, "RoVE: [A_ij R_{j-i} W_V] (block Toeplitz up to A)"),
  ):
    ax.imshow(mat, cmap="RdBu_r", vmin=-vmax, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel(f"input: {T} tokens x first {features} features")
    ax.set_ylabel(f"output: {T} tokens x {dims} head dims (first {dims // 2} rotary pairs)")
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  return png(fig, 110)
