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
  assert rows[2] == "| rotary_flash_fwd_rove (sm_90a) | 255 | 6424 | 6068 | 2120 |"


def test_mosaic_dump_env_makes_the_folder(tmp_path):
  folder = tmp_path / "a" / "b"
  env = ptxas.mosaic_dump_env(str(folder))
  assert env == {"MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_TO": str(folder)}
  assert folder.is_dir()
