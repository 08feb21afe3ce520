"""bench/sglang_profile.py without a GPU: GPU time per kernel read from Chrome traces as the torch
profiler inside SGLang writes them, and the side-by-side table per verify step."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import sglang_e2e
import sglang_profile

VERIFY = "void attention_kernel<128>(VerifyParams)"
GEMM = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"


def kernel(name: str, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": 1.0, "dur": dur}


def write_trace(path: Path, events: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, handle)
    return path


def test_gpu_time_is_summed_per_kernel_and_cpu_events_are_left_out(tmp_path: Path) -> None:
    trace = write_trace(
        tmp_path / "on-1-TP-0.trace.json.gz",
        [
            kernel(VERIFY, 30.0),
            kernel(VERIFY, 34.0),
            kernel(GEMM, 5.5),
            kernel("Memcpy HtoD (Pageable -> Device)", 2.0, "gpu_memcpy"),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 900.0},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 12.0},
            {"ph": "i", "cat": "kernel", "name": VERIFY, "ts": 3.0},
        ],
    )
    times = sglang_profile.kernel_times(trace)
    assert times == {
        VERIFY: sglang_profile.KernelTime(64.0, 2),
        GEMM: sglang_profile.KernelTime(5.5, 1),
        "Memcpy HtoD (Pageable -> Device)": sglang_profile.KernelTime(2.0, 1),
    }


def test_configurations_side_by_side_per_verify_step_largest_difference_first() -> None:
    kt = sglang_profile.KernelTime
    times = {
        "off": {"_fwd_kernel": kt(6000.0, 40), GEMM: kt(400.0, 80)},
        "on": {VERIFY: kt(300.0, 40), GEMM: kt(420.0, 80)},
    }
    table = sglang_profile.comparison(times, {"off": 10, "on": 10}, top=2)
    assert table["gpu_us_per_step"] == {"off": 640.0, "on": 72.0}
    assert [row["name"] for row in table["kernels"]] == ["_fwd_kernel", VERIFY]
    assert table["kernels"][0]["us_per_step"] == {"off": 600.0, "on": 0.0}
    assert table["kernels"][1]["calls"] == {"off": 0, "on": 40}
    text = sglang_profile.comparison_markdown(table)
    assert "| GPU µs per step, all kernels | 640.0 | 72.0 |" in text
    assert "| `_fwd_kernel` | 600.00 (40) | 0.00 (0) |" in text


def test_the_cli_reads_one_folder_per_configuration(tmp_path: Path, capsys) -> None:
    write_trace(tmp_path / "off" / "a.trace.json.gz", [kernel("_fwd_kernel", 800.0)])
    write_trace(tmp_path / "on" / "b.trace.json.gz", [kernel(VERIFY, 40.0)])
    folders = [str(tmp_path / "off"), str(tmp_path / "on")]
    assert sglang_profile.main([*folders, "--steps", "4", "2"]) == 0
    out = capsys.readouterr().out
    assert "| verify steps | 4 | 2 |" in out and "| `_fwd_kernel` | 200.00 (1) | 0.00 (0) |" in out
    assert sglang_profile.main([*folders, "--steps", "4"]) == 2
    (tmp_path / "empty").mkdir()
    assert sglang_profile.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "one count per folder" in err and "no *.trace.json[.gz] in" in err


@pytest.mark.parametrize(("shape", "refused"), [("8x8192", False), ("1x4096", True)])
def test_the_profiled_shape_must_be_a_measured_one(
    tmp_path: Path, shape: str, refused: bool
) -> None:
    (tmp_path / "config.json").write_text("{}")
    args = sglang_e2e.build_parser().parse_args(
        ["--model", str(tmp_path), "--out", str(tmp_path), "--profile-shape", shape]
    )
    why = sglang_e2e.refusal(args)
    assert (why == f"--profile-shape {shape} is not one of the measured shapes") is refused
    assert (why is None) is not refused
