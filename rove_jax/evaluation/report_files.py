"""The report directory: `write` replaces report.json, report.md (report_md) and the plots
(PLOT_FILES, drawn by plots), removes plots of an earlier report that it did not draw, and
lists exactly the plots drawn in report.md. `replace_files` is the package's atomic multi-file
writer for local files (study's write-up uses it too).

The directory is local or gs://bucket/path (rove_jax.storage.paths). What a failed write leaves:
  local   all or nothing: every file is written to a temporary file and flushed first, and
          only then are they all renamed into place; a failure leaves the previous report and
          its plots exactly as they were.
  gs://   each file whole: every object is uploaded in one piece (GCS publishes an object
          whole or not at all), one after the other, the plots and report.md first and
          report.json last. GCS cannot replace several objects at once, so a failure part way
          can leave some new plots (or a new report.md) beside the previous report.json; no
          object is ever partly written, and a report.json that is new was written after every
          other file of its report. Stale plots are removed only after report.json is written.
In both cases everything is rendered in memory before the first byte is written, so a report
that fails validation or a plot that fails to draw writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Union

from rove_jax.evaluation import plots, report_md
from rove_jax.evaluation.report import validate
from rove_jax.storage import paths as paths_lib

# The plot files `write` draws, by key of its returned paths (the only files it ever removes).
PLOT_FILES = {
  "perplexity": "perplexity_vs_length.png",
  "ruler": "ruler_nll.png",
  "icl": "icl_accuracy.png",
  "figure1": "figure1_mixer.png",
}


def _write_data(f, data: Union[str, bytes], path: str) -> None:
  """Writes the contents meant for `path` to its temporary file f (a seam for tests)."""
  f.write(data)


def replace_files(files: dict) -> None:
  """Writes {local path: str or bytes} so that each path holds either its old or its new
  contents.

  Every file is written to a temporary file in its own directory and flushed to disk first;
  only then are they moved over their paths with os.replace. On any error the temporary
  files are removed and nothing has been replaced.
  """
  umask = os.umask(0)
  os.umask(umask)
  temps = {}
  try:
    for path, data in files.items():
      directory, name = os.path.split(os.path.abspath(path))
      fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
      temps[path] = tmp
      os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
      binary = isinstance(data, bytes)
      with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
        _write_data(f, data, path)
        f.flush()
        os.fsync(f.fileno())
    for path, tmp in temps.items():
      os.replace(tmp, path)
  except BaseException:
    for tmp in temps.values():
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    raise


def drawn_plots(paths: dict) -> list:
  """The plot file names among `write`'s returned paths, in PLOT_FILES order."""
  return [PLOT_FILES[key] for key in PLOT_FILES if key in paths]


def upload_files(files: dict) -> None:
  """Writes {gs:// path: str or bytes} in order, each object whole (one upload): readers see
  an object's old or new contents, never a part; a failure stops at that file (the module
  docstring says what is left)."""
  for path, data in files.items():
    data = data.encode("utf-8") if isinstance(data, str) else data
    # through the same seam as replace_files, so a test can fail any one file
    paths_lib.write_atomic(path, lambda f, data=data, path=path: _write_data(f, data, path))


def write(report: dict, out_dir: str, *, figure1=None) -> dict:
  """Validates and writes report.json, report.md and the plots.

  Everything is rendered in memory, then written: locally replaced together
  (`replace_files`), so a failure leaves the previous report and plots as they were; on gs://
  object by object, report.json last (`upload_files`; the module docstring has what a failure
  leaves there). Then the PLOT_FILES this report did not draw are removed (no other file), so
  out_dir's plots are those report.md lists.

  Args:
    report: the report (validated first).
    out_dir: the report directory (created if missing), local or gs://bucket/path.
    figure1: (model, tokens, title) for `plots.figure1`, or None.

  Returns:
    {"json": path, "md": path, and a path per plot drawn, keyed as in PLOT_FILES}.
  """
  validate(report)
  text = json.dumps(report, indent=2)
  images = {
    key: fn(report)
    for key, fn in (("perplexity", plots.perplexity), ("ruler", plots.ruler), ("icl", plots.icl))
  }
  if figure1 is not None:
    model, tokens, title = figure1
    images["figure1"] = plots.figure1(model, tokens, title=title)
  images = {key: data for key, data in images.items() if data is not None}
  out_dir = paths_lib.resolve(out_dir, what="report directory")
  join = lambda name: paths_lib.join(out_dir, name)
  paths = {"json": join("report.json"), "md": join("report.md")}
  paths.update({key: join(PLOT_FILES[key]) for key in images})
  files = {paths[key]: data for key, data in images.items()}
  files[paths["md"]] = report_md.markdown(report, plots=drawn_plots(paths))
  files[paths["json"]] = text  # last: report.json is what other tools read
  if paths_lib.is_remote(out_dir):
    upload_files(files)
  else:
    os.makedirs(out_dir, exist_ok=True)
    replace_files(files)
  for key in sorted(PLOT_FILES.keys() - images.keys()):
    paths_lib.remove(join(PLOT_FILES[key]), missing_ok=True)
  return paths
