"""rove_jax against transformers 5, from values stored in
tests/reference_data/hf_rope_reference.json.

The file is written by scripts/hf_rope_reference.py (transformers and torch are that script's
dependencies, not the tests'); its docstring says how each value was computed. Covered:
  scaling    every rope type transformers has (default, linear, dynamic, yarn, llama3, longrope,
             proportional, axial) across head_dim x partial_rotary_factor x base x factor x
             lengths, through `scaling.from_config` with the stored rope_parameters dict as is;
             the project's own ntk and dynamic_yarn against the transformers tables they equal
             (dynamic at factor 1 is NTK by L / L0; yarn at s = L / L0 is dynamic_yarn at L).
  models     config.json dicts shaped like public models' through `rope_from_hf_config`.
  attention  `rope_attention` (reference, xla, chunked kernels, a traced attention factor and
             a pre-rotated key cache) against transformers' eager attention over its
             apply_rotary_pos_emb: the attention factor on the rotated dims only.
Tolerances: tables 2e-6 relative (transformers computes in float32 torch, rove_jax in float64
rounded once), llama3's 5e-6 (transformers' float32 blend loses ~2e-6 in the smooth band where
the smoothing weight is near 0; rove_jax equals the float64 value there), attention factors
1e-6 relative, attention outputs 2e-5 absolute.
"""

import functools
import json
import math
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rove_jax as rj
from rove_jax import attention, scaling
from rove_jax.kernels import chunked

DATA = pathlib.Path(__file__).parents[1] / "reference_data" / "hf_rope_reference.json"
TABLE_RTOL, FACTOR_RTOL, OUT_ATOL = 2e-6, 1e-6, 2e-5
METHOD_TABLE_RTOL = {"llama3": 5e-6}
METHODS = ("default", "linear", "dynamic", "yarn", "llama3", "longrope", "proportional", "axial")


@functools.lru_cache(maxsize=None)
def reference():
  with open(DATA) as f:
    return json.load(f)


def cases(method):
  return [c for c in reference()["scaling"] if c["method"] == method]


def rel_err(got, want) -> float:
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape, (got.shape, want.shape)
  return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30), initial=0.0))


def rot_dim_of(case) -> int:
  params = case["rope_parameters"]
  if case["method"] in ("proportional", "axial"):
    return case["head_dim"]
  return int(case["head_dim"] * params.get("partial_rotary_factor", 1.0))


def ours(case):
  """(inv_freq, attention factor) of a stored scaling case, the dict passed as stored."""
  seq_len = case["seq_len"]
  if case["method"] == "dynamic" and seq_len is None:
    seq_len = case["max_position_embeddings"]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # dynamic's ignored original_max_position_embeddings
    return scaling.from_config(
      case["rope_parameters"],
      rot_dim_of(case),
      max_len=case["max_position_embeddings"],
      seq_len=seq_len,
      head_dim=case["head_dim"],
    )


def test_reference_file_is_small_and_covers_every_method():
  assert DATA.stat().st_size < 300_000
  assert {c["method"] for c in reference()["scaling"]} == set(METHODS)
  assert reference()["transformers"].startswith("5.")


@pytest.mark.parametrize("method", METHODS)
def test_tables_match_transformers(method):
  worst_table = worst_factor = 0.0
  rtol = METHOD_TABLE_RTOL.get(method, TABLE_RTOL)
  for case in cases(method):
    inv, att = ours(case)
    tables = inv if method == "axial" else (inv,)  # axial: one stored table, used for both axes
    for table in tables:
      err = rel_err(table, case["inv_freq"])
      assert err < rtol, (err, case)
      worst_table = max(worst_table, err)
    err = rel_err(att, case["attention_factor"])
    assert err < FACTOR_RTOL, (err, case)
    worst_factor = max(worst_factor, err)
  print(
    f"{method}: {len(cases(method))} cases, max rel diff inv_freq {worst_table:.2e}, "
    f"attention factor {worst_factor:.2e}"
  )


