"""Evaluation's command-line options end to end (rove_jax.evaluation.cli.main, what
`python -m eval` and `rove-eval` run) on the shared trained run: --yarn off / on / both,
--stride and --data-path, the numbers checked against the float64 reference of
tests/test_perplexity.py; RULER's QA tasks from --squad / --hotpot; quiet checkpoint reads."""

import json
import logging

import chex
import numpy as np
import pytest
from absl import logging as absl_logging

from rove_jax import checkpoint as ckpt_lib
from rove_jax.evaluation import cli, report, ruler, scoring
from tests.test_perplexity import (TRAIN_LEN, assert_row_matches, reference_model,
                                   reference_ppl)
from tests.test_ruler import SQUAD

LENGTHS = (TRAIN_LEN, 2 * TRAIN_LEN)
PPL_TOKENS = cli.SUITES["quick"]["ppl_tokens"]  # targets scored per length


def perplexity_report(workdir, out, *options) -> dict:
  """cli.main on the perplexity task alone; returns the run's "perplexity" entry."""
  argv = ["--workdir", str(workdir), "--out", str(out), "--tasks", "ppl", "--suite", "quick",
          "--lengths", ",".join(map(str, LENGTHS)), "--no-progress", *options]
  assert cli.main(argv) == 0
  return json.loads((out / "report.json").read_text())["runs"][0]["perplexity"]


@pytest.fixture(scope="module")
def by_yarn(trained_run, tmp_path_factory):
  out = tmp_path_factory.mktemp("eval-yarn")
  return {yarn: perplexity_report(trained_run, out / yarn, "--yarn", yarn)
          for yarn in ("off", "on", "both")}


def test_yarn_off_on_both_select_the_settings(by_yarn):
  off, on, both = by_yarn["off"], by_yarn["on"], by_yarn["both"]
  assert set(off) == {"protocol", "none"}
  assert set(on) == {"protocol", "yarn"}
  assert set(both) == {"protocol", "none", "yarn"}
  for rep in (off, on, both):
    assert rep["protocol"]["train_len"] == TRAIN_LEN
    assert rep["protocol"]["mode"] == "non-overlapping"
    for setting in set(rep) - {"protocol"}:
      assert set(rep[setting]) == {str(L) for L in LENGTHS}
  chex.assert_trees_all_close(off["none"], both["none"])  # each setting computed the same way
  chex.assert_trees_all_close(on["yarn"], both["yarn"])
  at_1x, at_2x = str(TRAIN_LEN), str(2 * TRAIN_LEN)
  assert both["yarn"][at_1x]["loss"] == both["none"][at_1x]["loss"]  # identity at 1x
  assert abs(both["yarn"][at_2x]["loss"] / both["none"][at_2x]["loss"] - 1) > 2e-5  # on at 2x


@pytest.mark.parametrize("stride", [None, 0.5])
def test_data_path_and_stride_score_the_given_text_file(trained_run, tmp_path, stride):
  rng = np.random.default_rng(3)
  words = ["def", "return", "self", "import", "for", "in", "if", "else:", "(x)", "=", "\n    "]
  text = " ".join(rng.choice(words, size=4000))
  # The file's last 2% is its held-out part; the scored windows end well before it.
  assert len(text) * 0.97 > PPL_TOKENS + 2 * TRAIN_LEN + 1
  (tmp_path / "held_out.txt").write_text(text)
  options = ["--data-path", str(tmp_path / "held_out.txt"), "--yarn", "both"]
  if stride is not None:
    options += ["--stride", str(stride)]
  got = perplexity_report(trained_run, tmp_path / "eval", *options)
  assert got["protocol"]["mode"] == ("non-overlapping" if stride is None else "sliding")
  assert got["protocol"]["stride_fraction"] == stride
  tokens = np.frombuffer(text.encode(), np.uint8)
  model = reference_model(scoring.load_run(str(trained_run)))
  for L in LENGTHS:
    for setting, yarn_train_len in (("none", None), ("yarn", TRAIN_LEN)):
      kw = dict(max_tokens=PPL_TOKENS, yarn_train_len=yarn_train_len)
      want = reference_ppl(model, tokens, L, stride=None if stride is None else int(L * stride),
                           **kw)
      assert_row_matches(got[setting][str(L)], want, (setting, L, stride))
      if stride is not None:  # sliding windows give the targets other contexts
        other = reference_ppl(model, tokens, L, **kw)
        assert abs(want["loss"] - other["loss"]) > 1e-4 * other["loss"], (want, other)


