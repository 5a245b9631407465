"""The RoPE-scaling family against values derived by hand, and the HF-style dispatcher."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import scaling

PLAIN8 = np.array([1.0, 0.1, 0.01, 0.001])  # rope_frequencies(8, base=1e4)


def test_default_and_factor_one_return_the_plain_table():
  plain = np.asarray(rj.rope_frequencies(64))
  for fn in (lambda: scaling.default(64),
             lambda: scaling.linear(64, factor=1.0),
             lambda: scaling.ntk(64, factor=1.0),
             lambda: scaling.yarn(64, factor=1.0, original_max_len=1024),
             lambda: scaling.dynamic_yarn(64, original_max_len=1024, seq_len=512),
             lambda: scaling.dynamic_ntk(64, factor=4.0, original_max_len=1024, seq_len=1024),
             lambda: scaling.llama3(64, base=10000.0, factor=1.0, original_max_len=1024)):
    inv, att = fn()
    np.testing.assert_allclose(inv, plain, rtol=1e-6)
    assert att == 1.0


def test_linear_by_hand():
  inv, att = scaling.linear(8, factor=4.0)
  np.testing.assert_allclose(inv, PLAIN8 / 4, rtol=1e-6)
  assert att == 1.0


def test_ntk_by_hand():
  # base' = 1e4 * 4^(8/6); pair 0 keeps 1, pair 3 (exponent 6/8) becomes 1e-3 / 4 exactly.
  inv, _ = scaling.ntk(8, factor=4.0)
  new_base = 1e4 * 4 ** (8 / 6)
  np.testing.assert_allclose(inv, new_base ** -(np.arange(4) * 2 / 8), rtol=1e-6)
  np.testing.assert_allclose([inv[0], inv[3]], [1.0, 1e-3 / 4], rtol=1e-6)


def test_dynamic_ntk_by_hand():
  # L = 2 * L0 with factor 2: base' = base * (2 * 2 - 1)^(d/(d-2)) = base * 3^(8/6).
  inv, _ = scaling.dynamic_ntk(8, factor=2.0, original_max_len=100, seq_len=200)
  np.testing.assert_allclose(inv[3], 1e-3 / 3, rtol=1e-6)
  np.testing.assert_allclose(inv, (1e4 * 3 ** (8 / 6)) ** -(np.arange(4) / 4), rtol=1e-6)
  traced, _ = jax.jit(lambda n: scaling.dynamic_ntk(8, factor=2.0, original_max_len=100,
                                                    seq_len=n))(jnp.int32(200))
  np.testing.assert_allclose(traced, inv, rtol=1e-5)


def test_yarn_by_hand_truncated():
  # d=8, base=1e4, L0=1024: correction dims 8 ln(1024/(2 pi r)) / (2 ln 1e4) are 0.707 (r=32)
  # and 2.212 (r=1); floor/ceil give the ramp [0, 3]: weights of extrapolation 1, 2/3, 1/3, 0.
  low, high = scaling.yarn_correction_range(8, base=1e4, original_max_len=1024, beta_fast=32,
                                            beta_slow=1)
  assert (low, high) == (0, 3)
  inv, att = scaling.yarn(8, factor=4.0, original_max_len=1024)
  expected = [1.0, 0.1 * 2 / 3 + 0.025 / 3, 0.01 / 3 + 0.0025 * 2 / 3, 0.00025]
  np.testing.assert_allclose(inv, expected, rtol=1e-6)
  np.testing.assert_allclose(att, 0.1 * math.log(4.0) + 1.0, rtol=1e-12)


def test_yarn_by_hand_untruncated():
  low = 8 * math.log(1024 / (2 * math.pi * 32)) / (2 * math.log(1e4))
  high = 8 * math.log(1024 / (2 * math.pi)) / (2 * math.log(1e4))
  np.testing.assert_allclose([low, high], [0.70700, 2.21214], atol=1e-4)
  inv, _ = scaling.yarn(8, factor=2.0, original_max_len=1024, truncate=False)
  for m in range(4):
    ramp = min(max((m - low) / (high - low), 0.0), 1.0)
    want = PLAIN8[m] * (1 - ramp) + PLAIN8[m] / 2 * ramp
    np.testing.assert_allclose(inv[m], want, rtol=1e-6)


def test_yarn_properties_at_gpt2_shape():
  """d=64, L0=1024, s=16: fast pairs untouched, slow pairs interpolated by s, monotone blend."""
  d, L0, s = 64, 1024, 16.0
  inv, att = scaling.yarn(d, factor=s, original_max_len=L0)
  plain = np.asarray(rj.rope_frequencies(d), np.float64)
  inv = np.asarray(inv, np.float64)
  turns = L0 * plain / (2 * np.pi)
  fast, slow = turns > 64, turns < 0.5
  assert fast.sum() >= 3 and slow.sum() >= 3
  np.testing.assert_allclose(inv[fast], plain[fast], rtol=1e-6)
  np.testing.assert_allclose(inv[slow], plain[slow] / s, rtol=1e-6)
  ratio = plain / inv
  assert np.all(np.diff(ratio) >= -1e-6) and ratio.min() >= 1 - 1e-6 and ratio.max() <= s + 1e-4
  np.testing.assert_allclose(att, 0.1 * math.log(16) + 1, rtol=1e-12)


def test_yarn_traced_factor_matches_static_and_deepseek_mscale():
  static, att = scaling.yarn(32, factor=8.0, original_max_len=512)
  traced, att_t = jax.jit(lambda s: scaling.yarn(32, factor=s, original_max_len=512))(8.0)
  np.testing.assert_allclose(traced, static, rtol=1e-6)
  np.testing.assert_allclose(att_t, att, rtol=1e-6)
  _, att_ds = scaling.yarn(32, factor=40.0, original_max_len=4096, mscale=1.0, mscale_all_dim=0.707)
  want = (0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
  np.testing.assert_allclose(att_ds, want, rtol=1e-12)
  _, att_fixed = scaling.yarn(32, factor=4.0, original_max_len=512, attention_factor=1.5)
  assert att_fixed == 1.5


def test_dynamic_yarn_follows_length():
  inv, att = scaling.dynamic_yarn(16, original_max_len=256, seq_len=1024)
  inv4, att4 = scaling.yarn(16, factor=4.0, original_max_len=256)
  np.testing.assert_allclose(inv, inv4, rtol=1e-7)
  assert att == att4
  inv_t, att_t = jax.jit(lambda n: scaling.dynamic_yarn(16, original_max_len=256, seq_len=n))(
      jnp.int32(1024))
  np.testing.assert_allclose(inv_t, inv4, rtol=1e-5)
  np.testing.assert_allclose(att_t, att4, rtol=1e-6)


def test_llama3_by_hand():
  # d=8, base 1e4, L0=100: wavelengths 2 pi / inv = 6.28, 62.8, 628, 6283; bands at 100/4 = 25
  # and 100/1 = 100. Pair 0 kept, pairs 2-3 divided by 8, pair 1 blended with
  # smooth = (100 / 62.83 - 1) / (4 - 1).
  inv, att = scaling.llama3(8, base=1e4, factor=8.0, original_max_len=100)
  smooth = (100 / (2 * math.pi / 0.1) - 1) / 3
  expected = [1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8]
  np.testing.assert_allclose(inv, expected, rtol=1e-6)
  assert att == 1.0


def test_longrope_by_hand():
  short, long = [1.0, 1.0, 2.0, 2.0], [1.0, 2.0, 4.0, 8.0]
  kw = dict(short_factor=short, long_factor=long, original_max_len=1024, max_len=4096)
  inv_s, att = scaling.longrope(8, seq_len=1000, **kw)
  inv_l, _ = scaling.longrope(8, seq_len=2000, **kw)
  np.testing.assert_allclose(inv_s, PLAIN8 / np.array(short), rtol=1e-6)
  np.testing.assert_allclose(inv_l, PLAIN8 / np.array(long), rtol=1e-6)
  np.testing.assert_allclose(att, math.sqrt(1 + math.log(4) / math.log(1024)), rtol=1e-12)
  traced, _ = jax.jit(lambda n: scaling.longrope(8, seq_len=n, **kw))(jnp.int32(2000))
  np.testing.assert_allclose(traced, inv_l, rtol=1e-6)
  with pytest.raises(ValueError, match="4 entries"):
    scaling.longrope(8, short_factor=[1.0], long_factor=long, original_max_len=1024)


def test_hf_dict_dispatch_matches_direct_calls():
  d = 16
  cases = [
      ({"rope_type": "linear", "factor": 2.0}, scaling.linear(d, factor=2.0)),
      ({"type": "linear", "factor": 3.0}, scaling.linear(d, factor=3.0)),  # legacy key
      ({"rope_type": "ntk", "factor": 2.0}, scaling.ntk(d, factor=2.0)),
      ({"rope_type": "dynamic", "factor": 2.0}, scaling.dynamic_ntk(
          d, factor=2.0, original_max_len=128, seq_len=512)),
      ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 16}, scaling.yarn(d, factor=4.0, original_max_len=256, beta_fast=16)),
      ({"rope_type": "dynamic_yarn"}, scaling.yarn(d, factor=4.0, original_max_len=128)),
      ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64},
       scaling.llama3(d, base=1e4, factor=8.0, original_max_len=64)),
      ({"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0},
       scaling.yarn(d, base=500.0, factor=2.0, original_max_len=128)),
  ]
  for cfg, (want_inv, want_att) in cases:
    inv, att = scaling.from_config(cfg, d, base=1e4, max_len=128, seq_len=512)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-7, err_msg=str(cfg))
    assert att == want_att, cfg
  inv, att = scaling.from_config(None, d)
  np.testing.assert_allclose(inv, rj.rope_frequencies(d))


def test_hf_dict_errors_name_the_problem():
  with pytest.raises(ValueError, match="unknown rope_type 'su'"):
    scaling.from_config({"rope_type": "su"}, 16)
  with pytest.raises(ValueError, match=r"unknown keys \['facter'\]"):
    scaling.from_config({"rope_type": "yarn", "facter": 2.0}, 16, max_len=128)
  with pytest.raises(ValueError, match="needs the key 'factor'"):
    scaling.from_config({"rope_type": "linear"}, 16)
  with pytest.raises(ValueError, match="original_max_position_embeddings"):
    scaling.from_config({"rope_type": "yarn", "factor": 2.0}, 16)
  with pytest.raises(ValueError, match="seq_len"):
    scaling.from_config({"rope_type": "dynamic_yarn"}, 16, max_len=128)
  with pytest.raises(ValueError, match="factor must be a number >= 1"):
    scaling.yarn(16, factor=0.5, original_max_len=128)
  with pytest.raises(ValueError, match="even"):
    scaling.yarn(15, factor=2.0, original_max_len=128)
