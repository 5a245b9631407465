"""The recall study: the MQAR generator (rove_jax.tasks.recall), its corpus source and answer-only
loss mask, the evaluation (rove_jax.evaluation.recall) against hand-computed scores, and the
driver (study.retrieval): its plan, its checks and a --quick study end to end."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rove_jax.data import Corpus, iter_documents, prepare
from rove_jax.data.tokenization import ByteTokenizer
from rove_jax.evaluation import recall, scoring
from rove_jax.nn.model import GPT, GPTConfig
from rove_jax.tasks import recall as gen
from rove_jax.train import overrides, program
from rove_jax.train.run_config import DataConfig, RunConfig
from study import retrieval as recall_study
from study.configs import retrieval as recall_config

SPEC = gen.RecallSpec(seq_len=32, pairs=4, queries=8, train_docs=300, val_docs=50, seed=3)
EOT = 256


def _records(context, spec=SPEC):
  """{key token: record token} of a context (checking that no key has two records)."""
  records = [int(t) for t in context if chr(t) in gen.RECORD_CHARS]
  out = {ord(gen.KEY_CHARS[gen.RECORD_CHARS.index(chr(r)) // spec.values]): r for r in records}
  assert len(out) == len(records)
  return out


def test_spec_parses_round_trips_and_names_bad_fields():
  assert gen.RecallSpec.parse(SPEC.to_string()) == SPEC
  assert gen.RecallSpec.parse(None) == gen.RecallSpec()
  for bad, match in (
    ("pairs=x", "pairs must be an int"),
    ("pears=3", "NAME=INT"),
    ("pairs=7", "as many distinct keys"),
    ("seq_len=16", "too short"),
    ("keys=11", "keys must be <= 10"),
    ("keys=7,values=8", "keys \\* values"),
    ("values=1", "values must be >= 2"),
    ("answer_loss=2", "answer_loss must be 0 or 1"),
  ):
    with pytest.raises(ValueError, match=match):
      gen.RecallSpec.parse(bad)
  with pytest.raises(ValueError, match="val_path and max_files"):
    Corpus("recall", path=SPEC.to_string(), max_files=2)


def test_training_documents_answer_every_query_and_are_deterministic():
  docs = gen.training_tokens(SPEC, "train")
  assert docs.shape == (SPEC.train_docs, SPEC.seq_len - 1)
  C = SPEC.context_len
  for doc in docs[:50]:
    records = _records(doc[:C])
    assert len(records) == SPEC.pairs  # distinct keys, each once
    queries = doc[C:].reshape(SPEC.queries, 2)
    assert [records[int(k)] for k, _ in queries] == queries[:, 1].tolist()  # the answers
    assert sum(chr(t) in gen.FILLER_CHARS for t in doc[:C]) == C - SPEC.pairs
  keys = docs[:, C::2].ravel()
  assert set(np.unique(keys)) == set(gen.key_ids(SPEC))  # queries use every key
  np.testing.assert_array_equal(docs, gen.training_tokens(SPEC, "train"))
  np.testing.assert_array_equal(docs[120:130], gen.training_tokens(SPEC, "train", 10, 120))
  other = gen.training_tokens(gen.RecallSpec(**{**SPEC.__dict__, "seed": 4}), "train")
  assert not np.array_equal(docs, other)
  assert not np.array_equal(docs[:50], gen.training_tokens(SPEC, "val")[:50])


def test_corpus_stream_puts_each_document_in_one_window_after_an_eot():
  corpus = Corpus("recall", path=SPEC.to_string())
  tok = ByteTokenizer()
  stream = np.concatenate(
    [np.append(tok.encode(d), tok.eot_id) for d in iter_documents(corpus, "train")]
  )
  T = SPEC.seq_len
  assert stream.size == SPEC.train_docs * T + 1  # the first document has one extra token
  windows = stream[: (stream.size - 1) // T * T].reshape(-1, T)
  assert (windows[1:, 0] == tok.eot_id).all()  # window i >= 1: [eot] + document i
  np.testing.assert_array_equal(windows[1:, 1:], gen.training_tokens(SPEC, "train")[1:])
  with pytest.raises(ValueError, match="made for seq_len=32"):
    overrides.apply(recall_config.get_config(), {"data.seq_len": 16})


def test_test_samples_exact_lengths_answers_and_growing_distances():
  n = 12
  by_len = {L: gen.test_samples(SPEC, L, n, eot_id=EOT, seed=1) for L in (32, 64, 128)}
  for L, s in by_len.items():
    assert s.tokens.shape == (n, L) and (s.tokens[:, 0] == EOT).all()
    a = s.answer_index
    assert a == L - 2 * SPEC.queries + 1
    for row, dist in zip(s.tokens, s.distance):
      records = _records(row[1 : L - 2 * SPEC.queries])  # the context
      assert len(records) == SPEC.pairs
      assert row[a] == records[int(row[a - 1])]  # the answer: the queried key's record
      assert row[a - 1 - dist] == row[a]  # the distance leads from the key to the record
    # the target's depth: (i + 0.5) / n of the context, so the distance falls with i
    C = L - 1 - 2 * SPEC.queries
    np.testing.assert_array_equal(s.distance, C - np.round(s.depth * (C - 1)).astype(int))
    np.testing.assert_allclose(s.depth, (np.arange(n) + 0.5) / n)
  for short, long in ((32, 64), (64, 128)):
    assert (by_len[long].distance > by_len[short].distance).all()
  again = gen.test_samples(SPEC, 64, n, eot_id=EOT, seed=1)
  np.testing.assert_array_equal(again.tokens, by_len[64].tokens)
  assert not np.array_equal(gen.test_samples(SPEC, 64, n, eot_id=EOT, seed=2).tokens, again.tokens)


def _scorer(pos_encoding):
  cfg = GPTConfig(
    vocab_size=320, n_layer=1, n_head=2, d_model=32, max_len=32, pos_encoding=pos_encoding
  )
  params = nnx.state(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  data = DataConfig(source="recall", path=SPEC.to_string(), seq_len=32)
  run = scoring.Run(
    workdir="/nonexistent",
    name=f"tiny-{pos_encoding}",
    step=0,
    params=params,
    tokenizer=ByteTokenizer(),
    config=RunConfig(model=cfg, data=data, seed=7),
  )
  return scoring.Scorer(run)


def test_evaluate_records_match_the_scorer_on_a_tiny_model():
  scorer = _scorer("rove")
  spec = recall.run_spec(scorer.run)
  samples = recall.test_set(spec, [32, 64], 5, eot_id=EOT)
  records = recall.evaluate(scorer, samples)
  assert [(r["setting"], r["length"]) for r in records] == [
    (s, L) for s in recall.SETTINGS for L in (32, 64)
  ]
  for r in records:
    assert r["encoding"] == "rove" and r["seed"] == 7 and r["n"] == 5
    assert r["accuracy"] == np.mean(r["sample_correct"])
    assert r["nll"] == pytest.approx(np.mean(r["sample_nll"]), rel=1e-5)
  by = {(r["setting"], r["length"]): r for r in records}
  assert by["yarn", 32]["sample_nll"] == by["none", 32]["sample_nll"]  # no YaRN at 1x
  assert by["yarn_fixed", 32]["rope_scaling"]["factor"] == 2.0  # the longest length / 32
  s = samples[64]
  a = s.answer_index
  for setting in ("none", "yarn"):
    scaling = by[setting, 64]["rope_scaling"]
    ((nll, match),) = scorer.score([s.tokens[1, :a]], [s.tokens[1, a : a + 1]], scaling)
    assert by[setting, 64]["sample_nll"][1] == pytest.approx(nll, rel=1e-4, abs=1e-5)
    assert by[setting, 64]["sample_correct"][1] == int(match)
  assert by["yarn", 64]["sample_nll"] != by["none", 64]["sample_nll"]
  nope = recall.evaluate(_scorer("nope"), {32: samples[32]})
  assert {r["setting"] for r in nope} == {"none"}
  assert "rove" in recall.summary_table(records + nope)


def test_study_plan_and_comparisons(tmp_path):
  args = recall_study.parse_args(
    [
      "--out",
      str(tmp_path),
      "--runs-dir",
      str(tmp_path / "r"),
      "--seeds",
      "0,1",
      "--encodings",
      "rove,nope",
      "--quick",
    ]
  )
  runs = recall_study.plan(args)
  assert [(r["encoding"], r["seed"]) for r in runs] == [
    ("rove", 0),
    ("rove", 1),
    ("nope", 0),
    ("nope", 1),
  ]
  assert args.multiple_list == [1, 2] and args.samples == 8
  assert "--config.model.pos_encoding=nope" in runs[2]["overrides"]
  with pytest.raises(SystemExit):
    recall_study.parse_args(["--out", "x", "--runs-dir", "y", "--encodings", "bogus"])
  rec = lambda enc, seed, correct: {
    "encoding": enc,
    "seed": seed,
    "setting": "none",
    "length": 32,
    "sample_correct": correct,
    "sample_nll": [1.0 - c for c in correct],
  }
  records = [
    rec("rove", 0, [1, 1, 1, 0]),
    rec("rove", 1, [1, 1, 0, 1]),
    rec("nope", 0, [0, 0, 1, 0]),
    rec("nope", 1, [0, 1, 0, 0]),
  ]
  (row,) = recall_study.comparisons(records)
  assert (row["a"], row["b"]) == ("rove", "nope")
  assert row["accuracy"]["difference"] == pytest.approx(0.75 - 0.25)
  assert row["nll"]["difference"] == pytest.approx(-0.5)
  # the seed-level tests over the 2 seed pairs (each pair's difference 0.5: no spread)
  assert row["accuracy"]["t"]["n"] == 2 and row["accuracy"]["t"]["mean"] == pytest.approx(0.5)
  assert row["accuracy"]["sign_flip"]["p"] == 0.5  # both signs the same: 2 of 4 sign vectors


def test_loss_mask_marks_exactly_the_query_values(tmp_path):
  data = prepare(Corpus("recall", path=SPEC.to_string()), "bytes", workdir=str(tmp_path))
  mask = gen.loss_mask(SPEC)
  np.testing.assert_array_equal(data.loss_mask_T, mask)
  C, Q = SPEC.context_len, SPEC.queries
  assert np.flatnonzero(mask).tolist() == list(range(C + 1, C + 2 * Q, 2))
  (batch,) = data.eval_batches(seq_len=SPEC.seq_len, batch_size=16, max_batches=1)
  assert (batch["loss_mask"] == mask).all()
  for inputs, targets in zip(batch["inputs"], batch["targets"]):
    records = _records(inputs[1 : C + 1])  # the document's context
    answers = targets[mask == 1]
    assert answers.tolist() == [records[int(k)] for k in inputs[mask == 1]]  # key in, record out
    assert all(chr(t) in gen.KEY_CHARS for t in inputs[mask == 1])
  no_mask = gen.RecallSpec(**{**SPEC.__dict__, "answer_loss": 0})
  assert gen.loss_mask(no_mask) is None
  assert "loss_mask" not in next(
    iter(
      prepare(
        Corpus("recall", path=no_mask.to_string()), "bytes", workdir=str(tmp_path / "all")
      ).eval_batches(seq_len=32, batch_size=4)
    )
  )


def test_masked_training_loss_is_the_mean_nll_of_the_answers():
  cfg = GPTConfig(vocab_size=320, n_layer=1, n_head=2, d_model=32, max_len=32)
  graphdef, params = nnx.split(GPT(cfg, rngs=nnx.Rngs(0)), nnx.Param)
  docs = gen.training_tokens(SPEC, "train", 4)
  windows = np.concatenate([np.full((4, 1), EOT), docs, np.full((4, 1), EOT)], axis=1)
  mask = gen.loss_mask(SPEC)
  batch = {
    "inputs": windows[:, :-1],
    "targets": windows[:, 1:],
    "loss_mask": np.repeat(mask[None], 4, axis=0),
  }
  logits = np.asarray(nnx.merge(graphdef, params)(jnp.asarray(batch["inputs"])), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, batch["targets"][..., None], axis=-1)[..., 0]
  want = nll[:, mask == 1].mean()  # 4 rows x 8 answers
  got = float(program._batch_loss(graphdef, params, jax.tree.map(jnp.asarray, batch)))
  assert got == pytest.approx(want, rel=1e-5)
  del batch["loss_mask"]
  assert float(program._batch_loss(graphdef, params, batch)) == pytest.approx(nll.mean(), rel=1e-5)


def test_evaluator_scores_the_answer_position_of_a_hand_made_model(monkeypatch):
  """A fake model whose logits at position t are 3 on guess[token t] and 0 elsewhere: it
  answers key k with the record (k, value 0); right when that is the key's record."""
  V = 320
  spec = gen.RecallSpec(seq_len=32, pairs=4, queries=8, keys=6, values=2)  # half right
  guess = np.arange(V)
  guess[gen.key_ids(spec)] = gen.record_ids(spec)[:, 0]

  def fake(tokens_BT, **kw):
    return 3.0 * jax.nn.one_hot(jnp.asarray(guess)[tokens_BT], V)

  monkeypatch.setattr(
    recall,
    "_scores_fn",
    lambda config, scaling: jax.jit(
      lambda params, tokens_BW: scoring.token_scores(fake, tokens_BW)
    ),
  )
  scorer = _scorer("nope")
  scorer.max_tokens_per_batch = 3 * 64  # batches of 3 rows, the last one padded
  samples = recall.test_set(spec, [32, 64], 10, eot_id=EOT)
  records = recall.evaluate(scorer, samples)
  assert [(r["setting"], r["length"]) for r in records] == [("none", 32), ("none", 64)]
  hit = math.log(math.exp(3.0) + V - 1) - 3.0  # NLL of the predicted token
  miss = math.log(math.exp(3.0) + V - 1)
  for r in records:
    s = samples[r["length"]]
    key, value = s.tokens[:, s.answer_index - 1], s.tokens[:, s.answer_index]
    right = (value == guess[key]).astype(int)
    assert 0 < right.sum() < len(right)
    assert r["sample_correct"] == right.tolist()
    np.testing.assert_allclose(r["sample_nll"], np.where(right, hit, miss), rtol=1e-5)
    assert r["accuracy"] == right.mean()
    assert r["nll"] == pytest.approx(np.mean(np.where(right, hit, miss)), rel=1e-5)


