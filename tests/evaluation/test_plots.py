"""plots: curves against length have one colour per encoding, one line style per YaRN setting,
the mean over seeds as the line and the seed spread as a band, checked on the figures' artists
(matplotlib Agg), not only on the files."""

import math

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from rove_jax.evaluation import plots
from study import plots as study_plots

LENGTHS = (64, 128, 256)
plots.pyplot()  # import pyplot (about a second) once, outside the tests' timings


def ppl_run(encoding, seed, settings=("none", "yarn", "yarn_fixed"), windows=False):
  """A report run whose loss at (setting, L) is a known function of its arguments."""
  ppl = {"protocol": {"train_len": 128}}
  for s_i, setting in enumerate(settings):
    rows = {}
    for L in LENGTHS:
      loss = 2.0 + 0.1 * s_i + 0.01 * L / 64 + 0.05 * seed + (0.3 if encoding == "rope" else 0)
      rows[str(L)] = {"loss": loss, "ppl": math.exp(loss), "tokens": 40, "windows": 4}
      if windows:
        tokens = [10, 10, 5, 15]
        rows[str(L)].update(
          window_tokens=tokens,
          window_nll=[loss * t * (1 + 0.1 * (i - 1.5)) for i, t in enumerate(tokens)],
        )
    ppl[setting] = rows
  if "yarn" not in settings:
    ppl["yarn"] = {"not_applicable": "no rotary frequencies"}
  return {
    "name": f"{encoding}-{seed}",
    "perplexity": ppl,
    "ruler": None,
    "model": {"pos_encoding": encoding, "max_len": 128, "train_len": 128},
  }


def curves(ax) -> dict:
  """{gid "encoding/setting": line} of the data lines (not the training-length marks)."""
  return {line.get_gid(): line for line in ax.get_lines() if line.get_gid() != "train_len"}


def bands(ax) -> dict:
  """{gid: (x, lower, upper)} of the fill_between bands, read off their polygons."""
  out = {}
  for coll in ax.collections:
    xy = coll.get_paths()[0].vertices
    xs = np.unique(xy[:, 0])
    out[coll.get_gid()] = (
      xs,
      np.array([xy[xy[:, 0] == x, 1].min() for x in xs]),
      np.array([xy[xy[:, 0] == x, 1].max() for x in xs]),
    )
  return out


@pytest.fixture
def close_figures():
  yield
  plots.pyplot().close("all")


def test_perplexity_colours_by_encoding_styles_by_setting_and_means_over_seeds(close_figures):
  runs = [ppl_run(e, s) for e in ("rove", "rope") for s in (0, 1)]
  runs.append(ppl_run("nope", 0, settings=("none",)))
  fig = plots.perplexity_figure({"runs": runs})
  (ax,) = fig.axes
  lines = curves(ax)
  assert set(lines) == {f"{e}/{s}" for e in ("rove", "rope") for s in plots.SETTING_STYLES} | {
    "nope/none"
  }
  for gid, line in lines.items():
    encoding, setting = gid.split("/")
    assert to_rgba(line.get_color()) == to_rgba(plots.ENCODING_COLORS[encoding])
    assert line.get_linestyle() == {"none": "-", "yarn": "--", "yarn_fixed": ":"}[setting]
    np.testing.assert_array_equal(line.get_xdata(), LENGTHS)
  assert len({to_rgba(l.get_color()) for l in lines.values()}) == 3  # one per encoding
  # The line is exp(mean loss over seeds 0 and 1); the band min-max over seeds.
  expected = [math.exp(2.0 + 0.01 * L / 64 + 0.025 + 0.3) for L in LENGTHS]
  np.testing.assert_allclose(lines["rope/none"].get_ydata(), expected)
  band = bands(ax)
  assert set(band) == set(lines) - {"nope/none"}  # one seed of NoPE and no windows: no band
  xs, lower, upper = band["rove/yarn"]
  np.testing.assert_array_equal(xs, LENGTHS)
  np.testing.assert_allclose(lower, [math.exp(2.1 + 0.01 * L / 64) for L in LENGTHS])
  np.testing.assert_allclose(upper, [math.exp(2.15 + 0.01 * L / 64) for L in LENGTHS])
  assert to_rgba(ax.collections[0].get_facecolor()[0], alpha=1) == to_rgba(
    plots.ENCODING_COLORS[ax.collections[0].get_gid().split("/")[0]]
  )
  # Axis and legend: log2 lengths labelled, each encoding and setting named once.
  assert ax.get_xscale() == "log"
  assert [t.get_text() for t in ax.get_xticklabels()] == ["64", "128", "256"]
  assert [t.get_text() for t in ax.get_legend().get_texts()] == [
    "RoVE",
    "RoPE",
    "NoPE",
    "no YaRN",
    "YaRN, factor L / T",
    "YaRN, one fixed factor",
    "band: min-max over seeds",
    "training length",
  ]
  assert [l.get_xdata()[0] for l in ax.get_lines() if l.get_gid() == "train_len"] == [128]