def test_ntk_and_dynamic_yarn_match_the_transformers_tables_they_equal():
  n = 0
  for case in cases("dynamic"):
    if case["note"].startswith("ntk:"):  # dynamic at factor 1, L = s * L0: base * s^(d/(d-2))
      s = float(case["note"][4:])
      inv, att = scaling.ntk(rot_dim_of(case), base=case["rope_parameters"]["rope_theta"], factor=s)
      assert rel_err(inv, case["inv_freq"]) < TABLE_RTOL and att == 1.0, case
      n += 1
  for case in cases("yarn"):
    params = case["rope_parameters"]
    if case["note"] or set(params) != {
      "rope_type",
      "rope_theta",
      "partial_rotary_factor",
      "factor",
      "original_max_position_embeddings",
    }:
      continue
    original = params["original_max_position_embeddings"]
    inv, att = scaling.dynamic_yarn(
      rot_dim_of(case),
      base=params["rope_theta"],
      original_max_len=original,
      seq_len=int(params["factor"] * original),
    )
    assert rel_err(inv, case["inv_freq"]) < TABLE_RTOL, case
    assert rel_err(att, case["attention_factor"]) < FACTOR_RTOL, case
    n += 1
  assert n >= 30


def test_issue_15_scaling_cases():
  """v5-dict cases 3 and 4, by the numbers quoted for them."""
  (lr,) = [
    c
    for c in cases("longrope")
    if c["note"].startswith("v5-dict")
    and c["head_dim"] == 64
    and c["rope_parameters"]["partial_rotary_factor"] == 1.0
  ]
  assert lr["attention_factor"] == pytest.approx(1.080123, abs=1e-6)  # factor 4, not 32
  assert ours(lr)[1] == pytest.approx(1.080123, abs=1e-6)
  (dyn,) = [
    c
    for c in cases("dynamic")
    if c["note"] == "v5-dict case 4: the dict's original length is ignored"
  ]
  assert dyn["inv_freq"][-1] == pytest.approx(1.3335e-04, rel=1e-4)
  with pytest.warns(UserWarning, match="original_max_position_embeddings=1024 is ignored"):
    inv, _ = scaling.from_config(dyn["rope_parameters"], 64, max_len=4096, seq_len=4096)
  assert inv[-1] == pytest.approx(1.3335e-04, rel=1e-4)


@pytest.mark.parametrize("case", reference()["models"], ids=lambda c: f"{c['name']}@{c['seq_len']}")
def test_model_configs_match_transformers(case, tmp_path):
  ignored = (
    "attention_factor" in str(case["config"].get("rope_parameters", {}))
    and case["config"]["rope_parameters"]["rope_type"] == "linear"
  )
  (tmp_path / "config.json").write_text(json.dumps(case["config"]))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rope = rj.rope_from_hf_config(case["config"], seq_len=case["seq_len"])
    from_file = rj.rope_from_hf_config(tmp_path, seq_len=case["seq_len"])  # the folder
  assert any("ignoring keys ['attention_factor']" in str(w.message) for w in caught) == ignored
  assert rope.rot_dim == case["rot_dim"]
  assert rel_err(rope.inv_freq, case["inv_freq"]) < TABLE_RTOL
  assert rel_err(rope.attention_factor, case["attention_factor"]) < FACTOR_RTOL
  np.testing.assert_array_equal(from_file.inv_freq, rope.inv_freq)


def attention_inputs(case):
  params = case["rope_parameters"]
  rot_dim = int(case["head_dim"] * params["partial_rotary_factor"])
  positions = np.asarray(case["positions"])
  inv, att = scaling.from_config(
    params,
    rot_dim,
    max_len=case["max_position_embeddings"],
    seq_len=int(positions.max()) + 1,
    head_dim=case["head_dim"],
  )
  assert rel_err(inv, case["inv_freq"]) < TABLE_RTOL
  assert rel_err(att, case["attention_factor"]) < FACTOR_RTOL
  q, k, v = (np.asarray(case[n], np.float32) for n in "qkv")
  return q, k, v, positions, inv, att


