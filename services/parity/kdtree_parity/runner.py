"""One parity run end to end: health, identity, replay, compare, persist, decide, report.

The same request for a prompt goes to the baseline, the candidate and the A/A twin (the replica,
or the baseline a second time), and to the A/A' target when the run has one. A prompt's result
is stored as soon as all its answers are in.
A target that fails ``max_consecutive_transport_errors`` requests in a row stops the run (queued
requests are dropped, not sent): the verdict is then ``error``, and ``resume`` finishes it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdtree_parity.client import (
    Notice,
    TargetClient,
    TargetRefused,
    TargetUnavailable,
    build_request,
    url_problem,
)
from kdtree_parity.corpus import Corpus, CorpusEntry, CorpusError, load_corpus, parse_corpus
from kdtree_parity.gate import Verdict
from kdtree_parity.policy import LoadedPolicy, Policy, PolicyError, load_policy, parse_policy
from kdtree_parity.reference_targets import distinct_url_problems, identity_problems
from kdtree_parity.report import RunEnding, write_report_files
from kdtree_parity.results import ALL_ROLES, Outcome, PromptResult, Role, build_prompt_result
from kdtree_parity.store import (
    VERDICT_TO_STATUS,
    AsyncStore,
    LeaseLost,
    RunRecord,
    RunStatus,
    Store,
)
from kdtree_parity.targets import RECORD_KEY, TargetRole, Targets
from kdtree_parity.verdict import judge

log = logging.getLogger("kdtree_parity.runner")
ProgressCallback = Callable[[int, int, PromptResult | None], None]


class IdentityChanged(RuntimeError):
    """A resumed run's target is not the build the run started with (or cannot be shown to be)."""


# An image label that names content (``sha256:<64 hex>``, optionally ``name@sha256:...``); a tag
# such as ``kdtree/inference:latest`` can move between the run and its resume.
_IMAGE_DIGEST = re.compile(r"(?:[^@\s]+@)?sha256:[0-9a-f]{64}")


def weights_digest(identity: dict[str, Any] | None) -> str | None:
    """The weights digest a target reports in /model_info (the reference engine does)."""
    info = (identity or {}).get("model_info")
    engine = info.get("kdtree_engine") if isinstance(info, dict) else None
    digest = engine.get("weights_sha256") if isinstance(engine, dict) else None
    return digest if isinstance(digest, str) and digest else None


def unverifiable(recorded: dict[str, Any] | None) -> str | None:
    """Why a resume cannot show that a target is the build a run started with, or None.

    /model_info pins a build only when it reports a weights digest (the reference engine);
    SGLang's /model_info names the model path and served name but not the weights or the code,
    so such a target is pinned only by an image digest recorded when the run started."""
    if weights_digest(recorded):
        return None
    image = (recorded or {}).get("image")
    if isinstance(image, str) and _IMAGE_DIGEST.fullmatch(image):
        return None
    return "its /model_info has no weights digest and the run recorded no image digest for it" + (
        f" (only {image!r}, which is not a digest)" if image else ""
    )


def identity_differences(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str]:
    """What differs between a target's recorded identity and ``current`` (both may hold 'image'
    and 'model_info'). An image label recorded with the run must be given again and match; a
    /model_info that was never recorded (the run never got that far) is not compared."""
    recorded = recorded or {}
    differences = []
    if "image" in recorded and "image" not in current:
        differences.append(f"image {recorded['image']!r} -> (not given on the resume)")
    elif "image" in current and recorded.get("image") != current["image"]:
        differences.append(f"image {recorded.get('image')!r} -> {current['image']!r}")
    if "model_info" in current and "model_info" in recorded:
        before, after = _flat(recorded["model_info"]), _flat(current["model_info"])
        for flat in (before, after):  # a restarted server is a new process of the same build
            flat.pop(SERVER_ID_KEY, None)
        differences += [
            f"/model_info {key}: {before.get(key, '(absent)')!r} -> {after.get(key, '(absent)')!r}"
            for key in sorted(set(before) | set(after))
            if before.get(key, _ABSENT) != after.get(key, _ABSENT)
        ]
    return differences


