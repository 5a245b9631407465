"""ICL evaluation: scores on hand-made numbers, task files through fake score functions whose
answers are known, file errors, and synthetic tasks checked by independent solvers."""

import json
import re
import zlib

import chex
import numpy as np
import pytest

from rove_jax.evaluation import icl
from tests.reference import ByteTok, WordTok


def write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


def keyword_score_fn(tok, calls):
  """Low NLL and a greedy match when "right" is in the continuation or in the prompt's last
  line (the schema context option); records the decoded (prompt, continuation) texts."""

  def score_fn(prompts, continuations):
    out = []
    for p, c in zip(prompts, continuations):
      chex.assert_type([p, c], np.int32)
      assert p[0] == tok.eot_id
      prompt, cont = tok.decode(p[1:]), tok.decode(c)
      calls.append((prompt, cont))
      hit = "right" in prompt.split("\n")[-1] + cont
      out.append((0.1 if hit else 2.0, hit))
    return out

  return score_fn


# ------------------------------------------------------------------------------ scores


def test_centered_accuracy_and_core_on_hand_numbers():
  assert icl.centered_accuracy(0.5, 0.25) == pytest.approx(1 / 3)
  assert icl.centered_accuracy(0.25, 0.25) == 0.0
  assert icl.centered_accuracy(1.0, 0.5) == 1.0
  assert icl.centered_accuracy(0.1, 0.25) == pytest.approx(-0.2)
  assert icl.centered_accuracy(0.7, 0.0) == pytest.approx(0.7)
  tasks = {
    "a": {"centered": 0.2},
    "b": {"centered": -0.1},
    "c": {"accuracy": 0.5, "baseline": 0.25},
  }
  assert icl.core_score(tasks) == pytest.approx((0.2 - 0.1 + 1 / 3) / 3)
  assert icl.core_score({"tasks": tasks, "core": None}) == pytest.approx((0.2 - 0.1 + 1 / 3) / 3)
  assert icl.core_score({}) is None
  with pytest.raises(ValueError, match="divided by 100"):
    icl.centered_accuracy(0.5, 25.0)
  with pytest.raises(ValueError, match="acc=1.5"):
    icl.centered_accuracy(1.5, 0.25)


# -------------------------------------------------------------------------- task files

MC_RIGHT = [1, 0, 3, 2, 1, 0, 2, 3, 1, 0]  # where "right" sits among the choices


def mc_rows():
  rows = []
  for i, r in enumerate(MC_RIGHT):
    choices = [f"wrong {i}{c}" for c in "abcd"]
    choices[r] = f"right {i}"
    # The first 7 name the "right" choice gold; the last 3 a wrong one.
    rows.append(
      {
        "query": f"Question {i}:",
        "choices": choices,
        "gold": r if i < 7 else (r + 1) % 4,
        "category": "extra fields are ignored",
      }
    )
  return rows


@pytest.fixture
def files(tmp_path):
  mc = write_jsonl(tmp_path / "mc.jsonl", mc_rows())
  lm = write_jsonl(
    tmp_path / "lm.jsonl",
    [
      {"context": f"Story {i}.", "continuation": "right on" if i < 2 else "wrong way"}
      for i in range(5)
    ],
  )
  schema = write_jsonl(
    tmp_path / "schema.jsonl",
    [
      {
        "context_options": ["The wrong one", "The right one"],
        "continuation": f"went home {i}.",
        "gold": 1 if i < 3 else 0,
      }
      for i in range(4)
    ],
  )
  return {"mc": mc, "lm": lm, "schema": schema}


