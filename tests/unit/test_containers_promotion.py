"""The promotion records and the reading of the gate's report, without Docker or servers.

The end-to-end flow (stand-in docker, real sidecar, real servers) is in
tests/integration/test_promote.py; these pin the rules that flow relies on.
"""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path
from typing import Any

import pytest
from parity_factories import exact, hard

from kdtree_parity.corpus import parse_corpus
from kdtree_parity.exit_codes import ExitCode
from kdtree_parity.gate import decide, summarize
from kdtree_parity.policy import parse_policy
from kdtree_parity.promote.errors import PromotionError
from kdtree_parity.promote.gate_report import read_gate_report
from kdtree_parity.promote.records import (
    GateSummary,
    ImageSide,
    PromotedCandidate,
    PromoteRecord,
    RecordStore,
    RefusedRecord,
    RollbackRecord,
    SourceState,
    record_from_json,
)
from kdtree_parity.promote.registry import check_registry, registry_host
from kdtree_parity.report import write_report_files
from kdtree_parity.report.schema import Report
from kdtree_parity.runner import start_run, verdict_to_json
from kdtree_parity.store import Store
from kdtree_parity.targets import Targets

A, B, C = ("sha256:" + ch * 64 for ch in "abc")
IMAGE = "kdtree/inference"


def _gate(verdict: str = "pass") -> GateSummary:
    return GateSummary(
        run_id="r1",
        verdict=verdict,
        exit_code={"pass": 0, "fail": 1, "error": 2}[verdict],
        reasons=[],
        report="/reports/r1/report.json",
        report_sha256="d" * 64,
        corpus_sha256="c" * 64,
        policy={"source": "short", "sha256": "p" * 64},
    )


def _gated(digest: str) -> dict[str, Any]:
    return {
        "image": IMAGE,
        "baseline": ImageSide(ref=f"{IMAGE}:rev", digest=digest),
        "source": SourceState(revision="rev", dirty=False),
    }


def _promote(digest: str) -> PromoteRecord:
    return PromoteRecord(
        time="2026-11-29T00:00:00Z",
        digest=digest,
        previous_digest=None,
        pushed=False,
        candidate=PromotedCandidate(ref=f"{IMAGE}:rev", digest=digest, repo_digests=[]),
        gate=_gate(),
        **_gated(digest),
    )


def _refused(digest: str, stable_digest: str | None) -> RefusedRecord:
    return RefusedRecord(
        time="2026-11-29T00:00:00Z",
        digest=digest,
        stable_digest=stable_digest,
        candidate=ImageSide(ref=f"{IMAGE}:rev", digest=digest),
        gate=_gate("fail"),
        **_gated(digest),
    )


def _rollback(from_digest: str, to_digest: str) -> RollbackRecord:
    return RollbackRecord(
        time="2026-11-29T00:00:00Z",
        image=IMAGE,
        digest=to_digest,
        from_digest=from_digest,
        pushed=False,
        repo_digests=[],
        reason="drill",
    )


