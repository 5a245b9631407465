"""Before the first step: packed documents that the chosen attention kernel cannot take.

cuDNN's packed layout (rove_jax.kernels.xla) is compiled for at most `cudnn_max_segments(T)`
documents a row; a row with more would come out NaN. When the run packs documents and its
attention would take that path (a Hopper GPU, a half-precision model, kernel "auto" or
"cudnn"), every window of the training and validation tokens is counted here, once, and a run
whose data holds a fuller row stops with what to change, before any step runs. Every process
counts its own tokens; the largest count is shared, so all stop together.
"""

from __future__ import annotations

from typing import Optional

import jax
import numpy as np

from rove_jax import kernels
from rove_jax.data import pipeline
from rove_jax.nn.model_config import DTYPES, GPTConfig


def cudnn_capacity(model: GPTConfig, seq_len: int) -> Optional[int]:
  """The documents a row cuDNN's packed layout takes in this run's attention, or None when the
  run's attention does not take that path (another kernel, platform or dtype)."""
  if (
    model.pos_encoding == "t5_bias"
    or kernels.platform.target_platform() != "gpu"
    or not kernels.xla.cudnn_packs()
  ):
    return None
  q = jax.ShapeDtypeStruct((1, seq_len, model.n_head, model.head_dim), DTYPES[model.dtype])
  k = jax.ShapeDtypeStruct((1, seq_len, model.n_kv_head, model.head_dim), DTYPES[model.dtype])
  mask = kernels.Mask(segment_ids=np.zeros((1, seq_len), np.int32), ordered=True)
  name = model.attention_impl
  if name in kernels.ROTARY:
    return None
  try:
    chosen = kernels.choose(name, q=q, k=k, mask=mask)
  except ValueError:
    return None  # the model's own checks report a kernel that cannot run
  return kernels.xla.cudnn_max_segments(seq_len) if chosen == "cudnn" else None


def check(model: GPTConfig, seq_len: int, token_arrays, eot_id: int, log=print) -> None:
  """Raises ValueError, on every process alike, when a window of `token_arrays` packs more
  documents than the run's attention kernel takes (see the module docstring)."""
  capacity = cudnn_capacity(model, seq_len)
  if capacity is None:
    return
  most = max(pipeline.max_documents(t, seq_len, eot_id) for t in token_arrays)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    most = int(np.max(multihost_utils.process_allgather(np.array(most, np.int32))))
  if most > capacity:
    raise ValueError(
      f"packed documents: a window of {seq_len} tokens in this run's data holds {most} "
      f"documents, more than the {capacity} cuDNN's packed attention is compiled for "
      f"(seq_len / {kernels.xla.CUDNN_TOKENS_PER_SEGMENT}); its rows would come out NaN. Set "
      f"--config.model.attention_impl=xla (exact for any packing, slower), or "
      f"--config.data.packing=False, or filter out documents shorter than "
      f"{kernels.xla.CUDNN_TOKENS_PER_SEGMENT} tokens"
    )
  log(f"packed documents: at most {most} a window, within cuDNN's {capacity}")
