"""EvalConfig: what rove-eval measures on each run and how, one frozen dataclass validated at
construction (a ValueError names the field, what it must be and an example of a valid value).

rove_jax.cli.eval builds one from its command line (each field is the flag of the same name:
yarn_fixed_factor is --yarn-fixed-factor, progress is the negation of --no-progress);
`rove_jax.evaluation.tasks.evaluate_run` takes it. SUITES holds the sizes of the two suites,
TASKS the task names and YARN_CHOICES the settings of `yarn`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

import numpy as np

from rove_jax import checks
from rove_jax.evaluation.icl import TaskSpec

# Lengths are int(multiple * T). ICL's by-length tasks run at T only: the paper's ICL is inside
# the training context. The quick suite leaves out 0.5x: it is a smoke test (reproduce --quick
# and the test suite run it), and 0.5x adds to its perplexity time without testing anything new.
SUITES = {
  "quick": {
    "multiples": (1, 4, 16),
    "ppl_tokens": 8192,
    "ruler_multiples": (4, 16),
    "ruler_tasks": ("niah_single_1", "niah_multikey_1", "vt", "cwe", "qa_1", "qa_2"),
    "ruler_samples": 2,
    "icl_samples": 8,
    "icl_shots": (0, 2, 8),
    "icl_length_multiples": (1,),
    "recall_samples": 100,
  },
  "full": {
    "multiples": (0.5, 1, 2, 4, 8, 16),
    "ppl_tokens": 65536,
    "ruler_multiples": (4, 8, 16),
    "ruler_tasks": None,
    "ruler_samples": 25,
    "icl_samples": 32,
    "icl_shots": (0, 1, 2, 4, 8),
    "icl_length_multiples": (1,),
    "recall_samples": 200,
  },
}
TASKS = ("ppl", "ruler", "icl", "recall")  # recall only for recall-trained runs
YARN_CHOICES = ("off", "on", "both", "all")


def _f(default, help: str):
  """A field with its description."""
  return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """The evaluation of one or more runs: tasks, lengths, YaRN settings, sizes, seeds and the
  files the tasks read. Frozen; lists given for the tuple fields are kept as tuples.

  Raises (at construction):
    FieldError (a ValueError): a value a field cannot take, or two fields that disagree.
  """

  tasks: tuple = _f(
    ("ppl", "ruler", "icl"), "the tasks to run, in order, each once: any of " + ", ".join(TASKS)
  )
  suite: str = _f("quick", "the sizes of the tasks: " + " | ".join(SUITES) + " (SUITES)")
  lengths: Optional[tuple] = _f(
    None,
    "perplexity (and recall) lengths in tokens, each >= 2; "
    "unset: the suite's multiples of the training length",
  )
  yarn: str = _f(
    "both",
    "off: none; on: yarn (factor L / T); both: none and yarn; all: none, "
    "yarn and yarn_fixed (one factor at every length; perplexity and recall)",
  )
  yarn_fixed_factor: Optional[float] = _f(
    None,
    "the yarn_fixed factor, > 1, with yarn='all'; unset: the longest length / the training length",
  )
  stride: Optional[float] = _f(
    None,
    "sliding-window perplexity: windows advance by this "
    "fraction of the length, in (0, 1]; unset: non-overlapping",
  )
  ppl_tokens: Optional[int] = _f(
    None, "perplexity targets scored per length and setting, >= 1; unset: the suite's"
  )
  ruler_lengths: Optional[tuple] = _f(
    None, "RULER lengths in tokens, each >= 2; unset: the suite's multiples of the training length"
  )
  recall_lengths: Optional[tuple] = _f(
    None, "lengths of the recall task, each >= 2; unset: lengths, or the suite's"
  )
  recall_samples: Optional[int] = _f(None, "recall test samples a length, >= 1; unset: the suite's")
  seed: int = _f(0, "seed of the RULER, ICL and recall samples, >= 0")
  chunk: int = _f(512, "block length of the chunked attention kernel evaluation uses, >= 1")
  data_path: Optional[str] = _f(
    None, "score perplexity on this text or parquet source instead of the run's held-out split"
  )
  squad: Optional[str] = _f(None, "a local SQuAD dev JSON file, for RULER qa_1")
  hotpot: Optional[str] = _f(None, "a local HotpotQA dev JSON file, for RULER qa_2")
  icl_tasks: Optional[str] = _f(None, "a JSON list of ICL task specs (LLM-Foundry JSONL files)")
  icl_specs: Optional[tuple] = _f(
    None,
    "the TaskSpecs read from icl_tasks (rove-eval reads and "
    "checks them before any run is restored); unset: read from "
    "icl_tasks when the ICL task runs",
  )
  progress: bool = _f(True, "progress bars on stderr")
  train_len: Optional[int] = _f(
    None,
    "model directories: the training length T that lengths "
    "and YaRN factors are relative to, >= 2; unset: the one the "
    "directory records",
  )
  tokenizer: Optional[str] = _f(
    None,
    "model directories without a tokenizer.json: the model's "
    "tokenizer (a tokenizer.json path, bytes or tiktoken:gpt2)",
  )

  def __post_init__(self):
    set_ = functools.partial(object.__setattr__, self)
    for name in ("tasks", "lengths", "ruler_lengths", "recall_lengths", "icl_specs"):
      if isinstance(getattr(self, name), list):
        set_(name, tuple(getattr(self, name)))
    _validate(self)


# --------------------------------------------------------------------------- validation

# A FieldError's message is a template in which a field is written <name> and a setting
# <name=value>, the value a Python literal, followed by the value given: str(error) spells them
# as fields (yarn_fixed_factor, yarn='all', got (1, 64)), as_flags() as rove-eval's options
# (--yarn-fixed-factor, --yarn all, got 1,64).
_NAMED = re.compile(r"<(\w+)(?:=([^>]*))?>")
_NOTHING = object()


def _as_flag_value(text: str) -> str:
  """A Python literal as the command line writes it: (4096, 8192) -> 4096,8192, 'all' -> all."""
  return text.strip("()").replace(", ", ",").replace("'", "")


def _render(template: str, flags: bool) -> str:
  def one(m):
    name, value = m.groups()
    if not flags:
      return name if value is None else f"{name}={value}"
    flag = "--" + name.replace("_", "-")
    return flag if value is None else f"{flag} {_as_flag_value(value)}"

  return _NAMED.sub(one, template)


def _show(value, flags: bool = False) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  text = repr(value) if isinstance(value, str) else str(value)
  return _as_flag_value(text) if flags and isinstance(value, tuple) else text


class FieldError(ValueError):
  """An EvalConfig field holds a value it cannot take; `field` names it."""

  def __init__(self, field: str, template: str, got=_NOTHING):
    self.field, self.template, self.got = field, template, got
    super().__init__(self._message(flags=False))

  def as_flags(self) -> str:
    """The message with rove-eval's option names in place of the field names."""
    return self._message(flags=True)

  def _message(self, flags: bool) -> str:
    text = _render(self.template, flags)
    return text if self.got is _NOTHING else f"{text}; got {_show(self.got, flags)}"


