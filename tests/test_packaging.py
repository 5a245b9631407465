"""The wheel carries the library, evaluation, packaged configs and both commands, and nothing of
the study (reproduce.py's write-up, outside the package) or the checkout's tools.

Builds a wheel from a copy of the tracked files (nothing is written into the checkout) and
reads its contents; tests/cli/test_eval.py and test_loop.py run the commands' code.
"""

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  src = tmp_path_factory.mktemp("src")
  tracked = (
    subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    .stdout.decode()
    .split("\0")
  )
  for name in filter(None, tracked):
    path = ROOT / name
    if path.is_file() and not path.is_symlink():
      (src / name).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(path, src / name)
  out = tmp_path_factory.mktemp("wheel")
  built = subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
    capture_output=True,
    text=True,
    timeout=300,
  )
  if built.returncode != 0 and "Could not find a version" in built.stderr:
    pytest.skip(f"no build backend reachable: {built.stderr[-300:]}")
  assert built.returncode == 0, built.stderr[-3000:]
  (path,) = out.glob("rove_jax-*.whl")
  return zipfile.ZipFile(path)


def test_wheel_ships_evaluation_and_configs(wheel):
  names = set(wheel.namelist())
  tracked = {
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "rove_jax").rglob("*.py")
    if "__pycache__" not in p.parts
  }
  missing = sorted(tracked - names)
  assert not missing, f"modules left out of the wheel: {missing}"
  for name in (
    "rove_jax/cli/eval.py",
    "rove_jax/evaluation/ruler/suite.py",
    "rove_jax/train/configs/tiny.py",
    "rove_jax/data/pipeline.py",
  ):
    assert name in names
  # Only the package: no top-level eval/, tests/, bench/ or study/ to clobber other installs.
  assert not [n for n in names if n.split("/")[0] in ("eval", "tests", "bench", "configs", "study")]
  assert not [n for n in names if "paper_recipe" in n or "writeup" in n or "claims" in n]


def test_wheel_core_needs_only_jax_and_numpy(wheel):
  """The functions install with jax and numpy alone; the layers above come with extras."""
  (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
  requires = [
    line.split(":", 1)[1].strip()
    for line in wheel.read(meta).decode().splitlines()
    if line.startswith("Requires-Dist:")
  ]
  core = sorted(
    r.split(">")[0].split("=")[0].split("[")[0].strip() for r in requires if "extra ==" not in r
  )
  assert core == ["jax", "numpy"], requires
  extras = {r.split("extra ==")[1].strip().strip("'\"") for r in requires if "extra ==" in r}
  assert {"nn", "train", "eval", "all", "test"} <= extras
  flax = [r for r in requires if r.startswith("flax")]
  assert flax and all('extra == "nn"' in r or "extra == 'nn'" in r for r in flax), flax


def test_wheel_declares_both_commands(wheel):
  (entry,) = [n for n in wheel.namelist() if n.endswith("entry_points.txt")]
  parser = configparser.ConfigParser()
  parser.read_string(wheel.read(entry).decode())
  assert dict(parser["console_scripts"]) == {
    "rove-train": "rove_jax.cli.train:run",
    "rove-eval": "rove_jax.cli.eval:main",
    "rove-prepare": "rove_jax.cli.prepare:run",
    "rove-export": "rove_jax.cli.export:main",
    "rove-lm-eval": "rove_jax.cli.harness:main",
  }
