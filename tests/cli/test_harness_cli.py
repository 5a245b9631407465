"""rove-lm-eval's own argument checks (rove_jax.cli.harness.parse_args): refused before lm_eval
or the model loads, with one line and exit status 2."""

import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")
from rove_jax.cli import harness as harness_cli  # noqa: E402 - after the skip

BASE = ["--model", "rove_jax", "--model_args", "path=exports/tiny", "--tasks", "hellaswag"]


@pytest.mark.parametrize("value", ["auto", "auto:4"])
def test_automatic_batch_size_is_refused_in_one_line(value, capsys):
  with pytest.raises(SystemExit) as e:
    harness_cli.parse_args([*BASE, "--batch_size", value])
  assert e.value.code == 2
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert last == (
    f"rove-lm-eval: error: --batch_size {value}: the rove_jax model takes a fixed "
    f"batch size; give a number, e.g. --batch_size 8"
  )


def test_a_number_and_other_models_pass():
  assert harness_cli.parse_args([*BASE, "--batch_size", "8"]).batch_size == "8"
  other = ["--model", "hf", "--model_args", "pretrained=x", "--tasks", "t", "--batch_size", "auto"]
  assert harness_cli.parse_args(other).batch_size == "auto"


def test_the_command_ends_without_a_traceback(tmp_path):
  # the export does not exist: the refusal comes first, from the installed command's module
  r = subprocess.run(
    [
      sys.executable,
      "-m",
      "rove_jax.cli.harness",
      *BASE,
      "--batch_size",
      "auto",
      "--output_path",
      str(tmp_path / "out"),
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert r.returncode == 2, r.stderr
  assert "Traceback" not in r.stderr
  assert r.stderr.strip().splitlines()[-1].endswith("give a number, e.g. --batch_size 8")
