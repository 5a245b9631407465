"""ICL task specs: which task files to evaluate and how to prompt them.

Task specs: a JSON file holding a list of objects (or {"icl_tasks": [...]}, as in LLM-Foundry's
YAML), one a task:
  {"name": "hellaswag", "path": "hellaswag.jsonl", "kind": "multiple_choice",
   "num_fewshot": 10, "baseline": 0.25,
   "example_delimiter": "\\n", "continuation_delimiter": " ", "prompt_string": "",
   "scoring": "mean"}
Only name, path and kind are required. LLM-Foundry's names are accepted too (label,
dataset_uri, icl_task_type, random_baseline; num_fewshot may be a one-element list). A relative
path is taken from the spec file's folder. baseline is the random-guess accuracy as a fraction;
left out, it is the mean of 1 / (number of options) over the file (0 for language_modeling).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence

from rove_jax.evaluation import prompting

KINDS = ("multiple_choice", "language_modeling", "schema")
SCORINGS = ("mean", "sum")
_ALIASES = {
  "label": "name",
  "dataset_uri": "path",
  "icl_task_type": "kind",
  "random_baseline": "baseline",
}


# -------------------------------------------------------------------------------- task specs


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """One task file and how to prompt it (see the module docstring for the JSON form).

  Attributes:
    name: label in the results.
    path: JSONL file in the format of `kind`.
    kind: one of KINDS.
    num_fewshot: shots before each query.
    baseline: random-guess accuracy (fraction); None derives it from the file.
    example_delimiter: between the prompt string, the shots and the query.
    continuation_delimiter: between a context and its answer.
    prompt_string: text before everything (LLM-Foundry's preamble), "" for none.
    scoring: "mean" (per-token NLL, LLM-Foundry) or "sum" to rank choices.
  """

  name: str
  path: str
  kind: str
  num_fewshot: int = 0
  baseline: Optional[float] = None
  example_delimiter: str = "\n"
  continuation_delimiter: str = " "
  prompt_string: str = ""
  scoring: str = "mean"

  def __post_init__(self):
    where = f"task spec {self.name!r}"
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"task spec name={self.name!r} must be a non-empty string")
    if not isinstance(self.path, str) or not self.path:
      raise ValueError(f"{where}: path={self.path!r} must be the path of a JSONL file")
    if self.kind not in KINDS:
      raise ValueError(f"{where}: kind={self.kind!r} is not one of {', '.join(KINDS)}")
    if (
      isinstance(self.num_fewshot, bool)
      or not isinstance(self.num_fewshot, int)
      or self.num_fewshot < 0
    ):
      raise ValueError(f"{where}: num_fewshot={self.num_fewshot!r} must be an int >= 0")
    if self.baseline is not None:
      if (
        isinstance(self.baseline, bool)
        or not isinstance(self.baseline, (int, float))
        or not 0.0 <= self.baseline < 1.0
      ):
        raise ValueError(
          f"{where}: baseline={self.baseline!r} must be a fraction in [0, 1) (divide a "
          f"percentage by 100) or null to derive it from the file"
        )
    for field in ("example_delimiter", "continuation_delimiter", "prompt_string"):
      if not isinstance(getattr(self, field), str):
        raise ValueError(f"{where}: {field}={getattr(self, field)!r} must be a string")
    if self.scoring not in SCORINGS:
      raise ValueError(f"{where}: scoring={self.scoring!r} is not one of {', '.join(SCORINGS)}")

  @classmethod
  def from_dict(
    cls, entry: Mapping[str, Any], *, base_dir: Optional[str] = None, where: str = "task spec"
  ) -> "TaskSpec":
    """Builds a spec from its JSON object, accepting LLM-Foundry's field names.

    Args:
      entry: the object (see the module docstring).
      base_dir: folder that a relative path is taken from (None: as given).
      where: how errors name the entry.

    Returns:
      The TaskSpec.
    """
    if not isinstance(entry, Mapping):
      raise ValueError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in entry.items():
      field = _ALIASES.get(key, key)
      if field not in fields:
        raise ValueError(
          f"{where}: unknown field {key!r}; allowed: {', '.join(sorted(fields | set(_ALIASES)))}"
        )
      if field in kwargs:
        raise ValueError(f"{where}: field {field!r} is given twice (once as {key!r})")
      kwargs[field] = value
    for field in ("name", "path", "kind"):
      if field not in kwargs:
        raise ValueError(f"{where}: missing required field {field!r}")
    shots = kwargs.get("num_fewshot")
    if isinstance(shots, list):
      # LLM-Foundry lists shot counts; one run here evaluates one count.
      if len(shots) != 1:
        raise ValueError(
          f"{where}: num_fewshot={shots!r}: give one count per spec (copy the "
          f"spec with another name for each count)"
        )
      kwargs["num_fewshot"] = shots[0]
    if (
      base_dir is not None and isinstance(kwargs["path"], str) and not os.path.isabs(kwargs["path"])
    ):
      kwargs["path"] = os.path.join(base_dir, kwargs["path"])
    try:
      return cls(**kwargs)
    except ValueError as err:
      raise ValueError(f"{where}: {err}") from None


def load_task_specs(path: str) -> list[TaskSpec]:
  """Reads a JSON list of task specs (or {"icl_tasks": [...]}); relative paths are taken from
  the spec file's folder.

  Args:
    path: the JSON file.

  Returns:
    The specs, in file order.
  """
  data = prompting.read_json(path)
  if isinstance(data, Mapping) and "icl_tasks" in data:
    data = data["icl_tasks"]
  if not isinstance(data, list):
    raise ValueError(f'{path}: expected a JSON list of task specs (or {{"icl_tasks": [...]}})')
  base_dir = os.path.dirname(os.path.abspath(path))
  specs = [
    TaskSpec.from_dict(entry, base_dir=base_dir, where=f"{path}, task spec {i}")
    for i, entry in enumerate(data)
  ]
  _check_unique(specs)
  return specs


# The name the evaluation CLI uses.
load_specs = load_task_specs


def _check_unique(specs: Sequence[TaskSpec]) -> None:
  names = [spec.name for spec in specs]
  duplicates = sorted({name for name in names if names.count(name) > 1})
  if duplicates:
    raise ValueError(f"task names must be unique; repeated: {', '.join(duplicates)}")


def as_specs(specs) -> list[TaskSpec]:
  if isinstance(specs, (str, os.PathLike)):
    return load_task_specs(os.fspath(specs))
  if isinstance(specs, (TaskSpec, Mapping)):
    specs = [specs]
  out = [
    spec if isinstance(spec, TaskSpec) else TaskSpec.from_dict(spec, where=f"task spec {i}")
    for i, spec in enumerate(specs)
  ]
  _check_unique(out)
  return out
