"""Evaluation's command-line options end to end (rove_jax.cli.eval.main, what `rove-eval`
runs) on the shared trained run: --yarn off / on / both / all
(yarn_fixed at one factor), --stride and --data-path, the numbers checked against the float64
reference of tests/evaluation/test_perplexity.py; a report written to gs:// (the session's GCS API
server)
with the local report's numbers; RULER with and without YaRN, its QA tasks from --squad /
--hotpot; ICL inside the training context; quiet checkpoint reads."""

import json
import logging

import chex
import numpy as np
import pytest
from absl import logging as absl_logging

from rove_jax.cli import eval as cli
from rove_jax.evaluation import partial, report, report_files, report_md, scoring
from rove_jax.evaluation import tasks as eval_tasks
from rove_jax.evaluation.ruler import suite as ruler
from rove_jax.storage import paths
from rove_jax.train import checkpoint as ckpt_lib
from tests import gcs_server
from tests.evaluation.test_perplexity import (
  TRAIN_LEN,
  assert_row_matches,
  reference_model,
  reference_ppl,
)
from tests.evaluation.test_ruler import SQUAD

LENGTHS = (TRAIN_LEN, 2 * TRAIN_LEN)
PPL_TOKENS = cli.SUITES["quick"]["ppl_tokens"]  # targets scored per length


def perplexity_report(workdir, out, *options) -> dict:
  """cli.main on the perplexity task alone; returns the run's "perplexity" entry."""
  argv = [
    "--workdir",
    str(workdir),
    "--out",
    str(out),
    "--tasks",
    "ppl",
    "--suite",
    "quick",
    "--lengths",
    ",".join(map(str, LENGTHS)),
    "--no-progress",
    *options,
  ]
  assert cli.main(argv) == 0
  return json.loads((out / "report.json").read_text())["runs"][0]["perplexity"]


@pytest.fixture(scope="module")
def by_yarn(trained_run, tmp_path_factory):
  out = tmp_path_factory.mktemp("eval-yarn")
  # "both" (none and yarn) is "all" without yarn_fixed (tests/evaluation/test_perplexity.py runs
  # it).
  return {
    yarn: perplexity_report(trained_run, out / yarn, "--yarn", yarn)
    for yarn in ("off", "on", "all")
  }


def test_yarn_off_on_all_select_the_settings(by_yarn):
  off, on, all_ = by_yarn["off"], by_yarn["on"], by_yarn["all"]
  assert set(off) == {"protocol", "none"}
  assert set(on) == {"protocol", "yarn"}
  assert set(all_) == {"protocol", "none", "yarn", "yarn_fixed"}
  assert cli.parse_args(["--workdir", "w"]).yarn == "both"  # the default: none and yarn
  for rep in (off, on, all_):
    assert rep["protocol"]["train_len"] == TRAIN_LEN
    assert rep["protocol"]["mode"] == "non-overlapping"
    for setting in set(rep) - {"protocol"}:
      assert set(rep[setting]) == {str(L) for L in LENGTHS}
  chex.assert_trees_all_close(off["none"], all_["none"])  # each setting computed the same way
  chex.assert_trees_all_close(on["yarn"], all_["yarn"])
  at_1x, at_2x = str(TRAIN_LEN), str(2 * TRAIN_LEN)
  assert all_["yarn"][at_1x]["loss"] == all_["none"][at_1x]["loss"]  # identity at 1x
  assert abs(all_["yarn"][at_2x]["loss"] / all_["none"][at_2x]["loss"] - 1) > 2e-5  # on at 2x