_ABSENT = object()
SERVER_ID_KEY = "kdtree_engine.server_id"


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}: differences are named down to the leaf."""
    if not isinstance(value, dict):
        return {prefix or "(value)": value}
    out: dict[str, Any] = {}
    for key, item in value.items():
        out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


@dataclass
class RunOutcome:
    run_id: str
    status: str
    verdict: Verdict | None
    error: str | None = None


def corpus_too_small(corpus: Corpus, policy: LoadedPolicy) -> str | None:
    """Why ``corpus`` cannot satisfy ``policy``'s min_prompts (such a run could never decide)."""
    need = policy.policy.gate.min_prompts
    if len(corpus) >= need:
        return None
    return f"corpus {corpus.source} has {len(corpus)} prompts; policy {policy.source} needs {need}"


def corpus_too_short(corpus: Corpus, policy: LoadedPolicy) -> str | None:
    """Why ``corpus`` cannot reach ``policy``'s min_context_tokens, by the longest its prompts
    can be (``CorpusEntry.max_prompt_tokens``, an upper bound: the targets' count decides after
    the replay, ``verdict.py``)."""
    need = policy.policy.gate.min_context_tokens
    reach = max((e.max_prompt_tokens for e in corpus.entries), default=0)
    if need == 0 or reach >= need:
        return None
    return (
        f"corpus {corpus.source}'s longest prompt has at most {reach} tokens; policy "
        f"{policy.source} needs min_context_tokens {need} (the long corpus reaches it: "
        "--corpus long, or `kdtree-parity corpus long`)"
    )


class RunRefused(ValueError):
    """What keeps a run from starting, one problem a line (``problems``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True)
class PreparedRun:
    """A corpus and a policy checked against each other and the targets: ready for start_run."""

    corpus: Corpus
    policy: LoadedPolicy


def prepare_run(
    corpus: str | Corpus, policy: str | LoadedPolicy, urls: Mapping[str, str | None]
) -> PreparedRun:
    """Load ``corpus`` and ``policy`` (a spec: path or shipped name; or already loaded) and check
    that the corpus is large enough for the policy, that every URL (``label: url``; empty ones
    are skipped; a label ends in its role) is usable, and that the candidate, the baseline, the
    replica and the floor are distinct targets (``reference_targets``). RunRefused names every
    problem found, in that order."""
    problems = []
    if isinstance(corpus, str):
        try:
            corpus = load_corpus(corpus)
        except CorpusError as exc:
            problems.append(str(exc))
    if isinstance(policy, str):
        try:
            policy = load_policy(policy)
        except PolicyError as exc:
            problems.append(str(exc))
    loaded = isinstance(corpus, Corpus) and isinstance(policy, LoadedPolicy)
    if loaded and (too_small := corpus_too_small(corpus, policy)):
        problems.append(f"{too_small}: such a run could never decide")
    if loaded and (too_short := corpus_too_short(corpus, policy)):
        problems.append(f"{too_short}: such a run could never decide")
    problems += [
        f"{label}: {problem}"
        for label, url in urls.items()
        if url and (problem := url_problem(url))
    ]
    problems += distinct_url_problems(urls)
    if problems or not loaded:
        raise RunRefused(problems)
    return PreparedRun(corpus, policy)


def start_run(
    store: Store,
    corpus: Corpus,
    policy: LoadedPolicy,
    targets: Targets,
    *,
    pair: str = "cli",
    out_dir: str | None = None,
    exclusive: bool = False,
) -> str:
    """Record a new run (status running) and return its id; ``execute_run`` does the work.
    ``exclusive``: one live run per ``pair`` across every process on the store (PairBusy)."""
    return store.create_run(
        pair=pair,
        targets=targets.record_urls(),
        images=targets.record_images(),
        prompts_total=len(corpus),
        corpus_source=corpus.source,
        corpus_sha256=corpus.sha256,
        corpus_jsonl=corpus.raw,
        policy_source=policy.source,
        policy_sha256=policy.sha256,
        policy_text=policy.text,
        out_dir=out_dir,
        exclusive=exclusive,
    )


class _Breaker:
    """Counts consecutive transport failures per target client; trips the run's stop event."""

    def __init__(self, limit: int, stop: asyncio.Event) -> None:
        self.limit = limit
        self.stop = stop
        self.reason: str | None = None
        self._streak: dict[str, int] = {}

    def record(self, client: TargetClient, outcome: Outcome) -> None:
        if outcome.error is not None and outcome.error.transport:
            self._streak[client.name] = self._streak.get(client.name, 0) + 1
            if self._streak[client.name] >= self.limit and not self.stop.is_set():
                self.reason = (
                    f"{client.name} ({client.base_url}) failed {self.limit} requests in a row, "
                    f"last: {outcome.error.message}"
                )
                self.stop.set()
        else:
            self._streak[client.name] = 0


