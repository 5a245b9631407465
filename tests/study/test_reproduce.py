"""reproduce.py and the results write-up: seed statistics and verdicts by hand, and the whole
command end to end on tiny settings."""

import json
import math
import os
import re
import shlex
import subprocess
import sys

import pytest

from rove_jax.cli import eval as cli
from rove_jax.evaluation import report as report_lib
from rove_jax.evaluation import report_files
from study import recall_runs
from study import writeup as w
from tests.conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


T = 32  # the hand-made runs' training length
SEED_OFFSET = {0: -0.05, 1: 0.0, 2: 0.05}  # shared by every encoding: cancels in a seed pair
# RoVE's seeds 0 and 2 off by 0.02 more: a pair-to-pair spread, so a 0.01 difference is level
INTERACTION = {("rove", 0): 0.02, ("rove", 2): -0.02}


def _offset(run) -> float:
  """The seed effect of run = (encoding, seed)."""
  return SEED_OFFSET[run[1]] + INTERACTION.get(run, 0.0)


WINDOW_DIFFICULTY = (-0.2, 0.1, 0.3, -0.2)  # shared by every run: the units are paired
SAMPLE_DIFFICULTY = (-0.3, 0.0, 0.3)
# Per-token loss without YaRN by length: RoVE clearly lower past T, level with RoPE at T.
PPL = {
  "rove": {16: 2.5, 32: 2.0, 64: 2.3, 128: 2.6},
  "rope": {16: 2.51, 32: 2.01, 64: 2.7, 128: 3.2},
  "nope": {16: 3.0, 32: 2.8, 64: 3.5, 128: 4.0},
}
YARN_GAIN = {"rove": 0.3, "rope": 0.4}  # YaRN lowers the loss past T by this much
# RULER answer NLL by task: RoVE clearly lower on niah_single_1, cwe and fwe, level on vt.
RULER = {
  "rove": {"niah_single_1": 1.0, "vt": 2.0, "cwe": 1.5, "fwe": 2.5},
  "rope": {"niah_single_1": 1.5, "vt": 2.02, "cwe": 2.5, "fwe": 3.0},
  "nope": {"niah_single_1": 2.0, "vt": 2.0, "cwe": 2.0, "fwe": 2.0},
}
RULER_LENGTHS = (64, 128)
# RULER exact matches a run gets on each task's 3 samples: cwe none (not measurable on its own).
RULER_RIGHT = {"niah_single_1": [1, 1, 0], "vt": [1, 0, 0], "cwe": [0, 0, 0], "fwe": [1, 0, 0]}
ICL_NLL = {"rove": 2.0, "rope": 2.5, "nope": 3.0}


def _ppl_row(loss, run):
  nll = [round((loss + _offset(run) + d) * 8, 4) for d in WINDOW_DIFFICULTY]
  mean = sum(nll) / 32
  return {
    "loss": mean,
    "ppl": math.exp(mean),
    "tokens": 32,
    "windows": 4,
    "by_position": [],
    "window_nll": nll,
    "window_tokens": [8, 8, 8, 8],
  }


def _ruler_row(nll, run, correct):
  samples = [round(nll + _offset(run) * 2 + d, 4) for d in SAMPLE_DIFFICULTY]
  return {
    "nll": sum(samples) / 3,
    "exact_match": sum(correct) / 3,
    "n": 3,
    "correct": sum(correct),
    "sample_nll": samples,
    "sample_correct": correct,
  }


def _icl_row(axis, values, nll, run, correct):
  """A synthetic ICL task row with 4 samples at each axis value; `correct` right answers in
  its first cell."""
  row = {
    f"by_{axis}": {},
    f"nll_by_{axis}": {},
    f"sample_nll_by_{axis}": {},
    f"sample_correct_by_{axis}": {},
  }
  for i, v in enumerate(values):
    right = [1] * (correct if i == 0 else 0) + [0] * (4 - (correct if i == 0 else 0))
    samples = [round(nll + _offset(run) + d, 4) for d in (-0.2, 0.0, 0.1, 0.1)]
    row[f"by_{axis}"][v] = sum(right) / 4
    row[f"nll_by_{axis}"][v] = sum(samples) / 4
    row[f"sample_nll_by_{axis}"][v] = samples
    row[f"sample_correct_by_{axis}"][v] = right
  n = 4 * len(values)
  k = sum(sum(x) for x in row[f"sample_correct_by_{axis}"].values())
  return {**row, "accuracy": k / n, "n": n, "correct": k, "prompts": n, "truncated": 1}


def _run(enc, seed):
  """One schema-v2 run of the hand-made study (RoVE's seed 0 gets one ICL answer right)."""
  rotary = enc != "nope"
  ppl = {
    "protocol": {"yarn_fixed_factor": 4.0, "max_tokens": 128},
    "none": {str(L): _ppl_row(x, (enc, seed)) for L, x in PPL[enc].items()},
  }
  for setting, gain in (("yarn", 1.0), ("yarn_fixed", 0.8)):
    ppl[setting] = (
      {
        str(L): _ppl_row(x - (YARN_GAIN[enc] * gain if L > T else 0.0), (enc, seed))
        for L, x in PPL[enc].items()
      }
      if rotary
      else {"not_applicable": "pos_encoding='nope' has no rotary frequencies"}
    )
  settings = {}
  for setting, shift in (("none", 0.0), ("yarn", -0.1)):
    if setting == "yarn" and not rotary:
      settings[setting] = {"not_applicable": "no rotary frequencies"}
      continue
    settings[setting] = {
      "tasks": {
        task: {
          str(L): _ruler_row(nll + shift, (enc, seed), RULER_RIGHT[task])
          for L in RULER_LENGTHS
          if not (task == "cwe" and L == 64)
        }
        for task, nll in RULER[enc].items()
      }
    }
  correct = 1 if (enc, seed) == ("rove", 0) else 0
  tasks = {
    "associative_recall": _icl_row("length", ["32"], ICL_NLL[enc], (enc, seed), correct),
    "fewshot_reverse": _icl_row("shots", ["0", "2"], ICL_NLL[enc] + 0.5, (enc, seed), 0),
  }
  return {
    "name": f"{enc}-s{seed}",
    "workdir": f"runs/{enc}-s{seed}",
    "step": 10,
    "model": {
      "pos_encoding": enc,
      "params": 1000,
      "n_layer": 2,
      "d_model": 64,
      "n_head": 2,
      "max_len": T,
      "train_len": T,
    },
    "perplexity": ppl,
    "ruler": {
      "protocol": {
        "samples": 3,
        "seed": 0,
        "lengths": list(RULER_LENGTHS),
        "train_len": T,
        "yarn_factor": "L / train_len",
      },
      "settings": settings,
      "skipped": {
        "cwe@64": "the task's fixed text does not fit in 64 tokens",
        "qa_1": "needs --squad FILE",
      },
    },
    "icl": {
      "protocol": {
        "context": T,
        "lengths": [T],
        "samples": 4,
        "shots": [0, 2],
        "seed": 0,
        "rule": "every prompt is scored inside the training context of 32 tokens",
      },
      "synthetic": {
        "tasks": tasks,
        "skipped": {},
        "accuracy": sum(t["accuracy"] for t in tasks.values()) / 2,
        "prompts": 12,
        "truncated": 2,
      },
      "files": None,
    },
    "seconds": {"perplexity": 6.0},
  }


