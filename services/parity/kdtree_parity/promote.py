"""Promote an inference image to ``stable`` only when the parity gate passes; roll back by record.

``python -m kdtree_parity.promote promote`` builds the candidate image (tagged by git revision),
starts the compose pair (baseline ``KDTREE_VERIFY=off``, candidate ``on``), waits for both to be
healthy, runs the parity sidecar once, and reads its exit code and ``report.json``. Only a pass
whose report agrees tags the candidate's digest as ``stable`` (and pushes when asked) and writes a
promotion record. A fail or an error verdict tags nothing, writes a ``refused`` record and exits
non-zero with the reasons. ``--gate-profile demo`` runs the same path with the CPU reference
engine (compose's demo services) standing in for the inference image, which is how the path is
exercised on a machine without a GPU.

``python -m kdtree_parity.promote rollback`` points ``stable`` at the digest that was stable before
the current one, as the records tell it, and records that too.

Records (``promotions/NNNN-<action>-<digest12>.json``) are the history: the current stable digest
is the top of a stack that ``promote`` pushes and ``rollback`` pops (``refused`` leaves it alone).
A record appears whole under its name or not at all, and is never rewritten. Only the standard
library is used here, and every Docker action goes through the ``docker`` executable on PATH, so
the flow runs from the slim parity image as well as from the dev venv, against a real daemon or a
stand-in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# timezone.utc, not datetime.UTC: this module also runs on a GPU host's system Python 3.10.
UTC = timezone.utc  # noqa: UP017
RECORD_SCHEMA = "kdtree.promotion/v1"
STABLE_TAG = "stable"
# kdtree-parity's exit codes (its CLI contract): 0 pass, 1 fail, 2 could not decide.
GATE_EXIT_VERDICTS = {0: "pass", 1: "fail", 2: "error"}
# promote/rollback's own exit codes.
EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 2
_RECORD_NAME = re.compile(r"^(\d{4,})-(promote|rollback|refused)-[0-9a-f]{12}\.json$")


@dataclass(frozen=True)
class GateProfile:
    """Which compose services play baseline, candidate and sidecar, and the variables that pick
    their images. ``demo`` runs the same promotion with the CPU reference engine standing in for
    the inference image, so the whole path runs on a machine without a GPU."""

    servers: tuple[str, str]
    sidecar: str
    baseline_var: str
    candidate_var: str
    build_target: str
    default_image: str
    # The optional A/A' floor (``--floor``): its compose service and profile, and the variable
    # naming its image (the baseline's: the same model computed an equivalent way).
    floor_server: str = ""
    floor_profile: str = ""
    floor_var: str = ""


GATE_PROFILES = {
    "gate": GateProfile(
        servers=("inference-baseline", "inference-candidate"),
        sidecar="parity",
        baseline_var="KDTREE_BASELINE_IMAGE",
        candidate_var="KDTREE_CANDIDATE_IMAGE",
        build_target="inference",
        default_image="kdtree/inference",
        floor_server="inference-floor",
        floor_profile="floor",
        floor_var="KDTREE_FLOOR_IMAGE",
    ),
    "demo": GateProfile(
        servers=("demo-baseline", "demo-candidate"),
        sidecar="demo-parity",
        baseline_var="KDTREE_DEMO_BASELINE_IMAGE",
        candidate_var="KDTREE_DEMO_CANDIDATE_IMAGE",
        build_target="demo",
        default_image="kdtree/demo",
        floor_server="demo-floor",
        floor_profile="demo-floor",
        floor_var="KDTREE_DEMO_BASELINE_IMAGE",
    ),
}


class PromotionError(Exception):
    """Something went wrong that is not the gate's verdict: nothing was tagged."""


class GateRefused(Exception):
    """The gate ran and said fail (or could not decide): nothing was tagged."""

    def __init__(self, verdict: str, reasons: Sequence[str], exit_code: int) -> None:
        super().__init__(f"parity gate verdict: {verdict}")
        self.verdict = verdict
        self.reasons = list(reasons)
        self.exit_code = exit_code


def step(message: str) -> None:
    """Progress on stderr, so stdout stays the one-line result a script can read."""
    print(f"==> {message}", file=sys.stderr, flush=True)


