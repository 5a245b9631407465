"""rove_jax.aot.gpu_census on hand-written optimized-HLO text: what counts as a kernel, its
bytes, while-loop trips, GEMM precisions and FLOPs, vocabulary-wide float32 bytes."""

from rove_jax.aot import gpu_census

HLO = """HloModule jit_step, entry_computation_layout={(f32[8,4]{1,0})->f32[8,4]{1,0}}

%fused_convert (p: f32[8,4]) -> bf16[8,4] {
  %p = f32[8,4]{1,0} parameter(0)
  ROOT %c = bf16[8,4]{1,0} convert(%p)
}

%gemm_computation (a: bf16[8,4], b: bf16[4,16]) -> bf16[8,16] {
  %a = bf16[8,4]{1,0} parameter(0)
  %b = bf16[4,16]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,16]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (t: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %t = (s32[], f32[8,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[8,16]{1,0} get-tuple-element(%t), index=1
  %neg = f32[8,16]{1,0} fusion(%x), kind=kLoop, calls=%fused_convert, metadata={op_name="jit(step)/neg"}
  ROOT %r = (s32[], f32[8,16]{1,0}) tuple(%i, %neg)
}

%cond (t: (s32[], f32[8,16])) -> pred[] {
  %t = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %lt = pred[] constant(true)
}

ENTRY %main (x: f32[8,4], w: bf16[4,16]) -> f32[8,4] {
  %x = f32[8,4]{1,0} parameter(0)
  %w = bf16[4,16]{1,0} parameter(1)
  %conv = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%fused_convert, metadata={op_name="jit(step)/convert"}
  %bc = bf16[8,4]{1,0} bitcast(%conv)
  %mm = bf16[8,16]{1,0} fusion(%bc, %w), kind=kCustom, calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %lt = (f32[8,16]{1,0}, s8[4194304]{0}) custom-call(%x, %x), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  %pk = bf16[8,4]{1,0} custom-call(%conv, %conv, %conv), custom_call_target="mosaic_gpu_v2"
  %init = (s32[], f32[8,16]{1,0}) tuple(%x, %x)
  %loop = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %out = f32[8,4]{1,0} copy(%x)
}
"""


def test_kernels_bytes_and_trips():
  c = gpu_census.read(HLO, vocab_size=16)
  by_name = {k.name: k for k in c.kernels_list}
  # conv, mm, lt, pk, the copy, and the loop body's fusion counted 5 times; bitcast, tuple,
  # parameters and the while itself launch nothing.
  assert set(by_name) == {"conv", "mm", "lt", "pk", "out", "neg"}
  assert c.kernels == 5 + 5
  assert by_name["conv"].bytes == 8 * 4 * 4 + 8 * 4 * 2
  assert by_name["mm"].bytes == 8 * 4 * 2 + 4 * 16 * 2 + 8 * 16 * 2
  # cuBLAS's s8 workspace is no traffic: two f32 [8, 4] operands, one f32 [8, 16] output.
  assert by_name["lt"].bytes == 2 * 8 * 4 * 4 + 8 * 16 * 4
  # a kernel given one buffer three times (q, k, v read in place) reads it once
  assert by_name["pk"].bytes == 8 * 4 * 2 + 8 * 4 * 2
  assert by_name["neg"].times == 5 and by_name["neg"].bytes == 5 * (2 * 8 * 16 * 4)
  assert c.bytes == sum(k.bytes for k in c.kernels_list)


def test_gemm_precisions_and_flops():
  gemms = gpu_census.read(HLO).gemms_by_precision()
  assert gemms["bf16 x bf16"] == {"count": 1, "tflop": 2 * 8 * 16 * 4 / 1e12}
  assert gemms["f32 x f32"] == {"count": 1, "tflop": 2 * 8 * 16 * 4 / 1e12}


def test_vocab_wide_float32_bytes():
  """Float32 arrays with a dimension of the vocabulary size (16 here): the cuBLAS output and
  the loop body's float32 input and output, five times; not the bf16 GEMM's."""
  c = gpu_census.read(HLO, vocab_size=16)
  assert c.vocab_f32_bytes == 8 * 16 * 4 + 5 * 2 * 8 * 16 * 4
  assert gpu_census.read(HLO).vocab_f32_bytes == 0


def test_groups_by_phase_kind_and_operation():
  rows = gpu_census.read(HLO).groups()
  assert sum(r[3] for r in rows) == 10
  by = {r[:3]: r[3:] for r in rows}
  assert by[("other", "loop", "neg")][0] == 5  # the loop body's fusion, once a trip
  assert by[("other", "copy", "")] == (1, 2 * 8 * 4 * 4)
  assert ("other", "__cublas$lt$matmul", "") in by
  assert rows[0][:3] == ("other", "loop", "neg")  # most kernels first


