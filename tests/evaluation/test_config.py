"""rove_jax.evaluation.config.EvalConfig: frozen and validated at construction. Each refused
value is a FieldError (a ValueError) that names the field, what it must be and an example;
rove-eval builds the config once from its options and reports the same check under the
option's name (exit 2)."""

import dataclasses

import pytest

from rove_jax.cli import eval as cli
from rove_jax.evaluation import icl
from rove_jax.evaluation.config import SUITES, TASKS, EvalConfig, FieldError


def test_the_defaults_are_rove_evals_and_every_field_is_described():
  assert cli.parse_args(["--workdir", "w"]).config == EvalConfig()
  assert EvalConfig().suite in SUITES and set(EvalConfig().tasks) <= set(TASKS)
  assert all(f.metadata["help"] for f in dataclasses.fields(EvalConfig))


def test_lists_are_kept_as_tuples_and_the_config_is_frozen(tmp_path):
  spec = icl.TaskSpec("t", str(tmp_path / "t.jsonl"), "language_modeling")
  c = EvalConfig(
    tasks=["ppl"], lengths=[64, 128], ruler_lengths=[256], recall_lengths=[32], icl_specs=[spec]
  )
  assert (c.tasks, c.lengths, c.ruler_lengths, c.recall_lengths, c.icl_specs) == (
    ("ppl",),
    (64, 128),
    (256,),
    (32,),
    (spec,),
  )
  assert hash(c) == hash(dataclasses.replace(c))
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.seed = 1


BAD = [
  (dict(tasks=()), "tasks", "tasks must name one or more of ppl, ruler, icl, recall"),
  (dict(tasks=("ppl", "ppl")), "tasks", "each once"),
  (dict(tasks=("perplexity",)), "tasks", "got ('perplexity',)"),
  (dict(tasks="ppl"), "tasks", "got 'ppl'"),
  (dict(suite="medium"), "suite", "suite must be one of quick, full; got 'medium'"),
  (dict(yarn="sideways"), "yarn", "yarn must be one of off, on, both, all; got 'sideways'"),
  (
    dict(lengths=(64, 1)),
    "lengths",
    "lengths must be token counts >= 2, e.g. lengths=(4096, 8192); got (64, 1)",
  ),
  (dict(lengths=()), "lengths", "got ()"),
  (dict(ruler_lengths=(4096.0,)), "ruler_lengths", "got (4096.0,)"),
  (dict(recall_lengths="32"), "recall_lengths", "got '32'"),
  (
    dict(yarn="all", yarn_fixed_factor=1.0),
    "yarn_fixed_factor",
    "yarn_fixed_factor must be a YaRN factor > 1, e.g. yarn_fixed_factor=16",
  ),
  (dict(yarn="all", yarn_fixed_factor=float("inf")), "yarn_fixed_factor", "got inf"),
  (dict(yarn_fixed_factor=4.0), "yarn_fixed_factor", "only yarn='all' evaluates; got yarn='both'"),
  (
    dict(stride=0.0),
    "stride",
    "stride must be a fraction of the length in (0, 1], e.g. stride=0.5",
  ),
  (dict(stride=1.5), "stride", "got 1.5"),
  (dict(stride=float("nan")), "stride", "got nan"),
  (
    dict(ppl_tokens=0),
    "ppl_tokens",
    "ppl_tokens must be >= 1 target a length, e.g. ppl_tokens=16384; got 0",
  ),
  (dict(recall_samples=0), "recall_samples", "e.g. recall_samples=100; got 0"),
  (dict(seed=-1), "seed", "seed must be >= 0, e.g. seed=0; got -1"),
  (dict(chunk=0), "chunk", "chunk must be a block length >= 1 token, e.g. chunk=512; got 0"),
  (dict(chunk=True), "chunk", "got True"),
  (dict(chunk=512.0), "chunk", "got 512"),
  (dict(train_len=1), "train_len", "train_len must be >= 2 tokens, e.g. train_len=2048"),
  (dict(squad=""), "squad", "squad must be a path or spec"),
  (dict(tokenizer=3), "tokenizer", "got 3"),
  (dict(icl_specs=("t.jsonl",)), "icl_specs", "icl_specs must be a tuple of icl.TaskSpec"),
  (dict(progress="no"), "progress", "progress must be True or False; got 'no'"),
]


@pytest.mark.parametrize("kw, field, says", BAD, ids=[f"{f}:{kw}" for kw, f, _ in BAD])
def test_a_bad_value_is_refused_naming_the_field(kw, field, says):
  with pytest.raises(FieldError) as info:
    EvalConfig(**kw)
  e = info.value
  assert isinstance(e, ValueError) and e.field == field
  assert str(e).startswith(f"{field} ") and says in str(e), str(e)
  assert e.as_flags().startswith("--" + field.replace("_", "-") + " ")


@pytest.mark.parametrize(
  "argv, line",
  [
    (
      ["--lengths", "64,1"],
      "--lengths must be token counts >= 2, e.g. --lengths 4096,8192; got 64,1",
    ),
    (["--recall-samples", "0"], "--recall-samples must be >= 1, e.g. --recall-samples 100; got 0"),
    (["--train-len", "1"], "--train-len must be >= 2 tokens, e.g. --train-len 2048; got 1"),
    (
      ["--yarn", "on", "--yarn-fixed-factor", "4"],
      "--yarn-fixed-factor applies to the yarn_fixed setting, which only --yarn all evaluates; "
      "got --yarn on",
    ),
  ],
)
def test_rove_eval_reports_a_refused_value_under_its_option(capsys, argv, line):
  with pytest.raises(SystemExit) as info:
    cli.parse_args(["--workdir", "w", *argv])
  assert info.value.code == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == f"rove-eval: error: {line}"


def test_every_option_reaches_the_config():
  args = cli.parse_args(
    [
      "--workdir",
      "w",
      "--tasks",
      "ppl,recall,ppl",
      "--suite",
      "full",
      "--lengths",
      "64,128",
      "--yarn",
      "all",
      "--yarn-fixed-factor",
      "4",
      "--stride",
      "0.5",
      "--ppl-tokens",
      "100",
      "--ruler-lengths",
      "256",
      "--recall-lengths",
      "32",
      "--recall-samples",
      "7",
      "--seed",
      "3",
      "--chunk",
      "64",
      "--data-path",
      "d.txt",
      "--squad",
      "s.json",
      "--hotpot",
      "h.json",
      "--icl-tasks",
      "i.json",
      "--no-progress",
      "--train-len",
      "64",
      "--tokenizer",
      "bytes",
    ]
  )
  want = EvalConfig(
    tasks=("ppl", "recall"),
    suite="full",
    lengths=(64, 128),
    yarn="all",
    yarn_fixed_factor=4.0,
    stride=0.5,
    ppl_tokens=100,
    ruler_lengths=(256,),
    recall_lengths=(32,),
    recall_samples=7,
    seed=3,
    chunk=64,
    data_path="d.txt",
    squad="s.json",
    hotpot="h.json",
    icl_tasks="i.json",
    progress=False,
    train_len=64,
    tokenizer="bytes",
  )
  assert args.config == want
  unset = [
    f.name
    for f in dataclasses.fields(EvalConfig)
    if getattr(want, f.name) == f.default and f.name != "icl_specs"
  ]
  assert unset == []  # each field came from its option, not its default
