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

This module holds the spec of each type (its keys, checks and `_frequencies`); their base
RopeScaling, the dict parser and the rope_type registry are rove_jax.scaling_base's.
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
from rove_jax.scaling_base import ALIASES as _ALIASES
from rove_jax.scaling_base import SPECS, RopeScaling, register
from rove_jax.scaling_values import KEYS

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


@register
@dataclasses.dataclass(frozen=True, repr=False)
class DefaultScaling(RopeScaling):
  """Plain RoPE: theta_m = base^(-2m / rot_dim)."""

  rope_type: ClassVar[str] = "default"

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return default(rot_dim, base=base)


@register
@dataclasses.dataclass(frozen=True, repr=False)
class LinearScaling(RopeScaling):
  """Position interpolation: every frequency divided by the factor."""

  rope_type: ClassVar[str] = "linear"
  factor: Optional[float] = None  # the context extension s

  def _check(self):
    check_factor("linear", self._need("factor"))

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return linear(rot_dim, base=base, factor=self.factor)


@register
@dataclasses.dataclass(frozen=True, repr=False)
class NTKScaling(RopeScaling):
  """NTK-aware scaling: the base raised so the lowest frequency interpolates by the factor."""

  rope_type: ClassVar[str] = "ntk"
  factor: Optional[float] = None

  def _check(self):
    check_factor("ntk", self._need("factor"))

  def _frequencies(self, rot_dim, base, max_len, seq_len):
    return ntk(rot_dim, base=base, factor=self.factor)


@register
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


@register
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


@register
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


@register
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


@register
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


@register
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


@register
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