def _hand_made():
  """(report, runs, curves, meta): three seeds of RoVE, RoPE and NoPE."""
  runs_rep = [_run(enc, seed) for enc in ("rove", "rope", "nope") for seed in (0, 1, 2)]
  report = {
    "schema_version": report_lib.SCHEMA_VERSION,
    "suite": "full",
    "created": "now",
    "runs": runs_rep,
  }
  report_lib.validate(report)
  runs = [
    {"encoding": r["model"]["pos_encoding"], "seed": int(r["name"][-1]), "workdir": r["workdir"]}
    for r in runs_rep
  ]
  curves = {
    r["workdir"]: [
      {"step": 5, "loss": 3.0},
      {"step": 10, "loss": 2.5},
      {"step": 10, "val_loss": 2.6},
    ]
    for r in runs
  }
  meta = {
    "command": "python reproduce.py",
    "commit": "abc",
    "machine": "m",
    "quick": False,
    "started": "t",
    "wall_seconds": 120.0,
    "train_seconds": {},
  }
  return report, runs, curves, meta


def _recall_records():
  """Retrieval-study records (training length 16): RoVE clearly better at 64 tokens without
  YaRN, level with RoPE at 32; NoPE at chance."""
  acc = {
    "rove": {16: 4, 32: 3, 64: 3},
    "rope": {16: 4, 32: 3, 64: 0},
    "nope": {16: 1, 32: 0, 64: 0},
  }  # correct answers out of 4, seed 0
  records = []
  for enc, by_len in acc.items():
    for seed in (0, 1, 2):
      for setting in ("none", "yarn") if enc != "nope" else ("none",):
        for L, k in by_len.items():
          right = [1] * k + [0] * (4 - k)
          nll = [round(0.5 + (4 - k) * 0.5 + d + 0.01 * seed, 4) for d in (0.0, 0.1, 0.2, 0.3)]
          records.append(
            {
              "encoding": enc,
              "seed": seed,
              "setting": setting,
              "length": L,
              "multiple": L / 16,
              "n": 4,
              "accuracy": k / 4,
              "nll": sum(nll) / 4,
              "sample_correct": right,
              "sample_nll": nll,
            }
          )
  return records


N_BOOT = 400  # fewer replicates than the write-up's default: the tests compare like with like


def _section(text, heading):
  start = text.index(heading)
  end = text.find("\n## ", start + 1)
  return text[start : end if end > 0 else len(text)]


def _claims(text):
  """The claims table's rows as (id, claim, test, figure, raw verdict, Holm verdict): the
  primary rows (a paired-t column before the verdicts), the exploratory ones and d1's (no
  Holm column: None)."""
  table = _section(text, "## The paper's claims, one by one")
  out = []
  for line in table.splitlines():
    if re.match(r"\| [a-f]\d? \|", line):
      c = [x.strip() for x in line.strip().strip("|").split(" | ")]
      verdicts = (c[5], c[6]) if len(c) == 7 else (c[4], c[5]) if len(c) == 6 else (c[4], None)
      out.append(tuple(c[:4]) + verdicts)
  return out


