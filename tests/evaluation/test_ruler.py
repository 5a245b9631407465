"""RULER tasks: sizes within 2% under two tokenizations, determinism, needles and answers where
the templates put them, consistent vt chains, true top words for cwe/fwe, evaluate() aggregates,
SQuAD/HotpotQA files, and the error messages."""

import collections
import json
import re

import chex
import numpy as np
import pytest

from rove_jax.evaluation import prompting
from rove_jax.evaluation.ruler import suite as ruler
from tests.reference import ByteTok, WordTok

ESSAYS = [
  "When I was young I thought the best way to learn a craft was to read about it. Later I "
  "found that reading only helps once you have tried and failed a few times. The failures "
  "give the words something to attach to. Without them, advice slides off like rain from a "
  "window. So the order matters: first make something bad, then read, then make it again.",
  "Cities grow along rivers for a simple reason. Water moves goods more cheaply than any road "
  "could before railways. A town at a crossing point collects traders, and traders attract "
  "craftsmen. Over centuries the crossing becomes a bridge, and the bridge becomes the centre "
  "of a city that no longer remembers why it is there.",
  "Good tools disappear while you use them. You notice a hammer only when its head is loose. "
  "The same holds for programming languages, which is why arguments about them are so heated. "
  "People defend the tool that has become invisible to them. Is that irrational? Not entirely, "
  "since learning a new tool costs real time!",
]
NOISE = " ".join(prompting.NOISE_SENTENCES)
# Tasks whose fixed parts need more than 512 bytes; they are checked from 1024 bytes.
LONG_MIN = {"niah_multikey_1", "niah_multivalue", "niah_multiquery", "cwe", "fwe"}
KIND = {t: "uuid" if t in ("niah_single_3", "niah_multikey_3") else "number" for t in ruler.TASKS}
NEEDLE = re.compile(r"One of the special magic (?:number|uuid)s for (\S+) is: (\S+)\.")


def gen(task, length, tok, seed=7, **kw):
  return ruler.generate(task, length=length, tokenizer=tok, seed=seed, haystack_texts=ESSAYS, **kw)


def split_prompt(text, first_line_end="\n"):
  """(instruction line, context, question line, answer prefix)."""
  head, rest = text.split(first_line_end, 1)
  context, tail = rest.rsplit("\n", 1)
  question, prefix = tail.split(" Answer: ")
  return head, context, question, prefix


# ------------------------------------------------------------------------------- per-task checks


