"""rove_jax.aot.compile / aot.analysis: topology names, the HLO collective parser, the roofline,
the mesh recommendation, and a train step compiled ahead of time for this host's CPU devices
(cpu:4), whose FLOPs and memory are checked against independent counts."""

import dataclasses
import os

import jax
import pytest

from rove_jax.aot import analysis as hlo
from rove_jax.aot import compile as aot
from rove_jax.nn.model_config import GPTConfig
from rove_jax.train import overrides, run_config

# A module in the forms XLA prints: a variadic all-reduce, the async -start/-done pairs (only
# -start counts; all-gather-start and collective-permute-start return their operands too), a
# while body run 3 times (XLA's known_trip_count), one run twice (`i < 2`: TPU prints no trip
# count), a fusion that holds a collective, and a Mosaic kernel (a backslash joins two lines).
HLO = """HloModule m, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%body (p: (s32[], f32[256])) -> (s32[], f32[256]) {
  %p = (s32[], f32[256]{0}) parameter(0)
  %x = f32[256]{0} get-tuple-element(%p), index=1
  %all-reduce.7 = f32[256]{0} all-reduce(%x), replica_groups={{0,1,2,3}}, to_apply=%add
  ROOT %t = (s32[], f32[256]{0}) tuple(%i, %all-reduce.7)
}

%cond (p: (s32[], f32[256])) -> pred[] {
  ROOT %c = pred[] constant(true)
}

%cond2 (p: (s32[], f32[16])) -> pred[] {
  %p = (s32[], f32[16]{0}) parameter(0)
  %n = s32[]{:T(128)} constant(2)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%body2 (p: (s32[], f32[16])) -> (s32[], f32[16]) {
  %all-to-all.8 = s32[4,8]{1,0} all-to-all(%q), dimensions={0}
}

%fused_computation.2 (param_0: f32[2,2]) -> f32[2,8] {
  %param_0 = f32[2,2]{1,0} parameter(0)
  ROOT %all-gather.3 = f32[2,8]{1,0} all-gather(%param_0), dimensions={1}
}

ENTRY %main.9 (x: f32[8]) -> f32[8] {
  %all-reduce.1 = (bf16[320,384]{1,0:T(8,128)(2,1)}, /*index=1*/f32[768]{0}) all-reduce(%a, %b)
  %all-gather-start = (bf16[8,128]{1,0}, bf16[64,128]{1,0}) all-gather-start(%c), dimensions={0}
  %all-gather-done = bf16[64,128]{1,0} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[1024]{0} all-reduce-start(%d), to_apply=%add
  %all-reduce-done = f32[1024]{0} all-reduce-done(%all-reduce-start)
  %reduce-scatter.2 = f32[16,32]{1,0} reduce-scatter(%e), dimensions={0}, to_apply=%add
  %all-to-all = s32[4,8]{1,0} all-to-all(%f), dimensions={0}
  %cp-start = (s32[8,256,1]{1,0,2:T(8,128)S(1)}, s32[8,256,1], u32[]{:S(2)}, u32[]) \
collective-permute-start(%g)
  %cp-done = s32[8,256,1]{1,0,2} collective-permute-done(%cp-start)
  %while = (s32[], f32[256]) while(%i), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  %while.2 = (s32[], f32[16]) while(%j), condition=%cond2, body=%body2
  %fusion.5 = f32[2,8]{1,0} fusion(%h), kind=kLoop, calls=%fused_computation.2
  %custom-call.6 = f32[8]{0} custom-call(%x), custom_call_target="tpu_custom_call"
  ROOT %r = f32[8]{0} copy(%x)
}
"""


def test_topology_names():
  t = aot.parse_topology("v4-32")  # v4 counts TensorCores: 16 chips
  assert (t.name, t.grid, t.n_devices, t.accelerator_type) == ("v4:2x2x4", (2, 2, 4), 16, "v4-32")
  assert aot.parse_topology("v5e-256").grid == (16, 16)
  assert aot.parse_topology("v5litepod-8").name == "v5e:2x4"
  assert aot.parse_topology("v5p-128").grid == (4, 4, 4)
  assert aot.parse_topology("v6e-16").grid == (4, 4)
  assert aot.parse_topology("v4:2x2x4").accelerator_type == "v4-32"
  assert aot.parse_topology("cpu:4").chip is None
  with pytest.raises(
    ValueError,
    match=r"unknown topology 'v7-8'; known: v4-\{8,16,32.*v5e-\{1,"
    r"4,8,16.*cpu:N",
  ):
    aot.parse_topology("v7-8")
  with pytest.raises(ValueError, match=r"no v4 slice of that size.*v4:2x2x4"):
    aot.parse_topology("v4-12")
  with pytest.raises(ValueError, match="a v5e chip grid has 2 positive sizes"):
    aot.parse_topology("v5e:2x2x2")


