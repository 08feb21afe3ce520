"""The attention kernel's main loop, read from the SASS of a GPU-less compile, keeps the design's
MMA structure (kernel/csrc/verify_config.h): per 32-token KV tile a warp issues exactly the MMAs
its role calls for (S over its 144 dims for both m16 tiles and both n8 tiles of its token half;
O += PV over its 64 V columns for both m16 tiles) from exactly the ldmatrix loads that layout
needs, so every K, V and P fragment feeds more than one MMA, and it never touches local memory.
A change that breaks the unrolling, spills, or adds loads to the loop fails here before any GPU
run."""

from __future__ import annotations

import pytest

from kdtree_verify import _build, _ptxas, _sass

ARCHS = _build.parse_archs(_build.DEFAULT_ARCHS)  # kernel/kdtree_verify/cuda_archs.txt


@pytest.fixture(scope="module")
def config() -> dict[str, int]:
    return _ptxas.config_constants()


@pytest.fixture(scope="module")
def loops() -> list[_sass.LoopStats]:
    return _sass.loop_stats(ARCHS)


def test_main_loop_issues_the_designed_mmas_and_loads(config, loops) -> None:
    k_steps = config["qk_slice"] // 16
    pv_steps = config["block_n"] // 16
    s_mma = config["m_tiles"] * 2 * k_steps  # 2 n8 tiles of the 16-token half per K fragment
    pv_mma = pv_steps * config["m_tiles"] * (config["v_slice"] // 8)
    ldsm = k_steps + pv_steps * (config["m_tiles"] + config["v_slice"] // 16)
    assert [s.arch for s in loops] == [f"sm_{a}" for a in ARCHS]
    for stats in loops:
        assert stats.mma == s_mma + pv_mma, stats.summary()
        assert stats.opcodes["LDSM"] == ldsm, stats.summary()
        assert stats.mma >= 3 * stats.opcodes["LDSM"], stats.summary()


def test_main_loop_uses_no_local_memory(loops) -> None:
    for stats in loops:
        assert stats.opcodes["LDL"] == 0 and stats.opcodes["STL"] == 0, stats.summary()


def test_main_loop_finder_and_opcodes() -> None:
    listing = """
        Function : fake
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0020*/              @!P0 BRA 0x10 ;
        /*0030*/                   LDSM.16.M88.4 R8, [R2] ;
        /*0040*/                   HMMA.16816.F32.BF16 R4, R8, R12, R4 ;
        /*0050*/                   HMMA.16816.F32.BF16 R4, R8, R14, R4 ;
        /*0060*/               @P1 BRA 0x30 ;
        /*0070*/                   EXIT ;
    """
    body = _sass.main_loop(_sass.functions(listing)["fake"])
    assert [_sass.opcode(t) for t in body] == ["LDSM", "HMMA", "HMMA", "BRA"]
    assert _sass.opcode("@!UP0 IMAD.WIDE.U32 R2, R3, 0x4, R4") == "IMAD"
    assert _sass.main_loop(_sass.functions(listing.replace("HMMA", "FADD"))["fake"]) == []
