"""Which optional dependencies a layer needs, checked when the layer is imported.

The core (rotary, scaling, hf_rope, attention, kernels, analysis) needs jax and numpy only; the
layers above come with pip extras. Importing a layer whose extra is not installed raises one
ModuleNotFoundError naming every missing module and the pip command that installs them, instead
of the first bare import error deep inside the layer.
"""

from __future__ import annotations

import importlib.util

# The pip extra of each layer and the top-level modules it brings (pyproject.toml's extras).
# Each extra includes the one before it, as in pyproject.toml.
_NN = ("flax",)
_TRAIN = _NN + ("optax", "orbax.checkpoint", "grain", "absl", "tqdm", "tensorboardX")
EXTRAS = {"nn": _NN, "train": _TRAIN, "eval": _TRAIN + ("matplotlib",)}


def _installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):  # a parent package that is missing or broken
    return False


def require(extra: str, layer: str) -> None:
  """Raises ModuleNotFoundError when a module of `extra` (a key of EXTRAS) is missing."""
  missing = [m for m in EXTRAS[extra] if not _installed(m)]
  if missing:
    raise ModuleNotFoundError(
      f"{layer} needs the {extra!r} extra, which is not installed (missing: "
      f"{', '.join(missing)}): pip install 'rove_jax[{extra}]' (or 'rove_jax[all]')",
      name=missing[0],
    )
