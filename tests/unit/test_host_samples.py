"""bench/kdtree_bench/profiling/host_samples.py: py-spy samples of SGLang's schedulers, sorted by where the time went."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kdtree_bench.profiling import host_samples
from kdtree_bench.profiling.host_samples import category

REPO = Path(__file__).resolve().parents[2]
RUN25 = REPO / "bench/results/sglang_e2e/run25/speed.tar.xz"

# Stacks as py-spy writes them with --full-filenames (outermost first).
LOOP = "event_loop_overlap (/site/sglang/srt/managers/scheduler.py:2071)"
DECODE = "process_batch_result_decode (/site/sglang/srt/managers/batch_result_processor.py:958)"
WAIT = "synchronize (/opt/torch/.venv/lib/python3.12/site-packages/torch/cuda/streams.py:224)"
RUN = "run_batch (/site/sglang/srt/managers/scheduler.py:4704)"
VERIFY = "verify (/site/sglang/srt/speculative/eagle_worker_v2.py:1980)"
OURS = "init_forward_metadata_out_graph (/site/kdtree_inference/sglang/backend.py:199)"
COUNT = "_kdtree_count_replay (/site/kdtree_inference/sglang/backend.py:268)"
INC = "inc (/site/prometheus_client/metrics.py:318)"
PARENT = "init_forward_metadata_out_graph (/site/sglang/srt/layers/attention/triton_backend.py:756)"
RESULT = "process_batch_result (/site/sglang/srt/managers/scheduler.py:5092)"
IDLE = "on_idle (/site/sglang/srt/managers/scheduler.py:5322)"


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        ([LOOP, RESULT, DECODE, WAIT], "waiting_for_gpu"),
        ([LOOP, RUN, VERIFY, OURS, COUNT, INC], "plugin"),
        ([LOOP, RUN, VERIFY, OURS], "plugin"),
        # Our override calling the parent: SGLang's time, within the forward.
        ([LOOP, RUN, VERIFY, OURS, PARENT], "forward"),
        ([LOOP, RUN, VERIFY], "forward"),
        ([LOOP, RESULT, DECODE], "results"),
        ([LOOP, IDLE], "idle_loop"),
        ([LOOP], "other"),
        ([], "other"),
    ],
)
def test_each_stack_goes_to_its_category(frames, expected):
    assert category(frames) == expected


def test_raw_lines_parse_and_malformed_ones_are_skipped(tmp_path):
    raw = tmp_path / "pyspy.txt"
    raw.write_text(
        f"{LOOP};{RESULT};{DECODE};{WAIT} 7\n"
        f"{LOOP};{RUN};{VERIFY};{OURS};{COUNT} 2\n"
        " 3\n"  # an empty stack (a thread py-spy could not unwind)
        "no count here\n"
        f"{LOOP};{IDLE} x\n"
    )
    summary = host_samples.summarize(raw)
    assert summary == {
        "busy": 12,
        "waiting_for_gpu": 7,
        "plugin": 2,
        "forward": 0,
        "results": 0,
        "idle_loop": 0,
        "other": 3,
    }
    table = host_samples.summary_markdown({"off": summary, "on": summary})
    assert "| waiting_for_gpu | 7 (58.3%) | 7 (58.3%) |" in table


def test_the_documented_1k_figures_come_from_e2e_25s_samples(tmp_path):
    """docs/sglang.md quotes these counts ("Where `on` falls short"): off waits on its GPU, on
    does not (py-spy 0.4.1 at 100 Hz on both schedulers, e2e 25)."""
    with tarfile.open(RUN25) as archive:
        for member in ("pyspy_1156.txt", "pyspy_1236.txt"):
            archive.extract(f"diagnostics/spin/{member}", tmp_path, filter="data")
    folder = tmp_path / "diagnostics/spin"
    off = host_samples.summarize(folder / "pyspy_1156.txt")
    on = host_samples.summarize(folder / "pyspy_1236.txt")
    assert (off["busy"], off["waiting_for_gpu"]) == (2397, 1477)
    assert (on["busy"], on["waiting_for_gpu"]) == (1646, 0)
    assert (off["forward"], on["forward"]) == (351, 356)


def test_the_cli_writes_the_table_and_refuses_a_missing_file(tmp_path, capsys):
    raw = tmp_path / "a.txt"
    raw.write_text(f"{LOOP};{RUN};{VERIFY} 4\n")
    out = tmp_path / "summary.md"
    assert host_samples.main([f"on={raw}", "--out", str(out)]) == 0
    assert "| forward | 4 (100.0%) |" in out.read_text()
    assert host_samples.main([f"on={tmp_path / 'missing.txt'}"]) == 2
    assert "no file" in capsys.readouterr().err


def test_a_servers_schedulers_are_found_by_session_and_title(tmp_path):
    """Real processes: a session leader with two children, one titled as SGLang titles its
    scheduler; only that one is the server's scheduler."""
    script = (
        "import subprocess, sys, time\n"
        "title = 'import setproctitle, time; setproctitle.setproctitle({!r}); time.sleep(60)'\n"
        "kids = [subprocess.Popen([sys.executable, '-c', title.format(t)])\n"
        "        for t in ('sglang::scheduler_TP0', 'sglang::detokenizer')]\n"
        "time.sleep(60)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        found: list[int] = []
        while time.monotonic() < deadline and not found:
            found = host_samples.scheduler_pids(leader.pid)
            time.sleep(0.2)
        assert len(found) == 1
        title = Path(f"/proc/{found[0]}/cmdline").read_bytes().split(b"\0")[0]
        assert title == b"sglang::scheduler_TP0"
        assert host_samples.scheduler_pids(os.getsid(0)) == []
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_the_sampler_refuses_without_py_spy_or_without_a_scheduler(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="py-spy is not on PATH"):
        host_samples.HostSampler({"on": 1}, tmp_path)
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    sampler = host_samples.HostSampler({"on": os.getsid(0)}, tmp_path / "samples")
    with pytest.raises(RuntimeError, match="no sglang::scheduler process"), sampler:
        pass
