"""RopeScaling: one RoPE-scaling setting as transformers writes it (a v4 `rope_scaling` or v5
`rope_parameters` dict), parsed once into typed, hashable fields. GPTConfig holds one, model
calls take one to override it, and `RopeScaling.frequencies` computes the frequency table and
attention factor with the functions of rove_jax.frequencies (re-exported here: `scaling.yarn`,
`scaling.llama3`, ...). `from_config` does both steps for a dict in one call.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Any, Mapping, Optional

import numpy as np

from rove_jax.frequencies import (ScalingResult, axial, default, dynamic_ntk, dynamic_yarn, linear,
                                  llama3, longrope, ntk, proportional, yarn,
                                  yarn_correction_range)
from rove_jax.frequencies import check_factor

__all__ = ["RopeScaling", "from_config", "ROPE_TYPES", "ScalingResult", "axial", "default",
           "dynamic_ntk", "dynamic_yarn", "linear", "llama3", "longrope", "ntk", "proportional",
           "yarn", "yarn_correction_range"]


# ------------------------------------------------------------- RopeScaling: transformers' dicts

# Keys each rope_type reads, beside _COMMON_KEYS.
_HF_KEYS = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
             "attention_factor", "mscale", "mscale_all_dim"),
    "dynamic_yarn": ("original_max_position_embeddings", "beta_fast", "beta_slow", "truncate",
                     "attention_factor", "mscale", "mscale_all_dim", "factor"),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
               "high_freq_factor"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings",
                 "attention_factor"),
    "proportional": ("factor",),
    "axial": (),
}
# Read by every type: transformers v5 keeps rope_theta and partial_rotary_factor in the dict.
_COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
# "mrope" is Qwen2-VL's v4 name for default RoPE over (t, h, w) sections; transformers 5 renames
# it "default" and so do we (for text positions the sections change nothing).
_ALIASES = {"dynamic_ntk": "dynamic", "pi": "linear", "ntk_aware": "ntk", "mrope": "default"}
ROPE_TYPES = tuple(_HF_KEYS) + tuple(_ALIASES)
# RopeScaling's fields by kind of value (each is the dict key of the same name).
_FLOAT_FIELDS = ("factor", "rope_theta", "partial_rotary_factor", "beta_fast", "beta_slow",
                 "attention_factor", "mscale", "mscale_all_dim", "low_freq_factor",
                 "high_freq_factor")
_LIST_FIELDS = ("short_factor", "long_factor")
# The name each type's own function gives in its messages.
_FUNCTION_NAMES = {"dynamic": "dynamic_ntk", "dynamic_yarn": "yarn"}


@dataclasses.dataclass(frozen=True, repr=False)
class RopeScaling:
  """One RoPE-scaling setting: a transformers-style rope dict, parsed once into typed fields.

  Frozen and hashable: a GPTConfig field and a valid static argument of jax.jit. The fields are
  the dict's keys as transformers spells them; None is unset (the type's default, or a value
  `frequencies` resolves from the model). `RopeScaling()` is plain RoPE. Construction checks
  everything that does not depend on the model: the type, the keys it reads (a key it does not
  read is an error), the value types and ranges, the keys it cannot do without; `frequencies`
  checks the rest (rot_dim, lengths). Aliases are stored by their transformers-5 name ("pi" as
  "linear", "mrope" as "default").

    spec = RopeScaling.from_dict({"type": "yarn", "factor": 4.0})  # once
    inv_freq, attention_factor = spec.frequencies(64, base=1e4, max_len=1024, seq_len=4096)
    spec.to_dict()  # {"rope_type": "yarn", "factor": 4.0}: JSON-ready, from_dict reads it back
  """
  rope_type: str = "default"  # one of ROPE_TYPES
  factor: Optional[float] = None  # the context extension s
  original_max_position_embeddings: Optional[int] = None  # L0, the training context
  rope_theta: Optional[float] = None  # the RoPE base; overrides the caller's `base`
  partial_rotary_factor: Optional[float] = None  # the turning fraction of the head, in (0, 1]
  beta_fast: Optional[float] = None  # yarn: turns above which pairs extrapolate (32)
  beta_slow: Optional[float] = None  # yarn: turns below which pairs interpolate (1)
  truncate: Optional[bool] = None  # yarn: floor / ceil the correction range (True)
  attention_factor: Optional[float] = None  # yarn, longrope: overrides the computed factor
  mscale: Optional[float] = None  # yarn: DeepSeek-style attention factor ...
  mscale_all_dim: Optional[float] = None  # ... get_mscale(s, mscale) / get_mscale(s, all_dim)
  low_freq_factor: Optional[float] = None  # llama3 (1)
  high_freq_factor: Optional[float] = None  # llama3 (4)
  short_factor: Optional[tuple] = None  # longrope: per-pair rescale up to L0
  long_factor: Optional[tuple] = None  # longrope: per-pair rescale beyond L0

  def __post_init__(self):
    set_ = functools.partial(object.__setattr__, self)
    rope_type = self.rope_type
    if not isinstance(rope_type, str):
      raise ValueError(f"rope_scaling: rope_type must be a string, one of {sorted(ROPE_TYPES)}; "
                       f"got {type(rope_type).__name__}: {rope_type!r}")
    rope_type = _ALIASES.get(rope_type, rope_type)
    if rope_type not in _HF_KEYS:
      raise ValueError(f"unknown rope_type {rope_type!r}; expected one of {sorted(ROPE_TYPES)}")
    set_("rope_type", rope_type)
    for name in _FLOAT_FIELDS:
      set_(name, _as_float(name, getattr(self, name)))
    for name in _LIST_FIELDS:
      set_(name, _as_floats(name, getattr(self, name)))
    set_("original_max_position_embeddings", _as_length(self.original_max_position_embeddings))
    if self.truncate is not None:
      if not isinstance(self.truncate, (bool, np.bool_)):
        raise ValueError(f"rope_scaling['truncate'] must be true or false, got "
                         f"{type(self.truncate).__name__}: {self.truncate!r}")
      set_("truncate", bool(self.truncate))
    unread = sorted(name for name, value in self._items()
                    if value is not None and name not in _HF_KEYS[rope_type] + _COMMON_KEYS)
    if unread:
      raise ValueError(f"rope_scaling of type {rope_type!r} got unknown keys {unread}; accepted "
                       f"keys: {sorted(_HF_KEYS[rope_type])} (plus {', '.join(_COMMON_KEYS)}). "
                       f"Leave them out, or pass strict=False (from_dict, from_config) to "
                       f"ignore them with a warning, as transformers does")
    self._check_values()

  def _items(self):
    return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

  def _check_values(self) -> None:
    """The checks of the type's function that need no model shape, made at construction."""
    rope_type, name = self.rope_type, _FUNCTION_NAMES.get(self.rope_type, self.rope_type)
    if self.rope_theta is not None and not self.rope_theta > 1.0:
      raise ValueError(f"rope_scaling: rope_theta (the RoPE base) must be > 1, got "
                       f"{self.rope_theta!r}")
    if self.partial_rotary_factor is not None and not 0.0 < self.partial_rotary_factor <= 1.0:
      raise ValueError(f"rope_scaling: partial_rotary_factor must be a number in (0, 1], got "
                       f"{self.partial_rotary_factor!r}")
    if rope_type in ("linear", "ntk", "dynamic", "llama3"):
      self._need("factor")
    if rope_type in ("linear", "ntk", "dynamic", "llama3", "yarn") and self.factor is not None:
      check_factor(name, self.factor)
    if rope_type in ("yarn", "dynamic_yarn"):
      fast = 32.0 if self.beta_fast is None else self.beta_fast
      slow = 1.0 if self.beta_slow is None else self.beta_slow
      if not fast > slow > 0:
        raise ValueError(f"yarn: need beta_fast > beta_slow > 0, got beta_fast={fast}, "
                         f"beta_slow={slow}")
    if rope_type == "llama3":
      low = 1.0 if self.low_freq_factor is None else self.low_freq_factor
      high = 4.0 if self.high_freq_factor is None else self.high_freq_factor
      if not high > low > 0:
        raise ValueError(f"llama3: need high_freq_factor > low_freq_factor > 0, got "
                         f"low_freq_factor={low}, high_freq_factor={high}")
    if rope_type == "longrope":
      for key in _LIST_FIELDS:
        if not all(x > 0 for x in self._need(key)):
          raise ValueError(f"longrope: {key} entries must be positive")
      if self.factor is not None:
        check_factor("longrope", self.factor, minimum=0.0)
    if rope_type == "proportional" and self.factor is not None and not self.factor > 0:
      raise ValueError(f"proportional: factor must be > 0, got factor={self.factor!r}")

  def _need(self, key):
    value = getattr(self, key)
    if value is None:
      raise ValueError(f"rope_scaling of type {self.rope_type!r} needs the key {key!r}")
    return value

  def __repr__(self):
    return f"RopeScaling({', '.join(f'{k}={v!r}' for k, v in self._items() if v is not None)})"

  # ------------------------------------------------------------------ dict forms
  @classmethod
  def from_dict(cls, rope: Mapping[str, Any], *, strict: bool = True) -> "RopeScaling":
    """Parses a transformers-style rope dict: a v4 `rope_scaling` ({"type": "linear", "factor":
    2.0}) or a v5 `rope_parameters` as a model config holds it ({"rope_type": "yarn",
    "rope_theta": 1e6, "partial_rotary_factor": 0.5, "factor": 4.0, ...}); "type" is read as
    "rope_type" (which wins when both are given), a missing type is "default", and a key set to
    None is unset.

    Args:
      rope: the dict.
      strict: keys this rope_type does not read are errors (default: a typo in a hand-written
        config fails loudly). False ignores them with a warning, as transformers does (it warns
        "Unrecognized keys" and goes on), e.g. mrope_section, or attention_factor on linear.

    Raises:
      ValueError: not a dict, an unknown rope_type, unknown keys (strict), bad values.
    """
    if not isinstance(rope, Mapping):
      raise ValueError(f"rope_scaling must be a dict (e.g. {{'rope_type': 'yarn', 'factor': "
                       f"4.0, ...}}), a RopeScaling or None, got {type(rope).__name__}: {rope!r}")
    cfg = {str(key): value for key, value in rope.items()}
    rope_type = cfg.get("rope_type") or cfg.get("type") or "default"
    if not (isinstance(rope_type, str) and _ALIASES.get(rope_type, rope_type) in _HF_KEYS):
      return cls(rope_type=rope_type)  # the constructor names the problem
    rope_type = _ALIASES.get(rope_type, rope_type)
    accepted = _HF_KEYS[rope_type]
    unknown = sorted(set(cfg) - set(accepted) - set(_COMMON_KEYS))
    if unknown and strict:
      raise ValueError(f"rope_scaling of type {rope_type!r} got unknown keys {unknown}; accepted "
                       f"keys: {sorted(accepted)} (plus {', '.join(_COMMON_KEYS)}). Pass "
                       f"strict=False to ignore them with a warning, as transformers does")
    if unknown:
      warnings.warn(f"rope_scaling of type {rope_type!r}: ignoring keys {unknown}, which this "
                    f"type does not read (transformers ignores them too)", stacklevel=2)
    fields = {k: v for k, v in cfg.items()
              if k not in ("rope_type", "type") and k not in unknown}
    return cls(rope_type=rope_type, **fields)

  def to_dict(self) -> dict:
    """The set fields as a plain, JSON-ready dict (lists for the factor lists), rope_type
    first: what run configs, checkpoint metadata and reports hold. `from_dict` reads it back
    to an equal RopeScaling."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in self._items() if v is not None}

  @classmethod
  def coerce(cls, value) -> Optional["RopeScaling"]:
    """None or a RopeScaling as is; a dict through `from_dict`.

    Raises:
      ValueError: anything else, or a bad dict.
    """
    if value is None or isinstance(value, cls):
      return value
    return cls.from_dict(value)

  # ----------------------------------------------------------------- frequencies
  def frequencies(self, rot_dim: int, *, base: float = 10000.0, max_len: Optional[int] = None,
                  seq_len=None, head_dim: Optional[int] = None) -> ScalingResult:
    """(inv_freq, attention_factor) of a head, values resolved as transformers 5 resolves them:
      rope_theta       when set, overrides `base`.
      partial_rotary_factor  rot_dim is the caller's: it already says how many dims turn. With
        `head_dim` given the factor must agree, int(head_dim * factor) == rot_dim
        (transformers' rounding), else ValueError; without it it is not checked.
        "proportional" is the exception: there rot_dim is the whole head and the factor says
        how many pairs turn. `rope_from_hf_config` derives rot_dim from the model config.
      original_max_position_embeddings  defaults to max_len (llama3, yarn, longrope).
      dynamic          scales from max_len (transformers' max_position_embeddings);
        original_max_position_embeddings, which transformers ignores, is used only without
        max_len.
      yarn             an unset factor is max_len / original (DeepSeek-V3).
      longrope         the factor, else max_len / original, sets the attention factor.

    Args:
      rot_dim: rotated dims per head (the whole head for "proportional").
      base: RoPE base when rope_theta is unset.
      max_len: the model's max_position_embeddings.
      seq_len: current sequence length (may be traced), needed by "dynamic", "dynamic_yarn"
        and "longrope".
      head_dim: the head dimension, to check partial_rotary_factor against rot_dim.

    Returns:
      (inv_freq, attention_factor); for "axial" inv_freq is a pair of per-axis tables.

    Raises:
      ValueError: a length the type needs is missing, or rot_dim does not fit the setting.
    """
    rope_type = self.rope_type
    if self.rope_theta is not None:
      base = self.rope_theta
    partial = self._partial_factor(rot_dim, head_dim)

    def original_len():
      value = self.original_max_position_embeddings or max_len
      if value is None:
        raise ValueError(f"rope_scaling {rope_type!r} needs 'original_max_position_embeddings' "
                         f"in the dict or max_len= (the model's training context)")
      return value

    def need_seq_len():
      if seq_len is None:
        raise ValueError(f"rope_scaling of type {rope_type!r} depends on the current length: "
                         f"pass seq_len=")
      return seq_len

    yarn_opts = {k: getattr(self, k) for k in ("beta_fast", "beta_slow", "truncate",
                                               "attention_factor", "mscale", "mscale_all_dim")
                 if getattr(self, k) is not None}
    if rope_type == "default":
      return default(rot_dim, base=base)
    if rope_type == "linear":
      return linear(rot_dim, base=base, factor=self.factor)
    if rope_type == "ntk":
      return ntk(rot_dim, base=base, factor=self.factor)
    if rope_type == "dynamic":
      original = self.original_max_position_embeddings
      if max_len is not None and original is not None and original != max_len:
        warnings.warn(f"dynamic rope: original_max_position_embeddings={original} is ignored; "
                      f"like transformers, the scaling starts at max_len={max_len} (the model's "
                      f"max_position_embeddings)", stacklevel=2)
      return dynamic_ntk(rot_dim, base=base, factor=self.factor,
                         original_max_len=max_len or original_len(), seq_len=need_seq_len())
    if rope_type == "yarn":
      factor = self.factor
      if factor is None:
        factor = self._need("factor") if max_len is None else max_len / original_len()
      return yarn(rot_dim, base=base, factor=factor, original_max_len=original_len(),
                  **yarn_opts)
    if rope_type == "dynamic_yarn":
      return dynamic_yarn(rot_dim, base=base, original_max_len=original_len(),
                          seq_len=need_seq_len(), **yarn_opts)
    if rope_type == "llama3":
      return llama3(rot_dim, base=base, factor=self.factor, original_max_len=original_len(),
                    **{k: getattr(self, k) for k in ("low_freq_factor", "high_freq_factor")
                       if getattr(self, k) is not None})
    if rope_type == "proportional":
      return proportional(rot_dim, base=base, partial_rotary_factor=partial,
                          factor=self.factor or 1.0)
    if rope_type == "axial":
      return axial(rot_dim, base=base)
    return longrope(rot_dim, base=base, short_factor=self.short_factor,
                    long_factor=self.long_factor, original_max_len=original_len(),
                    factor=self.factor, max_len=max_len, seq_len=seq_len,
                    attention_factor=self.attention_factor)

  def _partial_factor(self, rot_dim, head_dim) -> float:
    """partial_rotary_factor (1.0 when unset), checked against rot_dim and head_dim."""
    partial = self.partial_rotary_factor
    if partial is None:
      return 1.0
    if head_dim is None:
      return partial
    if self.rope_type == "proportional":
      if rot_dim != head_dim:
        raise ValueError(f"rope_scaling 'proportional' rotates the whole head: rot_dim must be "
                         f"head_dim={head_dim}, got rot_dim={rot_dim} (partial_rotary_factor="
                         f"{partial} picks how many pairs turn)")
    elif int(head_dim * partial) != rot_dim:
      raise ValueError(f"rope_scaling: partial_rotary_factor={partial} of head_dim={head_dim} "
                       f"turns int({head_dim} * {partial}) = {int(head_dim * partial)} dims, but "
                       f"rot_dim={rot_dim}; pass rot_dim={int(head_dim * partial)}, or drop the "
                       f"key")
    return partial


def _as_float(name: str, value) -> Optional[float]:
  if value is None:
    return None
  if isinstance(value, (bool, np.bool_)) or not isinstance(
      value, (int, float, np.integer, np.floating)):
    raise ValueError(f"rope_scaling[{name!r}] must be a number, got {type(value).__name__}: "
                     f"{value!r}")
  if not math.isfinite(value):
    raise ValueError(f"rope_scaling[{name!r}] must be a finite number, got {value!r}")
  return float(value)


def _as_floats(name: str, value) -> Optional[tuple]:
  if value is None:
    return None
  if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
    raise ValueError(f"rope_scaling[{name!r}] must be a list of numbers, got "
                     f"{type(value).__name__}: {value!r}")
  return tuple(_as_float(f"{name}[{i}]", x) for i, x in enumerate(value))


def _as_length(value) -> Optional[int]:
  name = "original_max_position_embeddings"
  if value is None:
    return None
  ok = isinstance(value, (int, float, np.integer, np.floating)) \
      and not isinstance(value, (bool, np.bool_)) and math.isfinite(value) \
      and value == int(value) and value > 0
  if not ok:
    raise ValueError(f"rope_scaling[{name!r}] must be a positive int (the training context), got "
                     f"{type(value).__name__}: {value!r}")
  return int(value)


def from_config(rope_scaling: RopeScaling | Mapping[str, Any] | None, rot_dim: int, *,
                base: float = 10000.0, max_len: int | None = None, seq_len=None,
                head_dim: int | None = None, strict: bool = True) -> ScalingResult:
  """Frequencies and attention factor of a RopeScaling or a transformers-style rope dict:
  `RopeScaling.from_dict(rope_scaling, strict=strict).frequencies(rot_dim, ...)` (see both for
  how the dict is read and its values resolved).

  Args:
    rope_scaling: None (plain RoPE), a RopeScaling, or a v4 `rope_scaling` / v5
      `rope_parameters` dict.
    rot_dim: rotated dims per head (the whole head for "proportional").
    base: RoPE base when the setting has no rope_theta.
    max_len: the model's max_position_embeddings.
    seq_len: current sequence length, needed by "dynamic", "dynamic_yarn" and "longrope".
    head_dim: the head dimension, to check partial_rotary_factor against rot_dim.
    strict: for a dict, keys its rope_type does not read are errors; False ignores them with
      a warning, as transformers does.

  Returns:
    (inv_freq, attention_factor); for "axial" inv_freq is a pair of per-axis tables.

  Raises:
    ValueError: unknown rope_type, unknown keys (strict), missing keys, bad values.
  """
  if rope_scaling is None:
    return default(rot_dim, base=base)
  spec = rope_scaling if isinstance(rope_scaling, RopeScaling) else RopeScaling.from_dict(
      rope_scaling, strict=strict)
  return spec.frequencies(rot_dim, base=base, max_len=max_len, seq_len=seq_len,
                          head_dim=head_dim)
