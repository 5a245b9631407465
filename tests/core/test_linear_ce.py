"""The fused output projection and cross-entropy (rove_jax.kernels.linear_ce), in Pallas interpret
mode on CPU (compiled on a GPU, where `make test-gpu` runs this file): per-token losses and the
gradients of x and W against float64, bfloat16 inputs against the float64 loss of the same
rounded inputs, a float32 weight's float32 gradient, the sharded run against the unsharded one,
the training loss against the unfused one, and the refusals. The trainer's use of it
(optim.loss_impl=fused): tests/train/test_fused_loss.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rove_jax.kernels import linear_ce
from rove_jax.train import loss as loss_lib


def float64_parts(x, w, t, g):
  """(nll [B, T], dx, dW) in float64 for upstream gradient g [B, T]."""
  z = np.einsum("bte,ve->btv", x, w)
  m = z.max(-1, keepdims=True)
  lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[..., 0]
  nll = lse - np.take_along_axis(z, t[..., None], -1)[..., 0]
  d = (np.exp(z - lse[..., None]) - np.eye(w.shape[0])[t]) * g[..., None]
  return nll, np.einsum("btv,ve->bte", d, w), np.einsum("btv,bte->ve", d, x)


def inputs(B, T, E, V, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, E))
  w = rng.normal(size=(V, E)) * 1.5 / np.sqrt(E)  # logits spread over a few units
  return x, w, rng.integers(0, V, size=(B, T)), rng.normal(size=(B, T))


def kernel_and_grads(x, w, t, g, dtype=jnp.float32, plan=None):
  f = lambda x, w: linear_ce.token_nll(x, w, jnp.asarray(t), plan=plan)
  nll, vjp = jax.vjp(f, jnp.asarray(x, dtype), jnp.asarray(w, dtype))
  dx, dw = vjp(jnp.asarray(g, jnp.float32))
  return nll, dx, dw


@pytest.mark.parametrize(
  "shape",
  [(2, 32, 48, 80), (1, 64, 128, 256), (3, 16, 16, 16)],
  ids=["odd-blocks", "several-blocks", "one-block"],
)
def test_float32_matches_float64(shape):
  """Widths and vocabularies that are not powers of two (blocks of 16), several blocks on every
  side (a smaller plan), one block on every side."""
  x, w, t, g = inputs(*shape)
  plan = linear_ce.Plan(bn=16, bv=32, be=32, bn_dx=16, bv_dw=16, bn_dw=16)
  nll, dx, dw = kernel_and_grads(x, w, t, g, plan=plan)
  want_nll, want_dx, want_dw = float64_parts(x, w, t, g)
  assert nll.dtype == dx.dtype == dw.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(nll), want_nll, rtol=2e-6, atol=2e-6)
  np.testing.assert_allclose(np.asarray(dx), want_dx, rtol=2e-5, atol=2e-6)
  np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=2e-5, atol=2e-6)


def test_bfloat16_inputs_give_the_loss_of_the_rounded_inputs():
  """Under a bfloat16 model x and W are bfloat16 and everything after the products float32: the
  loss is that of the rounded x and W to float32 accuracy (the unfused step also rounds the
  logits to bfloat16); the gradients are within bfloat16's rounding of d and of their own."""
  x, w, t, g = inputs(2, 64, 64, 128, seed=3)
  xb, wb = (
    np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64) for a in (x, w)
  )
  nll, dx, dw = kernel_and_grads(x, w, t, g, jnp.bfloat16)
  want_nll, want_dx, want_dw = float64_parts(xb, wb, t, g)
  assert dx.dtype == dw.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(nll), want_nll, rtol=1e-5, atol=1e-5)
  for got, want in ((dx, want_dx), (dw, want_dw)):
    err = np.abs(np.asarray(got, np.float64) - want).max()
    assert err <= 0.02 * np.abs(want).max(), err


def test_a_float32_weight_gets_a_float32_gradient():
  """The trainer passes the float32 master weight with bfloat16 x: the kernels read W rounded
  to bfloat16, and dW comes back float32, the sum of the bfloat16 products unrounded."""
  x, w, t, g = inputs(2, 64, 64, 128, seed=4)
  xb, wb = (
    np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64) for a in (x, w)
  )
  f = lambda x, w: linear_ce.token_nll(x, w, jnp.asarray(t))
  nll, vjp = jax.vjp(f, jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.float32))
  dx, dw = vjp(jnp.asarray(g, jnp.float32))
  want_nll, _, want_dw = float64_parts(xb, wb, t, g)
  assert dx.dtype == jnp.bfloat16 and dw.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(nll), want_nll, rtol=1e-5, atol=1e-5)
  # d is rounded to bfloat16 before the product (as in the unfused step), dW is not.
  assert np.abs(np.asarray(dw) - want_dw).max() <= 0.01 * np.abs(want_dw).max()


