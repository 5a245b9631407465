"""rove-train (or `python train.py` from a checkout): train a RoVE (or baseline) GPT.

  rove-train --config smoke --workdir runs/smoke      # a first run: about a minute on 2 cores
  rove-train --config tiny --workdir runs/tiny [--config.field=value ...]
  rove-train --help-config                            # every config field, with its default

--config takes a config file (configs/tiny.py) or the name of a packaged one (smoke, tiny,
demo, recall_offset, gpt2_124m, gpt2_354m: rove_jax/train/configs/NAME.py), so an installed package
trains
without a checkout. --config.dry_run=True compiles the train step and prints its memory and
FLOPs instead of training; --helpfull lists the flags. Rerunning the same command resumes from the
newest readable checkpoint in
--workdir. SIGTERM / Ctrl-C finish the current step, save a checkpoint and exit 0. Several
processes (hosts): add --coordinator_address HOST:PORT --num_processes N --process_id I on
each, or nothing on TPU pods and SLURM, where jax.distributed.initialize() detects the cluster.
"""

import functools
import os
import shlex
import sys
from typing import Optional

from absl import app, flags, logging

from rove_jax.cli import platforms
from rove_jax.cli.errors import TRACEBACK_VAR, fail, missing_package
from rove_jax.train import config_file, overrides, run_config, sharding

_CONFIG = flags.DEFINE_string(
  "config",
  None,
  "a config file (configs/tiny.py) or a packaged config's name (smoke, tiny, "
  "demo, recall_offset, gpt2_124m, gpt2_354m); --config.a.b=VALUE overrides a field",
)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics, tokenizer")
_COORD = flags.DEFINE_string(
  "coordinator_address",
  None,
  "multi-process: HOST:PORT of process 0 (with --num_processes, "
  "--process_id); without them, TPU pods and SLURM are auto-detected",
)
_NPROC = flags.DEFINE_integer("num_processes", None, "multi-process: how many processes")
_PID = flags.DEFINE_integer("process_id", None, "multi-process: this process's index")
# Handled in run(), before absl (which would first ask for --config and --workdir); defined
# here so that --help lists it.
flags.DEFINE_bool("help-config", False, "list every config field with its default and exit")
flags.mark_flags_as_required(["config", "workdir"])

CONFIG_DIR = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train", "configs"
)  # the packaged configs


def packaged_configs() -> list[str]:
  """Names accepted by --config NAME."""
  return sorted(
    f[:-3] for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and not f.startswith("_")
  )


def resolve_config_arg(value: str) -> str:
  """--config NAME[:ARGS] -> the packaged file; paths (with / or .py) pass through."""
  name, sep, rest = value.partition(":")
  if os.path.isfile(name):
    return value
  if "/" in name or name.endswith(".py"):
    what = "is not a file" if os.path.exists(name) else "no such file"
    raise app.UsageError(
      f"--config {name}: {what}; give a config file (e.g. configs/tiny.py) "
      f"or one of {packaged_configs()}"
    )
  if name not in packaged_configs():
    raise app.UsageError(
      f"--config {value!r} is neither a file nor a packaged config; give a "
      f"path to a config file or one of {packaged_configs()}"
    )
  return os.path.join(CONFIG_DIR, name + ".py") + sep + rest


def _rewrite_config_flag(argv: list[str]) -> list[str]:
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      out[i] = "--config=" + resolve_config_arg(arg.split("=", 1)[1])
    elif arg == "--config" and i + 1 < len(out):
      out[i + 1] = resolve_config_arg(out[i + 1])
  return out


def _quiet_background_failures() -> None:
  """A failed checkpoint write also fails orbax's background write tasks and threads, each of
  which asyncio and orbax log with a traceback; the run reports that failure once, as its
  error line (ROVE_JAX_TRACEBACK=1 shows them all)."""
  import logging as std_logging

  std_logging.getLogger("asyncio").setLevel(std_logging.CRITICAL)

  def keep(record) -> bool:
    return not (record.exc_info and "orbax" in (record.pathname or ""))

  std_logging.getLogger("absl").addFilter(keep)
  # tensorstore's write callbacks that arrive after orbax closed their event loop are printed
  # through sys.excepthook / sys.unraisablehook, one traceback each
  closed = lambda exc: isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook
  sys.excepthook = lambda t, v, tb: None if closed(v) else excepthook(t, v, tb)
  sys.unraisablehook = lambda u: None if closed(u.exc_value) else unraisablehook(u)


