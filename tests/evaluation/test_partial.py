"""rove_jax.evaluation.partial: rove-eval's results kept as they are measured, read back by the
same command (same settings, same input files, same parameters) instead of measured again, and
set aside otherwise; the checks `evaluate_run` makes before any scoring."""

from __future__ import annotations

import dataclasses
import json

import jax
import pytest

from rove_jax.evaluation import partial, tasks
from tests.evaluation.test_tasks import _config, _run


def _counting(monkeypatch, name):
  """Wraps the real task function tasks.<name>, counting its calls."""
  calls = []
  real = getattr(tasks, name)

  def spy(*args, **kw):
    calls.append(args[0].name)
    return real(*args, **kw)

  monkeypatch.setattr(tasks, name, spy)
  return calls


def test_results_are_kept_as_measured_and_read_back_without_scoring(tmp_path, monkeypatch):
  config = _config(tasks=("ppl", "recall"), ppl_tokens=64)
  run = _run("a", "rove")
  ppl_calls, recall_calls = _counting(monkeypatch, "_perplexity"), _counting(monkeypatch, "_recall")
  first = tasks.evaluate_run(
    run, config, tasks.SUITES["quick"], partial.Partial(str(tmp_path), config)
  )
  assert ppl_calls == recall_calls == ["a"]
  stored = json.loads((tmp_path / partial.FILE).read_text())
  assert stored["format"] == partial.FORMAT and stored["settings"] == partial.settings_digest(
    config
  )
  (entry,) = stored["runs"].values()
  assert entry["perplexity"] == first["perplexity"] and entry["recall"] == first["recall"]
  assert entry["seconds"] == first["seconds"]

  said = []
  again = tasks.evaluate_run(
    run, config, tasks.SUITES["quick"], partial.Partial(str(tmp_path), config), log=said.append
  )
  assert again == first  # the numbers and the seconds they took, as measured
  assert ppl_calls == recall_calls == ["a"]  # nothing scored again
  assert said == [f"   ppl, recall: measured before, read back from {tmp_path / partial.FILE}"]

  other = _run("b", "rope")  # another run in the same file: measured, the first one's kept
  tasks.evaluate_run(other, config, tasks.SUITES["quick"], partial.Partial(str(tmp_path), config))
  assert recall_calls == ["a", "b"]
  assert len(json.loads((tmp_path / partial.FILE).read_text())["runs"]) == 2


def test_a_run_is_its_workdir_step_config_and_parameters():
  a = _run("a", "rove")
  assert partial.run_key(a) == partial.run_key(_run("a", "rove"))
  for other in (
    _run("a", "rope"),  # the same parameters, another encoding
    dataclasses.replace(a, params=jax.tree.map(lambda x: x * 2, a.params)),
    dataclasses.replace(a, step=4),
    dataclasses.replace(a, workdir="/elsewhere"),
  ):
    assert partial.run_key(other) != partial.run_key(a)


def test_what_decides_the_numbers_decides_the_digest(tmp_path):
  text = tmp_path / "text.txt"
  text.write_text("one text to score")
  base = _config(data_path=str(text))
  digest = partial.settings_digest(base)
  assert partial.settings_digest(_config(data_path=str(text))) == digest
  # which tasks run, and whether progress shows, change no task's numbers
  assert partial.settings_digest(_config(data_path=str(text), tasks=("ppl",))) == digest
  assert partial.settings_digest(_config(data_path=str(text), progress=True)) == digest
  for changed in ({"lengths": (32,)}, {"seed": 3}, {"yarn": "off"}, {"chunk": 8}):
    assert partial.settings_digest(_config(data_path=str(text), **changed)) != digest, changed
  text.write_text("another text, to score instead")  # the same path, other contents
  assert partial.settings_digest(base) != digest


def test_a_data_directory_counts_by_every_file_under_it(tmp_path):
  """A --data-path directory (a prepared dataset, a folder of texts): a file changed, added or
  removed anywhere under it changes the digest; the same directory unchanged keeps it."""
  data = tmp_path / "texts"
  (data / "part").mkdir(parents=True)
  (data / "a.txt").write_text("first text")
  (data / "part" / "b.txt").write_text("second text")
  config = _config(data_path=str(data))
  seen = {partial.settings_digest(config)}
  assert partial.settings_digest(_config(data_path=str(data))) in seen
  (data / "part" / "b.txt").write_text("second text, longer now")
  seen.add(partial.settings_digest(config))
  (data / "part" / "c.txt").write_text("a third")
  seen.add(partial.settings_digest(config))
  (data / "a.txt").unlink()
  seen.add(partial.settings_digest(config))
  assert len(seen) == 4


def test_a_file_of_other_settings_or_unreadable_is_replaced_with_a_line(tmp_path):
  config, said = _config(), []
  kept = partial.Partial(str(tmp_path), _config(seed=9))
  kept.record("run@1#x", "recall", {"records": []}, 1.0)
  stale = partial.Partial(str(tmp_path), config, log=said.append)
  assert stale.finished("run@1#x") == {}
  stale.record("run@1#x", "recall", {"records": [1]}, 2.0)
  assert said == [
    f"{tmp_path / partial.FILE}: replaced, as it was measured with other settings or input files"
  ]
  assert partial.Partial(str(tmp_path), config).finished("run@1#x") == {"recall": {"records": [1]}}
  (tmp_path / partial.FILE).write_bytes(b'{"format": 1, "sett')  # cut short
  said.clear()
  broken = partial.Partial(str(tmp_path), config, log=said.append)
  assert broken.finished("run@1#x") == {}
  broken.record("run@1#x", "recall", {"records": []}, 1.0)
  assert len(said) == 1 and "replaced, as it cannot be read (JSONDecodeError" in said[0], said


def test_what_was_kept_names_the_file_only_when_there_is_one(tmp_path):
  assert partial.what_was_kept(str(tmp_path)) == ""
  partial.Partial(str(tmp_path), _config()).record("k", "recall", {}, 0.0)
  assert partial.what_was_kept(str(tmp_path)) == (
    f"the results measured so far are kept in {tmp_path / partial.FILE}; the same command run "
    f"again reads them"
  )


def test_runs_are_checked_before_any_scoring(monkeypatch):
  """A length past a learned-position table and recall on a run not trained on it are refused
  by check_run, which evaluate_run calls before it scores anything."""
  calls = _counting(monkeypatch, "_perplexity")
  learned = _run("l", "learned")  # a table of 32 positions
  with pytest.raises(ValueError, match="learned position embeddings for 32 positions and cannot"):
    tasks.check_run(learned, _config(tasks=("ppl",), lengths=(32, 64)), tasks.SUITES["quick"])
  with pytest.raises(ValueError, match="cannot score 63 tokens"):  # recall scores L - 1
    tasks.check_run(learned, _config(lengths=(32,), recall_lengths=(64,)), tasks.SUITES["quick"])
  tasks.check_run(learned, _config(lengths=(32,), recall_lengths=(33,)), tasks.SUITES["quick"])
  with pytest.raises(ValueError, match="not 'recall'"):
    tasks.evaluate_run(
      _run("s", "rove", source="stdlib"), _config(tasks=("ppl", "recall")), tasks.SUITES["quick"]
    )
  assert calls == []  # refused before perplexity, the first task, ran
