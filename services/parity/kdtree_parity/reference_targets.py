"""The reference targets checked before they are trusted: the baseline, its A/A twin and the A/A'
floor must be what they claim to be, or the run cannot decide anything.

A floor or a twin that is the candidate itself makes every excess zero; a floor that is the
baseline measures no noise; a broken floor raises the bar the candidate is judged against.
Three checks, at three moments:

* before the run (``distinct_url_problems``): the candidate is not the baseline, the floor is
  neither the candidate nor the baseline, the replica is not the candidate (URLs compared after
  normalisation: scheme, lower-case host, explicit port, no trailing slash);
* before the replay (``identity_problems``): the targets' ``/model_info``. A target that reports
  a process identity (the reference engine's ``kdtree_engine.server_id``) must not share it
  with another role (two URLs, one process: a proxy in front of the candidate), and the floor and
  the twin must serve the baseline's model (``model_path``, and the weights digest where
  reported);
* after the replay (``agreement_problems``): the floor and the twin agree with the baseline
  within the policy's floor bounds: no hard divergence, and the floor's p99 drift at most
  ``gate.max_floor_drift_p99``.

Any problem makes the run undecided (rule ``reference_targets``), with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kdtree_parity.targets import RECORD_KEY, normalized_url, role_named

__all__ = [
    "agreement_problems",
    "distinct_url_problems",
    "identity_problems",
    "normalized_url",
    "stored_identity_problems",
]


def _role(label: str) -> tuple[str, str]:
    """A ``prepare_run`` label (``--floor``, ``pair 'x' floor``) -> (its group, its record key)."""
    group, _, role = label.rpartition(" ")
    return group, RECORD_KEY[role_named(role)]


# (role, role, why): two roles that must not be one target.
_MUST_DIFFER = (
    ("candidate", "baseline", "a run would compare the baseline with itself"),
    ("floor", "candidate", "the floor would be the candidate itself"),
    ("floor", "baseline", "the floor would measure no noise"),
    ("aa", "candidate", "the A/A twin would be the candidate itself"),
)


def distinct_url_problems(urls: Mapping[str, str | None]) -> list[str]:
    """What keeps the labelled URLs (``prepare_run``'s ``label: url``; a label ends in its role)
    from being distinct targets, one problem a line."""
    groups: dict[str, dict[str, tuple[str, str]]] = {}
    for label, url in urls.items():
        if url:
            group, role = _role(label)
            groups.setdefault(group, {})[role] = (label, normalized_url(url))
    problems = []
    for roles in groups.values():
        if "aa" in roles and "baseline" in roles and roles["aa"][1] == roles["baseline"][1]:
            del roles["aa"]  # no replica: the baseline replayed a second time is the twin
        for first, second, why in _MUST_DIFFER:
            if first in roles and second in roles and roles[first][1] == roles[second][1]:
                problems.append(
                    f"{roles[first][0]} is {roles[second][0]} ({roles[first][1]}): {why}"
                )
    return problems


def _engine(info: Mapping[str, Any] | None) -> dict[str, Any]:
    engine = (info or {}).get("kdtree_engine")
    return engine if isinstance(engine, dict) else {}


def identity_problems(infos: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """What the roles' ``/model_info`` answers (role -> answer; roles served by the same client
    left out) show wrong with the reference targets."""
    problems = []
    for first, second, why in _MUST_DIFFER:
        a, b = _engine(infos.get(first)), _engine(infos.get(second))
        server = a.get("server_id")
        if server and server == b.get("server_id"):
            problems.append(
                f"the {first} and the {second} are one server process "
                f"(/model_info server_id {server!r}): {why}"
            )
    base = infos.get("baseline") or {}
    for role in ("floor", "aa"):
        info = infos.get(role)
        if not info or not base:
            continue
        name = "the A/A' floor" if role == "floor" else "the A/A twin"
        if info.get("model_path") != base.get("model_path"):
            problems.append(
                f"{name} serves model {info.get('model_path')!r}, the baseline "
                f"{base.get('model_path')!r}: not the baseline's model"
            )
        digest, base_digest = (
            _engine(info).get("weights_sha256"),
            _engine(base).get("weights_sha256"),
        )
        if digest and base_digest and digest != base_digest:
            problems.append(
                f"{name}'s weights digest {digest!r} is not the baseline's {base_digest!r}"
            )
    return problems


def agreement_problems(
    floor_hard: int | None,
    floor_drift_p99: float | None,
    twin_hard: int,
    max_floor_drift_p99: float,
) -> list[str]:
    """How the floor (None: the run has none) and the twin disagree with the baseline beyond
    the floor bounds: any hard divergence, a floor p99 drift above the ceiling."""
    problems = []
    if floor_hard:
        problems.append(
            f"the A/A' floor diverged hard from the baseline on {floor_hard} prompt(s): not an "
            "equivalent computation, so no excess over it means anything"
        )
    if floor_drift_p99 is not None and floor_drift_p99 > max_floor_drift_p99:
        problems.append(
            f"the A/A' floor's p99 drift {floor_drift_p99:.3g} nats exceeds the ceiling "
            f"max_floor_drift_p99 {max_floor_drift_p99:g}"
        )
    if twin_hard:
        problems.append(f"the A/A twin diverged hard from the baseline on {twin_hard} prompt(s)")
    return problems


def stored_identity_problems(targets: Mapping[str, tuple[str, dict[str, Any] | None]]) -> list[str]:
    """``identity_problems`` of a stored run's targets (role -> (url, recorded identity)); the
    A/A twin only when it was a target of its own."""
    infos = {
        role: (identity or {}).get("model_info")
        for role, (url, identity) in targets.items()
        if role != "aa" or url != targets.get("baseline", ("", None))[0]
    }
    return identity_problems(infos)