@pytest.mark.parametrize(
  "case", reference()["attention"], ids=lambda c: f"{c['name']}/{c['layout']}"
)
def test_attention_matches_transformers(case):
  q, k, v, pos, inv, att = attention_inputs(case)
  out = jax.jit(
    lambda q, k, v, inv: rj.rope_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv, att, case["layout"])
    )
  )(q, k, v, inv)
  np.testing.assert_allclose(out, case["out"], atol=OUT_ATOL, rtol=0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_every_kernel_matches_transformers_under_jit(layout):
  """One partial-rotary YaRN case per layout through the reference, xla and chunked kernels,
  with the factor traced (a jax.Array under jit) and with keys rotated beforehand, as a KV
  cache stores them (queries rotated by rotate_queries, then masked_attention): the factor
  rides on q, so the cache carries none."""
  (case,) = [
    c
    for c in reference()["attention"]
    if c["name"] == "yarn D=16 partial 0.5 factor 4.0" and c["layout"] == layout
  ]
  q, k, v, pos, inv, att = attention_inputs(case)

  @functools.partial(jax.jit, static_argnames=("impl", "prerotated"))
  def f(q, k, v, factor, impl, prerotated=False):
    rope = rj.Rope(inv, factor, layout)
    kernel = chunked.kernel(4) if impl == "chunked" else impl
    if prerotated:
      q_r, _ = attention.rotate_queries(q, pos, rope)
      return rj.masked_attention(
        q_r, rope.rotate(k, pos), v, q_positions=pos, kv_positions=pos, kernel=kernel
      )
    return rj.rope_attention(q, k, v, q_positions=pos, kv_positions=pos, rope=rope, kernel=kernel)

  for impl, prerotated in (("reference", False), ("xla", False), ("chunked", False), ("xla", True)):
    np.testing.assert_allclose(
      f(q, k, v, jnp.float32(att), impl, prerotated),
      case["out"],
      atol=OUT_ATOL,
      rtol=0,
      err_msg=f"{impl} prerotated={prerotated}",
    )


def test_issue_15_reproducer():
  """D=4, rot_dim 2, half layout, factor 1.5: position 1 reads [0.5269, 0.4731, 0, 0]."""
  (case,) = [c for c in reference()["attention"] if c["name"] == "partial-rotary reproducer"]
  np.testing.assert_allclose(case["out"][0][1][0], [0.5269, 0.4731, 0, 0], atol=1e-4)
  q, k, v, pos, inv, att = attention_inputs(case)
  np.testing.assert_array_equal(inv, [1.0])
  out = jax.jit(
    lambda q, k, v, inv: rj.rope_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv, att, "half")
    )
  )(q, k, v, inv)
  np.testing.assert_allclose(out[0, 1, 0], [0.5269339, 0.4730661, 0, 0], atol=1e-6)


def test_splash_scales_only_rotated_dims():
  """The splash kernel (interpret mode on CPU, T = 128) with partial rotary and a traced factor
  equals attention over q and k multiplied by C = diag(c, ..., c, 1, ..., 1) by hand."""
  rng = np.random.default_rng(0)
  B, T, H, K, D, rot = 1, 128, 1, 1, 16, 8
  q, k, v = (rng.standard_normal((B, T, n, D)).astype(np.float32) for n in (H, K, K))
  pos = np.arange(T)[None]
  inv, att = scaling.yarn(rot, base=100.0, factor=4.0, original_max_len=32)
  c_D = np.where(np.arange(D) < rot, att, 1.0).astype(np.float32)
  by_hand = jax.jit(
    lambda q, k, v, inv: rj.rope_attention(
      q, k, v, q_positions=pos, kv_positions=pos, rope=rj.Rope(inv, layout="half")
    )
  )(q * c_D, k * c_D, v, inv)
  out = jax.jit(
    lambda a: rj.rope_attention(
      q,
      k,
      v,
      q_positions=pos,
      kv_positions=pos,
      rope=rj.Rope(inv, a, "half"),
      kernel="splash",
      mask=rj.Mask(ordered=True),
    )
  )(jnp.float32(att))
  np.testing.assert_allclose(out, by_hand, atol=2e-5, rtol=0)
  assert math.isclose(att, 0.1 * math.log(4.0) + 1, rel_tol=1e-12)
