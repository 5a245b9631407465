"""A model's RoPE setup from its transformers `config.json`, in one call.

    rope = rove_jax.rope_from_hf_config("path/to/config.json")  # or the dict, or its folder
    rope.rot_dim, rope.inv_freq, rope.attention_factor
    rope.rope_scaling  # the resolved rope dict, parsed: a scaling.RopeScaling

The config is read as transformers 5 reads it, for v4 files (`rope_scaling`, `rope_theta` and
`partial_rotary_factor` beside it) and v5 files (`rope_parameters` holding all three):
  head_dim       `head_dim`, else hidden_size // num_attention_heads (n_embd // n_head).
  rope dict      `rope_parameters`, else `rope_scaling`, else plain RoPE. A dict nested by layer
                 type (Gemma-style {"full_attention": {...}, "sliding_attention": {...}}) needs
                 `layer_type=`. A multimodal config without head counts is read from its
                 `text_config`.
  rope_theta     the dict's, else the config's `rope_theta` (GPT-NeoX v4: `rotary_emb_base`),
                 else 10000 (transformers' default_theta).
  rot_dim        int(head_dim * partial_rotary_factor), the factor from the dict, else the
                 config's `partial_rotary_factor` (GPT-NeoX v4: `rotary_pct`); GPT-J / CodeGen
                 give `rotary_dim` itself. "proportional" and "axial" rotate the whole head.
  lengths        `max_position_embeddings` (n_positions); a config-level
                 `original_max_position_embeddings` (Phi-3) overrides the dict's for llama3, yarn
                 and longrope, as transformers does.
  seq_len        None gives the table transformers builds at load time: the plain table for
                 "dynamic" (it grows past max_position_embeddings) and the short factors for
                 "longrope"; pass the current length for the table of a longer call.

Keys the rope type does not read are ignored with a warning, as transformers does (strict=True
makes them errors). Model-specific defaults that a config file leaves out (GPT-NeoX's
rotary_pct 0.25, Phi-3's original_max_position_embeddings 4096) are transformers' config
classes' and are not known here: a file that omits them is read with the generic defaults.
Rotation pairing is not in the file either: Llama, GPT-NeoX, Phi and most models pair dims
(m, m + P) (layout="half"), GPT-J and GLM pair (2m, 2m + 1) (layout="interleaved").
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, NamedTuple

from rove_jax import scaling


class HFRope(NamedTuple):
  """What `rope_from_hf_config` reads: pass inv_freq and attention_factor to `rope_attention`."""

  rot_dim: int  # dims that turn (2 * len(inv_freq)); the rest of the head passes through
  inv_freq: Any  # numpy float32 [rot_dim // 2]; for "axial" a pair of per-axis tables
  attention_factor: float  # multiplies the rotated dims of q and k (transformers' scaling)
  head_dim: int
  rope_type: str
  rope_scaling: scaling.RopeScaling  # the resolved setting; .to_dict() is its v5-style dict


def rope_from_hf_config(
  config: str | os.PathLike | Mapping[str, Any],
  *,
  seq_len: int | None = None,
  layer_type: str | None = None,
  strict: bool = False,
) -> HFRope:
  """rot_dim, inv_freq and attention factor of a transformers model config (see the module doc).

  Args:
    config: a config.json path, a folder holding one, or the parsed dict.
    seq_len: current length for the length-dependent types ("dynamic", "longrope").
    layer_type: which entry of a rope dict nested by layer type.
    strict: unread keys in the rope dict are errors instead of warnings.

  Raises:
    ValueError: unreadable config, no head dimension, an odd rotary width, or a bad rope dict.
  """
  cfg = _load(config)
  if (
    "num_attention_heads" not in cfg
    and "n_head" not in cfg
    and "head_dim" not in cfg
    and isinstance(cfg.get("text_config"), Mapping)
  ):
    cfg = dict(cfg["text_config"])
  head_dim = cfg.get("head_dim")
  if not head_dim:
    width, heads = (
      cfg.get("hidden_size") or cfg.get("n_embd"),
      cfg.get("num_attention_heads") or cfg.get("n_head"),
    )
    if not (width and heads):
      raise ValueError(
        "the config names no head dimension: it needs head_dim, or hidden_size and "
        "num_attention_heads"
      )
    head_dim = width // heads
  params = _rope_dict(cfg, layer_type)
  rope_type = params.get("rope_type") or params.get("type") or "default"
  rope_type = scaling._ALIASES.get(rope_type, rope_type)
  params["rope_type"] = rope_type
  params.pop("type", None)
  theta = params.get("rope_theta") or cfg.get("rope_theta") or cfg.get("rotary_emb_base")
  params["rope_theta"] = float(theta or 10000.0)
  partial = (
    params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or cfg.get("rotary_pct")
  )
  if partial is not None:
    params["partial_rotary_factor"] = partial
  max_len = cfg.get("max_position_embeddings") or cfg.get("n_positions")
  if rope_type in ("llama3", "yarn", "longrope") and cfg.get("original_max_position_embeddings"):
    params["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
  if rope_type in ("proportional", "axial"):
    rot_dim = head_dim
  elif partial is None and cfg.get("rotary_dim"):
    rot_dim = int(cfg["rotary_dim"])
  else:
    rot_dim = int(head_dim * (partial or 1.0))
  if rot_dim % 2 or rot_dim <= 0:
    raise ValueError(
      f"the config rotates {rot_dim} dims of head_dim={head_dim} (partial rotary "
      f"factor {partial}); rove_jax rotates an even number of dims, while "
      f"transformers pads an odd count by one pair: not supported"
    )
  if rope_type == "dynamic" and seq_len is None:
    seq_len = max_len  # transformers' table at load time
  spec = scaling.RopeScaling.from_dict(params, strict=strict)
  inv_freq, factor = spec.frequencies(
    rot_dim, max_len=max_len, seq_len=seq_len, head_dim=head_dim if partial is not None else None
  )
  return HFRope(
    rot_dim=rot_dim,
    inv_freq=inv_freq,
    attention_factor=float(factor),
    head_dim=int(head_dim),
    rope_type=rope_type,
    rope_scaling=spec,
  )


def _load(config) -> dict:
  if isinstance(config, Mapping):
    return dict(config)
  if not isinstance(config, (str, os.PathLike)):
    raise ValueError(
      f"config must be a config.json path, its folder or a dict, got {type(config).__name__}"
    )
  path = os.path.join(config, "config.json") if os.path.isdir(config) else os.fspath(config)
  try:
    with open(path, encoding="utf-8") as f:
      loaded = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"cannot read the transformers config {path!r}: {e}") from None
  if not isinstance(loaded, dict):
    raise ValueError(f"{path!r} holds a {type(loaded).__name__}, not a config object")
  return loaded


def _rope_dict(cfg: Mapping[str, Any], layer_type: str | None) -> dict:
  """The flat rope dict of the config (a copy), chosen by layer_type when nested by layer."""
  rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
  if not isinstance(rope, Mapping):
    raise ValueError(f"rope_parameters / rope_scaling must be a dict, got {rope!r}")
  nested = [k for k, v in rope.items() if isinstance(v, Mapping)]
  if not nested:
    if layer_type is not None:
      raise ValueError(
        f"layer_type={layer_type!r} given, but the rope dict is not nested by "
        f"layer type; leave layer_type unset"
      )
    return dict(rope)
  if layer_type is None and len(nested) == 1:
    layer_type = nested[0]
  if layer_type not in nested:
    raise ValueError(
      f"the rope dict is nested by layer type {sorted(nested)}: pass layer_type= "
      f"one of them (got {layer_type!r})"
    )
  return dict(rope[layer_type])
