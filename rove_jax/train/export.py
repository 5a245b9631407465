"""Exports the newest verified checkpoint of a training workdir for inference.

    python -m rove_jax.train.export --workdir runs/tiny --out exports/tiny [--format auto]

reads the newest checkpoint whose checksums verify (`checkpoint.read_run`: read-only, an
unreadable checkpoint is reported and the previous one taken) and writes its parameters with
`rove_jax.nn.pretrained.save`: a transformers GPT-2 checkpoint for a GPT-2-shaped model
(learned positions), otherwise rove-jax's own safetensors + config.json (its keys in
rove_jax.nn.pretrained's docstring). `rove_jax.nn.pretrained.load(out)` returns
(GPTConfig, params) ready for `rove_jax.nn.model.generate`. The config.json also records the
run it came from under "rove_jax_run": the step, the workdir's name and the tokenizer
metadata (spec, vocabulary size, end-of-text id, fingerprint), since the ids mean nothing
without the tokenizer; the end-of-text id also becomes GPT-2's bos/eos_token_id.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from rove_jax.nn import param_files, pretrained
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import checkpoint


def export_run(workdir: str, out_dir: str, *, format: str = "auto", overwrite: bool = False,
               report=print) -> dict:
  """Writes the newest verified checkpoint of `workdir` to `out_dir`.

  Returns:
    {"step", "format", "config", "weights"}: what was written.

  Raises:
    ValueError: an unknown format, no readable checkpoint, a model the format cannot hold, or
      an out_dir that already holds an export (without overwrite), all before writing.
  """
  if format not in pretrained.FORMATS:  # checked again, with the model, by resolve_format
    raise ValueError(f"unknown export format {format!r}; expected one of {pretrained.FORMATS}")
  existing = [f for f in (param_files.CONFIG, param_files.WEIGHTS)
              if os.path.exists(os.path.join(out_dir, f))]
  if existing and not overwrite:
    raise ValueError(f"{out_dir} already holds {', '.join(existing)}; choose another --out or "
                     f"pass --overwrite")
  step, params, meta = checkpoint.read_run(
      workdir, lambda meta: param_files.abstract_params(GPTConfig.from_dict(meta["model"])),
      report=report)
  config = GPTConfig.from_dict(meta["model"])
  format = pretrained.resolve_format(config, format)
  tokenizer = meta.get("tokenizer", {})
  extra = {"rove_jax_run": {"step": int(step), "tokenizer": tokenizer,
                            "workdir": os.path.basename(os.path.abspath(workdir).rstrip("/"))}}
  if tokenizer.get("eot_id") is not None and format == "gpt2":
    extra["bos_token_id"] = extra["eos_token_id"] = int(tokenizer["eot_id"])
  written = pretrained.save(out_dir, config, params, format=format, extra_config=extra)
  return {"step": int(step), **written}


def main(argv: Optional[list] = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m rove_jax.train.export",
      description="Export the newest verified checkpoint of a training workdir as "
                  "safetensors + config.json (GPT-2's format where it fits).")
  parser.add_argument("--workdir", required=True, help="the training run's --workdir")
  parser.add_argument("--out", required=True, help="the directory to write")
  parser.add_argument("--format", default="auto", choices=pretrained.FORMATS,
                      help="auto: GPT-2's where the model fits it, else rove-jax's")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace an export already in --out")
  args = parser.parse_args(argv)
  try:
    done = export_run(args.workdir, args.out, format=args.format, overwrite=args.overwrite,
                      report=lambda msg: print(msg, file=sys.stderr))
  except (ValueError, FileNotFoundError) as e:
    print(f"export: {e}", file=sys.stderr)
    return 2
  print(f"exported step {done['step']} of {args.workdir} in {done['format']} format to "
        f"{os.path.dirname(done['config'])}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
