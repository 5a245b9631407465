"""What a run computes: the optimizer, the train state, the jitted train and eval steps, and
`Program`, all of them built once for a run on its mesh.

Shape letters (legend in rove_jax): B batch (per process), T sequence length,
M gradient-accumulation micro-steps, V vocabulary.

In memory the state holds the blocks' parameters and moments stacked by layer (layer_stack.py:
fewer optimizer kernels); checkpoints hold them per layer (`Program` converts between the two).
A step whose loss or gradient is not finite leaves the state unchanged (metrics["finite"]).
Nothing here reads data or touches a workdir: the ahead-of-time compiles (rove_jax.aot) build
the same step without the training loop's checkpoints and data.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rove_jax.nn.model import GPT
from rove_jax.train import clipping, gpu_options, layer_stack
from rove_jax.train import sharding as sharding_lib
from rove_jax.train.loss import cross_entropy, fused_cross_entropy
from rove_jax.train.run_config import OptimConfig, RunConfig

# Weight decay applies to these matrices only; embeddings, norms, biases and the T5 table
# are not decayed.
_DECAY_NAMES = ("wqkv", "wq", "wkv", "wo", "w_in", "w_gate", "w_out", "lm_head")


@flax.struct.dataclass
class TrainState:
  params: Any
  opt_state: Any
  step: jax.Array


# --------------------------------------------------------------------------- components


def lr_schedule(o: OptimConfig, steps: int):
  """Linear warmup to optim.lr, then cosine decay to lr * min_lr_ratio at `steps`."""
  return optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=o.lr,
    warmup_steps=o.warmup_steps,
    decay_steps=max(steps, o.warmup_steps + 1),
    end_value=o.lr * o.min_lr_ratio,
  )


def decay_mask(params) -> Any:
  """True for the projection matrices that get weight decay; False for the rest."""

  def keep(path, leaf):
    names = [getattr(k, "key", None) for k in path]
    return any(n in _DECAY_NAMES for n in names)

  return jax.tree_util.tree_map_with_path(keep, params)


def make_optimizer(o: OptimConfig, steps: int) -> optax.GradientTransformation:
  """AdamW with warmup + cosine, global-norm clipping, decay on matrices only."""
  adamw = optax.adamw(
    lr_schedule(o, steps), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask
  )
  if not (o.clip_norm and o.clip_norm > 0):
    return optax.chain(adamw)
  return optax.chain(clipping.clip_by_global_norm(o.clip_norm), adamw)


def _batch_loss(graphdef, params, batch, loss_impl: str = "xla"):
  """The mean token loss of a batch: from the logits in the compute dtype ("xla"), or with the
  output projection inside the loss kernel ("fused", rove_jax.kernels.linear_ce)."""
  model = nnx.merge(graphdef, params)
  # The pipeline's positions restart at each packed document and grow inside it.
  out = model(
    batch["inputs"],
    positions=batch.get("positions"),
    segment_ids=batch.get("segment_ids"),
    positions_ordered=True,
    logits_dtype=None,
    head=loss_impl != "fused",
  )
  if loss_impl == "fused":
    return fused_cross_entropy(out, model.head_VE(), batch["targets"], batch.get("loss_mask"))[0]
  return cross_entropy(out, batch["targets"], batch.get("loss_mask"))[0]


def new_state(tx: optax.GradientTransformation, params, layers=None) -> TrainState:
  """The train state at step 0 of the model's parameters (an nnx.State): stacked by `layers`
  (a layer_stack.LayerStack) when given, and the optimizer's state for them."""
  if layers is not None:
    params = layers.stack(params)
  return TrainState(params=params, opt_state=tx.init(params), step=jnp.zeros((), jnp.int32))


