"""Model FLOPs of the GPT: PaLM's count, with the full T x T score matrix that XLA's kernel
computes (causal kernels that skip masked blocks do about half of the attention part).

Per token:
  train 6 N + 12 n_layer H D T    eval 2 N + 4 n_layer H D T    decode 2 N + 4 n_layer H D S
N: the parameters that multiply activations (all but embedding lookups: the token table unless
tied to the output head, the learned position and T5 tables; norms and biases, a fraction of a
percent, are in); H D = n_head * head_dim; T the sequence length; S the KV-cache length.

Used for the MFU that training logs (rove_jax.train.step_loop) and the ahead-of-time reports
(rove_jax.aot.analysis).
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from rove_jax.nn.model import abstract_model

JOBS = ("train", "eval", "decode")


def matmul_params(model_cfg) -> int:
  """Parameters that multiply activations: all but the embedding lookups."""
  model = abstract_model(model_cfg)
  size = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  lookups = [model.pos_embed, model.t5_table] + ([model.embed] if model.lm_head else [])
  return size(nnx.state(model, nnx.Param)) - sum(size(v) for v in lookups if v is not None)


def model_flops_per_token(model_cfg, job: str, length: int) -> tuple[float, float]:
  """(model FLOPs, of which attention) of one token; `length` is T (train, eval) or S
  (decode)."""
  if job not in JOBS:
    raise ValueError(f"job must be one of {JOBS}, got {job!r}")
  attention = 4 * model_cfg.n_layer * model_cfg.n_head * model_cfg.head_dim * length
  forward = 2 * matmul_params(model_cfg) + attention
  return (3 * forward, 3 * attention) if job == "train" else (forward, attention)
