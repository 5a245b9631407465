"""rove-train's helpers for a newcomer: --help-config lists every config field with its default,
and the dry run prints the elapsed time while the compiler runs."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time

from rove_jax.cli import dry_run
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import config_schema
from rove_jax.train.run_config import SECTIONS, RunConfig
from tests.conftest import subprocess_env


def _leaves(c, prefix=""):
  out = {}
  for key in c.keys():
    value = c[key]
    if hasattr(value, "keys") and f"{prefix}{key}" != "model.rope_scaling":
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def test_help_config_lists_every_field_with_its_default():
  r = subprocess.run([sys.executable, "-m", "rove_jax.cli.train", "--help-config"],
                     capture_output=True, text=True, timeout=120, env=subprocess_env())
  assert r.returncode == 0, r.stderr[-2000:]
  listed = dict(re.findall(r"^  (\S+) = (.*?)(?:  # .*)?$", r.stdout, re.M))
  schema = set(_leaves(config_schema.base_config("tiny")))
  assert set(listed) == schema  # the fields --config.KEY=VALUE accepts, no more, no fewer
  defaults = RunConfig()
  assert listed["optim.lr"] == repr(defaults.optim.lr) and listed["steps"] == "1000"
  assert listed["model.d_model"] == repr(GPTConfig.tiny().d_model)
  for name, section in SECTIONS.items():
    for f in dataclasses.fields(section):
      assert f.metadata["help"] in r.stdout, f"{name}.{f.name} has no help text"


def test_the_dry_run_prints_elapsed_time_while_it_compiles():
  lines = []
  with dry_run.Elapsed("compiling", every=0.05, log=lines.append):
    time.sleep(0.4)
  beats = [l for l in lines if re.fullmatch(r"  compiling: \d+ s", l)]
  assert len(beats) >= 3, lines  # one every 0.05 s of a 0.4 s compile
  done = re.fullmatch(r"  compiling: done in (\d+\.\d) s", lines[-1])
  assert done and float(done[1]) >= 0.4, lines
