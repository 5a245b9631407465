"""What `train()` returns, and the end-of-run report rove-train prints from it."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Optional

import jax
import numpy as np
from flax import nnx

from rove_jax.data.tokenization import Tokenizer
from rove_jax.nn.model import generate
from rove_jax.nn.model_config import GPTConfig


@dataclasses.dataclass(frozen=True)
class TrainResult:
  """One invocation of `train()`.

  Attributes:
    workdir: the run's directory, resolved (absolute, or gs://bucket/path).
    start_step: the step it resumed from (0 for a new run).
    step: the step it ended at (a checkpoint of it is saved).
    steps_run: step - start_step.
    nonfinite_steps: steps whose update was skipped as non-finite.
    last: the last logged metrics (step, loss, lr, grad_norm, throughput).
    val_loss: the last validation loss in nats/token (None: none was computed).
    val_unigram_entropy: the validation tokens' unigram entropy, a baseline for val_loss
      (None for a masked validation loss).
    stopped_by: the signal that stopped it early ("SIGTERM", "SIGINT", "peer"), or None.
    tokenizer, model_config, params, graphdef, mesh: the trained model, ready for
      `nnx.merge(graphdef, params)` and `generate`.
  """

  workdir: str
  start_step: int
  step: int
  steps_run: int
  nonfinite_steps: int
  last: dict
  tokenizer: Tokenizer
  model_config: GPTConfig
  params: Any
  graphdef: Any
  mesh: Any
  val_loss: Optional[float] = None
  val_unigram_entropy: Optional[float] = None
  stopped_by: Optional[str] = None


def finished_already(result: TrainResult) -> bool:
  """Whether this invocation found the run at its last step and trained nothing."""
  return result.steps_run == 0 and result.stopped_by is None and result.start_step > 0


def next_step(result: TrainResult) -> str:
  """The closing line: the command that evaluates this run."""
  return (
    f"next: rove-eval --workdir {result.workdir} --tasks ppl (perplexity from 0.5x to "
    f"16x the training length, with and without YaRN; docs/evaluation.md)"
  )


def report(result: TrainResult, c, *, out=print) -> None:
  """Prints the end-of-run summary, if c.sample_tokens a generated sample, and the next step.
  A run that was finished already says that nothing was trained."""
  last = result.last or {}
  if finished_already(result):
    out(
      f"already finished at step {result.step} in {result.workdir}; nothing trained "
      f"(--config.steps={c.steps}: raise it to train further, or give a new --workdir)"
    )
    out(next_step(result))
    return
  out(
    f"done: step {result.step} in {result.workdir}"
    + (f", train loss {last['loss']:.4f}" if "loss" in last else "")
    + (f", val loss {result.val_loss:.4f} nats/token" if result.val_loss is not None else "")
    + (
      f" (a unigram model of the validation tokens: {result.val_unigram_entropy:.4f})"
      if result.val_loss is not None and result.val_unigram_entropy is not None
      else ""
    )
    + (f", {last['tokens_per_s']:.0f} tokens/s" if "tokens_per_s" in last else "")
    + (
      f"; {result.nonfinite_steps} of the {result.steps_run} steps run were skipped as "
      f"non-finite (their updates not applied)"
      if result.nonfinite_steps
      else ""
    )
  )
  if c.sample_tokens and result.params is not None and jax.process_count() == 1:
    tok = result.tokenizer
    model = nnx.merge(result.graphdef, result.params)
    prompt = tok.encode("def ")[None]
    with warnings.catch_warnings():  # a smoke check of the model, not a long-context use
      warnings.filterwarnings("ignore", message="generate: a prompt of", category=UserWarning)
      out_ids = generate(
        model,
        prompt,
        c.sample_tokens,
        temperature=0.8,
        top_k=40,
        rng=jax.random.key(c.seed),
        valid_vocab=tok.vocab_size,
      )
    out("sample:\n" + tok.decode(np.asarray(out_ids[0])))
  if jax.process_index() == 0:
    out(next_step(result))
