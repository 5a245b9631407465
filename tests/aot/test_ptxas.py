"""rove_jax.aot.ptxas on ptxas -v reports as Mosaic GPU wrote them for the Hopper kernel
(copied from a deviceless H200 compile): registers, spill bytes, stack, the kernel named by its
file."""

from rove_jax.aot import ptxas

SPILLING = """\
ptxas warning : Registers are spilled to local memory in function 'rotary_flash_fwd_rove_mosaic_gpu_kernel', 6424 bytes spill stores, 6068 bytes spill loads
ptxas info    : 24 bytes gmem
ptxas info    : Compiling entry function 'rotary_flash_fwd_rove_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for rotary_flash_fwd_rove_mosaic_gpu_kernel
    2120 bytes stack frame, 6424 bytes spill stores, 6068 bytes spill loads
ptxas info    : Used 255 registers, used 2 barriers, 2120 bytes cumulative stack size, 1 bytes smem
ptxas info    : Compile time = 2156.137 ms
"""

CLEAN = """\
ptxas info    : 24 bytes gmem
ptxas info    : Compiling entry function 'rotary_flash_fwd_2wg_slices_rope_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for rotary_flash_fwd_2wg_slices_rope_mosaic_gpu_kernel
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 254 registers, used 16 barriers, 32 bytes cumulative stack size, 1 bytes smem
"""


def test_parse_reads_registers_and_spills():
  assert ptxas.parse(SPILLING) == {
    "rotary_flash_fwd_rove_mosaic_gpu_kernel (sm_90a)": dict(
      registers=255, stack_bytes=2120, spill_store_bytes=6424, spill_load_bytes=6068
    )
  }
  assert ptxas.parse(CLEAN, "fwd")["fwd (sm_90a)"] == dict(
    registers=254, stack_bytes=32, spill_store_bytes=0, spill_load_bytes=0
  )


def test_read_mosaic_names_kernels_by_file_and_keeps_the_first_compile(tmp_path):
  (tmp_path / "rotary_flash_fwd_rove_0.ptxas").write_text(SPILLING)
  (tmp_path / "rotary_flash_fwd_rove_10.ptxas").write_text(CLEAN)  # a later compile, same name
  (tmp_path / "rotary_flash_fwd_2wg_slices_rope_2.ptxas").write_text(CLEAN)
  (tmp_path / "rotary_flash_fwd_rove_0.mlir-passes.log").write_text("not a report")
  report = ptxas.read_mosaic(str(tmp_path))
  assert list(report) == [
    "rotary_flash_fwd_rove (sm_90a)",
    "rotary_flash_fwd_2wg_slices_rope (sm_90a)",
  ]
  assert report["rotary_flash_fwd_rove (sm_90a)"]["spill_store_bytes"] == 6424
  assert report["rotary_flash_fwd_2wg_slices_rope (sm_90a)"]["registers"] == 254
  rows = ptxas.table(report).splitlines()
  assert rows[2] == "| rotary_flash_fwd_rove (sm_90a) | 255 | 6424 | 6068 | 2120 |  |  |  |"


# The launch as Mosaic GPU's MLIR pass log shows it last (the final IR), with an earlier dump's
# definition of the same SSA name before it, and the PTX's thread count.
PASS_LOG = """\
// -----// IR Dump Before SomePass
    %24 = llvm.mlir.constant(1 : i32) : i32 loc(#loc7)
// -----// IR Dump Before ConvertToLLVMPass
    %8 = llvm.mlir.constant(128 : index) : i64 loc(#loc3)
    %24 = llvm.mlir.constant(87120 : i32) : i32 loc(#loc7)
    gpu.launch_func <%arg0 : !llvm.ptr> @k::@k blocks in (%5, %6, %7) threads in (%8, %25, %25) : i64 dynamic_shared_memory_size %24 args(%112 : !llvm.ptr) loc(#loc7)
    %24 = llvm.mlir.constant(4 : i64) : i64 loc(#loc3)
"""


def test_read_mosaic_adds_the_launch_and_the_programs_an_sm_holds(tmp_path):
  (tmp_path / "rotary_flash_fwd_slices_rove_0.ptxas").write_text(CLEAN)
  (tmp_path / "rotary_flash_fwd_slices_rove_0.ptx").write_text(
    ".version 9.0\n.target sm_90a\n.entry k(\n)\n.maxntid 128, 1, 1\n{\n}\n"
  )
  (tmp_path / "rotary_flash_fwd_slices_rove_0.mlir-passes.log").write_text(PASS_LOG)
  stats = ptxas.read_mosaic(str(tmp_path))["rotary_flash_fwd_slices_rove (sm_90a)"]
  assert (stats["threads"], stats["smem_bytes"], stats["programs_per_sm"]) == (128, 87120, 2)
  row = ptxas.table({"fwd": stats}).splitlines()[2]
  assert row == "| fwd | 254 | 0 | 0 | 32 | 128 | 87120 | 2 |"


def test_programs_per_sm_take_the_scarcest_resource():
  # 218 registers: 28 * 256 a warp, two programs of four warps; 87,120 bytes: two of them.
  assert ptxas.programs_per_sm(218, 87120, 128) == 2
  assert ptxas.programs_per_sm(218, 133200, 128) == 1  # shared memory: 233472 // 134224
  assert ptxas.programs_per_sm(160, 58000, 128) == 3  # 20 * 256 a warp: 65536 // 20480
  assert ptxas.programs_per_sm(32, 1000, 1024) == 2  # 32 warps a program of the SM's 64
  assert ptxas.programs_per_sm(None, 1000, 128) is None


def test_mosaic_dump_env_makes_the_folder(tmp_path):
  folder = tmp_path / "a" / "b"
  env = ptxas.mosaic_dump_env(str(folder))
  assert env == {"MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_TO": str(folder)}
  assert folder.is_dir()
