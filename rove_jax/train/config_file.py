"""A run's config file: `load_file(PATH[:ARG])` runs the file's `get_config()` and returns its
RunConfig. Whatever the file raises (SystemExit included) becomes one ValueError naming the file,
the line, the code and the exception; a file that returns anything but a RunConfig is told what
to return, with configs/tiny.py as the example. rove_jax.train.overrides then applies the
command line's `--config.a.b=value` to it.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import traceback
from typing import Optional

from rove_jax.train.run_config import RunConfig

EXAMPLE = "configs/tiny.py"


def load_file(spec: str) -> RunConfig:
  """The RunConfig of a config file: `PATH` calls its get_config(), `PATH:ARG` get_config(ARG).

  Raises:
    ValueError: the file is missing, defines no get_config(), raises (the message names the file,
      the line and the exception, whatever it is) or returns something other than a RunConfig.
  """
  path, sep, arg = spec.partition(":")
  path = os.path.abspath(path)
  if not os.path.isfile(path):
    raise ValueError(
      f"--config {path}: no such file; give a config file (e.g. {EXAMPLE}) or a "
      f"packaged config's name"
    )
  try:
    module_spec = importlib.util.spec_from_file_location("_rove_jax_config_file", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
      raise ValueError(
        f"--config {path} defines no get_config(); a config file defines "
        f"get_config() returning the run's RunConfig (see {EXAMPLE})"
      )
    c = get_config(arg) if sep else get_config()
  except (Exception, SystemExit) as e:  # noqa: BLE001 - whatever the file raises is named
    message = _failure(e, path)
    if message is None:
      raise
    raise ValueError(message) from None
  if not isinstance(c, RunConfig):
    kind = type(c).__name__
    hint = (
      " (config files no longer return an ml_collections ConfigDict: build the "
      "RunConfig as configs/tiny.py does)"
      if kind in ("ConfigDict", "FrozenConfigDict")
      else ""
    )
    raise ValueError(
      f"--config {path}: get_config() returned a {kind}, not a RunConfig{hint}; see {EXAMPLE}"
    )
  return c


def _failure(e: BaseException, path: str) -> Optional[str]:
  """ "--config FILE, line N (CODE): what happened; ..." for an exception raised in the file (its
  innermost line there), or None when the file is not in the traceback."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, ValueError) and str(e).startswith(f"--config {path}"):
      return str(e)
    frames = [
      f for f in traceback.extract_tb(e.__traceback__) if os.path.abspath(f.filename) == path
    ]
    if frames:
      line = frames[-1].lineno
      code = linecache.getline(frames[-1].filename, line).strip()
      if isinstance(e, SystemExit):
        what = (
          f"the config file exited (SystemExit: {e.code!r}) instead of returning a config; "
          f"nothing was trained"
        )
      else:
        what = f"{type(e).__name__}: {' '.join(str(e).split())}"
      return (
        f"--config {path}, line {line} ({code}): {what}; a config file defines "
        f"get_config() returning the run's RunConfig (see {EXAMPLE})"
      )
    e = e.__cause__ or e.__context__
  return None
