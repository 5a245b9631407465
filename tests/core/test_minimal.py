"""rove_jax.minimal, the copyable one-file version, against rove_jax.attention and a float64 einsum
with dense rotation matrices: several shapes, GQA and MQA, positions that are no arange
(gaps, documents restarting, queries after a cache, a query that sees no key)."""

import ast
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import minimal, rotary

CASES = {
  # name: (B, T, S, H, K, D, positions)
  "mha_arange": (2, 8, 8, 4, 4, 16, "arange"),
  "gqa_gaps": (2, 9, 9, 6, 2, 8, "gaps"),
  "mqa_documents": (1, 10, 10, 4, 1, 32, "documents"),
  "gqa_after_cache": (2, 3, 11, 4, 2, 16, "after_cache"),
  "nothing_visible": (1, 4, 6, 2, 2, 8, "nothing_visible"),
}


def positions(kind, B, T, S, rng):
  """(q_positions [B, T], kv_positions [B, S]) of one kind."""
  if kind == "arange":
    pos = np.tile(np.arange(T), (B, 1)) + 100
    return pos, pos
  if kind == "gaps":  # increasing with random gaps
    pos = np.cumsum(rng.integers(1, 7, size=(B, T)), axis=1)
    return pos, pos
  if kind == "documents":  # positions restart where a new document begins
    pos = np.concatenate([np.arange(4), np.arange(6)])[None]
    return pos, pos
  kv = np.tile(np.arange(S) * 2 + 3, (B, 1))
  if kind == "after_cache":  # the last T slots' positions: what a decoding step sees
    return kv[:, S - T :], kv
  q = kv[:, :T].copy()
  q[:, 0] = -1  # earlier than every key: this query sees none
  return q, kv


def naive(q, k, v, q_pos, kv_pos, inv, rove):
  """Float64 einsums with dense R_t from rotary.rotation_matrix, GQA by repeating kv heads."""
  D, G = q.shape[-1], q.shape[2] // k.shape[2]
  with jax.enable_x64(True):
    dense = lambda pos: np.stack(
      [
        [np.asarray(rotary.rotation_matrix(float(p), inv, D, dtype=jnp.float64)) for p in row]
        for row in pos
      ]
    )
    r_q, r_kv = dense(q_pos), dense(kv_pos)  # [B, T, D, D], [B, S, D, D]
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  q_r = np.einsum("btde,bthe->bthd", r_q, q)
  k_r = np.repeat(np.einsum("bsde,bske->bskd", r_kv, k), G, axis=2)
  v_r = np.repeat(np.einsum("bsde,bske->bskd", r_kv, v) if rove else v, G, axis=2)
  logits = np.einsum("bthd,bshd->bhts", q_r, k_r) / np.sqrt(D)
  visible = (kv_pos[:, None, :] <= q_pos[:, :, None])[:, None]
  logits = np.where(visible, logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  w = np.where(visible, np.exp(logits - np.where(np.isfinite(top), top, 0.0)), 0.0)
  w /= np.maximum(w.sum(-1, keepdims=True), 1e-300)
  out = np.einsum("bhts,bshd->bthd", w, v_r)
  return np.einsum("bted,bthe->bthd", r_q, out) if rove else out  # R^-1 = R^T


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["rope", "rove"])
def test_minimal_matches_the_library_and_float64(case, kind):
  B, T, S, H, K, D, pos_kind = CASES[case]
  rng = np.random.default_rng(0)
  q, k, v = (
    rng.standard_normal((B, n, h, D)).astype(np.float32) for n, h in ((T, H), (S, K), (S, K))
  )
  q_pos, kv_pos = positions(pos_kind, B, T, S, rng)
  kv_pos = np.broadcast_to(kv_pos, (B, S))
  q_pos = np.broadcast_to(q_pos, (B, T))
  inv = minimal.rope_frequencies(D, base=100.0)
  np.testing.assert_array_equal(inv, rj.rope_frequencies(D, base=100.0))
  kw = dict(q_positions=q_pos, kv_positions=kv_pos)
  fn = {"rope": minimal.rope_attention, "rove": minimal.rove_attention}[kind]
  got = jax.jit(lambda q, k, v: fn(q, k, v, inv_freq=inv, **kw))(q, k, v)
  lib = {"rope": rj.rope_attention, "rove": rj.rove_attention}[kind]
  want = lib(q, k, v, rope=rj.Rope(inv), **kw)
  assert got.shape == (B, T, H, D) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(
    got, naive(q, k, v, q_pos, kv_pos, inv, kind == "rove"), atol=3e-5, rtol=1e-5
  )
  if pos_kind == "nothing_visible":
    assert np.all(np.asarray(got)[:, 0] == 0)


def test_minimal_imports_only_jax_and_math():
  tree = ast.parse(inspect.getsource(minimal))
  imported = {
    alias.name.split(".")[0]
    for node in ast.walk(tree)
    if isinstance(node, ast.Import)
    for alias in node.names
  }
  imported |= {
    (node.module or ".").split(".")[0]
    for node in ast.walk(tree)
    if isinstance(node, ast.ImportFrom)
  }
  assert imported <= {"jax", "math"}, imported
  assert len(inspect.getsource(minimal).splitlines()) <= 150
