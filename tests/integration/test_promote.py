"""`make promote` / `make rollback` end to end, with a stand-in ``docker`` and real servers.

The stand-in (fake_docker.py) records its calls and keeps an image store; the gate inside it is
the real ``kdtree-parity`` CLI, run with the parity service's command from compose.yaml against
real reference-engine servers on loopback (baseline KDTREE_VERIFY=off, candidate on). A small
corpus and policy keep each gate run to seconds on two cores.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "services" / "parity" / "kdtree_parity"
IMAGE = "kdtree/inference"
STABLE = f"{IMAGE}:stable"


@dataclass
class Stage:
    """A promotion sandbox: stand-in docker on PATH, records and reports directories."""

    root: Path
    env: dict[str, str]

    @property
    def records(self) -> Path:
        return self.root / "promotions"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def make(self, verb: str, *args: str) -> subprocess.CompletedProcess:
        """The Makefile verb, as a user types it."""
        return subprocess.run(
            [
                "make",
                "--no-print-directory",
                "-C",
                str(ROOT),
                verb,
                f"PROMOTE_ARGS={' '.join(args)}",
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def promote(self, revision: str, *extra: str) -> subprocess.CompletedProcess:
        return self.make(
            "promote",
            f"--revision {revision} --records {self.records} --reports {self.reports}",
            *extra,
        )

    def rollback(self) -> subprocess.CompletedProcess:
        return self.make("rollback", f"--records {self.records} --reason drill")

    def calls(self) -> list[list[str]]:
        path = self.root / "docker" / "calls.jsonl"
        return (
            [json.loads(line)["argv"] for line in path.read_text().splitlines()]
            if path.exists()
            else []
        )

    def images(self) -> dict[str, str]:
        path = self.root / "docker" / "images.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def record_files(self) -> list[Path]:
        return sorted(self.records.glob("*.json")) if self.records.exists() else []

    def tag_calls(self) -> list[list[str]]:
        return [c for c in self.calls() if c[0] in {"tag", "push"}]


def write_policy(path: Path, changes: dict[str, dict[str, Any]]) -> None:
    """The shipped short policy with some keys changed (sections: replay, compare, gate)."""
    policy = yaml.safe_load((SHORT / "policies" / "short.yaml").read_text())
    for section, values in changes.items():
        assert set(values) <= set(policy[section]), f"unknown {section} keys {values}"
        policy[section].update(values)
    path.write_text(yaml.safe_dump(policy))


@pytest.fixture
def stage(tmp_path: Path) -> Callable[..., Stage]:
    """Build a sandbox whose compose services point at the given server URLs."""

    def make_stage(urls: dict[str, str], **env: str) -> Stage:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        docker = bin_dir / "docker"
        docker.write_text(
            # The stand-in imports tests/unit's compose_model, as pytest's pythonpath lets the tests.
            f'#!/bin/sh\nPYTHONPATH="{ROOT / "tests/unit"}${{PYTHONPATH:+:$PYTHONPATH}}" '
            f'exec "{sys.executable}" "{ROOT / "tests/integration/fake_docker.py"}" "$@"\n'
        )
        docker.chmod(0o755)
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text(
            "".join((SHORT / "corpora" / "short.jsonl").read_text().splitlines(True)[:4])
        )
        policy = tmp_path / "policy.yaml"
        write_policy(policy, {"replay": {"max_new_tokens": 8}, "gate": {"min_prompts": 4}})
        full_env = {
            # Hermetic: none of the caller's KDTREE_* settings, nor a parent make's flags
            # (under `make test`), reach the make we run.
            **{k: v for k, v in os.environ.items() if not k.startswith("KDTREE_")},
            "MAKEFLAGS": "",
            "MFLAGS": "",
            "MAKELEVEL": "",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_DOCKER_STATE": str(tmp_path / "docker"),
            "FAKE_DOCKER_URLS": json.dumps(urls),
            "KDTREE_PARITY_CORPUS": str(corpus),
            "KDTREE_PARITY_POLICY": str(policy),
            **env,
        }
        return Stage(tmp_path, full_env)

    return make_stage


@pytest.fixture
def registry_api() -> Iterator[str]:
    """host:port of a loopback HTTP server answering a registry's ``GET /v2/``: all that promote's
    registry check reads (the stand-in docker does the pushes)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v2/" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _pair(reference_server: Callable[..., str], **candidate_options: Any) -> dict[str, str]:
    return {
        "inference-baseline": reference_server(env={"KDTREE_VERIFY": "off"}),
        "inference-candidate": reference_server(env={"KDTREE_VERIFY": "on"}, **candidate_options),
    }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pass_tags_and_records_then_rollback_restores(
    reference_server, stage, registry_api: str
) -> None:
    # On a registry that answers, so that the pushes below get past promote's registry check.
    image = f"{registry_api}/kdtree/inference"
    stable = f"{image}:stable"
    sandbox = stage(_pair(reference_server), KDTREE_IMAGE=image)

    first = sandbox.promote("rev1")
    assert first.returncode == 0, first.stdout + first.stderr
    images = sandbox.images()
    assert images[stable] == images[f"{image}:rev1"]
    assert ["tag", images[f"{image}:rev1"], stable] in sandbox.calls()
    # The flow, in order: build both images, start the pair healthy, run the sidecar, stop.
    # compose calls: compose --file F --profile gate VERB ...
    assert all(c[3:5] == ["--profile", "gate"] for c in sandbox.calls() if c[0] == "compose")
    verbs = [c[:2] if c[0] != "compose" else c[5:7] for c in sandbox.calls()]
    assert verbs.index(["build", "--build-arg"]) < verbs.index(["up", "--detach"])
    assert verbs.index(["up", "--detach"]) < verbs.index(["run", "--rm"]) < verbs.index(["down"])
    up = next(c for c in sandbox.calls() if c[5:6] == ["up"])
    assert "--wait" in up and up[-2:] == ["inference-baseline", "inference-candidate"]
    assert not any(c[0] == "push" for c in sandbox.calls())

    [record_path] = sandbox.record_files()
    record = json.loads(record_path.read_text())
    report = Path(record["gate"]["report"])
    report_json = json.loads(report.read_text())
    assert record["action"] == "promote" and record["sequence"] == 1
    assert record["digest"] == record["candidate"]["digest"] == images[f"{image}:rev1"]
    assert record["baseline"] == {"ref": f"{image}:rev1", "digest": images[f"{image}:rev1"]}
    assert record["previous_digest"] is None
    assert record["gate"]["verdict"] == "pass" and record["gate"]["exit_code"] == 0
    assert record["gate"]["report_sha256"] == _sha256(report)
    assert record["gate"]["corpus_sha256"] == report_json["corpus"]["sha256"]
    assert record["gate"]["corpus_sha256"] == _sha256(sandbox.root / "corpus.jsonl")
    assert record["gate"]["policy"]["sha256"] == _sha256(sandbox.root / "policy.yaml")
    assert record["gate"]["run_id"] == report_json["run"]["id"]
    assert record["time"].endswith("Z") and record["source"]["revision"] == "rev1"
    first_bytes = record_path.read_bytes()

    # The second promotion also pushes, as with a registry configured (KDTREE_PUSH=1).
    sandbox.env["KDTREE_PUSH"] = "1"
    second = sandbox.promote("rev2")
    assert second.returncode == 0, second.stdout + second.stderr
    images = sandbox.images()
    assert images[stable] == images[f"{image}:rev2"] != images[f"{image}:rev1"]
    assert ["push", f"{image}:rev2"] in sandbox.calls() and ["push", stable] in sandbox.calls()
    records = sandbox.record_files()
    assert len(records) == 2 and records[0].read_bytes() == first_bytes
    second_record = json.loads(records[1].read_text())
    assert second_record["previous_digest"] == images[f"{image}:rev1"]
    assert second_record["pushed"] is True
    assert second_record["candidate"]["repo_digests"] == [f"{image}@{images[f'{image}:rev2']}"]

    # A registry that refuses the stable push: the local stable tag is put back, nothing recorded.
    sandbox.env["FAKE_DOCKER_FAIL"] = json.dumps({f"push {stable}": 1})
    refused_push = sandbox.promote("rev3")
    assert (
        refused_push.returncode == 2 and f"'docker push {stable}' exited 1" in refused_push.stderr
    )
    assert sandbox.images()[stable] == images[f"{image}:rev2"]
    assert len(sandbox.record_files()) == 2
    del sandbox.env["KDTREE_PUSH"], sandbox.env["FAKE_DOCKER_FAIL"]

    # The same digest again: nothing to gate, nothing written.
    calls_before = len(sandbox.calls())
    again = sandbox.promote("rev2", "--no-build")
    assert again.returncode == 0 and "already stable" in again.stdout
    assert len(sandbox.record_files()) == 2
    assert not any(c[0] == "compose" for c in sandbox.calls()[calls_before:])

    back = sandbox.rollback()
    assert back.returncode == 0, back.stdout + back.stderr
    assert sandbox.images()[stable] == images[f"{image}:rev1"]
    records = sandbox.record_files()
    assert len(records) == 3 and records[0].read_bytes() == first_bytes
    rollback_record = json.loads(records[2].read_text())
    assert rollback_record["action"] == "rollback"
    assert rollback_record["from_digest"] == images[f"{image}:rev2"]
    assert rollback_record["digest"] == images[f"{image}:rev1"]
    assert rollback_record["reason"] == "drill"

    # Nothing earlier than rev1 was ever promoted: a second rollback is refused and changes nothing.
    refused = sandbox.rollback()
    assert refused.returncode != 0 and "no earlier promoted digest" in refused.stderr
    assert sandbox.images()[stable] == images[f"{image}:rev1"]
    assert len(sandbox.record_files()) == 3


