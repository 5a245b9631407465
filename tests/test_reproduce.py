"""reproduce.py and the results write-up: seed statistics and verdicts by hand, and the whole
command end to end on tiny settings."""

import json
import math
import os
import subprocess
import sys

import pytest

from rove_jax.evaluation import report as report_lib
from rove_jax.evaluation import results_writeup as w
from tests.conftest import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(enc, seed, ppl_by_len, ruler_vt, icl_acc):
  lengths = sorted(ppl_by_len)
  return {"name": f"{enc}-s{seed}", "workdir": f"runs/{enc}-s{seed}", "step": 10,
          "model": {"pos_encoding": enc, "params": 1000, "n_layer": 2, "d_model": 64,
                    "n_head": 2, "max_len": lengths[0]},
          "perplexity": {"protocol": {},
                         "none": {str(L): {"loss": math.log(p), "ppl": p, "tokens": 100}
                                  for L, p in ppl_by_len.items()},
                         "yarn": {str(L): {"loss": math.log(p - 1), "ppl": p - 1, "tokens": 100}
                                  for L, p in ppl_by_len.items()}},
          "ruler": {"tasks": {"vt": {"512": {"nll": ruler_vt, "exact_match": 0.25, "n": 4}}},
                    "skipped": {}, "yarn": True},
          "icl": {"synthetic": {"tasks": {"recall": {"by_length": {"32": icl_acc},
                                                     "nll_by_length": {"32": 2.0},
                                                     "accuracy": icl_acc}},
                                "accuracy": icl_acc}, "files": None},
          "seconds": {}}


def test_stats_and_verdicts_by_hand():
  s = w.stats([10.0, 12.0])
  assert s["mean"] == 11.0 and s["spread"] == 1.0 and s["n"] == 2
  assert w.stats([None, float("nan")]) is None
  rope = w.stats([20.0, 22.0])  # mean 21 +- 1
  assert w.compare(w.stats([16.0, 18.0]), rope).startswith("agrees")       # gap 4 > noise 2
  assert w.compare(w.stats([19.0, 21.0]), rope).startswith("same direction, within")  # gap 1
  assert w.compare(w.stats([25.0, 27.0]), rope).startswith("disagrees")    # gap -5
  assert w.compare(w.stats([21.0, 23.0]), rope).startswith("opposite direction, within")
  assert "RoVE 19.0% better" in w.compare(w.stats([16.0, 18.0]), rope)
  assert w.compare(w.stats([0.6, 0.6]), w.stats([0.2, 0.3]), lower_is_better=False) \
      .startswith("agrees")
  assert "one seed" in w.compare(w.stats([16.0]), w.stats([21.0]))
  assert w.compare(None, rope) == "not measured"


def _hand_made():
  """(report, runs, curves, meta): two seeds of RoVE and RoPE, one of NoPE."""
  runs_rep = [_run("rove", 0, {32: 10.0, 128: 12.0}, 3.0, 0.5),
              _run("rove", 1, {32: 11.0, 128: 13.0}, 3.2, 0.4),
              _run("rope", 0, {32: 11.0, 128: 20.0}, 4.0, 0.1),
              _run("rope", 1, {32: 12.0, 128: 22.0}, 4.4, 0.2),
              _run("nope", 0, {32: 15.0, 128: 40.0}, 5.0, 0.0)]
  report = {"schema_version": report_lib.SCHEMA_VERSION, "suite": "full", "created": "now",
            "runs": runs_rep}
  report_lib.validate(report)
  runs = [{"encoding": r["model"]["pos_encoding"], "seed": int(r["name"][-1]),
           "workdir": r["workdir"]} for r in runs_rep]
  curves = {r["workdir"]: [{"step": 5, "loss": 3.0}, {"step": 10, "loss": 2.5},
                           {"step": 10, "val_loss": 2.6}] for r in runs}
  meta = {"command": "python reproduce.py", "commit": "abc", "machine": "m", "quick": False,
          "started": "t", "wall_seconds": 120.0, "train_seconds": {}}
  return report, runs, curves, meta


