"""rove-eval's failures (rove_jax.cli.eval.main, in process): argument errors exit 2 before
any checkpoint is restored (gs:// workdirs and --out checked on the session's GCS API server);
expected failures later exit 1 with one line on stderr; the report is replaced atomically and
lists exactly the plots in its directory. No trained run needed."""

import json
import math
import os
import re
import warnings

import numpy as np
import pytest

from rove_jax import data as data_lib
from rove_jax.cli import eval as cli
from rove_jax.evaluation import plots, report, report_files, scoring
from rove_jax.evaluation import tasks as eval_tasks
from rove_jax.evaluation.ruler import qa as ruler_qa
from rove_jax.storage import paths
from rove_jax.train import resolve
from study import plots as study_plots
from tests import gcs_server
from tests.conftest import small_config
from tests.evaluation.test_ruler import HOTPOT, SQUAD

TASK_CHOICES = "ppl, ruler, icl"


@pytest.fixture
def no_restore(monkeypatch):
  """Makes any checkpoint restore fail the test (the checks must come first)."""
  calls = []

  def load_run(workdir):
    calls.append(workdir)
    raise AssertionError(f"load_run({workdir}) was called before the argument error")

  monkeypatch.setattr(scoring, "load_run", load_run)
  return calls


@pytest.fixture
def empty_workdir(tmp_path):
  """A workdir with no checkpoints at all: a restore would fail with 'no checkpoints'."""
  (tmp_path / "run").mkdir()
  return tmp_path / "run"


def argument_error(capsys, argv) -> str:
  """Runs cli.main, expects argparse's exit 2; returns the last stderr line."""
  with pytest.raises(SystemExit) as info:
    cli.main([str(a) for a in argv])
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert "Traceback" not in err
  return err.strip().splitlines()[-1]


def _report(ruler=True, icl=True):
  row = lambda loss: {
    "loss": loss,
    "ppl": math.exp(loss),
    "tokens": 10,
    "windows": 1,
    "window_nll": [10 * loss],
    "window_tokens": [10],
  }
  vt = {
    "64": {
      "nll": 2.0,
      "exact_match": 0.5,
      "n": 2,
      "correct": 1,
      "sample_nll": [1.5, 2.5],
      "sample_correct": [0, 1],
    }
  }
  return {
    "schema_version": report.SCHEMA_VERSION,
    "suite": "quick",
    "runs": [
      {
        "name": "a",
        "workdir": "/x",
        "step": 3,
        "model": {
          "pos_encoding": "rove",
          "params": 10,
          "n_layer": 1,
          "d_model": 8,
          "n_head": 2,
          "max_len": 16,
        },
        "perplexity": {
          "protocol": {"mode": "non-overlapping", "max_tokens": 10, "train_len": 16},
          "none": {"16": row(1.0), "32": row(2.0)},
        },
        "ruler": {"settings": {"none": {"tasks": {"vt": vt}}}, "skipped": {}} if ruler else None,
        "icl": {"synthetic": {"tasks": {"x": {"accuracy": 0.5}}, "accuracy": 0.5}, "files": None}
        if icl
        else None,
        "seconds": {},
      }
    ],
  }


# ------------------------------------------------------------------------ argument errors


@pytest.mark.parametrize(
  "tasks, says",
  [
    (",", "names no task"),
    ("", "names no task"),
    (" , ", "names no task"),
    ("ppl,,icl", "has an empty entry"),
    ("ppl,foo", "unknown task 'foo'"),
    ("PPL", "unknown task 'PPL'"),
  ],
)
def test_bad_tasks_exit_2_before_any_restore(
  capsys, tmp_path, empty_workdir, no_restore, tasks, says
):
  out = tmp_path / "eval"
  out.mkdir()
  (out / "report.json").write_text('{"previous": true}')
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", out, "--tasks", tasks])
  assert line.startswith("rove-eval: error: ")
  assert f"--tasks {tasks!r}" in line and says in line and TASK_CHOICES in line
  assert no_restore == []
  assert (out / "report.json").read_text() == '{"previous": true}'  # not written over