def test_failing_gate_tags_nothing_and_says_why(reference_server, stage) -> None:
    sandbox = stage(_pair(reference_server, fault_layer=0, fault_scale=3.0))
    result = sandbox.promote("bad1")
    assert result.returncode != 0
    assert "NOT PROMOTED: the parity gate said fail" in result.stderr
    assert "hard_divergences" in result.stderr
    assert sandbox.tag_calls() == [] and STABLE not in sandbox.images()
    [report] = sandbox.reports.glob("*/*/report.json")
    assert json.loads(report.read_text())["verdict"]["status"] == "fail"
    [record_file] = sandbox.record_files()
    record = json.loads(record_file.read_text())
    assert record_file.name.startswith("0001-refused-")
    assert (record["action"], record["gate"]["verdict"], record["stable_digest"]) == (
        "refused",
        "fail",
        None,
    )
    assert record["gate"]["report_sha256"] == _sha256(report)
    assert any("hard_divergences" in reason for reason in record["gate"]["reasons"])
    assert any(c[0] == "compose" and "down" in c for c in sandbox.calls())


def test_slower_candidate_is_not_promoted(reference_server, stage) -> None:
    """Correct but slow on purpose (a sleep after every decode step): the speed rule refuses it,
    and it is the only rule that does."""
    sandbox = stage(_pair(reference_server, decode_step_delay=0.3))
    result = sandbox.promote("slow1")
    assert result.returncode != 0, result.stdout + result.stderr  # make's exit for a failed verb
    assert "NOT PROMOTED: the parity gate said fail" in result.stderr
    assert sandbox.tag_calls() == [] and STABLE not in sandbox.images()
    [report] = sandbox.reports.glob("*/*/report.json")
    reasons = json.loads(report.read_text())["verdict"]["reasons"]
    assert [r["rule"] for r in reasons if r["outcome"] != "pass"] == ["speed"], reasons
    speed = next(r for r in reasons if r["rule"] == "speed")
    assert speed["test"]["interval"][1] < 0.25  # the short policy's max_slowdown 0.75
    assert any("speed" in reason for reason in _only_record(sandbox)["gate"]["reasons"])


