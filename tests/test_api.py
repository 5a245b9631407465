"""The stable public names exist (tests/test_readme.py runs the README's python examples)."""

import rove_jax as rj


def test_stable_names():
  for name in ("rope_frequencies", "rotate", "rope_attention", "rove_attention",
               "rotation_matrix", "axial_frequencies"):
    assert callable(getattr(rj, name)), name
  for name in ("linear", "ntk", "dynamic_ntk", "yarn", "dynamic_yarn", "llama3", "longrope",
               "from_config"):
    assert callable(getattr(rj.scaling, name)), name
  assert callable(rj.analysis.value_kernel) and callable(rj.analysis.mixer_matrix)