def test_a_bad_out_exits_2_before_any_restore(capsys, tmp_path, empty_workdir, no_restore):
  a_file = tmp_path / "a_file"
  a_file.write_text("not a directory")
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", a_file])
  assert f"{a_file} is an existing file, not a directory" in line
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", a_file / "eval"])
  assert f"cannot create or write the report directory {a_file / 'eval'}" in line
  assert a_file.read_text() == "not a directory" and no_restore == []


def test_the_out_directory_is_created_and_probed_up_front(tmp_path, empty_workdir):
  argv = ["--workdir", str(empty_workdir), "--out", str(tmp_path / "a" / "b")]
  assert not hasattr(cli.parse_args(argv), "out_dir")  # plain parsing touches no files
  assert not (tmp_path / "a").exists()
  args = cli.parse_args(argv, check_files=True)
  assert args.out_dir == str(tmp_path / "a" / "b") and args.created_out
  assert os.listdir(tmp_path / "a" / "b") == []  # the write probe is gone
  default = cli.parse_args(["--workdir", str(empty_workdir)], check_files=True)  # WORKDIR/eval
  assert default.out_dir == str(empty_workdir / "eval") and (empty_workdir / "eval").is_dir()


def test_gcs_workdirs_and_out_pass_the_checks_and_the_probe_leaves_nothing(gcs_bucket):
  workdir = paths.join(gcs_bucket, "runs", "a")
  paths.write_atomic(paths.join(workdir, "checkpoints", "marker"), b"")  # a "directory" on GCS
  before = gcs_server.objects(gcs_bucket)
  args = cli.parse_args(["--workdir", workdir + "/"], check_files=True)
  assert args.out_dir == f"{gcs_bucket}/runs/a/eval" and not args.created_out  # WORKDIR/eval
  args = cli.parse_args(
    ["--workdir", workdir, "--compare", workdir, "--out", paths.join(gcs_bucket, "reports", "x")],
    check_files=True,
  )
  assert args.out_dir == f"{gcs_bucket}/reports/x" and not args.created_out
  assert gcs_server.objects(gcs_bucket) == before  # the write probes were removed


def test_bad_gcs_paths_exit_2_before_any_restore(
  capsys, tmp_path, gcs_bucket, empty_workdir, no_restore
):
  missing = paths.join(gcs_bucket, "runs", "nope")
  for flag in ("--workdir", "--compare"):
    argv = (
      ["--workdir", missing]
      if flag == "--workdir"
      else ["--workdir", empty_workdir, "--compare", missing]
    )
    line = argument_error(capsys, argv + ["--out", tmp_path / "eval"])
    assert line == (
      f"rove-eval: error: {flag} {missing} does not exist; give the workdir of a "
      f"training run or a model directory"
    )
  taken = paths.join(gcs_bucket, "taken")
  paths.write_atomic(taken, b"an object")
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", taken])
  assert line == (
    f"rove-eval: error: --out {taken}: {taken} is an existing file, not a "
    f"directory; give a directory for the report"
  )
  no_bucket = gcs_bucket + "-missing/eval"  # a bucket that does not exist
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", no_bucket])
  assert line == (
    f"rove-eval: error: --out {no_bucket}: cannot create or write the report "
    f"directory {no_bucket} (the bucket {gcs_bucket}-missing does not exist or "
    f"these credentials cannot reach it); give a writable --out"
  )
  line = argument_error(capsys, ["--workdir", "s3://b/run"])
  assert "the s3:// scheme is not supported" in line
  assert no_restore == [] and paths.read_bytes(taken) == b"an object"
  assert not (tmp_path / "eval").exists()


def write_icl_task(tmp_path, lines, name="t"):
  path = tmp_path / f"{name}.jsonl"
  path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines))
  return path