def test_perplexity_ticks_above_ten_are_labelled(close_figures):
  # The demo's range: perplexities from about 5.5 to 16, a little past a power of ten.
  runs = [ppl_run("rove", 0, settings=("none",))]
  for L, ppl in zip(LENGTHS, (5.5, 9.0, 16.0)):
    runs[0]["perplexity"]["none"][str(L)]["loss"] = math.log(ppl)
  (ax,) = plots.perplexity_figure({"runs": runs}).axes
  fig = ax.figure
  fig.canvas.draw()
  low, high = ax.get_ylim()
  shown = [
    (t.get_loc(), t.label1.get_text())
    for t in ax.yaxis.get_major_ticks()
    if low <= t.get_loc() <= high and t.label1.get_visible()
  ]
  labels = [text for _, text in shown]
  assert all(text for text in labels)
  assert [text for loc, text in shown if loc > 10] == ["12", "15"]
  assert "10" in labels and "6" in labels
  assert ax.yaxis.get_minor_locator().tick_values(low, high) == []


def test_perplexity_ticks_thin_out_over_wide_ranges():
  assert plots.perplexity_ticks(5.5, 16) == [6, 7, 8, 9, 10, 12, 15]
  assert plots.perplexity_ticks(5, 1000) == [5, 10, 20, 30, 50, 100, 200, 300, 500, 1000]
  assert plots.perplexity_ticks(2, 3) == [2, 2.5, 3]
  wide = plots.perplexity_ticks(1.5, 1e6)
  assert len(wide) <= plots.MAX_Y_TICKS and 1000 in wide


@pytest.mark.parametrize("low, high", [(13.75, 14.14), (13, 14.9), (21, 24), (101, 119), (9.5, 11)])
def test_a_narrow_perplexity_range_still_gets_labelled_ticks(low, high):
  """No mantissa tick, or one, falls in these ranges: they get evenly spaced ones instead."""
  ticks = plots.perplexity_ticks(low, high)
  assert 2 <= len(ticks) <= plots.MAX_Y_TICKS
  assert all(low <= t <= high for t in ticks)
  steps = np.diff(ticks)
  assert np.allclose(steps, steps[0])
  mantissa = steps[0] / 10 ** np.floor(np.log10(steps[0]))
  assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-9
  assert plots.perplexity_ticks(13.75, 14.14) == [13.75, 13.8, 13.85, 13.9, 13.95, 14, 14.05, 14.1]


def test_a_narrow_range_figure_labels_its_axis(close_figures):
  runs = [ppl_run("rove", 0, settings=("none",))]
  for L, ppl in zip(LENGTHS, (13.77, 13.9, 14.12)):
    runs[0]["perplexity"]["none"][str(L)]["loss"] = math.log(ppl)
  (ax,) = plots.perplexity_figure({"runs": runs}).axes
  ax.figure.canvas.draw()
  low, high = ax.get_ylim()
  labels = [
    t.label1.get_text()
    for t in ax.yaxis.get_major_ticks()
    if low <= t.get_loc() <= high and t.label1.get_visible()
  ]
  assert len(labels) >= 2 and all(labels), labels


def test_perplexity_band_is_the_seed_range_even_with_window_records(close_figures):
  """Per-window records do not turn the band into an interval over windows (whose difficulty
  every run shares): it stays the min-max over seeds, around the mean over seeds."""
  runs = [ppl_run("rove", s, settings=("none",), windows=True) for s in range(3)]
  (ax,) = plots.perplexity_figure({"runs": runs}).axes
  xs, lower, upper = bands(ax)["rove/none"]
  row = lambda r, L: r["perplexity"]["none"][str(L)]
  for i, L in enumerate(int(x) for x in xs):
    losses = [row(r, L)["loss"] for r in runs]
    assert (lower[i], upper[i]) == pytest.approx((math.exp(min(losses)), math.exp(max(losses))))
    assert curves(ax)["rove/none"].get_ydata()[i] == pytest.approx(math.exp(np.mean(losses)))
  assert "band: min-max over seeds" in [t.get_text() for t in ax.get_legend().get_texts()]


