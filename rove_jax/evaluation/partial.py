"""partial.json: what rove-eval has measured so far, in its report directory, so that a command
cut short (an error, a kill, a lost machine) loses at most the task it was in. The same command
run again reads the finished (run, task) results back instead of measuring them again; the
finished report replaces the file.

A result is taken back only when everything that decides its numbers is the same:
  settings  the EvalConfig's fields (all but `tasks` and `progress`, which change which tasks
            run and how they show, not what a task measures), and the size and modification
            time of each local file they name (the text scored, SQuAD, HotpotQA, the ICL
            specs and the files those name, a tokenizer file; a local directory by every
            file under it; a gs:// path counts by its name);
  run       its workdir, step and a digest of its run config and parameters (a directory
            exported again or trained further is another run).
A file made under other settings is set aside by the first result of the new ones (replaced,
with a line saying so); a file that cannot be read is reported and replaced the same way.

Format: {"format": 1, "settings": <digest>, "runs": {<run key>: {<report key>: <the task's
report.json entry>, "seconds": {<report key>: seconds}}}}, written whole (storage.paths'
write_atomic: a local rename, or one GCS object).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable, Optional

import jax
import numpy as np

from rove_jax.storage import paths

FILE = "partial.json"
FORMAT = 1
_NOT_SETTINGS = ("tasks", "progress")
_FILE_FIELDS = ("data_path", "squad", "hotpot", "icl_tasks", "tokenizer")


def settings_digest(config) -> str:
  """The digest of what decides a task's numbers in `config` (an EvalConfig)."""
  fields = {
    f.name: getattr(config, f.name)
    for f in dataclasses.fields(config)
    if f.name not in _NOT_SETTINGS
  }
  named = [getattr(config, name) for name in _FILE_FIELDS]
  named += [spec.path for spec in config.icl_specs or ()]
  files = {p: _fingerprint(p) for p in named if isinstance(p, str)}
  text = json.dumps({"fields": fields, "files": files}, sort_keys=True, default=repr)
  return hashlib.sha256(text.encode()).hexdigest()


def run_key(run) -> str:
  """A scoring.Run's identity: workdir, step and a digest of its run config (the model's
  encoding, its data) and parameters."""
  h = hashlib.blake2b(digest_size=16)
  h.update(json.dumps(run.config.to_dict(), sort_keys=True, default=repr).encode())
  leaves = jax.tree_util.tree_leaves_with_path(run.params)
  for path, leaf in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
    array = np.asarray(leaf)
    h.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape}".encode())
    h.update(np.ascontiguousarray(array).tobytes())
  return f"{run.workdir}@{run.step}#{h.hexdigest()}"


class Partial:
  """The partial results in `out_dir` for `config`, read once; `record` stores each result as
  it comes, `remove` drops the file once the report is written.

  Args:
    out_dir: the report directory (local or gs://).
    config: the EvalConfig of this command.
    log: where a line about a file that is set aside goes.
  """

  def __init__(self, out_dir: str, config, log: Callable[[str], None] = print):
    self.path = paths.join(out_dir, FILE)
    self.settings = settings_digest(config)
    self.log = log
    self.runs: dict = {}
    self.stale: Optional[str] = None  # why an existing file is not used
    try:
      data = json.loads(paths.read_bytes(self.path))
    except FileNotFoundError:
      return
    except (OSError, ValueError) as e:
      self.stale = f"it cannot be read ({type(e).__name__}: {e})"
      return
    if not (isinstance(data, dict) and data.get("format") == FORMAT):
      self.stale = f"it is not format {FORMAT}"
    elif data.get("settings") != self.settings:
      self.stale = "it was measured with other settings or input files"
    elif not isinstance(data.get("runs"), dict):
      self.stale = "it holds no runs"
    else:
      self.runs = data["runs"]

  def finished(self, key: str) -> dict:
    """{report key: result} of the tasks finished for run `key` (its "seconds" apart)."""
    done = self.runs.get(key, {})
    return {k: v for k, v in done.items() if k != "seconds"}

  def seconds(self, key: str) -> dict:
    return dict(self.runs.get(key, {}).get("seconds", {}))

  def record(self, key: str, task: str, result, seconds: float) -> None:
    """Stores `result`, the report entry of `task` for run `key`, with the rest."""
    if self.stale is not None:
      self.log(f"{self.path}: replaced, as {self.stale}")
      self.stale = None
    entry = self.runs.setdefault(key, {})
    entry[task] = result
    entry.setdefault("seconds", {})[task] = seconds
    data = {"format": FORMAT, "settings": self.settings, "runs": self.runs}
    paths.write_atomic(self.path, json.dumps(data))

  def remove(self) -> None:
    """Drops the file (the report holds its results now). A failure is logged, not raised: a
    file left behind is read back only under these same settings, which measure the same."""
    try:
      paths.remove(self.path, missing_ok=True)
    except Exception as e:  # noqa: BLE001 - an OSError or a storage library's own error
      self.log(f"{self.path}: not removed ({type(e).__name__}: {e}); the report is complete")


def what_was_kept(out_dir: str) -> str:
  """After a failure: where the results measured so far are, and how to use them ("" when none
  are, or when the storage cannot say: its failure has been reported already)."""
  path = paths.join(out_dir, FILE)
  try:
    if not paths.exists(path):
      return ""
  except Exception:  # noqa: BLE001 - the storage may be what failed
    return ""
  return f"the results measured so far are kept in {path}; the same command run again reads them"


def _fingerprint(path: str):
  """[size, modification time in ns] of a local file; of a local directory, [relative path,
  size, modification time] of every file under it (a prepared dataset, a text directory, a
  tokenizer directory: a file changed, added or removed changes it); None for anything else
  (a gs:// path, a name such as tiktoken:gpt2), which is identified by its name alone."""
  if paths.is_remote(path):
    return None
  if os.path.isfile(path):
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]
  if not os.path.isdir(path):
    return None
  found = []
  for root, dirs, files in os.walk(path):
    dirs.sort()
    for name in sorted(files):
      full = os.path.join(root, name)
      found.append([os.path.relpath(full, path)] + (_fingerprint(full) or []))
  return found