def main(argv, given=()):
  """The run, after absl parsed its flags; `given`: the --config.KEY=VALUE overrides, taken
  out of argv before absl (overrides.split)."""
  if len(argv) > 1:
    print(
      f"error: unexpected arguments {argv[1:]}: every setting is a flag, e.g. --config.steps=100",
      file=sys.stderr,
    )
    return 2
  logging.set_verbosity(logging.WARNING)  # orbax reports every file it writes at INFO
  if os.environ.get(TRACEBACK_VAR) != "1":
    _quiet_background_failures()
  # after flag parsing: --help and flag errors do not load flax, optax, orbax and grain
  from rove_jax.train import loop as training
  from rove_jax.train import result

  # Expected failures end with one message and an exit code, no traceback (set
  # ROVE_JAX_TRACEBACK=1 to see it): 2 a bad config or input, 3 a run that diverged, 1 the rest
  # (a missing package, files, the machine: memory, disk, permissions, another trainer).
  try:
    # The run config, built and checked once, here. That touches no device, so
    # jax.distributed can still start after it, before the first device is used.
    c = load(_CONFIG.value, list(given))
    if not (c.dry_run and c.dry_run_topology):  # a named slice compiles with its plugin
      platforms.skip_absent_accelerators()
    else:
      platforms.prepare_gpu_compile(c.dry_run_topology)
    sharding.initialize_distributed(_COORD.value, _NPROC.value, _PID.value)
    if c.dry_run:
      from rove_jax.cli import dry_run  # the compiler's machinery: this flag only

      return dry_run.run(c)
    result.report(training.train(c, _WORKDIR.value, resolved=True), c)
  except (ValueError, NotImplementedError) as e:
    return fail(str(e), 2)
  except training.NonFiniteError as e:
    return fail(f"{e}, e.g. {rerun_command(sys.argv, c.optim.lr)}", 3)
  except FloatingPointError as e:
    return fail(str(e), 3)
  except ImportError as e:
    return fail(missing_package(e), 1)
  except (OSError, RuntimeError) as e:
    code = fail(f"{type(e).__name__}: {e}", 1)
    # train() has closed the run's files and released its lock. What can be left is a failed
    # background write (orbax's threads, tensorstore's callbacks) that the interpreter's
    # shutdown would print from or wait on: leave without them.
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)
  return 0


def load(spec: str, given: list) -> "run_config.RunConfig":
  """The run's config: the file's RunConfig, the overrides applied, what the inputs decide
  filled in (rove_jax.train.resolve). Raises ValueError, one line, before any work."""
  from rove_jax.train import resolve  # reads a prepared dataset's manifest, init_from's config

  c = config_file.load_file(spec)
  return resolve.command_line(c, given)


def rerun_command(argv: list[str], lr: float) -> str:
  """This command again with a tenth of its learning rate (it resumes from the newest checkpoint
  in the same workdir, which is a good one: train/health.py)."""
  keep = [a for a in argv if not a.startswith("--config.optim.lr=")]
  prog = os.path.basename(keep[0]) if keep[0].endswith("train.py") else keep[0]
  cmd = [("python " + prog) if prog.endswith(".py") else prog] + [shlex.quote(a) for a in keep[1:]]
  return " ".join(cmd + [f"--config.optim.lr={lr / 10:g}"])


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with its errors as one `error:` line and exit status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"error: {' '.join(str(e).split())}\nrun with --helpshort for the flags", file=sys.stderr)
    sys.exit(2)


def config_arg(argv: list[str]) -> Optional[str]:
  """The value --config has in argv (PATH or PATH:ARGS), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def config_path(argv: list[str]) -> Optional[str]:
  """The absolute path of the config file --config names in argv (its :ARGS dropped)."""
  value = config_arg(argv)
  return None if value is None else os.path.abspath(value.split(":", 1)[0])


def help_config(argv: list[str]) -> int:
  """--help-config: every config field with its value and description; those of the config
  --config names, overrides applied, when one is given, else the defaults."""
  path = config_path(argv)
  if path is None:
    print(
      "Every config field with its default (the tiny preset's model); set one with "
      "--config.FIELD=VALUE:"
    )
    print("\n".join("  " + line for line in run_config.describe()))
    return 0
  given = overrides.split(argv[1:])
  try:
    c = load(config_arg(argv), given)
  except ValueError as e:
    return fail(str(e), 2)
  packaged = os.path.dirname(path) == os.path.abspath(CONFIG_DIR)
  name = os.path.basename(path)[:-3] if packaged else os.path.relpath(path)
  shown = [a for a in argv[1:] if a.startswith("--config.")]
  print(
    f"Every config field with its value under --config {name}"
    + (f" and {' '.join(shown)}" if shown else "")
    + "; set one with --config.FIELD=VALUE:"
  )
  print("\n".join("  " + line for line in run_config.describe(c)))
  return 0


def run(argv=None):
  """Entry point of `rove-train` and train.py."""
  argv = list(sys.argv if argv is None else argv)
  try:
    argv = _rewrite_config_flag(argv)
  except app.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  if "--help-config" in argv[1:]:
    sys.exit(help_config(argv))
  # --config.KEY=VALUE are the run config's, applied to the file's RunConfig by type
  # (rove_jax.train.overrides); their keys and values are checked before absl and any work
  given = overrides.split(argv[1:])
  problems = [p for p in (overrides.problem(k, v) for k, v in given) if p]
  if problems:
    print("error: " + "\nerror: ".join(problems), file=sys.stderr)
    sys.exit(2)
  argv = [a for a in argv if not a.startswith("--config.")]
  if config_path(argv) is None and not any(a.startswith("--help") for a in argv[1:]):
    print(
      f"error: --config is required: a config file (e.g. configs/tiny.py) or a packaged "
      f"config's name, one of {packaged_configs()}; e.g. rove-train --config smoke "
      f"--workdir runs/smoke",
      file=sys.stderr,
    )
    sys.exit(2)
  # absl prints the __main__ module's docstring as --help's usage; under the rove-train
  # console script that module is pip's generated wrapper, which has none.
  main_module = sys.modules.get("__main__")
  if main_module is not None and not getattr(main_module, "__doc__", None):
    main_module.__doc__ = __doc__
  app.run(functools.partial(main, given=given), argv=argv, flags_parser=_parse_flags)


if __name__ == "__main__":
  run()