@dataclass
class Docker:
    """The ``docker`` executable; every call is logged and a failure raises with its stderr."""

    executable: str = "docker"
    env: Mapping[str, str] = field(default_factory=dict)

    def run(
        self, *args: str, check: bool = True, capture: bool = True
    ) -> subprocess.CompletedProcess:
        command = [self.executable, *args]
        step("$ " + " ".join(command))
        try:
            result = subprocess.run(
                command,
                env={**os.environ, **self.env},
                text=True,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None,
                check=False,
            )
        except FileNotFoundError as exc:
            raise PromotionError(
                f"'{self.executable}' was not found on PATH: install Docker with the compose plugin"
            ) from exc
        if check and result.returncode != 0:
            detail = (result.stderr or result.stdout or "").strip()
            raise PromotionError(
                f"'{' '.join(command)}' exited {result.returncode}"
                + (f": {detail[-2000:]}" if detail else "")
            )
        return result

    def image_digest(self, ref: str) -> str:
        """The content-addressed image id (``sha256:...``) that ``ref`` names right now."""
        out = self.run("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", out):
            raise PromotionError(f"docker image inspect {ref} gave no sha256 image id: {out!r}")
        return out

    def repo_digests(self, ref: str) -> list[str]:
        out = self.run("image", "inspect", "--format", "{{json .RepoDigests}}", ref).stdout
        try:
            digests = json.loads(out or "null")
        except json.JSONDecodeError as exc:
            raise PromotionError(f"unreadable RepoDigests for {ref}: {out!r}") from exc
        return [str(d) for d in digests or []]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class RecordStore:
    """The promotions/ directory: numbered, append-only JSON records."""

    directory: Path

    def records(self) -> list[dict[str, Any]]:
        """All records in sequence order; a malformed one is an error, never silently skipped."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[int, dict[str, Any]]] = []
        for path in self.directory.iterdir():
            match = _RECORD_NAME.match(path.name)
            if not match:
                continue
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise PromotionError(f"promotion record {path} is unreadable: {exc}") from exc
            if record.get("schema") != RECORD_SCHEMA or "digest" not in record:
                raise PromotionError(f"promotion record {path} is not a {RECORD_SCHEMA} record")
            found.append((int(match.group(1)), record))
        found.sort(key=lambda item: item[0])
        sequences = [seq for seq, _ in found]
        if len(set(sequences)) != len(sequences):
            raise PromotionError(
                f"two promotion records share a sequence number in {self.directory}"
            )
        return [record for _, record in found]

    def stable_history(self) -> list[str]:
        """Digests that were stable, oldest first; the last one is stable now (a refused
        candidate never was)."""
        stack: list[str] = []
        for record in self.records():
            if record["action"] == "promote":
                stack.append(record["digest"])
            elif record["action"] == "rollback":
                if not stack or stack[-1] != record["from_digest"]:
                    raise PromotionError(
                        f"rollback record {record['sequence']} does not follow the history"
                    )
                stack.pop()
        return stack

    def write(self, record: dict[str, Any]) -> Path:
        """Add ``record`` under the next sequence number; an existing file is never replaced.

        The text goes to a hidden temporary file first, is flushed to disk, and is then linked
        under its final name, which fails if that name exists: a reader sees the whole record or
        none, even when the write is interrupted or the disk fills up.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = [self._sequence(p.name) for p in self.directory.iterdir()]
        sequence = max([s for s in existing if s is not None], default=0) + 1
        record = {"schema": RECORD_SCHEMA, "sequence": sequence, **record}
        name = f"{sequence:04d}-{record['action']}-{record['digest'].removeprefix('sha256:')[:12]}"
        path = self.directory / f"{name}.json"
        text = json.dumps(record, indent=2, sort_keys=True) + "\n"
        descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would hide it from others
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, path)  # exclusive: never overwrite
        except FileExistsError as exc:
            raise PromotionError(f"{path} already exists; records are never overwritten") from exc
        finally:
            os.unlink(temporary)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return path

    @staticmethod
    def _sequence(name: str) -> int | None:
        match = _RECORD_NAME.match(name)
        return int(match.group(1)) if match else None


# --------------------------------------------------------------------------- the gate's report


@dataclass(frozen=True)
class GateResult:
    exit_code: int
    verdict: str
    reasons: list[str]
    report_path: Path
    report_sha256: str
    corpus_sha256: str
    policy: Any
    run_id: str


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reason_text(reason: Any) -> str:
    if isinstance(reason, Mapping):
        parts = [str(reason.get(k)) for k in ("rule", "outcome") if reason.get(k)]
        message = reason.get("message", "")
        return f"[{' '.join(parts)}] {message}".strip() if parts else str(message)
    return str(reason)


