"""sin and cos for the GPU fused kernels' rotation tables (rove_jax.kernels.fused_gpu_tiles for
Pallas Triton, rove_jax.kernels.fused_hopper_tiles for Pallas Mosaic GPU), written with the
operations both lower: multiplies, adds, float-to-int conversion, integer masks and selects.

jnp.sin and jnp.cos lower to libdevice's sinf and cosf in both backends. Their slow path for
large arguments (Payne-Hanek reduction with a local-memory array) is compiled into every
kernel, whatever the arguments: it made a Triton program spill most of its registers, and the
Hopper kernels spill kilobytes a thread (python -m bench.fused_gpu --aot h200 --ptxas).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

# pi / 2 in three float32 parts (Cody-Waite; cephes' sinf constants, doubled): the first has 8
# significant bits and the second 12, so with k split into a multiple of 256 (12 bits up to
# 2**20) and the rest (8 bits), every product with them is exact.
_PIO2 = (1.5703125, 4.837512969970703125e-4, 7.54978995489188216e-8)
# Minimax polynomials for |r| <= pi / 4 (cephes' sinf and cosf).
_SIN = (-1.6666654611e-1, 8.3321608736e-3, -1.9515295891e-4)
_COS = (4.166664568298827e-2, -1.388731625493765e-3, 2.443315711809948e-5)


def sincos(a):
  """(sin a, cos a) of a float32 array, sharing one range reduction: a = k * pi / 2 + r with
  |r| <= pi / 4, polynomials in r, the quadrant k mod 4 picking and signing them. Within a few
  float32 ulps of sin and cos for |a| < 2**20 * pi / 2 (about 1.6e6: positions under that at
  frequencies <= 1), losing precision gradually beyond; k must fit an int32 (|a| < 3e9)."""
  x = jnp.abs(a)  # sin(-x) = -sin(x): k >= 0, so each difference below is exact (Sterbenz)
  k_int = (x * (2 / math.pi) + 0.5).astype(jnp.int32)  # x >= 0: truncation is the floor
  k_lo_int = jnp.bitwise_and(k_int, 255)
  k, k_lo = k_int.astype(jnp.float32), k_lo_int.astype(jnp.float32)
  k_hi = k - k_lo
  r = x - k_hi * _PIO2[0] - k_lo * _PIO2[0] - k_hi * _PIO2[1] - k_lo * _PIO2[1] - k * _PIO2[2]
  z = r * r
  sin_r = r + r * z * (_SIN[0] + z * (_SIN[1] + z * _SIN[2]))
  cos_r = 1.0 - 0.5 * z + z * z * (_COS[0] + z * (_COS[1] + z * _COS[2]))
  quadrant = jnp.bitwise_and(k_int, 3)
  odd = jnp.bitwise_and(quadrant, 1) == 1
  sin_a = jnp.where(odd, cos_r, sin_r)
  cos_a = jnp.where(odd, sin_r, cos_r)
  sin_a = jnp.where((quadrant >= 2) != (a < 0), -sin_a, sin_a)
  cos_a = jnp.where((quadrant == 1) | (quadrant == 2), -cos_a, cos_a)
  return sin_a, cos_a