def test_a_failed_report_write_keeps_the_old_report_and_a_rerun_drops_stale_plots(
    trained_run, tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(cli.SUITES, "quick", {**cli.SUITES["quick"], "ppl_tokens": 256})
  out = tmp_path / "eval"
  out.mkdir()
  before = {name: f"an earlier report's {name}".encode() for name in (
      "report.json", "report.md", *report.PLOT_FILES.values(), "mine.png")}
  for name, data in before.items():
    (out / name).write_bytes(data)
  argv = ["--workdir", str(trained_run), "--out", str(out), "--tasks", "ppl", "--lengths",
          str(TRAIN_LEN), "--yarn", "off", "--no-progress"]
  original = report._write_data

  def disk_full_at_json(f, data, path):
    if path.endswith("report.json"):
      original(f, data[:10], path)
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report, "_write_data", disk_full_at_json)
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  assert err.splitlines()[-1] == "rove-eval: error: [Errno 28] No space left on device"
  assert "Traceback" not in err
  assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no change, no temp files
  monkeypatch.setattr(report, "_write_data", original)
  assert cli.main(argv) == 0
  md = (out / "report.md").read_text()
  assert md.strip() in capsys.readouterr().out  # printed as written
  assert md.strip().splitlines()[-1] == "Plots: perplexity_vs_length.png, figure1_mixer.png"
  assert sorted(p.name for p in out.iterdir()) == [  # the earlier ruler and icl plots are gone
      "figure1_mixer.png", "mine.png", "perplexity_vs_length.png", "report.json", "report.md"]
  for name in ("figure1_mixer.png", "perplexity_vs_length.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG", name
  assert json.loads((out / "report.json").read_text())["runs"][0]["perplexity"]["none"]


def test_ruler_scores_qa_1_from_squad_and_reports_qa_2_skipped(trained_run, tmp_path):
  squad = tmp_path / "squad.json"
  squad.write_text(json.dumps(SQUAD))
  args = cli.parse_args(["--workdir", str(trained_run), "--out", str(tmp_path / "eval"),
                         "--tasks", "ruler", "--yarn", "off", "--squad", str(squad),
                         "--no-progress"], check_files=True)
  suite = {**cli.SUITES["quick"], "ruler_multiples": (8,), "ruler_tasks": ("qa_1", "qa_2"),
           "ruler_samples": 1}
  run = scoring.load_run(str(trained_run))
  result = cli.evaluate_run(run, args, suite)
  got, length = result["ruler"], 8 * TRAIN_LEN
  assert list(got["tasks"]) == ["qa_1"] and list(got["tasks"]["qa_1"]) == [str(length)]
  assert list(got["skipped"]) == ["qa_2"]
  assert got["skipped"]["qa_2"].startswith("needs --hotpot FILE: a local HotpotQA dev JSON")
  md = report.markdown({"suite": "quick", "runs": [result]})
  assert "- qa_2: skipped (needs --hotpot FILE" in md
  # The same sample scored directly: the report holds qa_1's real answer NLL.
  want = ruler.evaluate(scoring.Scorer(run).score_fn(), run.tokenizer, tasks=["qa_1"],
                        lengths=[length], samples_per_task=1, seed=0,
                        haystack_texts=cli._haystack_texts(run), squad_path=squad,
                        progress=False)["tasks"]["qa_1"][str(length)]
  row = got["tasks"]["qa_1"][str(length)]
  assert row["n"] == 1 and np.isfinite(row["nll"]) and row["nll"] > 0
  np.testing.assert_allclose(row["nll"], want["nll"], rtol=1e-5)
  assert row["exact_match"] == want["exact_match"]


def test_reading_a_run_logs_no_read_only_warnings(trained_run, caplog):
  caplog.set_level(logging.INFO)
  absl = logging.getLogger("absl")
  filters = list(absl.filters)
  run = scoring.load_run(str(trained_run))
  assert run.step == 6
  said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert [m for m in said if "read_only" in m or "read only" in m] == []
  assert absl.filters == filters  # nothing stays installed
  caplog.clear()
  with ckpt_lib._without_read_only_notice(True):  # only that one message is dropped
    absl_logging.warning("Given directory is read only=%s", "/x")
    absl_logging.warning("a real problem")
  assert [r.getMessage() for r in caplog.records] == ["a real problem"]
