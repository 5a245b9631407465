"""RopeScaling, the base every rope-type spec of rove_jax.scaling shares, and the registry that
builds a spec by its rope_type.

  RopeScaling     rope_theta and partial_rotary_factor (the keys every type reads), the checks
                  made at construction, the dict forms (`from_dict`, the one parser of
                  transformers' v4 `rope_scaling` and v5 `rope_parameters` dicts; `to_dict`,
                  `coerce`) and `frequencies`, which resolves the shared keys and calls the
                  type's own `_frequencies`
  SPECS           rope_type -> its spec class, filled by `register` (rove_jax.scaling registers
                  every type when it is imported, and rove_jax's __init__ imports it)
  ALIASES         the other names transformers gives a type ("pi", "ntk_aware", "mrope", ...)

`RopeScaling(rope_type="yarn", factor=4.0)` builds the registered class of that type through the
metaclass `_Dispatch`, which also refuses keys the type does not read.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, Mapping, Optional

from rove_jax.frequencies import ScalingResult
from rove_jax.scaling_values import COMMON_KEYS as _COMMON_KEYS
from rove_jax.scaling_values import CONVERT as _CONVERT
from rove_jax.scaling_values import KEYS
from rove_jax.scaling_values import as_float as _as_float

__all__ = ["RopeScaling", "SPECS", "ALIASES", "register", "spec_class", "rope_types"]

# "mrope" is Qwen2-VL's v4 name for default RoPE over (t, h, w) sections; transformers 5 renames
# it "default" and so do we (for text positions the sections change nothing).
ALIASES = {"dynamic_ntk": "dynamic", "pi": "linear", "ntk_aware": "ntk", "mrope": "default"}
SPECS: dict = {}  # rope_type -> its spec class, filled by `register`, in rove_jax.scaling's order


class _Dispatch(type):
  """Construction by keywords, with the keys checked: `RopeScaling(rope_type=..., **keys)`
  builds the spec class of rope_type; a key the type does not read is a ValueError (a None one
  is unset and dropped)."""

  def __call__(cls, **keys):
    if cls is RopeScaling:
      cls = spec_class(keys.pop("rope_type", "default"))
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
  """One RoPE-scaling setting: the base of the per-type specs (rove_jax.scaling lists them).

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
    spec = spec_class(cfg.get("rope_type") or cfg.get("type") or "default")
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


def register(cls):
  """Class decorator: records a spec class in SPECS under its rope_type."""
  SPECS[cls.rope_type] = cls
  return cls


def rope_types() -> tuple:
  """Every rope_type name RopeScaling takes: the registered types, then their aliases."""
  return tuple(SPECS) + tuple(ALIASES)


def spec_class(rope_type) -> type:
  """The registered spec class of a rope_type or one of its aliases.

  Raises:
    ValueError: not a string, or an unknown type.
  """
  if not isinstance(rope_type, str):
    raise ValueError(
      f"rope_scaling: rope_type must be a string, one of {sorted(rope_types())}; "
      f"got {type(rope_type).__name__}: {rope_type!r}"
    )
  spec = SPECS.get(ALIASES.get(rope_type, rope_type))
  if spec is None:
    raise ValueError(f"unknown rope_type {rope_type!r}; expected one of {sorted(rope_types())}")
  return spec
