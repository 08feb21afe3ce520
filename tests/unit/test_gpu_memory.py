"""kdtree_bench.e2e.gpu_memory: nvidia-smi's compute processes summed per server session, with
real processes in sessions of their own (the GPU query itself runs on the GPU machine)."""

from __future__ import annotations

import os
import subprocess

from kdtree_bench.e2e import gpu_memory


def test_compute_app_lines_are_parsed_and_unknown_figures_left_out() -> None:
    text = "1234, 2048\n5678, [N/A]\n\n91011, 16\n"
    assert gpu_memory.parse_compute_apps(text) == [(1234, 2048), (91011, 16)]


def test_processes_are_summed_under_their_session() -> None:
    # A launcher in a new session with a child of its own, as SGLang's scheduler is its server's.
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 30 & echo $!; wait"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        child = int(leader.stdout.readline())
        gone = subprocess.Popen(["true"])
        gone.wait()
        apps = [(leader.pid, 70), (child, 30), (os.getpid(), 50), (gone.pid, 7)]
        assert gpu_memory.session_mib(apps, [leader.pid]) == {leader.pid: 100}
        # A session none of the processes is in holds nothing.
        assert gpu_memory.session_mib(apps, [leader.pid, 2**22 + 7]) == {
            leader.pid: 100,
            2**22 + 7: 0,
        }
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_no_figures_without_nvidia_smi(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_memory.servers_mib({"speed_off": os.getpid()}) is None
