"""benchmarks/experiments/sass_loops.py on a hand-written cuobjdump listing: the opcode of an
instruction (predicate and modifiers dropped, the uniform datapath's U kept), the loops found from
backward branches, innermost first, and the local-memory and R2UR counts. CPU only."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "experiments" / "sass_loops.py"

LISTING = """
\t\tFunction : kernel_a
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   UMOV UR33, 0x40000040 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR32], RZ, !UPT ;
        /*0030*/                   LDL R2, [R1+0x4] ;
        /*0040*/              @!P0 BRA 0x10 ;
        /*0050*/                   STL [R1], R2 ;
        /*0060*/                   FADD R3, R3, R2 ;
        /*0070*/               @P1 BRA 0x0 ;
        /*0080*/                   EXIT ;
\t\tFunction : kernel_b
        /*0000*/                   FADD R3, R3, R2 ;
        /*0010*/                   BRA 0x0 ;
        /*0020*/               @P0 BRA 0x40 ;
        /*0030*/                   FADD R3, R3, R2 ;
        /*0040*/                   EXIT ;
"""


def load():
    spec = importlib.util.spec_from_file_location("sass_loops", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_opcode_drops_predicate_and_modifiers_and_keeps_the_uniform_prefix():
    sass_loops = load()
    assert sass_loops.opcode("@!P0 UMOV.64 UR4, UR6") == "UMOV"
    assert sass_loops.opcode("HGMMA.64x64x16.F32.BF16 R24, gdesc[UR32], RZ") == "HGMMA"
    assert sass_loops.opcode("MOV R1, R2") == "MOV"


def test_loops_innermost_first_with_their_mix():
    sass_loops = load()
    listing = sass_loops.functions(LISTING.splitlines())
    assert sorted(listing) == ["kernel_a", "kernel_b"]
    found = sass_loops.loops(listing["kernel_a"])
    assert [(first, last) for first, last, _ in found] == [(0x10, 0x40), (0x0, 0x70)]
    inner = found[0][2]
    assert inner == {"UMOV": 1, "HGMMA": 1, "LDL": 1, "BRA": 1}
    outer = found[1][2]
    assert outer["LDL"] + outer["STL"] == 2 and outer["MOV"] == 1 and outer["UMOV"] == 1


def test_report_lists_only_mma_loops_unless_asked(capsys):
    sass_loops = load()
    listing = sass_loops.functions(LISTING.splitlines())
    sass_loops.report("kernel_b", listing["kernel_b"], show_all=False, most=5)
    assert capsys.readouterr().out == ""
    sass_loops.report("kernel_b", listing["kernel_b"], show_all=True, most=5)
    # the forward branch at 0x20 is no loop
    assert capsys.readouterr().out == "kernel_b loop 0x0-0x10: 2 instructions, local memory 0, R2UR 0; FADD 1, BRA 1\n"
    sass_loops.report("kernel_a", listing["kernel_a"], show_all=False, most=3)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("kernel_a loop 0x10-0x40: 4 instructions, local memory 1, R2UR 0;")


def test_report_counts_the_loop_r2ur(capsys):
    sass_loops = load()
    listing = sass_loops.functions("""
\t\tFunction : kernel_c
        /*0000*/                   R2UR UR32, R208 ;
        /*0010*/                   R2UR UR33, R209 ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR32], RZ, !UPT ;
        /*0030*/               @P0 BRA 0x0 ;
        /*0040*/                   R2UR UR34, R210 ;
        /*0050*/                   EXIT ;
""".splitlines())
    sass_loops.report("kernel_c", listing["kernel_c"], show_all=False, most=2)
    # the R2UR after the loop's branch is not in the loop
    assert capsys.readouterr().out.startswith("kernel_c loop 0x0-0x30: 4 instructions, local memory 0, R2UR 2;")