def test_yarn_fixed_scores_every_length_with_one_factor(by_yarn, trained_run):
  """--yarn all: yarn_fixed uses max(lengths) / T = 2 at 1x too (there it is not the
  identity), and at 2x it is the per-length setting; a window scored directly at factor 2
  gives the report's per-window record."""
  got = by_yarn["all"]
  assert got["protocol"]["yarn_fixed_factor"] == 2.0
  fixed, at_1x, at_2x = got["yarn_fixed"], str(TRAIN_LEN), str(2 * TRAIN_LEN)
  assert fixed[at_2x] == got["yarn"][at_2x]
  assert abs(fixed[at_1x]["loss"] / got["none"][at_1x]["loss"] - 1) > 2e-5
  run = scoring.load_run(str(trained_run))
  scorer = scoring.Scorer(run)
  window = run.val_tokens()[None, : TRAIN_LEN + 1]  # the first window at 1x
  nll, _ = scorer.token_nll(window, scorer.fixed_yarn_scaling(2.0))
  np.testing.assert_allclose(fixed[at_1x]["window_nll"][0], nll.sum(), rtol=1e-5)
  assert fixed[at_1x]["window_tokens"][0] == TRAIN_LEN
  for rows in (fixed, got["none"]):  # per-window records add up to the aggregate
    for row in rows.values():
      assert len(row["window_nll"]) == len(row["window_tokens"]) == row["windows"]
      np.testing.assert_allclose(
        sum(row["window_nll"]) / sum(row["window_tokens"]), row["loss"], rtol=1e-6
      )


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
  assert got["protocol"]["text"] == str(tmp_path / "held_out.txt")
  md = (tmp_path / "eval" / "report.md").read_text()
  assert f"target tokens per length on `{tmp_path / 'held_out.txt'}`;" in md
  assert got["protocol"]["mode"] == ("non-overlapping" if stride is None else "sliding")
  assert got["protocol"]["stride_fraction"] == stride
  tokens = np.frombuffer(text.encode(), np.uint8)
  model = reference_model(scoring.load_run(str(trained_run)))
  for L in LENGTHS:
    for setting, yarn_train_len in (("none", None), ("yarn", TRAIN_LEN)):
      kw = dict(max_tokens=PPL_TOKENS, yarn_train_len=yarn_train_len)
      want = reference_ppl(
        model, tokens, L, stride=None if stride is None else int(L * stride), **kw
      )
      assert_row_matches(got[setting][str(L)], want, (setting, L, stride))
      if stride is not None:  # sliding windows give the targets other contexts
        other = reference_ppl(model, tokens, L, **kw)
        # a millionth is far above a mean's float32 rounding (the fixture's model is barely
        # trained, so other contexts move its loss by 1e-4 or less: 7.5e-5 with jax 0.12)
        assert abs(want["loss"] - other["loss"]) > 1e-6 * other["loss"], (want, other)


def test_a_failed_report_write_keeps_the_old_report_and_a_rerun_drops_stale_plots(
  trained_run, tmp_path, monkeypatch, capsys
):
  out = tmp_path / "eval"
  out.mkdir()
  before = {
    name: f"an earlier report's {name}".encode()
    for name in ("report.json", "report.md", *report_files.PLOT_FILES.values(), "mine.png")
  }
  for name, data in before.items():
    (out / name).write_bytes(data)
  argv = [
    "--workdir",
    str(trained_run),
    "--out",
    str(out),
    "--tasks",
    "ppl",
    "--lengths",
    str(TRAIN_LEN),
    "--yarn",
    "off",
    "--ppl-tokens",
    "256",
    "--no-progress",
  ]
  original = report_files._write_data

  def disk_full_at_json(f, data, path):
    if path.endswith("report.json"):
      original(f, data[:10], path)
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report_files, "_write_data", disk_full_at_json)
  assert cli.main(argv) == 1
  err = capsys.readouterr().err
  kept = out / partial.FILE
  assert err.splitlines()[-2:] == [
    "rove-eval: error: [Errno 28] No space left on device",
    f"the results measured so far are kept in {kept}; the same command run again reads them",
  ]
  assert "Traceback" not in err
  measured = json.loads(kept.read_text())
  # the report is unchanged and no temp file is left; the measured results are kept beside it
  assert {p.name: p.read_bytes() for p in out.iterdir() if p != kept} == before
  monkeypatch.setattr(report_files, "_write_data", original)
  scored = []
  real_perplexity = eval_tasks._perplexity
  monkeypatch.setattr(
    eval_tasks, "_perplexity", lambda run, *a: scored.append(run) or real_perplexity(run, *a)
  )
  assert cli.main(argv) == 0
  assert scored == []  # read back, not measured again
  printed = capsys.readouterr()
  assert f"   ppl: measured before, read back from {kept}" in printed.err
  assert not kept.exists()  # the report holds it now
  (entry,) = measured["runs"].values()
  got = json.loads((out / "report.json").read_text())["runs"][0]
  assert got["perplexity"] == entry["perplexity"] and got["seconds"] == entry["seconds"]
  md = (out / "report.md").read_text()
  assert md.strip() in printed.out  # printed as written
  assert md.strip().splitlines()[-1] == "Plots: perplexity_vs_length.png, figure1_mixer.png"
  assert "target tokens per length on the held-out split;" in md  # no --data-path
  assert sorted(p.name for p in out.iterdir()) == [  # the earlier ruler and icl plots are gone
    "figure1_mixer.png",
    "mine.png",
    "perplexity_vs_length.png",
    "report.json",
    "report.md",
  ]
  for name in ("figure1_mixer.png", "perplexity_vs_length.png"):
    assert (out / name).read_bytes()[:4] == b"\x89PNG", name
  ppl = json.loads((out / "report.json").read_text())["runs"][0]["perplexity"]
  assert ppl["protocol"]["max_tokens"] == 256  # --ppl-tokens over the suite's 8192
  assert ppl["none"][str(TRAIN_LEN)]["tokens"] == 256


def test_a_task_that_cannot_score_a_run_is_refused_before_any_scoring(
  trained_run, tmp_path, capsys
):
  """--tasks ppl,recall on a run trained on text: refused before perplexity, the first task,
  is measured (it used to be measured, then lost with the error)."""
  out = tmp_path / "eval"
  argv = ["--workdir", str(trained_run), "--out", str(out), "--tasks", "ppl,recall"]
  assert cli.main(argv + ["--lengths", "64", "--no-progress"]) == 1
  err = capsys.readouterr().err
  assert err.splitlines()[-1].startswith("rove-eval: error: run ") and "not 'recall'" in err
  assert "== " not in err and not (out / partial.FILE).exists()


