"""The transcendental functions of the GPU fused kernels' inner loops (rove_jax.kernels.fused_gpu
for Pallas Triton, rove_jax.kernels.fused_hopper for Pallas Mosaic GPU): sin and cos for the
rotation tables, written with the operations both lower at full rate (float32 multiplies and
adds, bitcasts, integer masks, shifts and selects), and the softmax's exp as exp2.

jnp.sin and jnp.cos lower to libdevice's sinf and cosf in both backends. Their slow path for
large arguments (Payne-Hanek reduction with a local-memory array) is compiled into every
kernel, whatever the arguments: it made a Triton program spill most of its registers, and the
Hopper kernels spill kilobytes a thread (python -m bench.fused_gpu --aot h200 --ptxas).
Float-to-int and int-to-float conversions are avoided too: a GPU converts at a quarter of its
float32 rate or less, and the tables are the largest part of a rotating kernel's work.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

# pi / 2 in three float32 parts (Cody-Waite; cephes' sinf constants, doubled): the first has 8
# significant bits and the second 12, so with k split into a multiple of 256 (at most 12 bits
# up to 2**20) and the rest (|k_lo| <= 128, 8 bits), every product with them is exact.
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)
# Minimax polynomials for |r| <= pi / 4 (cephes' sinf and cosf).
_SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)
# 1.5 * 2**23, whose ulp is 1: t + _ROUND is t rounded to the nearest integer k, plus _ROUND, for
# |t| < 2**22, and its bits are _ROUND's (0x4B400000) + k (two's complement, the exponent
# unchanged): k mod 4 (the quadrant) and k rounded to a multiple of 256 come from integer masks,
# not conversions.
_ROUND = 1.5 * 2.0**23
_EXPONENT_BITS = 0x4B000000  # the exponent field every such sum shares
_SIGN = -(2**31)  # the float32 sign bit, as an int32
# 2 pi in three float32 parts, the first two of 8 significant bits (truncated), the third the
# float32 nearest the rest: k times either of the first two is exact for |k| <= 2**16, and a
# fused multiply-add (the GPU's FFMA, which the kernels' a - k * part compiles to) rounds each
# step once whatever k (`turns`).
_TWO_PI = (6.28125, 0.00193023681640625, 5.070363386039389e-06)
LOG2E = math.log2(math.e)


def exp_minus(x, shift, expand=lambda v: v):
  """exp(x - expand(shift)) as exp2(x log2(e) - expand(shift log2(e))): a fused multiply-add and
  an exp2 an element (the GPU's ex2, or libdevice's exp2f around it), where exp is a range
  reduction and six instructions more (libdevice's expf). shift holds a value a row or a column
  of x and expand broadcasts it against x, after the multiply, which then runs once a row.
  -inf in x gives 0, as exp does; so does +inf in shift (a row that saw no key)."""
  return jnp.exp2(x * LOG2E - expand(shift * LOG2E))


def sincos(a, *, hardware: bool = False):
  """(sin a, cos a) of a float32 array, sharing one range reduction.

  By default a = k * pi / 2 + r with k the nearest integer and |r| <= pi / 4, polynomials in r,
  the quadrant k mod 4 picking and signing them: within a few float32 ulps of sin and cos for
  |a| < 2**20 * pi / 2 (about 1.6e6: positions under that at frequencies <= 1), losing precision
  gradually up to 2**22 * pi / 2 (6.5e6), where a float32 angle's own ulp is 0.5 radian; beyond
  it k wraps.

  hardware=True reduces by whole turns instead (`turns`: a = k * 2 pi + r, |r| <= pi, k not
  split, which the GPU's fused multiply-add makes unnecessary) and takes jnp.sin and jnp.cos of
  r, for a backend that lowers them to the GPU's sin.approx and cos.approx (Pallas Mosaic GPU
  under approximate math, rove_jax.kernels.fused_hopper_tiles):
  two instructions of the quarter-rate unit instead of the polynomials and the quadrant's
  selects. Those add an absolute error of about 2**-20.9 (their documented bound on [-pi, pi]),
  below the bfloat16 rounding every rotated tile takes. Elsewhere jnp.sin of r is exact (CPU,
  interpret mode) or libdevice's (Pallas Triton: do not)."""
  if hardware:
    r = turns(a)
    return jnp.sin(r), jnp.cos(r)
  bits, k = _nearest(a * (2 / math.pi))
  k_hi = _as_float(jnp.bitwise_and(bits + 128, -256)) - _ROUND  # k to a multiple of 256
  k_lo = k - k_hi  # |k_lo| <= 128
  c0, c1, c2 = _PIO2
  r = a - k_hi * c0 - k_lo * c0 - k_hi * c1 - k_lo * c1 - k * c2
  z = r * r
  sin_r = r + r * z * (_SIN[0] + z * (_SIN[1] + z * _SIN[2]))
  cos_r = 1.0 - 0.5 * z + z * z * (_COS[0] + z * (_COS[1] + z * _COS[2]))
  odd = jnp.bitwise_and(bits, 1) == 1  # _ROUND's bits are a multiple of 4: bits mod 4 = k mod 4
  sin_a = jnp.where(odd, cos_r, sin_r)
  cos_a = jnp.where(odd, sin_r, cos_r)
  # sin is negative in quadrants 2 and 3, cos in 1 and 2: bit 1 of k and of k + 1.
  return _flip(sin_a, bits), _flip(cos_a, bits + 1)


def turns(a, multiply_add=lambda x, y, z: x * y + z):
  """a - k * 2 pi (float32) with k the integer nearest a / (2 pi): in [-pi, pi] up to the rounding
  of k, a little past it where a float32 angle's ulp nears 1.

  Three steps a - k * part (`_TWO_PI`), multiply_add(-k, part, r) each; the GPU kernels' compile
  to an FFMA, which rounds each step once. With FFMA this is within about 2e-7 of the exact
  a - 2 pi k (in float64) up to |a| = 1.6e6 and within 4e-7 up to 6.5e6 (|k| = 2**20); with a
  multiply and an add, rounded apart (CPU, interpret mode), only while |k| <= 2**16 (|a| up to
  about 4e5), where the products are exact. It takes fewer instructions than splitting k as
  `sincos`'s polynomial path does (for backends that may not fuse a multiply and an add)."""
  _, k = _nearest(a * (1 / (2 * math.pi)))
  r = a
  for part in _TWO_PI:
    r = multiply_add(-k, part, r)
  return r


def _nearest(t):
  """(bits, k): k the float32 integer nearest t (|t| < 2**22) and the bits of k + _ROUND."""
  bits = lax.bitcast_convert_type(t + _ROUND, jnp.int32)
  # The or changes no bit; it keeps XLA's simplifier (interpret mode, CPU) from folding
  # (t + _ROUND) - _ROUND into t, which would drop the rounding.
  return bits, _as_float(jnp.bitwise_or(bits, _EXPONENT_BITS)) - _ROUND


def _as_float(bits):
  return lax.bitcast_convert_type(bits, jnp.float32)


def _flip(x, bits):
  """x with its sign flipped where bit 1 of bits is set."""
  sign = jnp.bitwise_and(lax.shift_left(bits, 30), _SIGN)
  return _as_float(jnp.bitwise_xor(lax.bitcast_convert_type(x, jnp.int32), sign))