def test_collectives_parser_counts_executions_and_result_bytes():
  out = hlo.parse_collectives(HLO)
  assert out == {
    # tuple: 320*384*2 + 768*4; -start: 1024*4; in the loop body: 3 x 256*4
    "all-reduce": {"count": 5, "bytes": 245760 + 3072 + 4096 + 3 * 1024},
    # -start: the output bf16[64,128] only; the fused one: f32[2,8]
    "all-gather": {"count": 2, "bytes": 64 * 128 * 2 + 2 * 8 * 4},
    "reduce-scatter": {"count": 1, "bytes": 16 * 32 * 4},
    "all-to-all": {"count": 1 + 2, "bytes": 3 * 4 * 8 * 4},
    "collective-permute": {"count": 1, "bytes": 8 * 256 * 4},  # not the u32[] contexts
  }
  assert hlo.while_loops(HLO) == [(3, 0), (2, 0)]
  assert hlo.custom_calls(HLO) == {"tpu_custom_call": 1}
  assert hlo.array_bytes("(pred[3], f8e4m3fn[2,2], s4[3], c64[2])") == [3, 4, 2, 16]


def test_kernels_with_a_cost_estimate_are_not_counted_twice():
  """Pallas kernels that carry a cost estimate (the fused kernel) are in cost_analysis's FLOPs
  already; those without one (splash, cuDNN) get the analytic attention FLOPs added. The
  backend config as libtpu prints it, checked against a real fused and splash compile."""
  line = (
    '%%c.%d = bf16[1,4,256,64]{3,2,1,0} custom-call(%%a), custom_call_target="%s", '
    'backend_config={"custom_call_config": {"body": "TUxJUu==", %s}}'
  )
  costed = '"cost_estimate":{"flops":"68829184","transcendentals":"360448"}'
  zero = '"cost_estimate":{"flops":"0","transcendentals":"0"}'
  text = "\n".join(
    [
      line % (1, "tpu_custom_call", costed),
      line % (2, "tpu_custom_call", zero),
      line % (3, "tpu_custom_call", '"name": "splash_mha_fwd"'),
      line % (4, "__cudnn$fmhaSoftmax", '"x": 1'),
      line % (5, "Sharding", '"x": 1'),
    ]
  )
  assert hlo.uncosted_kernels(text) == {"tpu_custom_call": 2, "__cudnn$fmhaSoftmax": 1}
  assert hlo.uncosted_kernels(line % (1, "tpu_custom_call", costed)) == {}


def test_roofline_arithmetic():
  v5e = aot.CHIPS["v5e"]
  r = hlo.roofline(197e12 * 0.010, 819e9 * 0.004, v5e, model_flops=0.5 * 197e12 * 0.010)
  assert r.pop("bound_by") == "compute"
  assert r == pytest.approx(
    {"compute_s": 0.010, "memory_s": 0.004, "step_time_bound_s": 0.010, "mfu_bound": 0.5}
  )
  assert hlo.roofline(1e9, 819e9, v5e)["bound_by"] == "memory"


class _Compiled:
  """The three methods analyze reads, with fixed figures."""

  def memory_analysis(self):
    names = ("argument", "output", "alias", "temp", "generated_code")
    return type("M", (), {f"{k}_size_in_bytes": v for k, v in zip(names, (100, 60, 50, 40, 7))})

  def cost_analysis(self):
    return {"flops": 1e9, "bytes accessed": 2e8}

  def as_text(self):
    return HLO


