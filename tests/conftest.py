"""Strict test configuration (rank promotion raises, 8 fake CPU devices for the sharding tests)
and the fixtures the test files share: child-process environments, model and run configs."""

# Must happen before JAX initialises its backends.
import importlib.metadata  # noqa: E402
import os
import pathlib
import pkgutil  # noqa: E402
import socket
import subprocess
import sys


def _cpu_only() -> bool:
  """Whether this session's JAX can only run on the CPU: JAX_PLATFORMS names the CPU alone, or
  no accelerator plugin is installed (found without importing jax: the plugins' namespace
  package and entry points, where jax looks for them)."""
  platforms = {
    p.strip().lower() for p in os.environ.get("JAX_PLATFORMS", "").split(",") if p.strip()
  }
  if platforms:
    return platforms <= {"cpu"}
  names = [ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")]
  try:
    import jax_plugins

    names += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
  except ImportError:
    pass
  return not any(k in n.lower() for n in names for k in ("cuda", "rocm", "gpu", "tpu"))


_DEVICE_FLAG = "--xla_force_host_platform_device_count"
# The suite is compile-bound (hundreds of small programs, each compiled once): LLVM at -O0 halves
# XLA's CPU compile times and with them the suite's. The programs and their floating-point
# semantics are the same (no fast-math at any level); only the generated machine code is less
# optimised. Child processes inherit it through XLA_FLAGS; set the flag yourself to override.
_OPT_FLAG = "--xla_backend_optimization_level"
# XLA's newer MLIR fusion emitters compile the suite's many small programs several times more
# slowly than the classic LLVM IR emitters (bench/RESULTS.md has the measurement). Both emit the
# same HLO semantics without fast-math. A CPU-only flag: an XLA that does not know it (the CUDA
# plugin of jax 0.11 aborts the process on it) never sees it, so it is set only when the session
# runs on the CPU alone; a GPU session keeps XLA's defaults for its CPU client too.
_EMITTER_FLAG = "--xla_cpu_use_fusion_emitters"
# Whether this XLA knows the flag, asked once a session of a child (an unknown flag aborts the
# process; jax 0.12's XLA has only the new emitters): "1" or "0", inherited by xdist's workers.
_EMITTER_KNOWN = "ROVE_JAX_TEST_XLA_KNOWS_EMITTER_FLAG"


def _xla_knows_emitter_flag() -> bool:
  if _EMITTER_KNOWN not in os.environ:
    probe = subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices('cpu')"],
      env={**os.environ, "XLA_FLAGS": f"{_EMITTER_FLAG}=false", "JAX_PLATFORMS": "cpu"},
      capture_output=True,
      timeout=300,
    )
    os.environ[_EMITTER_KNOWN] = "1" if probe.returncode == 0 else "0"
  return os.environ[_EMITTER_KNOWN] == "1"


_defaults = [(_DEVICE_FLAG, "8"), (_OPT_FLAG, "0")]
if _cpu_only() and _xla_knows_emitter_flag():
  _defaults.append((_EMITTER_FLAG, "false"))
_flags = os.environ.get("XLA_FLAGS", "")
for _flag, _default in _defaults:
  if _flag not in _flags:  # a value set by the caller wins
    _flags += f" {_flag}={_default}"
os.environ["XLA_FLAGS"] = _flags.strip()

# One persistent compilation cache for the child processes of the session (train.py, eval, the
# notebook; see subprocess_env): they compile the same tiny programs again and again, and read
# them back instead. The controller creates it before the xdist workers start; they inherit its
# path under a name JAX does not read, because in-process tests compile programs no other test
# shares, and writing each to the cache cost them about a quarter more time. Removed at the end.
_CHILD_CACHE_VAR = "ROVE_JAX_TEST_CHILD_XLA_CACHE"
_OWN_CACHE = None
if _CHILD_CACHE_VAR not in os.environ:
  import tempfile

  _OWN_CACHE = os.environ[_CHILD_CACHE_VAR] = tempfile.mkdtemp(prefix="rove-jax-test-xla-cache-")

# One GCS API server (fake-gcs-server, tests/gcs_server.py) for the session, started by the
# controller before the xdist workers; they and every child process reach it through the
# environment variables it sets. Stopped at the end.
from tests import gcs_server  # noqa: E402

_OWN_GCS = None
# ROVE_JAX_TEST_GCS=off (make test-gpu, whose tests use no storage): no server, and the tests
# that need one are skipped with that reason.
_GCS_OFF = os.environ.get("ROVE_JAX_TEST_GCS", "").lower() == "off"
if gcs_server.URL_VAR not in os.environ and not _GCS_OFF:
  _OWN_GCS = gcs_server.Server()
  os.environ.update(gcs_server.environment(_OWN_GCS.url))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from rove_jax.nn.model_config import GPTConfig  # noqa: E402
from rove_jax.train import overrides as overrides_lib  # noqa: E402
from rove_jax.train.run_config import DataConfig, OptimConfig, RunConfig  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_default_matmul_precision", "highest")


