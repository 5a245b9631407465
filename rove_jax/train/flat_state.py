"""The train state as a flat {entry name: array} dict, the form checkpoints store it in:
`to_flat` names every leaf of any pytree by its path ("params.blocks.0.attn.wqkv.value"),
`from_flat` puts such a dict back into a tree of the same structure, and `non_finite_leaves`
finds NaN or Inf before a state is saved or after it is restored.
"""

from __future__ import annotations

import jax


def _leaf_name(path) -> str:
  """A file-system-safe, unique name for a pytree path (orbax stores one entry per leaf)."""
  name = jax.tree_util.keystr(path)
  for ch in "[]'\".":
    name = name.replace(ch, " ")
  return ".".join(name.split())


def to_flat(tree) -> dict:
  """{path name: leaf}: any pytree (optax states, nnx.State, dataclasses) as a plain dict."""
  flat = {_leaf_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  if len(flat) != len(jax.tree.leaves(tree)):
    raise ValueError("two leaves of the train state map to the same checkpoint name")
  return flat


def from_flat(flat: dict, like):
  """Inverse of to_flat, with `like` giving the tree structure."""
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  missing = [_leaf_name(p) for p, _ in paths if _leaf_name(p) not in flat]
  if missing:
    raise ValueError(
      f"checkpoint lacks {len(missing)} entries of the train state, e.g. {missing[:3]}"
    )
  return jax.tree_util.tree_unflatten(treedef, [flat[_leaf_name(p)] for p, _ in paths])


def non_finite_leaves(tree) -> list[str]:
  """Paths of floating-point leaves holding NaN or Inf."""
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if hasattr(leaf, "dtype") and jax.numpy.issubdtype(leaf.dtype, jax.numpy.floating):
      # reduced where the array lives (works for sharded arrays), one bool comes back
      if not bool(jax.numpy.all(jax.numpy.isfinite(leaf))):
        bad.append(jax.tree_util.keystr(path))
  return bad
