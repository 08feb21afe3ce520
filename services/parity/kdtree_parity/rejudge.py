"""A stored run decided again under another policy, without replaying a prompt.

Each prompt's stored answers are compared again with the policy's ``compare`` settings and the
run is decided by its ``gate`` rules, exactly as ``execute_run`` does after a replay. This is how
a policy is calibrated on a model: replay once (GPU time), then try thresholds against what the
servers answered. The policy's ``replay`` settings cannot change stored answers; where they
differ from the run's, :func:`replay_differences` names them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kdtree_parity.gate import Verdict
from kdtree_parity.policy import LoadedPolicy, parse_policy
from kdtree_parity.reference_targets import stored_identity_problems
from kdtree_parity.results import build_prompt_result
from kdtree_parity.store import RunRecord, Store
from kdtree_parity.verdict import judge

# A run that ended any other way has no complete set of answers to decide on.
DECIDED = frozenset({"passed", "failed"})


class NotDecided(ValueError):
    """The stored run never reached a verdict, so it has nothing to decide again."""


@dataclass(frozen=True)
class Rejudged:
    record: RunRecord
    verdict: Verdict
    replay_differences: tuple[str, ...]


def replay_differences(record: RunRecord, policy: LoadedPolicy) -> tuple[str, ...]:
    """``replay`` settings of ``policy`` that differ from the ones the run replayed with."""
    stored = parse_policy(record.policy_text, record.policy_source).policy.replay
    wanted = policy.policy.replay
    return tuple(
        f"replay.{name}: run {getattr(stored, name)!r}, policy {getattr(wanted, name)!r}"
        for name in type(wanted).model_fields
        if getattr(stored, name) != getattr(wanted, name)
    )


def rejudge(store: Store, run_id: str, policy: LoadedPolicy) -> Rejudged:
    """Decide stored run ``run_id`` under ``policy``; KeyError if there is no such run."""
    record = store.get_run(run_id)
    if record.status not in DECIDED:
        raise NotDecided(f"run {run_id} ended {record.status}, without a verdict to revisit")
    epsilon = policy.policy.compare.near_tie_epsilon
    results = [
        dataclasses.replace(build_prompt_result(r.entry, r.outcomes, epsilon), notes=r.notes)
        for r in store.results(run_id)
    ]
    verdict = judge(
        results,
        record.prompts_total,
        policy.policy.gate,
        reference_problems=stored_identity_problems(record.targets),
    ).verdict
    return Rejudged(record, verdict, replay_differences(record, policy))