def has_gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def pytest_unconfigure(config):
  if _OWN_GCS is not None:
    _OWN_GCS.stop()
  if _OWN_CACHE is not None:
    import shutil

    shutil.rmtree(_OWN_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  # Collection order is kept: pytest-xdist (3.x) first hands each worker a contiguous share
  # (--dist load a quarter of it, worksteal, which make test uses, all of it), so moving the
  # tests marked slow to the front gave them all to one worker; in file order they are spread
  # over the workers and a module's tests (and its module fixtures) stay together.
  if has_gpu():
    return
  skip = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


@pytest.fixture
def gcs_bucket() -> str:
  """gs://NAME: a new, empty bucket on the session's GCS API server."""
  if _GCS_OFF:
    pytest.skip("ROVE_JAX_TEST_GCS=off: no GCS API server in this session")
  return gcs_server.new_bucket()


@pytest.fixture
def rng():
  return np.random.default_rng(0)


# ------------------------------------------------------------------ child processes


def subprocess_env(devices=1, **overrides) -> dict:
  """os.environ for a child process (train.py, rove_jax.cli.eval, a notebook kernel, bench).

  This process splits the CPU into 8 fake devices; a child inherits that through XLA_FLAGS
  unless told otherwise, and its default mesh then spans all 8.

  Args:
    devices: how many CPU devices the child sees; None: the machine as it is (no fake split).
      Other XLA flags are kept.
    **overrides: further variables to set, e.g. JAX_PLATFORMS="cpu".

  Returns:
    A new dict; os.environ is not modified.
  """
  env = dict(os.environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", env[_CHILD_CACHE_VAR])
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
  if devices is not None:
    flags.append(f"{_DEVICE_FLAG}={int(devices)}")
  env["XLA_FLAGS"] = " ".join(flags)
  env.update(overrides)
  return env


# ---------------------------------------------------------------------------- configs


def gpt_config(**overrides) -> GPTConfig:
  """A GPTConfig small enough for unit tests (one layer, width 32, 32 positions).

  Args:
    **overrides: GPTConfig fields to change; the rest keep GPTConfig's defaults (vocabulary
      320, RoVE, rope_base 1e4).

  Returns:
    The validated config.
  """
  return GPTConfig(**{**dict(n_layer=1, n_head=2, d_model=32, d_ff=64, max_len=32), **overrides})


def write_corpus(directory: pathlib.Path, n_files=6, chars=6000, seed=0) -> str:
  """A few text files of code-like words in `directory`; returns its path as a string."""
  rng = np.random.default_rng(seed)
  words = [
    "def",
    "return",
    "self",
    "value",
    "class",
    "import",
    "for",
    "in",
    "if",
    "else",
    "print",
    "(",
    ")",
    ":",
    "=",
    "+",
    "0",
    "1",
    "x",
    "y",
    "\n",
  ]
  directory.mkdir(parents=True, exist_ok=True)
  for i in range(n_files):
    text = " ".join(rng.choice(words, size=chars // 4))
    (directory / f"doc{i}.txt").write_text(text)
  return str(directory)


def free_port() -> int:
  """A TCP port on localhost nobody listens on now (for jax.distributed's coordinator)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run_together(cmds, env, *, timeout=300) -> list:
  """Runs the commands at once (the processes of one jax.distributed job) and returns their
  outputs (stdout and stderr); asserts that every one exited 0."""
  procs = [
    subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for cmd in cmds
  ]
  outs = []
  try:
    for p in procs:
      outs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      p.kill()
  assert all(p.returncode == 0 for p in procs), "\n\n".join(o[-3000:] for o in outs)
  return outs


def small_config(tmp_path, **overrides) -> RunConfig:
  """The tiny run config on a corpus written under tmp_path: 8 steps of [4, 32] batches.

  Args:
    tmp_path: a directory for the corpus (pytest's tmp_path).
    **overrides: dotted keys, e.g. **{"optim.lr": 0.0}, or top-level ones like steps=4
      (rove_jax.train.overrides.apply: model.max_len follows data.seq_len, d_ff d_model).

  Returns:
    The RunConfig.
  """
  c = RunConfig(
    model=GPTConfig.tiny(n_layer=1, d_model=32, n_head=2, d_ff=64, max_len=32),
    data=DataConfig(
      source="text", path=write_corpus(tmp_path / "corpus"), seq_len=32, batch_size=4
    ),
    optim=OptimConfig(warmup_steps=2),
    steps=8,
    log_every=1,
    eval_every=4,
    eval_batches=2,
    checkpoint_every=4,
    progress=False,
    sample_tokens=0,
  )
  return overrides_lib.apply(c, overrides)


# ------------------------------------------------------------------------ a trained run


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory) -> pathlib.Path:
  """The workdir of a tiny RoVE run trained once per test session, for tests that only read it.

  small_config on the stdlib corpus (120 files), max_len = seq_len = 64, 6 steps, checkpoints
  at steps 4 and 6. Under pytest-xdist the workers share it: the first to take the file lock
  trains it, the others wait and reuse it. Tests must not write into it (give rove-eval an
  --out directory).

  Returns:
    The workdir (a pathlib.Path).
  """
  from rove_jax.train import loop as training

  def train(workdir):
    c = small_config(
      workdir.parent / "shared-trained-run-data",
      steps=6,
      **{
        "data.source": "stdlib",
        "data.path": None,
        "data.max_files": 120,
        "model.max_len": 64,
        "data.seq_len": 64,
      },
    )
    training.train(c, str(workdir), devices=jax.devices()[:1], log=lambda *a: None)

  return made_once(tmp_path_factory, "shared-trained-run", train)


def made_once(tmp_path_factory, name: str, make) -> pathlib.Path:
  """The directory `name`, made by make(directory) once a test session: under pytest-xdist the
  first worker to take its file lock makes it, the others wait and reuse it (a module- or
  session-scoped fixture alone runs once a worker). A directory a worker left unfinished (it
  died in make) is made again."""
  import fcntl
  import shutil

  base = tmp_path_factory.getbasetemp()
  # Under xdist each worker's base is <session dir>/popen-gwN: the parent is this session's
  # alone. Without xdist the parent holds other sessions' directories, so stay in base.
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  made = root / name
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not (made / "DONE").exists():
      shutil.rmtree(made, ignore_errors=True)
      made.mkdir(parents=True)
      make(made)
      (made / "DONE").write_text("complete\n")
  return made
