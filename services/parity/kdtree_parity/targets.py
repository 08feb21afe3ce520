"""The servers a parity run compares: one ``Target`` per role, a run's ``Targets`` by role name.

A run has four roles, named as everywhere a person writes them (the ``run`` flags, the
``KDTREE_PARITY_<ROLE>_URL``/``_IMAGE``/``_TOKEN`` variables, the service's pairs file):

* ``baseline``: the reference server;
* ``candidate``: the server under test;
* ``replica``: optional, a second baseline for A/A noise; without one the baseline is replayed a
  second time and serves as the A/A twin;
* ``floor``: optional, the A/A' target (the baseline's model computed an equivalent, not
  bit-identical way).

Run records, prompt results and reports (the store, ``report.json``, the service's JSON) key the
A/A twin ``"aa"``, whichever server it is: ``RECORD_KEY`` is that one translation, and
``Targets.from_record`` / ``Targets.record_urls`` the only places it is applied.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

import httpx

if TYPE_CHECKING:
    from kdtree_parity.settings import ParitySettings

TargetRole = Literal["baseline", "candidate", "replica", "floor"]
TARGET_ROLES: tuple[TargetRole, ...] = get_args(TargetRole)
# The key of each role in run records, prompt results and reports (the replica is the A/A twin).
RECORD_KEY: dict[TargetRole, str] = {
    "baseline": "baseline",
    "candidate": "candidate",
    "replica": "aa",
    "floor": "floor",
}
_ROLE_OF_KEY: dict[str, TargetRole] = {key: role for role, key in RECORD_KEY.items()}
TOKEN_VARIABLE_PREFIX = "KDTREE_PARITY_"

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = {"localhost": "127.0.0.1", "::1": "127.0.0.1", "[::1]": "127.0.0.1"}


def normalized_url(url: str) -> str:
    """``url`` in one spelling per endpoint: scheme, lower-case host (``localhost`` as
    127.0.0.1), explicit port, path without its trailing slash."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError):
        return url
    host = (parsed.host or "").lower()
    host = _LOOPBACK_NAMES.get(host, host)
    port = parsed.port or _DEFAULT_PORTS.get(parsed.scheme, 0)
    return f"{parsed.scheme}://{host}:{port}{parsed.path.rstrip('/')}"


def role_named(name: str) -> TargetRole:
    """The role a flag (``--replica``), a record key (``aa``) or a role name stands for;
    ValueError for anything else."""
    bare = name.lstrip("-")
    if bare in TARGET_ROLES:
        return bare  # type: ignore[return-value]
    if bare in _ROLE_OF_KEY:
        return _ROLE_OF_KEY[bare]
    raise ValueError(f"no target role {name!r}; the roles are {', '.join(TARGET_ROLES)}")


def token_variable(role: TargetRole) -> str:
    """The variable holding the bearer token ``role`` requires (``..._FILE``: a file holding it)."""
    return f"{TOKEN_VARIABLE_PREFIX}{role.upper()}_TOKEN"


@dataclass(frozen=True)
class Target:
    """One server of a run. ``image``: the image digest or reference it was started from, a label
    recorded with the run; ``token``: the bearer token it requires, held for its HTTP client
    only (never shown, stored or compared)."""

    role: TargetRole
    url: str
    image: str | None = None
    token: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in TARGET_ROLES:
            raise ValueError(f"no target role {self.role!r}; the roles are {TARGET_ROLES}")

    @property
    def endpoint(self) -> str:
        """The URL normalised (``normalized_url``): two targets with one endpoint are one server."""
        return normalized_url(self.url)

    def same_endpoint(self, other: Target) -> bool:
        return self.endpoint == other.endpoint


def _target(role: TargetRole, url: str | None, image: str | None = None) -> Target | None:
    return Target(role, url, image or None) if url else None


