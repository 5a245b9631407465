"""Every check of a RunConfig's values (`validate`, which RunConfig's constructor runs), each naming
the field and what it takes, before any work starts (what a run needs installed is checked by the
module that needs it: tracking.check_ready for wandb). `c` is a rove_jax.train.RunConfig (not
imported: run_config imports this module)."""

from __future__ import annotations

import math

from rove_jax import checks
from rove_jax.nn.model_config import GPTConfig
from rove_jax.storage import deadline
from rove_jax.train import tracking

_DECAY_HINT = " (Adam's moment decay: 1 never forgets, the updates turn NaN)"
# name: (low, high, low included, high included)
_RANGES = {
  "lr": (0, math.inf, False, False),
  "weight_decay": (0, math.inf, True, False),
  "min_lr_ratio": (0, 1, True, True),
  "b1": (0, 1, True, False),
  "b2": (0, 1, True, False),
  "eps": (0, math.inf, False, False),
  "clip_norm": (0, math.inf, True, False),
}


LOSS_IMPLS = ("xla", "fused")


def _check_loss_impl(c) -> None:
  """optim.loss_impl is known, and the fused kernel's blocks (multiples of 16, its smallest
  Triton tile) fit the micro-batch's tokens, the width and the vocabulary."""
  o, m = c.optim, c.model
  if o.loss_impl not in LOSS_IMPLS:
    raise ValueError(f"optim.loss_impl must be one of {LOSS_IMPLS}, got {o.loss_impl!r}")
  if o.loss_impl != "fused":
    return
  tokens = c.data.batch_size // o.grad_accum * c.data.seq_len
  for name, n in (
    ("the micro-batch's tokens (batch_size / grad_accum x seq_len)", tokens),
    ("model.d_model", m.d_model),
    ("model.vocab_size", m.vocab_size),
  ):
    if n % 16:
      raise ValueError(
        f"optim.loss_impl=fused needs {name} a multiple of 16, got {n}; change "
        f"it or use optim.loss_impl=xla"
      )


def validate(c) -> None:
  """Each value's one check; ValueError names the field."""
  if not isinstance(c.model, GPTConfig):
    raise ValueError(f"model must be a GPTConfig, got {type(c.model).__name__}")
  d = c.data
  if d.source == "prepared" and not d.path:
    raise ValueError(
      "data.source=prepared needs data.path: the directory rove-prepare wrote; "
      "run rove-prepare --out DIR first and set --config.data.path=DIR"
    )
  if not (checks.is_int(d.seq_len, numpy=False) and d.seq_len >= 1):
    raise ValueError(f"data.seq_len must be a positive int, got {d.seq_len!r}")
  if d.seq_len > c.model.max_len:
    raise ValueError(
      f"data.seq_len={d.seq_len} exceeds model.max_len={c.model.max_len}, the "
      f"training context the positional encoding is set up for; set "
      f"--config.model.max_len={d.seq_len}"
    )
  if c.init_from is not None and not (isinstance(c.init_from, str) and c.init_from):
    raise ValueError(f"init_from must be a checkpoint path or unset, got {c.init_from!r}")
  if not (checks.is_int(d.batch_size, numpy=False) and d.batch_size >= 1):
    raise ValueError(f"data.batch_size must be a positive int, got {d.batch_size!r}")
  if d.source == "recall":
    from rove_jax.tasks import recall  # numpy only: loaded by recall runs alone

    spec = recall.RecallSpec.parse(d.path)
    if spec.seq_len != d.seq_len:
      raise ValueError(
        f"data.path={d.path!r}: the recall documents are made for seq_len="
        f"{spec.seq_len} but data.seq_len={d.seq_len}; set seq_len={d.seq_len} "
        f"in data.path (each document must fill one training window)"
      )
    if d.packing:
      raise ValueError(
        "data.packing: a recall window is [eot] + one document, the layout its "
        "test samples use; train the recall source with packing=False"
      )
  for name in (
    "steps",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "eval_batches",
    "keep_checkpoints",
    "optim.grad_accum",
    "optim.max_nonfinite",
  ):
    section, _, field = name.rpartition(".")
    value = getattr(getattr(c, section) if section else c, field)
    if not (checks.is_int(value, numpy=False) and value >= 1):
      raise ValueError(f"{name} must be an int >= 1, got {value!r}")
  if c.run_steps is not None and not (checks.is_int(c.run_steps, numpy=False) and c.run_steps >= 1):
    raise ValueError(
      f"run_steps must be an int >= 1 (the steps this invocation runs before it "
      f"saves and exits) or unset, got {c.run_steps!r}"
    )
  deadline.checked(c.storage_timeout)
  if not (checks.is_int(c.sample_tokens, numpy=False) and c.sample_tokens >= 0):
    raise ValueError(f"sample_tokens must be an int >= 0 (0: no sample), got {c.sample_tokens!r}")
  o = c.optim
  for name, (lo, hi, lo_ok, hi_ok) in _RANGES.items():
    value = getattr(o, name)
    ok = (
      checks.is_finite(value, numpy=False)
      and (lo <= value if lo_ok else lo < value)
      and (value <= hi if hi_ok else value < hi)
    )
    if not ok:
      interval = f"{'[' if lo_ok else '('}{lo}, {hi}{']' if hi_ok else ')'}"
      hint = {
        "clip_norm": " (clip_norm=0 turns clipping off)",
        "b1": _DECAY_HINT,
        "b2": _DECAY_HINT,
      }.get(name, "")
      raise ValueError(f"optim.{name} must be a finite number in {interval}, got {value!r}{hint}")
  for name in ("max_loss_jump", "max_param_growth"):
    value = getattr(o, name)
    if not (checks.is_finite(value, numpy=False) and (value == 0 or value > 1)):
      raise ValueError(
        f"optim.{name} must be a finite number > 1, or 0 to turn the check off, got {value!r}"
      )
  if not (checks.is_int(o.warmup_steps, numpy=False) and 0 <= o.warmup_steps <= c.steps):
    raise ValueError(
      f"optim.warmup_steps={o.warmup_steps} must be in [0, steps={c.steps}]; "
      f"set --config.optim.warmup_steps (e.g. {c.steps // 10}) with a short run"
    )
  if d.batch_size % o.grad_accum:
    raise ValueError(
      f"data.batch_size={d.batch_size} is not divisible by optim.grad_accum={o.grad_accum}"
    )
  _check_loss_impl(c)
  tracking.parse_tracking(c.tracking)
  if c.wandb.mode not in tracking.WANDB_MODES:
    raise ValueError(f"wandb.mode must be one of {tracking.WANDB_MODES}, got {c.wandb.mode!r}")
  tracking.parse_profile_steps(c.profile_steps, c.steps)
  for name in ("data", "fsdp", "tensor"):
    value = getattr(c.mesh, name)
    if not (checks.is_int(value, numpy=False) and (value >= 1 or value == -1)):
      raise ValueError(f"mesh.{name} must be a positive int or -1, got {value!r}")