def check_niah(task, text, s):
  kind = KIND[task]
  head, context, question, prefix = split_prompt(text)
  assert head == (
    f"Some special magic {kind}s are hidden within the following text. Make sure "
    f"to memorize it. I will quiz you about the {kind}s afterwards."
  )
  keys, needles = s.meta["keys"], s.meta["needles"]
  for k, v in needles:
    assert context.count(f"One of the special magic {kind}s for {k} is: {v}.") == 1
  for k in keys:
    assert k in question and k in prefix
  gold = {k: [v for kk, v in needles if kk == k] for k in keys}
  if task == "niah_multiquery":
    assert len(keys) == 4 and s.answers == [gold[k][0] for k in keys]
    assert question.startswith("What are all") and prefix.endswith("are")
  elif task == "niah_multivalue":
    assert len(needles) == 4 and {k for k, _ in needles} == set(keys)
    # Values in the order they appear in the context.
    assert s.answers == sorted(gold[keys[0]], key=context.index)
    assert prefix.endswith("are")
  else:
    assert len(keys) == 1 and s.answers == gold[keys[0]] and prefix.endswith("is")
    assert question == (
      f"What is the special magic {kind} for {keys[0]} mentioned in the provided text?"
    )
  for a in s.answers:
    assert a in context
  if task == "niah_multikey_1":
    assert len({k for k, _ in needles}) == 4
  if task in ("niah_multikey_2", "niah_multikey_3"):
    # Made only of needles: every whole line is one, keys never repeat; the last line may be
    # the truncated end of one.
    lines = context.split("\n")
    found = [NEEDLE.fullmatch(line) for line in lines]
    assert all(found[:-1])
    keys_seen = [m.group(1) for m in found if m]
    assert len(keys_seen) == len(set(keys_seen)) >= 1
    if not found[-1]:
      assert lines[-1] and "One of the special magic".startswith(lines[-1][:24])
    if kind == "uuid":
      assert re.fullmatch(
        r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", keys[0]
      )
  else:
    plain = " ".join(NEEDLE.sub(" ", context).split())
    if task == "niah_single_1":
      assert ((NOISE + " ") * (len(plain) // len(NOISE) + 2)).startswith(plain)
    else:
      stream = " ".join(" ".join(e.split()) for e in ESSAYS)
      assert plain in (stream + " ") * (len(plain) // len(stream) + 3)
  assert all(re.fullmatch(r"\d{7}" if kind == "number" else r"[0-9a-f-]{36}", a) for a in s.answers)


def check_vt(text, s):
  assert text.startswith(
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
  )
  _, context, question, prefix = split_prompt(text, "\n\n")
  value = s.meta["value"]
  assert question == (
    f"Question: Find all variables that are assigned the value {value} in the text above."
  )
  assert prefix.endswith(f"5 variables are assigned the value {value}, they are:")
  holds = {}  # variable -> value, resolved in reading order
  lines = context.split("\n")
  for i, line in enumerate(lines):
    m = re.fullmatch(r"VAR ([A-Z]{5}) = (?:VAR ([A-Z]{5})|(\d{5}))", line)
    if m:
      name, source, number = m.groups()
      # An assignment only copies a variable that was assigned above it.
      holds[name] = number if number else holds[source]
    else:
      assert line == NOISE or (i == len(lines) - 1 and NOISE.startswith(line))
  assert [v for v in holds if holds[v] == value] == s.answers
  assert len(s.answers) == 5 and s.meta["answer_text"] == " " + " ".join(s.answers)


def check_cwe(text, s):
  head, context, question, prefix = split_prompt(text)
  assert question == "Question: What are the 10 most common words in the above list?"
  entries = re.findall(r"(\d+)\. (\S+)", context)
  assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
  words = [w for _, w in entries]
  counts = collections.Counter(words)
  assert len(s.answers) == 10
  top = min(counts[a] for a in s.answers)
  rest = max(c for w, c in counts.items() if w not in s.answers)
  assert top == s.meta["freq_common"] > rest == s.meta["freq_rare"]
  assert s.answers == sorted(s.answers, key=words.index)  # order of first appearance


def check_fwe(text, s):
  body, tail = text.split("\nQuestion: ")
  words = body.split("coded words. ", 1)[1].split(" ")
  counts = collections.Counter(words)
  assert counts.most_common(1)[0][0] == "...."
  del counts["...."]
  ranked = counts.most_common()
  assert [w for w, _ in ranked[:3]] == s.answers
  assert ranked[0][1] > ranked[1][1] > ranked[2][1] > ranked[3][1]
  assert [c for _, c in ranked[:3]] == s.meta["answer_counts"]
  assert all(re.fullmatch(r"[a-z]{6}", w) for w in counts)


def check_content(task, text, s):
  if task.startswith("niah"):
    check_niah(task, text, s)
  else:
    {"vt": check_vt, "cwe": check_cwe, "fwe": check_fwe}[task](text, s)


@pytest.mark.parametrize("tok_name", ["bytes", "words"])
@pytest.mark.parametrize("task", ruler.TASKS)
def test_task_size_determinism_and_content(task, tok_name):
  tok = ByteTok() if tok_name == "bytes" else WordTok()
  smallest = 1024 if tok_name == "bytes" and task in LONG_MIN else 512
  for length in (smallest, 2048, 4096):
    s = gen(task, length, tok)
    total = s.prompt_ids.size + s.answer_ids.size
    assert 0.98 * length <= total <= length, (task, length, total)
    assert s.meta["tokens"] == total and s.length == length and s.task == task
    chex.assert_type([s.prompt_ids, s.answer_ids], np.int32)
    chex.assert_rank([s.prompt_ids, s.answer_ids], 1)
    assert s.prompt_ids[0] == tok.eot_id and tok.eot_id not in s.prompt_ids[1:]
    again = gen(task, length, tok)
    chex.assert_trees_all_equal((again.prompt_ids, again.answer_ids), (s.prompt_ids, s.answer_ids))
    other = gen(task, length, tok, seed=8)
    assert other.prompt_ids.shape != s.prompt_ids.shape or not np.array_equal(
      other.prompt_ids, s.prompt_ids
    )
    assert other.answers != s.answers
    # The answer decodes to the gold text, which starts with the space after the prefix.
    answer = tok.decode(s.answer_ids)
    assert answer == s.meta["answer_text"] and answer.startswith(" ")
    assert answer[1:].split(" " if task == "vt" else ", ") == s.answers
    text = tok.decode(s.prompt_ids)
    assert not text.endswith(" ")
    check_content(task, text, s)
    if tok_name == "words":  # lengths count the tokenizer's tokens, not characters
      assert len(text) > 1.5 * length


@pytest.mark.parametrize("task", sorted(LONG_MIN))
def test_too_short_names_task_and_exact_minimum(task):
  with pytest.raises(ValueError, match=rf"too short for task '{task}'.*length >= \d+") as e:
    gen(task, 512, ByteTok())
  minimum = int(re.search(r"length >= (\d+)", str(e.value)).group(1))
  assert minimum > 512
  s = gen(task, minimum, ByteTok())  # the stated minimum is enough
  assert s.prompt_ids.size + s.answer_ids.size == minimum


def test_needle_depth_follows_the_drawn_depth():
  tok = ByteTok()
  depths = []
  for seed in range(12):
    s = gen("niah_single_2", 4096, tok, seed=seed)
    _, context, _, _ = split_prompt(tok.decode(s.prompt_ids))
    k, v = s.meta["needles"][0]
    where = context.index(f"for {k} is: {v}.") / len(context)
    assert abs(where - s.meta["depths"][0]) < 0.08, (seed, where, s.meta["depths"])
    depths.append(where)
  assert min(depths) < 0.3 and max(depths) > 0.7  # spread over the haystack, not one spot


def test_cwe_uses_ruler_long_frequencies_from_4096_tokens():
  tok = WordTok()
  assert gen("cwe", 4096, tok).meta["freq_common"] == 30
  assert gen("cwe", 2048, tok).meta["freq_common"] == 6


# ------------------------------------------------------------------------------- evaluate


def test_evaluate_aggregates_hand_checkable_numbers():
  tok = ByteTok()
  batches = []

  def score(prompts, answers):
    batches.append((prompts, answers))
    # NLL = answer length + index in batch; a match where the answer text is in the prompt,
    # except for the second sample of each batch.
    return [
      (float(a.size + i), tok.decode(a) in tok.decode(p) and i != 1)
      for i, (p, a) in enumerate(zip(prompts, answers))
    ]

  res = ruler.evaluate(
    score,
    tok,
    tasks=["niah_single_1", "niah_single_3", "niah_multivalue", "qa_1"],
    lengths=[1024, 2048],
    samples_per_task=3,
    seed=0,
    haystack_texts=ESSAYS,
    progress=False,
  )
  # " 1234567" is 8 bytes and appears in its needle; " <uuid>" 37; " a, b, c, d" 35 bytes and
  # never appears as one string. + 1 is the mean batch index (0 + 1 + 2) / 3.
  expected = {
    "niah_single_1": (8 + 1, 2 / 3),
    "niah_single_3": (37 + 1, 2 / 3),
    "niah_multivalue": (35 + 1, 0.0),
  }
  assert set(res) == {"tasks", "skipped"}
  assert set(res["tasks"]) == set(expected)
  for task, (nll, em) in expected.items():
    for length in ("1024", "2048"):
      correct = [1, 0, 1] if em else [0, 0, 0]  # per sample, in sample order
      assert res["tasks"][task][length] == {
        "nll": pytest.approx(nll),
        "exact_match": pytest.approx(em),
        "n": 3,
        "correct": sum(correct),
        "sample_nll": [nll - 1, nll, nll + 1],
        "sample_correct": correct,
      }
  assert list(res["skipped"]) == ["qa_1"] and "squad_path" in res["skipped"]["qa_1"]
  assert [len(p) for p, _ in batches] == [3] * 6
  for prompts, answers in batches:
    assert len({p.tobytes() for p in prompts}) == 3  # three different samples

  def values(batch):
    return [sorted(tok.decode(a).replace(",", "").split()) for a in batch[1]]

  # Sample i has the same needles at both lengths: a sweep compares like with like.
  for i in range(0, 6, 2):
    assert values(batches[i]) == values(batches[i + 1])
    assert batches[i][0][0].size < batches[i + 1][0][0].size


def test_evaluate_progress_bar(capsys):
  res = ruler.evaluate(
    lambda p, a: [(1.5, True)] * len(p),
    ByteTok(),
    tasks=["vt"],
    lengths=[1024],
    samples_per_task=2,
    seed=1,
    progress=True,
  )
  assert res == {
    "tasks": {
      "vt": {
        "1024": {
          "nll": 1.5,
          "exact_match": 1.0,
          "n": 2,
          "correct": 2,
          "sample_nll": [1.5, 1.5],
          "sample_correct": [1, 1],
        }
      }
    },
    "skipped": {},
  }
  assert "RULER" in capsys.readouterr().err


def test_evaluate_settings_scores_the_same_samples_under_each_setting():
  """Each cell's samples are built once and scored by every setting's function of the length;
  per-sample lists hold n entries in sample order, and their mean is the cell's aggregate."""
  tok, calls = ByteTok(), []

  def setting(offset):
    def at_length(length):
      def score(prompts, answers):
        calls.append((offset, length, [p.tobytes() for p in prompts]))
        return [(offset + 0.25 * i + 1 / 3, i % 2 == 0) for i in range(len(prompts))]

      return score

    return at_length

  res = ruler.evaluate_settings(
    {"none": setting(1.0), "yarn": setting(2.0)},
    tok,
    tasks=["vt"],
    lengths=[1024],
    samples_per_task=3,
    seed=2,
    progress=False,
  )
  assert set(res) == {"settings", "skipped"} and list(res["settings"]) == ["none", "yarn"]
  assert [(offset, length) for offset, length, _ in calls] == [(1.0, 1024), (2.0, 1024)]
  assert calls[0][2] == calls[1][2]  # the same three samples
  for offset, name in ((1.0, "none"), (2.0, "yarn")):
    row = res["settings"][name]["tasks"]["vt"]["1024"]
    assert row["n"] == len(row["sample_nll"]) == len(row["sample_correct"]) == 3
    assert row["sample_correct"] == [1, 0, 1] and row["correct"] == 2
    assert row["sample_nll"] == [round(offset + 0.25 * i + 1 / 3, 5) for i in range(3)]
    assert np.mean(row["sample_nll"]) == pytest.approx(row["nll"], rel=1e-5)  # 6 digits
    assert np.mean(row["sample_correct"]) == row["exact_match"]
  alone = ruler.evaluate(
    setting(1.0)(1024),
    tok,
    tasks=["vt"],
    lengths=[1024],
    samples_per_task=3,
    seed=2,
    progress=False,
  )
  assert alone["tasks"] == res["settings"]["none"]["tasks"]


def test_evaluate_errors_before_any_scoring():
  calls = []

  def score(prompts, answers):
    calls.append(1)
    return [(0.0, False)] * len(prompts)

  kw = dict(lengths=[1024], samples_per_task=1, seed=0, progress=False)
  with pytest.raises(ValueError, match=r"unknown RULER task.*'nope'.*niah_single_1.*qa_2"):
    ruler.evaluate(score, ByteTok(), tasks=["vt", "nope"], **kw)
  with pytest.raises(ValueError, match="list of task names"):
    ruler.evaluate(score, ByteTok(), tasks="vt", **kw)
  with pytest.raises(ValueError, match=r"too short for task 'cwe'.*length >= \d+"):
    ruler.evaluate(
      score,
      ByteTok(),
      tasks=["vt", "cwe"],
      lengths=[1024, 480],
      samples_per_task=2,
      seed=0,
      progress=False,
    )
  assert calls == []
  with pytest.raises(ValueError, match="returned 0 results for 1 pairs of task .vt. at length"):
    ruler.evaluate(lambda p, a: [], ByteTok(), tasks=["vt"], **kw)
  res = ruler.evaluate(score, ByteTok(), tasks=["niah_single_2", "qa_1", "qa_2"], **kw)
  assert res["tasks"] == {} and calls == []
  assert "haystack_texts" in res["skipped"]["niah_single_2"]
  assert "squad_path" in res["skipped"]["qa_1"] and "hotpot_path" in res["skipped"]["qa_2"]


def test_generate_errors():
  tok = ByteTok()
  with pytest.raises(ValueError, match=r"unknown RULER task 'niah'.*'niah_single_1'"):
    ruler.generate("niah", length=1024, tokenizer=tok, seed=0)
  with pytest.raises(ValueError, match=r"too short for task 'niah_single_1'.*length >= \d+"):
    ruler.generate("niah_single_1", length=100, tokenizer=tok, seed=0)
  with pytest.raises(ValueError, match="needs haystack_texts"):
    ruler.generate("niah_single_2", length=1024, tokenizer=tok, seed=0)
  with pytest.raises(ValueError, match="single string"):
    ruler.generate("niah_single_2", length=1024, tokenizer=tok, seed=0, haystack_texts=ESSAYS[0])
  with pytest.raises(ValueError, match="seed must be an int >= 0"):
    ruler.generate("vt", length=1024, tokenizer=tok, seed=-1)
  with pytest.raises(ValueError, match="length must be an int >= 1"):
    ruler.generate("vt", length=0, tokenizer=tok, seed=0)
  with pytest.raises(ValueError, match="needs squad_path"):
    ruler.generate("qa_1", length=1024, tokenizer=tok, seed=0)


# ------------------------------------------------------------------------------- QA files

SQUAD = {
  "version": "v2.0",
  "data": [
    {
      "title": "Nile",
      "paragraphs": [
        {
          "context": "The Nile is a major north-flowing river in northeastern Africa. It flows "
          "into the Mediterranean Sea after passing through Egypt.",
          "qas": [
            {
              "id": "a",
              "question": "Into which sea does the Nile flow?",
              "answers": [
                {"text": "the Mediterranean Sea", "answer_start": 89},
                {"text": "Mediterranean Sea", "answer_start": 93},
                {"text": "Mediterranean Sea", "answer_start": 93},
              ],
              "is_impossible": False,
            },
            {
              "id": "b",
              "question": "Which river is the longest in Antarctica?",
              "answers": [],
              "is_impossible": True,
            },
          ],
        },
        {
          "context": "Aswan lies on the east bank of the Nile. Its dam was finished in 1970.",
          "qas": [
            {
              "id": "c",
              "question": "When was the dam at Aswan finished?",
              "answers": [{"text": "1970", "answer_start": 66}],
            }
          ],
        },
      ],
    },
    {
      "title": "Tea",
      "paragraphs": [
        {
          "context": "Tea is an aromatic beverage prepared by pouring hot water over cured "
          "leaves of Camellia sinensis, an evergreen shrub native to East Asia.",
          "qas": [
            {
              "id": "d",
              "question": "Which plant are tea leaves taken from?",
              "answers": [{"text": "Camellia sinensis", "answer_start": 79}],
            }
          ],
        },
        {
          "context": "Green tea is not oxidized, while black tea is fully oxidized.",
          "qas": [
            {
              "id": "e",
              "question": "Which tea is fully oxidized?",
              "answers": [{"text": "black tea", "answer_start": 41}],
            }
          ],
        },
      ],
    },
  ],
}

HOTPOT = [
  {
    "_id": "h1",
    "question": "Which city is the birthplace of the author of The Red Lamp?",
    "answer": "Lyon",
    "type": "bridge",
    "level": "easy",
    "supporting_facts": [["The Red Lamp", 0], ["Marie Duval", 0]],
    "context": [
      ["The Red Lamp", ["The Red Lamp is a novel by Marie Duval.", " It was published in 1921."]],
      ["Marie Duval", ["Marie Duval was born in Lyon.", " She wrote six novels."]],
    ],
  },
  {
    "_id": "h2",
    "question": "Are the Arno and the Tiber both in Italy?",
    "answer": "yes",
    "type": "comparison",
    "level": "medium",
    "supporting_facts": [["Arno", 0], ["Tiber", 0]],
    "context": [
      ["Arno", ["The Arno is a river in Tuscany, Italy."]],
      ["Tiber", ["The Tiber flows through Rome, Italy."]],
      ["Po", ["The Po is the longest river in Italy.", " It ends in the Adriatic."]],
    ],
  },
  {
    "_id": "h3",
    "question": "Who designed the Blue Bridge?",
    "answer": "Anna Berg",
    "type": "bridge",
    "level": "hard",
    "supporting_facts": [["Blue Bridge", 0]],
    "context": [
      ["Blue Bridge", ["The Blue Bridge was designed by Anna Berg in 1960."]],
      ["Anna Berg", ["Anna Berg was a Swedish engineer."]],
    ],
  },
]


@pytest.fixture
def qa_files(tmp_path):
  squad, hotpot = tmp_path / "squad.json", tmp_path / "hotpot.json"
  squad.write_text(json.dumps(SQUAD))
  hotpot.write_text(json.dumps(HOTPOT))
  return squad, hotpot


def test_qa_loaders(qa_files):
  squad, hotpot = qa_files
  data = ruler.load_squad(squad)
  assert len(data.docs) == 4
  # The unanswerable question is dropped; repeated answers are merged.
  assert [q.question for q in data.questions] == [
    "Into which sea does the Nile flow?",
    "When was the dam at Aswan finished?",
    "Which plant are tea leaves taken from?",
    "Which tea is fully oxidized?",
  ]
  assert data.questions[0].answers == ("the Mediterranean Sea", "Mediterranean Sea")
  assert data.docs[data.questions[1].gold[0]].startswith("Aswan lies")
  hp = ruler.load_hotpotqa(hotpot)
  assert len(hp.docs) == 7 and [q.answers for q in hp.questions] == [
    ("Lyon",),
    ("yes",),
    ("Anna Berg",),
  ]
  assert hp.docs[hp.questions[0].gold[1]] == (
    "Marie Duval\nMarie Duval was born in Lyon. She wrote six novels."
  )


@pytest.mark.parametrize("task", ruler.QA_TASKS)
def test_qa_samples(task, qa_files):
  squad, hotpot = qa_files
  data = ruler.load_squad(squad) if task == "qa_1" else ruler.load_hotpotqa(hotpot)
  paths = dict(squad_path=squad, hotpot_path=hotpot)
  for tok in (ByteTok(), WordTok()):
    for length in (1024, 2048):
      s = ruler.generate(task, length=length, tokenizer=tok, seed=3, **paths)
      total = s.prompt_ids.size + s.answer_ids.size
      assert 0.98 * length <= total <= length
      again = ruler.generate(task, length=length, tokenizer=tok, seed=3, **paths)
      chex.assert_trees_all_equal(again.prompt_ids, s.prompt_ids)
      text = tok.decode(s.prompt_ids)
      q = data.questions[s.meta["question_index"]]
      assert text.startswith("Answer the question based on the given documents.")
      assert text.endswith(f"\n\nQuestion: {q.question} Answer:")
      assert s.answers == list(q.answers)
      assert tok.decode(s.answer_ids) == " " + q.answers[0]
      # Every gold document is there, under the number the metadata gives.
      for gi, number in zip(q.gold, s.meta["gold_documents"]):
        assert f"Document {number}:\n{data.docs[gi]}\n\n" in text
      numbers = [int(n) for n in re.findall(r"^Document (\d+):$", text, flags=re.M)]
      assert numbers == list(range(1, s.meta["documents"] + 1))
  seeds = {
    ruler.generate(task, length=1024, tokenizer=ByteTok(), seed=k, **paths).meta["question_index"]
    for k in range(12)
  }
  assert len(seeds) > 1  # the seed picks the question


def test_qa_file_errors(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"rows": []}))
  with pytest.raises(ValueError, match=r"not a SQuAD file; expected .*paragraphs"):
    ruler.generate("qa_1", length=2048, tokenizer=ByteTok(), seed=0, squad_path=bad)
  with pytest.raises(ValueError, match=r"not a HotpotQA file"):
    ruler.generate("qa_2", length=2048, tokenizer=ByteTok(), seed=0, hotpot_path=bad)
  lonely = tmp_path / "one.json"  # a single paragraph: nothing to pad the haystack with
  lonely.write_text(json.dumps({"data": [{"paragraphs": SQUAD["data"][1]["paragraphs"][:1]}]}))
  with pytest.raises(
    ValueError,
    match=r"holds no document besides its questions' own "
    r"\(1 in all\).*distractors",
  ):
    ruler.generate("qa_1", length=2048, tokenizer=ByteTok(), seed=0, squad_path=lonely)
  with pytest.raises(ValueError, match="does not exist"):
    ruler.generate(
      "qa_1", length=2048, tokenizer=ByteTok(), seed=0, squad_path=tmp_path / "missing.json"
    )


def test_a_sample_cache_builds_each_sample_once_for_every_model(monkeypatch):
  """rove-eval scores every --compare run on one cache: the second model gets the very samples
  the first got, and none is generated again."""
  tok, built, seen = ByteTok(), [], []
  real = ruler.generate

  def counting(task, **kw):
    built.append((task, kw["length"], kw["seed"]))
    return real(task, **kw)

  def score(prompts, answers):
    seen.append([p.tobytes() for p in prompts])
    return [(1.0, False)] * len(prompts)

  monkeypatch.setattr(ruler, "generate", counting)
  cache = {}
  kw = dict(
    tasks=["vt", "niah_single_1"],
    lengths=[1024],
    samples_per_task=2,
    seed=3,
    progress=False,
    sample_cache=cache,
  )
  ruler.evaluate_settings({"none": lambda L: score}, tok, **kw)
  assert len(built) == 4 and len(cache) == 4
  ruler.evaluate_settings({"none": lambda L: score}, tok, **kw)
  assert len(built) == 4  # nothing generated for the second model
  assert seen[2:] == seen[:2]  # the same prompts, task by task
  ruler.evaluate_settings({"none": lambda L: score}, tok, **{**kw, "sample_cache": None})
  assert len(built) == 8  # without a cache every call generates its own
