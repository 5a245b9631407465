"""The stable public names exist and the README's example runs as written."""

import pathlib
import re

import numpy as np

import rove_jax as rj


def test_stable_names():
  for name in ("rope_frequencies", "rotate", "rope_attention", "rove_attention",
               "rotation_matrix", "axial_frequencies"):
    assert callable(getattr(rj, name)), name
  for name in ("linear", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn", "llama3", "longrope",
               "from_config"):
    assert callable(getattr(rj.scaling, name)), name
  assert callable(rj.analysis.value_kernel) and callable(rj.analysis.mixer_matrix)


def test_readme_python_example_runs():
  readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
  blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
  assert blocks, "README.md has no python example"
  scope = {}
  exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102
  y = scope["y"]
  assert y.shape == (2, 128, 8, 64) and np.isfinite(np.asarray(y)).all()