def test_icl_task_files_are_read_and_validated_up_front(
  capsys, tmp_path, empty_workdir, no_restore
):
  good = [{"context": "2 + 2 =", "continuation": "4"}, {"context": "1 + 1 =", "continuation": "2"}]
  write_icl_task(tmp_path, good, "good")
  write_icl_task(tmp_path, [good[0], '{"context": "x"'], "broken")
  specs = {
    "ok.json": [
      {"name": "sums", "path": "good.jsonl", "kind": "language_modeling", "num_fewshot": 1}
    ],
    "empty.json": [],
    "invalid.json": '[{"name": "x"',
    "no_file.json": [{"name": "gone", "path": "gone.jsonl", "kind": "schema"}],
    "bad_line.json": [{"name": "b", "path": "broken.jsonl", "kind": "language_modeling"}],
    "bad_kind.json": [{"name": "k", "path": "good.jsonl", "kind": "essay"}],
  }
  for name, content in specs.items():
    (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
  base = ["--workdir", empty_workdir, "--out", tmp_path / "eval", "--icl-tasks"]
  args = cli.parse_args([str(a) for a in base + [tmp_path / "ok.json"]], check_files=True)
  assert [(s.name, s.num_fewshot) for s in args.config.icl_specs] == [("sums", 1)]
  for name, says in [
    ("missing.json", "does not exist"),
    ("empty.json", "lists no tasks"),
    ("invalid.json", "invalid JSON"),
    ("no_file.json", "no file at"),
    ("bad_line.json", "broken.jsonl, line 2: invalid JSON"),
    ("bad_kind.json", "kind='essay' is not one of"),
  ]:
    line = argument_error(capsys, base + [tmp_path / name])
    assert f"--icl-tasks {tmp_path / name}" in line and says in line, (name, line)
  assert no_restore == []


@pytest.mark.parametrize("flag", ["--squad", "--hotpot", "--data-path", "--compare"])
def test_missing_input_files_exit_2_naming_them(capsys, tmp_path, empty_workdir, no_restore, flag):
  missing = tmp_path / "nowhere" / "dev.json"
  line = argument_error(
    capsys, ["--workdir", empty_workdir, "--out", tmp_path / "eval", flag, missing]
  )
  assert str(missing) in line and "does not exist" in line and flag in line
  assert no_restore == [] and not (tmp_path / "eval").exists()  # checked before --out


@pytest.mark.parametrize(
  "option, value, says",
  [
    ("--stride", "0", "got 0"),
    ("--stride", "-0.5", "got -0.5"),
    ("--stride", "2", "got 2"),
    ("--stride", "nan", "got nan"),
    ("--chunk", "0", "got 0"),
    ("--chunk", "-8", "got -8"),
    ("--seed", "-1", "got -1"),
    ("--yarn-fixed-factor", "1", "got 1"),
    ("--yarn-fixed-factor", "0.5", "got 0.5"),
    ("--yarn-fixed-factor", "nan", "got nan"),
    ("--ruler-lengths", "4k", "got '4k'"),
    ("--lengths", "64,x", "got '64,x'"),
    ("--ppl-tokens", "0", "got 0"),
  ],
)
def test_out_of_range_numbers_exit_2_before_any_restore(
  capsys, tmp_path, empty_workdir, no_restore, option, value, says
):
  line = argument_error(
    capsys, ["--workdir", empty_workdir, "--out", tmp_path / "eval", option, value]
  )
  assert line.startswith(f"rove-eval: error: {option} must be") and says in line
  assert f"e.g. {option} " in line  # an example of a valid value
  assert no_restore == [] and not (tmp_path / "eval").exists()


def test_in_range_numbers_are_accepted():
  args = cli.parse_args(["--workdir", "w", "--stride", "1", "--chunk", "1", "--seed", "0"])
  assert (args.stride, args.chunk, args.seed) == (1.0, 1, 0)
  assert cli.parse_args(["--workdir", "w", "--stride", "1e-3"]).stride == 1e-3
  args = cli.parse_args(["--workdir", "w", "--yarn", "all", "--yarn-fixed-factor", "1.5"])
  assert (args.yarn, args.yarn_fixed_factor) == ("all", 1.5)
  args = cli.parse_args(["--workdir", "w", "--ruler-lengths", "4096,8192"])
  assert args.ruler_lengths == [4096, 8192] and args.lengths is None


def test_a_fixed_yarn_factor_needs_yarn_all(capsys):
  for yarn in ("off", "on", "both"):
    line = argument_error(capsys, ["--workdir", "w", "--yarn", yarn, "--yarn-fixed-factor", "8"])
    assert f"only --yarn all evaluates; got --yarn {yarn}" in line


def test_suite_lengths_include_half_the_training_length():
  assert eval_tasks.suite_lengths(cli.SUITES["full"]["multiples"], 1024) == [
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
  ]
  assert eval_tasks.suite_lengths((0.5, 1, 1.0, 4), 33) == [16, 33, 132]  # int(m T), no repeats
  assert cli.SUITES["full"]["ruler_samples"] >= 25
  assert all(s["icl_length_multiples"] == (1,) for s in cli.SUITES.values())


def test_both_suites_include_the_qa_tasks():
  for name, suite in cli.SUITES.items():
    tasks = eval_tasks.ruler_tasks(suite)
    assert {"qa_1", "qa_2"} <= set(tasks) and len(set(tasks)) == len(tasks), name
  # the 11 synthetic tasks and the 2 QA
  assert len(eval_tasks.ruler_tasks(cli.SUITES["full"])) == 13


@pytest.mark.parametrize(
  "flag, content, says",
  [
    ("--squad", '{"data": [', "invalid JSON"),
    ("--squad", "{}", "the top level has no 'data'"),
    ("--squad", "[]", "the top level is a list, not an object"),
    (
      "--squad",
      '{"data": [{"paragraphs": [{"context": "c"}]}]}',
      "data[0].paragraphs[0] has no 'qas'",
    ),
    (
      "--squad",
      json.dumps(
        {
          "data": [
            {"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": [{"text": 7}]}]}]}
          ]
        }
      ),
      "data[0].paragraphs[0].qas[0].answers[0].text is a number, not a string",
    ),
    ("--squad", '{"data": []}', "holds no answerable questions"),
    (
      "--squad",
      json.dumps(
        {
          "data": [
            {
              "paragraphs": [
                {"context": "one text", "qas": [{"question": "q", "answers": [{"text": "one"}]}]}
              ]
            }
          ]
        }
      ),
      "holds no document besides its questions' own (1 in all)",
    ),
    (
      "--hotpot",
      '[{"question": "q", "answer": "a", "context": [["t", ["s."]], ["u", ["v."]]]}]',
      "holds no document besides its questions' own (2 in all)",
    ),
    ("--hotpot", "[{", "invalid JSON"),
    ("--hotpot", "{}", "the top level is an object, not a list"),
    ("--hotpot", '[{"question": "q", "context": []}]', "[0] has no 'answer'"),
    (
      "--hotpot",
      '[{"question": "q", "answer": "a", "context": "text"}]',
      "[0].context is a string, not a list",
    ),
    (
      "--hotpot",
      '[{"question": "q", "answer": "a", "context": [["t", "s"]]}]',
      "[0].context[0] is not a [title, [sentence, ...]] pair",
    ),
    ("--squad", json.dumps(HOTPOT), "the top level is a list"),
    ("--hotpot", json.dumps(SQUAD), "the top level is an object"),
  ],
)
def test_malformed_qa_files_exit_2_before_any_restore(
  capsys, tmp_path, empty_workdir, no_restore, flag, content, says
):
  path = tmp_path / "dev.json"
  path.write_text(content)
  line = argument_error(
    capsys, ["--workdir", empty_workdir, "--out", tmp_path / "eval", flag, path]
  )
  assert line.startswith(f"rove-eval: error: {flag} {path}: "), line
  assert says in line, line
  if not any(x in says for x in ("invalid JSON", "no answerable", "no document besides")):
    assert (
      "not a SQuAD file; expected" if flag == "--squad" else "not a HotpotQA file; expected"
    ) in line
  assert no_restore == [] and not (tmp_path / "eval").exists()


