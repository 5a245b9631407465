"""Evaluation takes the training length from one place (Run.train_len = data.seq_len): the
lengths, the YaRN factors and the report's labels, also when model.max_len is larger."""

import math

import numpy as np
import pytest
from flax import nnx

from rove_jax.data import tokenization
from rove_jax.evaluation import perplexity, report, report_md, scoring
from rove_jax.evaluation import tasks as eval_tasks
from rove_jax.evaluation.config import EvalConfig
from rove_jax.nn.model import GPT
from rove_jax.train.run_config import DataConfig, RunConfig
from tests.conftest import gpt_config

SEQ_LEN, MAX_LEN = 128, 256  # trained on 128 tokens, positions set up for 256


@pytest.fixture(scope="module")
def short_run():
  """A random-weight run whose config says: trained on SEQ_LEN tokens, max_len = 2 SEQ_LEN."""
  cfg = gpt_config(max_len=MAX_LEN)
  params = nnx.state(GPT(cfg, rngs=nnx.Rngs(1)), nnx.Param)
  tokens = np.random.default_rng(0).integers(0, 257, 3000).astype(np.int32)
  return scoring.Run(
    workdir="/nonexistent",
    name="short",
    step=0,
    config=RunConfig(model=cfg, data=DataConfig(seq_len=SEQ_LEN)),
    params=params,
    tokenizer=tokenization.get_tokenizer("bytes"),
    _val_tokens=tokens,
  )


def test_yarn_factor_is_the_length_over_the_trained_length(short_run):
  run = short_run
  scorer = scoring.Scorer(run, chunk_size=64)
  assert run.train_len == scorer.train_len == SEQ_LEN
  assert scorer.yarn_scaling(SEQ_LEN) is None
  for length in (2 * SEQ_LEN, 4 * SEQ_LEN):  # 2x is past training even though max_len = 2x
    assert scorer.yarn_scaling(length).to_dict() == {
      "rope_type": "yarn",
      "factor": length / SEQ_LEN,
      "original_max_position_embeddings": SEQ_LEN,
    }


def test_eval_lengths_yarn_and_labels_all_use_the_trained_length(short_run):
  run = short_run
  config = EvalConfig(progress=False, chunk=64, tasks=("ppl",), yarn="both")
  suite = {"multiples": (1, 2), "ppl_tokens": 512}
  result = eval_tasks.evaluate_run(run, config, suite)
  ppl = result["perplexity"]
  assert set(ppl["none"]) == set(ppl["yarn"]) == {str(SEQ_LEN), str(2 * SEQ_LEN)}
  assert ppl["protocol"]["train_len"] == SEQ_LEN
  assert result["model"]["train_len"] == SEQ_LEN and result["model"]["max_len"] == MAX_LEN
  # at 2x, YaRN with factor 2 over the trained 128 (not the identity of "2x = max_len")
  L = 2 * SEQ_LEN
  scorer = scoring.Scorer(run, chunk_size=64)
  wins, first = perplexity.windows(run.val_tokens(), L, max_targets=512)
  by_hand = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": SEQ_LEN}
  nll = scorer.token_nll(wins, by_hand)[0]
  mask = np.arange(L)[None, :] >= first[:, None]
  want = float((nll * mask).sum() / mask.sum())
  np.testing.assert_allclose(ppl["yarn"][str(L)]["loss"], want, rtol=1e-6)
  assert abs(ppl["yarn"][str(L)]["loss"] - ppl["none"][str(L)]["loss"]) > 1e-4
  np.testing.assert_allclose(
    ppl["yarn"][str(SEQ_LEN)]["loss"], ppl["none"][str(SEQ_LEN)]["loss"], rtol=1e-6
  )
  # the report labels the run with the trained length
  rep = {
    "schema_version": report.SCHEMA_VERSION,
    "suite": "quick",
    "runs": [{**result, "ruler": None, "icl": None}],
  }
  report.validate(rep)
  md = report_md.markdown(rep)
  assert f"| short | rove | {result['model']['params'] / 1e6:.1f}M | 0 | {SEQ_LEN} |" in md
  assert f"YaRN factor = L / {SEQ_LEN}" in md
  assert math.isfinite(ppl["yarn"][str(L)]["ppl"])
