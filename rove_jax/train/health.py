"""Whether the training state is good enough to checkpoint, and the error of a run that
diverged (`NonFiniteError`).

A checkpoint is written only from a state known good, so that retention (keep_checkpoints) can
never rotate the last good state out behind a divergence. An update can be finite and still
ruin the run (a learning rate of 1e9 leaves |param| near 1e9 and every later step non-finite),
so a state is judged on three things:

  * the newest step's loss and gradient norm were finite (a skipped step leaves the state whose
    loss was not);
  * the newest step's loss is at most optim.max_loss_jump x the median of the recent finite
    losses (once `MIN_HISTORY` of them are known: a fresh or resumed run has no history);
  * the parameters' global norm is finite and at most optim.max_param_growth x that of the last
    good state (the restored checkpoint or the initial parameters to begin with).

The judgement uses global values only (the loss of the global batch, the norm of all
parameters), so every process of a multi-host run reaches the same verdict.
"""

from __future__ import annotations

import collections
import math
import statistics
from typing import Optional

WINDOW = 64  # recent finite losses the median is taken over
MIN_HISTORY = 8  # finite losses needed before a loss jump is judged


class NonFiniteError(RuntimeError):
  """The run diverged; `last_good` is the step of the newest good checkpoint (None: none)."""

  def __init__(self, message: str, *, last_good: Optional[int] = None):
    super().__init__(message)
    self.last_good = last_good


class Health:
  """Recent losses and the last good state's parameter norm; `verdict` judges a state."""

  def __init__(
    self,
    *,
    max_loss_jump: float,
    max_param_growth: float,
    good_step: Optional[int],
    good_norm: float,
  ):
    self.max_loss_jump, self.max_param_growth = max_loss_jump, max_param_growth
    self.good_step, self.good_norm = good_step, good_norm
    self.losses: collections.deque = collections.deque(maxlen=WINDOW)
    self.last_loss: Optional[float] = None
    self.last_finite = True
    self.last_step: Optional[int] = None

  def observe(self, step: int, loss: float, finite: bool) -> None:
    """Records a step's loss (computed on the state before its update) and whether it was
    finite (the update was applied)."""
    self.last_step, self.last_loss, self.last_finite = step, loss, finite
    if finite:
      self.losses.append(loss)

  def verdict(self, param_norm: float) -> Optional[str]:
    """None when the current state is good, else why it is not (one clause)."""
    if not self.last_finite:
      return f"step {self.last_step}'s loss or gradient was not finite"
    # The newest loss is judged against the losses before it.
    history = list(self.losses)[:-1]
    if self.max_loss_jump and len(history) >= MIN_HISTORY and self.last_loss is not None:
      median = statistics.median(history)
      if self.last_loss > self.max_loss_jump * median:
        return (
          f"step {self.last_step}'s loss {self.last_loss:.4g} is more than "
          f"optim.max_loss_jump={self.max_loss_jump:g} x the median {median:.4g} of the "
          f"{len(history)} steps before it"
        )
    if not math.isfinite(param_norm):
      return "the parameters' norm is not finite"
    if (
      self.max_param_growth
      and self.good_norm > 0
      and (param_norm > self.max_param_growth * self.good_norm)
    ):
      since = "the start" if self.good_step is None else f"step {self.good_step}"
      return (
        f"the parameters' norm {param_norm:.4g} is more than optim.max_param_growth="
        f"{self.max_param_growth:g} x its {self.good_norm:.4g} at {since}"
      )
    return None

  def accept(self, step: int, param_norm: float) -> None:
    """The state at `step` was judged good and saved: it is the new reference."""
    self.good_step, self.good_norm = step, param_norm

  def last_good(self) -> str:
    """Where a rerun resumes: the newest good checkpoint, in words."""
    if self.good_step is None:
      return "no checkpoint of this run was judged good, so a rerun starts from step 0"
    return f"the last good checkpoint is step {self.good_step}, where a rerun resumes"