def test_qa_loaders_raise_value_errors_only(tmp_path):
  """Every wrong structure is a ValueError naming the file, never a KeyError or TypeError."""
  shapes = [
    {},
    [],
    "text",
    3,
    None,
    {"data": {}},
    {"data": [[]]},
    {"data": [{"paragraphs": 1}]},
    {"data": [{"paragraphs": [{"context": ["c"], "qas": []}]}]},
    {"data": [{"paragraphs": [{"context": "c", "qas": ["q"]}]}]},
    {"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": "a"}]}]}]},
    [1],
    [{}],
    [{"question": "q", "answer": "a", "context": [["t"]]}],
    [{"question": "q", "answer": 1, "context": []}],
    [{"question": "q", "answer": "a", "context": [["t", [1]]]}],
  ]
  for i, shape in enumerate(shapes):
    path = tmp_path / f"{i}.json"
    path.write_text(json.dumps(shape))
    for load in (ruler_qa.load_squad, ruler_qa.load_hotpotqa):
      with pytest.raises(ValueError, match=re.escape(str(path))):
        load(path)
  binary = tmp_path / "binary.json"
  binary.write_bytes(b"\xff\xfe{}")
  with pytest.raises(ValueError, match="is not UTF-8 text"):
    ruler_qa.load_squad(binary)