def test_history_is_a_stack_of_promotions_and_rollbacks(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    for record in (_promote(A), _promote(B), _promote(C), _rollback(C, B)):
        store.write(record)
    assert [p.name[:4] for p in sorted(tmp_path.iterdir())] == ["0001", "0002", "0003", "0004"]
    assert store.stable_history() == [A, B]
    assert [r.sequence for r in store.records()] == [1, 2, 3, 4]


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


def _gate_run(directory: Path, results: list) -> Path:
    """A real run of the gate (its store, policy and verdict) and the report.json it writes."""
    store = Store(directory / "runs.sqlite3")
    corpus_text = "".join(json.dumps({"id": r.entry.id, "text": "t"}) + "\n" for r in results)
    corpus = parse_corpus(corpus_text.encode(), source="unit.jsonl")
    policy = parse_policy("gate:\n  min_prompts: 2\n", source="unit.yaml")
    run_id = start_run(
        store, corpus, policy, Targets.from_urls("http://127.0.0.1:1", "http://127.0.0.1:2")
    )
    for index, prompt in enumerate(results):
        store.save_result(run_id, index, prompt)
    verdict = decide(summarize(store.results(run_id), len(results)), policy.policy.gate)
    status = {"pass": "passed", "fail": "failed", "error": "error"}[verdict.status]
    store.finish_run(run_id, status, verdict=verdict_to_json(verdict))
    paths = write_report_files(store, run_id, directory / "out")
    store.close()
    return paths["json"]


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A passing report.json as the gate writes it, to be varied by the tests."""
    path = _gate_run(tmp_path_factory.mktemp("gate"), [exact("a"), exact("b")])
    return json.loads(path.read_text())


def _report(out_dir: Path, base: dict[str, Any], verdict: str, **overrides: object) -> Path:
    report = json.loads(json.dumps(base))
    report["run"]["id"] = "r1"
    report["verdict"] = {
        "status": verdict,
        "reasons": [{"rule": "hard", "outcome": "fail", "message": "2 hard"}],
    }
    report["corpus"]["sha256"] = "c" * 64
    report.update(overrides)
    path = out_dir / "r1" / "report.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(report))
    return path


def test_a_report_the_gate_wrote_reads_through_its_schema(tmp_path: Path) -> None:
    for results, exit_code in (([exact("a"), exact("b")], 0), ([exact("a"), hard("b")], 1)):
        path = _gate_run(tmp_path / str(exit_code), results)
        report = Report.model_validate_json(path.read_text())
        result = read_gate_report(path.parent.parent, exit_code)
        assert result.exit_code == ExitCode(exit_code) and result.report_path == path
        assert result.verdict == report.verdict.status == ("pass", "fail")[exit_code]
        assert len(result.reasons) == len(report.verdict.reasons) > 0
        assert all(
            text.startswith(f"[{r.rule} {r.outcome}] ") and text.endswith(r.message)
            for text, r in zip(result.reasons, report.verdict.reasons, strict=True)
        )
        assert result.report_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert result.corpus_sha256 == report.corpus.sha256 and result.run_id == report.run.id
        assert result.policy == json.loads(path.read_text())["policy"]  # as the report said it


def test_gate_report_is_read_with_its_hash(tmp_path: Path, real_report: dict) -> None:
    path = _report(tmp_path, real_report, "fail")
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
    tmp_path: Path, real_report: dict, verdict: str, exit_code: int, message: str
) -> None:
    _report(tmp_path, real_report, verdict)
    with pytest.raises(PromotionError, match=message):
        read_gate_report(tmp_path, exit_code)


def test_gate_report_without_corpus_hash_is_an_error(tmp_path: Path, real_report: dict) -> None:
    _report(tmp_path, real_report, "pass", corpus={})
    with pytest.raises(PromotionError, match="incomplete"):
        read_gate_report(tmp_path, 0)


def test_a_refused_candidate_stays_out_of_the_stable_history(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    store.write(_refused(B, stable_digest=A))
    assert store.stable_history() == [A]
    assert [r.action for r in store.records()] == ["promote", "refused"]


def test_an_interrupted_write_leaves_no_record_and_no_debris(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path)
    store.write(_promote(A))
    before = sorted(p.name for p in tmp_path.iterdir())

    def disk_full(_fd: int) -> None:
        raise OSError(28, "No space left on device")

    # The failure comes after the text was written to the temporary file, before it is named.
    monkeypatch.setattr("kdtree_parity.promote.records.os.fsync", disk_full)
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


def _file_text(record: dict[str, Any]) -> str:
    """A record file's text as promote has always written it."""
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


def test_records_in_the_v1_file_format_read_and_write_back_byte_for_byte(tmp_path: Path) -> None:
    gate = {
        "run_id": "r1",
        "verdict": "pass",
        "exit_code": 0,
        "reasons": ["[hard pass] 0 hard"],
        "report": "/reports/r1/report.json",
        "report_sha256": "d" * 64,
        "corpus_sha256": "c" * 64,
        "policy": {"source": "short", "sha256": "p" * 64, "text": "", "settings": None},
    }
    gated = {
        "image": IMAGE,
        "baseline": {"ref": f"{IMAGE}:rev1", "digest": A},
        "source": {"revision": "rev1", "dirty": False},
    }
    files = {
        "0001-promote-aaaaaaaaaaaa.json": {
            "schema": "kdtree.promotion/v1",
            "sequence": 1,
            "action": "promote",
            "time": "2026-11-29T00:00:00Z",
            "tag": "stable",
            "digest": A,
            "previous_digest": None,
            "pushed": True,
            "gate": gate,
            "candidate": {"ref": f"{IMAGE}:rev1", "digest": A, "repo_digests": [f"{IMAGE}@{A}"]},
            **gated,
        },
        "0002-refused-bbbbbbbbbbbb.json": {
            "schema": "kdtree.promotion/v1",
            "sequence": 2,
            "action": "refused",
            "time": "2026-11-29T00:00:01Z",
            "digest": B,
            "stable_digest": A,
            "gate": {**gate, "verdict": "fail", "exit_code": 1},
            "candidate": {"ref": f"{IMAGE}:rev2", "digest": B},
            **gated,
        },
        "0003-rollback-aaaaaaaaaaaa.json": {
            "schema": "kdtree.promotion/v1",
            "sequence": 3,
            "action": "rollback",
            "time": "2026-11-29T00:00:02Z",
            "image": IMAGE,
            "tag": "stable",
            "digest": A,
            "from_digest": C,
            "pushed": False,
            "repo_digests": [],
            "reason": "drill",
        },
    }
    for name, record in files.items():
        (tmp_path / name).write_text(_file_text(record))
    records = RecordStore(tmp_path).records()
    assert [type(r) for r in records] == [PromoteRecord, RefusedRecord, RollbackRecord]
    assert [r.to_json() for r in records] == [_file_text(r) for r in files.values()]
    assert records[0].candidate.repo_digests == [f"{IMAGE}@{A}"] and records[1].stable_digest == A
    assert records[2].from_digest == C and records[2].reason == "drill"


def test_a_written_record_reads_back_equal(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    written = [_promote(A), _refused(B, A), _promote(C), _rollback(C, A)]
    paths = [store.write(record) for record in written]
    assert [p.name.split("-")[1] for p in paths] == ["promote", "refused", "promote", "rollback"]
    assert store.records() == [
        r.model_copy(update={"sequence": i}) for i, r in enumerate(written, start=1)
    ]
    assert record_from_json(paths[1].read_text()) == store.records()[1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": "kdtree.promotion/v0"}, "is not a kdtree.promotion/v1 record"),
        ({"digets": A}, "is not a kdtree.promotion/v1 record"),  # a misspelt key
        ({"action": "demote"}, "is not a kdtree.promotion/v1 record"),
    ],
)
def test_a_record_that_is_not_v1_stops_everything(
    tmp_path: Path, change: dict[str, str], message: str
) -> None:
    store = RecordStore(tmp_path)
    path = store.write(_promote(A))
    record = json.loads(path.read_text())
    path.unlink()
    (tmp_path / path.name).write_text(_file_text({**record, **change}))
    with pytest.raises(PromotionError, match=message):
        store.stable_history()