def find_report(out_dir: Path) -> Path:
    """The sidecar writes ``OUT/<its run id>/report.json``; a gate's OUT is fresh, so one."""
    found = sorted(out_dir.glob("*/report.json"))
    if len(found) != 1:
        raise PromotionError(f"expected one report.json under {out_dir}, found {len(found)}")
    return found[0]


def read_gate_report(out_dir: Path, exit_code: int) -> GateResult:
    """Read the ``report.json`` the sidecar wrote and check it agrees with its exit code."""
    if exit_code not in GATE_EXIT_VERDICTS:
        raise PromotionError(
            f"the parity sidecar exited {exit_code}, which is not a verdict (0 pass, 1 fail, "
            "2 error): it crashed or was killed"
        )
    try:
        report_path = find_report(out_dir)
        report = json.loads(report_path.read_text())
        verdict = report["verdict"]["status"]
        reasons = report["verdict"]["reasons"]
        corpus_sha256 = report["corpus"]["sha256"]
        policy = report["policy"]
        run_id = report["run"]["id"]
    except PromotionError as exc:
        raise PromotionError(f"the parity sidecar exited {exit_code} but: {exc}") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PromotionError(
            f"the report under {out_dir} is unreadable or incomplete: {exc!r}"
        ) from exc
    if verdict != GATE_EXIT_VERDICTS[exit_code]:
        raise PromotionError(
            f"the sidecar exited {exit_code} ({GATE_EXIT_VERDICTS[exit_code]}) but its report "
            f"says {verdict!r}: refusing to trust either"
        )
    return GateResult(
        exit_code=exit_code,
        verdict=verdict,
        reasons=[_reason_text(r) for r in reasons],
        report_path=report_path,
        report_sha256=sha256_file(report_path),
        corpus_sha256=str(corpus_sha256),
        policy=policy,
        run_id=run_id,
    )


# --------------------------------------------------------------------------- promote


@dataclass(frozen=True)
class PromoteSettings:
    """Everything ``promote`` needs; the CLI fills it from flags and KDTREE_* variables."""

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
    cuda_archs: str = "80;90;120"
    health_timeout_s: int = 1800
    keep_up: bool = False
    gate_profile: str = "gate"
    floor: bool = False  # also run the A/A' floor server and judge against it

    @property
    def profile(self) -> GateProfile:
        return GATE_PROFILES[self.gate_profile]


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


def registry_host(image: str) -> str:
    """The registry an image reference names (Docker's rule: a first component with a dot, a
    colon or ``localhost`` is a host; anything else lives on Docker Hub)."""
    first, sep, _ = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "registry-1.docker.io"


def check_registry(image: str, timeout_s: float = 10.0) -> None:
    """Fail before the gate, and so before any tag or push, when the registry does not answer.

    Any HTTP answer from ``/v2/`` counts as up (401 asks for the login ``docker push`` brings);
    HTTPS is tried first, then plain HTTP, which Docker uses for loopback registries.
    """
    host = registry_host(image)
    errors = []
    for scheme in ("https", "http"):
        try:
            with urllib.request.urlopen(f"{scheme}://{host}/v2/", timeout=timeout_s):
                return
        except urllib.error.HTTPError:
            return
        except (urllib.error.URLError, OSError) as exc:
            errors.append(f"{scheme}: {getattr(exc, 'reason', exc)}")
    raise PromotionError(
        f"the registry {host} of {image} does not answer ({'; '.join(errors)}): "
        "nothing was gated, tagged or pushed"
    )


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


@dataclass(frozen=True)
class GateOutcome:
    """What was gated (refs and the digests they named) and what the sidecar said."""

    candidate_ref: str
    candidate_digest: str
    baseline_ref: str
    baseline_digest: str
    out_dir: Path
    result: GateResult


def build_images(settings: PromoteSettings, docker: Docker) -> None:
    candidate_ref = f"{settings.image}:{settings.revision}"
    parity_ref = f"{settings.parity_image}:{settings.revision}"
    target = settings.profile.build_target
    step(
        f"building {candidate_ref} (target {target}, archs {settings.cuda_archs}) and {parity_ref}"
    )
    common = ["build", "--build-arg", f"VCS_REF={settings.revision}"]
    docker.run(
        *common,
        "--build-arg",
        f"KDTREE_CUDA_ARCHS={settings.cuda_archs}",
        "--target",
        target,
        "--tag",
        candidate_ref,
        str(settings.context_dir),
        capture=False,
    )
    docker.run(
        *common, "--target", "parity", "--tag", parity_ref, str(settings.context_dir), capture=False
    )