def test_runner_accuracies_centered_and_core_are_exact(files):
  tok, calls = ByteTok(), []
  specs = [
    icl.TaskSpec("mc", files["mc"], "multiple_choice", num_fewshot=3, baseline=0.25),
    {"name": "lm", "path": files["lm"], "kind": "language_modeling", "num_fewshot": 1},
    {"label": "schema", "dataset_uri": files["schema"], "icl_task_type": "schema"},
  ]
  out = icl.run_task_files(keyword_score_fn(tok, calls), tok, specs, progress=False)
  mc, lm, schema = out["tasks"]["mc"], out["tasks"]["lm"], out["tasks"]["schema"]
  assert (mc["accuracy"], mc["n"], mc["kind"], mc["num_fewshot"]) == (0.7, 10, "multiple_choice", 3)
  assert mc["centered"] == pytest.approx(0.6) and mc["baseline"] == 0.25
  assert (lm["accuracy"], lm["baseline"], lm["centered"], lm["n"]) == (0.4, 0.0, 0.4, 5)
  # Schema's baseline comes from the file: two options -> 0.5.
  assert (schema["accuracy"], schema["baseline"], schema["centered"]) == (0.75, 0.5, 0.5)
  assert out["core"] == pytest.approx((0.6 + 0.4 + 0.5) / 3)
  assert len(calls) == 10 * 4 + 5 + 4 * 2


def test_fewshot_context_is_other_examples_and_deterministic(files):
  tok, rows = ByteTok(), mc_rows()
  spec = icl.TaskSpec("mc", files["mc"], "multiple_choice", num_fewshot=3)

  def prompts(seed, **kwargs):
    calls = []
    icl.run_task_files(
      keyword_score_fn(tok, calls), tok, [spec], seed=seed, progress=False, **kwargs
    )
    return calls

  calls = prompts(0)
  shots_of = {}
  for prompt, cont in calls:
    lines = prompt.split("\n")
    assert len(lines) == 4
    i = int(re.fullmatch(r"Question (\d+):", lines[-1]).group(1))
    assert cont in [" " + c for c in rows[i]["choices"]]
    shots = [int(re.match(r"Question (\d+):", line).group(1)) for line in lines[:3]]
    assert i not in shots and len(set(shots)) == 3
    for j, line in zip(shots, lines[:3]):
      assert line == f"Question {j}: {rows[j]['choices'][rows[j]['gold']]}"
    assert shots_of.setdefault(i, shots) == shots  # the same shots for every choice
  assert sorted(shots_of) == list(range(10))
  assert prompts(0) == calls
  assert prompts(1) != calls
  # An example keeps its shots when only a subset is evaluated.
  subset = prompts(0, max_examples=4)
  assert len(subset) == 16 and all(p in calls for p in subset)


def test_prompt_text_tokens_and_delimiters(tmp_path, files):
  tok, calls = ByteTok(), []
  seen = []

  def score_fn(prompts, continuations):
    seen.extend(zip(prompts, continuations))
    return keyword_score_fn(tok, calls)(prompts, continuations)

  icl.run_task_files(
    score_fn,
    tok,
    [icl.TaskSpec("mc", files["mc"], "multiple_choice")],
    progress=False,
    max_examples=10,
  )
  prompt_ids, cont_ids = seen[0]
  chex.assert_trees_all_equal(prompt_ids, np.array([256] + list(b"Question 0:"), np.int32))
  # Choice 0 of example 0.
  chex.assert_trees_all_equal(cont_ids, np.array(list(b" wrong 0a"), np.int32))

  calls.clear()
  spec = icl.TaskSpec(
    "lm",
    files["lm"],
    "language_modeling",
    num_fewshot=1,
    example_delimiter="\n\n",
    continuation_delimiter="\nAnswer: ",
    prompt_string="Finish the stories.",
  )
  icl.run_task_files(keyword_score_fn(tok, calls), tok, [spec], progress=False)
  for i, (prompt, cont) in enumerate(calls):
    j = icl.fewshot_indices(5, i, 1, 0)[0]
    shot = "right on" if j < 2 else "wrong way"
    assert prompt == f"Finish the stories.\n\nStory {j}.\nAnswer: {shot}\n\nStory {i}.\nAnswer:"
    assert cont == (" right on" if i < 2 else " wrong way")

  # max_tokens cuts prompts from the left so prompt + continuation fits.
  seen.clear()
  icl.run_task_files(
    lambda p, c: seen.extend(zip(p, c)) or [(1.0, True)] * len(p),
    tok,
    [spec],
    progress=False,
    max_tokens=20,
  )
  assert len(seen) == 5 and all(len(p) + len(c) == 20 for p, c in seen)
  assert tok.decode(seen[0][0]) == " 0.\nAnswer:"  # 20 - len(" right on")