def test_build_tables_from_a_hand_made_report():
  from study import stats

  report, runs, curves, meta = _hand_made()
  text, summary, pngs = w.build(report, runs, curves, meta, n_boot=N_BOOT)
  assert set(pngs.values()) == {None}  # no retrieval records
  rove = [r for r in report["runs"] if r["model"]["pos_encoding"] == "rove"]
  # A perplexity cell is stats.mean_interval of the token-weighted loss, under exp.
  rows = [r["perplexity"]["none"]["128"] for r in rove]
  iv = stats.mean_interval(
    [r["window_nll"] for r in rows],
    weights=[r["window_tokens"] for r in rows],
    n_boot=N_BOOT,
    seed=0,
  ).transformed(math.exp)
  assert iv.estimate == pytest.approx(math.exp(2.6), rel=1e-3)
  cell = f"{iv.estimate:.2f} [{iv.lower:.2f}, {iv.upper:.2f}]"
  row = next(
    line
    for line in _section(text, "## Perplexity by").splitlines()
    if line.startswith("| RoVE | no YaRN |")
  )
  assert row.split(" | ")[-1] == cell + " |"
  assert summary["encodings"]["rove"]["ppl"]["none"]["128"]["estimate"] == iv.estimate
  # RULER: a task's NLL is the mean over the lengths it was scored at (cwe: 128 only).
  nll = stats.mean_interval(
    [r["ruler"]["settings"]["none"]["tasks"]["cwe"]["128"]["sample_nll"] for r in rove],
    n_boot=N_BOOT,
    seed=0,
  )
  assert summary["ruler"]["none"]["cwe"]["nll"]["rove"]["estimate"] == pytest.approx(nll.estimate)
  assert summary["ruler"]["none"]["cwe"]["lengths"] == [128]
  assert "- cwe: skipped at 64 tokens (the task's fixed text" in text
  assert "- qa_1: not scored (needs --squad FILE)" in text
  # Verdicts from intervals: level at T (inconclusive), RoVE clearly lower past it (supports).
  claims = _claims(text)
  by_test = {c[2]: c for c in claims}
  at_t = by_test["perplexity at the training length (32 tokens), no YaRN: RoVE / RoPE - 1"]
  assert at_t[0] == "b" and at_t[4] == "inconclusive"
  assert by_test["perplexity at 128 tokens (4x), no YaRN: RoVE / RoPE - 1"][4] == "supports"
  ruler_rows = [c for c in claims if c[2].startswith("RULER ") and "aggregation" not in c[2]]
  for task in ("niah_single_1", "vt", "cwe", "fwe"):
    for setting in ("no YaRN", "YaRN, factor L/T"):
      [row] = [c for c in ruler_rows if c[2].startswith(f"RULER {task} ") and setting in c[2]]
      if task == "cwe":  # no answer right for either encoding: counts, no verdict
        assert row[4] == (
          "not measurable at this scale: RoVE 0/9, RoPE 0/9 right, chance 0 + margin 0.05"
        ), row
      else:  # the paired t-test over the 3 seed pairs
        assert row[4] == ("inconclusive" if task == "vt" else "supports"), row
      k = sum(RULER_RIGHT[task]) * (1 if task == "cwe" else 2) * 3
      assert f"exact match RoVE {k}/" in row[3]  # accuracy as counts
  # ICL accuracy is within the margin of chance (1 of 36 right, open-ended answers): counts, no
  # verdict, no percentage; its answer NLL gets none either.
  [acc] = [c for c in claims if c[0] == "a" and "accuracy" in c[2]]
  assert (
    acc[4] == ("not measurable at this scale: RoVE 1/36, RoPE 0/36 right, chance 0 + margin 0.05")
    and "%" not in acc[3]
  )
  assert "left the primary family" in acc[1]
  assert "%" not in _section(text, "## In-context learning inside")
  [icl_nll] = [c for c in claims if c[0] == "a" and "NLL" in c[2] and "pooled" in c[2]]
  assert icl_nll[4].startswith("not measurable at this scale: RoVE 1/36")
  per_task = [c for c in claims if c[2].startswith("synthetic ICL task ")]
  assert [c[2].split()[3] for c in per_task] == ["associative_recall:", "fewshot_reverse:"]
  assert {c[0] for c in claims} >= {"a", "b", "c", "d1", "d2", "e", "f"}
  assert "| NoPE | 3 | " in text and "± " not in text and "spreads added" not in text
  from study import numbers as rs

  assert rs.coverage_quote(3) in text and rs.coverage_quote(8) in text  # the method's limits
  assert str(N_BOOT) in text and "Seeds are paired across encodings" in text
  for name in ("rove-s0", "rope-s2", "nope-s1"):  # every run reported
    assert f"| {name} |" in text


def test_build_with_one_encoding_and_perplexity_only():
  report, runs, curves, meta = _hand_made()
  report["runs"] = [r for r in report["runs"] if r["model"]["pos_encoding"] == "rove"]
  for r in report["runs"]:
    r["ruler"] = r["icl"] = None
  text, summary, _ = w.build(report, runs[:3], curves, meta, n_boot=N_BOOT)
  assert "## RULER" not in text and "## In-context learning" not in text
  assert "Needs RoVE and RoPE runs." in text and summary["claims"] == []
  assert "| RoVE | no YaRN | " in text and "| RoVE | 3 | " in text


def test_writeup_quotes_the_coverage_that_bench_results_records():
  from study import numbers as rs

  results = " ".join(open(os.path.join(ROOT, "bench", "RESULTS.md")).read().split())
  for pairs in rs.COVERAGE:
    assert f"{pairs} pairs, {rs.coverage_quote(pairs)}" in results


