"""The tensors of a Llama-family checkpoint in transformers' format (llama, qwen2, mistral) and
the GPT's parameters, one from the other (rove_jax.nn.hf_llama reads and writes the checkpoints).

The tensors map as (torch Linear weights are [out, in]; the GPT's are [in, ...])

  transformers (*ForCausalLM)                 GPT
  model.embed_tokens.weight  [V, E]           embed  [V, E]
  model.layers.i.input_layernorm.weight       blocks.i.norm1.scale (post_attention_: norm2)
  model.layers.i.self_attn.q_proj.weight      [H*D, E] -> wq [E, H, D], or for K == H the q
    (k_proj, v_proj: [K*D, E])                slot of wqkv [E, 3, H, D] (k, v: wkv [E, 2, K, D])
  model.layers.i.self_attn.{q,k,v}_proj.bias  bq [H, D], bkv [2, K, D] (or bqkv [3, H, D])
  model.layers.i.self_attn.o_proj.weight      [E, H*D] -> wo [H, D, E] (.bias: bo)
  model.layers.i.mlp.gate_proj / up_proj      [F, E] -> w_gate / w_in [E, F]
  model.layers.i.mlp.down_proj.weight         [E, F] -> w_out [F, E]
  model.norm.weight                           final_norm.scale
  lm_head.weight  [V, E] (untied only)        lm_head [E, V]

Heads are D consecutive rows of the projections, in order, and transformers' checkpoints
already hold q and k in the half pairing, so no rows are permuted. Old checkpoints'
rotary_emb.inv_freq buffers are skipped.

Shape letters: V vocabulary, E model width, F MLP hidden width, H query heads, K key/value
heads, D head dimension.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from rove_jax.nn import param_files
from rove_jax.nn.model_config import DTYPES, GPTConfig

_INV_FREQ_BUFFER = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def _rows(config: GPTConfig):
  """[(transformers name, shape)] of every tensor a checkpoint of `config` holds."""
  V, E, F, H, K, D = (
    config.vocab_size,
    config.d_model,
    config.d_ff,
    config.n_head,
    config.n_kv_head,
    config.head_dim,
  )
  qkv_bias = config.use_bias or config.qkv_bias
  rows = [("model.embed_tokens.weight", (V, E))]
  for i in range(config.n_layer):
    a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    rows += [
      (f"model.layers.{i}.input_layernorm.weight", (E,)),
      (f"model.layers.{i}.post_attention_layernorm.weight", (E,)),
      (a + "q_proj.weight", (H * D, E)),
      (a + "k_proj.weight", (K * D, E)),
      (a + "v_proj.weight", (K * D, E)),
      (a + "o_proj.weight", (E, H * D)),
      (m + "gate_proj.weight", (F, E)),
      (m + "up_proj.weight", (F, E)),
      (m + "down_proj.weight", (E, F)),
    ]
    if qkv_bias:
      rows += [
        (a + "q_proj.bias", (H * D,)),
        (a + "k_proj.bias", (K * D,)),
        (a + "v_proj.bias", (K * D,)),
      ]
    if config.use_bias:
      rows.append((a + "o_proj.bias", (E,)))
  rows.append(("model.norm.weight", (E,)))
  if not config.tie_embeddings:
    rows.append(("lm_head.weight", (V, E)))
  return rows


def header_shapes(shapes: Mapping[str, tuple], config: GPTConfig) -> tuple[dict, dict]:
  """(found, wanted) for checking a checkpoint's tensor shapes (from its safetensors headers,
  `shapes`: {name: shape}) before reading it: found without the rotary inv_freq buffers and a
  tied checkpoint's lm_head.weight (loading compares its values with the embeddings'), wanted
  the {name: shape} `config` needs."""
  found = {n: tuple(s) for n, s in shapes.items() if not _INV_FREQ_BUFFER.fullmatch(n)}
  if config.tie_embeddings:
    found.pop("lm_head.weight", None)
  return found, dict(_rows(config))


def params_from_llama(
  tensors: Mapping[str, np.ndarray], config: GPTConfig, *, where: str = "the checkpoint"
):
  """The GPT's parameters (nnx.State) from transformers tensors {name: array}, cast to
  config.param_dtype.

  Raises:
    ValueError: names missing or unknown, a shape that is not the config's, or a tied
      checkpoint whose lm_head.weight differs from model.embed_tokens.weight.
  """
  t = {n: a for n, a in tensors.items() if not _INV_FREQ_BUFFER.fullmatch(n)}
  if config.tie_embeddings and "lm_head.weight" in t:
    head, embed = t.pop("lm_head.weight"), t.get("model.embed_tokens.weight")
    if embed is None or head.shape != embed.shape or not np.array_equal(head, embed):
      raise ValueError(
        f"{where}: config.json ties lm_head to the embeddings "
        f"(tie_word_embeddings), but lm_head.weight differs from "
        f"model.embed_tokens.weight; set tie_word_embeddings to false to load "
        f"it untied"
      )
  rows = _rows(config)
  missing, unknown = sorted({n for n, _ in rows} - set(t)), sorted(set(t) - {n for n, _ in rows})
  if missing or unknown:
    raise ValueError(
      f"{where} does not hold the tensors of its config.json "
      f"(n_layer={config.n_layer}, tied={config.tie_embeddings}, "
      f"q/k/v biases={config.use_bias or config.qkv_bias}, o bias="
      f"{config.use_bias}): missing {missing[:6]}{' ...' * (len(missing) > 6)}, "
      f"unexpected {unknown[:6]}{' ...' * (len(unknown) > 6)}"
    )
  for name, shape in rows:
    if tuple(t[name].shape) != shape:
      raise ValueError(
        f"{where}: {name} has shape {tuple(t[name].shape)}; its config.json says {shape}"
      )
  H, K, D, E = config.n_head, config.n_kv_head, config.head_dim, config.d_model
  dtype = DTYPES[config.param_dtype]
  native = {"embed": t["model.embed_tokens.weight"], "final_norm.scale": t["model.norm.weight"]}
  if not config.tie_embeddings:
    native["lm_head"] = t["lm_head.weight"].T
  for i in range(config.n_layer):
    a, m, b = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"blocks.{i}."
    native[b + "norm1.scale"] = t[f"model.layers.{i}.input_layernorm.weight"]
    native[b + "norm2.scale"] = t[f"model.layers.{i}.post_attention_layernorm.weight"]
    w = {p: t[a + p + "_proj.weight"].T.reshape(E, -1, D) for p in "qkv"}  # [E, heads, D]
    if K == H:
      native[b + "attn.wqkv"] = np.stack([w["q"], w["k"], w["v"]], axis=1)
    else:
      native[b + "attn.wq"] = w["q"]
      native[b + "attn.wkv"] = np.stack([w["k"], w["v"]], axis=1)
    if config.use_bias or config.qkv_bias:
      bias = {p: t[a + p + "_proj.bias"].reshape(-1, D) for p in "qkv"}
      if K == H:
        native[b + "attn.bqkv"] = np.stack([bias["q"], bias["k"], bias["v"]])
      else:
        native[b + "attn.bq"] = bias["q"]
        native[b + "attn.bkv"] = np.stack([bias["k"], bias["v"]])
    native[b + "attn.wo"] = t[a + "o_proj.weight"].T.reshape(H, D, E)
    if config.use_bias:
      native[b + "attn.bo"] = t[a + "o_proj.bias"]
    native[b + "mlp.w_gate"] = t[m + "gate_proj.weight"].T
    native[b + "mlp.w_in"] = t[m + "up_proj.weight"].T
    native[b + "mlp.w_out"] = t[m + "down_proj.weight"].T
  native = {k: np.ascontiguousarray(v).astype(dtype) for k, v in native.items()}
  return param_files.from_named(native, config, where=where)


def llama_tensors(params, config: GPTConfig) -> dict:
  """{transformers name: numpy array} of the GPT's parameters (the inverse of
  `params_from_llama`); lm_head.weight for an untied head only, as save_pretrained writes."""
  named = param_files.named(params)
  param_files.check_named(named, config, where="the parameters to export")
  H, K, D, E = config.n_head, config.n_kv_head, config.head_dim, config.d_model
  out = {
    "model.embed_tokens.weight": named["embed"],
    "model.norm.weight": named["final_norm.scale"],
  }
  if not config.tie_embeddings:
    out["lm_head.weight"] = named["lm_head"].T
  for i in range(config.n_layer):
    a, m, b = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"blocks.{i}."
    out[f"model.layers.{i}.input_layernorm.weight"] = named[b + "norm1.scale"]
    out[f"model.layers.{i}.post_attention_layernorm.weight"] = named[b + "norm2.scale"]
    if K == H:
      w = dict(zip("qkv", np.moveaxis(named[b + "attn.wqkv"], 1, 0)))
      bias = named.get(b + "attn.bqkv")
      bias = None if bias is None else dict(zip("qkv", bias))
    else:
      w = dict(q=named[b + "attn.wq"], **dict(zip("kv", np.moveaxis(named[b + "attn.wkv"], 1, 0))))
      bias = (
        None
        if b + "attn.bq" not in named
        else dict(q=named[b + "attn.bq"], **dict(zip("kv", named[b + "attn.bkv"])))
      )
    for p in "qkv":
      out[a + p + "_proj.weight"] = w[p].reshape(E, -1).T
      if bias is not None:
        out[a + p + "_proj.bias"] = bias[p].reshape(-1)
    out[a + "o_proj.weight"] = named[b + "attn.wo"].reshape(H * D, E).T
    if config.use_bias:
      out[a + "o_proj.bias"] = named[b + "attn.bo"]
    out[m + "gate_proj.weight"] = named[b + "mlp.w_gate"].T
    out[m + "up_proj.weight"] = named[b + "mlp.w_in"].T
    out[m + "down_proj.weight"] = named[b + "mlp.w_out"].T
  return {k: np.ascontiguousarray(v) for k, v in out.items()}