def test_mean_versus_summed_scoring(tmp_path):
  tok = ByteTok()
  path = write_jsonl(
    tmp_path / "len.jsonl",
    [{"query": "Pick:", "choices": ["a long long answer", "b"], "gold": 0}] * 2,
  )

  def score_fn(prompts, continuations):
    # Per token: the long choice is likelier, its sum (1.0 * 19 tokens) is not (1.5 * 2).
    return [(1.0 if tok.decode(c).strip().startswith("a") else 1.5, False) for c in continuations]

  for scoring, acc in (("mean", 1.0), ("sum", 0.0)):
    spec = icl.TaskSpec("t", path, "multiple_choice", scoring=scoring)
    out = icl.run_task_files(score_fn, tok, [spec], progress=False)
    assert out["tasks"]["t"]["accuracy"] == acc


def test_spec_file_loader(tmp_path, files):
  spec_path = tmp_path / "specs" / "tasks.json"
  spec_path.parent.mkdir()
  (tmp_path / "specs" / "mc.jsonl").write_text(open(files["mc"]).read())
  spec_path.write_text(
    json.dumps(
      {
        "icl_tasks": [
          {
            "label": "mc",
            "dataset_uri": "mc.jsonl",
            "icl_task_type": "multiple_choice",
            "num_fewshot": [2],
            "random_baseline": 0.25,
            "continuation_delimiter": "\nA: ",
          },
          {"name": "lm", "path": files["lm"], "kind": "language_modeling"},
        ]
      }
    )
  )
  mc, lm = icl.load_task_specs(str(spec_path))
  assert mc == icl.TaskSpec(
    "mc",
    str(tmp_path / "specs" / "mc.jsonl"),
    "multiple_choice",
    num_fewshot=2,
    baseline=0.25,
    continuation_delimiter="\nA: ",
  )
  assert (lm.path, lm.num_fewshot, lm.baseline) == (files["lm"], 0, None)
  assert (lm.example_delimiter, lm.continuation_delimiter, lm.scoring) == ("\n", " ", "mean")
  tok, calls = ByteTok(), []
  out = icl.run_task_files(keyword_score_fn(tok, calls), tok, str(spec_path), progress=False)
  assert out["tasks"]["mc"]["accuracy"] == 0.7 and out["tasks"]["lm"]["accuracy"] == 0.4

  bad = [
    ({"name": "x", "path": "p", "kind": "mc"}, "kind='mc' is not one of"),
    ({"name": "x", "path": "p", "kind": "schema", "baseline": 25}, "baseline=25"),
    ({"name": "x", "path": "p", "kind": "schema", "num_shots": 2}, "unknown field 'num_shots'"),
    ({"name": "x", "kind": "schema"}, "missing required field 'path'"),
    ({"name": "x", "path": "p", "kind": "schema", "num_fewshot": [0, 5]}, "one count"),
  ]
  for entry, message in bad:
    spec_path.write_text(json.dumps([entry]))
    with pytest.raises(ValueError, match=re.escape(message)) as err:
      icl.load_task_specs(str(spec_path))
    assert "tasks.json, task spec 0" in str(err.value)
  spec_path.write_text(json.dumps([{"name": "x", "path": "p", "kind": "schema"}] * 2))
  with pytest.raises(ValueError, match="repeated: x"):
    icl.load_task_specs(str(spec_path))


GOOD_MC = {"query": "Q", "choices": ["a", "b", "c", "d"], "gold": 1}