def run_gate(settings: PromoteSettings, docker: Docker, run_id: str | None = None) -> GateOutcome:
    """Start the pair, wait for health, run the sidecar once, read its verdict. Tags nothing."""
    candidate_ref = f"{settings.image}:{settings.revision}"
    parity_ref = f"{settings.parity_image}:{settings.revision}"
    candidate_digest = docker.image_digest(candidate_ref)
    # The baseline is the candidate image with the kernel off (stock SGLang) unless a different
    # image is named: the gate then isolates exactly what KDTREE_VERIFY=on changes.
    baseline_ref = settings.baseline_image or candidate_ref
    baseline_digest = docker.image_digest(baseline_ref)
    docker.image_digest(parity_ref)  # fail now, not after the servers took minutes to load

    run_id = run_id or f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{settings.revision}"
    reports_dir = settings.reports_dir.resolve()
    out_dir = reports_dir / run_id
    if out_dir.exists():
        raise PromotionError(
            f"{out_dir} already exists: a gate run never reuses a report directory"
        )
    profile = settings.profile
    compose_env = {
        profile.candidate_var: candidate_ref,
        profile.baseline_var: baseline_ref,
        "KDTREE_PARITY_IMAGE": parity_ref,
        "KDTREE_RUN_ID": run_id,
        "KDTREE_REPORTS_DIR": str(reports_dir),
        # The sidecar writes its report into our bind-mounted directory as us.
        "KDTREE_PARITY_USER": f"{os.getuid()}:{os.getgid()}",
    }
    servers = list(profile.servers)
    compose_args = ["compose", "--file", str(settings.compose_file), "--profile"]
    compose_args.append(settings.gate_profile)
    if settings.floor:
        servers.append(profile.floor_server)
        compose_args += ["--profile", profile.floor_profile]
        compose_env[profile.floor_var] = baseline_ref
        compose_env["KDTREE_GATE_FLOOR_URL"] = f"http://{profile.floor_server}:30000"
    compose = Docker(docker.executable, {**docker.env, **compose_env})
    reports_dir.mkdir(parents=True, exist_ok=True)
    try:
        step(f"starting {' and '.join(servers)}; waiting up to {settings.health_timeout_s}s")
        compose.run(
            *compose_args,
            "up",
            "--detach",
            "--wait",
            "--wait-timeout",
            str(settings.health_timeout_s),
            *servers,
            capture=False,
        )
        step(f"running the parity gate (run {run_id}, report in {out_dir})")
        gate_exit = compose.run(
            *compose_args, "run", "--rm", profile.sidecar, check=False, capture=False
        ).returncode
    finally:
        if not settings.keep_up:
            compose.run(*compose_args, "down", check=False, capture=False)
    return GateOutcome(
        candidate_ref=candidate_ref,
        candidate_digest=candidate_digest,
        baseline_ref=baseline_ref,
        baseline_digest=baseline_digest,
        out_dir=out_dir,
        result=read_gate_report(out_dir, gate_exit),
    )