def make_train_step(
  graphdef,
  tx: optax.GradientTransformation,
  grad_accum: int,
  schedule=None,
  *,
  layers=None,
  state_shardings=None,
  batch_sharding=None,
  compiler_options=None,
  loss_impl: str = "xla",
):
  """A jitted (state, batch) -> (state, metrics) with the state donated, compiled with
  `compiler_options` (rove_jax.train.gpu_options on GPUs), its loss by `loss_impl`
  (OptimConfig.loss_impl: `_batch_loss`). With `layers` (a
  layer_stack.LayerStack) the state's parameters are stacked (`new_state(tx, params, layers)`):
  the model gets them unstacked and the optimizer sees their gradients stacked.

  With grad_accum = M the batch [B, T] is split into M micro-batches [B / M, T] whose
  gradients are averaged (a lax.scan), then one optimizer update is applied. A non-finite loss
  or gradient norm leaves params and optimizer state unchanged (metrics["finite"] = False).
  """

  def step(state: TrainState, batch):
    params = state.params if layers is None else layers.unstack(state.params)
    loss_fn = functools.partial(_batch_loss, graphdef, loss_impl=loss_impl)

    def micro(carry, mb):
      loss, grads = jax.value_and_grad(loss_fn)(params, mb)
      acc_loss, acc_grads = carry
      return (acc_loss + loss, jax.tree.map(jnp.add, acc_grads, grads)), None

    if grad_accum == 1:
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    else:
      split = jax.tree.map(functools.partial(_micro_batches, grad_accum, batch_sharding), batch)
      zeros = jax.tree.map(jnp.zeros_like, params)
      (loss, grads), _ = jax.lax.scan(micro, (jnp.zeros((), jnp.float32), zeros), split)
      loss = loss / grad_accum
      grads = jax.tree.map(lambda g: g / grad_accum, grads)
    if layers is not None:  # the concatenation fuses into the optimizer's update
      grads = layers.stack(grads)
    # The norm clipping computes too (clipping.clip_by_global_norm): compiled once.
    grad_norm = clipping.global_norm(grads)
    updates, new_opt = tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    # An update that overflows the parameters is rejected like a non-finite gradient. AdamW's
    # step is lr times a normalised direction for every parameter alike, so an overflow shows in
    # the smallest parameter array as in all: its new values decide, and the choice between new
    # and old state fuses into each other parameter's update instead of waiting on a norm of all
    # of them (a pass over every parameter and a kernel each).
    probe = min(jax.tree.leaves(new_params), key=lambda x: x.size)
    finite = (
      jnp.isfinite(loss)
      & jnp.isfinite(grad_norm)
      & jnp.isfinite(jnp.sum(jnp.square(probe.astype(jnp.float32))))
    )
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    new_state = TrainState(
      params=keep(new_params, state.params),
      opt_state=keep(new_opt, state.opt_state),
      step=state.step + 1,
    )
    metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite}
    if schedule is not None:
      metrics["lr"] = schedule(state.step)
    return new_state, metrics

  options = compiler_options or None
  if state_shardings is None:
    return jax.jit(step, donate_argnums=0, compiler_options=options)
  return jax.jit(
    step,
    donate_argnums=0,
    in_shardings=(state_shardings, batch_sharding),
    out_shardings=(state_shardings, None),
    compiler_options=options,
  )