def test_pooled_scores_average_to_the_linear_combination():
  from study import numbers as rs

  # two runs; part A has 2 units, part B 4: 0.5 * mean(A) - 0.25 * mean(B)
  a, b = [[1.0, 3.0], [2.0, 2.0]], [[4.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
  runs = rs.pooled([(0.5, a), (-0.25, b)])
  assert [float(x.mean()) for x in runs] == pytest.approx([0.5 * 2 - 0.25 * 2, 1 - 0.25])


def test_write_replaces_readme_summary_and_curves_together(tmp_path, monkeypatch):
  calls = _fake_plots(monkeypatch)
  report, runs, curves, meta = _hand_made()
  summary = w.write(str(tmp_path), report, runs, curves, meta, n_boot=N_BOOT)
  text, _, _ = w.build(report, runs, curves, meta, n_boot=N_BOOT)
  assert (tmp_path / "README.md").read_text() == text
  assert (
    "`python -m rove_jax.cli.eval --suite full --yarn all --ppl-tokens 128 "
    "--ruler-lengths 64,128 --compare ...`"
  ) in text  # the sizing the report was scored at
  assert json.loads((tmp_path / "summary.json").read_text())["claims"] == summary["claims"]
  assert (tmp_path / "loss_curves.png").read_bytes() == b"\x89PNG loss"
  assert calls == [("loss_curves", 9)]  # no retrieval records: no retrieval plot
  assert not (tmp_path / w.RECALL_PNG).exists()
  before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  # A failure while writing the second file (a full disk) replaces none of the three.
  original = report_files._write_data

  def fail_on_summary(f, data, path):
    if path.endswith("summary.json"):
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report_files, "_write_data", fail_on_summary)
  meta2 = {**meta, "commit": "def"}
  with pytest.raises(OSError, match="No space"):
    w.write(str(tmp_path), report, runs, {}, meta2, n_boot=N_BOOT)
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files left
  monkeypatch.setattr(report_files, "_write_data", original)
  assert "(loss_curves.png)" in text
  w.write(str(tmp_path), report, runs, {}, meta2, n_boot=N_BOOT)  # no curves: no link, no file
  text2 = (tmp_path / "README.md").read_text()
  assert "def" in text2 and "(loss_curves.png)" not in text2
  assert not (tmp_path / "loss_curves.png").exists()


def _fake_plots(monkeypatch):
  """study.plots' PNG renderers replaced by stand-ins that record their calls
  (tests/evaluation/test_plots.py
  covers the drawing; these tests cover which files the write-up writes and links)."""
  from study import plots

  calls = []

  def loss_curves(curves, runs, names):
    calls.append(("loss_curves", len(runs)))
    return b"\x89PNG loss" if any("loss" in r for rows in curves.values() for r in rows) else None

  def retrieval_study(records, *, title="", train_lengths=()):
    calls.append(("retrieval_study", len(records), list(train_lengths)))
    return b"\x89PNG recall" if records else None

  monkeypatch.setattr(plots, "loss_curves", loss_curves)
  monkeypatch.setattr(plots, "retrieval_study", retrieval_study)
  return calls


def test_write_adds_the_retrieval_study_and_its_plot(tmp_path, monkeypatch):
  from study import stats

  calls = _fake_plots(monkeypatch)
  report, runs, curves, meta = _hand_made()
  records = _recall_records()
  w.write(str(tmp_path), report, runs, {}, meta, recall=records, n_boot=N_BOOT)
  text = (tmp_path / "README.md").read_text()
  assert (tmp_path / w.RECALL_PNG).read_bytes() == b"\x89PNG recall"
  assert ("retrieval_study", len(records), [16]) in calls  # T = length / multiple
  study = _section(text, "## Retrieval study")
  assert f"![retrieval study]({w.RECALL_PNG})" in study
  cells = [
    r["sample_correct"]
    for r in records
    if (r["encoding"], r["setting"], r["length"]) == ("rove", "none", 64)
  ]
  iv = stats.mean_interval(cells, n_boot=N_BOOT, seed=0)
  row = next(line for line in study.splitlines() if line.startswith("| RoVE | no YaRN |"))
  assert row.endswith(f"{iv.estimate:.2f} [{iv.lower:.2f}, {iv.upper:.2f}] |")
  # The paragraph's tally, from the comparisons past T = 16: accuracy higher at 64 (both
  # settings), level at 32 (both).
  assert (
    "Of the 4 length-setting cells past the training length, RoVE's accuracy is higher "
    "than RoPE's (paired t over seed pairs, p < 0.05) in 2, lower in 0, and neither "
    "in 2;" in study
  )
  rows = [c for c in _claims(text) if c[2].startswith("retrieval study")]
  assert [c[4] for c in rows if "accuracy" in c[2]] == ["supports", "supports"]
  w.write(str(tmp_path), report, runs, {}, meta, n_boot=N_BOOT)  # no records: no stale plot
  assert not (tmp_path / w.RECALL_PNG).exists()


def test_retrieval_cells_where_every_answer_is_right_get_no_verdict(monkeypatch):
  """At the ceiling (both encodings right on > 95 % of the queries) a systematic but tiny NLL
  difference would pass the interval test; it is shown with no verdict."""
  _fake_plots(monkeypatch)
  report, runs, curves, meta = _hand_made()
  records = _recall_records()
  for r in records:
    if r["setting"] == "yarn" and r["length"] > 16:  # every answer right, RoVE 0.001 lower
      r["sample_correct"], r["accuracy"] = [1] * 4, 1.0
      r["sample_nll"] = [0.01 - 0.001 * (r["encoding"] == "rove") + 0.0001 * r["seed"]] * 4
      r["nll"] = r["sample_nll"][0]
  text, _, _ = w.build(
    report, runs, curves, {**meta, "recall_rerun": False}, recall=records, n_boot=N_BOOT
  )
  rows = {
    (c[2].split(",")[1].split(":")[0].strip(), "NLL" in c[2]): c[4]
    for c in _claims(text)
    if c[2].startswith("retrieval study")
  }
  assert rows[("YaRN", False)] == "at the ceiling: RoVE 24/24, RoPE 24/24 correct"
  assert rows[("YaRN", True)] == "at the ceiling: every answer right, no verdict"
  assert rows[("no YaRN", False)] == "supports"  # the rest keeps its verdicts
  study = _section(text, "## Retrieval study")
  assert "both at the ceiling (no verdict) in 2" in study
  yarn = [line for line in study.splitlines() if line.startswith("| RoVE - RoPE | YaRN")]
  # every cell of both YaRN rows: past T by construction, at T = 16 both were 4/4 already
  assert len(yarn) == 2 and all(line.count("at the ceiling") == 3 for line in yarn)
  assert "the retrieval study's records are an earlier run's, not rerun" in text


@pytest.mark.slow
def test_reproduce_quick_end_to_end(tmp_path):
  env = subprocess_env(devices=None)
  out, runs_dir = tmp_path / "results", tmp_path / "runs"
  cmd = [
    sys.executable,
    os.path.join(ROOT, "reproduce.py"),
    "--quick",
    "--out",
    str(out),
    "--runs-dir",
    str(runs_dir),
    "--seeds",
    "0",
    "--encodings",
    "rove,rope",
    "--steps",
    "4",
    "--no-recall",
    "--long-seeds",
    "0",
    "--lrs",
    "",
  ]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  text = (out / "README.md").read_text()
  assert "--quick smoke run" in text
  assert "| RoVE | 1 |" in text and "| RoPE | 1 |" in text
  assert "## The paper's claims, one by one" in text and "(1 seed: units only)" in text
  report = json.loads((out / "eval" / "report.json").read_text())
  report_lib.validate(report)
  assert sorted(r["model"]["pos_encoding"] for r in report["runs"]) == ["rope", "rove"]
  assert all(r["step"] == 4 for r in report["runs"])
  summary = json.loads((out / "summary.json").read_text())
  assert summary["meta"]["quick"] is True and summary["claims"]
  assert (out / "loss_curves.png").stat().st_size > 0
  for png in ("perplexity_vs_length.png", "figure1_mixer.png"):
    assert (out / "eval" / png).stat().st_size > 0
  # Rerunning resumes each run from its newest checkpoint: train.py's resume is tested in
  # tests/train/test_loop.py and tests/train/test_loop_faults.py, and reproduce.py passes each run
  # the same
  # workdir every time (plan()); a second full invocation here cost a minute of the CI budget.
  with open(runs_dir / "rove-s0" / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f if line.strip()]
  assert steps == sorted(steps) and max(steps) == 4


def test_reproduce_evaluation_command():
  """The full evaluation's sizing reaches rove-eval; --quick keeps the quick suite as it is."""
  import reproduce

  args = reproduce.parse_args(["--seeds", "0", "--encodings", "rove,rope"])
  runs = reproduce.plan(args)
  cmd = reproduce.eval_command(args, runs, "out/eval")
  parsed = cli.parse_args(cmd[3:])  # after python -m rove_jax.cli.eval
  from study.checkout import load_config

  T = load_config(reproduce.CONFIG).data.seq_len
  assert parsed.suite == "full" and parsed.yarn == "all" and parsed.out == "out/eval"
  assert [parsed.workdir, *parsed.compare] == [r["workdir"] for r in runs]
  assert parsed.ppl_tokens == reproduce.PPL_TOKENS
  assert parsed.ruler_lengths == [m * T for m in reproduce.RULER_MULTIPLES]
  quick = reproduce.parse_args(["--quick"])
  parsed = cli.parse_args(reproduce.eval_command(quick, runs, "q")[3:])
  assert parsed.suite == "quick" and parsed.ppl_tokens is None and parsed.ruler_lengths is None


def test_reproduce_rejects_bad_arguments():
  import reproduce

  for argv in (["--seeds", "a"], ["--encodings", "alibi"], ["--steps", "0"], ["--seeds", ""]):
    with pytest.raises(SystemExit) as e:
      reproduce.parse_args(argv)
    assert e.value.code == 2


def test_plan_pairs_eight_seeds_and_adds_the_two_checks():
  import reproduce

  plan = reproduce.plan(reproduce.parse_args([]))
  main = [r for r in plan if r["kind"] == "main"]
  assert [(r["encoding"], r["seed"]) for r in main] == [
    (e, s) for e in ("rove", "rope") for s in range(8)
  ] + [("nope", s) for s in range(3)]
  assert [r["seed"] for r in main if r["full_eval"]] == [0, 1, 2] * 3
  steps = reproduce.base_steps(reproduce.parse_args([]))
  assert [(r["encoding"], r["seed"], r["steps"]) for r in plan if r["kind"] == "long"] == [
    (e, s, 3 * steps) for s in (0, 1, 2) for e in ("rove", "rope")
  ]
  args = reproduce.parse_args([])
  assert args.sweep_grids == {e: [1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2] for e in ("rove", "rope")}
  assert not [r for r in plan if r["kind"] == "lr"]  # the sweep tunes instead
  assert reproduce.parse_args(["--quick"]).sweep_grids == {}
  args = reproduce.parse_args(["--sweep-lrs", "", "--lrs", "1e-3,4e-3"])
  plan = reproduce.plan(args)
  assert [(r["encoding"], r["seed"], r["lr"]) for r in plan if r["kind"] == "lr"] == [
    (e, 0, lr) for lr in (1e-3, 4e-3) for e in ("rove", "rope")
  ]
  assert len({r["workdir"] for r in plan}) == len(plan)  # one workdir a run
  long_run = next(r for r in plan if r["kind"] == "long")
  assert f"--config.steps={3 * steps}" in reproduce.overrides(args, long_run)
  lr_run = next(r for r in plan if r["kind"] == "lr")
  assert "--config.optim.lr=0.001" in reproduce.overrides(args, lr_run)
  assert not any(o.startswith("--config.steps") for o in reproduce.overrides(args, main[0]))
  plan = reproduce.plan(
    reproduce.parse_args(
      ["--nope-seeds", "1", "--long-seeds", "0", "--lrs", "", "--full-eval-seeds", "0"]
    )
  )
  assert [r["seed"] for r in plan if r["encoding"] == "nope"] == [0]
  assert {r["kind"] for r in plan} == {"main"} and all(r["full_eval"] for r in plan)
  for bad in (["--nope-seeds", "-1"], ["--long-multiple", "1"], ["--lrs", "x"], ["--lrs", "2"]):
    with pytest.raises(SystemExit):
      reproduce.parse_args(bad)


def _fake_reproduce(monkeypatch, tmp_path, *, recall_present, extra=()):
  """reproduce.main's children faked: training does nothing, the evaluation writes the
  hand-made report, the retrieval study its records. Returns (commands, write calls)."""
  import reproduce
  from study import writeup

  report = _hand_made()[0]
  calls, writes = [], []

  def fake_call(cmd, env=None):
    calls.append(cmd)
    out = cmd[cmd.index("--out") + 1] if "--out" in cmd else None
    if "rove_jax.cli.eval" in cmd:
      os.makedirs(out, exist_ok=True)
      with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f)
    elif reproduce.RECALL_STUDY in cmd:
      os.makedirs(out, exist_ok=True)
      with open(os.path.join(out, "recall.json"), "w") as f:
        json.dump({"records": _recall_records()}, f)
    return 0

  def fake_run(todo, n=None, log=print):
    for job in todo:
      fake_call(job.cmd)
    return [(0, 1.0)] * len(todo)

  monkeypatch.setattr(recall_runs.subprocess, "call", fake_call)
  monkeypatch.setattr(reproduce.jobs, "run", fake_run)
  monkeypatch.setattr(recall_runs, "recall_available", lambda: recall_present)
  monkeypatch.setattr(reproduce, "machine", lambda: "m")
  monkeypatch.setattr(writeup, "write", lambda *a, **k: writes.append((a, k)))
  argv = [
    "--out",
    str(tmp_path / "out"),
    "--runs-dir",
    str(tmp_path / "runs"),
    "--sweep-lrs",
    "",
    *extra,
  ]  # the sweep's order: tests/study/test_sweep.py
  assert reproduce.main(argv) == 0
  return calls, writes


