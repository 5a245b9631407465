"""The layers' optional dependencies: the core imports with jax and numpy alone, and a layer
whose extra is missing says which pip extra to install."""

import subprocess
import sys
import textwrap

import pytest

from rove_jax import extras

# Runs in a child whose imports of the named top-level modules fail, as if not installed.
_BLOCKED = textwrap.dedent("""
    import importlib.abc, sys
    BLOCKED = set(sys.argv[1].split(","))

    class Block(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
          raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

    sys.meta_path.insert(0, Block())
    try:
      exec(sys.argv[2])
    except ModuleNotFoundError as e:
      print("ERROR:", e)
    """)


def _run(blocked, code):
  r = subprocess.run(
    [sys.executable, "-c", _BLOCKED, ",".join(blocked), code],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert r.returncode == 0, r.stderr[-2000:]
  return r.stdout


def test_core_imports_and_computes_without_any_extra():
  heavy = [
    "flax",
    "optax",
    "orbax",
    "grain",
    "ml_collections",
    "absl",
    "matplotlib",
    "chex",
    "tqdm",
    "tensorboardX",
  ]
  out = _run(
    heavy,
    textwrap.dedent("""
      import jax.numpy as jnp, rove_jax as rj
      q = jnp.ones((1, 4, 2, 8)); pos = jnp.arange(4)[None]
      inv = rj.rope_frequencies(8)
      print("shape", rj.rotate(q, pos, inv).shape)
      print("loaded", sorted({m.split('.')[0] for m in sys.modules} & BLOCKED))
      """),
  )
  assert "shape (1, 4, 2, 8)" in out and "loaded []" in out, out


@pytest.mark.parametrize(
  "layer, extra, blocked",
  [
    ("rove_jax.nn", "nn", ["flax"]),
    ("rove_jax.train", "train", ["optax", "grain"]),
    ("rove_jax.data", "train", ["grain"]),
    ("rove_jax.aot", "train", ["orbax"]),
  ],
)
def test_a_layer_without_its_extra_names_the_pip_command(layer, extra, blocked):
  out = _run(blocked, f"import {layer}")
  assert f"{layer} needs the {extra!r} extra" in out, out
  assert f"pip install 'rove_jax[{extra}]'" in out, out
  for module in blocked:
    assert module in out.split("missing:")[1], out


def test_plots_without_matplotlib_name_the_eval_extra():
  out = _run(["matplotlib"], "from rove_jax.evaluation import plots; plots.pyplot()")
  assert "needs the 'eval' extra" in out and "pip install 'rove_jax[eval]'" in out, out
  assert "missing: matplotlib" in out, out


def test_extras_match_pyproject():
  """Every module a layer checks for is brought by that extra in pyproject.toml (or by one of
  the extras it includes)."""
  import pathlib

  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  meta = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
  optional = meta["project"]["optional-dependencies"]

  def packages(extra):
    out = set()
    for req in optional[extra]:
      if req.startswith("rove_jax["):
        for inner in req[len("rove_jax[") : -1].split(","):
          out |= packages(inner)
      else:
        out.add(req.split(">")[0].split("=")[0].split("[")[0].strip().lower())
    return out

  dist = {"orbax.checkpoint": "orbax-checkpoint", "absl": "absl-py", "tensorboardX": "tensorboardx"}
  for extra, modules in extras.EXTRAS.items():
    have = packages(extra)
    for module in modules:
      assert dist.get(module, module).lower() in have, (extra, module, sorted(have))
