"""rove_jax.aot.sass on lines of a `cuobjdump -sass` listing of the Hopper forward kernel
(copied from a deviceless H200 compile): opcodes without predicates and modifiers, their classes,
the main loop (a back edge; not the unconditional jump back from a barrier-wait stub after
EXIT), the table, and what it asks for when its tools are missing."""

import collections

from rove_jax.aot import sass

LISTING = """\

	code for sm_90a
		Function : rotary_flash_fwd_slices_rove_mosaic_gpu_kernel
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                                              /* 0x00000a00ff017b82 */
                                                                                                       /* 0x000fe20000000800 */
        /*01f0*/               @P0 IADD3 R0, P4, R2.reuse, 0x30, RZ ;                                  /* 0x0000003002000810 */
                                                                                                       /* 0x000fe20007f9e0ff */
        /*0250*/               @P0 IADD3.X R0, RZ, R3, RZ, P4, !PT ;                                   /* 0x00000003ff000210 */
                                                                                                       /* 0x000fe200027fe4ff */
        /*0be0*/              @!P1 BRA 0xf40 ;                                                         /* 0x0000000000d49947 */
                                                                                                       /* 0x000fea0003800000 */
        /*1210*/                   LDS.64 R28, [R16] ;                                                 /* 0x00000000101c7984 */
                                                                                                       /* 0x000e280000000a00 */
        /*16c0*/                   FFMA R30, R27, R26.reuse, 12582912 ;                                /* 0x4b4000001b1e7423 */
                                                                                                       /* 0x000fe20000000000 */
        /*2260*/                   F2FP.BF16.F32.PACK_AB R45, R54, R49 ;                               /* 0x00000031362d723e */
                                                                                                       /* 0x000fe200000000ff */
        /*b1d0*/                   WARPGROUP.ARRIVE ;                                                  /* 0x00000000000079c5 */
                                                                                                       /* 0x000fe20000000000 */
        /*b1e0*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], RZ, !UPT ;               /* 0x01e000000c1879f0 */
                                                                                                       /* 0x000fe20008000818 */
        /*c8d0*/                   MUFU.EX2 R61, R24 ;                                                 /* 0x00000018003d7308 */
                                                                                                       /* 0x000e220000000800 */
        /*f0c0*/                @P1 BRA 0x1210 ;                                                        /* 0x0000000000007947 */
                                                                                                       /* 0x000fea000383ffff */
        /*12430*/                  EXIT ;                                                              /* 0x000000000000794d */
                                                                                                       /* 0x000fea0003800000 */
        /*12490*/                  BRA 0xf60 ;                                                         /* 0xffffffe800b07947 */
                                                                                                       /* 0x000fea000383ffff */
"""


def test_opcodes_drop_predicates_and_modifiers():
  assert sass.opcodes(LISTING) == collections.Counter(
    {
      "LDC": 1,
      "IADD3": 2,
      "BRA": 3,
      "EXIT": 1,
      "LDS": 1,
      "FFMA": 1,
      "F2FP": 1,
      "WARPGROUP": 1,
      "HGMMA": 1,
      "MUFU": 1,
    }
  )


def test_mix_counts_each_class_and_the_rest():
  m = sass.mix(sass.opcodes(LISTING))
  assert m == dict(
    instructions=13,
    float32=1,
    integer=2,
    conversion=1,
    packed16=0,
    mufu=1,
    tensor=2,
    shared=1,
    local=0,
    other=5,  # LDC, three BRA, EXIT
  )
  # bfloat16 pairs (HFMA2.BF16_V2, HMUL2.BF16_V2 once their modifiers are dropped) are packed16
  packed = sass.opcodes(
    line(0x10, "HFMA2.BF16_V2 R4, R2, R3, -R5") + "\n" + line(0x20, "HMUL2 R1, R2, R3")
  )
  assert sass.mix(packed)["packed16"] == 2 and sass.mix(packed)["instructions"] == 2


