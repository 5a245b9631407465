"""rove-eval's failures (rove_jax.evaluation.cli.main, in process): argument errors exit 2 before
any checkpoint is restored; expected failures later exit 1 with one line on stderr; the report
is replaced atomically and lists exactly the plots in its directory. No trained run needed."""

import json
import math
import os

import pytest

from rove_jax.evaluation import cli, report, scoring

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
  return {"schema_version": 1, "suite": "quick", "runs": [{
      "name": "a", "workdir": "/x", "step": 3,
      "model": {"pos_encoding": "rove", "params": 10, "n_layer": 1, "d_model": 8, "n_head": 2,
                "max_len": 16},
      "perplexity": {"protocol": {"mode": "non-overlapping", "max_tokens": 10, "train_len": 16},
                     "none": {"16": {"loss": 1.0, "ppl": math.e, "tokens": 10},
                              "32": {"loss": 2.0, "ppl": math.e ** 2, "tokens": 10}}},
      "ruler": {"tasks": {"vt": {"64": {"nll": 2.0, "exact_match": 0.5, "n": 2}}},
                "skipped": {}} if ruler else None,
      "icl": {"synthetic": {"tasks": {"x": {"accuracy": 0.5}}, "accuracy": 0.5},
              "files": None} if icl else None,
      "seconds": {}}]}


# ------------------------------------------------------------------------ argument errors


@pytest.mark.parametrize("tasks, says", [
    (",", "names no task"), ("", "names no task"), (" , ", "names no task"),
    ("ppl,,icl", "has an empty entry"), ("ppl,foo", "unknown task 'foo'"),
    ("PPL", "unknown task 'PPL'")])
def test_bad_tasks_exit_2_before_any_restore(capsys, tmp_path, empty_workdir, no_restore,
                                             tasks, says):
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


def write_icl_task(tmp_path, lines, name="t"):
  path = tmp_path / f"{name}.jsonl"
  path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines))
  return path


def test_icl_task_files_are_read_and_validated_up_front(capsys, tmp_path, empty_workdir,
                                                        no_restore):
  good = [{"context": "2 + 2 =", "continuation": "4"}, {"context": "1 + 1 =", "continuation": "2"}]
  write_icl_task(tmp_path, good, "good")
  write_icl_task(tmp_path, [good[0], '{"context": "x"'], "broken")
  specs = {"ok.json": [{"name": "sums", "path": "good.jsonl", "kind": "language_modeling",
                        "num_fewshot": 1}],
           "empty.json": [], "invalid.json": '[{"name": "x"',
           "no_file.json": [{"name": "gone", "path": "gone.jsonl", "kind": "schema"}],
           "bad_line.json": [{"name": "b", "path": "broken.jsonl", "kind": "language_modeling"}],
           "bad_kind.json": [{"name": "k", "path": "good.jsonl", "kind": "essay"}]}
  for name, content in specs.items():
    (tmp_path / name).write_text(content if isinstance(content, str) else json.dumps(content))
  base = ["--workdir", empty_workdir, "--out", tmp_path / "eval", "--icl-tasks"]
  args = cli.parse_args([str(a) for a in base + [tmp_path / "ok.json"]], check_files=True)
  assert [(s.name, s.num_fewshot) for s in args.icl_specs] == [("sums", 1)]
  for name, says in [("missing.json", "does not exist"), ("empty.json", "lists no tasks"),
                     ("invalid.json", "invalid JSON"), ("no_file.json", "no file at"),
                     ("bad_line.json", "broken.jsonl, line 2: invalid JSON"),
                     ("bad_kind.json", "kind='essay' is not one of")]:
    line = argument_error(capsys, base + [tmp_path / name])
    assert f"--icl-tasks {tmp_path / name}" in line and says in line, (name, line)
  assert no_restore == []


@pytest.mark.parametrize("flag", ["--squad", "--hotpot", "--data-path", "--compare"])
def test_missing_input_files_exit_2_naming_them(capsys, tmp_path, empty_workdir, no_restore,
                                                flag):
  missing = tmp_path / "nowhere" / "dev.json"
  line = argument_error(capsys, ["--workdir", empty_workdir, "--out", tmp_path / "eval",
                                 flag, missing])
  assert str(missing) in line and "does not exist" in line and flag in line
  assert no_restore == [] and not (tmp_path / "eval").exists()  # checked before --out


