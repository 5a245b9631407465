"""The train state's parameters with the layers' arrays stacked: blocks.<i>.attn.wqkv of every
layer i is one [L, ...] array blocks.attn.wqkv, and so on for each parameter of a block.

Why: the optimizer updates each parameter array in a kernel of its own, and the norm for
gradient clipping reduces each one in two more; XLA's GPU compiler does not fuse independent
updates (no horizontal fusion pass runs in it now). A GPT-2 124M has 147 arrays, twelve of each
block parameter; stacked, the optimizer sees 15. The model still takes its own per-layer
parameters: the train step slices them out of the stacks (the slices fuse with the bfloat16
casts the forward pass makes anyway) and stacks their gradients (the concatenation fuses into
the update). bench/RESULTS.md has the kernel counts.

Only the train state in memory is stacked. Checkpoints keep the model's layout: `to_layers`
before a save and `from_layers` after a restore, so checkpoints written before and after
stacking read the same, and readers of a checkpoint (evaluation, export, init_from) see the
model's parameters as always. The optimizer state follows the parameters: every subtree of it
shaped like the parameters (AdamW's moments) is stacked and unstacked with them.

  layers = LayerStack(abstract_params)      # nnx.State of nnx.Param, as nnx.split gives it
  stacked = layers.stack(params)            # a plain nested dict of arrays
  params = layers.unstack(stacked)          # the nnx.State again, for nnx.merge

A model whose blocks do not all hold the same arrays (names, shapes, dtypes) is not stacked:
`stack` and `unstack` then return their argument.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jax.tree_util import DictKey, GetAttrKey, SequenceKey

BLOCKS = "blocks"  # the model's list of transformer blocks (rove_jax.nn.model.GPT.blocks)


def _names(path) -> tuple:
  """A parameter's path as plain names, without nnx's `.value` at the end."""
  out = []
  for k in path:
    if isinstance(k, DictKey):
      out.append(k.key)
    elif isinstance(k, SequenceKey):
      out.append(k.idx)
    elif isinstance(k, GetAttrKey):
      if k.name != "value":
        out.append(k.name)
    else:
      out.append(str(k))
  return tuple(out)


def _get(tree: dict, key: tuple):
  for k in key:
    tree = tree[k]
  return tree


def _put(tree: dict, key: tuple, value) -> None:
  for k in key[:-1]:
    tree = tree.setdefault(k, {})
  tree[key[-1]] = value


class LayerStack:
  """The correspondence between a model's per-layer parameters and their stacked form.

  Args:
    params: the model's parameters (abstract or real), an nnx.State as `nnx.split(model,
      nnx.Param)` returns it; any tree of the same structure (gradients, AdamW's moments)
      converts the same way.
  """

  def __init__(self, params):
    flat, self._treedef = jax.tree_util.tree_flatten_with_path(params)
    self._paths = [jax.tree_util.keystr(path) for path, _ in flat]
    self._source = []  # for each per-layer leaf: (its key in the stacked tree, layer or None)
    shapes = {}  # stacked key -> {layer: (shape, dtype)}
    for path, leaf in flat:
      names = _names(path)
      if len(names) > 2 and names[0] == BLOCKS and isinstance(names[1], int):
        key, layer = (BLOCKS,) + names[2:], names[1]
      else:
        key, layer = names, None
      self._source.append((key, layer))
      shapes.setdefault(key, {})[layer] = (tuple(leaf.shape), jnp.dtype(leaf.dtype))
    per_block = [v for k, v in shapes.items() if k[0] == BLOCKS and None not in v]
    n = len(per_block[0]) if per_block else 0
    uniform = all(sorted(v) == list(range(n)) and len(set(v.values())) == 1 for v in per_block)
    self.n_layers = n if uniform and n > 1 else 0  # 0: nothing is stacked
    self._stacked_def = (
      jax.tree.structure(jax.eval_shape(self.stack, params)) if self.active else self._treedef
    )

  @property
  def active(self) -> bool:
    """Whether the layers' arrays are stacked (else every conversion is the identity)."""
    return self.n_layers > 0

  # ------------------------------------------------------------------- parameter trees
  def stack(self, tree) -> Any:
    """A tree of the parameters' structure -> the stacked tree (a nested dict of arrays)."""
    if not self.active:
      return tree
    leaves = self._treedef.flatten_up_to(tree)
    parts = {}
    for (key, layer), leaf in zip(self._source, leaves):
      parts.setdefault(key, {})[layer] = leaf
    out = {}
    for key, by_layer in parts.items():
      _put(
        out,
        key,
        by_layer[None]
        if None in by_layer
        else jnp.stack([by_layer[i] for i in range(self.n_layers)]),
      )
    return out

  def unstack(self, stacked) -> Any:
    """The stacked tree -> the parameters' own structure (what nnx.merge takes)."""
    if not self.active:
      return stacked
    leaves = [
      _get(stacked, key) if layer is None else _get(stacked, key)[layer]
      for key, layer in self._source
    ]
    return self._treedef.unflatten(leaves)

  # ------------------------------------------------------------------------ train states
  def to_layers(self, state) -> Any:
    """A train state (or any tree) with stacked parameters -> the model's layout: the
    parameters and every subtree shaped like them (AdamW's moments) unstacked."""
    return _map_subtrees(state, self._stacked_def, self.unstack) if self.active else state

  def from_layers(self, state) -> Any:
    """Inverse of `to_layers`: a train state in the model's layout (a restored checkpoint)
    -> stacked."""
    return _map_subtrees(state, self._treedef, self.stack) if self.active else state

  # ---------------------------------------------------------------------------- sharding
  def path_specs(self, per_layer: dict) -> dict:
    """sharding.param_path_specs of the model's parameters -> the same for the stacked tree:
    a stacked array keeps its layers' spec with the new leading axis replicated."""
    if not self.active:
      return per_layer
    out = {}
    for path, (key, layer) in zip(self._paths, self._source):
      if layer in (None, 0):
        shape, spec = per_layer[path]
        if layer == 0:
          shape, spec = (self.n_layers,) + tuple(shape), P(None, *spec)
        out[jax.tree_util.keystr(tuple(DictKey(k) for k in key))] = (tuple(shape), spec)
    return dict(sorted(out.items(), key=lambda kv: -len(kv[0])))


def _map_subtrees(tree, structure, fn: Any) -> Any:
  """`tree` with every subtree of the given structure replaced by fn(subtree)."""

  def matches(x) -> bool:
    return jax.tree.structure(x) == structure

  return jax.tree.map(lambda x: fn(x) if matches(x) else x, tree, is_leaf=matches)
