"""study.jobs: children run n at a time, pinned to distinct cores, logs kept, a failure stops
new starts."""

import os
import sys

import pytest

from study import jobs

SCRIPT = """
import os, sys, time
time.sleep(float(sys.argv[1]))
aff = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
print("affinity", aff, "exit", sys.argv[2], flush=True)
sys.exit(int(sys.argv[2]))
"""


def _job(tmp_path, name, sleep=0.3, rc=0):
  return jobs.Job(
    name, [sys.executable, "-c", SCRIPT, str(sleep), str(rc)], str(tmp_path / name / "log.txt")
  )


def test_jobs_run_side_by_side_on_their_own_cores(tmp_path):
  lines = []
  todo = [_job(tmp_path, f"j{i}") for i in range(3)]
  results = jobs.run(todo, 2, log=lines.append)
  assert [rc for rc, _ in results] == [0, 0, 0] and all(s > 0.25 for _, s in results)
  logs = [open(j.log).read() for j in todo]
  assert all("exit 0" in text for text in logs)
  if hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) >= 2:
    first_two = [text.split("affinity ")[1].split(" exit")[0] for text in logs[:2]]
    assert all(len(eval(a)) == 1 for a in first_two) and first_two[0] != first_two[1]
  assert sum("started" in line for line in lines) == 3


def test_a_failure_stops_new_starts_and_shows_the_log(tmp_path):
  lines = []
  todo = [_job(tmp_path, "bad", 0.0, 3), _job(tmp_path, "slow", 0.5), _job(tmp_path, "never")]
  results = jobs.run(todo, 1, log=lines.append)
  assert results[0][0] == 3 and results[1:] == [(None, None), (None, None)]
  assert any("FAILED (exit 3)" in line for line in lines)
  assert any("affinity" in line for line in lines)  # the failed child's log tail is shown
  assert not os.path.exists(todo[2].log)


@pytest.mark.parametrize("n", [0, 5])
def test_job_count_is_clamped(tmp_path, n):
  results = jobs.run([_job(tmp_path, "a", 0.0)], n, log=lambda _: None)
  assert results[0][0] == 0 and 1 <= jobs.default_jobs() <= 2


def test_on_done_hears_each_job_as_it_ends(tmp_path):
  heard = []
  out = jobs.run(
    [_job(tmp_path, "slow", 1.5), _job(tmp_path, "fast", 0.0, rc=3)],
    2,
    log=lambda line: None,
    on_done=lambda i, rc, s: heard.append((i, rc)),
  )
  assert heard == [(1, 3), (0, 0)]  # the fast one first, while the slow one still ran
  assert [rc for rc, _ in out] == [0, 3]