def test_build_tables_from_a_hand_made_report():
  report, runs, curves, meta = _hand_made()
  text, summary = w.build(report, runs, curves, meta)
  e = summary["encodings"]
  assert e["rove"]["table1"]["ppl"]["mean"] == pytest.approx(10.5)
  assert e["rove"]["table1"]["ppl"]["spread"] == pytest.approx(0.5)
  assert e["rope"]["ppl"]["yarn"]["128"]["mean"] == pytest.approx(20.0)
  assert e["nope"]["table1"]["ppl"]["n"] == 1
  assert e["rove"]["ruler"]["vt"]["mean"] == pytest.approx(3.1)
  verdicts = {c["claim"]: c["verdict"] for c in summary["claims"]}
  # 1x: 10.5 +- 0.5 vs 11.5 +- 0.5: gap 1.0 == noise 1.0, not beyond it.
  assert verdicts["RoVE lowers in-context perplexity (training length)"].startswith(
      "same direction, within")
  assert verdicts["RoVE lowers perplexity at 128 tokens (4x) without YaRN"].startswith("agrees")
  assert verdicts["RoVE lowers RULER NLL on vt"].startswith("agrees")
  assert verdicts["RoVE raises in-context-learning accuracy"].startswith("agrees")
  assert "| RoVE | 2 | " in text and "| NoPE | 1 | " in text
  assert "10.50 ± 0.50" in text  # the 1x perplexity cell
  assert "best cell of any run: 0.25" in text
  for name in ("rove-s0", "rove-s1", "rope-s0", "rope-s1", "nope-s0"):  # every run reported
    assert f"| {name} |" in text


def test_write_replaces_readme_summary_and_curves_together(tmp_path, monkeypatch):
  report, runs, curves, meta = _hand_made()
  summary = w.write(str(tmp_path), report, runs, curves, meta)
  text, _ = w.build(report, runs, curves, meta)
  assert (tmp_path / "README.md").read_text() == text
  assert json.loads((tmp_path / "summary.json").read_text())["claims"] == summary["claims"]
  png = (tmp_path / "loss_curves.png").read_bytes()
  assert png.startswith(b"\x89PNG")
  before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
  # A failure while writing the second file (a full disk) replaces none of the three.
  original = report_lib._write_data

  def fail_on_summary(f, data, path):
    if path.endswith("summary.json"):
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report_lib, "_write_data", fail_on_summary)
  meta2 = {**meta, "commit": "def"}
  with pytest.raises(OSError, match="No space"):
    w.write(str(tmp_path), report, runs, {}, meta2)
  assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp files left
  monkeypatch.setattr(report_lib, "_write_data", original)
  assert "(loss_curves.png)" in text
  w.write(str(tmp_path), report, runs, {}, meta2)  # no curves logged: neither link nor file
  text2 = (tmp_path / "README.md").read_text()
  assert "def" in text2 and "(loss_curves.png)" not in text2
  assert not (tmp_path / "loss_curves.png").exists()


@pytest.mark.slow
def test_reproduce_quick_end_to_end(tmp_path):
  env = subprocess_env(devices=None)
  out, runs_dir = tmp_path / "results", tmp_path / "runs"
  cmd = [sys.executable, os.path.join(ROOT, "reproduce.py"), "--quick", "--out", str(out),
         "--runs-dir", str(runs_dir), "--seeds", "0", "--encodings", "rove,rope",
         "--steps", "4"]
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  text = (out / "README.md").read_text()
  assert "--quick smoke run" in text
  assert "| RoVE | 1 |" in text and "| RoPE | 1 |" in text
  assert "## Where the small-scale result agrees with the paper" in text
  report = json.loads((out / "eval" / "report.json").read_text())
  report_lib.validate(report)
  assert sorted(r["model"]["pos_encoding"] for r in report["runs"]) == ["rope", "rove"]
  assert all(r["step"] == 4 for r in report["runs"])
  summary = json.loads((out / "summary.json").read_text())
  assert summary["meta"]["quick"] is True and summary["claims"]
  assert (out / "loss_curves.png").stat().st_size > 0
  for png in ("perplexity_vs_length.png", "figure1_mixer.png"):
    assert (out / "eval" / png).stat().st_size > 0
  # A rerun resumes: the finished runs are not trained again. A retrained run would log no
  # "resumed", write new metrics lines (their tokens_per_s are timings, never equal twice) and
  # new checkpoint files.
  before = {name: _run_files(runs_dir / name) for name in ("rove-s0", "rope-s0")}
  proc2 = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc2.returncode == 0, proc2.stderr[-3000:]
  assert proc2.stdout.count("resumed from step 4 ") == 2, proc2.stdout[-3000:]
  for name, files in before.items():
    assert _run_files(runs_dir / name) == files, name
  with open(runs_dir / "rove-s0" / "metrics.jsonl") as f:
    steps = [json.loads(line)["step"] for line in f if line.strip()]
  assert steps == sorted(steps) and max(steps) == 4


def _run_files(workdir):
  """The metrics log's bytes and (path, mtime) of every checkpoint file of a training run."""
  ck = workdir / "checkpoints"
  return ((workdir / "metrics.jsonl").read_bytes(),
          sorted((str(p.relative_to(ck)), p.stat().st_mtime_ns) for p in ck.rglob("*")))


def test_reproduce_rejects_bad_arguments():
  import reproduce
  for argv in (["--seeds", "a"], ["--encodings", "alibi"], ["--steps", "0"], ["--seeds", ""]):
    with pytest.raises(SystemExit) as e:
      reproduce.parse_args(argv)
    assert e.value.code == 2
