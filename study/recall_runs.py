"""The retrieval studies reproduce.py runs beside the comparison: the associative-recall study
(study.retrieval) and the position-dependent tasks (POSITION_TASKS), each a subprocess that
resumes, and their records read back for the write-up."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout
RECALL_STUDY = "study.retrieval"  # the retrieval study, when present
POSITION_TASKS = ("lastwrite", "offset")  # study/configs/retrieval.py TASKS, by order / distance


def position_records(out_dir) -> dict:
  """{task: recall.json content} of the position tasks whose records are in out_dir."""
  from study import position_tasks

  return position_tasks.load(
    [(t, os.path.join(out_dir, f"recall_{t}", "recall.json")) for t in POSITION_TASKS]
  )


def _env() -> dict:
  """rove_jax from this checkout even when it is not installed (train.py finds it by its
  path)."""
  return {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
  }


def recall_available() -> bool:
  """Whether the retrieval study's module is present with a callable main()."""
  if importlib.util.find_spec(RECALL_STUDY) is None:
    return False
  return callable(getattr(importlib.import_module(RECALL_STUDY), "main", None))


def recall_study(args, out_dir, task: str = "mqar", seeds=None, nope_seeds: int = 0) -> list | None:
  """Runs the retrieval study on one task of study/configs/retrieval.py into out_dir (module
  docstring) and returns its records; None when it is skipped (--no-recall or the module is
  not present)."""
  path = os.path.join(out_dir, "recall.json")
  if args.no_recall or not recall_available():
    why = "--no-recall given" if args.no_recall else f"{RECALL_STUDY} not present"
    if args.no_recall and os.path.exists(path):
      print(
        f"retrieval study ({task}): not rerun ({why}); the write-up uses the records of an "
        f"earlier run in {path}",
        flush=True,
      )
      return _recall_records(path)
    print(f"retrieval study ({task}): skipped ({why})", flush=True)
    return None
  seeds = args.seed_list if seeds is None else seeds
  runs_dir = os.path.join(args.runs_dir, "recall" if task == "mqar" else f"recall_{task}")
  cmd = [
    sys.executable,
    "-m",
    RECALL_STUDY,
    "--out",
    out_dir,
    "--runs-dir",
    runs_dir,
    "--seeds",
    ",".join(map(str, seeds)),
    "--encodings",
    ",".join(args.encoding_list),
    "--task",
    task,
    "--nope-seeds",
    str(nope_seeds),
  ] + (["--quick"] if args.quick else [])
  print(f"retrieval study ({task}):", " ".join(cmd[1:]), flush=True)
  rc = subprocess.call(cmd, env=_env())
  if rc != 0:
    raise SystemExit(
      f"the retrieval study failed (exit {rc}); rerun `{' '.join(sys.argv)}` to resume it"
    )
  return _recall_records(path)


def position_studies(args) -> dict:
  """The position-dependent retrieval tasks (POSITION_TASKS), each on the first
  --position-seeds seeds (NoPE on --position-nope-seeds of them) into <out>/recall_<task>/:
  {task: recall.json content} of those that ran or that an earlier run left."""
  seeds = args.seed_list[: args.position_seeds]
  for task in POSITION_TASKS if args.position_seeds else ():
    recall_study(
      args, os.path.join(args.out, f"recall_{task}"), task, seeds, args.position_nope_seeds
    )
  return position_records(args.out)


def _recall_records(path) -> list:
  with open(path) as f:
    data = json.load(f)
  return data["records"] if isinstance(data, dict) else data


def recall_chance(out_dir) -> float:
  """The chance accuracy of the retrieval study's task, from its <out>/recall/recall.json spec
  (study.verdicts.recall_chance; 0 without one)."""
  from study import verdicts

  path = os.path.join(out_dir, "recall", "recall.json")
  if not os.path.exists(path):
    return 0.0
  with open(path) as f:
    data = json.load(f)
  return verdicts.recall_chance(data.get("spec") if isinstance(data, dict) else None)
