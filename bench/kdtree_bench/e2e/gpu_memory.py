"""The GPU memory each SGLang server holds: nvidia-smi's compute processes, summed by session.

A server's GPU memory is held by its scheduler processes, children of the launcher that
``SGLangServer`` starts in a session of its own. So each process nvidia-smi lists is counted
under its session, which is the launcher's pid. SGLang's own "avail mem" lines cannot give
these figures when several servers start together: each is a difference of the card's free
memory, which another server's loading moves at the same time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping

QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def parse_compute_apps(text: str) -> list[tuple[int, int]]:
    """(pid, MiB) of each line of ``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits``; a line without a number (``[N/A]``) is left out."""
    apps = []
    for line in text.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit() and used.strip().isdigit():
            apps.append((int(pid), int(used)))
    return apps


def session_mib(apps: Iterable[tuple[int, int]], sessions: Iterable[int]) -> dict[int, int]:
    """MiB per session of ``sessions``, summed over the processes in ``apps`` that belong to it
    (a process gone meanwhile is left out)."""
    wanted = set(sessions)
    totals = dict.fromkeys(wanted, 0)
    for pid, used in apps:
        try:
            session = os.getsid(pid)
        except (ProcessLookupError, PermissionError):
            continue
        if session in wanted:
            totals[session] += used
    return totals


def servers_mib(launchers: Mapping[str, int]) -> dict[str, int] | None:
    """MiB each server holds, by name, from its launcher's pid (its session); None where
    nvidia-smi is not there or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    done = subprocess.run([smi, *QUERY], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return None
    totals = session_mib(parse_compute_apps(done.stdout), launchers.values())
    return {name: totals[pid] for name, pid in launchers.items()}