def test_the_main_loop_runs_from_the_back_edges_target_to_it():
  loop = sass.mix(sass.opcodes(sass.main_loop(LISTING)))
  # LDS at 0x1210 through the back edge at 0xf0c0: LDS, FFMA, F2FP, WARPGROUP, HGMMA, MUFU, BRA.
  assert loop == dict(
    instructions=7,
    float32=1,
    integer=0,
    conversion=1,
    packed16=0,
    mufu=1,
    tensor=2,
    shared=1,
    local=0,
    other=1,
  )
  assert sass.main_loop(LISTING.replace("@P1 BRA", "@P1 NOP")) == ""
  # An unconditional back edge before EXIT (the exit test at the loop's top) is a loop too.
  unconditional = LISTING.replace("@P1 BRA 0x1210", "BRA 0x1210")
  assert sass.mix(sass.opcodes(sass.main_loop(unconditional))) == loop
  table = sass.table({"fwd": dict(sass.mix(sass.opcodes(LISTING)), loop=loop)}).splitlines()
  assert table[0].startswith("| kernel | part | instructions | float32 | integer | conversion |")
  assert table[2:] == [
    "| fwd | all | 13 | 1 | 2 | 1 | 0 | 1 | 2 | 1 | 0 | 5 |",
    "| fwd | loop | 7 | 1 | 0 | 1 | 0 | 1 | 2 | 1 | 0 | 1 |",
  ]


def line(address: int, text: str) -> str:
  return f"        /*{address:04x}*/                   {text} ;"


def two_loops(n_first: int, n_second: int, n_third: int = 0) -> str:
  """A listing with a loop of n_first FFMAs, then one of n_second FMULs (and of n_third FADDs),
  then a barrier-wait stub's two-instruction loop."""
  out = []
  for start, n, op, p in (
    (0x100, n_first, "FFMA R1, R2, R3, R4", 0),
    (0x4000, n_second, "FMUL R1, R2, R3", 1),
    (0x6000, n_third, "FADD R1, R2, R3", 3),
  ):
    if not n:
      continue
    out += [line(start + 16 * i, op) for i in range(n)]
    out.append(line(start + 16 * n, f"@P{p} BRA 0x{start:x}"))
  return "\n".join(out + [line(0x8000, "NOP"), line(0x8010, "@P2 BRA 0x8000")])


def test_a_second_loop_of_its_own_is_reported_beside_the_main_one():
  """A kernel that runs the blocks off the diagonal in a loop without the mask, then the rest
  with it, has two loops: both are counted, the longer as "loop", the other as "loop 2"; a
  loop under SECOND_LOOP_MIN instructions (a barrier-wait stub's) is not."""
  got = sass.with_loops(two_loops(120, 150))
  assert (got["loop"]["float32"], got["loop"]["instructions"]) == (150, 151)
  assert (got["loop 2"]["float32"], got["loop 2"]["instructions"]) == (120, 121)
  assert got["instructions"] == 120 + 150 + 2 + 2  # two back edges, the stub
  assert [r.split(" | ")[1] for r in sass.table({"dq": got}).splitlines()[2:]] == [
    "all",
    "loop",
    "loop 2",
  ]
  assert "loop 2" not in sass.with_loops(two_loops(50, 150))
  assert sass.with_loops(two_loops(50, 150))["loop"]["instructions"] == 151
  # A producer warpgroup's loop beside the compute warpgroups' two: a third row.
  three = sass.with_loops(two_loops(120, 150, 130))
  sizes = [three[k]["instructions"] for k in ("loop", "loop 2", "loop 3")]
  assert sizes == [151, 131, 121] and "loop 4" not in three
  assert [r.split(" | ")[1] for r in sass.table({"dq": three}).splitlines()[2:]] == [
    "all",
    "loop",
    "loop 2",
    "loop 3",
  ]


def test_missing_tools_say_what_to_install(monkeypatch):
  monkeypatch.setattr(
    sass, "_candidates", lambda name: ["/usr/bin/true"] if name == "ptxas" else []
  )
  assert "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm" in sass.missing_tools()
  monkeypatch.setattr(sass, "_candidates", lambda name: [])
  assert "needs ptxas" in sass.missing_tools()
