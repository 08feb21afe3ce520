"""Build a run's Report from the store (the single source of every rendering)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kdtree_parity.buckets import bucket_of, prompt_tokens
from kdtree_parity.compare import PairComparison
from kdtree_parity.gate import Summary, decode_rate, summarize
from kdtree_parity.policy import Policy, PolicyError, parse_policy
from kdtree_parity.report.context import context_model
from kdtree_parity.report.schema import (
    ComparisonModel,
    CorpusModel,
    ExcessModel,
    IdentityChangeModel,
    PairSummaryModel,
    PolicyModel,
    PromptModel,
    ReasonModel,
    Report,
    RoleSpeedModel,
    RunModel,
    SideModel,
    SummaryModel,
    TargetModel,
    TopLogprobModel,
    UndecidablePromptModel,
    VerdictModel,
)
from kdtree_parity.results import ALL_ROLES, PromptResult
from kdtree_parity.store import RunRecord, Store
from kdtree_parity.verdict import Judgement, judge

PROMPT_CHARS = 4000


@dataclass(frozen=True)
class RunEnding:
    """The final status a run is about to be stored with: its reports are written first."""

    status: str
    verdict: dict[str, Any] | None
    error: str | None


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


def _comparison(c: PairComparison | None) -> ComparisonModel | None:
    return None if c is None else ComparisonModel.model_validate(c, from_attributes=True)


def _prompt(result: PromptResult) -> PromptModel:
    c = result.candidate
    if result.has_error or c is None:
        status = "error"
    else:
        status = "exact" if c.exact else c.divergence_class or "hard"
    at = c.first_divergence if c is not None else None
    sides = []
    for role in (r for r in ALL_ROLES if r in result.outcomes):
        outcome = result.outcomes[role]
        g = outcome.generation
        top = None
        if (
            g is not None
            and at is not None
            and role in ("baseline", "candidate")
            and at < len(g.top_logprobs)
        ):
            entries = g.top_logprobs[at]
            top = (
                None
                if entries is None
                else [
                    TopLogprobModel(token_id=t.token_id, logprob=_finite(t.logprob), text=t.text)
                    for t in entries
                ]
            )
        sides.append(
            SideModel(
                role=role,
                output_ids=list(g.output_ids) if g else [],
                token_texts=list(g.token_texts) if g else [],
                token_logprobs=[_finite(x) for x in g.token_logprobs] if g else [],
                finish_reason=g.finish_reason if g else None,
                text=g.text if g else "",
                error=None
                if outcome.error is None
                else f"{outcome.error.kind}: {outcome.error.message}",
                attempts=outcome.attempts,
                elapsed_s=outcome.elapsed_s,
                decode_tps=decode_rate(outcome),
                ttft_s=g.timing.ttft_s if g is not None and g.timing is not None else None,
                prompt_tokens=g.prompt_tokens if g is not None else None,
                spec_verify_ct=g.spec_verify_ct if g is not None else None,
                accept_length=g.accept_length if g is not None else None,
                top_at_divergence=top,
            )
        )
    return PromptModel(
        id=result.entry.id,
        bucket=bucket_of(prompt_tokens(result)),
        line=result.entry.line,
        tags=list(result.entry.tags),
        prompt=result.entry.prompt_preview[:PROMPT_CHARS],
        status=status,
        candidate=_comparison(c),
        aa=_comparison(result.aa),
        floor=_comparison(result.floor),
        sides=sides,
    )


def build_report(store: Store, run_id: str, ending: RunEnding | None = None) -> Report:
    """The report of ``run_id`` in whatever state it is; an unfinished run's verdict is error.

    With ``ending``, the report of the run as it is about to be finished with that status.
    """
    record, end = _record_as_of(store, run_id, ending)
    settings, refused = _stored_policy(record)
    results = store.results(run_id)
    summary = summarize(results, record.prompts_total)
    judgement = None
    if settings is not None:
        # The error's first line: a stored traceback (the database stayed locked, a crash)
        # belongs to run.error, not to a reason of the verdict.
        why = (record.error or "").strip().splitlines()[:1] or [_no_end(record.status)]
        unfinished = None if record.verdict is not None else f"{record.status}: {why[0]}"
        judgement = judge(results, record.prompts_total, settings.gate, aborted_because=unfinished)
    return Report(
        generated_at=_iso(time.time()),
        run=RunModel(
            id=record.id,
            status=record.status,
            pair=record.pair,
            created_at=_iso(record.created_at),
            finished_at=_iso(end),
            duration_s=None if end is None else round(end - record.created_at, 3),
            error=record.error,
        ),
        verdict=_verdict_model(record, refused, judgement),
        targets=[
            TargetModel(role=role, url=url, identity=identity)
            for role, (url, identity) in sorted(
                record.targets.items(), key=lambda kv: ALL_ROLES.index(kv[0])
            )
        ],
        corpus=CorpusModel(
            source=record.corpus_source, sha256=record.corpus_sha256, prompts=record.prompts_total
        ),
        policy=PolicyModel(
            source=record.policy_source,
            sha256=record.policy_sha256,
            text=record.policy_text,
            settings=settings,
            refused=refused,
        ),
        summary=_summary_model(summary),
        prompts=[_prompt(r) for r in results],
        identity_changes=[
            IdentityChangeModel(
                role=c["role"], at=_iso(c["at"]), differences=c["differences"], before=c["before"]
            )
            for c in record.identity_changes
        ],
        context=None
        if judgement is None or settings is None
        else context_model(judgement, settings.gate),
    )


def _record_as_of(
    store: Store, run_id: str, ending: RunEnding | None
) -> tuple[RunRecord, float | None]:
    """The stored run and when it ended; with ``ending``, as it is about to end now with it."""
    record = store.get_run(run_id)
    if ending is None:
        return record, record.finished_at
    end = time.time()
    record = replace(
        record, status=ending.status, verdict=ending.verdict, error=ending.error, finished_at=end
    )
    return record, end


def _stored_policy(record: RunRecord) -> tuple[Policy | None, str | None]:
    """The run's stored policy, or why it is refused today (it was stored before a rule that
    refuses it existed)."""
    try:
        return parse_policy(record.policy_text, source=record.policy_source).policy, None
    except PolicyError as exc:
        return None, str(exc)


def _verdict_model(
    record: RunRecord, refused: str | None, judgement: Judgement | None
) -> VerdictModel:
    """The stored verdict; else the stored policy's refusal, or the verdict judged now."""
    if record.verdict is not None:
        return VerdictModel.model_validate(record.verdict)
    if judgement is None:
        return VerdictModel(
            status="error",
            reasons=[ReasonModel(rule="policy", outcome="undecided", message=str(refused))],
        )
    v = judgement.verdict
    return VerdictModel(
        status=v.status,
        reasons=[ReasonModel.model_validate(r, from_attributes=True) for r in v.reasons],
    )