@pytest.mark.parametrize(
  "kind,rows,line,message",
  [
    ("multiple_choice", [GOOD_MC, '{"query": "Q", "choices": [', GOOD_MC], 2, "invalid JSON"),
    (
      "multiple_choice",
      [GOOD_MC, "", {"query": "Q", "choices": ["a", "b"]}],
      3,
      "missing field 'gold'",
    ),
    (
      "multiple_choice",
      [{**GOOD_MC, "gold": 4}],
      1,
      "gold=4 is out of range for 4 choices (must be 0..3)",
    ),
    ("multiple_choice", [GOOD_MC, {**GOOD_MC, "gold": "1"}], 2, "'gold' must be an int"),
    ("multiple_choice", [{**GOOD_MC, "choices": "abcd"}], 1, "'choices' must be a list"),
    ("multiple_choice", ["[1, 2]"], 1, "expected a JSON object"),
    (
      "language_modeling",
      [{"context": "c", "continuation": 3}],
      1,
      "'continuation' must be a string",
    ),
    (
      "language_modeling",
      [{"context": "c", "continuation": "x"}, {"continuation": "x"}],
      2,
      "missing field 'context'",
    ),
    (
      "schema",
      [{"context_options": ["a", "b"], "continuation": "c", "gold": -1}],
      1,
      "gold=-1 is out of range for 2 context_options",
    ),
  ],
)
def test_malformed_files_name_file_line_and_problem(tmp_path, kind, rows, line, message):
  path = write_jsonl(tmp_path / "bad.jsonl", rows)
  called = []
  with pytest.raises(ValueError, match=re.escape(f"bad.jsonl, line {line}: ")) as err:
    icl.run_task_files(
      lambda p, c: called.append(1),
      ByteTok(),
      [
        icl.TaskSpec("ok", write_jsonl(tmp_path / "ok.jsonl", [GOOD_MC] * 3), "multiple_choice"),
        icl.TaskSpec("bad", path, kind),
      ],
      progress=False,
    )
  assert message in str(err.value)
  assert not called  # every file is checked before anything is scored


def test_task_level_errors(tmp_path):
  tok = ByteTok()
  path = write_jsonl(tmp_path / "few.jsonl", [GOOD_MC] * 3)
  with pytest.raises(ValueError, match="num_fewshot=3 needs at least 4 examples"):
    icl.run_task_files(None, tok, [icl.TaskSpec("t", path, "multiple_choice", num_fewshot=3)])
  with pytest.raises(ValueError, match="returned 1 results for 12 pairs"):
    icl.run_task_files(
      lambda p, c: [(0.0, True)], tok, [icl.TaskSpec("t", path, "multiple_choice")], progress=False
    )
  empty = write_jsonl(tmp_path / "empty.jsonl", [""])
  with pytest.raises(ValueError, match="no examples"):
    icl.run_task_files(None, tok, [icl.TaskSpec("t", empty, "multiple_choice")])
  with pytest.raises(FileNotFoundError, match="no file at"):
    icl.run_task_files(None, tok, [icl.TaskSpec("t", str(tmp_path / "nope"), "schema")])


# --------------------------------------------------------------------- synthetic tasks
# Independent solvers: each reads the answer off the prompt text alone (None: not determined).

OPS = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, max, min]
CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}


def solve_recall(prompt):
  lines = prompt.split("\n")
  split = lines.index("Now recall them.")
  pairs = dict(line.split(": ") for line in lines[1:split])
  assert len(pairs) == split - 1  # keys are distinct
  for line in lines[split + 1 : -1]:  # queries answered in the prompt agree with the pairs
    key, value = line.split(": ")
    assert pairs[key] == value
  return " " + pairs[lines[-1].rstrip(":")]


def solve_passkey(prompt):
  keys = set(
    re.findall(r"The pass key is (\d{5})\. Remember it\. (\d{5}) is the pass key\.", prompt)
  )
  assert len(keys) == 1
  ((a, b),) = keys
  assert a == b and prompt.endswith("What is the pass key? The pass key is")
  return " " + a


