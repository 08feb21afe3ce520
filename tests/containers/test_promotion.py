"""`make promote` and `make rollback` for real: dockerd, a local registry, compose's demo gate.

The demo image stands in for the inference image (``--gate-profile demo``), through the same
promotion code that gates SGLang on a GPU host: compose up --wait of the pair, one sidecar run,
the verdict read from report.json, then tag, push and record. Three candidates, all made from
the built kdtree/demo image inside the daemon:

  good-a    kdtree/demo as built
  good-b    the same engine under another image id (a label differs), so there is a history
  faulted   the engine's fault options baked into the entrypoint: the gate must fail it

The steps run in order and each builds on the last (one registry, one records directory).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from container_support import ROOT, docker, inspect, run

pytestmark = pytest.mark.slow
PROJECT = "kdtree-ct-promote"
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)


@dataclass
class Promotion:
    registry: str
    root: Path

    @property
    def image(self) -> str:
        return f"{self.registry}/kdtree/demo"

    @property
    def records(self) -> Path:
        return self.root / "promotions"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    def make(self, verb: str, *args: str, image: str | None = None) -> Any:
        """The Makefile verb as a user types it, pushing to the registry."""
        env = {
            "KDTREE_IMAGE": image or self.image,
            "KDTREE_PUSH": "1",
            "KDTREE_GATE_PROFILE": "demo",
            "KDTREE_PARITY_IMAGE_REPO": "kdtree/parity",
            "COMPOSE_PROJECT_NAME": PROJECT,
        }
        flags = [f"--records {self.records}", *args]
        return run(
            "make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            verb,
            f"PROMOTE_ARGS={' '.join(flags)}",
            env=env,
            check=False,
            timeout=900,
        )

    def promote(self, revision: str, *args: str, image: str | None = None) -> Any:
        return self.make(
            "promote",
            f"--no-build --revision {revision} --reports {self.reports} --health-timeout 300",
            *args,
            image=image,
        )

    def records_now(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.records.glob("*.json"))]

    def image_id(self, ref: str) -> str:
        return inspect(ref, ".Id")

    def registry_get(self, path: str, method: str = "GET") -> tuple[dict[str, str], bytes]:
        request = urllib.request.Request(
            f"http://{self.registry}/v2/kdtree/demo/{path}",
            method=method,
            headers={"Accept": MANIFEST_TYPES},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return dict(response.headers), response.read()

    def registry_digest(self, tag: str) -> str:
        headers, _ = self.registry_get(f"manifests/{tag}", method="HEAD")
        return headers["Docker-Content-Digest"]

    def registry_tags(self) -> set[str]:
        try:
            _, body = self.registry_get("tags/list")
        except urllib.error.HTTPError as exc:  # nothing pushed yet: the repository is unknown
            if exc.code == 404:
                return set()
            raise
        return set(json.loads(body)["tags"] or [])


def exit_status(result: Any) -> int:
    """The promotion CLI's own exit code: make exits 2 for any failing recipe and names the
    recipe's status in its message ("[Makefile:NN: promote] Error 1")."""
    if result.returncode == 0:
        return 0
    found = re.search(r"\[Makefile:\d+: \w+\] Error (\d+)", result.stderr)
    assert found, f"make failed without running the recipe: {result.stderr[-2000:]}"
    return int(found.group(1))


def _derive(source: str, target: str, *changes: str) -> None:
    """A new image from ``source`` with Dockerfile-style ``changes`` (docker commit)."""
    container = docker("create", source).stdout.strip()
    try:
        flags = [arg for change in changes for arg in ("--change", change)]
        docker("commit", *flags, container, target)
    finally:
        docker("rm", container)


@pytest.fixture(scope="module")
def promotion(engine: None, registry: str) -> Iterator[Promotion]:
    root = Path(tempfile.mkdtemp(prefix="kdtree-promote-"))
    stage = Promotion(registry, root)
    docker("tag", "kdtree/demo:latest", f"{stage.image}:good-a")
    _derive("kdtree/demo:latest", f"{stage.image}:good-b", "LABEL io.kdtree.test.variant=b")
    _derive(
        "kdtree/demo:latest",
        f"{stage.image}:faulted",
        'ENTRYPOINT ["kdtree-engine", "--fault-layer", "1", "--fault-scale", "1.5"]',
    )
    for revision in ("good-a", "good-b", "faulted"):
        docker("tag", "kdtree/parity:latest", f"kdtree/parity:{revision}")
    yield stage
    run("docker", "compose", "--project-name", PROJECT, "--profile", "demo", "down", check=False)
    shutil.rmtree(root, ignore_errors=True)


