"""How the two-warpgroup backward kernels (rove_jax.kernels.fused_hopper_backward_ws) get each
looped block (dq: k and v; dk, dv: q and dO) copied and turned, with or without a producer
warpgroup (`fused_hopper.kernel(backward_producer=True)`).

Without a producer, compute warpgroup 0 issues the copies: block t + 1 into the slot block
t - 1 left, once both compute warpgroups are past block t's "rotated" barrier; both turn each
block in place (their halves, `turn_shared`) and meet at that barrier before the products.

With a producer (warp specialisation, as the forward's rove_jax.kernels.fused_hopper_ws and
FlashAttention-3 do), a third warpgroup issues every looped copy: block t + 1 into the slot of
block t - 1 once both compute warpgroups have arrived at that slot's "consumed" barrier after
their products. With bf16 turns and copied tables (`producer_turns`) it also turns each block
as it lands, 32 rows at a time, and tells the compute warpgroups on the slot's "turned"
barrier: their loop then holds no turn, no copy and no barrier between them, and the turns
overlap their products. Otherwise they turn the block themselves, as without a producer. The
producer hands registers to the compute warpgroups (plgpu.set_max_registers): at most 232 a
thread, which the dk, dv kernel at D = 128 (255 without a producer) spills at, so it runs
without one there (`with_producer`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from rove_jax.kernels import fused_hopper_rotation as rotation
from rove_jax.kernels import fused_hopper_tiles as tiles
from rove_jax.kernels.fused_tiles import Plan

W = 2  # compute warpgroups a program
TURN_ROWS = 32  # rows the producer turns at a time (16 bytes a thread of each tile and table)
# Registers a thread (plgpu.set_max_registers): 128 x (producer + 2 x compute) is within the
# SM's 64 Ki for the program's 384 threads; turning takes the producer more (a 32-row part's
# tiles and tables), its compute warpgroups then fewer and no turns.
PRODUCER_REGISTERS = {False: 40, True: 56}
CONSUMER_REGISTERS = {False: 232, True: 224}


def with_producer(plan: Plan, D: int, queries_looped: bool) -> Plan:
  """The plan a kernel runs: plan.backward_producer kept, except for the dk, dv kernel
  (queries_looped) at D > 64, whose registers a producer's share would spill."""
  if plan.backward_producer and queries_looped and D > 64:
    return plan._replace(backward_producer=False)
  return plan


def producer_turns(plan: Plan, D: int) -> bool:
  """Whether the producer also turns each looped block: bf16 turns by copied tables
  (rotation.tables_copied), whose 16-byte loads take 32-row parts."""
  return plan.backward_producer and plan.bf16_turns and rotation.tables_copied(plan, D)


class Bars(NamedTuple):
  """A kernel's looped-block barriers: copies (n_loop a slot), the compute warpgroups'
  meeting after a shared turn, and (with a producer) a slot consumed and a slot turned."""

  loop: Any
  n_loop: int
  rotated: Any
  consumed: Any
  turned: Any


class Pipe(NamedTuple):
  """One program's looped blocks. fetch(t, slot) issues block t's copies into slot;
  turn_shared(slot) is the compute warpgroups' turn of the block in slot (each its share);
  turn_part(slot, part) turns rows `part` of it (the producer's); n is the blocks' number
  (traced), most its static bound; rows a block's."""

  plan: Plan
  wg: Any
  n: Any
  most: int
  rows: int
  fetch: Callable
  turn_shared: Callable
  turn_part: Callable
  bars: Bars

  def by_producer(self, D: int) -> bool:
    return producer_turns(self.plan, D)

  def ready(self, t, D: int) -> None:
    """Before a compute warpgroup's products with block t: the block turned in its slot."""
    slot, bars = lax.rem(t, 2), self.bars
    if self.by_producer(D):
      plgpu.barrier_wait(bars.turned.at[slot])
      return
    tiles.wait_block(bars.loop, slot, bars.n_loop)
    self.turn_shared(slot)
    plgpu.commit_smem()
    plgpu.barrier_arrive(bars.rotated)
    plgpu.barrier_wait(bars.rotated)
    if not self.plan.backward_producer:  # block t + 1 into the slot block t - 1 left
      pl.when((self.wg == 0) & (t >= 1) & (t + 1 < self.n))(
        lambda: self.fetch(t + 1, lax.rem(t + 1, 2))
      )

  def done(self, t) -> None:
    """After a compute warpgroup's products with block t: its slot may be refilled."""
    if self.plan.backward_producer:
      plgpu.barrier_arrive(self.bars.consumed.at[lax.rem(t, 2)])

  def run(self, compute: Callable[[], None], D: int, wait_fixed: Callable[[], None]) -> None:
    """The program: compute() on the compute warpgroups, the first copies issued by warpgroup
    0 or, with a producer, the producer's loop. wait_fixed(): waits for the constants (which
    the producer's turn of q reads for its pass-through dims)."""
    first = lambda: tiles.first_key_fetches(self.fetch, self.most, self.n)
    if not self.plan.backward_producer:
      pl.when(self.wg == 0)(first)
      compute()
      return
    turns = self.by_producer(D)

    @pl.when(self.wg == W)
    def _producer():
      plgpu.set_max_registers(PRODUCER_REGISTERS[turns], action="decrease")
      first()
      if turns:
        wait_fixed()
      lax.fori_loop(0, self.n, lambda t, _: self._produce(t, turns), None)
      # The last two consumptions: the interpreter wants every phase of a barrier waited on
      # by each warpgroup that waits on it at all.
      drain = lambda t, _: plgpu.barrier_wait(self.bars.consumed.at[lax.rem(t, 2)])
      lax.fori_loop(lax.max(self.n - 2, 0), self.n, drain, None)

    @pl.when(self.wg < W)
    def _compute():
      plgpu.set_max_registers(CONSUMER_REGISTERS[turns], action="increase")
      compute()

  def _produce(self, t, turns: bool) -> None:
    """The producer's part of block t: turned as it lands (turns), then block t + 1 into the
    slot of block t - 1 once both compute warpgroups are done with it."""
    slot, bars = lax.rem(t, 2), self.bars
    if turns:
      tiles.wait_block(bars.loop, slot, bars.n_loop)
      for i in range(self.rows // TURN_ROWS):  # static parts: swizzled slices static
        self.turn_part(slot, pl.ds(i * TURN_ROWS, TURN_ROWS))
      plgpu.commit_smem()
      plgpu.barrier_arrive(bars.turned.at[slot])

    @pl.when((t >= 1) & (t + 1 < self.n))
    def _():
      nxt = lax.rem(t + 1, 2)
      plgpu.barrier_wait(bars.consumed.at[nxt])
      self.fetch(t + 1, nxt)