def solve_induction(prompt):
  _, first, second = prompt.split("\n")
  words, prefix = first.split(" "), second.split(" ")
  assert len(set(words)) == len(words) and words[: len(prefix)] == prefix
  return " " + " ".join(words[len(prefix) : len(prefix) + 4])


def solve_flip_flop(prompt):
  lines, last = prompt.split("\n")[1:], None
  assert lines[0].startswith("write ") and lines[-1] == "read"
  for line in lines[:-1]:
    op, bit = line.split(" ")
    if op == "write":
      last = bit
    elif op == "read":
      assert bit == last
  return " " + last


def solve_dyck(prompt):
  stack = []
  for s in prompt.split(": ", 1)[1].split(" "):
    if s in CLOSE:
      stack.append(CLOSE[s])
    else:
      assert stack.pop() == s
  assert stack
  return " " + " ".join(reversed(stack))


def solve_operator(prompt):
  *shots, query = prompt.split("\n")
  if not shots:
    return None
  rows = [tuple(int(x) for x in re.fullmatch(r"(\d) @ (\d) = (-?\d+)", s).groups()) for s in shots]
  ops = [f for f in OPS if all(f(a, b) == c for a, b, c in rows)]
  assert len(ops) == 1
  a, b = (int(x) for x in re.fullmatch(r"(\d) @ (\d) =", query).groups())
  return f" {ops[0](a, b)}"


def solve_mapping(transform):
  def solve(prompt):
    *shots, query = prompt.split("\n")
    for shot in shots:
      word, mapped = shot.split(" -> ")
      assert mapped == transform(word)
    assert len({s.split(" ")[0] for s in shots} | {query[:-3]}) == len(shots) + 1
    return f" {transform(query[:-3])}" if shots else None

  return solve


SOLVERS = {
  "associative_recall": solve_recall,
  "passkey": solve_passkey,
  "induction": solve_induction,
  "flip_flop": solve_flip_flop,
  "dyck": solve_dyck,
  "fewshot_operator": solve_operator,
  "fewshot_reverse": solve_mapping(lambda w: w[::-1]),
  "fewshot_uppercase": solve_mapping(str.upper),
}


def examples(task, tok, value, **kwargs):
  axis = "shots" if task.startswith("fewshot") else "length"
  return icl.synthetic_examples(task, tok, **{axis: value}, **kwargs)


def test_synthetic_task_names():
  assert set(icl.synthetic_tasks()) == set(SOLVERS)
  with pytest.raises(ValueError, match="valid names: associative_recall, passkey"):
    icl.run_synthetic(None, ByteTok(), tasks=["passkey", "copying"])


@pytest.mark.parametrize("task", sorted(SOLVERS))
def test_synthetic_answers_are_correct_and_deterministic(task):
  tok = ByteTok()
  values = (0, 1, 2, 8) if task.startswith("fewshot") else (256, 512)
  for value in values:
    pairs = examples(task, tok, value, samples=8, seed=3)
    assert pairs == examples(task, tok, value, samples=8, seed=3)
    assert pairs != examples(task, tok, value, samples=8, seed=4)
    assert len(set(pairs)) == 8
    for prompt, answer in pairs:
      assert answer.startswith(" ") and not prompt.endswith(" ")
      expected = SOLVERS[task](prompt)
      if expected is not None:
        assert answer == expected
      if task == "fewshot_operator":
        a, b = (int(x) for x in re.search(r"(\d) @ (\d) =$", prompt).groups())
        assert int(answer) in {f(a, b) for f in OPS}


def test_fewshot_samples_keep_their_query_across_shot_counts():
  tok = ByteTok()
  for task in icl.FEWSHOT_TASKS:
    full = icl.synthetic_examples(task, tok, shots=8, samples=4)
    for k in (0, 1, 2, 4):
      for (prompt, answer), (p8, a8) in zip(
        icl.synthetic_examples(task, tok, shots=k, max_shots=8, samples=4), full
      ):
        lines, lines8 = prompt.split("\n"), p8.split("\n")
        assert answer == a8 and lines[-1] == lines8[-1] and lines[:-1] == lines8[:k]


