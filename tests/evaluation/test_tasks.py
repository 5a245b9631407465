"""rove_jax.evaluation.tasks: rove-eval's recall task on a recall-trained run (its report entry
is rove_jax.evaluation.recall's records for the run's own generator spec, validated by the
report schema and rendered as counts), and its refusal of a run trained on other data."""

from __future__ import annotations

import pytest
from flax import nnx

from rove_jax.data.tokenization import ByteTokenizer
from rove_jax.evaluation import recall, report, report_md, scoring, tasks
from rove_jax.evaluation.config import EvalConfig
from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.tasks import recall as gen
from rove_jax.train.run_config import DataConfig, RunConfig

SPEC = gen.RecallSpec(
  seq_len=32, pairs=1, queries=8, keys=4, values=16, train_docs=300, val_docs=50, task="offset"
)


def _run(name, pos_encoding, source="recall"):
  cfg = GPTConfig(
    vocab_size=320, n_layer=1, n_head=2, d_model=32, max_len=32, pos_encoding=pos_encoding
  )
  data = DataConfig(
    source=source, path=SPEC.to_string() if source == "recall" else None, seq_len=32
  )
  return scoring.Run(
    workdir="/nonexistent",
    name=name,
    step=3,
    params=nnx.state(GPT(cfg, rngs=nnx.Rngs(1)), nnx.Param),
    tokenizer=ByteTokenizer(),
    config=RunConfig(model=cfg, data=data, seed=4),
  )


def _config(**kw):
  base = dict(
    tasks=("recall",),
    lengths=(32, 64),
    yarn="both",
    seed=2,
    chunk=16,
    recall_samples=6,
    progress=False,
  )
  return EvalConfig(**{**base, **kw})


def test_recall_entry_is_the_runs_own_task_scored_on_shared_samples():
  run = _run("a", "rove")
  entry = tasks.evaluate_run(run, _config(), tasks.SUITES["quick"])
  rec = entry["recall"]
  assert entry["perplexity"] is None and entry["ruler"] is None and entry["icl"] is None
  assert rec["protocol"] == {
    "task": SPEC.to_string(),
    "samples": 6,
    "seed": 2,
    "lengths": [32, 64],
    "train_len": 32,
  }
  want = recall.evaluate(
    scoring.Scorer(run, implementation="chunked", chunk_size=16),
    recall.test_set(SPEC, [32, 64], 6, eot_id=ByteTokenizer().eot_id, seed=2),
    settings=("none", "yarn"),
  )
  assert rec["records"] == want and len(want) == 4  # none and yarn, at 1x and 2x
  full = {"schema_version": report.SCHEMA_VERSION, "suite": "quick", "runs": [entry]}
  report.validate(full)
  md = report_md.markdown(full)
  for r in want:
    cell = f"{sum(r['sample_correct'])}/6 ({r['nll']:.2f})"
    assert f"| a | {r['setting']} |" in md and cell in md


def test_recall_lengths_and_yarn_settings_follow_the_config():
  entry = tasks.evaluate_run(
    _run("b", "rope"), _config(recall_lengths=(32,), yarn="off"), tasks.SUITES["quick"]
  )
  assert [(r["setting"], r["length"]) for r in entry["recall"]["records"]] == [("none", 32)]
  nope = tasks.evaluate_run(_run("c", "nope"), _config(yarn="all"), tasks.SUITES["quick"])
  assert {r["setting"] for r in nope["recall"]["records"]} == {"none"}  # nothing to rescale


def test_the_suite_is_the_configs_unless_given():
  """No suite given: the sizes of config.suite; recall_samples unset: the suite's count."""
  config = _config(recall_samples=None, suite="full", recall_lengths=(32,), yarn="off")
  entry = tasks.evaluate_run(_run("e", "rove"), config)
  assert entry["recall"]["protocol"]["samples"] == tasks.SUITES["full"]["recall_samples"]
  assert (
    entry["recall"] == tasks.evaluate_run(_run("e", "rove"), config, tasks.SUITES["full"])["recall"]
  )


def test_a_run_trained_on_other_data_is_refused():
  with pytest.raises(ValueError, match=r"trained on the 'stdlib' source, not 'recall'"):
    tasks.evaluate_run(_run("d", "rove", source="stdlib"), _config(), tasks.SUITES["quick"])
