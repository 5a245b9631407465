"""What the benchmark suite's measurements (bench/suite.py, bench/isolated.py) share: timing
(one call run to completion, alternatives interleaved repeat by repeat, the median of the
paired per-repeat ratios), the training loop's optimizer with a train state and a random batch
for a GPT config, model FLOPs per train step (FLOPS_FORMULA), and this process's peak memory.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from bench import peak_rss_gib
from rove_jax.nn import model as nn_model
from rove_jax.nn.model import GPT, GPTConfig, count_params
from rove_jax.train import program
from rove_jax.train.run_config import OptimConfig

GIB = 2**30
FLOPS_FORMULA = (
  "6 * N_nonembed * tokens + 6 * n_layer * T * d_model * tokens "
  "(Kaplan et al. 2020; N_nonembed excludes the token/position embedding "
  "tables, so the tied LM-head matmul and rotary arithmetic are not credited)"
)


def time_call(fn: Callable[[], object]) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t0


def interleaved(fns: dict, repeats: int) -> dict:
  """Per-name lists of seconds; each repeat calls every fn once, back to back, so all see the
  same machine noise and the i-th times pair up."""
  times = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      times[name].append(time_call(fn))
  return times


def paired_ratio(a: list, b: list) -> float:
  """Median of per-repeat ratios: cancels slow drifts that a ratio of medians keeps."""
  return statistics.median(x / y for x, y in zip(a, b))


def optimizer():
  """The training loop's AdamW (warmup + cosine, clipping, decay mask) from the default config."""
  return program.make_optimizer(OptimConfig(), 1000)


def train_state(cfg: GPTConfig, tx, abstract: bool = False):
  """(graphdef, TrainState); shapes only (nothing allocated) when abstract."""

  def init():
    _, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
    return program.TrainState(
      params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32)
    )

  graphdef = nn_model.graphdef(cfg)
  return graphdef, (jax.eval_shape(init) if abstract else jax.jit(init)())


def random_batch(B: int, T: int, vocab: int, abstract: bool = False) -> dict:
  if abstract:
    s = jax.ShapeDtypeStruct((B, T), jnp.int32)
    return {"inputs": s, "targets": s}
  tok = jax.random.randint(jax.random.key(1), (B, T + 1), 0, min(vocab, 256), jnp.int32)
  return {"inputs": tok[:, :-1], "targets": tok[:, 1:]}


def flops_per_step(cfg: GPTConfig, B: int, T: int) -> float:
  """Model FLOPs of one train step by FLOPS_FORMULA."""
  abstract = nn_model.abstract_model(cfg)
  n_embed = cfg.vocab_size * cfg.d_model + (
    cfg.max_len * cfg.d_model if cfg.pos_encoding == "learned" else 0
  )
  n_nonembed = count_params(abstract) - n_embed
  tokens = B * T
  return 6.0 * n_nonembed * tokens + 6.0 * cfg.n_layer * T * cfg.d_model * tokens


def peak_memory() -> dict:
  """This process's peak host RSS and, on a GPU, the device allocator's peak."""
  out = {"peak_rss_gib": peak_rss_gib()}
  dev = jax.devices()[0]
  if dev.platform == "gpu":
    stats = dev.memory_stats() or {}
    out["peak_device_gib"] = stats.get("peak_bytes_in_use", float("nan")) / GIB
  return out
