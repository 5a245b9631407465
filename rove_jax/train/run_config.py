"""The run config: one typed, frozen `RunConfig`, its model section a `GPTConfig`.

A run is described by a config file whose get_config() returns a RunConfig (configs/*.py, or a
function of the presets here: `paper_config`) and `--config.a.b=value` overrides, which
rove_jax.train.overrides applies by each field's type. RunConfig's constructor validates every
value, naming the field, before any work starts (rove_jax.train.run_checks);
rove_jax.train.resolve fills what the inputs decide (a prepared dataset's tokenizer,
init_from's model). Everything after that reads the typed value. `to_dict` / `from_dict` are
the checkpoint metadata's form of it, read back by `from_metadata` as the same type.

Frozen dataclasses, not pydantic: GPTConfig and RopeScaling already are, the values are hashable
and comparable, and the core adds no dependency. Nothing here touches a JAX device, so a config
is built before jax.distributed starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Optional

from rove_jax import scaling
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import run_checks


def _f(default, help: str, **kw):
  """A field with its --help-config text."""
  return dataclasses.field(default=default, metadata={"help": help}, **kw)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the tokens come from and how they are batched (`rove_jax.data`)."""

  source: str = _f(
    "stdlib",
    "stdlib | text | parquet | hf | recall (synthetic) | prepared (rove-prepare's directory)",
  )
  path: Optional[str] = _f(
    None, "files, directory or glob; hf dataset; recall sizes; prepared directory"
  )
  val_path: Optional[str] = _f(None, "explicit validation files (or hf split)")
  text_field: str = _f("text", "jsonl key / parquet or hf column holding the text")
  val_fraction: float = _f(0.02, "share held out for validation without val_path")
  max_files: Optional[int] = _f(None, "use only the first N files")
  max_train_tokens: Optional[int] = _f(None, "cap on the training tokens")
  max_val_tokens: Optional[int] = _f(None, "cap on the validation tokens")
  hf_config: Optional[str] = _f(None, "hf dataset configuration")
  tokenizer: Optional[str] = _f(
    None,
    "bytes | bpe | bpe:VOCAB | path/to/tokenizer.json | "
    "tiktoken:gpt2; unset: a prepared dataset's own, else bytes",
  )
  seq_len: Optional[int] = _f(None, "training window in tokens; unset: model.max_len")
  batch_size: int = _f(16, "sequences per step, global (all processes)")
  packing: bool = _f(False, "pack documents into windows with segment ids")
  allow_changed: bool = _f(
    False, "resume on data other than the checkpoint's (a re-prepared dataset, edited files)"
  )

  def corpus(self):
    """The `rove_jax.data.Corpus` this section reads."""
    from rove_jax import data as data_lib  # the package loads grain: only callers that read data

    return data_lib.Corpus(
      source=self.source,
      path=self.path,
      val_path=self.val_path,
      text_field=self.text_field,
      val_fraction=self.val_fraction,
      max_files=self.max_files,
      hf_config=self.hf_config,
    )


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW with linear warmup and cosine decay (`program.make_optimizer`)."""

  lr: float = _f(1e-3, "peak learning rate")
  min_lr_ratio: float = _f(0.1, "final learning rate / peak")
  warmup_steps: int = _f(100, "linear warmup steps (at most `steps`)")
  weight_decay: float = _f(0.1, "AdamW decay of the matrices")
  b1: float = _f(0.9, "Adam's first-moment decay")
  b2: float = _f(0.95, "Adam's second-moment decay")
  eps: float = _f(1e-8, "Adam's epsilon")
  clip_norm: float = _f(1.0, "global gradient-norm clip (0: off)")
  grad_accum: int = _f(1, "micro-steps a step's batch is split into")
  loss_impl: str = _f(
    "xla",
    "the output projection and loss: xla (the logits written in the "
    "compute dtype) | fused (one Pallas kernel for GPUs that never writes "
    "them, rove_jax/kernels/linear_ce.py; interpreted, slowly, on CPU)",
  )
  max_nonfinite: int = _f(10, "consecutive skipped (non-finite) updates before the run stops")
  max_loss_jump: float = _f(
    2.0,
    "a state whose step's loss exceeds this x the median of the "
    "recent losses is not checkpointed (0: no check; train/health.py)",
  )
  max_param_growth: float = _f(
    4.0,
    "a state whose parameter norm exceeds this x that of the "
    "last good checkpoint is not checkpointed (0: no check)",
  )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """The device mesh's axes; -1: the devices left over by the other axes."""

  data: int = _f(-1, "data-parallel axis")
  fsdp: int = _f(1, "fully sharded data-parallel axis (parameters and optimizer sharded)")
  tensor: int = _f(1, "tensor-parallel axis")


