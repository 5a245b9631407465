"""The RoPE-scaling family's frequency tables: context extension by changing the table.

Every function returns (inv_freq [rot_dim // 2] float32, attention_factor). The attention
factor multiplies the rotated dims of q and k, exactly as HuggingFace's `attention_scaling`
multiplies cos and sin (so the logits by attention_factor**2 at full rotary; the pass-through
dims of a partial rotary head are not scaled). `rope_attention` / `rove_attention` apply it
(through rove_jax.rotary.Rope); the value and output rotations never see it and stay
orthogonal.

Definitions follow HuggingFace transformers' `modeling_rope_utils` and the YaRN authors' code:
  linear       Position Interpolation: inv_freq / factor.
  ntk          NTK-aware base change: base * factor^(d / (d - 2)).
  dynamic_ntk  NTK with factor' = factor * L / L0 - (factor - 1) for the current length L > L0.
  yarn         per-pair blend of extrapolation and interpolation by a linear ramp over the pair
               index between the correction dims of beta_fast and beta_slow rotations, and the
               attention factor 0.1 ln(s) + 1 for s > 1.
  dynamic_yarn yarn with s = max(1, L / L0).
  llama3       wavelength bands: high frequencies kept, low ones / factor, a smooth band between.
  longrope     per-pair rescale factors, short or long list by the current length.
  proportional (Gemma-style) the whole head's table over base^(-2m/D), zero beyond a fraction.
  axial        (Qwen3-VL vision) two tables, one per image axis, over half the dims each.

rove_jax.scaling re-exports them beside RopeScaling, the typed setting that picks one.

Static arguments are computed in float64 with numpy and rounded once, and the table comes back
as a numpy float32 array (no JAX backend is started: config validation relies on that). The
dynamic variants also accept a traced `seq_len` (e.g. inside a jitted decoding loop) and then
compute with jax.numpy and return a jax array.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rove_jax import rotary

ScalingResult = tuple[Any, Any]  # (inv_freq: np.ndarray or jax.Array, factor)


def _xp(*values):
  """numpy for static Python/numpy values (exact float64), jax.numpy once anything is traced."""
  return jnp if any(isinstance(v, jax.Array) for v in values) else np


def _pair_exponents(rot_dim: int, xp) -> Any:
  return xp.arange(0, rot_dim, 2, dtype=xp.float32 if xp is jnp else np.float64) / rot_dim


def _finish(inv_freq, attention_factor) -> ScalingResult:
  """Rounds the table to float32 once. A static table stays a numpy array, so building and
  validating a model config never starts a JAX backend; a traced one stays jax."""
  if isinstance(attention_factor, (np.floating, np.ndarray)):
    attention_factor = float(attention_factor)
  if isinstance(inv_freq, jax.Array):
    return inv_freq.astype(jnp.float32), attention_factor
  return np.asarray(inv_freq, dtype=np.float32), attention_factor


def check_factor(name: str, factor, minimum: float = 1.0) -> None:
  if isinstance(factor, jax.Array):
    return  # traced: the caller's responsibility; checked where static
  if not (isinstance(factor, (int, float, np.integer, np.floating)) and factor >= minimum):
    raise ValueError(f"{name}: factor must be a number >= {minimum}, got factor={factor!r}")


def _check_len(name: str, what: str, value) -> None:
  if isinstance(value, jax.Array):
    return
  if not (isinstance(value, (int, float, np.integer, np.floating)) and value > 0):
    raise ValueError(f"{name}: {what} must be a positive number, got {what}={value!r}")


def _base_table(rot_dim: int, base, xp):
  if xp is jnp:
    return xp.power(base, -_pair_exponents(rot_dim, xp))
  return float(base) ** -_pair_exponents(rot_dim, xp)


def default(rot_dim: int, *, base: float = 10000.0) -> ScalingResult:
  """Plain RoPE: (rope_frequencies(rot_dim, base), 1.0), as a numpy table."""
  rot_dim = rotary._check_rot_dim(rot_dim)
  if not base > 1.0:
    raise ValueError(f"rope base must be > 1, got base={base!r}")
  return _finish(_base_table(rot_dim, base, np), 1.0)


def linear(rot_dim: int, *, base: float = 10000.0, factor: float) -> ScalingResult:
  """Position Interpolation (Chen et al. 2023): every frequency divided by `factor`."""
  rot_dim = rotary._check_rot_dim(rot_dim)
  check_factor("linear", factor)
  return _finish(_base_table(rot_dim, base, np) / float(factor), 1.0)


def ntk(rot_dim: int, *, base: float = 10000.0, factor: float) -> ScalingResult:
  """NTK-aware scaling: the base becomes base * factor^(d / (d - 2)).

  The highest frequency is unchanged and the lowest is divided by exactly `factor`.
  """
  rot_dim = rotary._check_rot_dim(rot_dim)
  check_factor("ntk", factor)
  if rot_dim < 4:
    raise ValueError(f"ntk: rot_dim must be >= 4 (the exponent d / (d - 2)), got {rot_dim}")
  new_base = float(base) * float(factor) ** (rot_dim / (rot_dim - 2))
  return _finish(_base_table(rot_dim, new_base, np), 1.0)


def dynamic_ntk(
  rot_dim: int, *, base: float = 10000.0, factor: float, original_max_len: int, seq_len
) -> ScalingResult:
  """Dynamic NTK (HuggingFace "dynamic"): the NTK base grows with the current length.

  base' = base * (factor * L / L0 - (factor - 1))^(d / (d - 2)) with L = max(seq_len, L0), so
  the table is the plain one up to L0.
  """
  rot_dim = rotary._check_rot_dim(rot_dim)
  check_factor("dynamic_ntk", factor)
  _check_len("dynamic_ntk", "original_max_len", original_max_len)
  _check_len("dynamic_ntk", "seq_len", seq_len)
  if rot_dim < 4:
    raise ValueError(f"dynamic_ntk: rot_dim must be >= 4, got {rot_dim}")
  xp = _xp(seq_len, factor)
  length = xp.maximum(
    xp.asarray(seq_len, dtype=xp.float32 if xp is jnp else np.float64), original_max_len
  )
  new_base = base * (factor * length / original_max_len - (factor - 1)) ** (rot_dim / (rot_dim - 2))
  return _finish(_base_table(rot_dim, new_base, xp), 1.0)


def _yarn_mscale(scale, mscale, xp):
  """0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (YaRN's attention temperature)."""
  if xp is np:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
  scale = jnp.asarray(scale, jnp.float32)
  return jnp.where(scale > 1, 0.1 * mscale * jnp.log(jnp.maximum(scale, 1.0)) + 1.0, 1.0)


def yarn_correction_range(
  rot_dim: int,
  *,
  base: float,
  original_max_len: int,
  beta_fast: float,
  beta_slow: float,
  truncate: bool = True,
) -> tuple[float, float]:
  """The pair indices (low, high) between which YaRN ramps from extrapolation to interpolation.

  Pair m completes L0 / (2 pi base^(2m/d)) turns over the original context L0; the correction
  dim for r turns solves that for m: d ln(L0 / (2 pi r)) / (2 ln base). With truncate, low is
  floored and high ceiled; the range is clipped to [0, d - 1] as in the reference code.
  """

  def correction_dim(turns):
    return rot_dim * math.log(original_max_len / (turns * 2 * math.pi)) / (2 * math.log(base))

  low, high = correction_dim(beta_fast), correction_dim(beta_slow)
  if truncate:
    low, high = math.floor(low), math.ceil(high)
  return max(low, 0), min(high, rot_dim - 1)


def yarn(
  rot_dim: int,
  *,
  base: float = 10000.0,
  factor,
  original_max_len: int,
  beta_fast: float = 32.0,
  beta_slow: float = 1.0,
  truncate: bool = True,
  attention_factor: float | None = None,
  mscale: float | None = None,
  mscale_all_dim: float | None = None,
) -> ScalingResult:
  """YaRN (Peng et al. 2024), as defined by HuggingFace transformers and the authors' code.

  Args:
    rot_dim: rotated dims d.
    base: RoPE base.
    factor: the context extension s (e.g. eval_len / train_len). May be traced.
    original_max_len: L0, the context the model was trained at.
    beta_fast, beta_slow: turn counts bounding the ramp (pairs turning more than beta_fast
      times over L0 extrapolate, fewer than beta_slow interpolate).
    truncate: floor/ceil the correction range (reference default).
    attention_factor: overrides the computed factor when given.
    mscale, mscale_all_dim: DeepSeek-style factor get_mscale(s, mscale) / get_mscale(s, all).

  Returns:
    (inv_freq [d/2], attention_factor) with attention_factor = 0.1 ln(s) + 1 for s > 1.
  """
  rot_dim = rotary._check_rot_dim(rot_dim)
  check_factor("yarn", factor)
  _check_len("yarn", "original_max_len", original_max_len)
  if not beta_fast > beta_slow > 0:
    raise ValueError(
      f"yarn: need beta_fast > beta_slow > 0, got beta_fast={beta_fast}, beta_slow={beta_slow}"
    )
  xp = _xp(factor)
  if attention_factor is None:
    if mscale and mscale_all_dim:
      attention_factor = _yarn_mscale(factor, mscale, xp) / _yarn_mscale(factor, mscale_all_dim, xp)
    else:
      attention_factor = _yarn_mscale(factor, 1.0, xp)
  low, high = yarn_correction_range(
    rot_dim,
    base=base,
    original_max_len=original_max_len,
    beta_fast=beta_fast,
    beta_slow=beta_slow,
    truncate=truncate,
  )
  if low == high:
    high += 0.001  # the reference's guard against a zero-width ramp
  # The ramp does not depend on the factor: numpy float64 always.
  ramp = np.clip((np.arange(rot_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
  extrapolation_weight = 1.0 - ramp
  extrapolated = _base_table(rot_dim, base, np)
  if xp is np:
    interpolated = extrapolated / float(factor)
  else:
    extrapolated = jnp.asarray(extrapolated, jnp.float32)
    extrapolation_weight = jnp.asarray(extrapolation_weight, jnp.float32)
    interpolated = extrapolated / factor
  inv_freq = interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight
  return _finish(inv_freq, attention_factor)


def dynamic_yarn(
  rot_dim: int, *, base: float = 10000.0, original_max_len: int, seq_len, **yarn_kwargs
) -> ScalingResult:
  """YaRN with the factor taken from the current length: s = max(1, seq_len / original_max_len)."""
  _check_len("dynamic_yarn", "seq_len", seq_len)
  _check_len("dynamic_yarn", "original_max_len", original_max_len)
  if isinstance(seq_len, jax.Array):
    factor = jnp.maximum(1.0, seq_len.astype(jnp.float32) / original_max_len)
  else:
    factor = max(1.0, seq_len / original_max_len)
  return yarn(rot_dim, base=base, factor=factor, original_max_len=original_max_len, **yarn_kwargs)


def llama3(
  rot_dim: int,
  *,
  base: float = 500000.0,
  factor: float,
  original_max_len: int,
  low_freq_factor: float = 1.0,
  high_freq_factor: float = 4.0,
) -> ScalingResult:
  """Llama 3.1 scaling: wavelengths shorter than L0 / high_freq_factor are kept, longer than
  L0 / low_freq_factor divided by `factor`, and the band between blends the two smoothly."""
  rot_dim = rotary._check_rot_dim(rot_dim)
  check_factor("llama3", factor)
  _check_len("llama3", "original_max_len", original_max_len)
  if not high_freq_factor > low_freq_factor > 0:
    raise ValueError(
      f"llama3: need high_freq_factor > low_freq_factor > 0, got "
      f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor}"
    )
  inv_freq = _base_table(rot_dim, base, np)
  wavelen = 2 * np.pi / inv_freq
  low_freq_wavelen = original_max_len / low_freq_factor
  high_freq_wavelen = original_max_len / high_freq_factor
  smooth = (original_max_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
  blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  out = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
  medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
  return _finish(np.where(medium, blended, out), 1.0)


def longrope(
  rot_dim: int,
  *,
  base: float = 10000.0,
  short_factor: Sequence[float],
  long_factor: Sequence[float],
  original_max_len: int,
  factor: float | None = None,
  max_len: int | None = None,
  seq_len=None,
  attention_factor: float | None = None,
) -> ScalingResult:
  """LongRoPE (Phi-3): inv_freq = base^(-2m/d) / ext[m], ext = long_factor when the current
  length exceeds L0, else short_factor.

  The extension factor is `factor` when given, else max_len / original_max_len when max_len is
  given (Phi-3 configs state no factor), else 1, as in transformers 5; the attention factor
  defaults to sqrt(1 + ln(factor) / ln(L0)) for factor > 1.
  """
  rot_dim = rotary._check_rot_dim(rot_dim)
  _check_len("longrope", "original_max_len", original_max_len)
  short = np.asarray(short_factor, dtype=np.float64)
  long = np.asarray(long_factor, dtype=np.float64)
  for name, arr in (("short_factor", short), ("long_factor", long)):
    if arr.shape != (rot_dim // 2,):
      raise ValueError(
        f"longrope: {name} must have rot_dim / 2 = {rot_dim // 2} entries, got "
        f"{arr.shape[0] if arr.ndim == 1 else arr.shape}"
      )
    if not np.all(arr > 0):
      raise ValueError(f"longrope: {name} entries must be positive")
  if factor is None:
    factor = 1.0 if max_len is None else max_len / original_max_len
  check_factor("longrope", factor, minimum=0.0)
  if attention_factor is None:
    attention_factor = (
      1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original_max_len))
    )
  table = _base_table(rot_dim, base, np)
  if seq_len is None:
    return _finish(table / short, attention_factor)
  if isinstance(seq_len, jax.Array):
    use_long = seq_len > original_max_len
    inv = jnp.where(
      use_long, jnp.asarray(table / long, jnp.float32), jnp.asarray(table / short, jnp.float32)
    )
    return _finish(inv, attention_factor)
  return _finish(table / (long if seq_len > original_max_len else short), attention_factor)


def proportional(
  rot_dim: int, *, base: float = 10000.0, partial_rotary_factor: float = 1.0, factor: float = 1.0
) -> ScalingResult:
  """transformers' "proportional" RoPE (Gemma 4): rot_dim is the whole head D; the first
  int(partial_rotary_factor * D // 2) pairs turn at base^(-2m/D) / factor (exponents over D, not
  over the turning dims) and the other pairs get frequency 0, i.e. do not turn."""
  rot_dim = rotary._check_rot_dim(rot_dim)
  if not 0.0 <= partial_rotary_factor <= 1.0:
    raise ValueError(
      f"proportional: partial_rotary_factor must be in [0, 1], got {partial_rotary_factor!r}"
    )
  if not factor > 0:
    raise ValueError(f"proportional: factor must be > 0, got factor={factor!r}")
  turning = int(partial_rotary_factor * rot_dim // 2)
  table = _base_table(rot_dim, base, np)
  table[turning:] = 0.0
  return _finish(table / float(factor), 1.0)


def axial(rot_dim: int, *, base: float = 10000.0) -> tuple[tuple[np.ndarray, np.ndarray], float]:
  """transformers' "axial" RoPE (Qwen3-VL vision): two equal tables, one per image axis (height
  then width), each the plain table of rot_dim / 2 dims. Rotating with positions [..., T, 2] and
  layout="half" matches transformers' concatenated (h, w) cos / sin."""
  rot_dim = rotary._check_rot_dim(rot_dim)
  if rot_dim % 4:
    raise ValueError(f"axial: rot_dim must be a multiple of 4 (two axes of pairs), got {rot_dim}")
  table = _finish(_base_table(rot_dim // 2, base, np), 1.0)[0]
  return (table, table.copy()), 1.0