def records(encodings=("rove", "rope"), settings=("none", "yarn"), seeds=(0, 1, 2)):
  return [
    {
      "encoding": e,
      "seed": s,
      "setting": st,
      "length": L,
      "accuracy": 0.9 - 0.1 * j - 0.05 * s - (0.2 if e == "rope" else 0),
      "nll": 0.5 + 0.1 * j + 0.05 * s,
    }
    for e in encodings
    for st in settings
    for s in seeds
    for j, L in enumerate(LENGTHS)
  ]


def test_retrieval_study_draws_two_panels_with_the_same_conventions(close_figures):
  recs = records() + records(encodings=("alibi",), settings=("ntk",), seeds=(0,))
  fig = plots.retrieval_figure(recs, train_lengths=[128])
  acc, nll = fig.axes[:2]
  for ax, key in ((acc, "accuracy"), (nll, "nll")):
    lines = curves(ax)
    assert set(lines) == {"rove/none", "rove/yarn", "rope/none", "rope/yarn", "alibi/ntk"}
    assert lines["rove/none"].get_color() == lines["rove/yarn"].get_color() == "tab:red"
    assert lines["rope/yarn"].get_linestyle() == "--"
    # Unknown encodings and settings get colours and styles no known one has.
    assert lines["alibi/ntk"].get_color() not in plots.ENCODING_COLORS.values()
    assert lines["alibi/ntk"].get_linestyle() not in plots.SETTING_STYLES.values()
    mean = [
      np.mean(
        [r[key] for r in recs if (r["encoding"], r["setting"], r["length"]) == ("rope", "yarn", L)]
      )
      for L in LENGTHS
    ]
    np.testing.assert_allclose(lines["rope/yarn"].get_ydata(), mean)
    assert set(bands(ax)) == {"rove/none", "rove/yarn", "rope/none", "rope/yarn"}
  _, lower, upper = bands(acc)["rope/none"]
  np.testing.assert_allclose(upper - lower, 0.1)  # min-max over seeds 0..2


def test_the_png_functions_render_the_figures(monkeypatch, close_figures):
  drawn = []
  monkeypatch.setattr(plots, "png", lambda fig, dpi: drawn.append(fig) or b"PNG")  # no render
  assert study_plots.retrieval_study(records()[:3]) == b"PNG"
  assert plots.perplexity({"runs": [ppl_run("rove", 0)]}) == b"PNG"
  assert [len(fig.axes) for fig in drawn] == [2, 1]
  assert study_plots.retrieval_study([]) is None and plots.perplexity({"runs": []}) is None


def test_retrieval_records_are_checked(close_figures):
  with pytest.raises(ValueError, match=r"records\[0\] lacks \['nll'\]"):
    plots.retrieval_figure([{k: 1 for k in plots.RECORD_KEYS if k != "nll"}])
  with pytest.raises(ValueError, match=r"records\[1\] repeats"):
    plots.retrieval_figure(records(seeds=(0,))[:1] * 2)


def ruler_run(encoding, seed, *, settings=True, skip=False):
  rows = lambda base: {
    str(L): {
      "nll": base + seed,
      "exact_match": 0.5,
      "n": 2,
      "sample_nll": [base + seed] * 2,
      "sample_correct": [0, 1],
    }
    for L in LENGTHS
  }
  tasks = {"a": rows(1.0), "b": rows(3.0)}
  if skip:
    tasks.pop("b")
  ruler = (
    {"settings": {"none": {"tasks": tasks}, "yarn": {"tasks": tasks}}}
    if settings
    else {"tasks": tasks}
  )
  return {
    "name": f"{encoding}-{seed}",
    "perplexity": None,
    "ruler": ruler,
    "model": {"pos_encoding": encoding, "max_len": 128, "train_len": 128},
  }


def test_ruler_draws_each_setting_over_the_tasks_every_run_scored(close_figures):
  runs = [
    ruler_run("rove", 0),
    ruler_run("rove", 1),
    ruler_run("rope", 0),
    ruler_run("nope", 0, settings=False, skip=True),
  ]  # version 1 ("none"), no task b
  acc, nll = plots.ruler_figure({"runs": runs}).axes[:2]
  lines = curves(nll)
  assert set(lines) == {"rove/none", "rove/yarn", "rope/none", "rope/yarn", "nope/none"}
  np.testing.assert_allclose(lines["rove/none"].get_ydata(), 1.5)  # task a; seeds 0, 1
  np.testing.assert_allclose(lines["rove/yarn"].get_ydata(), 2.5)  # tasks a, b
  np.testing.assert_allclose(curves(acc)["rope/yarn"].get_ydata(), 0.5)
  assert set(bands(nll)) == {"rove/none", "rove/yarn"}  # the seed range: RoVE has 2 seeds
  assert plots.ruler({"runs": [dict(runs[0], ruler=None)]}) is None