def test_valid_qa_files_pass_the_checks(tmp_path, empty_workdir):
  (tmp_path / "squad.json").write_text(json.dumps(SQUAD))
  (tmp_path / "hotpot.json").write_text(json.dumps(HOTPOT))
  args = cli.parse_args(
    [
      "--workdir",
      str(empty_workdir),
      "--out",
      str(tmp_path / "eval"),
      "--squad",
      str(tmp_path / "squad.json"),
      "--hotpot",
      str(tmp_path / "hotpot.json"),
    ],
    check_files=True,
  )
  assert (args.squad, args.hotpot) == (str(tmp_path / "squad.json"), str(tmp_path / "hotpot.json"))


# ------------------------------------------------------------------ the training workdir


def _listing(directory) -> dict:
  return {
    p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
    for p in sorted(directory.iterdir())
  }


def test_eval_reads_the_runs_capped_val_cache_and_writes_nothing(tmp_path, capsys):
  """The held-out split comes from training's own cache (data.max_val_tokens included); a
  deleted cache is tokenized in memory, not written back into the workdir."""
  c = small_config(tmp_path, **{"data.max_val_tokens": 300})
  workdir = tmp_path / "run"
  prepared = data_lib.prepare(  # what training.train does before its first step
    c.data.corpus(),
    "bytes",
    workdir=str(workdir),
    max_train_tokens=c.data.max_train_tokens,
    max_val_tokens=c.data.max_val_tokens,
  )
  assert prepared.val_tokens.size == 300
  data_dir = workdir / "data"

  def val_tokens():
    run = scoring.Run(
      workdir=str(workdir),
      name="run",
      step=8,
      config=resolve.resolve(c),
      params=None,
      tokenizer=prepared.tokenizer,
    )
    capsys.readouterr()
    tokens = np.array(run.val_tokens())
    return tokens, capsys.readouterr().err

  before = _listing(data_dir)
  tokens, err = val_tokens()
  np.testing.assert_array_equal(tokens, prepared.val_tokens)
  assert "cached tokens from" in err and "tokenizing" not in err
  assert _listing(data_dir) == before  # names, sizes, times and bytes
  for path in data_dir.glob("tokens-*-val-*"):
    path.unlink()
  before = _listing(data_dir)
  tokens, err = val_tokens()
  np.testing.assert_array_equal(tokens, prepared.val_tokens)
  assert "tokenizing" in err and _listing(data_dir) == before  # not recreated


# ------------------------------------------------------------------ failures after parsing


