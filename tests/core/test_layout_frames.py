"""The attention code stays shallow and narrow: a GPT forward reaches the kernel's
jax.nn.dot_product_attention call through at most 7 frames of rove_jax code, and no function of
rove_jax.attention or rove_jax.kernels takes more than 8 parameters."""

import importlib
import inspect
import pathlib
import pkgutil
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import rove_jax
from rove_jax import kernels
from rove_jax.kernels import fused, splash  # noqa: F401 (kernels.fused, kernels.splash)
from rove_jax.nn.model import GPT
from tests.conftest import gpt_config

PACKAGE = pathlib.Path(rove_jax.__file__).resolve().parent
# GPT.__call__ -> forward_embeddings -> Block -> Attention -> attention fn -> its shared body
# (attention._attention) -> kernel
MAX_FRAMES = 7
MAX_PARAMETERS = 8


def rove_jax_frames() -> list:
  """The frames of rove_jax code on the current stack, innermost first, as 'file:function'."""
  frames, frame = [], sys._getframe(1)
  while frame is not None:
    path = pathlib.Path(frame.f_code.co_filename).resolve()
    if PACKAGE in path.parents:
      frames.append(f"{path.relative_to(PACKAGE)}:{frame.f_code.co_name}")
    frame = frame.f_back
  return frames


@pytest.mark.parametrize("pos_encoding", ["rove", "rope"])
@pytest.mark.parametrize("remat", ["none", "full"])
def test_gpt_reaches_the_kernel_in_few_frames(pos_encoding, remat, monkeypatch):
  stacks, real = [], jax.nn.dot_product_attention

  def recording(*args, **kwargs):
    stacks.append(rove_jax_frames())
    return real(*args, **kwargs)

  monkeypatch.setattr(jax.nn, "dot_product_attention", recording)
  cfg = gpt_config(vocab_size=64, pos_encoding=pos_encoding, attention_impl="xla", remat=remat)
  model = GPT(cfg, rngs=nnx.Rngs(0))
  model(jnp.zeros((2, 16), jnp.int32))  # the training path (no cache)
  assert len(stacks) == cfg.n_layer
  for stack in stacks:
    assert stack[-1] == "nn/model.py:__call__" and stack[0] == "kernels/xla.py:attend", stack
    assert len(stack) <= MAX_FRAMES, "\n".join(stack)


def _modules():
  names = ["rove_jax.attention"] + [
    f"rove_jax.kernels.{m.name}" for m in pkgutil.iter_modules(kernels.__path__)
  ]
  return [importlib.import_module(n) for n in names + ["rove_jax.kernels"]]


def _functions(module):
  """The functions and methods defined in `module`, with the kernels its factories return."""
  for _, obj in vars(module).items():
    if inspect.isfunction(obj) and obj.__module__ == module.__name__:
      yield obj
    elif inspect.isclass(obj) and obj.__module__ == module.__name__:
      yield from (f for f in vars(obj).values() if inspect.isfunction(f))
      yield from (p.fget for p in vars(obj).values() if isinstance(p, property))


def test_no_function_takes_more_than_eight_parameters():
  seen, wide = 0, []
  for module in _modules():
    for fn in _functions(module):
      seen += 1
      n = len(inspect.signature(fn).parameters)
      if n > MAX_PARAMETERS:
        wide.append(f"{module.__name__}.{fn.__qualname__}: {n}")
  assert seen > 20 and not wide, wide
  for kernel in (
    kernels.chunked.kernel(),
    kernels.xla.kernel("xla"),
    kernels.fused.kernel(),
    kernels.splash.kernel(),
  ):  # the uniform signature: one KernelCall
    assert list(inspect.signature(kernel.attend).parameters) == ["call"]