@dataclass(frozen=True)
class Targets:
    """A run's targets by role; ``replica`` and ``floor`` are optional."""

    baseline: Target
    candidate: Target
    replica: Target | None = None
    floor: Target | None = None

    def __post_init__(self) -> None:
        for role in TARGET_ROLES:
            target = getattr(self, role)
            if target is not None and target.role != role:
                raise ValueError(f"the {role} slot holds a {target.role} target")

    @classmethod
    def from_urls(
        cls,
        baseline: str,
        candidate: str,
        replica: str | None = None,
        floor: str | None = None,
        *,
        images: Mapping[str, str | None] | None = None,
    ) -> Targets:
        """From URLs and image labels by role (empty ones are left out)."""
        images = images or {}
        return cls(
            Target("baseline", baseline, images.get("baseline") or None),
            Target("candidate", candidate, images.get("candidate") or None),
            _target("replica", replica, images.get("replica")),
            _target("floor", floor, images.get("floor")),
        )

    @classmethod
    def from_settings(cls, settings: ParitySettings) -> Targets:
        """The targets ``KDTREE_PARITY_<ROLE>_URL`` and ``..._IMAGE`` name."""
        return cls.from_urls(
            *(getattr(settings, f"{role}_url") for role in TARGET_ROLES),
            images={role: getattr(settings, f"{role}_image") for role in TARGET_ROLES},
        )

    @classmethod
    def from_record(cls, stored: Mapping[str, tuple[str, dict[str, Any] | None]]) -> Targets:
        """A run record's targets (key -> (url, identity); the A/A twin as ``aa``, or
        ``replica``); the twin is a replica only when its URL is not the baseline's."""
        by_role: dict[TargetRole, Target] = {}
        for key, (url, identity) in stored.items():
            role = role_named(key)
            image = (identity or {}).get("image")
            by_role[role] = Target(role, url, image if isinstance(image, str) else None)
        twin = by_role.get("replica")
        if twin is not None and twin.url == by_role["baseline"].url:
            del by_role["replica"]
        return cls(**by_role)

    def __iter__(self) -> Iterator[Target]:
        """The targets the run has, in role order."""
        return (t for role in TARGET_ROLES if (t := getattr(self, role)) is not None)

    def by_role(self) -> dict[TargetRole, Target]:
        return {target.role: target for target in self}

    @property
    def twin(self) -> Target:
        """The A/A twin: the replica, or the baseline replayed a second time."""
        return self.replica or self.baseline

    def with_tokens(self, tokens: Mapping[str, str] | None) -> Targets:
        """These targets with the bearer tokens ``tokens`` (role -> token) gives."""
        tokens = tokens or {}
        return replace(
            self,
            **{t.role: replace(t, token=tokens.get(t.role)) for t in self},  # type: ignore[arg-type]
        )

    def with_images(self, images: Mapping[str, str | None]) -> Targets:
        """These targets with the image labels ``images`` (role -> label; empty: none) gives."""
        return replace(
            self,
            **{t.role: replace(t, image=images.get(t.role) or None) for t in self},  # type: ignore[arg-type]
        )

    def labelled_urls(self, prefix: str = "") -> dict[str, str]:
        """``prefix + role -> url`` of the targets the run has (``prepare_run``'s labels)."""
        return {f"{prefix}{t.role}": t.url for t in self}

    def record_urls(self) -> dict[str, str]:
        """URL by record key: what a run record stores (the twin always, as ``aa``)."""
        urls = {"baseline": self.baseline.url, "candidate": self.candidate.url, "aa": self.twin.url}
        return urls | ({"floor": self.floor.url} if self.floor else {})

    def record_images(self) -> dict[str, str]:
        """Image label by record key, those given only (the twin's is the baseline's without a
        replica)."""
        labels = {"baseline": self.baseline, "candidate": self.candidate, "aa": self.twin}
        labels |= {"floor": self.floor} if self.floor else {}
        return {key: target.image for key, target in labels.items() if target.image}