def _summary_model(summary: Summary) -> SummaryModel:
    return SummaryModel(
        prompts_total=summary.prompts_total,
        prompts_done=summary.prompts_done,
        prompts_compared=summary.prompts_compared,
        errors=summary.errors,
        candidate=PairSummaryModel.model_validate(summary.candidate, from_attributes=True),
        aa=PairSummaryModel.model_validate(summary.aa, from_attributes=True),
        excess=ExcessModel(
            divergence_rate=summary.excess_divergence_rate,
            hard=summary.excess_hard,
            drift_p99=summary.excess_drift_p99,
            finish_mismatch=summary.excess_finish_mismatch,
        ),
        undecidable_prompts=[
            UndecidablePromptModel(id=pid, why=why) for pid, why in summary.undecidable
        ],
        floor=None
        if summary.floor is None
        else PairSummaryModel.model_validate(summary.floor, from_attributes=True),
        speed=[
            RoleSpeedModel(
                role=role,
                requests=len(rates),
                median_decode_tps=summary.speed.median_decode(role),
                median_ttft_s=summary.speed.median_ttft(role),
                median_reported_decode_tps=summary.speed.median_reported(role),
            )
            for role, rates in sorted(
                summary.speed.decode_tps.items(), key=lambda kv: ALL_ROLES.index(kv[0])
            )
        ],
    )


def _no_end(status: str) -> str:
    """Why a run with no recorded error has no verdict either."""
    if status == "running":
        # A run whose process stopped before it could record its end (a full disk, a kill)
        # looks the same as one still going: say both.
        return (
            "no end recorded: the run is still going, or its process stopped before it could "
            "record one (a full disk, a kill; its lease then expires and --resume finishes it)"
        )
    return f"the run is {status}"