def test_reproduce_evaluates_every_setting_then_the_retrieval_study(tmp_path, monkeypatch):
  import reproduce

  calls, writes = _fake_reproduce(monkeypatch, tmp_path, recall_present=True)
  train = [c for c in calls if c[1].endswith("train.py")]
  full, ppl = [c for c in calls if "rove_jax.cli.eval" in c]
  studies = [c for c in calls if reproduce.RECALL_STUDY in c]
  assert len(train) == 25 and calls.index(full) > calls.index(train[-1])
  workdirs = (
    lambda c: [
      c[c.index("--workdir") + 1],
      *c[
        c.index("--compare") + 1 : c.index(  # noqa
          "--suite"
        )
      ],
    ]
  )
  assert [os.path.basename(w) for w in workdirs(full)] == [
    f"{e}-s{s}" for e in ("rove", "rope", "nope") for s in (0, 1, 2)
  ]
  assert "--tasks" not in full and full[full.index("--yarn") + 1] == "all"
  # the added seeds and the training-length check: perplexity only, every setting
  assert ppl[ppl.index("--tasks") + 1] == "ppl" and ppl[ppl.index("--yarn") + 1] == "all"
  assert [os.path.basename(w) for w in workdirs(ppl)] == [
    f"{e}-s{s}" for e in ("rove", "rope") for s in range(3, 8)
  ] + [f"{e}-s{s}-steps900" for s in (0, 1, 2) for e in ("rove", "rope")]
  assert "--ruler-lengths" not in ppl
  assert all(calls.index(st) > calls.index(ppl) for st in studies)
  by_task = {c[c.index("--task") + 1]: c for c in studies}
  assert sorted(by_task) == ["lastwrite", "mqar", "offset"]
  assert by_task["mqar"][by_task["mqar"].index("--out") + 1] == str(tmp_path / "out" / "recall")
  assert by_task["mqar"][by_task["mqar"].index("--seeds") + 1] == "0,1,2"
  for task in ("lastwrite", "offset"):
    c = by_task[task]
    assert c[c.index("--out") + 1] == str(tmp_path / "out" / f"recall_{task}")
    assert c[c.index("--seeds") + 1] == "0,1,2,3,4" and c[c.index("--nope-seeds") + 1] == "2"
  [(args, kwargs)] = writes
  assert kwargs["recall"] == _recall_records()
  assert set(kwargs["positions"]) == {"lastwrite", "offset"}
  assert kwargs["ppl_report"] is not None