def test_registry_down_fails_before_anything_is_tagged(promotion: Promotion) -> None:
    # Nothing listens on this port inside the namespace: the registry is down.
    down = "127.0.0.1:5999/kdtree/demo"
    docker("tag", f"{promotion.image}:good-a", f"{down}:good-a")
    result = promotion.promote("good-a", image=down)
    assert exit_status(result) == 2, result.stdout + result.stderr
    assert "127.0.0.1:5999" in result.stderr and "does not answer" in result.stderr
    assert docker("image", "inspect", f"{down}:stable", check=False).returncode != 0
    assert not promotion.records.exists() or not list(promotion.records.iterdir())
    assert not promotion.reports.exists(), "the gate ran although the registry was down"


def test_a_passing_candidate_is_pushed_and_tagged_stable(promotion: Promotion) -> None:
    result = promotion.promote("good-a")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    [record] = promotion.records_now()
    assert record["action"] == "promote" and record["gate"]["verdict"] == "pass"
    candidate_id = promotion.image_id(f"{promotion.image}:good-a")
    assert record["digest"] == candidate_id == promotion.image_id(f"{promotion.image}:stable")
    # The digests the record keeps are the daemon's and the registry's.
    repo_digests = inspect(f"{promotion.image}:stable", ".RepoDigests")
    assert record["candidate"]["repo_digests"] == repo_digests
    [pushed] = repo_digests
    assert pushed == f"{promotion.image}@{promotion.registry_digest('stable')}"
    assert promotion.registry_digest("good-a") == promotion.registry_digest("stable")
    assert Path(record["gate"]["report"]).is_file()


def test_promoting_the_same_revision_again_changes_nothing(promotion: Promotion) -> None:
    before = (promotion.records_now(), promotion.registry_digest("stable"))
    result = promotion.promote("good-a")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "already stable" in result.stdout
    assert (promotion.records_now(), promotion.registry_digest("stable")) == before


def test_a_second_passing_candidate_becomes_stable(promotion: Promotion) -> None:
    first = promotion.records_now()[-1]["digest"]
    result = promotion.promote("good-b")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = promotion.records_now()[-1]
    assert record["action"] == "promote" and record["previous_digest"] == first
    assert record["digest"] == promotion.image_id(f"{promotion.image}:good-b") != first
    assert record["candidate"]["repo_digests"] == [
        f"{promotion.image}@{promotion.registry_digest('stable')}"
    ]


def test_a_failing_candidate_tags_and_pushes_nothing(promotion: Promotion) -> None:
    stable_id = promotion.image_id(f"{promotion.image}:stable")
    stable_pushed = promotion.registry_digest("stable")
    # The fault is in the image, so the baseline is the last good one, not the candidate itself.
    result = promotion.promote("faulted", f"--baseline-image {promotion.image}:good-b")
    assert exit_status(result) == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "NOT PROMOTED: the parity gate said fail" in result.stderr
    assert promotion.image_id(f"{promotion.image}:stable") == stable_id
    assert promotion.registry_digest("stable") == stable_pushed
    assert "faulted" not in promotion.registry_tags()
    record = promotion.records_now()[-1]
    assert record["action"] == "refused" and record["gate"]["verdict"] == "fail"
    assert record["digest"] == promotion.image_id(f"{promotion.image}:faulted")
    assert record["stable_digest"] == stable_id
    assert record["baseline"]["digest"] == stable_id
    assert any(reason.startswith("[hard_divergences fail]") for reason in record["gate"]["reasons"])


def test_rollback_restores_the_previous_digest_and_the_registry_serves_it(
    promotion: Promotion,
) -> None:
    promoted = [r for r in promotion.records_now() if r["action"] == "promote"]
    previous, current = promoted[-2], promoted[-1]
    result = promotion.make("rollback", "--reason drill")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = promotion.records_now()[-1]
    assert record["action"] == "rollback"
    assert (record["digest"], record["from_digest"]) == (previous["digest"], current["digest"])
    assert promotion.image_id(f"{promotion.image}:stable") == previous["digest"]
    [digest_ref] = previous["candidate"]["repo_digests"]
    assert promotion.registry_digest("stable") == digest_ref.split("@")[1]
    _, manifest = promotion.registry_get("manifests/stable")
    assert json.loads(manifest)["config"]["digest"] == previous["digest"]
    # Pulls resolve through the registry, by digest and by tag, to the image rolled back to.
    for tag in ("stable", "good-a", "good-b", "faulted"):
        docker("image", "rm", f"{promotion.image}:{tag}", check=False)
    docker("pull", digest_ref)
    assert promotion.image_id(digest_ref) == previous["digest"]
    docker("pull", f"{promotion.image}:stable")
    assert promotion.image_id(f"{promotion.image}:stable") == previous["digest"]