def test_promote_with_the_floor_runs_it_and_judges_against_it(reference_server, stage) -> None:
    urls = _pair(reference_server)
    urls["inference-floor"] = reference_server(attention_kv_splits=3)
    sandbox = stage(urls)
    result = sandbox.promote("floor1", "--floor")
    assert result.returncode == 0, result.stdout + result.stderr
    up = [c for c in sandbox.calls() if c[0] == "compose" and "up" in c]
    assert up and "inference-floor" in up[0] and "floor" in up[0]
    [report] = sandbox.reports.glob("*/*/report.json")
    data = json.loads(report.read_text())
    assert {t["role"]: t["url"] for t in data["targets"]}["floor"] == urls["inference-floor"]
    assert data["summary"]["floor"]["drift"]["max"] > 0  # a floor with noise, not a twin
    assert _only_record(sandbox)["action"] == "promote"


def _only_record(sandbox: Stage) -> dict[str, Any]:
    [record_file] = sandbox.record_files()
    return json.loads(record_file.read_text())


def test_gate_that_cannot_decide_tags_nothing(reference_server, stage) -> None:
    """The real sidecar says error: the candidate never answers /health within the deadline."""
    urls = {"inference-baseline": reference_server(), "inference-candidate": "http://127.0.0.1:9"}
    sandbox = stage(urls)
    write_policy(
        Path(sandbox.env["KDTREE_PARITY_POLICY"]),
        {"replay": {"max_new_tokens": 8, "health_deadline_s": 2}, "gate": {"min_prompts": 4}},
    )
    result = sandbox.promote("err1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "NOT PROMOTED: the parity gate said error" in result.stderr
    assert sandbox.tag_calls() == []
    [report] = sandbox.reports.glob("*/*/report.json")
    assert json.loads(report.read_text())["verdict"]["status"] == "error"
    [record_file] = sandbox.record_files()
    record = json.loads(record_file.read_text())
    assert (record["action"], record["gate"]["verdict"]) == ("refused", "error")


def test_sidecar_refusing_its_input_is_an_error(stage) -> None:
    """A policy asking for more prompts than the corpus has: exit 2 and no report at all."""
    urls = {
        "inference-baseline": "http://127.0.0.1:9",
        "inference-candidate": "http://127.0.0.1:10",
    }
    sandbox = stage(urls)
    write_policy(Path(sandbox.env["KDTREE_PARITY_POLICY"]), {"gate": {"min_prompts": 500}})
    result = sandbox.promote("err2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "expected one report.json" in result.stderr
    assert sandbox.tag_calls() == [] and sandbox.record_files() == []


@pytest.mark.parametrize(
    ("failure", "message"),
    [
        ({"up": 1}, "exited 1"),  # the servers never became healthy
        ({"run": 137}, "crashed or was killed"),  # the sidecar was killed (no verdict)
        ({"build": 1}, "exited 1"),  # the image did not build
    ],
    ids=["unhealthy", "sidecar-killed", "build-failed"],
)
def test_erroring_gate_tags_nothing(stage, failure: dict[str, int], message: str) -> None:
    urls = {
        "inference-baseline": "http://127.0.0.1:9",
        "inference-candidate": "http://127.0.0.1:10",
    }
    sandbox = stage(urls, FAKE_DOCKER_FAIL=json.dumps(failure))
    result = sandbox.promote("e1")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "NOT PROMOTED" in result.stderr and message in result.stderr
    assert sandbox.tag_calls() == [] and sandbox.record_files() == []
    if "build" not in failure:
        assert any(c[0] == "compose" and "down" in c for c in sandbox.calls()), (
            "services left running"
        )


def test_revision_comes_from_git_and_a_dirty_tree_is_refused(stage, tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "file.txt").write_text("one\n")
    subprocess.run([*git, "add", "file.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
    urls = {
        "inference-baseline": "http://127.0.0.1:9",
        "inference-candidate": "http://127.0.0.1:10",
    }
    sandbox = stage(urls, FAKE_DOCKER_FAIL=json.dumps({"up": 1}))
    common = f"--context {repo} --records {sandbox.records} --reports {sandbox.reports}"

    (repo / "file.txt").write_text("two\n")
    refused = sandbox.make("promote", common)
    assert refused.returncode == 2 and "uncommitted changes" in refused.stderr
    assert sandbox.calls() == []  # refused before building anything

    allowed = sandbox.make("promote", common, "--allow-dirty")
    assert "building with uncommitted changes" in allowed.stderr
    build = next(c for c in sandbox.calls() if c[0] == "build")
    assert build[build.index("--tag") + 1] == f"{IMAGE}:{head.stdout.strip()}"
    assert allowed.returncode == 2 and sandbox.tag_calls() == []  # then the servers never came up