async def execute_run(
    store: AsyncStore,
    run_id: str,
    *,
    progress: ProgressCallback | None = None,
    write_reports: bool = True,
    images: dict[str, str] | None = None,
    accept_identity_change: bool = False,
    resolution: Any = None,
    tokens: Mapping[str, str] | None = None,
    notice: Notice | None = None,
) -> RunOutcome:
    """Run (or resume) ``run_id`` as recorded in the store; always leaves it in a final status.

    Before any prompt is replayed, each target's identity (its /model_info, and the image label
    in ``images`` where the caller gives one) is compared with what the run recorded: a resume
    against a different build raises IdentityChanged (the run is left ``error``, resumable)
    unless ``accept_identity_change``, which records the change in the run and its report. With
    ``write_reports`` the reports are written before the final status is stored, so a run is
    never ``passed`` without them; reports that cannot be written leave it ``error``.
    ``tokens``: bearer token by target (baseline, candidate, replica, floor), held by the HTTP
    clients only, never stored. ``notice`` hears what the run is waiting for (default: the log).
    """
    record = await store.call(Store.get_run, run_id)
    lost: list[LeaseLost] = []
    async with contextlib.AsyncExitStack() as stack:
        run = await _open_run(stack, store, record, tokens, progress)
        heartbeat = asyncio.create_task(_heartbeat(store, run_id, asyncio.current_task(), lost))
        stack.callback(heartbeat.cancel)  # LIFO: cancelled before the clients close
        try:
            ending = await _replay_and_decide(
                run, notice or log.info, images or {}, accept_identity_change
            )
            outcome = await _finish(run, ending, write_reports, resolution)
        except LeaseLost:
            _log_lost(run_id)
            raise
        except (asyncio.CancelledError, KeyboardInterrupt):
            if lost:  # the heartbeat found the run taken over: it is not ours to end or report
                _log_lost(run_id)
                raise lost[0] from None
            reason = "interrupted (signal or cancellation)"
            await _end_on_failure(
                store, run_id, "interrupted", reason, record.out_dir, write_reports
            )
            raise
        except IdentityChanged as exc:
            reason = f"resume refused: {exc}"
            await _end_on_failure(store, run_id, "error", reason, record.out_dir, write_reports)
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            await _end_on_failure(store, run_id, "error", reason, record.out_dir, write_reports)
            raise
    return outcome


@dataclass
class _Run:
    """One execution of a recorded run: what it replays, against which clients, how it stops."""

    store: AsyncStore
    record: RunRecord
    corpus: Corpus
    policy: Policy
    # One client per server, by role name; and the client serving each record key (the A/A
    # twin "aa" is the baseline's client when the run has no replica).
    clients: dict[TargetRole, TargetClient]
    role_client: dict[Role, TargetClient]
    breaker: _Breaker
    stop: asyncio.Event
    progress: ProgressCallback | None
    # Held around every request when the policy asks for the targets in turn (shared GPU).
    turn: asyncio.Lock | None = None

    @property
    def run_id(self) -> str:
        return self.record.id


@dataclass(frozen=True)
class _Ending:
    """How a replay ended before its reports: the verdict and why the run stopped early."""

    verdict: Verdict
    aborted_because: str | None


async def _open_run(
    stack: contextlib.AsyncExitStack,
    store: AsyncStore,
    record: RunRecord,
    tokens: Mapping[str, str] | None,
    progress: ProgressCallback | None,
) -> _Run:
    """The recorded run's corpus, policy and one open client per server (closed by ``stack``)."""
    corpus = parse_corpus(record.corpus_jsonl, source=record.corpus_source)
    policy = parse_policy(record.policy_text, source=record.policy_source).policy
    targets = record.as_targets().with_tokens(tokens)
    clients: dict[TargetRole, TargetClient] = {}
    for target in targets:
        client = TargetClient(target.role, target.url, policy.replay, bearer_token=target.token)
        clients[target.role] = await stack.enter_async_context(client)
    by_key = {RECORD_KEY[role]: client for role, client in clients.items()}
    by_key.setdefault("aa", clients["baseline"])
    role_client = {key: by_key[key] for key in ALL_ROLES if key in record.targets}
    stop = asyncio.Event()
    breaker = _Breaker(policy.replay.max_consecutive_transport_errors, stop)
    turn = asyncio.Lock() if policy.replay.targets_in_turn else None
    return _Run(store, record, corpus, policy, clients, role_client, breaker, stop, progress, turn)


