"""How scripts/hf_rope_reference.py writes the values it computes into
tests/reference_data/hf_rope_reference.json (imported by it and its table modules; run
hf_rope_reference.py).
"""

import numpy as np


def f32_list(t):
  """float32 values, each written with the fewest digits that read back to the same float32."""
  return [
    float(np.format_float_scientific(x, unique=True)) for x in np.asarray(t, np.float32).reshape(-1)
  ]


def nested(t, digits=6):
  """An array as nested lists rounded to `digits` decimals (attention outputs)."""
  return np.round(np.asarray(t, np.float64), digits).tolist()