def test_diff_keeps_what_one_program_adds():
  """A program with one kernel more than HLO (a second convert of the parameter, under a name
  HLO does not have): the diff is that kernel alone; the kernels both launch cancel."""
  extra = HLO.replace(
    "  ROOT %out = f32[8,4]{1,0} copy(%x)",
    "  %conv.9 = bf16[8,4]{1,0} fusion(%x), kind=kLoop, calls=%fused_convert, "
    'metadata={op_name="jit(step)/jvp()/convert"}\n  ROOT %out = f32[8,4]{1,0} copy(%x)',
  )
  a, b = gpu_census.read(extra), gpu_census.read(HLO)
  assert a.kernels == b.kernels + 1
  rows = a.diff(b)
  assert rows == [
    (("forward", "loop", "convert", ("f32[8,4]",), ("bf16[8,4]",)), 1, 8 * 4 * 4 + 8 * 4 * 2)
  ]
  assert b.diff(a) == [(rows[0][0], -1, -rows[0][2])]
  assert a.diff(a) == []


def test_a_fusion_that_slices_an_operand_reads_the_slice():
  """A fusion whose every use of an operand is a static slice (a layer's weights out of a stack
  of all layers') reads those slices, not the whole buffer; an operand also used whole is read
  whole, and one sliced twice is read twice (each slice)."""
  hlo = """HloModule m, entry_computation_layout={(f32[12,8,4]{2,1,0})->bf16[8,4]{1,0}}

%fused_layer (p: f32[12,8,4], q: f32[8,4]) -> bf16[8,4] {
  %p = f32[12,8,4]{2,1,0} parameter(0)
  %q = f32[8,4]{1,0} parameter(1)
  %s = f32[1,8,4]{2,1,0} slice(%p), slice={[3:4], [0:8], [0:4]}
  %s2 = f32[1,8,4]{2,1,0} slice(%p), slice={[5:6], [0:8], [0:4]}
  %b = f32[8,4]{1,0} bitcast(%s)
  %a = f32[8,4]{1,0} add(%b, %q)
  ROOT %c = bf16[8,4]{1,0} convert(%a)
}

ENTRY %main (w: f32[12,8,4], x: f32[8,4]) -> bf16[8,4] {
  %w = f32[12,8,4]{2,1,0} parameter(0)
  %x = f32[8,4]{1,0} parameter(1)
  ROOT %f = bf16[8,4]{1,0} fusion(%w, %x), kind=kLoop, calls=%fused_layer
}
"""
  (k,) = gpu_census.read(hlo).kernels_list
  assert k.bytes == 2 * 8 * 4 * 4 + 8 * 4 * 4 + 8 * 4 * 2  # two slices of w, x whole, the output
  whole = hlo.replace("%a = f32[8,4]{1,0} add(%b, %q)", "%a = f32[8,4]{1,0} add(%b, %p)")
  (k,) = gpu_census.read(whole).kernels_list
  assert k.bytes == 12 * 8 * 4 * 4 + 8 * 4 * 4 + 8 * 4 * 2


def test_a_gemm_xla_wraps_in_a_custom_fusion_is_a_gemm_reading_its_slice():
  """XLA 0.11 (jax 0.11) wraps a cuBLAS GEMM that reads one layer's weights out of the stack of
  all layers' in a custom fusion (a dynamic-slice fusion, in place, no copy), as in the H200
  train step: it is one GEMM kernel, of the call's precision and FLOPs and of the op_name the
  call carries, reading the slice and the other operand, writing the product but not cuBLAS's
  workspace."""
  hlo = """HloModule m, entry_computation_layout={(bf16[12,8,32]{2,1,0}, bf16[64,8]{1,0})->bf16[64,32]{1,0}}

%dynamic-slice-fusion.1 (p0.1: bf16[12,8,32], p1.1: bf16[64,8]) -> (bf16[64,32], s8[4096]) {
  %p1.1 = bf16[64,8]{1,0} parameter(1)
  %p0.1 = bf16[12,8,32]{2,1,0} parameter(0)
  %slice.85 = bf16[1,8,32]{2,1,0} slice(%p0.1), slice={[1:2], [0:8], [0:32]}
  %bitcast.2848 = bf16[8,32]{1,0} bitcast(%slice.85)
  ROOT %custom-call.295 = (bf16[64,32]{1,0}, s8[4096]{0}) custom-call(%p1.1, %bitcast.2848), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp()/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
}

ENTRY %main (w: bf16[12,8,32], x: bf16[64,8]) -> bf16[64,32] {
  %w = bf16[12,8,32]{2,1,0} parameter(0)
  %x = bf16[64,8]{1,0} parameter(1)
  %f = (bf16[64,32]{1,0}, s8[4096]{0}) fusion(%w, %x), kind=kCustom, calls=%dynamic-slice-fusion.1, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_slice_fusion","kernel_index":0}}}
  ROOT %y = bf16[64,32]{1,0} get-tuple-element(%f), index=0
}
"""
  c = gpu_census.read(hlo)
  (k,) = c.kernels_list
  assert k.gemm == gpu_census.Gemm("bf16", "bf16", 2.0 * 64 * 32 * 8)
  assert c.gemms_by_precision() == {"bf16 x bf16": {"count": 1, "tflop": 2 * 64 * 32 * 8 / 1e12}}
  assert k.bytes == 8 * 32 * 2 + 64 * 8 * 2 + 64 * 32 * 2  # w's slice, x, the product
  assert gpu_census.signature(k)[:3] == ("forward", "__custom_fusion", "dot_general")