def test_analyze_scales_the_accumulation_loop_and_adds_kernel_attention():
  chip = dataclasses.replace(aot.CHIPS["v5e"], hbm_bytes=150)
  r = hlo.analyze(
    _Compiled(), chip, n_devices=4, tokens=400, model_flops=2e7, attention_flops=1e6, accumulation=3
  )
  assert r["memory"]["total"] == 100 + 60 - 50 + 40
  assert (r["fits"], r["headroom_bytes"]) == (True, 0)
  # the accumulation loop (3 trips) times 3, plus the analytic attention the kernel (and the
  # other loop) hide, 1e6 x 400 / 4
  assert r["flops"] == 3e9 + 1e8 and r["bytes_accessed"] == 6e8
  assert r["compiled_flops_per_token"] == pytest.approx(3.1e9 * 4 / 400)
  assert r["model_to_compiled"] == pytest.approx(2e7 / 3.1e7)
  assert r["roofline"]["step_time_bound_s"] == pytest.approx(6e8 / chip.hbm_bandwidth)
  assert len(r["analysis_notes"]) == 2


def test_collective_matmul_loops_and_missing_flops_are_named():
  """XLA's collective matmuls (an fsdp all-gather overlapped with the matmul, in a while loop
  named windowed_dot_general_body_*) are counted once by cost_analysis: the report says so,
  and compiled FLOPs below the model's count are flagged."""
  name = "%wide.windowed_dot_general_body_ag.2"
  text = HLO.replace("body=%body2", f"body={name}").replace("%body2 (", f"{name} (")

  class Windowed(_Compiled):
    def as_text(self):
      return text

  analyze = lambda compiled, model_flops: hlo.analyze(
    compiled,
    None,
    n_devices=4,
    tokens=400,
    model_flops=model_flops,
    attention_flops=1e6,
    accumulation=3,
  )
  r = analyze(Windowed(), 3.5e7)
  notes = " | ".join(r["analysis_notes"])
  assert "1 of XLA's collective matmuls (windowed_dot_general loops" in notes, notes
  assert r["model_to_compiled"] == pytest.approx(3.5e7 / 3.1e7)
  assert "compiled FLOPs are 0.89x the model FLOPs: cost_analysis misses work" in notes, notes
  plain = analyze(_Compiled(), 3.1e7)
  assert not any(
    "collective matmuls" in n or "compiled FLOPs" in n for n in plain["analysis_notes"]
  )


