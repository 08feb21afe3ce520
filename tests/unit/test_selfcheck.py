"""kdtree-selfcheck on a CPU machine: it refuses in one line (exit 2), through its console script
and through the image's entrypoint (kdtree-serve); its case list, timing summary and report writer
are what the GPU run (tests/gpu/test_selfcheck_gpu.py) relies on."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdtree_inference import selfcheck

needs_cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the refusal is for machines without a CUDA device"
)
BIN = Path(sys.executable).parent


def _script(name: str) -> str:
    path = shutil.which(name, path=str(BIN))
    assert path, (
        f"{name} is not installed next to {sys.executable} (pip install services/inference)"
    )
    return path


def _assert_one_line_refusal(result: subprocess.CompletedProcess, out: Path) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kdtree-selfcheck: refused: no CUDA device is visible")
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists(), "a refusal must not write a report"


@needs_cpu_only
@pytest.mark.parametrize("command", [["kdtree-selfcheck"], ["kdtree-serve", "kdtree-selfcheck"]])
def test_without_a_gpu_it_refuses_in_one_line(command: list[str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    argv = [_script(command[0]), *command[1:], "--out", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    _assert_one_line_refusal(result, out)


def test_bad_arguments_are_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        selfcheck.main(["--repeats", "0"])
    assert exit_info.value.code == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_cases_cover_every_mask_kind_draft_size_and_the_fp8_pool() -> None:
    cases = selfcheck.CASES
    assert len({c.name for c in cases}) == len(cases)
    assert {c.mask for c in cases} == {"tree", "chain", "causal"}
    assert {1, 8, 16, 64} <= {c.num_draft for c in cases}
    assert any(c.fp8 for c in cases) and any(not c.fp8 for c in cases)
    prefixes = {p for c in cases for p in c.prefix_lens}
    assert {0, 63, 64, 65} <= prefixes and max(prefixes) >= 32768
    assert any(len(c.prefix_lens) >= 32 for c in cases), "a large ragged batch"
    assert {16, 128} <= {c.num_heads for c in cases}


def test_cases_build_with_the_kernel_packages_helpers() -> None:
    """Each case is a valid input of the op: built by kdtree_verify.testing and judged by the same
    helper on the CPU op (small stand-ins for the long prefixes, to keep this fast)."""
    from kdtree_verify import verify_attention
    from kdtree_verify.testing import assert_matches_reference, make_case

    for case in selfcheck.CASES:
        prefixes = [min(p, 300) for p in case.prefix_lens[:4]]
        options = (
            {"kv_dtype": torch.float8_e4m3fn, "k_scale": 0.75, "v_scale": 1.25} if case.fp8 else {}
        )
        built = make_case(
            prefixes, case.num_draft, min(case.num_heads, 16), mask=case.mask, **options
        )
        out, lse = verify_attention(*built.args(), return_lse=True, **built.scales())
        assert_matches_reference(out, lse, built.args(), case.name, **built.scales())


def test_timing_summary_is_the_median_and_spread_in_microseconds() -> None:
    summary = selfcheck.summarize_times([0.010, 0.012, 0.011, 0.050, 0.011])
    assert summary["median_us"] == pytest.approx(11.0)
    assert summary["min_us"] == pytest.approx(10.0) and summary["max_us"] == pytest.approx(50.0)
    assert summary["iqr_us"] == pytest.approx(1.0)
    assert summary["repeats"] == 5
    with pytest.raises(ValueError):
        selfcheck.summarize_times([])


def _report(passed: bool) -> dict:
    timing = selfcheck.summarize_times([0.02, 0.021, 0.019])
    return {
        "schema": selfcheck.SCHEMA,
        "time": "2026-12-01T00:00:00Z",
        "passed": passed,
        "device": {
            "name": "NVIDIA Test GPU",
            "sm": "sm_120",
            "memory_gib": 31.4,
            "multiprocessors": 170,
            "torch_cuda": "13.0",
        },
        "environment": {
            "torch": "2.14.1",
            "sglang": "0.5.23",
            "python": "3.11",
            "kdtree_verify": "0.1.0",
            "triton": "3.8.0",
        },
        "cases": [
            {
                "name": "ok-case",
                "prefix_lens": [1, 2, 3, 4, 5],
                "num_draft": 8,
                "num_heads": 16,
                "mask": "tree",
                "kv": "bf16",
                "passed": True,
                "detail": "fine",
                "seconds": 0.1,
            },
            {
                "name": "bad-case",
                "prefix_lens": [7],
                "num_draft": 1,
                "num_heads": 16,
                "mask": "chain",
                "kv": "fp8_e4m3",
                "passed": passed,
                "detail": "AssertionError: off",
                "seconds": 0.1,
            },
        ],
        "benchmark": {
            "warmup": 3,
            "repeats": 3,
            "triton_unavailable": None,
            "skipped": None,
            "shapes": [
                {"shape": "B1-H16-T8-P4096", "kdtree": timing, "triton": timing, "speedup": 1.0}
            ],
        },
    }


def test_reports_are_written_as_json_and_markdown(tmp_path: Path) -> None:
    json_path, md_path = selfcheck.write_reports(_report(passed=False), tmp_path / "out")
    assert json.loads(json_path.read_text())["cases"][1]["passed"] is False
    text = md_path.read_text()
    assert text.startswith("# kdtree self-check: FAIL")
    assert "NVIDIA Test GPU (sm_120" in text
    assert "1/2 cases pass" in text
    assert "| bad-case | 7 | 1 | 16 | chain | fp8_e4m3 | FAIL: AssertionError: off |" in text
    assert "| ok-case | 1, 2, 3, 4, ... (5 requests) |" in text
    assert "| B1-H16-T8-P4096 | 20.0 [19.0, 21.0], IQR 1.0 |" in text
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "selfcheck.json",
        "selfcheck.md",
    ]


def test_a_passing_report_says_pass() -> None:
    assert selfcheck.render_markdown(_report(passed=True)).startswith("# kdtree self-check: PASS")
