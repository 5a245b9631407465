"""rove-train's helpers for a newcomer: --help-config lists every config field with its default
(or its value under --config, overrides applied) and its description,
and the dry run prints the elapsed time while the compiler runs."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time

import pytest

from rove_jax.cli import dry_run
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.run_config import SECTIONS, RunConfig
from tests.conftest import subprocess_env


def _leaves(c, prefix=""):
  """Every field of a RunConfig's dict form, dotted (model.rope_scaling is one)."""
  out = {}
  for key, value in c.items():
    if isinstance(value, dict) and f"{prefix}{key}" != "model.rope_scaling":
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def test_help_config_lists_every_field_with_its_default():
  r = subprocess.run(
    [sys.executable, "-m", "rove_jax.cli.train", "--help-config"],
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(),
  )
  assert r.returncode == 0, r.stderr[-2000:]
  listed = dict(re.findall(r"^  (\S+) = (.*?)(?:  # .*)?$", r.stdout, re.M))
  schema = set(_leaves(RunConfig().to_dict()))
  assert set(listed) == schema  # the fields --config.KEY=VALUE accepts, no more, no fewer
  defaults = RunConfig()
  assert listed["optim.lr"] == repr(defaults.optim.lr) and listed["steps"] == "1000"
  assert listed["model.d_model"] == repr(GPTConfig.tiny().d_model)
  for name, section in {**SECTIONS, "model": GPTConfig}.items():
    for f in dataclasses.fields(section):
      assert f.metadata.get("help"), f"{name}.{f.name} has no help text"
      assert f.metadata["help"] in r.stdout, f"{name}.{f.name}'s help text is not listed"


def test_help_config_lists_the_chosen_configs_values_with_overrides():
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.train",
      "--config",
      "demo",
      "--config.model.pos_encoding=rope",
      "--help-config",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(),
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.splitlines()[0] == (
    "Every config field with its value under --config demo and "
    "--config.model.pos_encoding=rope; set one with --config.FIELD=VALUE:"
  )
  listed = dict(re.findall(r"^  (\S+) = (.*?)(?:  # .*)?$", r.stdout, re.M))
  # configs/demo.py's values, not the tiny preset's (n_layer 6, d_model 384, max_len 256)
  assert (listed["model.n_layer"], listed["model.d_model"], listed["model.max_len"]) == (
    "3",
    "128",
    "64",
  )
  assert listed["data.seq_len"] == "64" and listed["steps"] == "400"
  assert listed["model.pos_encoding"] == "'rope'"
  assert "  model.n_layer = 3  # transformer blocks" in r.stdout.splitlines()
  bad = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.train",
      "--config",
      "demo",
      "--config.model.nope=1",
      "--help-config",
    ],
    capture_output=True,
    text=True,
    timeout=120,
    env=subprocess_env(),
  )
  assert bad.returncode == 2 and "model has no field 'nope'" in bad.stderr, bad.stderr


def test_the_dry_run_prints_elapsed_time_while_it_compiles():
  lines = []
  with dry_run.Elapsed("compiling", every=0.05, log=lines.append):
    time.sleep(0.4)
  beats = [l for l in lines if re.fullmatch(r"  compiling: \d+ s", l)]
  assert len(beats) >= 3, lines  # one every 0.05 s of a 0.4 s compile
  done = re.fullmatch(r"  compiling: done in (\d+\.\d) s", lines[-1])
  assert done and float(done[1]) >= 0.4, lines


def test_the_dry_run_gives_a_verdict_against_this_hosts_memory():
  report = {"memory": {"total": 3 * 2**30}, "devices": 2}
  assert dry_run.verdict(report, 8 * 2**30, "this host's memory", True) == (
    True,
    "verdict: fits this host's memory: it needs 3.00 GiB a device x 2 devices = 6.00 GiB "
    "of 8.00 GiB",
  )
  assert dry_run.verdict(report, 5 * 2**30, "this host's memory", True) == (
    False,
    "the train step does not fit this host's memory: it needs 3.00 GiB a device x 2 "
    "devices = 6.00 GiB of 5.00 GiB",
  )
  assert dry_run.verdict(report, 5 * 2**30, "a GPU's memory", False)[0]  # one device's own
  assert dry_run.host_memory_bytes() > 2**30


def test_a_dry_run_that_does_not_fit_this_host_exits_1_with_the_figures(tmp_path):
  base = [
    sys.executable,
    "-m",
    "rove_jax.cli.train",
    "--config",
    "smoke",
    "--workdir",
    str(tmp_path / "w"),
    "--config.dry_run=True",
  ]
  ok = subprocess.run(base, capture_output=True, text=True, timeout=600, env=subprocess_env())
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert re.search(
    r"^verdict: fits this host's memory: it needs [\d.]+ GiB of [\d.]+ GiB$", ok.stdout, re.M
  ), ok.stdout
  # 1 TiB of host memory is not enough for a batch of 2**22 windows
  big = subprocess.run(
    [*base, "--config.data.batch_size=4194304"],
    capture_output=True,
    text=True,
    timeout=600,
    env=subprocess_env(),
  )
  assert big.returncode == 1, big.stderr[-2000:]
  last = big.stderr.strip().splitlines()[-1]
  assert re.match(
    r"error: the train step does not fit this host's memory: it needs [\d.]+ GiB "
    r"of [\d.]+ GiB; training would run out of memory \(a smaller "
    r"data.batch_size",
    last,
  ), last
  assert not (tmp_path / "w").exists()  # nothing written


def _config_failure(path):
  """What rove-train says of the config file at `path` (its ValueError's message)."""
  from rove_jax.train import overrides

  with pytest.raises(ValueError) as e:
    overrides.load_file(str(path))
  return str(e.value)


def test_a_config_file_that_exits_or_raises_is_an_error_naming_its_line(tmp_path):
  cases = {
    "exit0.py": (
      "import sys\n\ndef get_config():\n  sys.exit(0)\n",
      4,
      "sys.exit(0)",
      "the config file exited (SystemExit: 0)",
    ),
    "exit_at_import.py": (
      "import sys\nsys.exit('bye')\n",
      2,
      "sys.exit('bye')",
      "the config file exited (SystemExit: 'bye')",
    ),
    "runtime.py": (
      "def get_config():\n  raise RuntimeError('boom')\n",
      2,
      "raise RuntimeError('boom')",
      "RuntimeError: boom",
    ),
    "value.py": (
      "def get_config():\n  return int('x')\n",
      2,
      "return int('x')",
      "ValueError: invalid literal for int() with base 10: 'x'",
    ),
    "oserror.py": (
      "def get_config():\n  return open('/nonexistent/config')\n",
      2,
      "return open('/nonexistent/config')",
      "FileNotFoundError: [Errno 2]",
    ),
  }
  for name, (text, line, code, what) in cases.items():
    path = tmp_path / name
    path.write_text(text)
    message = _config_failure(path)
    assert message.startswith(f"--config {path}, line {line} ({code}): {what}"), message


def test_errors_outside_the_config_file_are_not_blamed_on_it(tmp_path):
  from rove_jax.cli import train
  from rove_jax.train import config_file

  try:
    raise SystemExit(1)  # absl's --help exits like this: it must pass through
  except SystemExit as e:
    assert config_file._failure(e, str(tmp_path / "c.py")) is None
  assert train.config_path(["rove-train", "--config=c.py:arg", "--workdir", "w"]).endswith("/c.py")