@pytest.mark.parametrize("tok", [ByteTok(), WordTok()], ids=["bytes", "words"])
def test_synthetic_lengths_within_five_percent_below_target(tok):
  for task in icl.LENGTH_TASKS:
    for length in (256, 512, 1024):
      for prompt, answer in icl.synthetic_examples(task, tok, length=length, samples=3):
        n = 1 + len(tok.encode(prompt)) + len(tok.encode(answer))
        # Within 5%, and never past the target (a model's context length).
        assert 0.95 * length <= n <= length, (task, length, n)
  with pytest.raises(ValueError, match="shortest example has"):
    icl.synthetic_examples("passkey", tok, length=20)
  with pytest.raises(ValueError, match="pass shots=, not length="):
    icl.synthetic_examples("fewshot_reverse", tok, length=256)


MARKERS = {
  "Remember the number": "associative_recall",
  "A pass key": "passkey",
  "Random words": "induction",
  "Flip-flop": "flip_flop",
  "Close the brackets": "dyck",
}


def task_of(prompt):
  first = prompt.split("\n")[0]
  for marker, task in MARKERS.items():
    if first.startswith(marker):
      return task
  if " @ " in first:
    return "fewshot_operator"
  return "fewshot_uppercase" if first.split(" -> ")[1].isupper() else "fewshot_reverse"


def test_oracle_scores_one_and_never_right_scores_zero():
  tok, shots, lengths = ByteTok(), (0, 1, 2, 4, 8), (256, 512)
  # Zero-shot queries of the few-shot tasks cannot be solved from the prompt: looked up.
  zero_shot = {
    p: a
    for t in icl.FEWSHOT_TASKS
    for p, a in icl.synthetic_examples(t, tok, shots=0, max_shots=8, samples=4)
  }

  def oracle(prompts, continuations):
    out = []
    for p, c in zip(prompts, continuations):
      assert p[0] == tok.eot_id
      prompt = tok.decode(p[1:])
      expected = zero_shot[prompt] if prompt in zero_shot else SOLVERS[task_of(prompt)](prompt)
      out.append((0.0, tok.decode(c) == expected))
    return out

  result = icl.run_synthetic(oracle, tok, shots=shots, lengths=lengths, samples=4, progress=False)
  assert result["accuracy"] == 1.0
  for task in icl.synthetic_tasks():
    values = shots if task.startswith("fewshot") else lengths
    axis = "shots" if task.startswith("fewshot") else "length"
    assert result["tasks"][task][f"by_{axis}"] == {str(v): 1.0 for v in values}
    assert result["tasks"][task]["accuracy"] == 1.0

  never = icl.run_synthetic(
    lambda p, c: [(5.0, False)] * len(p),
    tok,
    shots=shots,
    lengths=lengths,
    samples=4,
    progress=True,
  )
  assert never["accuracy"] == 0.0 and set(never["tasks"]) == set(SOLVERS)
  for task, entry in never["tasks"].items():
    axis = "shots" if task.startswith("fewshot") else "length"
    assert set(entry[f"by_{axis}"].values()) == {0.0} and entry["accuracy"] == 0.0
    assert set(entry[f"nll_by_{axis}"].values()) == {5.0}


