"""kdtree_parity.targets: one Target per role, a run's Targets by role name, and how they map
onto run records (the A/A twin keyed "aa" there), tokens and the reference targets' checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdtree_parity.corpus import load_corpus
from kdtree_parity.policy import load_policy
from kdtree_parity.reference_targets import distinct_url_problems
from kdtree_parity.results import ALL_ROLES
from kdtree_parity.runner import start_run
from kdtree_parity.settings import ENV_PREFIX, TOKEN_TARGETS, ParitySettings, target_tokens
from kdtree_parity.store import Store
from kdtree_parity.targets import (
    RECORD_KEY,
    TARGET_ROLES,
    Target,
    Targets,
    normalized_url,
    role_named,
    token_variable,
)


def test_the_roles_are_the_token_targets_and_map_onto_the_record_keys() -> None:
    assert TARGET_ROLES == ("baseline", "candidate", "replica", "floor") == TOKEN_TARGETS
    assert set(RECORD_KEY.values()) == set(ALL_ROLES)
    assert RECORD_KEY["replica"] == "aa"
    assert token_variable("replica") == f"{ENV_PREFIX}REPLICA_TOKEN"


def test_a_role_is_named_by_flag_record_key_or_name() -> None:
    assert role_named("--replica") == role_named("aa") == role_named("replica") == "replica"
    assert role_named("--floor") == "floor" and role_named("baseline") == "baseline"
    with pytest.raises(ValueError, match="no target role 'twin'"):
        role_named("twin")
    with pytest.raises(ValueError, match="no target role"):
        Target("twin", "http://a:1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="the replica slot holds a floor target"):
        Targets(Target("baseline", "http://a:1"), Target("candidate", "http://a:2"),
                replica=Target("floor", "http://a:3"))  # fmt: skip


def test_empty_urls_and_labels_are_no_target_and_no_image() -> None:
    t = Targets.from_urls(
        "http://a:1", "http://a:2", "", None, images={"baseline": "", "candidate": "sha256:c"}
    )
    assert t.replica is None and t.floor is None
    assert [x.role for x in t] == ["baseline", "candidate"]
    assert t.baseline.image is None and t.candidate.image == "sha256:c"
    assert t.twin is t.baseline
    assert t.labelled_urls("--") == {"--baseline": "http://a:1", "--candidate": "http://a:2"}


def test_the_record_keys_the_twin_aa_whichever_server_it_is() -> None:
    images = {"baseline": "img-b", "candidate": "img-c", "replica": "img-r", "floor": "img-f"}
    alone = Targets.from_urls("http://a:1", "http://a:2", images=images)
    assert alone.record_urls() == {
        "baseline": "http://a:1",
        "candidate": "http://a:2",
        "aa": "http://a:1",
    }
    # Without a replica its label is not the twin's: the baseline's is.
    assert alone.record_images() == {"baseline": "img-b", "candidate": "img-c", "aa": "img-b"}
    full = Targets.from_urls("http://a:1", "http://a:2", "http://a:3", "http://a:4", images=images)
    assert full.twin is full.replica
    assert full.record_urls() == {
        "baseline": "http://a:1",
        "candidate": "http://a:2",
        "aa": "http://a:3",
        "floor": "http://a:4",
    }
    assert full.record_images() == {"baseline": "img-b", "candidate": "img-c", "aa": "img-r",
                                    "floor": "img-f"}  # fmt: skip


def test_targets_come_back_from_a_stored_run(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "runs.sqlite3"))
    corpus, policy = load_corpus("short"), load_policy("short")
    try:
        for targets in (
            Targets.from_urls("http://a:1", "http://a:2", images={"candidate": "sha256:c"}),
            Targets.from_urls(
                "http://a:1",
                "http://a:2",
                "http://a:3",
                "http://a:4",
                images={"replica": "r", "floor": "f"},
            ),
        ):
            record = store.get_run(start_run(store, corpus, policy, targets))
            assert Targets.from_record(record.targets) == targets
    finally:
        store.close()
    # A record written as "replica" (not "aa") reads the same.
    stored = {"baseline": ("http://a:1", None), "candidate": ("http://a:2", {"image": "c"}),
              "replica": ("http://a:3", None)}  # fmt: skip
    assert Targets.from_record(stored) == Targets.from_urls(
        "http://a:1", "http://a:2", "http://a:3", images={"candidate": "c"}
    )


def test_targets_from_the_settings() -> None:
    settings = ParitySettings(
        baseline_url="http://b:1",
        candidate_url="http://c:1",
        replica_url="",
        floor_url="http://f:1",
        floor_image="sha256:f",
    )
    t = Targets.from_settings(settings)
    assert (t.baseline.url, t.candidate.url, t.replica, t.floor) == (
        "http://b:1",
        "http://c:1",
        None,
        Target("floor", "http://f:1", "sha256:f"),
    )


def test_a_token_is_held_but_never_shown_or_compared(tmp_path: Path) -> None:
    secret = tmp_path / "floor.token"
    secret.write_text("s3cret-file\n")
    settings = ParitySettings(
        candidate_token="s3cret-env", floor_url="http://f:1", floor_token_file=str(secret)
    )
    plain = Targets.from_settings(settings)
    t = plain.with_tokens(target_tokens(settings))
    assert t.candidate.token == "s3cret-env" and t.floor is not None
    assert t.floor.token == "s3cret-file" and t.baseline.token is None
    assert "s3cret" not in repr(t)
    assert t == plain  # a token is not part of which server a target is


def test_one_endpoint_is_one_target_however_spelt() -> None:
    a = Target("baseline", "http://localhost:30000/")
    b = Target("candidate", "HTTP://127.0.0.1:30000")
    assert a.same_endpoint(b) and a.endpoint == normalized_url(b.url) == "http://127.0.0.1:30000"
    assert not a.same_endpoint(Target("floor", "http://localhost:30001"))
    same = Targets(a, b)
    (problem,) = distinct_url_problems(same.labelled_urls("--"))
    assert "--candidate is --baseline" in problem and "compare the baseline with itself" in problem
    twin = Targets.from_urls("http://a:1", "http://a:2", "http://A:2/")
    (problem,) = distinct_url_problems(twin.labelled_urls("pair 'p' "))
    assert "pair 'p' replica is pair 'p' candidate" in problem
