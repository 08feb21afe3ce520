"""`docker compose --profile demo up` for real: the CPU reference-engine pair and the sidecar.

The passing run goes through `make demo-up` as the invoking user (an unprivileged uid when the
suite runs as root), the way a user starts it, and checks the report lands in the host's reports
directory owned by that user. The failing runs use the same compose file, once with the engine's
fault options on the candidate and once with the candidate container killed while the sidecar
replays the corpus.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from container_support import (
    ROOT,
    Invoker,
    compose_command,
    compose_down,
    docker,
    failing_reasons,
    read_report,
    run,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("engine")]
PROFILE = ("--profile", "demo")


@pytest.fixture
def project(request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"kdtree-ct-{request.node.name.removeprefix('test_')[:20].replace('_', '-')}"
    compose_down(name, "demo")
    yield name
    compose_down(name, "demo")


def _assert_owned_by(tree: Path, uid: int, gid: int) -> None:
    for path in [tree, *tree.rglob("*")]:
        stat = path.stat()
        assert (stat.st_uid, stat.st_gid) == (uid, gid), f"{path} is owned by {stat.st_uid}"


def test_demo_profile_passes_and_the_report_belongs_to_the_user(
    project: str, invoker: Invoker
) -> None:
    reports = invoker.directory("reports")
    command = invoker.command(
        "make",
        "--no-print-directory",
        "-C",
        str(ROOT),
        "demo-up",
        f"REPORTS_DIR={reports}",
        f"COMPOSE=docker compose --project-name {project}",
    )
    result = run(*command, env={"HOME": str(invoker.home)}, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "--exit-code-from demo-parity" in result.stdout  # make echoes the command it ran
    report_path, report = read_report(reports / "demo")
    assert report["verdict"]["status"] == "pass", failing_reasons(report)
    assert {"report.md", "report.html"} <= {p.name for p in report_path.parent.iterdir()}
    _assert_owned_by(reports, invoker.uid, invoker.gid)


def _fault_override(directory: Path) -> Path:
    """The candidate with the engine's fault options: layer 1's attention output scaled by 1.5."""
    override = directory / "faulted-candidate.yaml"
    override.write_text(
        "services:\n"
        "  demo-candidate:\n"
        '    command: ["--host", "0.0.0.0", "--port", "30000", "--seed", "0",\n'
        '              "--fault-layer", "1", "--fault-scale", "1.5"]\n'
    )
    return override


def _gate_env(reports: Path, invoker: Invoker, run_id: str) -> dict[str, str]:
    return {
        "KDTREE_REPORTS_DIR": str(reports),
        "KDTREE_PARITY_USER": f"{invoker.uid}:{invoker.gid}",
        "KDTREE_RUN_ID": run_id,
    }


def test_a_faulted_candidate_fails_and_the_report_says_why(project: str, invoker: Invoker) -> None:
    reports = invoker.directory("reports")
    command = compose_command(
        project,
        *PROFILE,
        "up",
        "--exit-code-from",
        "demo-parity",
        files=[_fault_override(invoker.home)],
    )
    result = run(*command, env=_gate_env(reports, invoker, "faulted"), check=False)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    _, report = read_report(reports / "faulted")
    assert report["verdict"]["status"] == "fail"
    failed = failing_reasons(report)
    assert failed and all(r["outcome"] == "fail" for r in failed), failed
    assert all(r["message"] for r in failed)
    # The candidate really ran with the fault (the engine reports its settings).
    inspected = docker("inspect", "--format", "{{json .Args}}", f"{project}-demo-candidate-1")
    assert "--fault-layer" in inspected.stdout


def _logs(container: str) -> str:
    result = docker("logs", container, check=False)
    return result.stdout + result.stderr if result.returncode == 0 else ""


def test_a_candidate_that_dies_mid_run_does_not_pass(project: str, invoker: Invoker) -> None:
    reports = invoker.directory("reports")
    env = _gate_env(reports, invoker, "killed")
    command = compose_command(project, *PROFILE, "up", "--exit-code-from", "demo-parity")
    log = invoker.home / "compose.log"
    with log.open("w") as sink:
        up = subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env}, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            sidecar, candidate = f"{project}-demo-parity-1", f"{project}-demo-candidate-1"
            deadline = time.monotonic() + 300
            # The sidecar prints "run ID: N prompts, corpus ..." as its replay starts; the short
            # corpus then takes seconds, so the candidate is killed the moment that line shows.
            while "prompts, corpus" not in _logs(sidecar):
                assert up.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the sidecar never started its replay"
                time.sleep(0.2)
            docker("kill", candidate)
            exit_code = up.wait(timeout=300)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
    # Had the replay finished before the kill, the sidecar would have exited 0 with a pass.
    assert exit_code != 0, log.read_text()[-3000:]
    reports_written = sorted((reports / "killed").glob("*/report.json"))
    if reports_written:  # an interrupted run may leave a report; it must not say pass
        _, report = read_report(reports / "killed")
        assert report["verdict"]["status"] != "pass"
