"""The measurement plans of `python -m bench`: which models, shapes and repeats each suite
(cpu, gpu; --quick, --smoke) runs. Pure: builds and checks configs, touches no device.
"""

from __future__ import annotations

import dataclasses

from rove_jax.nn.model import GPTConfig


@dataclasses.dataclass(frozen=True)
class Model:
  """A named model shape: a GPTConfig preset, overrides, and the batch it is run at."""

  name: str
  preset: str
  overrides: tuple  # ((field, value), ...): hashable, printable
  batch: int
  seq: int

  def config(self, **more) -> GPTConfig:
    return getattr(GPTConfig, self.preset)(**{**dict(self.overrides), **more})


@dataclasses.dataclass(frozen=True)
class Spec:
  """Everything a suite run measures; built by `make_spec`, recorded in the JSON."""

  suite: str
  quick: bool
  smoke: bool  # the smallest shapes: the suite runs end to end; its figures mean nothing
  train_models: tuple
  repeats: int
  matmul_n: int
  matmul_dtype: str
  memory_model: Model
  memory_steps: int
  long_model: Model  # batch and seq unused: long contexts come from long_lengths
  long_lengths: tuple
  long_kernels: tuple
  long_cap_gib: float  # RLIMIT_AS for the cpu subprocesses; the xla skip threshold
  decode_model: Model
  decode_prompt: int
  decode_new: int
  compile_model: Model
  compile_depths: tuple


def make_spec(suite: str, quick: bool, smoke: bool = False) -> Spec:
  """The measurement plan for a suite. Pure: checks arguments and configs, touches no device.

  `smoke` (cpu only, implies `quick`) shrinks every model to one layer of width 64 and 32
  tokens (one train model, 512-token long-context rows): what the test suite runs to check
  that every section works and every table prints."""
  if suite not in ("cpu", "gpu"):
    raise ValueError(f"unknown suite {suite!r}; expected 'cpu' or 'gpu'")
  if smoke and suite != "cpu":
    raise ValueError("--smoke is for the cpu suite; the gpu suite's smallest run is --quick")
  quick = quick or smoke
  if smoke:
    one = (("n_layer", 1), ("d_model", 64), ("n_head", 2), ("d_ff", 128))
    spec = Spec(
      suite=suite,
      quick=True,
      smoke=True,
      train_models=(Model("smoke-L1", "tiny", one, 2, 32),),
      repeats=2,
      matmul_n=256,
      matmul_dtype="float32",
      memory_model=Model("smoke-L1", "tiny", one, 2, 32),
      memory_steps=2,
      long_model=Model("smoke-L1", "tiny", one, 1, 0),
      long_lengths=(512,),
      long_kernels=("xla", "chunked"),
      long_cap_gib=4.0,
      decode_model=Model("smoke-L1", "tiny", one, 2, 0),
      decode_prompt=8,
      decode_new=8,
      compile_model=Model("smoke", "tiny", one[1:], 2, 32),
      compile_depths=(1, 2, 4),
    )
  elif suite == "cpu":
    small = (("n_layer", 2), ("d_model", 128), ("n_head", 4), ("d_ff", 512))
    if quick:
      train = (
        Model("tiny-L2", "tiny", (("n_layer", 2),), 4, 128),
        Model(
          "mid-L4-d256",
          "tiny",
          (("n_layer", 4), ("d_model", 256), ("n_head", 4), ("d_ff", 1024)),
          2,
          128,
        ),
      )
    else:
      train = (
        Model("tiny", "tiny", (), 16, 256),
        Model(
          "mid-L8-d512",
          "tiny",
          (("n_layer", 8), ("d_model", 512), ("n_head", 8), ("d_ff", 2048)),
          4,
          256,
        ),
      )
    spec = Spec(
      suite=suite,
      quick=quick,
      smoke=False,
      train_models=train,
      repeats=3 if quick else 7,
      matmul_n=1024 if quick else 2048,
      matmul_dtype="float32",
      memory_model=(
        Model("tiny-L2", "tiny", (("n_layer", 2),), 4, 128)
        if quick
        else Model("tiny", "tiny", (), 16, 256)
      ),
      memory_steps=3 if quick else 5,
      long_model=Model("small-L2" if quick else "tiny", "tiny", small if quick else (), 1, 0),
      long_lengths=(4096,) if quick else (4096, 8192, 16384),
      long_kernels=("xla", "chunked"),
      long_cap_gib=8.0 if quick else 16.0,
      decode_model=(
        Model("tiny-L2", "tiny", (("n_layer", 2),), 2, 0)
        if quick
        else Model("tiny", "tiny", (), 4, 0)
      ),
      decode_prompt=16 if quick else 64,
      decode_new=32 if quick else 128,
      compile_model=Model(
        "small" if quick else "tiny",
        "tiny",
        (("d_model", 128), ("n_head", 4), ("d_ff", 512)) if quick else (),
        2,
        64 if quick else 256,
      ),
      compile_depths=(2, 6, 12),
    )
  else:
    gpu = (("dtype", "bfloat16"), ("attention_impl", "cudnn"))
    spec = Spec(
      suite=suite,
      quick=quick,
      smoke=False,
      train_models=(
        Model("gpt2_124m", "gpt2_124m", gpu, 8 if quick else 16, 1024),
        Model("gpt2_354m", "gpt2_354m", gpu, 4 if quick else 8, 1024),
      ),
      repeats=3 if quick else 5,
      matmul_n=8192,
      matmul_dtype="bfloat16",
      memory_model=Model("gpt2_124m", "gpt2_124m", gpu, 16, 1024),
      memory_steps=3,
      long_model=Model("gpt2_124m", "gpt2_124m", (("dtype", "bfloat16"),), 1, 0),
      long_lengths=(4096, 8192, 16384),
      long_kernels=("xla", "chunked"),
      long_cap_gib=0.0,  # on the GPU the cap is the device's own memory (bytes_limit)
      decode_model=Model("gpt2_124m", "gpt2_124m", (("dtype", "bfloat16"),), 4, 0),
      decode_prompt=64,
      decode_new=128,
      compile_model=Model("gpt2_124m", "gpt2_124m", gpu, 8, 1024),
      compile_depths=(2, 6, 12),
    )
  # Building every config now turns a bad override into an error before anything is timed.
  for m in spec.train_models + (
    spec.memory_model,
    spec.long_model,
    spec.decode_model,
    spec.compile_model,
  ):
    m.config()
  return spec