def test_study_rejects_a_bad_spec_before_training(tmp_path, capsys):
  for spec, message in (
    ("pairs=9", "as many distinct keys"),
    ("seq_len=64", "made for seq_len=64"),
    ("pairs=4,bogus=1", "NAME=INT"),
  ):
    with pytest.raises(SystemExit, match=message):
      recall_study.main(
        ["--out", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs"), "--data", spec]
      )
    assert not (tmp_path / "runs").exists()


def test_quick_study_end_to_end(tmp_path):
  out, runs = tmp_path / "out", tmp_path / "runs"
  argv = [
    "--out",
    str(out),
    "--runs-dir",
    str(runs),
    "--seeds",
    "0",
    "--encodings",
    "rove,nope",
    "--quick",
  ]
  assert recall_study.main(argv) == 0
  result = json.loads((out / "recall.json").read_text())
  assert result["train_len"] == 32 and result["lengths"] == [32, 64] and result["quick"]
  cells = {(r["encoding"], r["setting"], r["length"]) for r in result["records"]}
  assert cells == {("rove", s, L) for s in recall.SETTINGS for L in (32, 64)} | {
    ("nope", "none", 32),
    ("nope", "none", 64),
  }
  assert all(r["n"] == 8 == len(r["sample_correct"]) for r in result["records"])
  assert {(c["setting"], c["length"]) for c in result["comparisons"]} == {
    ("none", 32),
    ("none", 64),
  }
  assert [r["step"] for r in result["runs"]] == [4, 4]
  assert all(len(d) == 8 for d in result["sample_distance"].values())
  mtime = (runs / "rove-s0" / recall_study.DONE).stat().st_mtime
  assert recall_study.main(argv) == 0  # a rerun keeps the finished runs
  assert (runs / "rove-s0" / recall_study.DONE).stat().st_mtime == mtime
