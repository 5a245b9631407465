"""The RoPE-scaling family against values derived by hand, the HF-style dispatcher and the
typed RopeScaling.

Every hand check runs eagerly and under jit (chex variants): under jit the static arguments are
closed over and the length / factor arguments that may be traced are passed as arrays."""

import dataclasses
import json
import math
import pickle

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import rove_jax as rj
from rove_jax import scaling

PLAIN8 = np.array([1.0, 0.1, 0.01, 0.001])  # rope_frequencies(8, base=1e4)
PLAIN8_BASE100 = 100.0 ** -(np.arange(4) / 4)  # rope_frequencies(8, base=100)


class ScalingByHand(chex.TestCase):
  def assert_factor(self, att, want, rtol=1e-12):
    """Attention factors are Python floats (float64) eagerly; jit returns them as float32."""
    if self.variant.type == chex.ChexVariantType.WITH_JIT:
      rtol = max(rtol, 1e-7)
    chex.assert_trees_all_close(np.float64(att), np.float64(want), rtol=rtol)

  @chex.variants(with_jit=True, without_jit=True)
  def test_default_and_factor_one_return_the_plain_table(self):
    plain = np.asarray(rj.rope_frequencies(64))
    for fn in (
      lambda: scaling.default(64),
      lambda: scaling.linear(64, factor=1.0),
      lambda: scaling.ntk(64, factor=1.0),
      lambda: scaling.yarn(64, factor=1.0, original_max_len=1024),
      lambda: scaling.dynamic_yarn(64, original_max_len=1024, seq_len=512),
      lambda: scaling.dynamic_ntk(64, factor=4.0, original_max_len=1024, seq_len=1024),
      lambda: scaling.llama3(64, base=10000.0, factor=1.0, original_max_len=1024),
    ):
      inv, att = self.variant(fn)()
      chex.assert_shape(inv, (32,))
      chex.assert_trees_all_close(inv, plain, rtol=1e-6)
      self.assertEqual(float(att), 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_linear_by_hand(self):
    inv, att = self.variant(lambda: scaling.linear(8, factor=4.0))()
    chex.assert_trees_all_close(inv, PLAIN8 / 4, rtol=1e-6)
    self.assertEqual(float(att), 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_ntk_by_hand(self):
    # base' = 1e4 * 4^(8/6); pair 0 keeps 1, pair 3 (exponent 6/8) becomes 1e-3 / 4 exactly.
    inv, _ = self.variant(lambda: scaling.ntk(8, factor=4.0))()
    new_base = 1e4 * 4 ** (8 / 6)
    chex.assert_trees_all_close(inv, new_base ** -(np.arange(4) * 2 / 8), rtol=1e-6)
    chex.assert_trees_all_close(np.array([inv[0], inv[3]]), np.array([1.0, 1e-3 / 4]), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dynamic_ntk_by_hand(self):
    # L = 2 * L0 with factor 2: base' = base * (2 * 2 - 1)^(d/(d-2)) = base * 3^(8/6).
    fn = self.variant(lambda n: scaling.dynamic_ntk(8, factor=2.0, original_max_len=100, seq_len=n))
    inv, _ = fn(200)
    chex.assert_trees_all_close(inv[3], 1e-3 / 3, rtol=1e-6)
    chex.assert_trees_all_close(inv, (1e4 * 3 ** (8 / 6)) ** -(np.arange(4) / 4), rtol=1e-6)
    traced, _ = fn(jnp.int32(200))  # an array length: the traced branch, also eagerly
    chex.assert_trees_all_close(traced, inv, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_yarn_by_hand_truncated(self):
    # d=8, base=1e4, L0=1024: correction dims 8 ln(1024/(2 pi r)) / (2 ln 1e4) are 0.707 (r=32)
    # and 2.212 (r=1); floor/ceil give the ramp [0, 3]: weights of extrapolation 1, 2/3, 1/3, 0.
    low, high = scaling.yarn_correction_range(
      8, base=1e4, original_max_len=1024, beta_fast=32, beta_slow=1
    )
    assert (low, high) == (0, 3)
    inv, att = self.variant(lambda s: scaling.yarn(8, factor=s, original_max_len=1024))(4.0)
    expected = np.array([1.0, 0.1 * 2 / 3 + 0.025 / 3, 0.01 / 3 + 0.0025 * 2 / 3, 0.00025])
    chex.assert_trees_all_close(inv, expected, rtol=1e-6)
    self.assert_factor(att, 0.1 * math.log(4.0) + 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_yarn_by_hand_untruncated(self):
    low = 8 * math.log(1024 / (2 * math.pi * 32)) / (2 * math.log(1e4))
    high = 8 * math.log(1024 / (2 * math.pi)) / (2 * math.log(1e4))
    chex.assert_trees_all_close(
      np.array([low, high]), np.array([0.70700, 2.21214]), atol=1e-4, rtol=1e-7
    )
    inv, _ = self.variant(
      lambda: scaling.yarn(8, factor=2.0, original_max_len=1024, truncate=False)
    )()
    for m in range(4):
      ramp = min(max((m - low) / (high - low), 0.0), 1.0)
      want = PLAIN8[m] * (1 - ramp) + PLAIN8[m] / 2 * ramp
      chex.assert_trees_all_close(inv[m], want, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_yarn_properties_at_gpt2_shape(self):
    """d=64, L0=1024, s=16: fast pairs untouched, slow pairs interpolated by s, monotone blend."""
    d, L0, s = 64, 1024, 16.0
    inv, att = self.variant(lambda s: scaling.yarn(d, factor=s, original_max_len=L0))(s)
    plain = np.asarray(rj.rope_frequencies(d), np.float64)
    inv = np.asarray(inv, np.float64)
    turns = L0 * plain / (2 * np.pi)
    fast, slow = turns > 64, turns < 0.5
    assert fast.sum() >= 3 and slow.sum() >= 3
    chex.assert_trees_all_close(inv[fast], plain[fast], rtol=1e-6)
    chex.assert_trees_all_close(inv[slow], plain[slow] / s, rtol=1e-6)
    ratio = plain / inv
    assert np.all(np.diff(ratio) >= -1e-6) and ratio.min() >= 1 - 1e-6
    assert ratio.max() <= s + 1e-4
    self.assert_factor(att, 0.1 * math.log(16) + 1)

  @chex.variants(with_jit=True, without_jit=True)
  def test_yarn_traced_factor_matches_static_and_deepseek_mscale(self):
    static, att = scaling.yarn(32, factor=8.0, original_max_len=512)
    traced, att_t = self.variant(lambda s: scaling.yarn(32, factor=s, original_max_len=512))(
      jnp.float32(8.0)
    )
    chex.assert_trees_all_close(traced, static, rtol=1e-6)
    chex.assert_trees_all_close(att_t, att, rtol=1e-6)
    _, att_ds = self.variant(
      lambda: scaling.yarn(32, factor=40.0, original_max_len=4096, mscale=1.0, mscale_all_dim=0.707)
    )()
    self.assert_factor(att_ds, (0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1))
    _, att_fixed = self.variant(
      lambda: scaling.yarn(32, factor=4.0, original_max_len=512, attention_factor=1.5)
    )()
    self.assertEqual(float(att_fixed), 1.5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dynamic_yarn_follows_length(self):
    inv4, att4 = scaling.yarn(16, factor=4.0, original_max_len=256)
    fn = self.variant(lambda n: scaling.dynamic_yarn(16, original_max_len=256, seq_len=n))
    inv, att = fn(1024)
    chex.assert_trees_all_close(inv, inv4, rtol=1e-5)
    self.assert_factor(att, att4, rtol=0)
    inv_t, att_t = fn(jnp.int32(1024))
    chex.assert_trees_all_close(inv_t, inv4, rtol=1e-5)
    chex.assert_trees_all_close(att_t, att4, rtol=1e-6)

  def test_dynamic_yarn_static_length_is_exactly_static_yarn(self):
    inv, att = scaling.dynamic_yarn(16, original_max_len=256, seq_len=1024)
    inv4, att4 = scaling.yarn(16, factor=4.0, original_max_len=256)
    chex.assert_trees_all_close(inv, inv4, rtol=1e-7)
    assert att == att4

  @chex.variants(with_jit=True, without_jit=True)
  def test_llama3_by_hand(self):
    # d=8, base 1e4, L0=100: wavelengths 2 pi / inv = 6.28, 62.8, 628, 6283; bands at 100/4 = 25
    # and 100/1 = 100. Pair 0 kept, pairs 2-3 divided by 8, pair 1 blended with
    # smooth = (100 / 62.83 - 1) / (4 - 1).
    inv, att = self.variant(lambda: scaling.llama3(8, base=1e4, factor=8.0, original_max_len=100))()
    smooth = (100 / (2 * math.pi / 0.1) - 1) / 3
    expected = np.array([1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8])
    chex.assert_trees_all_close(inv, expected, rtol=1e-6)
    self.assertEqual(float(att), 1.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_longrope_by_hand(self):
    short, long = [1.0, 1.0, 2.0, 2.0], [1.0, 2.0, 4.0, 8.0]
    kw = dict(short_factor=short, long_factor=long, original_max_len=1024, max_len=4096)
    fn = self.variant(lambda n: scaling.longrope(8, seq_len=n, **kw))
    inv_s, att = fn(1000)
    inv_l, _ = fn(2000)
    chex.assert_trees_all_close(inv_s, PLAIN8 / np.array(short), rtol=1e-6)
    chex.assert_trees_all_close(inv_l, PLAIN8 / np.array(long), rtol=1e-6)
    self.assert_factor(att, math.sqrt(1 + math.log(4) / math.log(1024)))
    traced, _ = fn(jnp.int32(2000))
    chex.assert_trees_all_close(traced, inv_l, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(False, True)  # the length as a Python int / as an array
  def test_longrope_from_config_by_hand(self, array_len):
    """A Phi-3-style dict through from_config: short factors up to L0 = 1024 tokens inclusive,
    long factors beyond; extension factor max_len / L0 = 4 and its attention factor."""
    short, long = [1.0, 1.5, 2.0, 3.0], [1.0, 2.0, 4.0, 8.0]
    cfg = {
      "rope_type": "longrope",
      "short_factor": short,
      "long_factor": long,
      "original_max_position_embeddings": 1024,
    }
    fn = self.variant(lambda n: scaling.from_config(cfg, 8, base=1e4, max_len=4096, seq_len=n))
    as_len = jnp.int32 if array_len else int
    want_att = math.sqrt(1 + math.log(4096 / 1024) / math.log(1024))  # sqrt(1 + 0.2) = 1.0954
    for seq_len, factors in ((1000, short), (1024, short), (1025, long), (3000, long)):
      inv, att = fn(as_len(seq_len))
      chex.assert_shape(inv, (4,))
      chex.assert_trees_all_close(inv, PLAIN8 / np.array(factors), rtol=1e-6)
      self.assert_factor(att, want_att)
    np.testing.assert_allclose(want_att, math.sqrt(1.2), rtol=1e-12)
    # No original_max_position_embeddings: L0 is the model's max_len and "factor" sets the
    # attention factor; rope_theta replaces the base.
    cfg2 = {
      "rope_type": "longrope",
      "short_factor": short,
      "long_factor": long,
      "factor": 2.0,
      "rope_theta": 100.0,
    }
    fn2 = self.variant(lambda n: scaling.from_config(cfg2, 8, max_len=128, seq_len=n))
    inv, att = fn2(as_len(128))
    chex.assert_trees_all_close(inv, PLAIN8_BASE100 / np.array(short), rtol=1e-6)
    self.assert_factor(att, math.sqrt(1 + math.log(2) / math.log(128)))
    inv, _ = fn2(as_len(129))
    chex.assert_trees_all_close(inv, PLAIN8_BASE100 / np.array(long), rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hf_dict_dispatch_matches_direct_calls(self):
    d = 16
    cases = [
      ({"rope_type": "linear", "factor": 2.0}, scaling.linear(d, factor=2.0)),
      ({"type": "linear", "factor": 3.0}, scaling.linear(d, factor=3.0)),  # legacy key
      ({"rope_type": "ntk", "factor": 2.0}, scaling.ntk(d, factor=2.0)),
      (
        {"rope_type": "dynamic", "factor": 2.0},
        scaling.dynamic_ntk(d, factor=2.0, original_max_len=128, seq_len=512),
      ),
      (
        {
          "rope_type": "yarn",
          "factor": 4.0,
          "original_max_position_embeddings": 256,
          "beta_fast": 16,
        },
        scaling.yarn(d, factor=4.0, original_max_len=256, beta_fast=16),
      ),
      ({"rope_type": "dynamic_yarn"}, scaling.yarn(d, factor=4.0, original_max_len=128)),
      (
        {
          "rope_type": "llama3",
          "factor": 8.0,
          "low_freq_factor": 1.0,
          "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64,
        },
        scaling.llama3(d, base=1e4, factor=8.0, original_max_len=64),
      ),
      (
        {"rope_type": "yarn", "factor": 2.0, "rope_theta": 500.0},
        scaling.yarn(d, base=500.0, factor=2.0, original_max_len=128),
      ),
    ]
    for cfg, (want_inv, want_att) in cases:
      inv, att = self.variant(
        lambda: scaling.from_config(cfg, d, base=1e4, max_len=128, seq_len=512)
      )()
      chex.assert_trees_all_close(inv, want_inv, rtol=1e-7, custom_message=str(cfg))
      self.assert_factor(att, want_att, rtol=0)
    inv, att = self.variant(lambda: scaling.from_config(None, d))()
    chex.assert_trees_all_close(inv, rj.rope_frequencies(d), rtol=1e-7)


def test_hf_dict_dispatch_is_exact_eagerly():
  """Eagerly the dispatcher returns what the direct call returns, to the bit."""
  for cfg, want in (
    (
      {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16},
      scaling.yarn(16, factor=4.0, original_max_len=128, beta_fast=16),
    ),
    ({"rope_type": "dynamic_yarn"}, scaling.yarn(16, factor=4.0, original_max_len=128)),
  ):
    inv, att = scaling.from_config(cfg, 16, max_len=128, seq_len=512)
    chex.assert_trees_all_equal(inv, want[0])
    assert att == want[1], cfg


def test_longrope_wrong_length_is_a_clear_error():
  with pytest.raises(ValueError, match="4 entries"):
    scaling.longrope(8, short_factor=[1.0], long_factor=[1.0, 2.0, 4.0, 8.0], original_max_len=1024)


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


# ------------------------------------------------- transformers-v5 dicts (cases 2-5)


def test_v5_dicts_keep_partial_rotary_factor_and_rope_theta():
  """Every type takes transformers v5's rope_parameters as a model config holds them; the
  partial factor is checked against rot_dim when head_dim is given."""
  common = {"rope_theta": 100.0, "partial_rotary_factor": 0.5}
  for cfg in (
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4},
  ):
    inv, _ = scaling.from_config({**cfg, **common}, 8, max_len=128, seq_len=64, head_dim=16)
    assert inv.shape == (4,), cfg
  inv, _ = scaling.from_config({"rope_type": "default", **common}, 8, head_dim=16)
  chex.assert_trees_all_close(inv, PLAIN8_BASE100, rtol=1e-7)
  with pytest.raises(
    ValueError,
    match=r"partial_rotary_factor=0.5 of head_dim=16 turns .* 8 "
    r"dims, but rot_dim=16; pass rot_dim=8",
  ):
    scaling.from_config({"rope_type": "default", **common}, 16, head_dim=16)
  with pytest.raises(ValueError, match=r"partial_rotary_factor must be a number in \(0, 1\]"):
    scaling.from_config({"partial_rotary_factor": 1.5}, 16)
  # transformers' rounding: int(80 * 0.4) = 32 (80 * 0.4 is 32.00000000000001).
  inv, _ = scaling.from_config({"partial_rotary_factor": 0.4}, 32, head_dim=80)
  assert inv.shape == (16,)


def test_unread_keys_strict_errors_or_warnings():
  """Keys a type does not read: an error by default (typos in project configs), ignored with a
  warning under strict=False, as transformers does."""
  cfg = {"rope_type": "linear", "factor": 2.0, "attention_factor": 1.5}
  with pytest.raises(ValueError, match=r"unknown keys \['attention_factor'\].*strict=False"):
    scaling.from_config(cfg, 8)
  with pytest.warns(UserWarning, match=r"ignoring keys \['attention_factor'\]"):
    inv, att = scaling.from_config(cfg, 8, strict=False)
  chex.assert_trees_all_close(inv, PLAIN8 / 2, rtol=1e-7)
  assert att == 1.0  # ignored, as in transformers
  qwen2_vl = {"type": "mrope", "mrope_section": [1, 1, 2]}  # v4 spelling of default RoPE
  with pytest.warns(UserWarning, match="mrope_section"):
    inv, _ = scaling.from_config(qwen2_vl, 8, strict=False)
  chex.assert_trees_all_close(inv, PLAIN8, rtol=1e-7)


def test_longrope_explicit_factor_wins_over_max_len():
  """v5-dict case 3: factor 4 with L0 4096 and max_len 131072 gives sqrt(1 + ln 4 / ln 4096)
  = sqrt(7 / 6) = 1.080123, not the ratio 32's 1.190238."""
  kw = dict(short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_len=4096, max_len=131072)
  _, att = scaling.longrope(8, factor=4.0, **kw)
  np.testing.assert_allclose(att, math.sqrt(7 / 6), rtol=1e-12)
  np.testing.assert_allclose(att, 1.080123, atol=1e-6)
  _, att = scaling.longrope(8, **kw)  # no factor: max_len / L0 = 32
  np.testing.assert_allclose(att, 1.190238, atol=1e-6)


def test_dynamic_starts_at_max_len_like_transformers():
  """v5-dict case 4: the dict's original_max_position_embeddings (1024) is ignored with a
  warning; up to max_len (4096) the table is the plain one, and beyond it grows from there."""
  cfg = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 1024}
  with pytest.warns(UserWarning, match="is ignored"):
    inv, _ = scaling.from_config(cfg, 64, max_len=4096, seq_len=4096)
  np.testing.assert_allclose(inv[-1], 1e4 ** (-62 / 64), rtol=1e-6)  # 1.3335e-04
  with pytest.warns(UserWarning):
    inv, _ = scaling.from_config(cfg, 64, max_len=4096, seq_len=8192)
  want, _ = scaling.dynamic_ntk(64, factor=4.0, original_max_len=4096, seq_len=8192)
  chex.assert_trees_all_equal(inv, want)
  inv, _ = scaling.from_config(cfg, 8, seq_len=2048)  # no max_len: the dict's length
  chex.assert_trees_all_equal(
    inv, scaling.dynamic_ntk(8, factor=4.0, original_max_len=1024, seq_len=2048)[0]
  )


def test_yarn_without_factor_takes_max_len_over_original():
  cfg = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 1024}
  inv, att = scaling.from_config(cfg, 8, max_len=4096)
  want = scaling.yarn(8, factor=4.0, original_max_len=1024)
  chex.assert_trees_all_equal(inv, want[0])
  assert att == want[1]
  with pytest.raises(ValueError, match="needs the key 'factor'"):
    scaling.from_config(cfg, 8)


def test_proportional_and_axial_by_hand():
  # proportional: the whole head (D=8) at base^(-2m/8) for the first int(0.5 * 8 // 2) = 2
  # pairs, zero (no turn) for the other 2; then / factor.
  inv, att = scaling.from_config(
    {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0}, 8, head_dim=8
  )
  chex.assert_trees_all_close(inv, np.array([1.0, 0.1, 0.0, 0.0]) / 2, rtol=1e-7)
  assert att == 1.0
  with pytest.raises(ValueError, match="rotates the whole head"):
    scaling.from_config({"rope_type": "proportional", "partial_rotary_factor": 0.5}, 4, head_dim=8)
  # axial: two copies of the plain table of D/2 dims, one per image axis.
  (h, w), att = scaling.from_config({"rope_type": "axial", "rope_theta": 100.0}, 16)
  chex.assert_trees_all_close(h, PLAIN8_BASE100, rtol=1e-7)
  chex.assert_trees_all_equal(h, w)
  assert att == 1.0
  with pytest.raises(ValueError, match="multiple of 4"):
    scaling.axial(6)


def test_rope_from_hf_config_errors_name_the_problem(tmp_path):
  with pytest.raises(ValueError, match="no head dimension"):
    rj.rope_from_hf_config({"rope_theta": 1e4})
  nested = {
    "head_dim": 16,
    "rope_parameters": {
      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    },
  }
  with pytest.raises(ValueError, match=r"nested by layer type .*pass layer_type="):
    rj.rope_from_hf_config(nested)
  rope = rj.rope_from_hf_config(nested, layer_type="full_attention")
  chex.assert_trees_all_close(
    rope.inv_freq, np.asarray(rj.rope_frequencies(16, base=1e6)) / 8, rtol=1e-6
  )
  with pytest.raises(ValueError, match="odd"):
    rj.rope_from_hf_config({"head_dim": 10, "partial_rotary_factor": 0.5})
  with pytest.raises(ValueError, match="cannot read the transformers config"):
    rj.rope_from_hf_config(tmp_path / "missing.json")
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(ValueError, match="not a config object"):
    rj.rope_from_hf_config(tmp_path)
  with pytest.raises(ValueError, match="unknown keys"):
    rj.rope_from_hf_config(
      {"head_dim": 8, "rope_scaling": {"type": "linear", "factor": 2, "facter": 2}}, strict=True
    )


def test_rope_from_hf_config_reads_a_multimodal_text_config():
  with pytest.warns(UserWarning, match=r"ignoring keys \['mrope_section'\]"):
    rope = rj.rope_from_hf_config(
      {
        "text_config": {
          "hidden_size": 64,
          "num_attention_heads": 4,
          "rope_theta": 100.0,
          "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        }
      }
    )
  assert (rope.rot_dim, rope.rope_type, rope.attention_factor) == (16, "default", 1.0)
  chex.assert_trees_all_close(rope.inv_freq, 100.0 ** -(np.arange(8) / 8), rtol=1e-6)


# ------------------------------------------------------------------------------ RopeScaling

# One setting of every rope_type (and the v4 aliases), as a transformers-style dict.
EVERY_TYPE = [
  {"rope_type": "default"},
  {"rope_type": "default", "rope_theta": 500.0, "partial_rotary_factor": 0.5},
  {"rope_type": "linear", "factor": 2.0},
  {"type": "linear", "factor": 3},  # v4 spelling, an int factor
  {"rope_type": "ntk", "factor": 2.0},
  {"rope_type": "dynamic", "factor": 2.0},
  {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 128},
  {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "beta_fast": 16.0,
    "beta_slow": 2.0,
    "truncate": False,
  },
  {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707},
  {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.5},
  {"rope_type": "dynamic_yarn", "original_max_position_embeddings": 64},
  {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
  },
  {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.5, 2.0, 3.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
    "original_max_position_embeddings": 64,
  },
  {
    "rope_type": "longrope",
    "short_factor": [1.0] * 4,
    "long_factor": [2.0] * 4,
    "factor": 4.0,
    "attention_factor": 1.2,
  },
  {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
  {"rope_type": "axial", "rope_theta": 100.0},
  {"rope_type": "pi", "factor": 2.0},  # aliases: stored by their transformers-5 names
  {"type": "mrope"},
]


@pytest.mark.parametrize("cfg", EVERY_TYPE, ids=lambda c: c.get("rope_type") or c["type"])
def test_rope_scaling_round_trips_through_its_dict(cfg):
  spec = scaling.RopeScaling.from_dict(cfg)
  plain = spec.to_dict()
  assert json.loads(json.dumps(plain)) == plain  # JSON-ready as is
  assert scaling.RopeScaling.from_dict(plain) == spec
  assert hash(scaling.RopeScaling.from_dict(json.loads(json.dumps(plain)))) == hash(spec)
  assert pickle.loads(pickle.dumps(spec)) == spec
  assert list(plain)[0] == "rope_type" and plain["rope_type"] in scaling.SPECS
  # the keys keep their transformers spelling: the dict is the one given, the type canonical
  given = {k: v for k, v in cfg.items() if k not in ("type", "rope_type")}
  assert {k: v for k, v in plain.items() if k != "rope_type"} == given


def test_each_rope_type_is_its_own_spec_built_from_its_dict():
  """One spec class per rope_type, reached alike by from_dict, RopeScaling(rope_type=...) and
  the class itself; EVERY_TYPE covers them all, and scaling.KEYS is every key they read."""
  specs = [scaling.RopeScaling.from_dict(cfg) for cfg in EVERY_TYPE]
  assert {type(spec) for spec in specs} == set(scaling.SPECS.values())
  for spec in specs:
    cls = scaling.SPECS[spec.rope_type]
    assert type(spec) is cls and isinstance(spec, scaling.RopeScaling)
    keys = {k: v for k, v in spec.to_dict().items() if k != "rope_type"}
    assert cls(**keys) == spec == scaling.RopeScaling(rope_type=spec.rope_type, **keys)
  read = {f.name for cls in scaling.SPECS.values() for f in dataclasses.fields(cls)}
  assert set(scaling.KEYS) == read | {"rope_type"} and len(scaling.KEYS) == len(read) + 1
  # one type's keys do not carry over to another
  assert scaling.LinearScaling(factor=2.0) != scaling.NTKScaling(factor=2.0)
  with pytest.raises(ValueError, match=r"type 'ntk' got unknown keys \['beta_fast'\]"):
    scaling.NTKScaling(factor=2.0, beta_fast=4.0)


@pytest.mark.parametrize("cfg", EVERY_TYPE, ids=lambda c: c.get("rope_type") or c["type"])
@pytest.mark.filterwarnings("ignore:dynamic rope")  # the ignored original length
def test_rope_scaling_frequencies_are_from_config_s_to_the_bit(cfg):
  """frequencies on the parsed setting, from_config on the dict and on the setting agree exactly,
  eagerly and with a traced length."""
  spec = scaling.RopeScaling.from_dict(cfg)
  rot_dim = 16 if spec.rope_type in ("proportional", "axial") else 8
  head_dim = 16
  if spec.rope_type not in ("proportional", "axial") and spec.partial_rotary_factor is None:
    head_dim = None  # partial_rotary_factor unset: nothing to check against
  kw = dict(base=1e4, max_len=256, head_dim=head_dim)
  for seq_len in (128, 512, jnp.int32(512)):
    want = scaling.from_config(cfg, rot_dim, seq_len=seq_len, **kw)
    for got in (
      spec.frequencies(rot_dim, seq_len=seq_len, **kw),
      scaling.from_config(spec, rot_dim, seq_len=seq_len, **kw),
    ):
      chex.assert_trees_all_equal(got, want)


def test_rope_scaling_equality_and_hash_follow_the_setting():
  a = scaling.RopeScaling.from_dict({"type": "yarn", "factor": 4, "beta_fast": 32})
  b = scaling.RopeScaling(rope_type="yarn", beta_fast=32.0, factor=4.0)
  assert a == b and hash(a) == hash(b) and len({a, b}) == 1
  assert a != scaling.RopeScaling(rope_type="yarn", factor=4.0)  # beta_fast set vs unset
  assert scaling.RopeScaling.from_dict({"rope_type": "pi", "factor": 2.0}) == scaling.RopeScaling(
    rope_type="linear", factor=2.0
  )
  assert (
    scaling.RopeScaling()
    == scaling.RopeScaling.from_dict({})
    == scaling.RopeScaling(rope_type="default")
  )
  lr = scaling.RopeScaling(rope_type="longrope", short_factor=np.ones(4), long_factor=[2, 2, 2, 2])
  assert lr.short_factor == (1.0,) * 4 and lr.long_factor == (2.0,) * 4  # tuples: hashable
  hash(lr)
  with pytest.raises(dataclasses.FrozenInstanceError):
    lr.factor = 2.0
  assert repr(b) == "RopeScaling(rope_type='yarn', factor=4.0, beta_fast=32.0)"


def test_rope_scaling_is_a_static_jit_argument():
  traces = []

  def f(x, spec):
    traces.append(spec)
    inv, att = spec.frequencies(8, max_len=64, seq_len=x.shape[0])
    return x[:, None] * jnp.asarray(inv)[None] * att

  f = jax.jit(f, static_argnums=1)
  yarn = {"rope_type": "yarn", "factor": 4.0}
  out = f(jnp.ones(4), scaling.RopeScaling.from_dict(yarn))
  f(jnp.ones(4), scaling.RopeScaling.from_dict(dict(yarn)))  # an equal setting: no retrace
  assert len(traces) == 1
  inv, att = scaling.from_config(yarn, 8, max_len=64)
  chex.assert_trees_all_close(out[0], inv * att, rtol=1e-6)
  f(jnp.ones(4), scaling.RopeScaling(rope_type="yarn", factor=2.0))
  assert len(traces) == 2


def test_rope_scaling_construction_errors_name_the_problem():
  R = scaling.RopeScaling
  for kwargs, message in [
    (dict(rope_type="su"), "unknown rope_type 'su'"),
    (dict(rope_type=3), "rope_type must be a string"),
    (dict(rope_type="linear"), "type 'linear' needs the key 'factor'"),
    (dict(rope_type="longrope", short_factor=[1.0]), "needs the key 'long_factor'"),
    (
      dict(rope_type="linear", factor=2.0, beta_fast=4.0),
      r"type 'linear' got unknown keys \['beta_fast'\].*strict=False",
    ),
    (dict(rope_type="linear", factor=0.5), "linear: factor must be a number >= 1"),
    (dict(rope_type="dynamic", factor=0.5), "dynamic_ntk: factor must be a number >= 1"),
    (dict(rope_type="yarn", factor="4"), r"rope_scaling\['factor'\] must be a number, got str"),
    (dict(rope_type="yarn", factor=True), r"rope_scaling\['factor'\] must be a number"),
    (dict(rope_type="yarn", factor=float("nan")), "must be a finite number"),
    (dict(rope_type="yarn", beta_fast=1.0, beta_slow=2.0), "need beta_fast > beta_slow > 0"),
    (dict(rope_type="yarn", truncate="no"), r"\['truncate'\] must be true or false"),
    (dict(rope_type="yarn", original_max_position_embeddings=100.5), "must be a positive int"),
    (dict(rope_type="yarn", original_max_position_embeddings=0), "must be a positive int"),
    (
      dict(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0),
      "need high_freq_factor > low_freq_factor > 0",
    ),
    (
      dict(rope_type="longrope", short_factor=[1.0, -1.0], long_factor=[1.0, 1.0]),
      "short_factor entries must be positive",
    ),
    (
      dict(rope_type="longrope", short_factor="1, 2", long_factor=[1.0]),
      r"\['short_factor'\] must be a list of numbers",
    ),
    (dict(rope_type="proportional", factor=0.0), "proportional: factor must be > 0"),
    (dict(partial_rotary_factor=1.5), r"partial_rotary_factor must be a number in \(0, 1\]"),
    (dict(rope_theta=1.0), "rope_theta .* must be > 1"),
  ]:
    with pytest.raises(ValueError, match=message):
      R(**kwargs)
  with pytest.raises(ValueError, match=r"rope_scaling must be a dict .* got list"):
    R.from_dict([("rope_type", "yarn")])
  with pytest.raises(ValueError, match=r"rope_scaling must be a dict .* got str"):
    R.coerce("yarn")
  assert R.coerce(None) is None and R.coerce(R()) == R()
  assert R.coerce({"rope_type": "linear", "factor": 2.0}) == R(rope_type="linear", factor=2.0)
  # What needs the model's shape is checked by frequencies.
  with pytest.raises(ValueError, match="4 entries"):
    R(rope_type="longrope", short_factor=[1.0], long_factor=[1.0]).frequencies(8, max_len=64)


def test_from_dict_ignores_unread_keys_with_a_warning_unless_strict():
  cfg = {"rope_type": "linear", "factor": 2.0, "attention_factor": 1.5, "mrope_section": [1]}
  with pytest.raises(ValueError, match=r"unknown keys \['attention_factor', 'mrope_section'\]"):
    scaling.RopeScaling.from_dict(cfg)
  with pytest.warns(UserWarning, match=r"ignoring keys \['attention_factor', 'mrope_section'\]"):
    spec = scaling.RopeScaling.from_dict(cfg, strict=False)
  assert spec == scaling.RopeScaling(rope_type="linear", factor=2.0)
  # None is unset, and "rope_type" wins over "type"
  assert scaling.RopeScaling.from_dict(
    {"rope_type": "ntk", "type": "linear", "factor": 2.0, "rope_theta": None}
  ) == scaling.RopeScaling(rope_type="ntk", factor=2.0)