def test_reproduce_without_the_retrieval_study_writes_no_records(tmp_path, monkeypatch, capsys):
  import reproduce

  calls, writes = _fake_reproduce(monkeypatch, tmp_path, recall_present=False)
  assert not [c for c in calls if reproduce.RECALL_STUDY in c]
  assert writes[0][1]["recall"] is None
  assert "retrieval study (mqar): skipped" in capsys.readouterr().out


def test_no_recall_keeps_an_earlier_runs_records_and_the_note(tmp_path, monkeypatch, capsys):
  import reproduce

  (tmp_path / "out" / "recall").mkdir(parents=True)
  (tmp_path / "out" / "recall" / "recall.json").write_text(
    json.dumps({"records": _recall_records()})
  )
  calls, writes = _fake_reproduce(
    monkeypatch, tmp_path, recall_present=True, extra=("--no-recall", "--note", "resumed")
  )
  assert not [c for c in calls if reproduce.RECALL_STUDY in c]  # not rerun
  assert writes[0][1]["recall"] == _recall_records()
  assert writes[0][0][4]["notes"] == "resumed"  # meta
  assert "the write-up uses the records of an earlier run" in capsys.readouterr().out


def test_write_only_redoes_the_write_up_from_an_earlier_runs_files(tmp_path, monkeypatch):
  import reproduce

  _fake_plots(monkeypatch)
  monkeypatch.setattr(reproduce, "commit", lambda: "abc1234")
  report, _, _, meta = _hand_made()
  out, runs_dir = tmp_path / "out", tmp_path / "runs"
  argv = ["--out", str(out), "--runs-dir", str(runs_dir), "--sweep-lrs", "", "--write-only"]
  with pytest.raises(SystemExit, match="needs an earlier run's"):
    reproduce.main(argv)
  (out / "eval").mkdir(parents=True)
  (out / "eval" / "report.json").write_text(json.dumps(report))
  (out / "recall").mkdir()
  (out / "recall" / "recall.json").write_text(json.dumps({"records": _recall_records()}))
  workdirs = [r["workdir"] for r in reproduce.plan(reproduce.parse_args(argv))]
  meta = {
    **meta,
    "command": "python reproduce.py --no-recall",
    "notes": "trained earlier",
    "train_seconds": dict.fromkeys(workdirs, 60.0),
  }
  (out / "summary.json").write_text(json.dumps({"meta": meta}))
  with pytest.raises(SystemExit, match="give the same --runs-dir, --seeds and --encodings"):
    reproduce.main(argv + ["--seeds", "0"])
  with pytest.raises(SystemExit, match="needs every run's metrics.jsonl"):
    reproduce.main(argv)  # the runs are gone: their loss curves would be lost
  assert not (out / "README.md").exists()
  for workdir in workdirs:
    os.makedirs(workdir)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.write(
        "\n".join(
          json.dumps(r)
          for r in ({"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0, "val_loss": 4.5})
        )
      )
  assert reproduce.main(argv) == 0
  text = (out / "README.md").read_text()
  assert (
    "- Notes: trained earlier; write-up redone from the same report by `python "
    "reproduce.py --write-only` at abc1234"
  ) in text
  assert "## Retrieval study" in text
  assert "the retrieval study's records are an earlier run's, not rerun" in text  # --no-recall
  summary = json.loads((out / "summary.json").read_text())
  assert summary["meta"]["recall_rerun"] is False and summary["claims"]


# ---------------------------------------------------------- the paper-scale recipe (--scale)


def _scale(capsys, tmp_path, *extra):
  """reproduce.main on a --scale command line: (exit code, stdout, stderr). The parquet shard
  is empty: a dry run only checks that the data exists, never reads it."""
  import reproduce

  (tmp_path / "fw").mkdir(exist_ok=True)
  (tmp_path / "fw" / "000_00000.parquet").write_bytes(b"")
  argv = ["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), *extra]
  try:
    code = reproduce.main(argv)
  except SystemExit as e:
    code = e.code
  out, err = capsys.readouterr()
  return code, out, err


def _commands(out, program):
  return [
    shlex.split(line) for line in out.splitlines() if line.strip().startswith(f"python {program}")
  ]


@pytest.mark.parametrize("preset", ["gpt2_124m", "gpt2_354m"])
def test_scale_dry_run_prints_the_paper_plan(capsys, tmp_path, preset):
  data = str(tmp_path / "fw" / "*.parquet")
  code, out, err = _scale(
    capsys, tmp_path, "--scale", preset, "--data", data, "--dry-run", "--sweep-lrs", ""
  )  # untuned: test_paper_sweep.py plans the sweep
  assert code == 0, err
  train = _commands(out, "train.py")
  assert [t[t.index("--workdir") + 1] for t in train] == [
    str(tmp_path / "runs" / "rove-s0"),
    str(tmp_path / "runs" / "rope-s0"),
  ]
  for cmd, enc in zip(train, ("rove", "rope")):
    assert cmd[cmd.index("--config") + 1].endswith(f"configs/{preset}.py")
    assert f"--config.model.pos_encoding={enc}" in cmd and f"--config.data.path={data}" in cmd
  [ev] = _commands(out, "-m rove_jax.cli.eval")
  assert ev[ev.index("--lengths") + 1] == "512,1024,2048,4096,8192,16384"
  assert ev[ev.index("--ruler-lengths") + 1] == "4096,8192"  # the paper's RULER lengths
  assert ev[ev.index("--yarn") + 1] == "all" and "--icl-tasks" not in ev
  assert "Core: SKIPPED: no --icl-tasks" in out and "one seed (0): a cost choice" in out
  # Cost lines: each cites its compiled figures; the numbers are the JSON's.
  from study import paper_recipe

  steps = paper_recipe.load_config(preset).steps
  cited = re.findall(r"^  (\w+) on (\S+) .*\[(\S+\.json)\]$", out, re.M)
  assert [c[0] for c in cited] == ["rove", "rope"]
  for enc, _, path in cited:
    with open(os.path.join(ROOT, path) if not os.path.isabs(path) else path) as f:
      [row] = [r for r in json.load(f)["reports"] if r["job"] == "train"]
    assert row["pos_encoding"] == enc
    hours = steps * row["roofline"]["step_time_bound_s"] / 3600
    flops = steps * row["flops"] * row["devices"]
    assert (
      f">= {hours:.2f} h a run, >= {hours * row['devices']:.1f} device-hours; "
      f"{flops:.3e} FLOPs a run" in out
    )
    cmd = train[["rove", "rope"].index(enc)]
    assert f"--config.mesh.data={row['mesh']['data']}" in cmd
    assert f"--config.optim.grad_accum={row['grad_accum']}" in cmd
  assert "compiled-figure bounds, not measurements" in out
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_scale_printed_commands_parse_with_train_and_eval_parsers(capsys, tmp_path):
  """The printed train.py commands load and validate with rove-train's own flag parsing (the
  config file and every override, nothing trained); the rove-eval one parses too."""
  from absl import flags

  from rove_jax.cli import eval as cli
  from rove_jax.cli import train as train_cli
  from rove_jax.train import overrides

  data = str(tmp_path / "fw" / "*.parquet")
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_124m",
    "--data",
    data,
    "--topology",
    "v5e-8",
    "--sweep-lrs",
    "",
    "--dry-run",
  )
  assert code == 0, err
  FLAGS = flags.FLAGS
  for cmd, enc in zip(_commands(out, "train.py"), ("rove", "rope")):
    argv = train_cli._rewrite_config_flag(["rove-train", *cmd[2:]])
    given = overrides.split(argv[1:])
    assert not [p for p in (overrides.problem(k, v) for k, v in given) if p]
    try:
      assert FLAGS([a for a in argv if not a.startswith("--config.")]) == ["rove-train"]
      c = overrides.apply(overrides.load_file(FLAGS.config), given)
      model = c.model
    finally:
      FLAGS.unparse_flags()
    assert model.pos_encoding == enc and model.n_layer == 12 and c.data.path == data
    assert (c.data.batch_size, c.data.seq_len, c.data.tokenizer) == (512, 1024, "tiktoken:gpt2")
    assert (c.mesh.data, c.optim.grad_accum) == (8, 8)  # bench/aot_results/124m_*_v5e-8.json
  [ev] = _commands(out, "-m rove_jax.cli.eval")
  args = cli.parse_args(ev[3:])
  assert args.suite == "full" and args.lengths == [512, 1024, 2048, 4096, 8192, 16384]


def test_scale_without_compiled_figures_prints_analytic_flops(capsys, tmp_path, monkeypatch):
  import rove_jax.nn.model

  monkeypatch.setattr(rove_jax.nn.model, "param_count", lambda cfg: 1000)
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_354m",
    "--data",
    str(tmp_path / "fw"),
    "--topology",
    "v6e-16",
    "--encodings",
    "rove",
    "--aot-dir",
    str(tmp_path),
    "--sweep-lrs",
    "",
    "--dry-run",
  )
  assert code == 0, err
  tokens = 19073 * 512 * 1024
  assert f"6 x 1,000 x {tokens:,} = {6000 * tokens:.3e} FLOPs" in out
  assert (
    "python -m bench.aot --config configs/gpt2_354m.py --topology v6e-16 "
    "--config.model.pos_encoding=rove --recommend --json"
  ) in out
  [cmd] = _commands(out, "train.py")
  assert not [t for t in cmd if t.startswith(("--config.mesh", "--config.optim.grad_accum"))]


def test_scale_dry_run_needs_no_data_files(capsys, tmp_path):
  code, out, err = _scale(capsys, tmp_path, "--scale", "gpt2_124m", "--dry-run", "--sweep-lrs", "")
  assert code == 0, err
  from study import paper_recipe

  assert f"data: {paper_recipe.EXAMPLE_DATA!r}, not found here (a dry run plans" in out
  train = _commands(out, "train.py")
  assert len(train) == 2 and all(
    f"--config.data.path={paper_recipe.EXAMPLE_DATA}" in t for t in train
  )
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_124m",
    "--dry-run",
    "--data",
    str(tmp_path / "none" / "*.parquet"),
  )
  assert code == 0 and "not found here" in out, err


