"""A GPT-2-style train step in PyTorch, shaped like nanoGPT's model (learned positions,
pre-LayerNorm blocks, tanh-GELU MLP, tied output head, AdamW, global-norm clipping), for the
speed comparison of bench/peer_ratio.py. Needs torch (a separate venv: it is no dependency of
rove-jax). Prints one JSON line: {"side": "torch", "tokens_per_s": [...per timed step...]}.

  python bench/peers/torch_gpt.py --layers 6 --d-model 384 --heads 6 --vocab 320 \
      --batch 16 --seq 256 --steps 8 [--no-compile]
"""

import argparse
import json
import math
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
  def __init__(self, d, heads):
    super().__init__()
    self.heads = heads
    self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
    self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
    self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

  def forward(self, x):
    B, T, D = x.shape
    q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
    split = lambda t: t.view(B, T, self.heads, D // self.heads).transpose(1, 2)
    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
    return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
  def __init__(self, vocab, seq, layers, d, heads):
    super().__init__()
    self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
    self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
    self.ln = nn.LayerNorm(d)
    self.head = nn.Linear(d, vocab, bias=False)
    self.head.weight = self.tok.weight
    for p in self.parameters():
      if p.dim() == 2:
        nn.init.normal_(p, std=0.02)

  def forward(self, idx, targets):
    x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
    for block in self.blocks:
      x = block(x)
    logits = self.head(self.ln(x))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
  p = argparse.ArgumentParser()
  for name, default in (("layers", 6), ("d-model", 384), ("heads", 6), ("vocab", 320),
                        ("batch", 16), ("seq", 256), ("steps", 8), ("warmup", 3),
                        ("threads", 0)):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--no-compile", action="store_true")
  a = p.parse_args()
  if a.threads:
    torch.set_num_threads(a.threads)
  torch.manual_seed(0)
  model = GPT(a.vocab, a.seq, a.layers, a.d_model, a.heads)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=False)
  loss_fn = model if a.no_compile else torch.compile(model)
  data = torch.randint(0, a.vocab, (a.batch, a.seq + 1))
  inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

  def step():
    loss = loss_fn(inputs, targets)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss)

  for _ in range(a.warmup):
    step()
  speeds = []
  for _ in range(a.steps):
    t = time.perf_counter()
    loss = step()
    speeds.append(a.batch * a.seq / (time.perf_counter() - t))
  assert math.isfinite(loss)
  print(json.dumps({"side": "torch", "threads": torch.get_num_threads(),
                    "tokens_per_s": speeds}))


if __name__ == "__main__":
  main()