def test_a_report_to_gcs_holds_the_numbers_of_the_local_report(
  trained_run, tmp_path, gcs_bucket, capsys
):
  out = paths.join(gcs_bucket, "eval")
  argv = [
    "--workdir",
    str(trained_run),
    "--tasks",
    "ppl",
    "--lengths",
    str(TRAIN_LEN),
    "--yarn",
    "off",
    "--ppl-tokens",
    "256",
    "--no-progress",
  ]
  assert cli.main(argv + ["--out", out]) == 0
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
    f"wrote {out}/figure1_mixer.png, {out}/perplexity_vs_length.png, {out}/report.json, "
    f"{out}/report.md"
  )
  assert gcs_server.objects(gcs_bucket) == [  # no write probe left behind
    "eval/figure1_mixer.png",
    "eval/perplexity_vs_length.png",
    "eval/report.json",
    "eval/report.md",
  ]
  assert cli.main(argv + ["--out", str(tmp_path / "eval")]) == 0
  remote = json.loads(paths.read_text(paths.join(out, "report.json")))["runs"][0]
  local = json.loads((tmp_path / "eval" / "report.json").read_text())["runs"][0]
  assert remote["perplexity"] == local["perplexity"]  # the same numbers, bit for bit
  assert remote["perplexity"]["none"][str(TRAIN_LEN)]["tokens"] == 256
  for name in ("figure1_mixer.png", "perplexity_vs_length.png"):
    assert paths.read_bytes(paths.join(out, name))[:4] == b"\x89PNG", name


def test_ruler_scores_qa_1_with_and_without_yarn_and_reports_qa_2_skipped(trained_run, tmp_path):
  squad = tmp_path / "squad.json"
  squad.write_text(json.dumps(SQUAD))
  args = cli.parse_args(
    [
      "--workdir",
      str(trained_run),
      "--out",
      str(tmp_path / "eval"),
      "--tasks",
      "ruler",
      "--yarn",
      "both",
      "--squad",
      str(squad),
      "--ruler-lengths",
      str(8 * TRAIN_LEN),
      "--no-progress",
    ],
    check_files=True,
  )  # --ruler-lengths, not the suite's (4, 16) multiples
  suite = {**cli.SUITES["quick"], "ruler_tasks": ("qa_1", "qa_2"), "ruler_samples": 2}
  run = scoring.load_run(str(trained_run))
  result = eval_tasks.evaluate_run(run, args.config, suite)
  got, length = result["ruler"], 8 * TRAIN_LEN
  assert list(got["settings"]) == ["none", "yarn"]
  assert got["protocol"]["samples"] == 2 and got["protocol"]["lengths"] == [length]
  assert list(got["skipped"]) == ["qa_2"]
  assert got["skipped"]["qa_2"].startswith("needs --hotpot FILE: a local HotpotQA dev JSON")
  rep = {"schema_version": report.SCHEMA_VERSION, "suite": "quick", "runs": [result]}
  report.validate(rep)
  md = report_md.markdown(rep)
  assert "- qa_2: skipped (needs --hotpot FILE" in md
  assert "### No YaRN" in md and "### +YaRN" in md
  # The same samples scored directly without YaRN: "none" holds qa_1's real answer NLLs.
  want = ruler.evaluate(
    scoring.Scorer(run).score_fn(),
    run.tokenizer,
    tasks=["qa_1"],
    lengths=[length],
    samples_per_task=2,
    seed=0,
    haystack_texts=eval_tasks._haystack_texts(run),
    squad_path=squad,
    progress=False,
  )["tasks"]["qa_1"][str(length)]
  rows = {s: got["settings"][s]["tasks"]["qa_1"][str(length)] for s in ("none", "yarn")}
  assert all(list(got["settings"][s]["tasks"]) == ["qa_1"] for s in rows)
  row = rows["none"]
  np.testing.assert_allclose(row["nll"], want["nll"], rtol=1e-5)
  np.testing.assert_allclose(row["sample_nll"], want["sample_nll"], rtol=1e-5)
  assert row["sample_correct"] == want["sample_correct"]
  for row in rows.values():  # per-sample records: n of them, in order, averaging to the cell
    assert row["n"] == len(row["sample_nll"]) == len(row["sample_correct"]) == 2
    assert np.isfinite(row["nll"]) and row["nll"] > 0
    assert row["exact_match"] == np.mean(row["sample_correct"])
    np.testing.assert_allclose(np.mean(row["sample_nll"]), row["nll"], rtol=1e-5)
  assert rows["yarn"]["sample_nll"] != rows["none"]["sample_nll"]  # factor 8 at 8x


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
