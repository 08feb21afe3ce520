"""Two real ``kdtree-parity serve`` processes on one SQLite file (a rolling restart, blue/green,
two replicas on one volume): a pair runs once across both, a live run is never declared dead
by the other service or resumed beside its owner, and a run whose owner died is interrupted
once its lease expires. The second service runs in its own pid namespace where that is possible
(root), as a second container would: there it cannot see the first one's pid, only its lease.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from parity_service_proc import ParityService
from parity_support import run_cli, write_inputs

pytestmark = pytest.mark.slow
TOKEN = "shared-store-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEASE_S = 6.0


def own_pid_namespace() -> list[str]:
    if os.getuid() == 0 and shutil.which("unshare"):
        return ["unshare", "--pid", "--kill-child=SIGTERM"]
    return []


def test_two_services_share_one_store(reference_server, tmp_path: Path) -> None:
    # The candidate decodes slowly on purpose, so the shared run is still running (it takes
    # minutes) through every check below, however fast the machine.
    baseline, candidate = reference_server(), reference_server(decode_step_delay=0.05)
    corpus, policy = write_inputs(tmp_path, 6)
    db = tmp_path / "runs.sqlite3"
    env = {
        "KDTREE_PARITY_TOKEN": TOKEN,
        "KDTREE_PARITY_BASELINE_URL": baseline,
        "KDTREE_PARITY_CANDIDATE_URL": candidate,
        "KDTREE_PARITY_CORPUS": str(corpus),
        "KDTREE_PARITY_POLICY": str(policy),
        "KDTREE_PARITY_DB": str(db),
        "KDTREE_PARITY_OUT": str(tmp_path / "out"),
        "KDTREE_PARITY_LEASE_S": str(LEASE_S),
    }
    prefix = own_pid_namespace()
    first = ParityService(env, tmp_path / "first.log")
    second = ParityService(env, tmp_path / "second.log", prefix=prefix)
    try:
        first.wait()
        second.wait()
        # Both asked at once for the same pair (the 203-prompt corpus, on the slow candidate).
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda url: httpx.post(
                        url + "/runs", json={"corpus": "default"}, headers=AUTH, timeout=60
                    ),
                    [first.url, second.url],
                )
            )
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [202, 409], [a.text for a in answers]
        winner = next(a for a in answers if a.status_code == 202).json()["id"]
        owner, other = (first, second) if answers[0].status_code == 202 else (second, first)
        assert winner in next(a for a in answers if a.status_code == 409).json()["detail"]

        # A service (re)started on the same file leaves the live run alone ...
        late = ParityService(env, tmp_path / "late.log", prefix=prefix)
        try:
            late.wait()
            for service in (other, late):
                seen = httpx.get(f"{service.url}/runs/{winner}", timeout=30).json()
                assert seen["status"] == "running", seen
                busy = httpx.post(service.url + "/runs", json={}, headers=AUTH, timeout=30)
                assert busy.status_code == 409 and winner in busy.json()["detail"]
        finally:
            late.stop()
        # ... and so does a CLI resume: the owner is alive.
        resumed = run_cli("run", "--resume", winner, "--db", db, "--no-progress", timeout=60)
        assert resumed.returncode == 2, resumed.stdout + resumed.stderr
        assert f"cannot resume {winner}: run {winner} is still running" in resumed.stderr

        # The owner dies without a word. The other service sees the run interrupted when the
        # owner's lease runs out (or at once where it can see the owner's pid is gone).
        server = psutil.Process(owner.proc.pid)
        if server.name() == "unshare":  # the service itself, not its launcher
            (server,) = server.children()
        server.send_signal(signal.SIGKILL)
        owner.proc.wait(timeout=30)
        killed_at = time.monotonic()
        while True:
            seen = httpx.get(f"{other.url}/runs/{winner}", timeout=30).json()
            if seen["status"] != "running":
                break
            assert time.monotonic() - killed_at < LEASE_S + 10, seen
            time.sleep(0.2)
        assert seen["status"] == "interrupted" and seen["verdict"] is None, seen
        if prefix:  # in different pid namespaces only the lease can tell
            assert "lease" in seen["error"] and "expired" in seen["error"], seen
        taken = httpx.post(other.url + "/runs", json={}, headers=AUTH, timeout=30)
        assert taken.status_code == 202, taken.text
    finally:
        first.stop()
        second.stop()
