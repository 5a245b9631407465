"""The run config from a command line: a config file whose `get_config()` returns a RunConfig
(rove_jax.train.config_file.load_file, re-exported here), then `--config.a.b=value` overrides
applied to it by each field's type (`apply`).

A value is parsed by the type its field declares: bools (true/false, 1/0, yes/no), ints,
floats, strings, None for an optional field, a list for a tuple field (`0,2` or `[0, 2]`), and
model.rope_scaling's keys each by what transformers' rope dicts hold (`rope_type=yarn`,
`factor=4`). An unknown key is named with the closest known one and the fields of its section;
a bad value with the type it needs. RunConfig's constructor then checks the whole.

Three fields follow another unless set (run_config.FOLLOWERS): model.n_kv_head follows
model.n_head (multi-head), model.d_ff is 4 * model.d_model, and model.max_len follows
data.seq_len. A field follows when the config holds the followed value for it, so
`--config.model.d_model=256` on the tiny preset gives d_ff 1024 and `--config.data.seq_len=512`
a context of 512.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import typing
from typing import Any, Iterable, Optional

from rove_jax import scaling
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train.config_file import load_file  # noqa: F401 - callers use overrides.load_file
from rove_jax.train.run_config import SECTIONS, RunConfig

HELP = "rove-train --help-config lists every field"
# model.rope_scaling's keys by what their values are; the rest are numbers
_SCALING_TYPES = {
  "rope_type": str,
  "truncate": bool,
  "original_max_position_embeddings": int,
  "short_factor": tuple,
  "long_factor": tuple,
}
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
MISSING = type("MissingValue", (), {"__repr__": lambda self: "MISSING"})()  # --config.KEY, no =


# ------------------------------------------------------------------------ overrides


def split(args: Iterable[str]) -> list[tuple[str, Any]]:
  """[(key, value)] of the `--config.KEY=VALUE` arguments among `args` (MISSING for a
  `--config.KEY` without a value)."""
  out = []
  for arg in args:
    if arg.startswith("--config."):
      key, eq, value = arg[len("--config.") :].partition("=")
      out.append((key, value if eq else MISSING))
  return out


def _shown(key: str, value) -> str:
  return f"--config.{key}" + ("" if value is MISSING else f"={value}")


def apply(c: RunConfig, overrides) -> RunConfig:
  """`c` with each (key, value) override set: a list of pairs or a {key: value} dict. A string
  value is parsed by its field's type (as written after `--config.KEY=`); any other value is
  taken as it is, for RunConfig's constructor to check. The parsed values are set together,
  in order, by `RunConfig.updated` (which also moves the fields that follow another).

  Raises:
    ValueError: an unknown key, a section given a value, a value its field cannot take, or an
      invalid config (every problem of the keys and values at once, each naming the override).
  """
  overrides = list(overrides.items() if isinstance(overrides, dict) else overrides)
  settings, problems = [], []
  for key, value in overrides:
    try:
      settings.append(_parsed(key, value))
    except ValueError as e:
      problems.append(f"{_shown(key, value)}: {e}")
  if problems:
    raise ValueError("; ".join(problems))
  try:
    return c.updated(settings)
  except ValueError as e:
    shown = [_shown(k, v) for k, v in overrides if _section_of(k) is None]
    raise ValueError(f"{e} (with {' '.join(shown)})" if shown else str(e)) from None


def _section_of(key: str) -> Optional[type]:
  """The section class a top-level key names (model, data, ...), or None for a field."""
  return {"model": GPTConfig, **SECTIONS}.get(key)


def field_value(key: str, value: Any) -> Any:
  """`value` as `apply` sets field `key`: a string parsed by the field's type, anything else as
  it is. Raises ValueError naming the override (`--config.KEY=VALUE: ...`)."""
  try:
    return _parsed(key, value)[1]
  except ValueError as e:
    raise ValueError(f"{_shown(key, value)}: {e}") from None


def problem(key: str, value: Any = MISSING) -> Optional[str]:
  """Why `--config.KEY=VALUE` cannot be applied to a config, or None (checks the key and the
  value's type, not the whole config)."""
  try:
    field_value(key, value)
  except ValueError as e:
    return str(e)
  return None


def _parsed(key: str, value: Any) -> tuple[tuple[str, ...], Any]:
  """(the field's path, `value` parsed by the field's type, in RunConfig.to_dict's form) of a
  dotted key. Raises ValueError: what is wrong with the key or the value."""
  parts = key.split(".")
  cls = RunConfig
  for i, part in enumerate(parts):
    here = ".".join(parts[:i]) or "the config"
    if cls is scaling.RopeScaling:
      return tuple(parts), _scaling_value(parts[i:], value)
    if cls is None:
      raise ValueError(
        f"{here} is a field, not a section: it has no {part!r}; set --config.{here}=VALUE"
      )
    names = [f.name for f in dataclasses.fields(cls)]
    if part not in names:
      close = difflib.get_close_matches(part, names, n=1, cutoff=0.5)
      hint = (
        f"did you mean --config.{'.'.join(parts[:i] + close + parts[i + 1 :])}?"
        if close
        else f"{here} has: {', '.join(sorted(names))}"
      )
      raise ValueError(f"{here} has no field {part!r}; {hint} ({HELP})")
    kind = typing.get_type_hints(cls)[part]
    inner = [t for t in typing.get_args(kind) if t is not type(None)]
    optional = type(None) in typing.get_args(kind)
    kind = inner[0] if inner else kind
    if i < len(parts) - 1:
      cls = _section(kind)
      continue
    if value is MISSING:
      raise ValueError(f"no value: give --config.{key}=VALUE")
    if _section(kind) is None:
      return tuple(parts), parse(value, kind, optional) if isinstance(value, str) else value
    if kind is scaling.RopeScaling and (
      value is None or str(value).strip() in ("None", "none", "{}")
    ):
      return tuple(parts), None
    if isinstance(value, _section(kind)):  # a whole section, from Python
      return tuple(parts), (
        value.to_dict() if hasattr(value, "to_dict") else dataclasses.asdict(value)
      )
    if kind is scaling.RopeScaling and isinstance(value, dict):
      return tuple(parts), dict(value)
    example = {
      "model.rope_scaling": " (e.g. --config.model.rope_scaling.rope_type=yarn "
      "--config.model.rope_scaling.factor=4)"
    }.get(key, "")
    raise ValueError(
      f"{key} is a section, not a field; set its fields one by one, "
      f"--config.{key}.FIELD=VALUE{example}"
    )
  raise AssertionError("unreachable: the loop returns at the last part")


def _section(kind) -> Optional[type]:
  if kind is GPTConfig or kind in SECTIONS.values() or kind is scaling.RopeScaling:
    return kind
  return None


def _scaling_value(parts: list[str], value: Any):
  """A model.rope_scaling key's value parsed by what transformers' rope dicts hold (None:
  the key removed)."""
  name = parts[0]
  if len(parts) > 1:
    raise ValueError(f"model.rope_scaling.{name} is a field, not a section")
  if name not in scaling.KEYS:
    close = difflib.get_close_matches(name, scaling.KEYS, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
      f"model.rope_scaling has no key {name!r}; {hint}its keys are {', '.join(scaling.KEYS)}"
    )
  if value is MISSING:
    raise ValueError(f"no value: give --config.model.rope_scaling.{name}=VALUE")
  parsed = parse(value, _SCALING_TYPES.get(name, float), True) if isinstance(value, str) else value
  return list(parsed) if isinstance(parsed, tuple) else parsed


def parse(text: str, kind, optional: bool = False):
  """`text` as a value of type `kind` (bool, int, float, str or tuple); "None" for an optional
  field. Raises ValueError naming what the field takes."""
  if optional and text.strip() in ("None", "none", "null"):
    return None
  unset = " or None" if optional else ""
  if kind is bool:
    low = text.strip().lower()
    if low in _TRUE or low in _FALSE:
      return low in _TRUE
    raise ValueError(f"{text!r} is not a bool: give true or false{unset}")
  if kind is int:
    try:
      return int(text.strip().replace("_", ""))
    except ValueError:
      raise ValueError(f"{text!r} is not an int{unset}") from None
  if kind is float:
    try:
      return float(text)
    except ValueError:
      raise ValueError(f"{text!r} is not a number{unset}") from None
  if kind is tuple:
    body = text.strip()
    try:
      value = ast.literal_eval(body if body[:1] in "[(" else f"[{body}]")
    except (ValueError, SyntaxError):
      raise ValueError(
        f"{text!r} is not a list: give numbers separated by commas, e.g. 0,2{unset}"
      ) from None
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)
  text = text.strip()
  if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
    text = text[1:-1]  # a value quoted for the shell twice
  return text