def promote(settings: PromoteSettings, docker: Docker, source_dirty: bool = False) -> Path | None:
    """Run the gate and, on a pass, tag ``stable`` and write the record (its path is returned).

    Returns None when the candidate is already stable. Raises GateRefused on fail/error verdicts
    (after writing a ``refused`` record) and PromotionError on everything else; in both cases
    nothing was tagged or pushed.
    """
    records = RecordStore(settings.records_dir)
    history = records.stable_history()  # a corrupt history stops us before any work
    if settings.push:
        check_registry(settings.image)
    if settings.build:
        build_images(settings, docker)
    candidate_ref = f"{settings.image}:{settings.revision}"
    if history and history[-1] == docker.image_digest(candidate_ref):
        step(f"{candidate_ref} is already {STABLE_TAG}; nothing to promote")
        return None
    outcome = run_gate(settings, docker)
    gate = outcome.result
    gate_record = {
        "run_id": gate.run_id,
        "verdict": gate.verdict,
        "exit_code": gate.exit_code,
        "reasons": gate.reasons,
        "report": str(gate.report_path),
        "report_sha256": gate.report_sha256,
        "corpus_sha256": gate.corpus_sha256,
        "policy": gate.policy,
    }
    gated = {
        "image": settings.image,
        "candidate": {"ref": candidate_ref, "digest": outcome.candidate_digest},
        "baseline": {"ref": outcome.baseline_ref, "digest": outcome.baseline_digest},
        "source": {"revision": settings.revision, "dirty": source_dirty},
        "gate": gate_record,
    }
    if gate.verdict != "pass":
        refusal = {
            "action": "refused",
            "time": _now(),
            "digest": outcome.candidate_digest,
            "stable_digest": history[-1] if history else None,
            **gated,
        }
        try:
            step(f"refused: record {records.write(refusal)}")
        except (PromotionError, OSError) as exc:  # the verdict stands; keep the record visible
            print(json.dumps(refusal, indent=2, sort_keys=True), file=sys.stderr)
            step(f"warning: the refusal record could not be written ({exc}); it is printed above")
        raise GateRefused(gate.verdict, gate.reasons, gate.exit_code)

    # The tag must still name what was gated (a rebuild in between would move it).
    candidate_digest = outcome.candidate_digest
    if docker.image_digest(candidate_ref) != candidate_digest:
        raise PromotionError(f"{candidate_ref} moved while the gate ran; promote again")
    if settings.push:
        docker.run("push", candidate_ref, capture=False)
    step(f"gate passed: tagging {candidate_digest} as {settings.image}:{STABLE_TAG}")
    repo_digests = _tag_stable(docker, candidate_digest, settings.image, settings.push)
    gated["candidate"]["repo_digests"] = repo_digests
    record = {
        "action": "promote",
        "time": _now(),
        "tag": STABLE_TAG,
        "digest": candidate_digest,
        "previous_digest": history[-1] if history else None,
        "pushed": settings.push,
        **gated,
    }
    return _write_record_or_dump(records, record)


def _write_record_or_dump(records: RecordStore, record: dict[str, Any]) -> Path:
    """The tag already moved, so a record that cannot be written is printed whole, not lost."""
    try:
        return records.write(record)
    except (PromotionError, OSError) as exc:
        print(json.dumps(record, indent=2, sort_keys=True), file=sys.stderr)
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
    record = {
        "action": "rollback",
        "time": _now(),
        "image": image,
        "tag": STABLE_TAG,
        "digest": previous,
        "from_digest": current,
        "pushed": push,
        "repo_digests": repo_digests,
        "reason": reason,
    }
    return _write_record_or_dump(records, record)


# --------------------------------------------------------------------------- CLI


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kdtree_parity.promote",
        description="Gate an inference image with the parity sidecar and promote it to stable.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "promote": "build, gate, and on a pass tag the digest stable and write a record",
        "gate": "build and gate only (pull requests): exit 0 pass, 1 fail, 2 error; tags nothing",
        "rollback": "point stable back at the previously promoted digest and record it",
    }
    for name, help_text in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument(
            "--gate-profile",
            choices=sorted(GATE_PROFILES),
            default=os.environ.get("KDTREE_GATE_PROFILE", "gate"),
            help="compose services that gate: 'gate' (the SGLang pair on GPUs) or 'demo' (the "
            "CPU reference engine standing in for the inference image) [KDTREE_GATE_PROFILE]",
        )
        p.add_argument(
            "--image",
            default=os.environ.get("KDTREE_IMAGE"),
            help="image repository to promote (default: kdtree/inference, or kdtree/demo with "
            "--gate-profile demo) [KDTREE_IMAGE]",
        )
        if name == "gate":
            p.add_argument("--run-id", help="report directory name under --reports")
        else:
            p.add_argument(
                "--records",
                type=Path,
                default=Path(os.environ.get("KDTREE_PROMOTIONS_DIR", "promotions")),
                help="promotion records directory [KDTREE_PROMOTIONS_DIR]",
            )
            p.add_argument(
                "--push",
                action="store_true",
                default=_env_flag("KDTREE_PUSH"),
                help="also push the tags to the image's registry [KDTREE_PUSH=1]",
            )
        if name == "rollback":
            p.add_argument("--reason", default="", help="why (kept in the record)")
            continue
        p.add_argument(
            "--parity-image",
            default=os.environ.get("KDTREE_PARITY_IMAGE_REPO", "kdtree/parity"),
            help="parity sidecar image repository [KDTREE_PARITY_IMAGE_REPO]",
        )
        p.add_argument("--revision", help="candidate tag (default: the git revision)")
        p.add_argument(
            "--baseline-image",
            default=os.environ.get("KDTREE_GATE_BASELINE_IMAGE"),
            help="baseline image (default: the candidate itself with KDTREE_VERIFY=off) "
            "[KDTREE_GATE_BASELINE_IMAGE]",
        )
        p.add_argument("--compose-file", type=Path, default=Path("compose.yaml"))
        p.add_argument("--context", type=Path, default=Path("."), help="docker build context")
        p.add_argument(
            "--reports",
            type=Path,
            default=Path(os.environ.get("KDTREE_REPORTS_DIR", "runs/reports")),
            help="where gate reports go [KDTREE_REPORTS_DIR]",
        )
        p.add_argument(
            "--no-build",
            dest="build",
            action="store_false",
            help="gate images already built and tagged with --revision",
        )
        p.add_argument(
            "--cuda-archs",
            default=os.environ.get("KDTREE_CUDA_ARCHS", "80;90;120"),
            help="GPU architectures the kernel is built for [KDTREE_CUDA_ARCHS]",
        )
        p.add_argument(
            "--health-timeout",
            type=int,
            default=int(os.environ.get("KDTREE_HEALTH_TIMEOUT", "1800")),
            help="seconds to wait for both servers' /health [KDTREE_HEALTH_TIMEOUT]",
        )
        p.add_argument("--keep-up", action="store_true", help="leave the services running")
        p.add_argument(
            "--floor",
            action="store_true",
            default=_env_flag("KDTREE_GATE_FLOOR"),
            help="also start the A/A' floor server (the baseline with another KV split count) "
            "and judge the candidate by its excess over it [KDTREE_GATE_FLOOR=1]",
        )
        p.add_argument(
            "--allow-dirty",
            action="store_true",
            help="build even though tracked files have uncommitted changes",
        )
    return parser


