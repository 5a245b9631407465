"""RoPE scaling as transformers writes it (a v4 `rope_scaling` or v5 `rope_parameters` dict),
parsed once into one small frozen spec per rope_type, each with its own `frequencies`.

  RopeScaling            the base every spec shares: rope_theta, partial_rotary_factor, the dict
                         forms (`from_dict`, the one parser of transformers' dicts; `to_dict`)
  DefaultScaling         "default" (and v4 "mrope")   LinearScaling      "linear" ("pi")
  NTKScaling             "ntk" ("ntk_aware")          DynamicNTKScaling  "dynamic" ("dynamic_ntk")
  YarnScaling            "yarn"                       DynamicYarnScaling "dynamic_yarn"
  Llama3Scaling          "llama3"                     LongRopeScaling    "longrope"
  ProportionalScaling    "proportional"               AxialScaling       "axial"

`RopeScaling(rope_type="yarn", factor=4.0)` builds the spec of that type (here a YarnScaling),
as `RopeScaling.from_dict({"type": "yarn", "factor": 4.0})` does from a dict. GPTConfig holds
one, model calls take one to override it, and `spec.frequencies(...)` computes the frequency
table and attention factor with the functions of rove_jax.frequencies (re-exported here:
`scaling.yarn`, `scaling.llama3`, ...). `from_config` does both steps for a dict in one call.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, Mapping, Optional

from rove_jax.frequencies import (
  ScalingResult,
  axial,
  check_factor,
  default,
  dynamic_ntk,
  dynamic_yarn,
  linear,
  llama3,
  longrope,
  ntk,
  proportional,
  yarn,
  yarn_correction_range,
)
from rove_jax.scaling_values import COMMON_KEYS as _COMMON_KEYS
from rove_jax.scaling_values import CONVERT as _CONVERT
from rove_jax.scaling_values import KEYS
from rove_jax.scaling_values import as_float as _as_float

__all__ = [
  "RopeScaling",
  "from_config",
  "ROPE_TYPES",
  "SPECS",
  "KEYS",
  "DefaultScaling",
  "LinearScaling",
  "NTKScaling",
  "DynamicNTKScaling",
  "YarnScaling",
  "DynamicYarnScaling",
  "Llama3Scaling",
  "LongRopeScaling",
  "ProportionalScaling",
  "AxialScaling",
  "ScalingResult",
  "axial",
  "default",
  "dynamic_ntk",
  "dynamic_yarn",
  "linear",
  "llama3",
  "longrope",
  "ntk",
  "proportional",
  "yarn",
  "yarn_correction_range",
]

# "mrope" is Qwen2-VL's v4 name for default RoPE over (t, h, w) sections; transformers 5 renames
# it "default" and so do we (for text positions the sections change nothing).
_ALIASES = {"dynamic_ntk": "dynamic", "pi": "linear", "ntk_aware": "ntk", "mrope": "default"}
SPECS: dict = {}  # rope_type -> its spec class, filled by _register in the order below


class _Dispatch(type):
  """Construction by keywords, with the keys checked: `RopeScaling(rope_type=..., **keys)`
  builds the spec class of rope_type; a key the type does not read is a ValueError (a None one
  is unset and dropped)."""

  def __call__(cls, **keys):
    if cls is RopeScaling:
      cls = _spec_class(keys.pop("rope_type", "default"))
    own = {f.name for f in dataclasses.fields(cls)}
    keys = {k: v for k, v in keys.items() if v is not None or k in own}
    unread = sorted(set(keys) - own)
    if unread:
      raise ValueError(
        f"rope_scaling of type {cls.rope_type!r} got unknown keys {unread}; "
        f"accepted keys: {cls.type_keys()} (plus {', '.join(_COMMON_KEYS)}). "
        f"Leave them out, or pass strict=False (from_dict, from_config) to "
        f"ignore them with a warning, as transformers does"
      )
    return type.__call__(cls, **keys)


@dataclasses.dataclass(frozen=True, repr=False)
class RopeScaling(metaclass=_Dispatch):
  """One RoPE-scaling setting: the base of the per-type specs (module docstring).

  Frozen and hashable: a GPTConfig field and a valid static argument of jax.jit; equal specs
  are of one type with equal keys. The fields are the dict's keys as transformers spells them;
  None is unset (the type's default, or a value `frequencies` resolves from the model).
  `RopeScaling()` is plain RoPE. Construction checks everything that does not depend on the
  model: the type, the keys it reads (a key it does not read is an error), the value types and
  ranges, the keys it cannot do without; `frequencies` checks the rest (rot_dim, lengths).

    spec = RopeScaling.from_dict({"type": "yarn", "factor": 4.0})  # once
    inv_freq, attention_factor = spec.frequencies(64, base=1e4, max_len=1024, seq_len=4096)
    spec.to_dict()  # {"rope_type": "yarn", "factor": 4.0}: JSON-ready, from_dict reads it back
  """

  rope_type: ClassVar[str] = ""
  rope_theta: Optional[float] = None  # the RoPE base; overrides the caller's `base`
  partial_rotary_factor: Optional[float] = None  # the turning fraction of the head, in (0, 1]

  def __post_init__(self):
    for name, value in self._items():
      object.__setattr__(self, name, _CONVERT.get(name, _as_float)(name, value))
    if self.rope_theta is not None and not self.rope_theta > 1.0:
      raise ValueError(
        f"rope_scaling: rope_theta (the RoPE base) must be > 1, got {self.rope_theta!r}"
      )
    if self.partial_rotary_factor is not None and not 0.0 < self.partial_rotary_factor <= 1.0:
      raise ValueError(
        f"rope_scaling: partial_rotary_factor must be a number in (0, 1], got "
        f"{self.partial_rotary_factor!r}"
      )
    self._check()

  def _check(self) -> None:
    """The type's checks that need no model shape, made at construction."""

  def _frequencies(self, rot_dim: int, base: float, max_len, seq_len) -> ScalingResult:
    raise NotImplementedError

  @classmethod
  def type_keys(cls) -> list:
    """The keys this type reads beside _COMMON_KEYS, sorted."""
    return sorted(
      f.name
      for f in dataclasses.fields(cls)
      if f.name not in ("rope_theta", "partial_rotary_factor")
    )

  def _items(self):
    return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)]

  def _need(self, key):
    value = getattr(self, key)
    if value is None:
      raise ValueError(f"rope_scaling of type {self.rope_type!r} needs the key {key!r}")
    return value

  def _original(self, max_len) -> int:
    """original_max_position_embeddings, else the model's max_len."""
    value = getattr(self, "original_max_position_embeddings", None) or max_len
    if value is None:
      raise ValueError(
        f"rope_scaling {self.rope_type!r} needs 'original_max_position_embeddings' "
        f"in the dict or max_len= (the model's training context)"
      )
    return value

  def _seq_len(self, seq_len):
    if seq_len is None:
      raise ValueError(
        f"rope_scaling of type {self.rope_type!r} depends on the current length: pass seq_len="
      )
    return seq_len

  def _set(self, *names) -> dict:
    """The named keys that are set, as keyword arguments of the type's function."""
    return {k: getattr(self, k) for k in names if getattr(self, k) is not None}

  def __repr__(self):
    return f"RopeScaling({', '.join(f'{k}={v!r}' for k, v in self._ordered())})"

  def _ordered(self):
    """(key, value) of rope_type and the set keys, in KEYS order."""
    items = dict(self._items(), rope_type=self.rope_type)
    return [(k, items[k]) for k in KEYS if items.get(k) is not None]

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
      raise ValueError(
        f"rope_scaling must be a dict (e.g. {{'rope_type': 'yarn', 'factor': "
        f"4.0, ...}}), a RopeScaling or None, got {type(rope).__name__}: {rope!r}"
      )
    cfg = {str(key): value for key, value in rope.items()}
    spec = _spec_class(cfg.get("rope_type") or cfg.get("type") or "default")
    accepted = set(spec.type_keys()) | set(_COMMON_KEYS)
    unknown = sorted(set(cfg) - accepted)
    if unknown and strict:
      raise ValueError(
        f"rope_scaling of type {spec.rope_type!r} got unknown keys {unknown}; "
        f"accepted keys: {spec.type_keys()} (plus {', '.join(_COMMON_KEYS)}). "
        f"Pass strict=False to ignore them with a warning, as transformers does"
      )
    if unknown:
      warnings.warn(
        f"rope_scaling of type {spec.rope_type!r}: ignoring keys {unknown}, which "
        f"this type does not read (transformers ignores them too)",
        stacklevel=2,
      )
    return spec(
      **{k: v for k, v in cfg.items() if k in accepted and k not in ("rope_type", "type")}
    )

  def to_dict(self) -> dict:
    """rope_type and the set keys as a plain, JSON-ready dict (lists for the factor lists),
    rope_type first: what run configs, checkpoint metadata and reports hold. `from_dict` reads
    it back to an equal spec."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in self._ordered()}

  @classmethod
  def coerce(cls, value) -> Optional["RopeScaling"]:
    """None or a RopeScaling as is; a dict through `from_dict`.

    Raises:
      ValueError: anything else, or a bad dict.
    """
    if value is None or isinstance(value, RopeScaling):
      return value
    return RopeScaling.from_dict(value)

  # ----------------------------------------------------------------- frequencies
  def frequencies(
    self,
    rot_dim: int,
    *,
    base: float = 10000.0,
    max_len: Optional[int] = None,
    seq_len=None,
    head_dim: Optional[int] = None,
  ) -> ScalingResult:
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
    if self.partial_rotary_factor is not None and head_dim is not None:
      self._check_partial(rot_dim, head_dim)
    base = base if self.rope_theta is None else self.rope_theta
    return self._frequencies(rot_dim, base, max_len, seq_len)

  def _check_partial(self, rot_dim: int, head_dim: int) -> None:
    partial = self.partial_rotary_factor
    if int(head_dim * partial) != rot_dim:
      raise ValueError(
        f"rope_scaling: partial_rotary_factor={partial} of head_dim={head_dim} "
        f"turns int({head_dim} * {partial}) = {int(head_dim * partial)} dims, but "
        f"rot_dim={rot_dim}; pass rot_dim={int(head_dim * partial)}, or drop the "
        f"key"
      )


def _register(cls):
  SPECS[cls.rope_type] = cls
  return cls


def _spec_class(rope_type) -> type:
  if not isinstance(rope_type, str):
    raise ValueError(
      f"rope_scaling: rope_type must be a string, one of {sorted(ROPE_TYPES)}; "
      f"got {type(rope_type).__name__}: {rope_type!r}"
    )
  spec = SPECS.get(_ALIASES.get(rope_type, rope_type))
  if spec is None:
    raise ValueError(f"unknown rope_type {rope_type!r}; expected one of {sorted(ROPE_TYPES)}")
  return spec


# ------------------------------------------------------------------------- the specs


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class DefaultScaling(RopeScaling):
  """Plain RoPE: theta_m = base^(-2m / rot_dim)."""

  rope_type: ClassVar[str] = "default"

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return default(rot_dim, base=base)


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class LinearScaling(RopeScaling):
  """Position interpolation: every frequency divided by the factor."""

  rope_type: ClassVar[str] = "linear"
  factor: Optional[float] = None  # the context extension s

  def _check(self):
    check_factor("linear", self._need("factor"))

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return linear(rot_dim, base=base, factor=self.factor)


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class NTKScaling(RopeScaling):
  """NTK-aware scaling: the base raised so the lowest frequency interpolates by the factor."""

  rope_type: ClassVar[str] = "ntk"
  factor: Optional[float] = None

  def _check(self):
    check_factor("ntk", self._need("factor"))

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return ntk(rot_dim, base=base, factor=self.factor)


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class DynamicNTKScaling(RopeScaling):
  """NTK scaling that grows with the current length past max_len."""

  rope_type: ClassVar[str] = "dynamic"
  factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None  # used only without max_len

  def _check(self):
    check_factor("dynamic_ntk", self._need("factor"))

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    original = self.original_max_position_embeddings
    if max_len is not None and original is not None and original != max_len:
      warnings.warn(
        f"dynamic rope: original_max_position_embeddings={original} is ignored; "
        f"like transformers, the scaling starts at max_len={max_len} (the model's "
        f"max_position_embeddings)",
        stacklevel=3,
      )
    return dynamic_ntk(
      rot_dim,
      base=base,
      factor=self.factor,
      original_max_len=max_len or self._original(max_len),
      seq_len=self._seq_len(seq_len),
    )


@dataclasses.dataclass(frozen=True, repr=False)
class _YarnKeys(RopeScaling):
  """The keys yarn and dynamic_yarn share."""

  factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None  # L0, the training context
  beta_fast: Optional[float] = None  # turns above which pairs extrapolate (32)
  beta_slow: Optional[float] = None  # turns below which pairs interpolate (1)
  truncate: Optional[bool] = None  # floor / ceil the correction range (True)
  attention_factor: Optional[float] = None  # overrides the computed factor
  mscale: Optional[float] = None  # DeepSeek-style attention factor ...
  mscale_all_dim: Optional[float] = None  # ... get_mscale(s, mscale) / get_mscale(s, all_dim)

  def _check(self):
    fast = 32.0 if self.beta_fast is None else self.beta_fast
    slow = 1.0 if self.beta_slow is None else self.beta_slow
    if not fast > slow > 0:
      raise ValueError(
        f"yarn: need beta_fast > beta_slow > 0, got beta_fast={fast}, beta_slow={slow}"
      )

  def _options(self) -> dict:
    return self._set(
      "beta_fast", "beta_slow", "truncate", "attention_factor", "mscale", "mscale_all_dim"
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class YarnScaling(_YarnKeys):
  """YaRN: interpolation by the factor on slow pairs, extrapolation on fast ones, and an
  attention factor."""

  rope_type: ClassVar[str] = "yarn"

  def _check(self):
    if self.factor is not None:
      check_factor("yarn", self.factor)
    super()._check()

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    factor = self.factor
    if factor is None:
      factor = self._need("factor") if max_len is None else max_len / self._original(max_len)
    return yarn(
      rot_dim, base=base, factor=factor, original_max_len=self._original(max_len), **self._options()
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class DynamicYarnScaling(_YarnKeys):
  """YaRN whose factor is the current length over the training context."""

  rope_type: ClassVar[str] = "dynamic_yarn"

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return dynamic_yarn(
      rot_dim,
      base=base,
      original_max_len=self._original(max_len),
      seq_len=self._seq_len(seq_len),
      **self._options(),
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class Llama3Scaling(RopeScaling):
  """Llama 3.1: low frequencies interpolated by the factor, high ones kept, a ramp between."""

  rope_type: ClassVar[str] = "llama3"
  factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None
  low_freq_factor: Optional[float] = None  # (1)
  high_freq_factor: Optional[float] = None  # (4)

  def _check(self):
    check_factor("llama3", self._need("factor"))
    low = 1.0 if self.low_freq_factor is None else self.low_freq_factor
    high = 4.0 if self.high_freq_factor is None else self.high_freq_factor
    if not high > low > 0:
      raise ValueError(
        f"llama3: need high_freq_factor > low_freq_factor > 0, got "
        f"low_freq_factor={low}, high_freq_factor={high}"
      )

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return llama3(
      rot_dim,
      base=base,
      factor=self.factor,
      original_max_len=self._original(max_len),
      **self._set("low_freq_factor", "high_freq_factor"),
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class LongRopeScaling(RopeScaling):
  """LongRoPE (Phi-3): per-pair rescale factors, short up to the training context, long past
  it."""

  rope_type: ClassVar[str] = "longrope"
  short_factor: Optional[tuple] = None  # per-pair rescale up to L0
  long_factor: Optional[tuple] = None  # per-pair rescale beyond L0
  factor: Optional[float] = None
  original_max_position_embeddings: Optional[int] = None
  attention_factor: Optional[float] = None

  def _check(self):
    for key in ("short_factor", "long_factor"):
      if not all(x > 0 for x in self._need(key)):
        raise ValueError(f"longrope: {key} entries must be positive")
    if self.factor is not None:
      check_factor("longrope", self.factor, minimum=0.0)

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return longrope(
      rot_dim,
      base=base,
      short_factor=self.short_factor,
      long_factor=self.long_factor,
      original_max_len=self._original(max_len),
      factor=self.factor,
      max_len=max_len,
      seq_len=seq_len,
      attention_factor=self.attention_factor,
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class ProportionalScaling(RopeScaling):
  """Gemma-style partial rotary: rot_dim is the whole head and partial_rotary_factor picks how
  many pairs turn."""

  rope_type: ClassVar[str] = "proportional"
  factor: Optional[float] = None

  def _check(self):
    if self.factor is not None and not self.factor > 0:
      raise ValueError(f"proportional: factor must be > 0, got factor={self.factor!r}")

  def _check_partial(self, rot_dim, head_dim):
    if rot_dim != head_dim:
      raise ValueError(
        f"rope_scaling 'proportional' rotates the whole head: rot_dim must be "
        f"head_dim={head_dim}, got rot_dim={rot_dim} (partial_rotary_factor="
        f"{self.partial_rotary_factor} picks how many pairs turn)"
      )

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    partial = 1.0 if self.partial_rotary_factor is None else self.partial_rotary_factor
    return proportional(
      rot_dim, base=base, partial_rotary_factor=partial, factor=self.factor or 1.0
    )


@_register
@dataclasses.dataclass(frozen=True, repr=False)
class AxialScaling(RopeScaling):
  """Per-axis tables for 2-D positions (images)."""

  rope_type: ClassVar[str] = "axial"

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return axial(rot_dim, base=base)


ROPE_TYPES = tuple(SPECS) + tuple(_ALIASES)


def from_config(
  rope_scaling: RopeScaling | Mapping[str, Any] | None,
  rot_dim: int,
  *,
  base: float = 10000.0,
  max_len: int | None = None,
  seq_len=None,
  head_dim: int | None = None,
  strict: bool = True,
) -> ScalingResult:
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
  spec = (
    rope_scaling
    if isinstance(rope_scaling, RopeScaling)
    else RopeScaling.from_dict(rope_scaling, strict=strict)
  )
  return spec.frequencies(rot_dim, base=base, max_len=max_len, seq_len=seq_len, head_dim=head_dim)
