"""The promotion flow: build, gate, and on a pass tag ``stable`` and record it; roll back by record.

``promote`` builds the candidate image (tagged by git revision), starts the compose pair (baseline
``KDTREE_VERIFY=off``, candidate ``on``), waits for both to be healthy, runs the parity sidecar
once and reads its verdict. Only a pass whose report agrees tags the candidate's digest as
``stable`` (and pushes when asked) and writes a promotion record; a fail or an error verdict tags
nothing and writes a ``refused`` record. ``rollback`` points ``stable`` at the digest that was
stable before the current one, as the records tell it, and records that too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kdtree_parity.promote.docker import Docker
from kdtree_parity.promote.errors import GateRefused, PromotionError
from kdtree_parity.promote.gate_report import GateResult, read_gate_report
from kdtree_parity.promote.profiles import GATE_PROFILES, GateProfile, GateProfileName
from kdtree_parity.promote.progress import step
from kdtree_parity.promote.records import (
    STABLE_TAG,
    GateSummary,
    ImageSide,
    PromotedCandidate,
    PromoteRecord,
    PromotionRecord,
    RecordStore,
    RefusedRecord,
    RollbackRecord,
    SourceState,
)
from kdtree_parity.promote.registry import check_registry
from kdtree_parity.promote.settings import checkout_cuda_archs


@dataclass(frozen=True)
class PromotionOptions:
    """Everything one ``promote`` or ``gate`` needs; the CLI fills it from flags and settings."""

    image: str
    parity_image: str
    revision: str
    compose_file: Path
    records_dir: Path
    reports_dir: Path
    context_dir: Path
    baseline_image: str | None = None
    build: bool = True
    push: bool = False
    cuda_archs: str | None = None  # None: the checkout's kernel/kdtree_verify/cuda_archs.txt
    health_timeout_s: int = 1800
    keep_up: bool = False
    gate_profile: GateProfileName = "gate"
    floor: bool = False  # also run the A/A' floor server and judge against it

    @property
    def profile(self) -> GateProfile:
        return GATE_PROFILES[self.gate_profile]

    @property
    def candidate_ref(self) -> str:
        return f"{self.image}:{self.revision}"

    @property
    def parity_ref(self) -> str:
        return f"{self.parity_image}:{self.revision}"


@dataclass(frozen=True)
class GateOutcome:
    """What was gated (refs and the digests they named) and what the sidecar said."""

    candidate_ref: str
    candidate_digest: str
    baseline_ref: str
    baseline_digest: str
    out_dir: Path
    result: GateResult


def git_revision(repo: Path) -> tuple[str, bool]:
    """(short revision, whether the work tree has uncommitted changes)."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PromotionError(
            f"cannot read the git revision of {repo}; pass --revision explicitly"
        ) from exc
    return rev, bool(dirty)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _tag_stable(docker: Docker, digest: str, image: str, push: bool) -> list[str]:
    """Tag ``digest`` stable (and push it); if the push fails, put the local tag back."""
    stable_ref = f"{image}:{STABLE_TAG}"
    before = docker.run("image", "inspect", "--format", "{{.Id}}", stable_ref, check=False)
    docker.run("tag", digest, stable_ref)
    if not push:
        return []
    try:
        docker.run("push", stable_ref, capture=False)
        return docker.repo_digests(stable_ref)
    except PromotionError:
        if before.returncode == 0:
            docker.run("tag", before.stdout.strip(), stable_ref, check=False)
        else:
            docker.run("image", "rm", stable_ref, check=False)
        raise


def build_images(options: PromotionOptions, docker: Docker) -> None:
    target = options.profile.build_target
    archs = options.cuda_archs or checkout_cuda_archs()
    step(
        f"building {options.candidate_ref} (target {target}, archs {archs}) "
        f"and {options.parity_ref}"
    )
    common = ["build", "--build-arg", f"VCS_REF={options.revision}"]
    docker.run(
        *common,
        "--build-arg",
        f"KDTREE_CUDA_ARCHS={archs}",
        "--target",
        target,
        "--tag",
        options.candidate_ref,
        str(options.context_dir),
        capture=False,
    )
    docker.run(
        *common,
        "--target",
        "parity",
        "--tag",
        options.parity_ref,
        str(options.context_dir),
        capture=False,
    )


