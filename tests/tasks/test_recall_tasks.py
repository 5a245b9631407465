"""The position-dependent recall tasks (rove_jax.tasks.recall_tasks): every answer checked by an
independent solver that reads the document as text, the test samples' layout (depth, distance,
the scored key written twice), determinism and the spec's errors."""

import numpy as np
import pytest

from rove_jax.data import Corpus, iter_documents
from rove_jax.tasks import recall as gen
from rove_jax.tasks import recall_tasks as tasks

LASTWRITE = gen.RecallSpec(
  seq_len=32,
  pairs=8,
  queries=6,
  keys=4,
  values=8,
  train_docs=1200,
  val_docs=50,
  seed=5,
  task="lastwrite",
)
OFFSET = gen.RecallSpec(
  seq_len=32,
  pairs=1,
  queries=6,
  keys=4,
  values=16,
  train_docs=1200,
  val_docs=50,
  seed=5,
  task="offset",
)
EOT = 256


def _solve_lastwrite(context: str, key: str, spec=LASTWRITE) -> str:
  """The record of the key's last write, by a left-to-right scan of the text."""
  last = None
  for ch in context:
    if ch in gen.RECORD_CHARS and gen.KEY_CHARS[gen.RECORD_CHARS.index(ch) // spec.values] == key:
      last = ch
  return last


def _writes(context: str, key: str, spec=LASTWRITE) -> list[int]:
  return [
    i
    for i, ch in enumerate(context)
    if ch in gen.RECORD_CHARS and gen.KEY_CHARS[gen.RECORD_CHARS.index(ch) // spec.values] == key
  ]


def _text(row) -> str:
  return np.asarray(row, np.uint8).tobytes().decode("ascii")


def test_specs_parse_round_trip_and_name_bad_task_settings():
  for spec in (LASTWRITE, OFFSET):
    assert gen.RecallSpec.parse(spec.to_string()) == spec
  assert gen.RecallSpec.parse("pairs=4").task == "mqar"
  for bad, match in (
    ("task=nope", "task must be one of"),
    ("task=offset,pairs=2", "pairs=1"),
    ("task=offset,pairs=1,keys=10", "keys must be <= 9"),
    ("task=lastwrite,pairs=1,keys=4", "pairs >= 2"),
    ("task=lastwrite,pairs=3,keys=1", "keys >= 2"),
    ("task=offset,pairs=1,keys=8,seq_len=24", "too short for a marker"),
    ("task=offset,pairs=1,values=53", "values\\) <= 52"),
  ):
    with pytest.raises(ValueError, match=match):
      gen.RecallSpec.parse(bad)
  # lastwrite: more writes than keys is the point; offset: a value alphabet beyond keys x values
  assert gen.RecallSpec.parse("task=lastwrite,pairs=8,keys=4,values=8").pairs == 8
  assert gen.RecallSpec.parse("task=offset,pairs=1,keys=6,values=40").values == 40


def test_lastwrite_documents_answer_the_last_write_and_overwrite_with_a_new_value():
  docs = gen.training_tokens(LASTWRITE, "train")
  C = LASTWRITE.context_len
  assert docs.shape == (LASTWRITE.train_docs, LASTWRITE.seq_len - 1)
  ambiguous = 0
  for row in docs[:300]:
    text = _text(row)
    context, queries = text[:C], text[C:]
    assert sum(ch in gen.RECORD_CHARS for ch in context) == LASTWRITE.pairs
    for key, answer in zip(queries[::2], queries[1::2]):
      assert answer == _solve_lastwrite(context, key)
      writes = _writes(context, key)
      values = [context[i] for i in writes]
      assert all(a != b for a, b in zip(values, values[1:]))  # a rewrite changes the value
      ambiguous += len(writes) > 1
  # most queries need order (8 writes over 4 keys): not a degenerate generator
  assert ambiguous > 0.5 * 300 * LASTWRITE.queries
  np.testing.assert_array_equal(
    gen.training_tokens(LASTWRITE, "train", 10, start=995), docs[995:1005]
  )


def test_offset_documents_answer_the_token_k_after_the_one_marker():
  docs = gen.training_tokens(OFFSET, "train")
  C = OFFSET.context_len
  offsets = []
  for row in docs[:300]:
    text = _text(row)
    context, queries = text[:C], text[C:]
    assert context.count(tasks.MARKER) == 1
    assert set(context) - {tasks.MARKER} <= set(gen.RECORD_CHARS[: OFFSET.values])
    m = context.index(tasks.MARKER)
    for k, answer in zip(queries[::2], queries[1::2]):
      assert 1 <= int(k) <= OFFSET.keys and answer == context[m + int(k)]
      offsets.append(int(k))
  assert set(offsets) == set(range(1, OFFSET.keys + 1))


@pytest.mark.parametrize("spec", [LASTWRITE, OFFSET], ids=lambda s: s.task)
def test_test_samples_put_the_answer_at_its_depth_and_distance(spec):
  n = 10
  by_len = {L: gen.test_samples(spec, L, n, eot_id=EOT, seed=2) for L in (32, 128)}
  for L, s in by_len.items():
    assert s.tokens.shape == (n, L) and (s.tokens[:, 0] == EOT).all()
    a = s.answer_index
    assert a == L - 2 * spec.queries + 1
    C = L - 1 - 2 * spec.queries
    for row, dist, depth in zip(s.tokens, s.distance, s.depth):
      context, key, answer = _text(row[1 : C + 1]), chr(row[a - 1]), chr(row[a])
      pos = C - dist  # the answer's context position (the key is at context index C)
      assert context[pos] == answer
      if spec.task == "lastwrite":
        assert answer == _solve_lastwrite(context, key)
        writes = _writes(context, key)
        assert len(writes) == 2 and writes[1] == pos  # written twice, the answer is the later
        assert pos == 1 + round(depth * (C - 2))
      else:
        m = context.index(tasks.MARKER)
        assert context.count(tasks.MARKER) == 1 and pos == m + int(key)
        assert m == round(depth * (C - 1 - spec.keys))
  assert (by_len[128].distance > by_len[32].distance).all()
  again = gen.test_samples(spec, 128, n, eot_id=EOT, seed=2)
  np.testing.assert_array_equal(again.tokens, by_len[128].tokens)


def test_corpus_source_streams_the_task_documents():
  corpus = Corpus("recall", path=OFFSET.to_string())
  first = next(iter(iter_documents(corpus, "train")))
  assert first[1:] == _text(gen.training_tokens(OFFSET, "train", 1)[0])
  assert tasks.MARKER in first


def test_the_demos_mechanism_trains_the_offset_task_and_scores_it():
  """make demo's mechanism (the packaged recall_offset config, trained per encoding and seed,
  then rove-eval --tasks recall) is the offset task at 32 tokens, scored at 1x and 4x."""
  import pathlib
  import subprocess

  from rove_jax.cli import eval as eval_cli
  from rove_jax.train import overrides

  root = pathlib.Path(__file__).resolve().parents[2]
  c = overrides.load_file(str(root / "rove_jax" / "train" / "configs" / "recall_offset.py"))
  spec = gen.RecallSpec.parse(c.data.path)
  assert (spec.task, spec.seq_len, c.data.seq_len, c.steps) == ("offset", 32, 32, 300)
  recipe = subprocess.run(
    ["make", "-n", "demo"], cwd=root, capture_output=True, text=True, check=True
  ).stdout.splitlines()
  trains = [line for line in recipe if "--config recall_offset" in line]
  assert len(trains) == 4 and all(
    f"--config.model.pos_encoding={e}" in t and f"--config.seed={s}" in t and f"/{e}-s{s} " in t
    for t, (s, e) in zip(trains, [(0, "rove"), (0, "rope"), (1, "rove"), (1, "rope")])
  )
  [ev] = [line for line in recipe if "--tasks recall" in line]
  args = eval_cli.parse_args(ev.split("/rove-eval ")[1].split())
  assert args.task_list == ["recall"] and args.recall_lengths == [32, 128]
  assert len(args.compare) == 3 and args.recall_samples == 100
