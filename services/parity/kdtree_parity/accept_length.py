"""Accept length: tokens committed per speculative verify step, by target.

SGLang reports a finished request's verify forwards as ``meta_info.spec_verify_ct``; with its
``completion_tokens`` that gives the accept length (``Generation.accept_length``). A verify bug
that still produces the right tokens shows up here first, as fewer draft tokens accepted per
step. The candidate is compared with the baseline over the prompts where both report it: the
mean of the candidate's accept lengths over the baseline's, refused when it is more than
``max_accept_length_drop`` below 1. Never with an A/A' floor: a floor that drafts another shape
(EAGLE's chain under a tree, the recommended one) accepts another number of tokens per step by
design, so its accept length is no reference for the candidate's draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from kdtree_parity.gate import Reason
from kdtree_parity.policy import GateSettings
from kdtree_parity.results import ALL_ROLES, PromptResult

RULE = "accept_length"


def _accept(result: PromptResult, role: str) -> float | None:
    outcome = result.outcomes.get(role)  # type: ignore[call-overload]
    generation = outcome.generation if outcome is not None else None
    return generation.accept_length if generation is not None else None


@dataclass(frozen=True)
class AcceptLengths:
    """Per role, the accept lengths of its answers (answers without one left out)."""

    by_role: dict[str, tuple[float, ...]]

    @classmethod
    def of(cls, results: Sequence[PromptResult]) -> AcceptLengths:
        by_role: dict[str, list[float]] = {}
        for result in results:
            for role in ALL_ROLES:
                if (value := _accept(result, role)) is not None:
                    by_role.setdefault(role, []).append(value)
        return cls({role: tuple(values) for role, values in by_role.items()})

    def mean(self, role: str) -> float | None:
        values = self.by_role.get(role, ())
        return fmean(values) if values else None


def accept_length_reason(
    results: Sequence[PromptResult], gate: GateSettings, where: str = ""
) -> Reason:
    """The accept-length rule over ``results`` (answers with errors left out)."""
    reference = "baseline"  # the candidate's own draft and configuration, verified by off
    pairs = [
        (c, f)
        for r in results
        if not r.has_error
        and (f := _accept(r, reference)) is not None
        and (c := _accept(r, "candidate")) is not None
    ]
    measured_floor = sum(
        1 for r in results if not r.has_error and _accept(r, reference) is not None
    )
    prefix = f"{where}: " if where else ""
    if gate.max_accept_length_drop is None:
        return Reason(RULE, "pass", prefix + "not judged (max_accept_length_drop: null)")
    if not pairs:
        if measured_floor:
            return Reason(
                RULE,
                "fail",
                f"{prefix}the {reference} reports an accept length (spec_verify_ct) on "
                f"{measured_floor} prompt(s), the candidate on none of them",
            )
        return Reason(
            RULE,
            "pass",
            prefix + "not measured: no target reports spec_verify_ct (no speculative decoding)",
        )
    candidate = fmean(c for c, _ in pairs)
    floor = fmean(f for _, f in pairs)
    drop = 1 - candidate / floor if floor > 0 else 0.0
    return Reason(
        RULE,
        "fail" if drop > gate.max_accept_length_drop else "pass",
        f"{prefix}mean accept length {candidate:.3f} vs {reference} {floor:.3f} over "
        f"{len(pairs)} prompt(s), {drop:.1%} below (max {gate.max_accept_length_drop:.1%})",
    )
