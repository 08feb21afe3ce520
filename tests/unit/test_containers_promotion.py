"""The promotion records and the reading of the gate's report, without Docker or servers.

The end-to-end flow (stand-in docker, real sidecar, real servers) is in
tests/integration/test_promote.py; these pin the rules that flow relies on.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from kdtree_parity.promote import (
    PromotionError,
    RecordStore,
    check_registry,
    read_gate_report,
    registry_host,
)

A, B, C = ("sha256:" + ch * 64 for ch in "abc")


def _promote(digest: str) -> dict:
    return {"action": "promote", "digest": digest, "time": "2026-11-29T00:00:00Z"}


def _rollback(from_digest: str, to_digest: str) -> dict:
    return {"action": "rollback", "digest": to_digest, "from_digest": from_digest}


def test_history_is_a_stack_of_promotions_and_rollbacks(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for record in (_promote(A), _promote(B), _promote(C), _rollback(C, B)):
        store.write(record)
    assert [p.name[:4] for p in sorted(tmp_path.iterdir())] == ["0001", "0002", "0003", "0004"]
    assert store.stable_history() == [A, B]
    assert [r["sequence"] for r in store.records()] == [1, 2, 3, 4]


def test_a_record_is_never_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RecordStore(tmp_path)
    first = store.write(_promote(A))
    original = first.read_bytes()
    # A concurrent writer that did not see our file picks the same name: it must fail.
    monkeypatch.setattr(RecordStore, "_sequence", staticmethod(lambda name: None))
    with pytest.raises(PromotionError, match="never overwritten"):
        store.write(_promote(A))
    assert first.read_bytes() == original and len(list(tmp_path.iterdir())) == 1


def test_a_rollback_that_does_not_follow_the_history_is_refused(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    store.write(_promote(B))
    store.write(_rollback(A, B))  # claims A was stable: it was B
    with pytest.raises(PromotionError, match="does not follow the history"):
        store.stable_history()


def test_a_corrupt_record_stops_everything(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    (tmp_path / "0002-promote-bbbbbbbbbbbb.json").write_text("{not json")
    with pytest.raises(PromotionError, match="unreadable"):
        store.stable_history()


def _report(out_dir: Path, verdict: str, **overrides: object) -> Path:
    report = {
        "run": {"id": "r1"},
        "verdict": {
            "status": verdict,
            "reasons": [{"rule": "hard", "outcome": "fail", "message": "2 hard"}],
        },
        "corpus": {"sha256": "c" * 64},
        "policy": {"source": "short", "sha256": "p" * 64},
        **overrides,
    }
    path = out_dir / "r1" / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(report))
    return path


def test_gate_report_is_read_with_its_hash(tmp_path: Path) -> None:
    path = _report(tmp_path, "fail")
    result = read_gate_report(tmp_path, 1)
    assert result.verdict == "fail" and result.reasons == ["[hard fail] 2 hard"]
    assert result.report_path == path and len(result.report_sha256) == 64
    assert result.corpus_sha256 == "c" * 64 and result.run_id == "r1"


@pytest.mark.parametrize(
    ("verdict", "exit_code", "message"),
    [
        ("fail", 0, "refusing to trust either"),  # exit says pass, report says fail
        ("pass", 1, "refusing to trust either"),
        ("pass", 139, "crashed or was killed"),
    ],
)
def test_gate_report_that_disagrees_is_an_error(
    tmp_path: Path, verdict: str, exit_code: int, message: str
) -> None:
    _report(tmp_path, verdict)
    with pytest.raises(PromotionError, match=message):
        read_gate_report(tmp_path, exit_code)


def test_gate_report_without_corpus_hash_is_an_error(tmp_path: Path) -> None:
    _report(tmp_path, "pass", corpus={})
    with pytest.raises(PromotionError, match="incomplete"):
        read_gate_report(tmp_path, 0)


def test_a_refused_candidate_stays_out_of_the_stable_history(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    store.write({"action": "refused", "digest": B, "stable_digest": A})
    assert store.stable_history() == [A]
    assert [r["action"] for r in store.records()] == ["promote", "refused"]


def test_an_interrupted_write_leaves_no_record_and_no_debris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    before = sorted(p.name for p in tmp_path.iterdir())

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    # The failure comes after the text was written to the temporary file, before it is named.
    monkeypatch.setattr("kdtree_parity.promote.os.fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        store.write(_promote(B))
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert store.stable_history() == [A]


def test_a_written_record_is_whole_and_readable_by_others(tmp_path: Path) -> None:
    path = RecordStore(tmp_path).write(_promote(A))
    assert json.loads(path.read_text())["digest"] == A
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    ("image", "host"),
    [
        ("127.0.0.1:5000/kdtree/demo", "127.0.0.1:5000"),
        ("registry.example.com/kdtree/inference", "registry.example.com"),
        ("localhost/kdtree/inference", "localhost"),
        ("kdtree/inference", "registry-1.docker.io"),
        ("inference", "registry-1.docker.io"),
    ],
)
def test_the_registry_is_read_from_the_image_name(image: str, host: str) -> None:
    assert registry_host(image) == host


def test_a_registry_that_does_not_answer_is_an_error_naming_it() -> None:
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        with pytest.raises(PromotionError, match=f"127.0.0.1:{port}.*does not answer"):
            check_registry(f"127.0.0.1:{port}/kdtree/demo", timeout_s=5)
