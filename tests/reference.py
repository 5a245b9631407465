"""Independent float64 NumPy references: dense rotations built pair by pair, naive attention;
and two toy tokenizers for the evaluation tests."""

import re

import numpy as np


def dense_rotation(angles, dim, layout="interleaved"):
  """R [dim, dim] for per-pair angles [F], written out pair by pair."""
  angles = np.asarray(angles, np.float64)
  n = angles.shape[0]
  r = np.eye(dim)
  for m, a in enumerate(angles):
    i, j = (2 * m, 2 * m + 1) if layout == "interleaved" else (m, m + n)
    r[i, i] = np.cos(a)
    r[i, j] = -np.sin(a)
    r[j, i] = np.sin(a)
    r[j, j] = np.cos(a)
  return r


def angles_for(position, inv_freq):
  """Angles [F] for a scalar position and one table, or a position [A] and A tables."""
  if isinstance(inv_freq, (tuple, list)):
    return np.concatenate([float(p) * np.asarray(t, np.float64)
                           for p, t in zip(np.atleast_1d(position), inv_freq)])
  return float(position) * np.asarray(inv_freq, np.float64)


def naive_attention(q, k, v, q_pos, kv_pos, inv_freq, *, rove, causal=True, factor=1.0,
                    layout="interleaved", q_seg=None, kv_seg=None, kv_mask=None):
  """Loops over batch, heads, queries and keys in float64.

  RoPE: y_i = sum_j A_ij v_j. RoVE: y_i = sum_j A_ij R_{p_j - p_i} v_j (the attentive
  convolution, built from dense kernels, not by rotating before and after).
  """
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  q_pos, kv_pos = np.asarray(q_pos), np.asarray(kv_pos)
  B, T, H, D = q.shape
  S, K = k.shape[1], k.shape[2]
  G = H // K
  out = np.zeros((B, T, H, D))
  multi = isinstance(inv_freq, (tuple, list))
  for b in range(B):
    for h in range(H):
      kh = h // G
      for i in range(T):
        r_i = dense_rotation(angles_for(q_pos[b, i], inv_freq), D, layout)
        logits = np.full(S, -np.inf)
        for j in range(S):
          visible = True
          if causal:
            visible &= kv_pos[b, j] <= q_pos[b, i]
          if q_seg is not None:
            visible &= q_seg[b, i] == kv_seg[b, j]
          if kv_mask is not None:
            visible &= bool(kv_mask[b, j])
          if visible:
            r_j = dense_rotation(angles_for(kv_pos[b, j], inv_freq), D, layout)
            logits[j] = factor**2 * (r_i @ q[b, i, h]) @ (r_j @ k[b, j, kh]) / np.sqrt(D)
        if not np.isfinite(logits).any():
          continue
        w = np.exp(logits - logits.max())
        w /= w.sum()
        for j in range(S):
          if w[j] == 0:
            continue
          if rove:
            delta = (kv_pos[b, j] - q_pos[b, i]) if not multi else (
                np.asarray(kv_pos[b, j]) - np.asarray(q_pos[b, i]))
            kernel = dense_rotation(angles_for(delta, inv_freq), D, layout)
            out[b, i, h] += w[j] * (kernel @ v[b, j, kh])
          else:
            out[b, i, h] += w[j] * v[b, j, kh]
  return out


class ByteTok:
  """UTF-8 bytes, end-of-text 256."""

  eot_id = 256

  def encode(self, text):
    return np.array(list(text.encode("utf-8")), dtype=np.int32)

  def decode(self, ids):
    return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", "replace")


class WordTok:
  """Words, single punctuation marks and whitespace runs as tokens; ids assigned on first use."""

  eot_id = 0

  def __init__(self):
    self.ids, self.pieces = {}, ["<eot>"]

  def encode(self, text):
    out = []
    for piece in re.findall(r"\w+|[^\w\s]|\s+", text):
      if piece not in self.ids:
        self.ids[piece] = len(self.pieces)
        self.pieces.append(piece)
      out.append(self.ids[piece])
    return np.array(out, dtype=np.int32)

  def decode(self, ids):
    return "".join(self.pieces[int(i)] for i in ids if int(i) != self.eot_id)
