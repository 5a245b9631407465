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


def test_readme_model_example_runs():
  """The second python block (the model): forward, sampling, YaRN at 4x, all as written."""
  readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
  blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
  assert len(blocks) >= 2, "README.md lost its model example"
  scope = {}
  exec(compile(blocks[1], "README.md", "exec"), scope)  # noqa: S102
  cfg = scope["model"].config
  assert scope["logits"].shape == (2, 1024, cfg.vocab_size)  # the YaRN call, 4x the context
  assert np.isfinite(np.asarray(scope["logits"])).all()
  assert scope["out"].shape == (1, 8 + 64)
  assert np.array_equal(np.asarray(scope["out"][:, :8]), np.asarray(scope["prompt"]))