def test_scale_input_errors_exit_2_before_any_work(capsys, tmp_path):
  code, _, err = _scale(capsys, tmp_path, "--scale", "gpt2_124m")  # not a dry run: would train
  assert code == 2 and "--data is required to run the plan" in err
  code, _, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--data", str(tmp_path / "none" / "*.parquet")
  )  # not a dry run: would train
  assert code == 2 and "--data: the glob" in err and "matched no files" in err
  code, _, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_124m",
    "--data",
    str(tmp_path / "fw"),
    "--icl-tasks",
    str(tmp_path / "core.json"),
  )
  assert code == 2 and "--icl-tasks" in err and "does not exist" in err
  code, _, err = _scale(
    capsys, tmp_path, "--scale", "gpt2_124m", "--data", str(tmp_path / "fw"), "--topology", "v9-8"
  )
  assert code == 2 and "unknown topology 'v9-8'" in err
  assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()
  import reproduce
  from study import paper_recipe

  assert reproduce.SCALES == paper_recipe.PRESETS


def test_scale_runs_the_plan_in_order_and_writes_the_report(capsys, tmp_path, monkeypatch):
  """Without --dry-run: every train command, then the one evaluation (faked here), then
  --out/README.md; a failed run stops the plan with how to resume it."""
  from study import paper_recipe

  calls = []

  def fake_call(cmd, env=None):
    calls.append(cmd)
    if "rove_jax.cli.eval" in cmd:
      out = cmd[cmd.index("--out") + 1]
      os.makedirs(out)
      with open(os.path.join(out, "report.md"), "w") as f:
        f.write("# Evaluation report\n\n| run | 512 |\n|---|---|\n| rove-s0 | 21.5 |\n")
    return 0

  monkeypatch.setattr(paper_recipe.subprocess, "call", fake_call)
  code, out, err = _scale(
    capsys,
    tmp_path,
    "--scale",
    "gpt2_124m",
    "--data",
    str(tmp_path / "fw"),
    "--encodings",
    "rove,rope",
    "--sweep-lrs",
    "",
  )
  assert code == 0, err
  assert [c[0] for c in calls] == [sys.executable] * 3
  assert [c[1].endswith("train.py") for c in calls] == [True, True, False]
  readme = (tmp_path / "out" / "README.md").read_text()
  assert "# Paper-scale run: gpt2_124m, rove vs rope" in readme and "| rove-s0 |" in readme
  assert "## Evaluation report\n\n| run | 512 |" in readme  # rove-eval's, one level down
  assert "Core: SKIPPED" in readme  # the plan, as printed, is part of the report
  monkeypatch.setattr(paper_recipe.subprocess, "call", lambda cmd, env=None: 3)
  with pytest.raises(SystemExit, match=r"training .*rove-s0 failed \(exit 3\); rerun"):
    paper_recipe.main(
      [
        "--scale",
        "gpt2_124m",
        "--data",
        str(tmp_path / "fw"),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
        "--sweep-lrs",
        "",
      ]
    )