@dataclasses.dataclass(frozen=True)
class WandbConfig:
  """The Weights & Biases run, for tracking=wandb."""

  project: str = _f("rove-jax", "W&B project")
  entity: Optional[str] = _f(None, "W&B entity (team or user)")
  name: Optional[str] = _f(None, "run name; unset: the workdir's name")
  group: Optional[str] = _f(None, "run group")
  mode: str = _f(
    "online", "online | offline (written under workdir/wandb for `wandb sync`) | disabled"
  )


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "mesh": MeshConfig, "wandb": WandbConfig}
# (follower, followed, how): the follower takes how(followed) unless set (`RunConfig.updated`)
FOLLOWERS = (
  (("model", "n_kv_head"), ("model", "n_head"), lambda v: v),
  (("model", "d_ff"), ("model", "d_model"), lambda v: 4 * v),
  (("model", "max_len"), ("data", "seq_len"), lambda v: v),
)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Everything a training run reads. Constructed only with valid values (ValueError names the
  field); unset data.seq_len takes model.max_len. An unset data.tokenizer is rove_jax.train.
  resolve's to fill: a prepared dataset's own, init_from's, else bytes."""

  model: GPTConfig = dataclasses.field(
    default_factory=GPTConfig.tiny, metadata={"help": "the model (GPTConfig)"}
  )
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
  mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
  init_from: Optional[str] = _f(
    None,
    "a transformers checkpoint directory or a rove-export "
    "(local or gs://) a new run starts from: its model (only "
    "pos_encoding rope|rove and non-shape settings may be set) and "
    "tokenizer; a resumed run ignores it",
  )
  steps: int = _f(1000, "training steps of the whole run")
  run_steps: Optional[int] = _f(
    None, "stop this invocation after this many steps (saved; rerun to continue)"
  )
  log_every: int = _f(10, "steps between logged metrics")
  eval_every: int = _f(200, "steps between validation losses")
  eval_batches: int = _f(16, "batches per validation loss")
  checkpoint_every: int = _f(200, "steps between checkpoints")
  keep_checkpoints: int = _f(3, "checkpoints kept")
  async_checkpoints: bool = _f(True, "write checkpoints while training continues")
  storage_timeout: Optional[float] = _f(
    None,
    "seconds a gs:// read, write or wait may take "
    "before the run stops with exit 1; unset: "
    "ROVE_JAX_STORAGE_TIMEOUT or 180 (storage/deadline.py)",
  )
  fresh_start: bool = _f(
    False, "start from step 0 although earlier checkpoints were found unreadable"
  )
  seed: int = _f(0, "initialization and data order")
  progress: bool = _f(True, "a progress bar")
  tracking: str = _f(
    "tensorboard",
    "metrics sinks beside metrics.jsonl: tensorboard, wandb (comma-separated) or none",
  )
  wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)
  profile_steps: Optional[str] = _f(
    None, "START:END: a jax.profiler trace of those steps into workdir/profile"
  )
  sample_tokens: int = _f(200, "tokens of a sample generated at the end (0: none)")
  dry_run: bool = _f(False, "compile the train step, print memory, FLOPs and collectives, exit")
  dry_run_topology: Optional[str] = _f(
    None,
    "compile ahead of time for a slice (v5e-256, v4-32, h100-8) instead of this machine's devices",
  )

  def __post_init__(self):
    unset = {}
    if self.data.seq_len is None:
      unset["seq_len"] = self.model.max_len
    if unset:
      object.__setattr__(self, "data", dataclasses.replace(self.data, **unset))
    run_checks.validate(self)

  # ------------------------------------------------------------------ serialisation
  def to_dict(self) -> dict:
    """Plain JSON-ready values, every field, the model as `GPTConfig.to_dict()`."""
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["model"] = self.model.to_dict()
    for name in SECTIONS:
      out[name] = dataclasses.asdict(out[name])
    return out

  @classmethod
  def from_dict(cls, d: Mapping[str, Any]) -> "RunConfig":
    """The inverse of `to_dict`. Raises ValueError for an unknown field or an invalid value."""
    fields = dict(d)
    _check_known(fields, cls, "")
    if "model" in fields:
      fields["model"] = GPTConfig.from_dict(fields["model"])
    for name, section in SECTIONS.items():
      if name in fields:
        _check_known(fields[name], section, name + ".")
        fields[name] = section(**fields[name])
    return cls(**fields)

  def updated(self, settings) -> "RunConfig":
    """A copy with each (path, value) of `settings` set, in order, in `to_dict`'s form (the
    values parsed already: rove_jax.train.overrides). A path names a field, a whole section
    (its dict), or one key of model.rope_scaling (None removes the key). A field that follows
    another (FOLLOWERS) and held the followed one's value takes its new value, unless the
    field or its section is set. Raises ValueError for an invalid result (`from_dict`)."""
    tree = self.to_dict()
    get = lambda path: tree[path[0]][path[1]]
    following = [f for f in FOLLOWERS if get(f[0]) == f[2](get(f[1]))]
    for path, value in settings:
      node = tree
      for part in path[:-1]:
        node[part] = {} if node[part] is None else node[part]  # an unset model.rope_scaling
        node = node[part]
      if value is None and len(path) > 2:  # a key of model.rope_scaling
        node.pop(path[-1], None)
      else:
        node[path[-1]] = value
    given = {path for path, _ in settings}  # a section given: all its fields
    for follower, followed, how in following:
      if not any(follower[: len(g)] == g for g in given) and get(followed) is not None:
        tree[follower[0]][follower[1]] = how(get(followed))
    if tree["model"]["rope_scaling"] == {}:
      tree["model"]["rope_scaling"] = None
    return RunConfig.from_dict(tree)

  def metadata(self) -> dict:
    """Checkpoint metadata's form: the model config once under "model", the rest under
    "config" (`from_metadata` reads them back), and the tokenizer's spec under "tokenizer"
    (the loop adds what the built tokenizer is: name, vocabulary size, fingerprint)."""
    out = self.to_dict()
    return {"model": out.pop("model"), "config": out, "tokenizer": {"spec": self.data.tokenizer}}

  @classmethod
  def from_metadata(cls, meta: Mapping[str, Any]) -> "RunConfig":
    return cls.from_dict({**meta["config"], "model": meta["model"]})