def mesh_of(shape):
  return jax.make_mesh(
    shape, ("data", "fsdp", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 3
  )


@pytest.mark.parametrize(
  "shape, V",
  [((2, 2, 2), 128), ((1, 2, 4), 128), ((1, 8, 1), 128), ((4, 1, 2), 128), ((1, 2, 4), 80)],
  ids=["2x2x2", "1x2x4", "1x8x1", "4x1x2", "1x2x4-classes-whole"],
)
def test_sharded_equals_unsharded(shape, V):
  """Under a (data, fsdp, tensor) mesh the tokens are split over data and fsdp, the classes
  over tensor (each device makes the logits of its classes; the log-sum-exps combine), dx is
  summed over tensor and dW reduce-scattered over fsdp: the same losses and gradients as one
  device, to float32 rounding (partial sums add in another order), and dW arrives split as W
  is (rows over tensor, columns over fsdp). 80 classes do not split over 4 devices in blocks of
  16: W is then whole on every device."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py gives 8 CPU devices)")
  x, w, t, g = inputs(8, 16, 32, V, seed=5)
  want = kernel_and_grads(x, w, t, g)
  with jax.set_mesh(mesh_of(shape)):
    step = jax.jit(kernel_and_grads)
    got = step(x, w, t, g)
    program = step.lower(x, w, t, g).as_text()
  data, fsdp, tensor = shape
  assert got[1].sharding.shard_shape(x.shape) == (8 // (data * fsdp), 16, 32)
  split = tensor if V % (tensor * 16) == 0 else 1
  assert got[2].sharding.shard_shape(w.shape) == (V // split, 32 // fsdp)
  assert ("reduce_scatter" in program) == (fsdp > 1)
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_each_devices_tokens_must_fill_a_block():
  """The tokens are split over the data-parallel devices, so each device's share must be a
  multiple of 16 too: 8 sequences of 24 tokens over 8 devices is refused, not cut short."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 devices (tests/conftest.py gives 8 CPU devices)")
  with (
    jax.set_mesh(mesh_of((8, 1, 1))),
    pytest.raises(ValueError, match=r"got 24 \(8 sequences split over 8"),
  ):
    linear_ce.token_nll(jnp.zeros((8, 24, 32)), jnp.zeros((64, 32)), jnp.zeros((8, 24), jnp.int32))


def test_training_loss_equals_the_unfused_loss_with_a_mask():
  """loss.fused_cross_entropy of (x, W) == loss.cross_entropy of the float32 logits x W^T, with
  a loss mask, value and gradients."""
  x, w, t, _ = inputs(2, 32, 48, 96, seed=7)
  mask = jnp.asarray(np.random.default_rng(1).random((2, 32)) < 0.7)
  targets = jnp.asarray(t)
  fused = lambda x, w: loss_lib.fused_cross_entropy(x, w, targets, mask)[0]
  plain = lambda x, w: loss_lib.cross_entropy(jnp.einsum("bte,ve->btv", x, w), targets, mask)[0]
  args = (jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
  got, got_grads = jax.value_and_grad(fused, argnums=(0, 1))(*args)
  want, want_grads = jax.value_and_grad(plain, argnums=(0, 1))(*args)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
  for a, b in zip(got_grads, want_grads):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_refusals_name_the_problem(monkeypatch):
  x = jnp.zeros((1, 24, 32))
  with pytest.raises(ValueError, match="multiple of 16"):
    linear_ce.token_nll(x, jnp.zeros((64, 32)), jnp.zeros((1, 24), jnp.int32))
  with pytest.raises(ValueError, match=r"w must be \[V, E\]"):
    linear_ce.token_nll(jnp.zeros((1, 32, 32)), jnp.zeros((32, 64)), jnp.zeros((1, 32), jnp.int32))
  monkeypatch.setattr(linear_ce.platform, "target_platform", lambda: "tpu")
  with pytest.raises(ValueError, match="optim.loss_impl=xla"):
    linear_ce.token_nll(jnp.zeros((1, 32, 32)), jnp.zeros((64, 32)), jnp.zeros((1, 32), jnp.int32))