async def _replay_and_decide(
    run: _Run, notice: Notice, images: dict[str, str], accept_identity_change: bool
) -> _Ending:
    """Wait for the targets, check who they are, replay what is pending, judge the results."""
    unhealthy, candidate_refused = await _wait_ready(run, notice)
    reference_problems: list[str] = []
    if unhealthy:
        run.breaker.reason = "; ".join(unhealthy)
    else:
        identities = await _check_identities(
            run.store, run.run_id, run.record, run.role_client, images, accept_identity_change
        )
        reference_problems = identity_problems(identities)
    if not unhealthy and not reference_problems:
        await _replay_pending(run)
    verdict = judge(
        await run.store.call(Store.results, run.run_id),
        len(run.corpus),
        run.policy.gate,
        aborted_because=run.breaker.reason,
        candidate_refused=candidate_refused,
        reference_problems=reference_problems,
    ).verdict
    return _Ending(verdict, run.breaker.reason)


async def _wait_ready(run: _Run, notice: Notice) -> tuple[list[str], str | None]:
    """Every client healthy and accepting its token, by the same deadline: (why each target that
    never became healthy did not, why the candidate refused access or None). Every wait is
    collected, so the reason names every unhealthy target and no wait outlives its client."""
    deadline = run.policy.replay.health_deadline_s

    async def ready(client: TargetClient) -> None:
        await client.wait_healthy(deadline, notice=notice)
        await client.check_access()

    clients = list(run.clients.values())
    waits = await asyncio.gather(*(ready(c) for c in clients), return_exceptions=True)
    for failure in waits:
        if isinstance(failure, BaseException) and not isinstance(failure, TargetUnavailable):
            raise failure
    unhealthy = [str(w) for w in waits if isinstance(w, TargetUnavailable)]
    candidate = run.clients["candidate"]
    candidate_refused = next(
        (str(w) for w in waits if isinstance(w, TargetRefused) and w.target is candidate), None
    )
    return unhealthy, candidate_refused


async def _replay_pending(run: _Run) -> None:
    """Replay every prompt without a stored result, all at once (each client's slots bound how
    many are in flight); each result is stored as soon as all its answers are in."""
    done_ids = await run.store.call(Store.completed_prompt_ids, run.run_id)
    pending = [(i, e) for i, e in enumerate(run.corpus.entries) if e.id not in done_ids]
    counter = {"done": len(done_ids)}
    if run.progress:
        run.progress(counter["done"], len(run.corpus), None)

    async def one(ordinal: int, entry: CorpusEntry) -> None:
        result = await _replay_prompt(run, entry)
        if result is None:
            return  # the run was stopped; this prompt stays pending for resume
        await run.store.call(Store.save_result, run.run_id, ordinal, result)
        counter["done"] += 1
        if run.progress:
            run.progress(counter["done"], len(run.corpus), result)

    await asyncio.gather(*(one(i, e) for i, e in pending))


async def _replay_prompt(run: _Run, entry: CorpusEntry) -> PromptResult | None:
    """One prompt's answers from every role, compared; None when the run stopped meanwhile."""
    path, body = build_request(entry, run.policy.replay)

    async def ask(client: TargetClient) -> Outcome | None:
        async with client.slot, run.turn or contextlib.nullcontext():
            if run.stop.is_set():
                return None
            outcome = await client.generate(body, path)
        run.breaker.record(client, outcome)
        return outcome

    roles = tuple(run.role_client)
    answers = await asyncio.gather(*(ask(run.role_client[role]) for role in roles))
    if any(a is None for a in answers):
        return None
    outcomes: dict[Role, Outcome] = dict(zip(roles, answers, strict=True))  # type: ignore[arg-type]
    return build_prompt_result(entry, outcomes, run.policy.compare.near_tie_epsilon)