def test_recommend_mesh_and_accumulation():
  c = run_config.paper_config("gpt2_124m", lr=6e-4)
  r = aot.recommend(c, "v5e-8")  # state 16 x 124.5M bytes fits half the HBM: data parallel
  assert r["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1}
  # 64 rows a device; per token 12 (34 x 768 + 5 x 12 x 1024) + 8 x 50304 bytes: 8 rows fit
  assert r["grad_accum"] == 8 and r["fits"]
  assert r["activation_bytes_per_device"] == 8 * 1024 * (12 * (34 * 768 + 60 * 1024) + 8 * 50304)
  small = aot.Topology(
    "v5e:2x4", dataclasses.replace(aot.CHIPS["v5e"], hbm_bytes=2 * aot.GiB), (2, 4)
  )
  r = aot.recommend(c, small)
  assert r["mesh"] == {"data": 4, "fsdp": 2, "tensor": 1}  # 2.0 GB of state > 1 GiB
  assert (r["grad_accum"], r["fits"]) == (64, False)  # not even one row's activations fit
  with pytest.raises(ValueError, match="needs a TPU topology"):
    aot.recommend(c, "cpu:8")


def _tiny(**over):
  c = run_config.RunConfig(
    model=GPTConfig.tiny(n_layer=1, d_model=64, n_head=2, d_ff=256, max_len=64),
    data=run_config.DataConfig(seq_len=64, batch_size=8),
  )
  return overrides.apply(c, over)


def test_mesh_that_does_not_match_the_topology():
  c = _tiny(**{"mesh.data": 3})
  with pytest.raises(ValueError, match=r"topology cpu:4 has 4 devices: .* needs 3 devices"):
    aot.compile_job(c, "cpu:4", "train")
  with pytest.raises(ValueError, match="needs 16 CPU devices"):
    aot.compile_job(_tiny(), "cpu:16", "train")


def test_train_step_compiled_for_cpu_devices_matches_independent_counts():
  c = _tiny()
  r = aot.compile_job(c, "cpu:4", "train")
  E, F, V, T, L = 64, 256, 320, 64, 1
  # Parameters by hand (tied embedding): qkv, out, MLP matrices and biases, three norms.
  n = V * E + L * (E * 3 * E + 3 * E + E * E + E + E * F + F + F * E + E + 4 * E) + 2 * E
  assert r["model_flops_per_token"] == 6 * n + 12 * L * E * T
  # The matmuls alone, forward x 3: q/k/v, out, MLP, head, and q.k and p.v over T keys.
  matmuls = 3 * (2 * (3 * E * E + E * E + 2 * E * F + E * V) + 4 * E * T) * L
  per_token = r["flops"] * r["devices"] / r["tokens"]
  # cost_analysis also counts the elementwise work (softmax, GELU, layer norms, cross-entropy,
  # AdamW): at this width 7-18% more than the matmuls, depending on XLA's CPU flags
  assert 1.0 <= per_token / matmuls <= 1.25, per_token / matmuls
  mem = r["memory"]
  assert mem["total"] == mem["argument"] + mem["output"] - mem["alias"] + mem["temp"] > 0
  # arguments: float32 params and Adam's two moments (replicated), plus 2 rows x 64 tokens of
  # inputs and targets a device, plus a few int32 counters
  assert 0 <= mem["argument"] - (12 * param_count(c) + 2 * 2 * 64 * 4) <= 16
  assert mem["alias"] >= 12 * param_count(c)  # the donated state
  # data parallelism: every gradient is all-reduced
  assert r["collectives"]["all-reduce"]["bytes"] >= 4 * param_count(c)
  assert r["roofline"] is None and r["fits"] is None  # cpu: no chip figures


def test_fsdp_gathers_the_weights_and_never_all_reduces_an_activation():
  """Under fsdp the batch and the weights' embedding dim are split over one axis. The model pins
  its activations' batch split (rove_jax.nn.act_sharding), so the step gathers each weight and
  reduce-scatters (on CPU: all-reduces) its gradient: no all-reduce moves more than the
  parameters, and the whole step's all-reduced bytes stay within the gradients' (without the
  constraints GSPMD all-reduced every MLP activation of the global batch, [8, 64, 256] a
  layer, several times the parameters)."""
  c = _tiny(**{"mesh.data": 1, "mesh.fsdp": 4})
  r = aot.compile_job(c, "cpu:4", "train")
  grads = 4 * param_count(c)  # float32 gradients, each reduced once
  assert r["collectives"]["all-gather"]["count"] > 0
  assert r["collectives"]["all-reduce"]["bytes"] <= grads + 1024, r["collectives"]


def param_count(c):
  from rove_jax.nn.model import param_count as count

  return count(c.model)


def test_command_line_on_cpu_devices(tmp_path, capsys):
  import json

  from bench import aot as cli

  small = [
    "--config.model.n_layer=1",
    "--config.model.d_model=64",
    "--config.model.n_head=2",
    "--config.model.d_ff=256",
    "--config.model.max_len=64",
    "--config.data.seq_len=64",
    "--config.data.batch_size=8",
    "--config.mesh.data=2",
    "--config.mesh.fsdp=2",
  ]
  out, tiny = (
    tmp_path / "aot.json",
    os.path.join(os.path.dirname(__file__), "..", "..", "configs", "tiny.py"),
  )
  assert (
    cli.main(
      [
        "--config",
        tiny,
        *small,
        "--topology",
        "cpu:4",
        "--jobs",
        "eval,decode",
        "--eval-len",
        "128",
        "--markdown",
        "--json",
        str(out),
      ]
    )
    == 0
  )
  printed = capsys.readouterr().out
  assert "decode on cpu:4 (cpu:4), mesh data=2 fsdp=2 tensor=1" in printed
  assert "| tiny rove | cpu:4 | (2, 2, 1) | - | eval | 4 x 128 |" in printed
  ev, dec = json.loads(out.read_text())["reports"]
  # one window a data shard, YaRN for 128 tokens of a model trained on 64
  assert (ev["batch"], ev["length"], ev["tokens"]) == (4, 128, 4 * 128)
  assert ev["rope_scaling"] == {
    "rope_type": "yarn",
    "factor": 2.0,
    "original_max_position_embeddings": 64,
  }
  assert (dec["batch"], dec["length"], dec["tokens"]) == (4, 128, 4)
  assert cli.main(["--config", tiny, "--topology", "cpu:3", *small]) == 2
  assert "topology cpu:3 has 3 devices" in capsys.readouterr().err
  assert cli.main(["--config", "tiny", "--topology", "v9-8"]) == 2  # a packaged config
  assert "unknown topology 'v9-8'" in capsys.readouterr().err


def test_gradient_accumulation_keeps_micro_batches_split_over_the_devices():
  """With grad_accum = M each device works on its own rows of each micro-batch: the loop body's
  inputs are [B / M / devices, T] a device, and the temporaries do not grow with M (a micro-batch
  replicated on every device would hold devices x more activations)."""
  c = _tiny(**{"data.batch_size": 16})
  one = aot.compile_job(c, "cpu:4", "train")
  c = overrides.apply(c, {"optim.grad_accum": 2})
  two = aot.compile_job(c, "cpu:4", "train", hlo_path=None)
  assert two["memory"]["temp"] <= one["memory"]["temp"], (two["memory"], one["memory"])


def test_gpu_topologies_and_their_target_description():
  from rove_jax.aot import gpu as aot_gpu

  t = aot.parse_topology("h200-16")
  assert (t.name, t.n_devices, t.chip.hbm_bytes, t.chip.peak_flops) == (
    "h200-16",
    16,
    143771 * 2**20,
    989e12,
  )
  assert aot_gpu.gpu_grid(8) == (1, 1, 8) and aot_gpu.gpu_grid(16) == (1, 2, 8)
  with pytest.raises(ValueError, match="multiple of 8"):
    aot.parse_topology("h100-12")
  text = aot_gpu.target_config(aot_gpu.GPUS["h100"])
  assert "core_count: 132" in text and f"device_memory_size: {81559 * 2**20}" in text
  assert aot.parse_topology("local").devices() == jax.devices()


def test_a_gpu_compile_adds_the_cublas_gemm_flops_the_hlo_cost_model_misses():
  """Compiled for a GPU (no cost_analysis; the CPU client's HLO cost model stands in, here
  unavailable too), the FLOPs of cuBLAS calls, which no cost model sees, come from the HLO:
  a [64, 8] x [8, 32] GEMM run 5 times in a loop, plus the analytic attention."""
  gemm = (
    '%lt = (bf16[64,32]{1,0}, s8[4096]{0}) custom-call(%x, %w), custom_call_target="__cublas$lt'
    '$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting'
    '_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}'
  )
  loop = 'body=%body, backend_config={"known_trip_count":{"n":"5"}}'
  text = f"""HloModule m

%body (t: (bf16[64,8], bf16[8,32])) -> (bf16[64,8], bf16[8,32]) {{
  %t = (bf16[64,8]{{1,0}}, bf16[8,32]{{1,0}}) parameter(0)
  %x = bf16[64,8]{{1,0}} get-tuple-element(%t), index=0
  %w = bf16[8,32]{{1,0}} get-tuple-element(%t), index=1
  {gemm}
  ROOT %r = (bf16[64,8]{{1,0}}, bf16[8,32]{{1,0}}) tuple(%x, %w)
}}

%cond (t: (bf16[64,8], bf16[8,32])) -> pred[] {{
  %t = (bf16[64,8]{{1,0}}, bf16[8,32]{{1,0}}) parameter(0)
  ROOT %c = pred[] constant(true)
}}

ENTRY %main (x: bf16[64,8], w: bf16[8,32]) -> (bf16[64,8], bf16[8,32]) {{
  %x = bf16[64,8]{{1,0}} parameter(0)
  %w = bf16[8,32]{{1,0}} parameter(1)
  %init = (bf16[64,8]{{1,0}}, bf16[8,32]{{1,0}}) tuple(%x, %w)
  ROOT %loop = (bf16[64,8]{{1,0}}, bf16[8,32]{{1,0}}) while(%init), condition=%cond, {loop}
}}
"""

  class OnGpu(_Compiled):
    def cost_analysis(self):
      return None

    def as_text(self):
      return text

  r = hlo.analyze(OnGpu(), None, n_devices=1, tokens=64, model_flops=3560, attention_flops=1e3)
  assert r["flops"] == 5 * 2 * 64 * 32 * 8 + 1e3 * 64
  assert r["model_to_compiled"] == pytest.approx(1.0)  # 3560 x 64 tokens
  notes = " | ".join(r["analysis_notes"])
  assert "5 cuBLAS GEMMs: the HLO cost model sees no FLOPs in a library call" in notes, notes
  assert "no FLOPs or bytes: the compiler has no cost_analysis" in notes, notes
  plain = hlo.analyze(
    _Compiled(), None, n_devices=4, tokens=400, model_flops=2e7, attention_flops=0.0
  )
  assert not any("cuBLAS" in n for n in plain["analysis_notes"])
