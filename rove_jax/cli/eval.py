"""rove-eval: perplexity vs length (+/- YaRN), RULER NLL and in-context learning for trained
runs, written as report.json, report.md and plots (the options become one
rove_jax.evaluation.config.EvalConfig; the tasks themselves: rove_jax.evaluation.tasks).

  rove-eval --workdir runs/X [--suite quick|full] [--lengths 256,512,...]
            [--yarn off|on|both|all] [--yarn-fixed-factor F] [--tasks ppl,ruler,icl,recall]
            [--compare runs/Y runs/Z] [--out DIR] [--squad FILE] [--hotpot FILE]
            [--icl-tasks SPECS.json] [--ppl-tokens N] [--ruler-lengths 4096,8192]
            [--recall-lengths 32,128] [--recall-samples N] [--train-len T]
            [--tokenizer FILE]

--workdir and --compare take training workdirs or model directories (a rove-export, or a
transformers checkpoint of type gpt2, llama, qwen2 or mistral with its tokenizer.json): a model
directory's training length is the one it records (--train-len overrides it) and its text the
--data-path source, else the embedded default corpus (rove_jax.evaluation.imported).

Lengths default to multiples of the training length T, the run's data.seq_len (quick: 1x 4x
16x; full: 0.5x 1x 2x 4x 8x 16x); YaRN factors and the report's labels use the same length.
--yarn: off = the model as trained ("none"), on = YaRN with factor L / T at each length L > T
("yarn"), both = none and yarn, all = none, yarn and "yarn_fixed" (perplexity at every length
with one factor, max(lengths) / T or --yarn-fixed-factor). RULER is scored under none and/or
yarn; encodings without rotary frequencies under none only.
In-context learning is scored inside the training context: the by-length tasks at T tokens,
and every prompt whose prompt + answer exceeds T tokens is cut from the left to fit (the same
rule for every encoding; the report counts the cut prompts). --tasks recall scores a run trained
on the synthetic recall source (data.source=recall) on its own task: accuracy and answer NLL
of the same test samples for every run, at each length and setting.
The report goes to <first workdir>/eval/ (NAME-eval beside a model directory NAME) unless --out
is given; a default that would fall inside a Python package is refused. Workdirs and --out may
be gs://bucket/path (the [gcs] extra; report_files says what a failed write leaves there).

Each result is kept in <out>/partial.json as it is measured; a command cut short and run again
(the same runs and settings) reads those back and measures only the rest
(rove_jax.evaluation.partial). The written report replaces the file.

Exit status: 2 for a bad argument or input file (checked before any checkpoint is restored),
1 for a failure after that (a one-line message on stderr), 0 when the report is written.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import sys
import tempfile
import uuid

from rove_jax import data as data_lib
from rove_jax.cli import platforms
from rove_jax.data import files as data_files
from rove_jax.evaluation import icl, imported, partial, report, report_files, report_md, scoring
from rove_jax.evaluation.config import SUITES, TASKS, YARN_CHOICES, EvalConfig, FieldError
from rove_jax.evaluation.ruler import qa as ruler_qa
from rove_jax.evaluation.tasks import QA_FLAGS, check_run, evaluate_run
from rove_jax.nn import model as nn_model
from rove_jax.storage import paths

PROG = "rove-eval"


def parse_args(argv, *, check_files: bool = False):
  """Parses and checks the command line; every argument error exits 2 (argparse's error).

  Args:
    argv: the arguments.
    check_files: also check, as `main` does before any work, that the workdirs and the
      --data-path, --squad, --hotpot and --icl-tasks inputs exist (the QA files, the spec file
      and its task files are read and validated), and create the report directory and prove it
      writable.
      Sets args.out_dir (absolute or gs://) and args.created_out, and args.config.icl_specs
      (the specs of --icl-tasks). Off: no file system access (the README's command checks).

  Returns:
    The namespace, with args.task_list (the --tasks names), the lengths as lists of integers
    and args.config, the EvalConfig of the options (whose checks are argparse errors here).
  """
  p = argparse.ArgumentParser(
    prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  p.add_argument(
    "--workdir",
    required=True,
    help="a training workdir (checkpoints/ inside), or a model directory: a "
    "rove-export or a transformers checkpoint (config.json, safetensors, "
    "tokenizer.json)",
  )
  p.add_argument(
    "--compare",
    nargs="*",
    default=[],
    help="more workdirs or model directories for the same tables",
  )
  p.add_argument(
    "--train-len",
    type=int,
    help="model directories: the training length T that lengths and YaRN factors "
    "are relative to (default: the one the directory records)",
  )
  p.add_argument(
    "--tokenizer",
    help="model directories that hold no tokenizer.json: the model's tokenizer "
    "(a tokenizer.json path, bytes or tiktoken:gpt2)",
  )
  p.add_argument("--suite", choices=tuple(SUITES), default="quick")
  p.add_argument(
    "--lengths",
    help="comma-separated token counts (default: suite multiples of the training length)",
  )
  p.add_argument(
    "--yarn",
    choices=YARN_CHOICES,
    default="both",
    help="off: none; on: yarn (factor L / T); both: none and yarn; all: none, yarn "
    "and yarn_fixed (one factor at every length; perplexity and recall)",
  )
  p.add_argument(
    "--yarn-fixed-factor",
    type=float,
    help="the yarn_fixed factor (> 1; default: longest length / training length); needs --yarn all",
  )
  p.add_argument("--tasks", default="ppl,ruler,icl")
  p.add_argument(
    "--out",
    help="report directory (default: WORKDIR/eval for a training run, "
    "NAME-eval beside a model directory NAME)",
  )
  p.add_argument(
    "--data-path",
    help="score perplexity on this text/parquet source instead of the run's held-out split",
  )
  p.add_argument(
    "--stride",
    type=float,
    help="sliding-window perplexity with stride = this "
    "fraction of the length, in (0, 1] (default: "
    "non-overlapping)",
  )
  p.add_argument(
    "--ppl-tokens",
    type=int,
    help="perplexity targets scored per length and setting (default: the "
    "suite's, quick 8192 and full 65536)",
  )
  p.add_argument(
    "--ruler-lengths",
    help="comma-separated RULER lengths in tokens (default: "
    "suite multiples of the training length), e.g. 4096,8192 as in the paper",
  )
  p.add_argument(
    "--recall-lengths",
    help="comma-separated lengths of the recall task (default: --lengths, or the suite's)",
  )
  p.add_argument(
    "--recall-samples",
    type=int,
    help="recall test samples a length (default: the suite's, quick 100 and full 200)",
  )
  p.add_argument("--squad", help="local SQuAD dev JSON for RULER qa_1")
  p.add_argument("--hotpot", help="local HotpotQA dev JSON for RULER qa_2")
  p.add_argument("--icl-tasks", help="JSON list of ICL task specs (LLM-Foundry JSONL files)")
  p.add_argument("--seed", type=int, default=0, help="seed of the RULER and ICL samples (>= 0)")
  p.add_argument("--chunk", type=int, default=512, help="attention block length (>= 1)")
  p.add_argument("--no-progress", action="store_true")
  args = p.parse_args(argv)
  args.task_list = _task_list(p, args.tasks)
  for flag in ("lengths", "ruler_lengths", "recall_lengths"):
    value = getattr(args, flag)
    if not value:
      setattr(args, flag, None)
      continue
    name = "--" + flag.replace("_", "-")
    try:
      setattr(args, flag, [int(x) for x in value.split(",")])
    except ValueError:
      p.error(f"{name} must be comma-separated integers, e.g. {name} 4096,8192; got {value!r}")
  args.config = eval_config(p, args)
  if check_files:
    _check_inputs(p, args)
  return args


def eval_config(p, args) -> EvalConfig:
  """The EvalConfig of the parsed options: its checks of the values, a value it refuses an
  argparse error (exit 2) that names the option."""
  try:
    return EvalConfig(
      tasks=tuple(args.task_list),
      suite=args.suite,
      lengths=args.lengths,
      yarn=args.yarn,
      yarn_fixed_factor=args.yarn_fixed_factor,
      stride=args.stride,
      ppl_tokens=args.ppl_tokens,
      ruler_lengths=args.ruler_lengths,
      recall_lengths=args.recall_lengths,
      recall_samples=args.recall_samples,
      seed=args.seed,
      chunk=args.chunk,
      data_path=args.data_path,
      squad=args.squad,
      hotpot=args.hotpot,
      icl_tasks=args.icl_tasks,
      progress=not args.no_progress,
      train_len=args.train_len,
      tokenizer=args.tokenizer,
    )
  except FieldError as e:
    p.error(e.as_flags())


def _task_list(p, value: str) -> list:
  """The --tasks names in order, without repeats; an empty or unknown name is an error."""
  choices = ", ".join(TASKS)
  names = [t.strip() for t in value.split(",")]
  if not any(names):
    p.error(f"--tasks {value!r} names no task; give one or more of {choices}, comma-separated")
  if "" in names:
    p.error(f"--tasks {value!r} has an empty entry; give names from {choices}, comma-separated")
  bad = [t for t in names if t not in TASKS]
  if bad:
    p.error(f"--tasks {value!r}: unknown task {bad[0]!r}; choose from {choices}")
  return list(dict.fromkeys(names))


def _what_is_wrong(path: str, kind: str) -> str:
  """Why `path` is not the existing `kind` ("file" or "directory") an option needs."""
  return f"is not a {kind}" if os.path.exists(path) else "does not exist"


def _check_workdir(p, flag: str, workdir: str) -> str:
  """The workdir of `flag`, resolved (local or gs://); an argparse error (exit 2) when it is
  not an existing directory, has an unsupported scheme or needs gcsfs, which is missing."""
  try:
    resolved = paths.resolve(workdir, what=flag)  # ValueError, MissingExtra (an ImportError)
    if paths.isdir(resolved):
      return resolved
    wrong = "is not a directory" if paths.exists(resolved) else "does not exist"
  except (ValueError, ImportError) as e:
    p.error(str(e))
  except Exception as e:  # noqa: BLE001 -- OSError or a storage library's own error
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    p.error(f"{flag} {workdir} cannot be read: {' '.join(str(e).split()) or type(e).__name__}")
  p.error(f"{flag} {workdir} {wrong}; give the workdir of a training run or a model directory")


def _check_tokenizer(p, flag: str, workdir: str, given) -> None:
  """A model directory without a tokenizer needs --tokenizer: an argparse error (exit 2) that
  says so, before any model is loaded. --tokenizer's file must exist."""
  if not imported.is_model_dir(workdir):
    return
  try:
    found = imported.has_tokenizer(workdir)
  except ValueError as e:
    p.error(f"{flag} {workdir}: {e}")
  if given is not None and given.endswith(".json") and not os.path.isfile(given):
    p.error(f"--tokenizer {given}: no such file; give the model's tokenizer.json")
  if not found and given is None:
    p.error(
      f"{flag} {workdir} holds no tokenizer.json and records no tokenizer; pass "
      f"--tokenizer PATH/tokenizer.json (the model's), or copy it into the directory"
    )


def _check_inputs(p, args) -> None:
  """parse_args' checks of the file system (see check_files there). Workdirs and --out are
  local or gs:// (rove_jax.storage.paths); the other inputs are local files."""
  workdir = _check_workdir(p, "--workdir", args.workdir)
  _check_tokenizer(p, "--workdir", workdir, args.tokenizer)
  for w in args.compare:
    _check_tokenizer(p, "--compare", _check_workdir(p, "--compare", w), args.tokenizer)
  if args.data_path:
    exts = (
      data_lib.PARQUET_EXTENSIONS
      if args.data_path.endswith(".parquet")
      else data_lib.TEXT_EXTENSIONS
    )
    try:
      data_files.resolve_files(args.data_path, exts, "--data-path")
    except ValueError as e:
      p.error(str(e))
  specs = check_task_files(p, args)
  args.config = dataclasses.replace(args.config, icl_specs=None if specs is None else tuple(specs))
  try:
    args.out_dir = paths.resolve(args.out, what="--out") if args.out else default_out(workdir)
  except (ValueError, ImportError) as e:
    p.error(str(e))
  # GCS has no directories: a gs:// --out is never "created", so never removed on failure
  args.created_out = not paths.is_remote(args.out_dir) and not os.path.exists(args.out_dir)
  try:
    prepare_out_dir(args.out_dir)
  except OSError as e:
    p.error(f"--out {args.out or args.out_dir}: {e}")


def default_out(workdir: str) -> str:
  """--out's default: a training run's WORKDIR/eval; for a model directory NAME (a
  transformers checkpoint or an export) NAME-eval beside it, so that the model directory
  (perhaps a shared download) is never written to, whatever the current directory.

  Raises:
    ValueError: the default falls inside a Python package (a directory holding __init__.py, the
      report directory itself or one above it): source code is never written to; give --out.
  """
  if imported.is_model_dir(workdir):
    model_dir = paths.resolve(workdir, what="--workdir")
    out = paths.join(paths.dirname(model_dir), (paths.basename(model_dir) or "model") + "-eval")
  else:
    out = paths.join(workdir, "eval")
  package = _package_around(out)
  if package is not None:
    raise ValueError(
      f"the default report directory {out} is inside the Python package "
      f"{package}; give --out DIR outside the source tree"
    )
  return out


def _package_around(path: str):
  """The innermost directory holding __init__.py among a local path and the directories above
  it, or None (and None for gs://)."""
  if paths.is_remote(path):
    return None
  path = os.path.abspath(path)
  while True:
    if os.path.isfile(os.path.join(path, "__init__.py")):
      return path
    parent = os.path.dirname(path)
    if parent == path:
      return None
    path = parent


def check_task_files(p, args) -> list | None:
  """The --squad, --hotpot and --icl-tasks files of `args`, read and validated now (an
  argparse error through `p` names the flag and the problem); returns the specs of
  --icl-tasks (None without it). Shared by rove-eval and the paper-scale recipe
  (study/paper_recipe.py), which checks them before days of training."""
  for flag, dest, _, _ in QA_FLAGS.values():
    path = getattr(args, dest)
    if path is None:
      continue
    if not os.path.isfile(path):
      p.error(f"{flag} {path} {_what_is_wrong(path, 'file')}; give a local JSON file (see --help)")
    load = ruler_qa.load_squad if flag == "--squad" else ruler_qa.load_hotpotqa
    try:
      load(path)  # parsed and validated now (cached for the RULER tasks)
    except (ValueError, OSError) as e:
      p.error(f"{flag} {path}: {e}")
  if args.icl_tasks is None:
    return None
  if not os.path.isfile(args.icl_tasks):
    p.error(
      f"--icl-tasks {args.icl_tasks} {_what_is_wrong(args.icl_tasks, 'file')}; give a "
      f"JSON list of ICL task specs"
    )
  try:
    specs = icl.load_specs(args.icl_tasks)
    for spec in specs:
      icl.read_task_file(spec)  # validates every example
  except (ValueError, OSError) as e:
    p.error(f"--icl-tasks {args.icl_tasks}: {e}")
  if not specs:
    p.error(
      f"--icl-tasks {args.icl_tasks} lists no tasks; give at least one task spec or drop the option"
    )
  return specs


def prepare_out_dir(out_dir: str) -> None:
  """Creates the report directory and proves it writable: a probe file is written and
  removed, locally or as an object under a gs:// out_dir (which proves the bucket exists and
  the credentials may write there).

  Raises:
    OSError: a clear message: the path is a file, or it cannot be created or written.
  """
  try:
    if not paths.isfile(out_dir):
      if not paths.is_remote(out_dir):
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".rove-eval-write-test-")
        os.close(fd)
        os.remove(probe)
      else:
        probe = paths.join(out_dir, f".rove-eval-write-test-{uuid.uuid4().hex[:12]}")
        paths.write_atomic(probe, b"")
        paths.remove(probe)
      return
  except Exception as e:  # noqa: BLE001 -- OSError or a storage library's own error
    if not (isinstance(e, OSError) or paths.is_storage_error(e)):
      raise
    raise OSError(
      f"cannot create or write the report directory {out_dir} "
      f"({paths.describe_failure(e, out_dir)}); give a writable --out"
    ) from None
  raise OSError(f"{out_dir} is an existing file, not a directory; give a directory for the report")


def main(argv=None) -> int:
  """The rove-eval command: 0 on success; 2 for argument errors (before any work); 1, with a
  one-paragraph message on stderr and no traceback, for an expected failure (a run that cannot
  be restored or scored, an unreadable input, an unwritable report, a missing package)."""
  args = parse_args(sys.argv[1:] if argv is None else argv, check_files=True)
  platforms.skip_absent_accelerators()
  try:
    return _evaluate(args)
  except Exception as e:  # noqa: BLE001 -- the expected failures; anything else is re-raised
    if not (isinstance(e, (ValueError, OSError, ImportError)) or paths.is_storage_error(e)):
      raise  # a bug: keep its traceback
    message = " ".join(str(e).split()) or type(e).__name__
    print(f"{PROG}: error: {message}", file=sys.stderr)
    _say(partial.what_was_kept(args.out_dir))
    if args.created_out:
      with contextlib.suppress(OSError):
        os.rmdir(args.out_dir)  # only if still empty: nothing was written
    return 1


def _say(line: str) -> None:
  if line:
    print(line, file=sys.stderr)


def _load(workdir: str, config: EvalConfig) -> scoring.Run:
  """A training workdir's newest checkpoint, or a model directory (evaluation.imported)."""
  resolved = paths.resolve(workdir, what="--workdir")
  if imported.is_model_dir(resolved):
    return imported.load_model(
      resolved, data_path=config.data_path, train_len=config.train_len, tokenizer=config.tokenizer
    )
  return scoring.load_run(resolved)


def _evaluate(args) -> int:
  config = args.config
  workdirs = [args.workdir, *args.compare]
  runs = [_load(w, config) for w in workdirs]  # every run restorable before any scoring
  for run in runs:
    check_run(run, config)  # and scorable by every task
  kept = partial.Partial(args.out_dir, config, log=_say)
  results = []
  for run in runs:
    print(f"== {run.name}: {run.model_config.pos_encoding}, step {run.step}", file=sys.stderr)
    results.append(evaluate_run(run, config, partial=kept, log=_say))
  rep = {
    "schema_version": report.SCHEMA_VERSION,
    "suite": config.suite,
    "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "runs": results,
  }
  out_dir = args.out_dir  # made and probed by parse_args
  figure1 = None
  first = runs[0]
  if first.model_config.pos_encoding in ("rove", "rope"):
    model = nn_model.build(first.model_config, first.params)
    sample = first.val_tokens()[:12]
    figure1 = (model, sample, f"{first.name}: layer 0, head 0, {len(sample)} held-out tokens")
  paths = report_files.write(rep, out_dir, figure1=figure1)
  kept.remove()  # the report holds every result now
  print(report_md.markdown(rep, plots=report_files.drawn_plots(paths)))
  print(f"\nwrote {', '.join(sorted(paths.values()))}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
