"""Rotary position math: frequency tables, rotations by position, dense R_t.

Shape letters used in this module:
  T  sequence length            H  heads            D  head dimension
  P  rotary pairs (len of the frequency table, 2P <= D)
  A  position axes (1 for text, 2 for images, 3 for video)
  ...  any leading batch dimensions

R_t is block diagonal: pair m of the rotated dims turns by the angle t * inv_freq[m] with
[[cos, -sin], [sin, cos]]. Which two coordinates form pair m is the layout:
  "interleaved": (x[2m], x[2m+1])          (RoFormer, GPT-J, the RoVE paper)
  "half":        (x[m], x[m + P])           (GPT-NeoX, Llama, HuggingFace)
Dims beyond 2P pass through unchanged (partial rotary).

Multi-axis positions (2-D / 3-D RoPE): positions carry a trailing axis [..., T, A] and the
frequency table is a sequence of A tables; axis a's angles fill the next len(table_a) pairs,
so (R_m q).(R_n k) depends only on n - m, axis by axis.

`Rope` bundles one rotary setup (tables, attention factor, layout) for rove_jax.attention.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from rove_jax.kernels import platform

LAYOUTS = ("interleaved", "half")

# A frequency table: one array [P] for 1-D positions, or a tuple of A arrays for A-axis positions.
Frequencies = Union[jax.Array, np.ndarray, Sequence[Union[jax.Array, np.ndarray]]]


def rope_frequencies(rot_dim: int, *, base: float = 10000.0) -> jax.Array:
  """The RoPE frequency table theta_m = base^(-2m / rot_dim), m = 0 .. rot_dim/2 - 1.

  Args:
    rot_dim: number of rotated dims (even, > 0).
    base: the RoPE base (> 1).

  Returns:
    inv_freq [rot_dim // 2] float32, computed in float64 then rounded once.
  """
  rot_dim = _check_rot_dim(rot_dim)
  if not base > 1.0:
    raise ValueError(f"rope base must be > 1, got base={base!r}")
  exponent = np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim
  return jnp.asarray(float(base) ** -exponent, dtype=jnp.float32)


def axial_frequencies(rot_dim: int, n_axes: int, *, base: float = 10000.0) -> tuple[jax.Array, ...]:
  """Frequency tables for multi-axis RoPE: the rotated dims split evenly among the axes.

  Each axis gets the full RoPE spectrum over its share of dims (rot_dim / n_axes), the usual
  2-D RoPE for images (axes = row, column) and 3-D RoPE for video (time, row, column).

  Returns:
    a tuple of n_axes tables, each [rot_dim // (2 * n_axes)].
  """
  if not (isinstance(n_axes, (int, np.integer)) and n_axes >= 1):
    raise ValueError(f"n_axes must be a positive int, got {n_axes!r}")
  rot_dim = _check_rot_dim(rot_dim)
  if rot_dim % (2 * n_axes):
    raise ValueError(
      f"rot_dim={rot_dim} cannot be split evenly into {n_axes} axes of rotation pairs: "
      f"it must be a multiple of 2 * n_axes = {2 * n_axes}"
    )
  table = rope_frequencies(rot_dim // n_axes, base=base)
  return tuple(table for _ in range(n_axes))


def rotation_angles(positions, inv_freq: Frequencies) -> jax.Array:
  """Angles theta[..., T, P] = positions * inv_freq, in float32 (float64 if given float64).

  Args:
    positions: [..., T] for a single table, [..., T, A] for a sequence of A tables.
    inv_freq: one table [P] or a sequence of A tables [P_a] (P = sum P_a).
  """
  positions = jnp.asarray(positions)
  tables = _as_tables(inv_freq)
  dtype = jnp.float64 if positions.dtype == jnp.float64 else jnp.float32
  if not is_multi_axis(inv_freq):
    return _outer(positions.astype(dtype), tables[0].astype(dtype))
  if positions.ndim < 1 or positions.shape[-1] != len(tables):
    raise ValueError(
      f"multi-axis rotation with {len(tables)} frequency tables needs positions [..., T, "
      f"{len(tables)}], got positions of shape {positions.shape}"
    )
  parts = [_outer(positions[..., a].astype(dtype), t.astype(dtype)) for a, t in enumerate(tables)]
  return jnp.concatenate(parts, axis=-1)


def _outer(p, table):
  # Explicit ranks: the project runs with jax_numpy_rank_promotion="raise".
  return p[..., None] * table.reshape((1,) * p.ndim + table.shape)


def rotary_tables(positions, inv_freq: Frequencies) -> tuple[jax.Array, jax.Array]:
  """(cos, sin) of the rotation angles, each [..., T, P]; compute once, apply many times."""
  theta = rotation_angles(positions, inv_freq)
  return jnp.cos(theta), jnp.sin(theta)


def apply_rotary(x, cos, sin, *, inverse: bool = False, layout: str = "interleaved") -> jax.Array:
  """Rotates x [..., T, H, D] by precomputed tables cos, sin [..., T, P] (broadcast over H).

  The first 2P dims of D rotate, the rest pass through. The math runs in float32 (float64 for
  float64 inputs) and the result is cast back to x.dtype.
  """
  x = jnp.asarray(x)
  if x.ndim < 3:
    raise ValueError(f"x must be [..., T, H, D], got shape {x.shape}")
  tables = expand_tables(cos, sin, x.shape[-1], layout=layout, dtype=x.dtype)
  return apply_expanded(x, tables, inverse=inverse, layout=layout)


class ExpandedTables(NamedTuple):
  """`expand_tables`' result: full-width C, S [..., T, 1, D] and the rotated pair count."""

  c: jax.Array
  s: jax.Array
  n_pairs: int


def expand_tables(
  cos, sin, head_dim: int, *, layout: str = "interleaved", dtype=jnp.float32
) -> ExpandedTables:
  """Full-width tables C, S, each [..., T, 1, head_dim], from cos, sin [..., T, P]:
  `apply_expanded(x, tables)` is R_t x. Build them once per position set and apply them to
  every tensor at those positions (RoVE's q and output; k and v): the backward pass then keeps
  one pair of tables, not one per rotated tensor. Computed in float32 at least (float64 when
  cos or dtype is float64).
  """
  _check_layout(layout)
  n_pairs = cos.shape[-1]
  if 2 * n_pairs > head_dim:
    raise ValueError(
      f"{n_pairs} rotary frequencies need 2 * {n_pairs} = {2 * n_pairs} dims but the head "
      f"dimension D is {head_dim}; use a shorter frequency table (partial rotary) or a "
      f"larger head"
    )
  if cos.shape != sin.shape:
    raise ValueError(f"cos {cos.shape} and sin {sin.shape} must have the same shape")
  compute = jnp.promote_types(jnp.promote_types(cos.dtype, dtype), jnp.float32)
  # y = x * C + swap(x) * S with full-width tables C, S [..., T, 1, D] built from the small
  # [T, P] ones: one elementwise fusion over x, no stack or concatenate of x-sized arrays
  # (whose backward passes are pads and slices, a measurable part of a CPU train step; see
  # bench/RESULTS.md).
  # Pair (a, b) -> (a cos - b sin, a sin + b cos), so C = (cos, cos), S = (-sin, +sin) and
  # swap exchanges the two members of every pair.
  c, s = cos.astype(compute), sin.astype(compute)
  if layout == "interleaved":
    c_full = jnp.repeat(c, 2, axis=-1)
    s_full = jnp.stack([-s, s], axis=-1).reshape(s.shape[:-1] + (2 * n_pairs,))
  else:
    c_full = jnp.concatenate([c, c], axis=-1)
    s_full = jnp.concatenate([-s, s], axis=-1)
  rest = head_dim - 2 * n_pairs
  if rest:  # partial rotary: the tail passes through (C = 1, S = 0)
    c_full = jnp.concatenate([c_full, jnp.ones(c_full.shape[:-1] + (rest,), compute)], axis=-1)
    s_full = jnp.concatenate([s_full, jnp.zeros(s_full.shape[:-1] + (rest,), compute)], axis=-1)
  # [..., T, D] -> [..., T, 1, D]: the same angle for every head.
  return ExpandedTables(jnp.expand_dims(c_full, -2), jnp.expand_dims(s_full, -2), n_pairs)


def apply_expanded(
  x, tables: ExpandedTables, *, inverse: bool = False, layout: str = "interleaved"
) -> jax.Array:
  """R_t x (R_t^-1 x when inverse) for x [..., T, H, D] and `expand_tables`' tables; the
  result in x.dtype (the math in the tables' dtype or x's, whichever is wider)."""
  x = jnp.asarray(x)
  _check_layout(layout)
  c_full, s_full, n_pairs = tables
  if c_full.shape[-1] != x.shape[-1]:
    raise ValueError(
      f"tables of head dimension {c_full.shape[-1]} cannot rotate x {x.shape}; "
      f"build them with expand_tables(cos, sin, {x.shape[-1]})"
    )
  while c_full.ndim < x.ndim:  # tables without x's leading batch dims broadcast over them
    c_full, s_full = c_full[None], s_full[None]
  compute = jnp.promote_types(c_full.dtype, x.dtype)
  xc = x.astype(compute)
  rest = x.shape[-1] - 2 * n_pairs
  head = x[..., : 2 * n_pairs]  # the swap moves data only: done in x's dtype, then widened
  if layout == "interleaved" and platform.target_platform() != "tpu":
    # Each member of a pair takes its partner: a reverse over a [..., P, 2] view, which XLA's
    # CPU and GPU backends fuse into the elementwise math (bench/RESULTS.md).
    swapped = head.reshape(head.shape[:-1] + (n_pairs, 2))[..., ::-1].reshape(head.shape)
  elif layout == "interleaved":
    # Each member of a pair takes its partner: even dims the next one, odd dims the previous
    # one. Two shifts (pads by one, no slices: TPU layouts materialised the 63-wide slices of
    # a concatenate in float32) and a select keep D the minor dim (a [..., P, 2] reshape puts
    # a size-2 dim minor, which TPU layouts pad and materialise for every rotated tensor).
    no_pad = [(0, 0, 0)] * (head.ndim - 1)
    zero = jnp.zeros((), head.dtype)
    ahead = jax.lax.pad(head, zero, no_pad + [(-1, 1, 0)])  # [x1, x2, ..., 0]
    behind = jax.lax.pad(head, zero, no_pad + [(1, -1, 0)])  # [0, x0, x1, ...]
    even = (jnp.arange(2 * n_pairs) % 2 == 0).reshape((1,) * (head.ndim - 1) + (2 * n_pairs,))
    swapped = jnp.where(even, ahead, behind)
  else:
    swapped = jnp.concatenate([head[..., n_pairs:], head[..., :n_pairs]], axis=-1)
  swapped = swapped.astype(compute)
  if rest:
    swapped = jnp.concatenate([swapped, xc[..., 2 * n_pairs :]], axis=-1)
  # R^-1 is R with sin -> -sin: subtract rather than negate S, so both directions share S.
  y = xc * c_full - swapped * s_full if inverse else xc * c_full + swapped * s_full
  return y.astype(x.dtype)


def rotate(
  x, positions, inv_freq: Frequencies, *, inverse: bool = False, layout: str = "interleaved"
) -> jax.Array:
  """Applies R_t (or R_t^-1 = R_t^T when inverse) to every head vector of x.

  Args:
    x: [..., T, H, D], any float dtype (rotation math in float32, result in x.dtype).
    positions: [..., T] int or float positions for one table; [..., T, A] for a sequence of A
      tables (multi-axis RoPE). Leading dims must match x's (or be absent / 1 to broadcast).
    inv_freq: one table [P] (2P <= D) or a sequence of A tables.
    inverse: apply R_t^-1 instead of R_t.
    layout: "interleaved" or "half" (see the module docstring).

  Returns:
    [..., T, H, D] in x.dtype.
  """
  x = jnp.asarray(x)
  positions = jnp.asarray(positions)
  _check_positions(x.shape, positions.shape, inv_freq, what="positions")
  cos, sin = rotary_tables(positions, inv_freq)
  return apply_rotary(x, cos, sin, inverse=inverse, layout=layout)


def rotation_matrix(
  position, inv_freq: Frequencies, dim: int, *, layout: str = "interleaved", dtype=jnp.float32
) -> jax.Array:
  """The dense R_t [dim, dim] for one position (a scalar, or [A] for multi-axis tables).

  rotate(x, t, inv_freq) == x @ R_t.T for a row vector x, i.e. R_t @ x for a column vector.
  """
  _check_layout(layout)
  theta = rotation_angles(jnp.asarray(position, dtype=dtype), inv_freq)
  n_pairs = theta.shape[-1]
  if 2 * n_pairs > dim:
    raise ValueError(f"{n_pairs} rotary frequencies need dim >= {2 * n_pairs}, got dim={dim}")
  if layout == "interleaved":
    first = 2 * jnp.arange(n_pairs)
    second = first + 1
  else:
    first = jnp.arange(n_pairs)
    second = first + n_pairs
  c, s = jnp.cos(theta).astype(dtype), jnp.sin(theta).astype(dtype)
  r = jnp.eye(dim, dtype=dtype)
  r = r.at[first, first].set(c).at[second, second].set(c)
  r = r.at[first, second].set(-s).at[second, first].set(s)
  return r


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)  # arrays: compared by identity
class Rope:
  """One rotary setup: what rove_jax.attention's rope_attention and rove_attention rotate with.
  A pytree: the tables and the factor are leaves (traced under jit), the layout is static.

  Attributes:
    inv_freq: a frequency table [P] (e.g. `rope_frequencies` or a rove_jax.scaling function),
      or a sequence of A tables for multi-axis positions [..., T, A]; 2P <= D, and the dims past
      2P pass through (partial rotary).
    attention_factor: c, YaRN's and LongRoPE's temperature, a float or a traced scalar. It
      multiplies the rotated dims of q and k (the logits by c**2 at full rotary), applied as
      c**2 on q alone (`scale_query`); value and output rotations are never scaled.
    layout: "interleaved" or "half" (module docstring).
  """

  inv_freq: Frequencies
  attention_factor: Any = 1.0
  layout: str = dataclasses.field(default="interleaved", metadata=dict(static=True))

  def __post_init__(self):
    _check_layout(self.layout)

  @property
  def n_rotated(self) -> int:
    """2P, the dims the rotation turns."""
    return 2 * n_frequencies(self.inv_freq)

  @property
  def multi_axis(self) -> bool:
    return is_multi_axis(self.inv_freq)

  def tables(self, positions, head_dim: int, dtype) -> ExpandedTables:
    """`expand_tables`' full-width tables of these positions ([..., T] or [..., T, A])."""
    cos, sin = rotary_tables(positions, self.inv_freq)
    return expand_tables(cos, sin, head_dim=head_dim, layout=self.layout, dtype=dtype)

  def apply(self, x, tables: ExpandedTables, *, inverse: bool = False) -> jax.Array:
    """R_t x (R_t^-1 x when inverse) with tables from `tables`."""
    return apply_expanded(x, tables, inverse=inverse, layout=self.layout)

  def rotate(self, x, positions, *, inverse: bool = False) -> jax.Array:
    """`rotate(x, positions, inv_freq, inverse=, layout=)` with this setup."""
    return rotate(x, positions, self.inv_freq, inverse=inverse, layout=self.layout)

  def scale_query(self, q_BTHD) -> jax.Array:
    """q with its rotated dims times attention_factor**2: the factor of q and k, all on q, so
    keys from a KV cache carry none. Scaling commutes with the rotation of those dims, so it is
    applied before it, in float32 (q is rounded to its dtype once, after the rotation). A
    static factor of 1 returns q unchanged."""
    factor = self.attention_factor
    if not isinstance(factor, jax.Array) and float(factor) == 1.0:
      return q_BTHD
    D = q_BTHD.shape[-1]
    c2 = jnp.asarray(factor, jnp.float32) ** 2
    c2_D = jnp.where(jnp.arange(D) < self.n_rotated, c2, jnp.float32(1.0))
    compute = jnp.promote_types(q_BTHD.dtype, jnp.float32)
    return q_BTHD.astype(compute) * c2_D.astype(compute).reshape((1,) * (q_BTHD.ndim - 1) + (D,))


# ----------------------------------------------------------------------------- validation


def half_order(head_dim: int, n_rotated: int) -> np.ndarray:
  """Indices into a head's dims that put the interleaved layout's pairs (2m, 2m + 1) where the
  half layout has its pairs (m, m + r), r = n_rotated / 2, and the pass-through dims after them
  as they are: x[..., half_order(D, n)] rotated in the half layout is x rotated in the
  interleaved one, its dims renamed. Renaming the dims of q and k alike leaves q.k unchanged,
  and of v and the output alike leaves RoVE's o = R_i^-1 sum_j p_ij R_j v_j the same vector
  renamed; a model may so hand a kernel whose half-layout rotation is cheaper its interleaved
  rotary (kernels.Kernel.half_pairs; rove_jax.nn.attention_layer) by gathering its q, k, v
  projections' output dims and its output projection's input dims in this order."""
  if n_rotated % 2 or not 0 < n_rotated <= head_dim:
    raise ValueError(f"n_rotated must be even and in (0, head_dim={head_dim}], got {n_rotated}")
  pairs = np.arange(0, n_rotated, 2)
  return np.concatenate([pairs, pairs + 1, np.arange(n_rotated, head_dim)])


def in_half_order(x, n_rotated: int, axis: int = -1) -> jax.Array:
  """x with its head-dim axis in `half_order`: x.take(half_order(x.shape[axis], n_rotated),
  axis), written as strided slices and a concatenation, which XLA fuses into the kernel that
  reads x (and whose transpose in the backward pass is a pad and a sum, not a scatter)."""
  x = jnp.moveaxis(x, axis, -1)
  half_order(x.shape[-1], n_rotated)  # checks n_rotated
  out = jnp.concatenate([x[..., 0:n_rotated:2], x[..., 1:n_rotated:2], x[..., n_rotated:]], -1)
  return jnp.moveaxis(out, -1, axis)


def _check_rot_dim(rot_dim) -> int:
  if not isinstance(rot_dim, (int, np.integer)) or isinstance(rot_dim, bool):
    raise ValueError(f"rot_dim must be an int, got {rot_dim!r}")
  if rot_dim <= 0 or rot_dim % 2:
    raise ValueError(
      f"rot_dim must be a positive even number (dims rotate in pairs), got rot_dim={rot_dim}"
    )
  return int(rot_dim)


def _check_layout(layout: str) -> None:
  if layout not in LAYOUTS:
    raise ValueError(f"unknown rotary layout {layout!r}; expected one of {LAYOUTS}")


def _as_tables(inv_freq: Frequencies) -> list[jax.Array]:
  if isinstance(inv_freq, (tuple, list)):
    if not inv_freq:
      raise ValueError("inv_freq is an empty sequence; give one table per position axis")
    tables = [jnp.asarray(t) for t in inv_freq]
  else:
    tables = [jnp.asarray(inv_freq)]
  for t in tables:
    if t.ndim != 1:
      raise ValueError(f"a frequency table must be 1-D [P], got shape {t.shape}")
  return tables


def n_frequencies(inv_freq: Frequencies) -> int:
  """P, the number of rotated pairs, for a single table or a sequence of per-axis tables."""
  return sum(int(t.shape[0]) for t in _as_tables(inv_freq))


def is_multi_axis(inv_freq: Frequencies) -> bool:
  return isinstance(inv_freq, (tuple, list))


def _check_positions(x_shape, pos_shape, inv_freq: Frequencies, *, what: str) -> None:
  """positions must be [..., T] ([..., T, A] multi-axis) matching x [..., T, H, D]."""
  lead = tuple(x_shape[:-2])
  if is_multi_axis(inv_freq):
    n_axes = len(inv_freq)
    if len(pos_shape) < 2 or pos_shape[-1] != n_axes:
      raise ValueError(
        f"{what} for {n_axes} frequency tables must be [..., T, {n_axes}], got {pos_shape}"
      )
    pos_lead = tuple(pos_shape[:-1])
  else:
    pos_lead = tuple(pos_shape)
  ok = (
    1 <= len(pos_lead) <= len(lead)
    and pos_lead[-1] == lead[-1]
    and all(p in (1, l) for p, l in zip(pos_lead[::-1], lead[::-1]))
  )
  if not ok:
    want = "[..., T]" if not is_multi_axis(inv_freq) else f"[..., T, {len(inv_freq)}]"
    raise ValueError(
      f"{what} of shape {tuple(pos_shape)} do not match x of shape {tuple(x_shape)}: expected "
      f"{want} with T = {lead[-1] if lead else '?'} and leading dims equal to "
      f"{lead[:-1]} (or broadcastable)"
    )