async def _finish(run: _Run, ending: _Ending, write_reports: bool, resolution: Any) -> RunOutcome:
    """Write the reports (when asked and the run has an out dir), then store the final status:
    a run whose reports could not be written ends ``error``."""
    verdict, run_id, out_dir = ending.verdict, run.run_id, run.record.out_dir
    final = RunEnding(
        VERDICT_TO_STATUS[verdict.status], verdict_to_json(verdict), ending.aborted_because
    )
    # Still ours? (LeaseLost) -- never report over a new owner's run.
    await run.store.call(Store.heartbeat, run_id)
    if write_reports and out_dir:
        try:
            await run.store.call(
                write_report_files, run_id, Path(out_dir), ending=final, resolution=resolution
            )
        except OSError as exc:
            final = RunEnding(
                "error", None, f"the reports could not be written to {out_dir}: {exc}"
            )
    await run.store.call(
        Store.finish_run, run_id, final.status, verdict=final.verdict, error=final.error
    )
    return RunOutcome(run_id, final.status, verdict, final.error)


async def _check_identities(
    store: AsyncStore,
    run_id: str,
    record: RunRecord,
    role_client: dict[Role, TargetClient],
    images: dict[str, str],
    accept_change: bool,
) -> dict[str, dict[str, Any]]:
    """Record each target's identity; on a resume, refuse (or record) any change of build, and
    any target whose build cannot be shown to be the same (see ``unverifiable``). Returns each
    role's /model_info, the A/A twin's only when it is a target of its own."""
    current = {}
    for role, client in role_client.items():
        current[role] = {"model_info": await client.identity()}
        if images.get(role):
            current[role]["image"] = images[role]
    changed = {}
    for role, identity in current.items():
        recorded = record.targets[role][1]
        if recorded is None or "model_info" not in recorded:
            continue  # the first time this run gets this far: nothing to compare with yet
        diff = identity_differences(recorded, identity)
        if not diff and (why := unverifiable(recorded)):
            diff = [f"cannot be verified: {why}"]
        if diff:
            changed[role] = diff
    if changed and not accept_change:
        named = "; ".join(f"{role}: {', '.join(diff)}" for role, diff in changed.items())
        raise IdentityChanged(
            f"run {run_id}: the targets are not the builds the run started with ({named}); "
            "start a new run, or accept the change explicitly (--accept-identity-change)"
        )
    for role, identity in current.items():
        if role in changed:
            merged = {**(record.targets[role][1] or {}), **identity}
            await store.call(Store.accept_identity_change, run_id, role, changed[role], merged)
        else:
            await store.call(Store.set_identity, run_id, role, identity)
    return {
        role: identity["model_info"]
        for role, identity in current.items()
        if role != "aa" or role_client["aa"] is not role_client["baseline"]
    }


async def _heartbeat(
    store: AsyncStore, run_id: str, owner: asyncio.Task | None, lost: list[LeaseLost]
) -> None:
    """Renew the run's lease so other processes see it is alive. If the run was taken over
    (our lease expired), stop the run at once: its results are no longer ours to store."""
    while True:
        await asyncio.sleep(store.heartbeat_s)
        try:
            await store.call(Store.heartbeat, run_id)
        except LeaseLost as exc:
            lost.append(exc)
            if owner is not None:
                owner.cancel()
            return
        except sqlite3.Error as exc:  # e.g. locked for longer than the busy timeout: next time
            log.warning("run %s: could not renew its lease: %s", run_id, exc)


def _log_lost(run_id: str) -> None:
    log.error("run %s: this process lost its lease; stopped without touching the run", run_id)


def verdict_to_json(verdict: Verdict) -> dict[str, Any]:
    return {
        "status": verdict.status,
        "reasons": [
            {
                "rule": r.rule,
                "outcome": r.outcome,
                "message": r.message,
                "test": None if r.test is None else r.test.to_json(),
            }
            for r in verdict.reasons
        ],
    }


async def _end_on_failure(
    store: AsyncStore,
    run_id: str,
    status: RunStatus,
    reason: str,
    out_dir: str | None,
    write_reports: bool,
) -> None:
    """The run ends ``status`` with ``reason``; its reports are then written on a best-effort
    basis (the status is already safe in the store, and the original failure is raised on)."""
    await store.call(Store.finish_run, run_id, status, error=reason)
    if not (write_reports and out_dir):
        return
    try:
        await store.call(write_report_files, run_id, Path(out_dir))
    except Exception:
        log.exception("run %s: the reports could not be written", run_id)