def run_gate(options: PromotionOptions, docker: Docker, run_id: str | None = None) -> GateOutcome:
    """Start the pair, wait for health, run the sidecar once, read its verdict. Tags nothing."""
    candidate_ref = options.candidate_ref
    candidate_digest = docker.image_digest(candidate_ref)
    # The baseline is the candidate image with the kernel off (stock SGLang) unless a different
    # image is named: the gate then isolates exactly what KDTREE_VERIFY=on changes.
    baseline_ref = options.baseline_image or candidate_ref
    baseline_digest = docker.image_digest(baseline_ref)
    docker.image_digest(options.parity_ref)  # fail now, not after the servers took minutes

    run_id = run_id or f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{options.revision}"
    reports_dir = options.reports_dir.resolve()
    out_dir = reports_dir / run_id
    if out_dir.exists():
        raise PromotionError(
            f"{out_dir} already exists: a gate run never reuses a report directory"
        )
    profile = options.profile
    compose_env = {
        profile.candidate_var: candidate_ref,
        profile.baseline_var: baseline_ref,
        "KDTREE_PARITY_IMAGE": options.parity_ref,
        "KDTREE_RUN_ID": run_id,
        "KDTREE_REPORTS_DIR": str(reports_dir),
        # The sidecar writes its report into our bind-mounted directory as us.
        "KDTREE_PARITY_USER": f"{os.getuid()}:{os.getgid()}",
    }
    servers = list(profile.servers)
    compose_args = ["compose", "--file", str(options.compose_file), "--profile"]
    compose_args.append(options.gate_profile)
    if options.floor:
        servers.append(profile.floor_server)
        compose_args += ["--profile", profile.floor_profile]
        compose_env[profile.floor_var] = baseline_ref
        compose_env["KDTREE_GATE_FLOOR_URL"] = f"http://{profile.floor_server}:30000"
    compose = docker.with_env(compose_env)
    reports_dir.mkdir(parents=True, exist_ok=True)
    try:
        step(f"starting {' and '.join(servers)}; waiting up to {options.health_timeout_s}s")
        compose.run(
            *compose_args,
            "up",
            "--detach",
            "--wait",
            "--wait-timeout",
            str(options.health_timeout_s),
            *servers,
            capture=False,
        )
        step(f"running the parity gate (run {run_id}, report in {out_dir})")
        gate_exit = compose.run(
            *compose_args, "run", "--rm", profile.sidecar, check=False, capture=False
        ).returncode
    finally:
        if not options.keep_up:
            compose.run(*compose_args, "down", check=False, capture=False)
    return GateOutcome(
        candidate_ref=candidate_ref,
        candidate_digest=candidate_digest,
        baseline_ref=baseline_ref,
        baseline_digest=baseline_digest,
        out_dir=out_dir,
        result=read_gate_report(out_dir, gate_exit),
    )


def _gate_summary(gate: GateResult) -> GateSummary:
    return GateSummary(
        run_id=gate.run_id,
        verdict=gate.verdict,
        exit_code=gate.exit_code,
        reasons=gate.reasons,
        report=str(gate.report_path),
        report_sha256=gate.report_sha256,
        corpus_sha256=gate.corpus_sha256,
        policy=gate.policy,
    )