def _micro_batches(M: int, batch_sharding, x):
  """[B, ...] -> [M, B / M, ...]: micro-batch m holds rows m, M + m, 2 M + m, ... so that each
  device's contiguous share of the batch splits into M local pieces and every micro-batch stays
  split over the data axes (a plain reshape to [M, B / M] would put the sharding on the M axis
  and replicate each micro-batch on every device)."""
  split = x.reshape((x.shape[0] // M, M) + x.shape[1:]).swapaxes(0, 1)
  if batch_sharding is None:
    return split
  spec = P(None, *batch_sharding.spec)
  return jax.lax.with_sharding_constraint(split, NamedSharding(batch_sharding.mesh, spec))


def make_eval_step(graphdef, compiler_options=None, layers=None, loss_impl: str = "xla"):
  """A jitted (params, batch) -> mean loss; params stacked by `layers` when given."""

  @functools.partial(jax.jit, compiler_options=compiler_options or None)
  def eval_step(params, batch):
    return _batch_loss(
      graphdef, params if layers is None else layers.unstack(params), batch, loss_impl
    )

  return eval_step


# ------------------------------------------------------------------------ a run's program


class Program:
  """A run's model, optimizer and steps on `mesh`, built once from its config (abstractly:
  nothing is placed on the devices before `init` is called).

  Attributes:
    graphdef, layers: the GPT's graph and its layer stack (layer_stack.LayerStack).
    saved, saved_shardings: the train state in the checkpoints' layout (the model's per-layer
      parameters and moments, LayerStack.to_layers): its shapes, and their shardings.
    restore_target: what a checkpoint restores into: those shapes with those shardings.
    abstract_state, state_shardings: the train state in memory (stacked): its shapes, and
      their shardings.
    to_layers, from_layers, stack_params: the conversions between the two, jitted onto the
      mesh: to_layers copies the state once on the devices while a save starts (orbax then
      copies it to the host); from_layers stacks a restored one; stack_params stacks
      init_from's parameters. Nothing stacked: nothing to do.
    init: () -> the train state at step 0, created already sharded (no full copy on one device).
    options: the XLA options of this GPU's compiles (rove_jax.train.gpu_options; {} elsewhere).
    train_step, eval_step: `make_train_step`'s and `make_eval_step`'s, with those options.
  """

  def __init__(self, c: RunConfig, mesh: Mesh):
    o = c.optim
    schedule = lr_schedule(o, c.steps)
    tx = make_optimizer(o, c.steps)
    # The run's GPT: built abstractly once here (nnx.eval_shape: nothing allocated) for the
    # graph, the layer stack and the state's shapes, and for real inside `init`.
    model = lambda: GPT(c.model, rngs=nnx.Rngs(c.seed))
    self.graphdef, abstract_params = nnx.split(nnx.eval_shape(model), nnx.Param)
    layers = self.layers = layer_stack.LayerStack(abstract_params)
    abstract_state = self.abstract_state = jax.eval_shape(
      lambda p: new_state(tx, p, layers), abstract_params
    )
    init = lambda: new_state(tx, nnx.state(model(), nnx.Param), layers)
    self._layouts(layers, abstract_state, mesh)
    batch_sharding = sharding_lib.batch_sharding(mesh)
    self.init = jax.jit(init, out_shardings=self.state_shardings)
    self.options = gpu_options.compiler_options(mesh.devices.flat)
    self.eval_step = make_eval_step(self.graphdef, self.options, layers, o.loss_impl)
    self.train_step = make_train_step(
      self.graphdef,
      tx,
      o.grad_accum,
      schedule,
      layers=layers,
      state_shardings=self.state_shardings,
      batch_sharding=batch_sharding,
      compiler_options=self.options,
      loss_impl=o.loss_impl,
    )

  def _layouts(self, layers: layer_stack.LayerStack, abstract_state, mesh: Mesh) -> None:
    """The state's two layouts (stacked in memory, per layer saved), their shardings and the
    conversions between them."""
    self.saved = jax.eval_shape(layers.to_layers, abstract_state)
    path_specs = sharding_lib.param_path_specs(self.saved.params, mesh)
    self.saved_shardings = sharding_lib.tree_shardings(self.saved, path_specs, mesh)
    self.state_shardings = sharding_lib.tree_shardings(
      abstract_state, layers.path_specs(path_specs), mesh
    )
    self.restore_target = jax.tree.map(
      lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
      self.saved,
      self.saved_shardings,
    )
    on_mesh = lambda f, sh: jax.jit(f, out_shardings=sh) if layers.active else f
    self.to_layers = on_mesh(layers.to_layers, self.saved_shardings)
    self.from_layers = on_mesh(layers.from_layers, self.state_shardings)
    self.stack_params = on_mesh(layers.stack, self.state_shardings.params)
