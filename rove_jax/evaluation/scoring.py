"""Restoring a trained run and scoring token sequences with it.

Shape letters (legend in rove_jax): B batch, T tokens scored, W = T + 1 window length,
V vocabulary.

`load_run(workdir)` restores the newest readable checkpoint's parameters, model config and
tokenizer onto one device. `Scorer` wraps them: per-token negative log-likelihoods of windows
(perplexity), and (mean answer NLL, greedy exact match) of prompt/answer pairs (RULER, ICL),
at any length and with any inference-time `rope_scaling` (a scaling.RopeScaling, e.g. YaRN).
Long inputs use the chunked attention kernel, so 16x the training context fits a CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rove_jax import checks
from rove_jax import data as data_lib
from rove_jax.nn import model as nn_model
from rove_jax.nn.model import ROTARY_ENCODINGS, GPTConfig
from rove_jax.scaling import RopeScaling
from rove_jax.storage import paths
from rove_jax.train import run_reader
from rove_jax.train.run_config import RunConfig


@dataclasses.dataclass
class Run:
  """A trained run restored for evaluation."""

  workdir: str
  name: str
  step: int
  config: RunConfig  # what it was trained with, read back from the checkpoint's metadata
  params: Any  # nnx.State of the parameters
  tokenizer: Any
  _val_tokens: Optional[np.ndarray] = dataclasses.field(default=None, repr=False)

  @property
  def model_config(self) -> GPTConfig:
    return self.config.model

  @property
  def train_len(self) -> int:
    """The length the model was trained on (data.seq_len; model.max_len may be larger): the
    one source of evaluation lengths, YaRN factors and report labels."""
    return self.config.data.seq_len

  def val_tokens(self) -> np.ndarray:
    """The held-out split of the run's own training source, tokenized as in training, with its
    data.max_val_tokens cap (loaded once: perplexity, the RULER haystack and Figure 1 all read
    it). The training-time cache in workdir/data is read when valid; nothing is ever written
    into the workdir (a missing cache is made up for in memory)."""
    if self._val_tokens is None:
      data = self.config.data
      self._val_tokens = data_lib.load_tokens(
        data.corpus(),
        "val",
        self.tokenizer,
        cache_dir=paths.join(self.workdir, "data"),
        max_tokens=data.max_val_tokens,
        write_cache=False,
      )
    return self._val_tokens


def load_run(workdir: str) -> Run:
  """Restores the newest readable checkpoint of a training workdir (parameters only) with its
  run config and tokenizer (`run_reader.load_for_inference`, which rove-export shares).

  Raises:
    ValueError: the workdir or its checkpoints are missing or unreadable, (a
      checkpoint.LayoutError) they were written by another parameter layout, or the run's
      tokenizer is not the one it was trained with.
    paths.MissingExtra (an ImportError): a gs:// workdir without gcsfs.
  """
  restored = run_reader.load_for_inference(workdir)
  return Run(
    workdir=restored.workdir,
    name=paths.basename(restored.workdir),
    step=restored.step,
    config=RunConfig.from_metadata(restored.meta),
    params=restored.params,
    tokenizer=restored.tokenizer,
  )


DEFAULT_KERNEL = "chunked"  # evaluation's attention kernel: memory linear in the length


def yarn_scaling(length: int, train_len: int) -> Optional[RopeScaling]:
  """YaRN for `length` tokens of a model trained on `train_len`: factor = length / train_len
  (None at or below it)."""
  if length <= train_len:
    return None
  return fixed_yarn_scaling(length / train_len, train_len)


def fixed_yarn_scaling(factor: float, train_len: int) -> RopeScaling:
  """YaRN at one factor for every length (a deployed model's setting; at lengths up to the
  training length it is not the identity: the low frequencies are interpolated and the
  attention factor is 0.1 ln(factor) + 1).

  Raises:
    ValueError: factor is not a finite number > 1.
  """
  if not (checks.is_finite(factor) and factor > 1):
    raise ValueError(f"a fixed YaRN factor must be a finite number > 1, got {factor!r}")
  return RopeScaling(
    rope_type="yarn", factor=float(factor), original_max_position_embeddings=train_len
  )


def token_scores(model, tokens_BW, rope_scaling: Optional[RopeScaling] = None):
  """Per-token NLL and greedy match [B, T] of windows tokens [B, T + 1] (traceable; jit it);
  rope_scaling overrides the model config's (None keeps it)."""
  logits = model(tokens_BW[:, :-1], rope_scaling=rope_scaling)
  logp = jax.nn.log_softmax(logits, axis=-1)
  targets = tokens_BW[:, 1:]
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return nll, jnp.argmax(logits, axis=-1) == targets