def _settings(args: argparse.Namespace) -> tuple[PromoteSettings, bool]:
    revision, dirty = (args.revision, False) if args.revision else git_revision(args.context)
    if dirty and args.build:
        if not args.allow_dirty:
            raise PromotionError(
                f"the work tree has uncommitted changes, so the image would not be what {revision} "
                "names: commit them, or pass --allow-dirty (the record then says dirty: true)"
            )
        step(f"warning: building with uncommitted changes; {revision} does not name them")
    settings = PromoteSettings(
        image=args.image,
        parity_image=args.parity_image,
        revision=revision,
        compose_file=args.compose_file,
        records_dir=getattr(args, "records", Path("promotions")),
        reports_dir=args.reports,
        context_dir=args.context,
        baseline_image=args.baseline_image,
        build=args.build,
        push=getattr(args, "push", False),
        cuda_archs=args.cuda_archs,
        health_timeout_s=args.health_timeout,
        keep_up=args.keep_up,
        gate_profile=args.gate_profile,
        floor=args.floor,
    )
    return settings, dirty


def _print_refusal(verdict: str, reasons: Sequence[str]) -> None:
    print(f"NOT PROMOTED: the parity gate said {verdict}", file=sys.stderr)
    for reason in reasons:
        print(f"  - {reason}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gate_profile not in GATE_PROFILES:  # an environment default escapes argparse's check
        parser.error(
            f"KDTREE_GATE_PROFILE={args.gate_profile!r}: choose one of {sorted(GATE_PROFILES)}"
        )
    args.image = args.image or GATE_PROFILES[args.gate_profile].default_image
    docker = Docker()
    try:
        if args.command == "rollback":
            path = rollback(args.records, args.image, docker, push=args.push, reason=args.reason)
            print(f"rolled back: record {path}")
            return EXIT_OK
        settings, dirty = _settings(args)
        if args.command == "gate":
            if settings.build:
                build_images(settings, docker)
            outcome = run_gate(settings, docker, run_id=args.run_id)
            result = outcome.result
            print(f"gate {result.verdict}: report {result.report_path.parent}")
            for reason in result.reasons:
                print(f"  - {reason}")
            return result.exit_code
        path = promote(settings, docker, source_dirty=dirty)
    except GateRefused as refused:
        _print_refusal(refused.verdict, refused.reasons)
        return EXIT_REFUSED if refused.verdict == "fail" else EXIT_ERROR
    except PromotionError as exc:
        print(f"{'NOT PROMOTED' if args.command == 'promote' else 'error'}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print("already stable: nothing promoted" if path is None else f"promoted: record {path}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