def paper_config(preset: str, *, lr: float) -> RunConfig:
  """A GPT-2 run for a preset set up like the paper's, as far as the paper says.

  From the paper (2606.11275, the experiments section): GPT-2-style models of ~124M and ~354M
  parameters, trained on FineWebEdu-10B with a context of 1024 tokens. Everything else here is
  an ASSUMPTION, nanoGPT-style defaults the paper does not give: the GPT-2 tokenizer, 0.5M-token
  batches (512 x 1024), 19,073 steps (one pass over ~10B tokens), the learning rate `lr`, 700
  warmup steps, weight decay 0.1, AdamW's betas, bf16 compute with float32 master weights.
  """
  return RunConfig(
    model=getattr(GPTConfig, preset)(pos_encoding="rove", dtype="bfloat16"),
    data=DataConfig(
      source="parquet",
      path="fineweb-edu/*.parquet",
      tokenizer="tiktoken:gpt2",
      seq_len=1024,
      batch_size=512,
    ),  # assumed: 512 x 1024 = 0.5M tokens a step
    optim=OptimConfig(lr=lr, warmup_steps=700, weight_decay=0.1),  # assumed
    steps=19073,  # assumed: one pass over ~10B tokens
    log_every=10,
    eval_every=500,
    eval_batches=40,
    checkpoint_every=1000,
    keep_checkpoints=3,
    sample_tokens=0,
  )


def _check_known(fields: Mapping, cls, prefix: str) -> None:
  known = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(
      f"unknown config fields {[prefix + k for k in unknown]}; "
      f"{prefix.rstrip('.') or 'the config'} has: {', '.join(sorted(known))}"
    )


def describe(c: Optional[RunConfig] = None) -> list[str]:
  """--help-config: one line per field, "name = default  # help", sections included."""
  c = c if c is not None else RunConfig()
  lines = []

  def walk(obj, prefix):
    for f in dataclasses.fields(obj):
      value = getattr(obj, f.name)
      if isinstance(value, scaling.RopeScaling):  # one value, as an override gives it
        value = value.to_dict()
      if dataclasses.is_dataclass(value):
        walk(value, f"{prefix}{f.name}.")
      else:
        help_ = f.metadata.get("help", "")
        lines.append(f"{prefix}{f.name} = {value!r}" + (f"  # {help_}" if help_ else ""))

  walk(c, "")
  return lines