def check_length(run, length: int) -> None:
  """Raises ValueError when `run` (a Run) cannot score `length` tokens: learned position
  embeddings have no row past their table."""
  cfg = run.model_config
  if cfg.pos_encoding == "learned" and length > cfg.max_len:
    raise ValueError(
      f"run {run.name} uses learned position embeddings for "
      f"{cfg.max_len} positions and cannot score {length} tokens; drop the "
      f"longer lengths for this run"
    )


class Scorer:
  """Teacher-forced scoring with a restored model.

  Args:
    run: from `load_run`.
    implementation: attention kernel for evaluation ("chunked" keeps memory linear in length).
    chunk_size: block length of the chunked kernel.
    max_tokens_per_batch: windows are batched up to this many tokens.
  """

  def __init__(
    self,
    run: Run,
    *,
    implementation: str = DEFAULT_KERNEL,
    chunk_size: int = 512,
    max_tokens_per_batch: int = 8192,
  ):
    self.run = run
    self.config = run.model_config.with_kernel(implementation, attention_chunk=chunk_size)
    self.max_tokens_per_batch = max_tokens_per_batch
    self.model = nn_model.build(self.config, run.params)
    self._fns = {}

  @property
  def rotary(self) -> bool:
    return self.config.pos_encoding in ROTARY_ENCODINGS

  @property
  def train_len(self) -> int:
    return self.run.train_len

  def yarn_scaling(self, length: int) -> Optional[RopeScaling]:
    """YaRN for `length` tokens: factor = length / run.train_len (None at or below it)."""
    return yarn_scaling(length, self.train_len)

  def fixed_yarn_scaling(self, factor: float) -> RopeScaling:
    """YaRN at `factor` over run.train_len, whatever the length (see `fixed_yarn_scaling`)."""
    return fixed_yarn_scaling(factor, self.train_len)

  def check_length(self, length: int) -> None:
    check_length(self.run, length)

  def _fn(self, rope_scaling: Optional[RopeScaling]):
    if rope_scaling not in self._fns:
      graphdef, state = nnx.split(self.model)

      fn = jax.jit(
        lambda state, tokens_BW: token_scores(nnx.merge(graphdef, state), tokens_BW, rope_scaling)
      )
      self._fns[rope_scaling] = (fn, state)
    return self._fns[rope_scaling]

  def token_nll(self, tokens_BW, rope_scaling: Optional[RopeScaling] = None):
    """Per-token NLL and greedy-match [B, T] for windows [B, W = T + 1] (numpy); rope_scaling
    overrides the model config's (None keeps it; a dict is parsed into a RopeScaling)."""
    rope_scaling = RopeScaling.coerce(rope_scaling)
    tokens = np.asarray(tokens_BW, np.int32)
    self.check_length(tokens.shape[1] - 1)
    fn, state = self._fn(rope_scaling)
    nll, match = fn(state, jnp.asarray(tokens))
    return np.asarray(nll, np.float64), np.asarray(match)

  def score(
    self,
    prompts: Sequence[np.ndarray],
    answers: Sequence[np.ndarray],
    rope_scaling: Optional[RopeScaling] = None,
  ) -> list[tuple[float, bool]]:
    """(mean NLL of the answer tokens given the prompt, greedy exact match) per pair.

    Pairs are right-padded to a multiple of 256 tokens (fewer recompilations; a model with
    learned positions only up to its table); causal attention makes the padding invisible to
    the scored positions.
    """
    cfg = self.config
    table = cfg.max_len if cfg.pos_encoding == "learned" else None
    out = []
    for prompt, answer in zip(prompts, answers):
      prompt, answer = np.asarray(prompt, np.int32), np.asarray(answer, np.int32)
      if answer.size == 0:
        raise ValueError("an answer has no tokens to score")
      seq = np.concatenate([prompt, answer])
      padded = -(-(seq.size - 1) // 256) * 256 + 1
      if table is not None and seq.size - 1 <= table:
        padded = min(padded, table + 1)
      window = np.full((1, padded), self.run.tokenizer.eot_id, np.int32)
      window[0, : seq.size] = seq
      nll, match = self.token_nll(window, rope_scaling)
      span = slice(prompt.size - 1, seq.size - 1)  # positions predicting the answer tokens
      out.append((float(nll[0, span].mean()), bool(match[0, span].all())))
    return out

  def score_fn(self, rope_scaling: Optional[RopeScaling] = None):
    """The (prompts, answers) -> [(nll, exact_match)] callable the task modules take."""
    return lambda prompts, answers: self.score(prompts, answers, rope_scaling)