def _int(c: EvalConfig, name: str, low: int, what: str, example, *, optional: bool = True):
  value = getattr(c, name)
  if (value is None and optional) or (checks.is_int(value) and value >= low):
    return
  raise FieldError(name, f"<{name}> must be {what}, e.g. <{name}={example}>", value)


def _lengths(c: EvalConfig, name: str) -> None:
  value = getattr(c, name)
  if value is None or (
    isinstance(value, tuple) and value and all(checks.is_int(L) and L >= 2 for L in value)
  ):
    return
  raise FieldError(name, f"<{name}> must be token counts >= 2, e.g. <{name}=(4096, 8192)>", value)


def _choice(c: EvalConfig, name: str, choices) -> None:
  value = getattr(c, name)
  if not isinstance(value, str) or value not in choices:
    raise FieldError(name, f"<{name}> must be one of {', '.join(choices)}", value)


def _validate(c: EvalConfig) -> None:
  """Each field's check, one FieldError naming the field for the first that fails."""
  tasks = c.tasks
  if not (
    isinstance(tasks, tuple)
    and tasks
    and all(t in TASKS for t in tasks)
    and len(set(tasks)) == len(tasks)
  ):
    raise FieldError(
      "tasks",
      f"<tasks> must name one or more of {', '.join(TASKS)}, each "
      f"once, e.g. <tasks=('ppl', 'icl')>",
      tasks,
    )
  _choice(c, "suite", tuple(SUITES))
  _choice(c, "yarn", YARN_CHOICES)
  for name in ("lengths", "ruler_lengths", "recall_lengths"):
    _lengths(c, name)
  factor = c.yarn_fixed_factor
  if factor is not None:
    if not (checks.is_finite(factor) and factor > 1):
      raise FieldError(
        "yarn_fixed_factor",
        "<yarn_fixed_factor> must be a YaRN factor > 1, "
        "e.g. <yarn_fixed_factor=16> for 16x the training length",
        factor,
      )
    if c.yarn != "all":
      raise FieldError(
        "yarn_fixed_factor",
        f"<yarn_fixed_factor> applies to the yarn_fixed "
        f"setting, which only <yarn='all'> evaluates; got <yarn={c.yarn!r}>",
      )
  if c.stride is not None and not (checks.is_finite(c.stride) and 0 < c.stride <= 1):
    raise FieldError(
      "stride",
      "<stride> must be a fraction of the length in (0, 1], e.g. "
      "<stride=0.5> for windows that advance by half a length (leave it unset "
      "for non-overlapping windows)",
      c.stride,
    )
  _int(c, "ppl_tokens", 1, ">= 1 target a length", 16384)
  _int(c, "recall_samples", 1, ">= 1", 100)
  _int(c, "seed", 0, ">= 0", 0, optional=False)
  _int(c, "chunk", 1, "a block length >= 1 token", 512, optional=False)
  _int(c, "train_len", 2, ">= 2 tokens", 2048)
  for name in ("data_path", "squad", "hotpot", "icl_tasks", "tokenizer"):
    value = getattr(c, name)
    if value is not None and not (isinstance(value, str) and value):
      raise FieldError(
        name, f"<{name}> must be a path or spec (a non-empty string) or unset", value
      )
  specs = c.icl_specs
  if specs is not None and not (
    isinstance(specs, tuple) and all(isinstance(s, TaskSpec) for s in specs)
  ):
    raise FieldError(
      "icl_specs",
      "<icl_specs> must be a tuple of icl.TaskSpec (what icl.load_specs returns) or unset",
      specs,
    )
  if not isinstance(c.progress, (bool, np.bool_)):
    raise FieldError("progress", "<progress> must be True or False", c.progress)