def test_task_results_do_not_depend_on_the_other_tasks():
  tok = WordTok()

  def coin(prompts, continuations):
    # A deterministic function of the texts: right for about half of them.
    return [
      (1.0, zlib.crc32((tok.decode(p) + tok.decode(c)).encode()) % 2 == 0)
      for p, c in zip(prompts, continuations)
    ]

  kwargs = dict(shots=(0, 2), lengths=(256,), samples=8, seed=5, progress=False)
  full = icl.run_synthetic(coin, tok, **kwargs)
  for task in ("dyck", "fewshot_reverse"):
    alone = icl.run_synthetic(coin, tok, tasks=[task], **kwargs)
    assert alone["tasks"][task] == full["tasks"][task]
  accuracies = [t["accuracy"] for t in full["tasks"].values()]
  assert full["accuracy"] == pytest.approx(np.mean(accuracies))
  assert 0.0 < full["accuracy"] < 1.0
  for name, task in full["tasks"].items():  # per-sample records: 8 a cell, mean = aggregate
    axis = "shots" if name.startswith("fewshot") else "length"
    assert set(task[f"sample_correct_by_{axis}"]) == set(task[f"by_{axis}"])
    for value, accuracy in task[f"by_{axis}"].items():
      correct = task[f"sample_correct_by_{axis}"][value]
      assert len(correct) == len(task[f"sample_nll_by_{axis}"][value]) == 8
      assert set(correct) <= {0, 1} and np.mean(correct) == accuracy
      assert task[f"sample_nll_by_{axis}"][value] == [1.0] * 8
    assert task["n"] == 8 * len(task[f"by_{axis}"])
    assert task["correct"] == sum(map(sum, task[f"sample_correct_by_{axis}"].values()))


# ------------------------------------------------------------- inside the training context


def test_cli_icl_scores_inside_the_training_context_and_counts_cut_prompts(files):
  """rove-eval's ICL: the by-length tasks at the training length T only; every pair (synthetic
  or task file) longer than T is cut from the left to T tokens, whatever the encoding, and the
  cut prompts are counted per task."""
  import types

  from rove_jax.cli import eval as cli
  from rove_jax.evaluation import tasks as eval_tasks
  from rove_jax.evaluation.config import EvalConfig

  tok, T, seen = ByteTok(), 64, []

  def score_fn(prompts, answers):
    seen.extend(len(p) + len(a) for p, a in zip(prompts, answers))
    return [(1.0, True)] * len(prompts)

  run = types.SimpleNamespace(train_len=T, tokenizer=tok)
  scorer = types.SimpleNamespace(score_fn=lambda: score_fn)
  config = EvalConfig(
    progress=False,
    seed=0,
    icl_tasks="specs.json",
    icl_specs=[icl.TaskSpec("mc", files["mc"], "multiple_choice", num_fewshot=3)],
  )
  suite = {**cli.SUITES["full"], "icl_shots": (0, 8), "icl_samples": 2}
  got = eval_tasks._icl(run, scorer, config, suite, lengths=None)
  assert got["protocol"]["context"] == T and got["protocol"]["lengths"] == [T]
  assert f"training context of {T} tokens" in got["protocol"]["rule"]
  synth = got["synthetic"]
  assert set(synth["tasks"]) | set(synth["skipped"]) == set(icl.synthetic_tasks())
  assert max(seen) <= T and len(seen) == synth["prompts"] + got["files"]["prompts"]
  for name, task in synth["tasks"].items():
    if name in icl.LENGTH_TASKS:
      assert list(task["by_length"]) == [str(T)] and task["truncated"] == 0
      continue
    pairs = [
      p for k in (0, 8) for p in icl.synthetic_examples(name, tok, shots=k, max_shots=8, samples=2)
    ]
    too_long = sum(1 + len(tok.encode(p)) + len(tok.encode(a)) > T for p, a in pairs)
    assert (task["prompts"], task["truncated"]) == (4, too_long) and too_long > 0
  assert synth["truncated"] == sum(t["truncated"] for t in synth["tasks"].values())
  spec = config.icl_specs[0]
  examples = icl.read_task_file(spec)
  too_long = sum(
    1 + len(tok.encode(p)) + len(tok.encode(c)) > T
    for i in range(len(examples))
    for p, c in icl.build_prompts(spec, examples, i, seed=0)
  )
  mc = got["files"]["tasks"]["mc"]  # 4 choices of 10 examples, each after 3 shots
  assert (mc["prompts"], mc["truncated"], got["files"]["truncated"]) == (40, too_long, too_long)
  assert got["files"]["core"] == icl.core_score(got["files"]["tasks"])
