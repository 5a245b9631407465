"""A short tour of the core library: `make demo` runs it until training lands.

Checks, with numbers printed, the equations the project is built on:
  1. RoVE == the attentive convolution sum_j A_ij R_{j-i} v_j (dense kernels, float64 loop);
  2. RoPE and RoVE are invariant to a common shift of all positions;
  3. the cached-decoding pattern (queries later than keys) equals the full causal pass;
  4. the chunked kernel equals XLA's at 4k tokens;
  5. the YaRN table for 16x extension of a 1024-token model.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

import rove_jax as rj


def main():
  rng = np.random.default_rng(0)
  B, T, H, K, D = 1, 12, 4, 2, 16
  q = rng.standard_normal((B, T, H, D)).astype(np.float32)
  k = rng.standard_normal((B, T, K, D)).astype(np.float32)
  v = rng.standard_normal((B, T, K, D)).astype(np.float32)
  pos = np.arange(T)[None]
  inv = rj.rope_frequencies(D, base=100.0)
  rope = rj.Rope(inv)
  out = np.asarray(rj.rove_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=rope))

  # 1. attentive convolution with dense kernels psi_delta = R_delta (W_V folded into v).
  q_r = np.asarray(rj.rotate(q, pos, inv), np.float64)
  k_r = np.asarray(rj.rotate(k, pos, inv), np.float64)
  conv = np.zeros_like(out, np.float64)
  for h in range(H):
    logits = q_r[0, :, h] @ k_r[0, :, h // (H // K)].T / np.sqrt(D)
    logits[np.triu_indices(T, 1)] = -np.inf
    a = np.exp(logits - logits.max(1, keepdims=True))
    a /= a.sum(1, keepdims=True)
    for i in range(T):
      for j in range(i + 1):
        kernel = np.asarray(rj.rotation_matrix(j - i, inv, D), np.float64)
        conv[0, i, h] += a[i, j] * kernel @ v[0, j, h // (H // K)]
  print(f"1. RoVE vs attentive convolution:         max |diff| = {np.abs(out - conv).max():.2e}")

  # 2. shift invariance.
  shifted = rj.rove_attention(q, k, v, q_positions=pos + 1000, kv_positions=pos + 1000, rope=rope)
  print(f"2. RoVE with all positions + 1000:        max |diff| = {np.abs(shifted - out).max():.2e}")

  # 3. the last 3 queries against all keys, as a KV cache would run them.
  tail = rj.rove_attention(q[:, -3:], k, v, q_positions=pos[:, -3:], kv_positions=pos, rope=rope)
  diff = np.abs(tail - out[:, -3:]).max()
  print(f"3. cache-style queries vs full pass:      max |diff| = {diff:.2e}")

  # 4. chunked vs xla at 4k tokens.
  L = 4096
  q4, k4, v4 = (jnp.asarray(rng.standard_normal((1, L, 4, 32)), jnp.float32) for _ in range(3))
  p4 = jnp.arange(L)[None]
  rope4 = rj.Rope(rj.rope_frequencies(32))
  timings = {}
  results = {}
  for impl in ("xla", "chunked"):
    f = jax.jit(
      lambda q, k, v, impl=impl: rj.rove_attention(
        q, k, v, q_positions=p4, kv_positions=p4, rope=rope4, kernel=impl
      )
    )
    jax.block_until_ready(f(q4, k4, v4))
    t0 = time.perf_counter()
    results[impl] = jax.block_until_ready(f(q4, k4, v4))
    timings[impl] = time.perf_counter() - t0
  diff = float(jnp.abs(results["xla"] - results["chunked"]).max())
  print(
    f"4. chunked vs xla at {L} tokens:          max |diff| = {diff:.2e} "
    f"(xla {timings['xla']:.2f} s, chunked {timings['chunked']:.2f} s)"
  )

  # 5. YaRN for 16x.
  plain = np.asarray(rj.rope_frequencies(64))
  yarn, factor = rj.scaling.yarn(64, factor=16.0, original_max_len=1024)
  ratio = plain / np.asarray(yarn)
  print(
    f"5. YaRN 16x on d=64, L0=1024: attention factor {factor:.4f}; per-pair slowdown "
    f"{ratio[0]:.1f}x (fast pairs) ... {ratio[-1]:.1f}x (slow pairs)"
  )


if __name__ == "__main__":
  main()
