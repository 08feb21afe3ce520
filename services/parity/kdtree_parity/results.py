"""Per-request outcomes and per-prompt results: what the replay produces and the store keeps."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kdtree_parity.compare import PairComparison, compare_generations, missing_logprobs
from kdtree_parity.corpus import CorpusEntry
from kdtree_parity.generation import Generation

# Every role a target plays in a run. "aa" is the A/A twin of the baseline: the replica when one
# is configured, otherwise the baseline itself replayed a second time. "floor" is the optional
# A/A' target: the baseline's model and weights computed an equivalent but not bit-identical way
# (another KV split count, batch composition or concurrency); when a run has one, the candidate
# is judged by its excess over the baseline-vs-A/A' noise floor instead of the exact twin's.
Role = Literal["baseline", "candidate", "aa", "floor"]
ROLES: tuple[Role, ...] = ("baseline", "candidate", "aa")
ALL_ROLES: tuple[Role, ...] = (*ROLES, "floor")

ErrorKind = Literal["connect", "timeout", "unavailable", "http", "malformed"]
# Kinds that say "the target could not be reached / did not answer", as opposed to "the target
# answered and the answer was an error". The first kind makes a run undecidable; the second is
# held against the target.
TRANSPORT_KINDS: frozenset[str] = frozenset({"connect", "timeout", "unavailable"})


@dataclass(frozen=True)
class RequestError:
    """Why a request to one target produced no generation (after all retries)."""

    kind: ErrorKind
    message: str
    status_code: int | None = None

    @property
    def transport(self) -> bool:
        return self.kind in TRANSPORT_KINDS

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "status_code": self.status_code}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestError:
        return cls(kind=data["kind"], message=data["message"], status_code=data.get("status_code"))


@dataclass(frozen=True)
class Outcome:
    """One request to one target: a generation or an error, and what it took."""

    generation: Generation | None
    error: RequestError | None
    attempts: int
    elapsed_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "generation": None if self.generation is None else self.generation.to_json(),
            "error": None if self.error is None else self.error.to_json(),
            "attempts": self.attempts,
            "elapsed_s": self.elapsed_s,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        return cls(
            generation=None
            if data["generation"] is None
            else Generation.from_json(data["generation"]),
            error=None if data["error"] is None else RequestError.from_json(data["error"]),
            attempts=data["attempts"],
            elapsed_s=data["elapsed_s"],
        )


@dataclass(frozen=True)
class PromptResult:
    """All targets' outcomes for one corpus entry and the two comparisons made from them."""

    entry: CorpusEntry
    outcomes: dict[Role, Outcome]
    candidate: PairComparison | None = None  # baseline vs candidate
    aa: PairComparison | None = None  # baseline vs its A/A twin
    floor: PairComparison | None = None  # baseline vs the A/A' target, when the run has one
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_error(self) -> bool:
        return any(o.error is not None for o in self.outcomes.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.entry.to_json(),
            "line": self.entry.line,
            "outcomes": {role: o.to_json() for role, o in self.outcomes.items()},
            "candidate": None if self.candidate is None else self.candidate.to_json(),
            "aa": None if self.aa is None else self.aa.to_json(),
            "floor": None if self.floor is None else self.floor.to_json(),
            "notes": list(self.notes),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PromptResult:
        """A stored result, judged by today's answer rules (``judge_outcomes``): a result stored
        before a rule existed (e.g. a NaN logprob) reads back as the error it is now."""
        stored = cls(
            entry=CorpusEntry.from_json(data["entry"], line=data.get("line", 0)),
            outcomes={role: Outcome.from_json(o) for role, o in data["outcomes"].items()},
            candidate=None
            if data["candidate"] is None
            else PairComparison.from_json(data["candidate"]),
            aa=None if data["aa"] is None else PairComparison.from_json(data["aa"]),
            floor=None if data.get("floor") is None else PairComparison.from_json(data["floor"]),
            notes=tuple(data.get("notes", ())),
        )
        judged = judge_outcomes(stored.outcomes)
        if judged == stored.outcomes:
            return stored
        ok = {role: o.generation is not None for role, o in judged.items()}
        return replace(
            stored,
            outcomes=judged,
            candidate=stored.candidate if ok["baseline"] and ok["candidate"] else None,
            aa=stored.aa if ok["baseline"] and ok["aa"] else None,
            floor=stored.floor if ok["baseline"] and ok.get("floor") else None,
        )


def _malformed(outcome: Outcome, problem: str) -> Outcome:
    error = RequestError("malformed", problem, status_code=200)
    return Outcome(None, error, outcome.attempts, outcome.elapsed_s)


def judge_outcomes(outcomes: dict[Role, Outcome]) -> dict[Role, Outcome]:
    """``outcomes`` with every answer that cannot be compared turned into a malformed error: a
    NaN or +inf logprob anywhere (any role), or a chosen-token logprob the baseline reports and
    the candidate or the A/A twin does not (``compare.missing_logprobs``)."""
    judged = dict(outcomes)
    for role, outcome in outcomes.items():
        if outcome.generation is not None and (problem := outcome.generation.logprob_problem()):
            judged[role] = _malformed(outcome, problem)
    reference = judged["baseline"].generation
    if reference is not None:
        for role in ("candidate", "aa", "floor"):
            if role not in judged:
                continue
            answer = judged[role].generation
            if answer is not None and (problem := missing_logprobs(reference, answer)):
                judged[role] = _malformed(judged[role], problem)
    return judged


def build_prompt_result(
    entry: CorpusEntry, outcomes: dict[Role, Outcome], epsilon: float
) -> PromptResult:
    """Judge one prompt's answers and compare baseline vs candidate, vs its twin and (when the
    run has an A/A' target) vs the A/A' target."""
    judged = judge_outcomes(outcomes)
    base, cand, twin = (judged[role].generation for role in ROLES)
    prime = judged["floor"].generation if "floor" in judged else None
    return PromptResult(
        entry=entry,
        outcomes=judged,
        candidate=None
        if base is None or cand is None
        else compare_generations(base, cand, epsilon),
        aa=None if base is None or twin is None else compare_generations(base, twin, epsilon),
        floor=None if base is None or prime is None else compare_generations(base, prime, epsilon),
    )