def test_checkpoint_errors_exit_1_with_one_line_and_no_empty_out(capsys, tmp_path, empty_workdir):
  out = tmp_path / "eval"
  assert cli.main(["--workdir", str(empty_workdir), "--out", str(out), "--no-progress"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("rove-eval: error: ") and "no checkpoints" in err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert not out.exists()  # created by the up-front check, removed as it stayed empty


@pytest.mark.parametrize(
  "error",
  [
    OSError("[Errno 5] I/O error:\n  disk gone"),
    ImportError("No module named 'matplotlib'"),
    ValueError("layout\n\nmismatch"),
  ],
)
def test_expected_failures_exit_1_as_one_paragraph(
  capsys, monkeypatch, tmp_path, empty_workdir, error
):
  def load_run(workdir):
    raise error

  monkeypatch.setattr(scoring, "load_run", load_run)
  assert cli.main(["--workdir", str(empty_workdir), "--out", str(tmp_path / "o")]) == 1
  err = capsys.readouterr().err
  assert err == f"rove-eval: error: {' '.join(str(error).split())}\n"


def test_unexpected_exceptions_keep_their_traceback(monkeypatch, tmp_path, empty_workdir):
  def load_run(workdir):
    raise KeyError("a bug")

  monkeypatch.setattr(scoring, "load_run", load_run)
  with pytest.raises(KeyError, match="a bug"):
    cli.main(["--workdir", str(empty_workdir), "--out", str(tmp_path / "o")])


# ------------------------------------------------------------------------ report files


def plots_listed(md_text: str) -> set:
  (line,) = [l for l in md_text.splitlines() if l.startswith("Plots: ")]
  return set(line[len("Plots: ") :].split(", "))


def test_stale_plots_are_removed_and_the_list_matches_the_directory(tmp_path):
  first = report_files.write(_report(), str(tmp_path))
  assert report_files.drawn_plots(first) == [
    "perplexity_vs_length.png",
    "ruler_nll.png",
    "icl_accuracy.png",
  ]
  (tmp_path / "figure1_mixer.png").write_bytes(b"an older report's figure")
  (tmp_path / "notes.png").write_bytes(b"not ours")
  paths = report_files.write(_report(ruler=False, icl=False), str(tmp_path))
  assert report_files.drawn_plots(paths) == ["perplexity_vs_length.png"]
  pngs = {p for p in os.listdir(tmp_path) if p.endswith(".png")}
  assert pngs == {"perplexity_vs_length.png", "notes.png"}  # only known names are removed
  assert plots_listed((tmp_path / "report.md").read_text()) == {"perplexity_vs_length.png"}
  assert (tmp_path / "perplexity_vs_length.png").read_bytes()[:4] == b"\x89PNG"
  no_plots = dict(
    _report(), runs=[dict(_report()["runs"][0], perplexity=None, ruler=None, icl=None)]
  )
  report_files.write(no_plots, str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["notes.png", "report.json", "report.md"]
  assert "Plots: none" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("fail_on", ["report.json", "report.md", "ruler_nll.png"])
def test_a_failed_write_keeps_the_previous_report_whole(monkeypatch, tmp_path, fail_on):
  report_files.write(_report(), str(tmp_path))
  before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
  original = report_files._write_data

  def write_half_then_fail(f, data, path):
    if os.path.basename(path) == fail_on:
      original(f, data[: len(data) // 2], path)
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report_files, "_write_data", write_half_then_fail)
  new = _report(icl=False)  # draws no icl_accuracy.png
  new["runs"][0]["step"] = 99
  with pytest.raises(OSError, match="No space left"):
    report_files.write(new, str(tmp_path))
  after = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
  assert after == before  # nothing replaced, nothing removed, no temporary files left
  if fail_on != "report.json":
    return
  monkeypatch.setattr(report_files, "_write_data", original)
  report_files.write(new, str(tmp_path))
  assert json.loads((tmp_path / "report.json").read_text())["runs"][0]["step"] == 99
  assert not (tmp_path / "icl_accuracy.png").exists()
  assert oct((tmp_path / "report.json").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_failed_json_dump_leaves_no_file(monkeypatch, tmp_path):
  def dumps(*args, **kwargs):
    raise ValueError("injected")

  monkeypatch.setattr(report_files.json, "dumps", dumps)
  with pytest.raises(ValueError, match="injected"):
    report_files.write(_report(), str(tmp_path / "eval"))
  assert not (tmp_path / "eval").exists() or os.listdir(tmp_path / "eval") == []


def test_plots_with_nothing_labelled_draw_no_empty_legend():
  """matplotlib warns "No artists with labels found to put in legend" on an empty legend."""
  rep = _report(ruler=False, icl=False)
  rep["runs"][0]["perplexity"] = {
    "protocol": {"train_len": 16},
    "yarn": {"not_applicable": "a learned-position run"},
  }
  curves = {"/w": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]}  # no held-out loss yet
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert plots.perplexity(rep)[:4] == b"\x89PNG"
    assert (
      study_plots.loss_curves(
        curves, [{"workdir": "/w", "encoding": "rove", "seed": 0}], {"rove": "RoVE"}
      )[:4]
      == b"\x89PNG"
    )
  assert [str(w.message) for w in caught if "legend" in str(w.message)] == []


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask
