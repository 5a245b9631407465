"""Independent float64 NumPy references: dense rotations built pair by pair, naive attention,
T5 buckets, sinusoids and a naive GPT forward; and two toy tokenizers for the evaluation tests."""

import math
import re

import numpy as np


def dense_rotation(angles, dim, layout="interleaved"):
  """R [dim, dim] for per-pair angles [P], written out pair by pair."""
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
  """Angles [P] for a scalar position and one table, or a position [A] and A tables."""
  if isinstance(inv_freq, (tuple, list)):
    return np.concatenate(
      [float(p) * np.asarray(t, np.float64) for p, t in zip(np.atleast_1d(position), inv_freq)]
    )
  return float(position) * np.asarray(inv_freq, np.float64)


def naive_attention(
  q,
  k,
  v,
  q_pos,
  kv_pos,
  inv_freq,
  *,
  rove,
  causal=True,
  factor=1.0,
  layout="interleaved",
  q_seg=None,
  kv_seg=None,
  kv_mask=None,
  bias=None,
  window=None,
):
  """Loops over batch, heads, queries and keys in float64. bias: optional [B, H, T, S] added
  to the logits; window: key j visible only if q_pos[i] - kv_pos[j] < window. inv_freq None:
  no rotation (plain softmax attention).

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
  if inv_freq is None:  # no rotation: every angle 0
    inv_freq, factor = np.zeros(D // 2), 1.0
  # The attention factor multiplies the rotated dims (the first 2P) of q and k.
  n_rotated = 2 * (sum(len(f) for f in inv_freq) if multi else len(np.atleast_1d(inv_freq)))
  c_D = np.where(np.arange(D) < n_rotated, factor, 1.0)
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
          if window is not None:
            visible &= q_pos[b, i] - kv_pos[b, j] < window
          if visible:
            r_j = dense_rotation(angles_for(kv_pos[b, j], inv_freq), D, layout)
            logits[j] = (r_i @ (c_D * q[b, i, h])) @ (r_j @ (c_D * k[b, j, kh])) / np.sqrt(D)
            if bias is not None:
              logits[j] += bias[b, h, i, j]
        if not np.isfinite(logits).any():
          continue
        w = np.exp(logits - logits.max())
        w /= w.sum()
        for j in range(S):
          if w[j] == 0:
            continue
          if rove:
            delta = (
              (kv_pos[b, j] - q_pos[b, i])
              if not multi
              else (np.asarray(kv_pos[b, j]) - np.asarray(q_pos[b, i]))
            )
            kernel = dense_rotation(angles_for(delta, inv_freq), D, layout)
            out[b, i, h] += w[j] * (kernel @ v[b, j, kh])
          else:
            out[b, i, h] += w[j] * v[b, j, kh]
  return out


def t5_bucket(distance, num_buckets, max_distance):
  """T5's causal bucket of one integer distance q_pos - kv_pos, in float64 scalar math."""
  n = max(int(distance), 0)
  exact = num_buckets // 2
  if n < exact:
    return n
  log_part = math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact)
  return min(exact + int(log_part), num_buckets - 1)


def sinusoid(position, dim):
  """[dim] features of one position: sin at even dims, cos at odd, wavelengths 10000^(2i/dim)."""
  out = np.zeros(dim)
  for i in range(dim // 2):
    angle = position / 10000.0 ** (2 * i / dim)
    out[2 * i], out[2 * i + 1] = math.sin(angle), math.cos(angle)
  return out


def _norm(x, p, kind, eps):
  if kind == "layernorm":
    x = x - x.mean(-1, keepdims=True)
  y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * p["scale"]
  return y + p["bias"] if "bias" in p else y


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def naive_gpt(params, cfg, tokens, *, inv_freq=None, factor=1.0):
  """Logits [B, T, V] of the rove_jax GPT in float64 NumPy, written from the architecture.

  Args:
    params: the model's parameters as nested dicts of arrays (nnx.to_pure_dict); the fused
      attention projections are read as wqkv [E, 3, H, D] or wq [E, H, D] + wkv [E, 2, K, D].
    cfg: the GPTConfig (only its fields are read).
    tokens: [B, T] ints at positions 0..T-1.
    inv_freq: [P] rotary frequencies (rotary encodings), after any scaling.
    factor: the attention factor multiplying q and k.
  """
  as64 = lambda tree: {
    k: as64(v) if isinstance(v, dict) else np.asarray(v, np.float64) for k, v in tree.items()
  }
  p = as64(params)
  tokens = np.asarray(tokens)
  B, T = tokens.shape
  H, E = cfg.n_head, cfg.d_model
  pos = np.broadcast_to(np.arange(T), (B, T))
  x = p["embed"][tokens]
  if cfg.pos_encoding == "learned":
    x = x + p["pos_embed"][:T][None]
  elif cfg.pos_encoding == "sinusoidal":
    x = x + np.stack([sinusoid(t, E) for t in range(T)])[None]
  rotary = cfg.pos_encoding in ("rove", "rope")
  bias = None
  if cfg.pos_encoding == "t5_bias":
    buckets = np.array(
      [
        [t5_bucket(i - j, cfg.t5_num_buckets, cfg.t5_max_distance) for j in range(T)]
        for i in range(T)
      ]
    )
    bias = np.broadcast_to(np.moveaxis(p["t5_table"][buckets], -1, 0)[None], (B, H, T, T))
  for layer in range(cfg.n_layer):
    blk = p["blocks"][layer]
    a = blk["attn"]
    h = _norm(x, blk["norm1"], cfg.norm, cfg.norm_eps)
    if "wqkv" in a:
      w = [a["wqkv"][:, i] for i in range(3)]
      b = [a["bqkv"][i] for i in range(3)] if "bqkv" in a else [0.0] * 3
    else:
      w = [a["wq"], a["wkv"][:, 0], a["wkv"][:, 1]]
      b = [a["bq"], a["bkv"][0], a["bkv"][1]] if "bq" in a else [0.0] * 3
    q, k, v = (np.einsum("bte,ehd->bthd", h, wi) + bi for wi, bi in zip(w, b))
    rove = cfg.pos_encoding == "rove" and (cfg.rove_layers is None or layer in cfg.rove_layers)
    out = naive_attention(
      q,
      k,
      v,
      pos,
      pos,
      inv_freq if rotary else np.zeros(1),
      rove=rove,
      factor=factor,
      layout=cfg.rope_layout,
      bias=bias,
    )
    x = x + np.einsum("bthd,hde->bte", out, a["wo"]) + a.get("bo", 0.0)
    m = blk["mlp"]
    h = _norm(x, blk["norm2"], cfg.norm, cfg.norm_eps)
    if cfg.mlp == "swiglu":
      z = h @ m["w_gate"]
      hidden = z / (1 + np.exp(-z)) * (h @ m["w_in"])
    else:
      hidden = _gelu_tanh(h @ m["w_in"] + m.get("b_in", 0.0))
    x = x + hidden @ m["w_out"] + m.get("b_out", 0.0)
  x = _norm(x, p["final_norm"], cfg.norm, cfg.norm_eps)
  return x @ (p["embed"].T if cfg.tie_embeddings else p["lm_head"])


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
