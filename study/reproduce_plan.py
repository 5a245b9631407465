"""The runs of reproduce.py's comparison (the first study, study/preregistration.md): the
config every run shares, the plan (the main runs, the training-length check and the
learning-rate check, each rotary encoding at the sweep's chosen rate), each run's train.py
overrides (--steps, --quick's tiny model), and the training settings the write-up reports.
"""

from __future__ import annotations

import os

from study.checkout import ROOT, load_config

CONFIG = os.path.join(ROOT, "study", "configs", "reproduce.py")
QUICK_STEPS = 8  # --quick's training steps


def plan(args, rates: dict | None = None) -> list[dict]:
  """The runs, each {encoding, seed, workdir, kind} (+ steps or lr for the checks); with
  `rates` ({encoding: the sweep's chosen rate}) those encodings' main and long runs train at
  their rate, in workdirs named by it:
    main  every encoding x seed (NoPE on its first --nope-seeds seeds), full_eval for the
          first --full-eval-seeds seeds;
    long  RoVE and RoPE (the rotary encodings of --encodings) on the first --long-seeds seeds
          with --long-multiple times the steps;
    lr    the same encodings on the first --lr-seeds seeds at each of --lrs.
  """
  runs, rates = [], rates or {}
  tuned = lambda enc: {"lr": rates[enc]} if enc in rates else {}  # noqa: E731
  suffix = lambda enc: f"-lr{rates[enc]:g}" if enc in rates else ""  # noqa: E731
  full = args.seed_list[: args.full_eval_seeds] if args.full_eval_seeds else args.seed_list
  for enc in args.encoding_list:
    seeds = args.seed_list
    if enc == "nope" and args.nope_seeds:
      seeds = seeds[: args.nope_seeds]
    for seed in seeds:
      runs.append(
        {
          "encoding": enc,
          "seed": seed,
          "kind": "main",
          "full_eval": seed in full,
          "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}{suffix(enc)}"),
          **tuned(enc),
        }
      )
  rotary = [e for e in args.encoding_list if e != "nope"]
  steps = base_steps(args) * args.long_multiple
  for seed in args.seed_list[: args.long_seeds]:
    for enc in rotary:
      runs.append(
        {
          "encoding": enc,
          "seed": seed,
          "kind": "long",
          "steps": steps,
          "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}-steps{steps}{suffix(enc)}"),
          **tuned(enc),
        }
      )
  for lr in args.lr_list:
    for seed in args.seed_list[: args.lr_seeds]:
      for enc in rotary:
        runs.append(
          {
            "encoding": enc,
            "seed": seed,
            "kind": "lr",
            "lr": lr,
            "workdir": os.path.join(args.runs_dir, f"{enc}-s{seed}-lr{lr:g}"),
          }
        )
  return runs


def base_steps(args) -> int:
  """The main runs' training steps (--steps, --quick's or the config's)."""
  if args.steps is not None:
    return args.steps
  if args.quick:
    return QUICK_STEPS
  return load_config(CONFIG).steps


def overrides(args, run) -> list[str]:
  o = [f"--config.model.pos_encoding={run['encoding']}", f"--config.seed={run['seed']}"]
  if run.get("steps") is not None:
    o.append(f"--config.steps={run['steps']}")
  elif args.steps is not None or args.quick:
    o.append(f"--config.steps={base_steps(args)}")
  if run.get("lr") is not None:
    o.append(f"--config.optim.lr={run['lr']}")
  if args.quick:
    o += [
      "--config.model.n_layer=1",
      "--config.model.d_model=64",
      "--config.model.n_head=2",
      "--config.model.max_len=32",
      "--config.data.seq_len=32",
      "--config.data.batch_size=8",
      # 100 files: a held-out split that fills the quick evaluation's windows on Python 3.11,
      # 3.12 and 3.13 alike (with 40, 3.12's held out one 97-byte frozen-import test stub)
      "--config.data.max_files=100",
      "--config.optim.warmup_steps=2",
      "--config.log_every=2",
      "--config.eval_every=4",
      "--config.eval_batches=2",
      "--config.checkpoint_every=4",
      "--config.sample_tokens=0",
    ]
  return o


def train_meta(args) -> dict:
  """The training settings every run shares (for the write-up's limits paragraph): the
  config with this invocation's overrides applied."""
  from rove_jax.train import overrides as overrides_lib

  given = overrides_lib.split(overrides(args, {"encoding": "rove", "seed": 0}))
  c = overrides_lib.apply(load_config(CONFIG), given)
  return {
    "steps": c.steps,
    "batch_size": c.data.batch_size,
    "seq_len": c.data.seq_len,
    "lr": c.optim.lr,
    "warmup_steps": c.optim.warmup_steps,
  }
