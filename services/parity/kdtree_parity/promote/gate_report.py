"""The gate's verdict as promote reads it: the sidecar's exit status and its ``report.json``,
read through the report's own schema (``kdtree_parity.report.schema.Report``), which must agree."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.promote.errors import PromotionError
from kdtree_parity.report.schema import ReasonModel, Report

# kdtree-parity's exit statuses (its CLI contract) and the verdict each one stands for.
GATE_EXIT_VERDICTS = {ExitCode.PASSED: "pass", ExitCode.FAILED: "fail", ExitCode.ERROR: "error"}


@dataclass(frozen=True)
class GateResult:
    exit_code: ExitCode
    verdict: str
    reasons: list[str]
    report_path: Path
    report_sha256: str
    corpus_sha256: str
    policy: dict[str, Any]
    run_id: str


def reason_text(reason: ReasonModel) -> str:
    """``[rule outcome] message``: one line per reason for a terminal or a record."""
    parts = [part for part in (reason.rule, reason.outcome) if part]
    return f"[{' '.join(parts)}] {reason.message}".strip() if parts else reason.message


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
    expected = GATE_EXIT_VERDICTS[ExitCode(exit_code)]
    try:
        report_path = find_report(out_dir)
        text = report_path.read_bytes()  # hashed as read: the record names these bytes
        report = Report.model_validate_json(text)
    except PromotionError as exc:
        raise PromotionError(f"the parity sidecar exited {exit_code} but: {exc}") from exc
    except (OSError, ValidationError) as exc:
        raise PromotionError(
            f"the report under {out_dir} is unreadable or incomplete: {exc!r}"
        ) from exc
    if report.verdict.status != expected:
        raise PromotionError(
            f"the sidecar exited {exit_code} ({expected}) but its report "
            f"says {report.verdict.status!r}: refusing to trust either"
        )
    return GateResult(
        exit_code=ExitCode(exit_code),
        verdict=report.verdict.status,
        reasons=[reason_text(r) for r in report.verdict.reasons],
        report_path=report_path,
        report_sha256=hashlib.sha256(text).hexdigest(),
        corpus_sha256=report.corpus.sha256,
        policy=report.policy.model_dump(mode="json"),
        run_id=report.run.id,
    )