# ------------------------------------------------------------------ failures after parsing


def test_checkpoint_errors_exit_1_with_one_line_and_no_empty_out(capsys, tmp_path,
                                                                 empty_workdir):
  out = tmp_path / "eval"
  assert cli.main(["--workdir", str(empty_workdir), "--out", str(out), "--no-progress"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("rove-eval: error: ") and "no checkpoints" in err
  assert err.count("\n") == 1 and "Traceback" not in err
  assert not out.exists()  # created by the up-front check, removed as it stayed empty


@pytest.mark.parametrize("error", [OSError("[Errno 5] I/O error:\n  disk gone"),
                                   ImportError("No module named 'matplotlib'"),
                                   ValueError("layout\n\nmismatch")])
def test_expected_failures_exit_1_as_one_paragraph(capsys, monkeypatch, tmp_path,
                                                   empty_workdir, error):
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
  line, = [l for l in md_text.splitlines() if l.startswith("Plots: ")]
  return set(line[len("Plots: "):].split(", "))


def test_stale_plots_are_removed_and_the_list_matches_the_directory(tmp_path):
  first = report.write(_report(), str(tmp_path))
  assert report.drawn_plots(first) == ["perplexity_vs_length.png", "ruler_nll.png",
                                       "icl_accuracy.png"]
  (tmp_path / "figure1_mixer.png").write_bytes(b"an older report's figure")
  (tmp_path / "notes.png").write_bytes(b"not ours")
  paths = report.write(_report(ruler=False, icl=False), str(tmp_path))
  assert report.drawn_plots(paths) == ["perplexity_vs_length.png"]
  pngs = {p for p in os.listdir(tmp_path) if p.endswith(".png")}
  assert pngs == {"perplexity_vs_length.png", "notes.png"}  # only known names are removed
  assert plots_listed((tmp_path / "report.md").read_text()) == {"perplexity_vs_length.png"}
  assert (tmp_path / "perplexity_vs_length.png").read_bytes()[:4] == b"\x89PNG"
  no_plots = dict(_report(), runs=[dict(_report()["runs"][0], perplexity=None, ruler=None,
                                        icl=None)])
  report.write(no_plots, str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["notes.png", "report.json", "report.md"]
  assert "Plots: none" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("fail_on", ["report.json", "report.md", "ruler_nll.png"])
def test_a_failed_write_keeps_the_previous_report_whole(monkeypatch, tmp_path, fail_on):
  report.write(_report(), str(tmp_path))
  before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
  original = report._write_data

  def write_half_then_fail(f, data, path):
    if os.path.basename(path) == fail_on:
      original(f, data[: len(data) // 2], path)
      raise OSError(28, "No space left on device")
    original(f, data, path)

  monkeypatch.setattr(report, "_write_data", write_half_then_fail)
  new = _report(icl=False)  # draws no icl_accuracy.png
  new["runs"][0]["step"] = 99
  with pytest.raises(OSError, match="No space left"):
    report.write(new, str(tmp_path))
  after = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
  assert after == before  # nothing replaced, nothing removed, no temporary files left
  if fail_on != "report.json":
    return
  monkeypatch.setattr(report, "_write_data", original)
  report.write(new, str(tmp_path))
  assert json.loads((tmp_path / "report.json").read_text())["runs"][0]["step"] == 99
  assert not (tmp_path / "icl_accuracy.png").exists()
  assert oct((tmp_path / "report.json").stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def test_a_failed_json_dump_leaves_no_file(monkeypatch, tmp_path):
  def dumps(*args, **kwargs):
    raise ValueError("injected")

  monkeypatch.setattr(report.json, "dumps", dumps)
  with pytest.raises(ValueError, match="injected"):
    report.write(_report(), str(tmp_path / "eval"))
  assert not (tmp_path / "eval").exists() or os.listdir(tmp_path / "eval") == []


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask
