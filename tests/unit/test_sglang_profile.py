"""bench/kdtree_bench/profiling/sglang_profile.py without a GPU: GPU time per kernel read from Chrome traces as the torch
profiler inside SGLang writes them, and the side-by-side table per verify step."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import pytest

from kdtree_bench.e2e import sglang_e2e
from kdtree_bench.profiling import sglang_profile

VERIFY = "void kdtree::(anonymous namespace)::attention_kernel<__nv_bfloat16, true>(VerifyParams)"
COMBINE = "void kdtree::(anonymous namespace)::combine_kernel<__nv_bfloat16, 4>(VerifyParams)"
GEMM = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"


def kernel(
    name: str, dur: float, cat: str = "kernel", ts: float = 1.0, pid: int = 0, tid: int = 7
) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


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
    times = sglang_profile.trace_times(trace)
    assert times.kernels == {
        VERIFY: sglang_profile.KernelTime(64.0, 2),
        GEMM: sglang_profile.KernelTime(5.5, 1),
        "Memcpy HtoD (Pageable -> Device)": sglang_profile.KernelTime(2.0, 1),
    }


def test_busy_time_counts_overlapping_work_once_per_device(tmp_path: Path) -> None:
    """A programmatic dependent (the combine) starts while the attention grid drains: the sums
    count the overlap in both kernels, the busy time once; another device's work adds."""
    trace = write_trace(
        tmp_path / "on.trace.json.gz",
        [
            kernel(VERIFY, 30.0, ts=100.0),
            kernel(COMBINE, 10.0, ts=125.0, tid=8),  # 5 µs inside the attention
            kernel(GEMM, 4.0, ts=126.0),  # wholly inside both
            kernel(GEMM, 5.0, ts=200.0),  # after a gap
            kernel(GEMM, 7.0, ts=100.0, pid=1),  # the second device, at the same time
            kernel("_fwd_kernel", 6.0, ts=300.0),
            kernel("_fwd_kernel", 6.0, ts=303.0, tid=9),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 900.0},
        ],
    )
    times = sglang_profile.trace_times(trace)
    assert sum(t.total_us for t in times.kernels.values()) == 68.0
    assert times.busy_us == 35.0 + 5.0 + 9.0 + 7.0
    assert times.group_busy_us == {
        "kdtree's kernels": 35.0,
        "Triton `*_fwd_kernel*`": 9.0,
    }
    assert sglang_profile.busy_time([]) == 0.0
    assert sglang_profile.busy_time([(3.0, 4.0), (0.0, 2.0), (1.0, 2.5)]) == 3.5
    merged = sglang_profile.merged_times((trace, trace))
    assert merged.busy_us == 112.0 and merged.kernels[VERIFY] == sglang_profile.KernelTime(60.0, 2)
    assert merged.group_busy_us["kdtree's kernels"] == 70.0


def test_configurations_side_by_side_per_verify_step_largest_difference_first() -> None:
    kt = sglang_profile.KernelTime
    times = {
        "off": sglang_profile.GpuTime(
            {"_fwd_kernel": kt(6000.0, 40), GEMM: kt(400.0, 80)},
            6400.0,
            {"kdtree's kernels": 0.0, "Triton `*_fwd_kernel*`": 6000.0},
        ),
        "on": sglang_profile.GpuTime(
            {VERIFY: kt(300.0, 40), GEMM: kt(420.0, 80)},
            650.0,
            {"kdtree's kernels": 230.0, "Triton `*_fwd_kernel*`": 0.0},
        ),
    }
    table = sglang_profile.comparison(times, {"off": 10, "on": 10}, top=2)
    assert table["gpu_us_per_step"] == {"off": 640.0, "on": 72.0}
    assert table["gpu_busy_us_per_step"] == {"off": 640.0, "on": 65.0}
    assert [row["name"] for row in table["kernels"]] == ["_fwd_kernel", VERIFY]
    assert table["kernels"][0]["us_per_step"] == {"off": 600.0, "on": 0.0}
    assert table["kernels"][1]["calls"] == {"off": 0, "on": 40}
    text = sglang_profile.comparison_markdown(table)
    assert "| GPU µs per step, all kernels | 640.0 | 72.0 |" in text
    assert "| GPU busy µs per step (overlaps once) | 640.0 | 65.0 |" in text
    assert "| GPU busy µs per step, kdtree's kernels | 0.0 | 23.0 |" in text
    assert table["group_busy_us_per_step"]["Triton `*_fwd_kernel*`"] == {
        "off": 600.0,
        "on": 0.0,
    }
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


RUNS = Path(__file__).resolve().parents[2] / "bench" / "results" / "sglang_e2e"


@pytest.mark.parametrize(
    ("archive", "busy", "kdtree_busy"),
    [
        # docs/sglang.md quotes these, rounded: GPU busy µs per verify step, and kdtree's share.
        ("run23/profile_eagle.tar.xz", {"off": 3030.1, "on": 2110.0}, {"on": 69.5}),
        ("run23/profile_dflash.tar.xz", {"off": 90657.1, "on": 13014.4}, {"on": 1292.6}),
        (
            "run29/speed.tar.xz",
            {"off": 2725.6, "on": 2279.4, "on_draft_triton": 2440.8},
            {"on": 244.9, "on_draft_triton": 194.4},
        ),
        ("run34/speed.tar.xz", {"off": 50993.6, "on": 5957.2}, {"on": 3188.4}),
        ("run36/speed.tar.xz", {"off": 1973.0, "on": 1938.1}, {"on": 405.6}),
        ("run38/speed.tar.xz", {"off": 1979.0, "on_fp16": 1729.3}, {"on_fp16": 185.2}),
    ],
)
def test_the_committed_profiles_busy_times(tmp_path: Path, archive, busy, kdtree_busy) -> None:
    """The busy times the docs quote, read again from the runs' traces by this module; each is
    below the kernels' summed time the run's own profile.md recorded."""
    with tarfile.open(RUNS / archive) as tar:
        members = [m for m in tar.getmembers() if "speed/profile/" in m.name]
        tar.extractall(tmp_path, members=members, filter="data")
    folder = tmp_path / "speed" / "profile"
    lines = (folder / "profile.md").read_text().splitlines()
    confs = [c.strip() for c in lines[2].strip("|").split("|")[1:]]
    steps = dict(zip(confs, map(int, lines[4].strip("|").split("|")[1:]), strict=True))
    summed = dict(zip(confs, map(float, lines[5].strip("|").split("|")[1:]), strict=True))
    assert set(confs) == set(busy)
    for conf in confs:
        times = sglang_profile.merged_times(tuple(sorted((folder / conf).glob("*.trace.json.gz"))))
        table = sglang_profile.comparison({conf: times}, {conf: steps[conf]})
        assert table["gpu_us_per_step"][conf] == pytest.approx(summed[conf], abs=0.06)
        assert table["gpu_busy_us_per_step"][conf] == pytest.approx(busy[conf], abs=0.06)
        assert busy[conf] < summed[conf]
        kdtree = table["group_busy_us_per_step"]["kdtree's kernels"][conf]
        assert kdtree == pytest.approx(kdtree_busy.get(conf, 0.0), abs=0.06)
