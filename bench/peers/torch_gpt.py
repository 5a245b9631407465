"""A GPT-2-style train step in PyTorch, nanoGPT's model and training recipe (learned positions,
pre-LayerNorm blocks with biases, tanh-GELU MLP, tied output head, flash SDPA, AdamW on betas
0.9/0.95 with weight decay 0.1 on the matrices only, global-norm clipping at 1.0), for the speed
comparison of bench/peer_ratio.py. Needs torch (a separate venv: it is no dependency of
rove-jax). Prints one JSON line: {"side": "torch", "tokens_per_s": [...per timed step...]}.

  python bench/peers/torch_gpt.py --layers 6 --d-model 384 --heads 6 --vocab 320 \
      --batch 16 --seq 256 --steps 8 [--no-compile]
  python bench/peers/torch_gpt.py --layers 12 --d-model 768 --heads 12 --vocab 50304 \
      --batch 16 --seq 1024 --device cuda --bf16      # nanoGPT's GPT-2 124M on a GPU

On CUDA it is nanoGPT's train.py setup: torch.compile, bf16 autocast (--bf16), TF32 matmuls,
fused AdamW. Every step ends with the loss read on the host, as rove-jax's loop does.
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
    x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
    for block in self.blocks:
      x = block(x)
    logits = self.head(self.ln(x))
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
  p = argparse.ArgumentParser()
  for name, default in (
    ("layers", 6),
    ("d-model", 384),
    ("heads", 6),
    ("vocab", 320),
    ("batch", 16),
    ("seq", 256),
    ("steps", 8),
    ("warmup", 3),
    ("threads", 0),
  ):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--no-compile", action="store_true")
  p.add_argument("--device", default="cpu", help="cpu or cuda")
  p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (nanoGPT on a GPU)")
  a = p.parse_args()
  if a.threads:
    torch.set_num_threads(a.threads)
  cuda = a.device == "cuda"
  if cuda:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
  torch.manual_seed(0)
  model = GPT(a.vocab, a.seq, a.layers, a.d_model, a.heads).to(a.device)
  params = [p for p in model.parameters() if p.requires_grad]
  groups = [
    {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
    {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
  ]
  opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=cuda)
  loss_fn = model if a.no_compile else torch.compile(model)
  data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)
  inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
  autocast = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.bf16)

  def step():
    with autocast:
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
  print(
    json.dumps(
      {
        "side": "torch",
        "threads": torch.get_num_threads(),
        "device": a.device,
        "torch": torch.__version__,
        "tokens_per_s": speeds,
      }
    )
  )


if __name__ == "__main__":
  main()