def test_claims_table_families_duplicates_and_the_aggregation_guard(monkeypatch):
  text, summary, _ = w.build(*_hand_made(), n_boot=N_BOOT)
  primary = _section(text, "### Primary comparisons").split("### Exploratory")[0]
  from study import primary as primary_lib

  rows = {f: [r for r in summary["claims"] if r["family"] == f] for f in ("primary", "exploratory")}
  # b and c (no YaRN, YaRN) form the family; ICL (a) and RULER (e, f) left it
  assert [r["id"] for r in rows["primary"]] == ["b", "c", "c"]
  assert {r["id"] for r in rows["exploratory"] if r.get("left_primary")} == {"a", "e", "f"}
  m = {f: sum("p_holm" in r for r in rows[f]) for f in rows}
  assert m == {f: primary_lib.family_size(rows[f]) for f in rows} and m["primary"] == 3
  assert all(r["holm_m"] == m[r["family"]] for f in rows for r in rows[f] if "p_holm" in r)
  assert primary.startswith(f"### Primary comparisons (3 rows, {m['primary']} in Holm's family")
  assert f"### Exploratory rows ({len(rows['exploratory'])} rows, {m['exploratory']} in " in text
  assert f"Tally, Holm over {m['primary']} rows:" in primary
  assert "ICL (claim a) and RULER (claims e, f) left the primary family" in text
  claims = _claims(text)
  fams = [r["family"] for r in summary["claims"]]
  assert fams == sorted(fams, key=["primary", "exploratory", "yarn"].index)
  for r in summary["claims"]:  # Holm never makes a verdict stronger
    assert r["verdict_holm"] in (r["verdict"], "inconclusive"), r
  tests = [c[2] for c in claims]
  # the fixed factor is longest / T = 4: at 128 tokens (4x) it repeats the L / T row
  assert "perplexity at 128 tokens (4x), YaRN, fixed s: RoVE / RoPE - 1" not in tests
  assert "perplexity at 64 tokens (2x), YaRN, fixed s: RoVE / RoPE - 1" in tests
  d1 = [c for c in claims if c[0] == "d1"]
  assert d1 and all("factor L/T" in c[2] and c[5] is None for c in d1)
  assert "count neither for nor against RoVE" in text
  # the t-test column: 3 seed pairs on every tested primary row
  assert all(
    "(3 pairs)" in r_line
    for r_line in primary.splitlines()
    if r_line.startswith("| b |") or r_line.startswith("| c |")
  )
  # (f): RoVE worse on the other tasks, level on the aggregation tasks: the difference is
  # below 0, but the aggregation tasks do not improve
  monkeypatch.setitem(RULER, "rove", {"niah_single_1": 2.5, "vt": 3.0, "cwe": 2.5, "fwe": 3.0})
  monkeypatch.setitem(RULER, "rope", {"niah_single_1": 2.0, "vt": 2.5, "cwe": 2.5, "fwe": 3.0})
  text, _, _ = w.build(*_hand_made(), n_boot=N_BOOT)
  f_rows = [c for c in _claims(text) if c[0] == "f"]
  assert len(f_rows) == 2 and all(
    c[4] == "inconclusive: the aggregation tasks themselves do not improve" for c in f_rows
  )


def test_added_seeds_scored_on_perplexity_only_join_the_perplexity_rows_alone():
  report, runs, curves, meta = _hand_made()
  SEED_OFFSET[3] = SEED_OFFSET[4] = 0.0
  try:
    for enc in ("rove", "rope"):
      for seed in (3, 4):
        run = _run(enc, seed)
        run["ruler"] = run["icl"] = None
        report["runs"].append(run)
  finally:
    del SEED_OFFSET[3], SEED_OFFSET[4]
  text, summary, _ = w.build(report, runs, curves, meta, n_boot=N_BOOT)
  primary = {
    (r["id"], r["test"].split(":")[0]): r for r in summary["claims"] if r["family"] == "primary"
  }
  b = primary[("b", "perplexity at the training length (32 tokens), no YaRN")]
  assert b["t"]["n"] == 5  # five seed pairs scored on perplexity
  e = [r for r in summary["claims"] if r["id"] == "e" and r["test"].startswith("RULER")]
  assert e and all(r["t"]["n"] == 3 for r in e)  # RULER: the three pairs it scored
  a = [r for r in summary["claims"] if r["id"] == "a" and "pooled" in r["test"]]
  assert a and all(r.get("t") is None or r["t"]["n"] == 3 for r in a)
