"""Train a RoVE (or baseline) GPT.

  python train.py --config configs/tiny.py --workdir runs/tiny [--config.field=value ...]

Rerunning the same command resumes from the newest readable checkpoint in --workdir.
SIGTERM / Ctrl-C finish the current step, save a checkpoint and exit 0. Several processes
(hosts): add --coordinator_address HOST:PORT --num_processes N --process_id I on each, or
nothing on TPU pods and SLURM, where jax.distributed.initialize() detects the cluster.
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "a configs/*.py file", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics, tokenizer")
_COORD = flags.DEFINE_string("coordinator_address", None,
                             "multi-process: HOST:PORT of process 0 (with --num_processes, "
                             "--process_id); without them, TPU pods and SLURM are auto-detected")
_NPROC = flags.DEFINE_integer("num_processes", None, "multi-process: how many processes")
_PID = flags.DEFINE_integer("process_id", None, "multi-process: this process's index")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax reports every file it writes at INFO
  from rove_jax import training  # after flag parsing: --help stays fast
  try:
    summary = training.train(_CONFIG.value, _WORKDIR.value)
  except (ValueError, NotImplementedError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except training.NonFiniteError as e:
    print(f"error: {e}", file=sys.stderr)
    return 3
  training.report(summary, _CONFIG.value)
  return 0


def _start_distributed(argv):
  """jax.distributed must start before anything touches a device, and evaluating the config
  file already does (it validates the model config): read the three flags straight from argv."""
  values = {}
  for name in ("coordinator_address", "num_processes", "process_id"):
    for i, arg in enumerate(argv):
      if arg.startswith(f"--{name}="):
        values[name] = arg.split("=", 1)[1]
      elif arg == f"--{name}" and i + 1 < len(argv):
        values[name] = argv[i + 1]
  from rove_jax import sharding
  as_int = lambda v: None if v is None else int(v)
  sharding.initialize_distributed(values.get("coordinator_address"),
                                  as_int(values.get("num_processes")),
                                  as_int(values.get("process_id")))


if __name__ == "__main__":
  _start_distributed(sys.argv)
  app.run(main)
