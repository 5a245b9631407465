"""GPTConfig: the model's shape and positional encoding, a frozen dataclass with presets.

Validation happens at construction and names the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from rove_jax import kernels, rotary, scaling

POS_ENCODINGS = ("rove", "rope", "nope", "learned", "sinusoidal", "t5_bias")
ROTARY_ENCODINGS = ("rove", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")
REMAT_POLICIES = ("none", "full", "dots")
WINDOWLESS_KERNELS = ("cudnn", "splash", "fused")  # flash kernels that mask by index only
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# Embedding rows come in multiples of this: a tokenizer's ids padded up to it keep the embedding
# and output matmuls on tile-friendly shapes.
VOCAB_MULTIPLE = 64


def padded_vocab_size(n_ids: int) -> int:
  """The vocab_size for a tokenizer of n_ids ids: n_ids rounded up to a multiple of
  VOCAB_MULTIPLE."""
  return -(-int(n_ids) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _f(default, help: str):
  """A field with its description (rove-train --help-config prints it)."""
  return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """Model shape and positional encoding. Frozen and hashable; presets are classmethods.

  `rope_scaling` is a `scaling.RopeScaling` (None: plain RoPE); a transformers-style dict given
  for it is parsed once into one (`RopeScaling.from_dict`). `rove_layers` the layer indices
  that use RoVE when pos_encoding="rove" (None: all; the others use RoPE), `remat` one of
  "none", "full" (recompute each block in the backward pass) or "dots" (save matmul outputs
  only). `qkv_bias` gives the q, k and v projections biases even when use_bias is False (the
  output projection and the MLP then have none), as Qwen2 does; `sliding_window` w > 0 lets
  query i see key j only if pos_i - pos_j < w (Mistral's window), 0 is no window.
  """

  vocab_size: int = _f(
    320, f"embedding rows: at least the tokenizer's ids, a multiple of {VOCAB_MULTIPLE}"
  )
  n_layer: int = _f(6, "transformer blocks")
  n_head: int = _f(6, "query heads")
  n_kv_head: Optional[int] = _f(
    None, "key/value heads; unset: n_head (multi-head), fewer for GQA, 1 for MQA"
  )
  d_model: int = _f(384, "residual width (a multiple of n_head)")
  d_ff: Optional[int] = _f(None, "MLP hidden width; unset: 4 * d_model")
  max_len: int = _f(256, "the training context in tokens (data.seq_len's default)")
  pos_encoding: str = _f("rove", " | ".join(POS_ENCODINGS))
  rope_base: float = _f(10000.0, "RoPE base: theta_m = base^(-2m/rot_dim)")
  rotary_fraction: float = _f(1.0, "share of each head's dims that rotate (partial rotary)")
  rope_layout: str = _f(
    "interleaved", "rotary pairs: interleaved (x[2m], x[2m+1]) | half (x[m], x[m+P], Llama's)"
  )
  rope_scaling: Optional[scaling.RopeScaling] = _f(
    None, "transformers-style dict, e.g. {'rope_type': 'yarn', 'factor': 4.0}; unset: plain RoPE"
  )
  rove_layers: Optional[tuple] = _f(None, "layer indices that use RoVE (the rest RoPE); unset: all")
  norm: str = _f("layernorm", " | ".join(NORMS))
  mlp: str = _f("gelu", " | ".join(MLPS))
  use_bias: bool = _f(True, "biases on the projections and the MLP")
  qkv_bias: bool = _f(False, "biases on q, k, v even without use_bias (Qwen2)")
  tie_embeddings: bool = _f(True, "the output projection is the embedding's transpose")
  dtype: str = _f("float32", "compute dtype: " + " | ".join(DTYPES))
  param_dtype: str = _f("float32", "parameter dtype: " + " | ".join(DTYPES))
  attention_impl: str = _f(
    "auto", "attention kernel; auto: splash (TPU), cudnn (GPU), xla/chunked (CPU), per call"
  )
  attention_chunk: int = _f(512, "block length of the chunked kernel")
  fused_variant: str = _f(
    "default",
    "with attention_impl=fused on a Hopper GPU, the kernel's variant: default | features "
    f"joined by '+' from {', '.join(kernels.FUSED_FEATURES)} (kernels.FUSED_FEATURES)",
  )
  remat: str = _f(
    "none",
    "none | full (recompute each block in the backward pass) | dots (save matmul outputs only)",
  )
  t5_num_buckets: int = _f(32, "t5_bias: relative-position buckets")
  t5_max_distance: int = _f(128, "t5_bias: distance of the last bucket")
  init_std: float = _f(0.02, "standard deviation of the weights' normal init")
  norm_eps: float = _f(1e-5, "epsilon of the norms")
  sliding_window: int = _f(
    0, "w > 0: each query sees the keys at most w - 1 positions back (Mistral); 0: no window"
  )

  def __post_init__(self):
    set_ = functools.partial(object.__setattr__, self)
    if self.n_kv_head is None:
      set_("n_kv_head", self.n_head)
    if self.d_ff is None:
      set_("d_ff", 4 * self.d_model)
    if self.rope_scaling is not None and not isinstance(self.rope_scaling, scaling.RopeScaling):
      if not isinstance(self.rope_scaling, Mapping):
        raise ValueError(
          f"GPTConfig: rope_scaling must be a scaling.RopeScaling, a "
          f"transformers-style dict (e.g. {{'rope_type': 'yarn', 'factor': 4.0}}) "
          f"or None, got {type(self.rope_scaling).__name__}: "
          f"{self.rope_scaling!r}"
        )
      try:
        set_("rope_scaling", scaling.RopeScaling.from_dict(self.rope_scaling))
      except ValueError as e:
        raise ValueError(f"GPTConfig: rope_scaling: {e}") from None
    if self.rove_layers is not None:
      set_("rove_layers", tuple(int(i) for i in self.rove_layers))
    self._validate()

  # ---------------------------------------------------------------------------- presets
  @classmethod
  def tiny(cls, **overrides) -> "GPTConfig":
    """6 layers, d_model 384, 6 heads, context 256, byte vocabulary (256 + EOT, padded to 320):
    10.7M parameters, trains on 2 CPU cores in minutes."""
    return cls(
      **{**dict(vocab_size=320, n_layer=6, n_head=6, d_model=384, max_len=256), **overrides}
    )

  @classmethod
  def gpt2_124m(cls, **overrides) -> "GPTConfig":
    """GPT-2 small: 12 layers, d_model 768, 12 heads, context 1024, vocab 50304, tied."""
    return cls(
      **{**dict(vocab_size=50304, n_layer=12, n_head=12, d_model=768, max_len=1024), **overrides}
    )

  @classmethod
  def gpt2_354m(cls, **overrides) -> "GPTConfig":
    """GPT-2 medium: 24 layers, d_model 1024, 16 heads, context 1024, vocab 50304, tied."""
    return cls(
      **{**dict(vocab_size=50304, n_layer=24, n_head=16, d_model=1024, max_len=1024), **overrides}
    )

  # ------------------------------------------------------------------------- derived
  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_head

  @property
  def rot_dim(self) -> int:
    """Rotated dims per head (0 for non-rotary encodings)."""
    if self.pos_encoding not in ROTARY_ENCODINGS:
      return 0
    return int(round(self.head_dim * self.rotary_fraction))

  # ------------------------------------------------------------------ serialisation
  def to_dict(self) -> dict:
    """Every field as plain JSON-ready values (rope_scaling a dict, rove_layers a list): what
    run configs and checkpoint metadata hold. `from_dict` is its inverse."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["rope_scaling"] = None if self.rope_scaling is None else self.rope_scaling.to_dict()
    if self.rove_layers is not None:
      out["rove_layers"] = list(self.rove_layers)
    return out

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> "GPTConfig":
    """A GPTConfig from `to_dict()` output (a run config's model section, checkpoint metadata).

    Raises:
      ValueError: an unknown field (the message lists the known ones) or an invalid value.
    """
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(fields) - set(known))
    if unknown:
      raise ValueError(f"GPTConfig: unknown fields {unknown}; known fields: {sorted(known)}")
    return cls(**dict(fields))

  def with_kernel(self, attention_impl: str, **changes) -> "GPTConfig":
    """This config with another attention kernel in its default variant (and `changes`):
    evaluation's. A fused_variant is the training run's tuning for the Hopper kernel, which
    another kernel does not take and evaluation on another platform would refuse; the default
    variant computes the same function."""
    return dataclasses.replace(
      self, attention_impl=attention_impl, fused_variant="default", **changes
    )

  def is_rove_layer(self, layer: int) -> bool:
    return self.pos_encoding == "rove" and (self.rove_layers is None or layer in self.rove_layers)

  def _validate(self):
    def fail(msg):
      raise ValueError(f"GPTConfig: {msg}")

    for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "max_len"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        fail(f"{name} must be a positive int, got {value!r}")
    if (
      not isinstance(self.sliding_window, (int, np.integer))
      or isinstance(self.sliding_window, bool)
      or self.sliding_window < 0
    ):
      fail(f"sliding_window must be an int >= 0 (0: no window), got {self.sliding_window!r}")
    if self.sliding_window and self.attention_impl in WINDOWLESS_KERNELS:
      fail(
        f"attention_impl={self.attention_impl!r} masks no sliding window (sliding_window="
        f"{self.sliding_window}); use one of "
        f"{tuple(k for k in kernels.IMPLEMENTATIONS if k not in WINDOWLESS_KERNELS)}"
      )
    if not isinstance(self.qkv_bias, (bool, np.bool_)):
      fail(f"qkv_bias must be true or false, got {self.qkv_bias!r}")
    if self.pos_encoding not in POS_ENCODINGS:
      fail(f"unknown pos_encoding {self.pos_encoding!r}; expected one of {POS_ENCODINGS}")
    if self.d_model % self.n_head:
      fail(f"d_model={self.d_model} must be divisible by n_head={self.n_head}")
    if self.n_head % self.n_kv_head:
      fail(f"n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}")
    if self.norm not in NORMS:
      fail(f"unknown norm {self.norm!r}; expected one of {NORMS}")
    if self.mlp not in MLPS:
      fail(f"unknown mlp {self.mlp!r}; expected one of {MLPS}")
    if self.remat not in REMAT_POLICIES:
      fail(f"unknown remat policy {self.remat!r}; expected one of {REMAT_POLICIES}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        fail(f"unknown {name} {getattr(self, name)!r}; expected one of {tuple(DTYPES)}")
    if self.attention_impl not in kernels.IMPLEMENTATIONS:
      fail(
        f"unknown attention_impl {self.attention_impl!r}; expected one of {kernels.IMPLEMENTATIONS}"
      )
    try:
      kernels.fused_options(self.fused_variant)
    except ValueError as e:
      fail(f"fused_variant: {e}")
    if self.fused_variant != "default" and self.attention_impl != "fused":
      fail(
        f"fused_variant={self.fused_variant!r} is a variant of attention_impl=fused, not of "
        f"{self.attention_impl!r}; set attention_impl=fused or leave fused_variant 'default'"
      )
    if self.attention_impl in kernels.ROTARY and self.pos_encoding not in ROTARY_ENCODINGS:
      fail(
        f"attention_impl={self.attention_impl!r} rotates inside the kernel and needs a rotary "
        f"pos_encoding {ROTARY_ENCODINGS}, not {self.pos_encoding!r}"
      )
    if self.rope_layout not in rotary.LAYOUTS:
      fail(f"unknown rope_layout {self.rope_layout!r}; expected one of {rotary.LAYOUTS}")
    if self.pos_encoding in ROTARY_ENCODINGS:
      if not 0.0 < self.rotary_fraction <= 1.0:
        fail(f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}")
      exact = self.head_dim * self.rotary_fraction
      if abs(exact - round(exact)) > 1e-6 or round(exact) % 2 or round(exact) == 0:
        fail(
          f"rotary_fraction={self.rotary_fraction} of head_dim={self.head_dim} gives "
          f"{exact:g} rotary dims; it must be a positive even integer"
        )
      if not self.rope_base > 1:
        fail(f"rope_base must be > 1, got {self.rope_base}")
      try:  # what needs the model's shape (rot_dim, lengths), in numpy: no JAX backend
        (self.rope_scaling or scaling.RopeScaling()).frequencies(
          self.rot_dim,
          base=self.rope_base,
          max_len=self.max_len,
          seq_len=self.max_len,
          head_dim=self.head_dim,
        )
      except ValueError as e:
        fail(f"rope_scaling: {e}")
    elif self.rope_scaling is not None:
      fail(f"rope_scaling applies to rotary encodings only, not pos_encoding={self.pos_encoding!r}")
    if self.rove_layers is not None:
      if self.pos_encoding != "rove":
        fail("rove_layers selects RoVE layers and needs pos_encoding='rove'")
      bad = [i for i in self.rove_layers if not 0 <= i < self.n_layer]
      if bad:
        fail(f"rove_layers {bad} out of range for n_layer={self.n_layer}")
    if self.pos_encoding == "t5_bias" and not self.t5_max_distance > self.t5_num_buckets // 2 >= 1:
      fail("t5_bias needs t5_max_distance > t5_num_buckets // 2 >= 1")