def promote(options: PromotionOptions, docker: Docker, source_dirty: bool = False) -> Path | None:
    """Run the gate and, on a pass, tag ``stable`` and write the record (its path is returned).

    Returns None when the candidate is already stable. Raises GateRefused on fail/error verdicts
    (after writing a ``refused`` record) and PromotionError on everything else; in both cases
    nothing was tagged or pushed.
    """
    records = RecordStore(options.records_dir)
    history = records.stable_history()  # a corrupt history stops us before any work
    stable_digest = history[-1] if history else None
    if options.push:
        check_registry(options.image)
    if options.build:
        build_images(options, docker)
    candidate_ref = options.candidate_ref
    if stable_digest is not None and stable_digest == docker.image_digest(candidate_ref):
        step(f"{candidate_ref} is already {STABLE_TAG}; nothing to promote")
        return None
    outcome = run_gate(options, docker)
    gate = outcome.result
    gated = {
        "image": options.image,
        "baseline": ImageSide(ref=outcome.baseline_ref, digest=outcome.baseline_digest),
        "source": SourceState(revision=options.revision, dirty=source_dirty),
        "gate": _gate_summary(gate),
    }
    if gate.verdict != "pass":
        refusal = RefusedRecord(
            time=_now(),
            digest=outcome.candidate_digest,
            stable_digest=stable_digest,
            candidate=ImageSide(ref=candidate_ref, digest=outcome.candidate_digest),
            **gated,
        )
        try:
            step(f"refused: record {records.write(refusal)}")
        except (PromotionError, OSError) as exc:  # the verdict stands; keep the record visible
            print(refusal.to_json(), end="", file=sys.stderr)
            step(f"warning: the refusal record could not be written ({exc}); it is printed above")
        raise GateRefused(gate.verdict, gate.reasons, gate.exit_code)

    # The tag must still name what was gated (a rebuild in between would move it).
    candidate_digest = outcome.candidate_digest
    if docker.image_digest(candidate_ref) != candidate_digest:
        raise PromotionError(f"{candidate_ref} moved while the gate ran; promote again")
    if options.push:
        docker.run("push", candidate_ref, capture=False)
    step(f"gate passed: tagging {candidate_digest} as {options.image}:{STABLE_TAG}")
    repo_digests = _tag_stable(docker, candidate_digest, options.image, options.push)
    record = PromoteRecord(
        time=_now(),
        digest=candidate_digest,
        previous_digest=stable_digest,
        pushed=options.push,
        candidate=PromotedCandidate(
            ref=candidate_ref, digest=candidate_digest, repo_digests=repo_digests
        ),
        **gated,
    )
    return _write_record_or_dump(records, record)


def _write_record_or_dump(records: RecordStore, record: PromotionRecord) -> Path:
    """The tag already moved, so a record that cannot be written is printed whole, not lost."""
    try:
        return records.write(record)
    except (PromotionError, OSError) as exc:
        print(record.to_json(), end="", file=sys.stderr)
        raise PromotionError(
            f"{STABLE_TAG} was moved but the record could not be written ({exc}); "
            "the record is printed above: save it under promotions/ by hand"
        ) from exc


def rollback(
    records_dir: Path, image: str, docker: Docker, push: bool = False, reason: str = ""
) -> Path:
    """Point ``stable`` at the digest that was stable before the current one; record it."""
    records = RecordStore(records_dir)
    history = records.stable_history()
    if len(history) < 2:
        raise PromotionError(
            f"no earlier promoted digest to roll back to ({len(history)} in the history of "
            f"{records_dir})"
        )
    current, previous = history[-1], history[-2]
    stable_ref = f"{image}:{STABLE_TAG}"
    tagged = docker.run("image", "inspect", "--format", "{{.Id}}", stable_ref, check=False)
    if tagged.returncode == 0 and tagged.stdout.strip() != current:
        step(f"warning: {stable_ref} is {tagged.stdout.strip()}, the records say {current}")
    docker.image_digest(previous)  # the image must still exist locally
    step(f"rolling {stable_ref} back from {current} to {previous}")
    repo_digests = _tag_stable(docker, previous, image, push)
    record = RollbackRecord(
        time=_now(),
        image=image,
        digest=previous,
        from_digest=current,
        pushed=push,
        repo_digests=repo_digests,
        reason=reason,
    )
    return _write_record_or_dump(records, record)
