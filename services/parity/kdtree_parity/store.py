"""SQLite persistence of runs: targets, corpus, policy, per-prompt results, status and verdict.

A run is ``running`` until it ends as ``passed``, ``failed``, ``error`` (could not decide) or
``interrupted`` (Ctrl-C, SIGTERM, a crash of the process that owned it). Every per-prompt result
is committed as soon as it is known, so nothing is lost on failure and ``resume`` replays only
the prompts that have no result (or an errored one). A ``running`` row whose owner process is
gone (same host), or whose owner stopped its heartbeat (any host: a container that died) is
reconciled to ``interrupted`` whenever runs are read: a crashed run is never reported as passed,
nor as still running.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kdtree_parity.results import PromptResult

RunStatus = Literal["running", "passed", "failed", "error", "interrupted"]
FINAL_STATUSES = ("passed", "failed", "error", "interrupted")
HEARTBEAT_S = 10.0  # how often a live run touches updated_at
STALE_AFTER_S = 120.0  # a running run untouched this long has lost its owner
VERDICT_TO_STATUS: dict[str, RunStatus] = {"pass": "passed", "fail": "failed", "error": "error"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    finished_at REAL,
    status TEXT NOT NULL,
    pair TEXT NOT NULL,
    prompts_total INTEGER NOT NULL,
    corpus_source TEXT NOT NULL,
    corpus_sha256 TEXT NOT NULL,
    corpus_jsonl BLOB NOT NULL,
    policy_source TEXT NOT NULL,
    policy_sha256 TEXT NOT NULL,
    policy_text TEXT NOT NULL,
    out_dir TEXT,
    verdict_json TEXT,
    error TEXT,
    owner_host TEXT NOT NULL,
    owner_pid INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS targets (
    run_id TEXT NOT NULL REFERENCES runs(id),
    role TEXT NOT NULL,
    url TEXT NOT NULL,
    identity_json TEXT,
    PRIMARY KEY (run_id, role)
);
CREATE TABLE IF NOT EXISTS identity_changes (
    run_id TEXT NOT NULL REFERENCES runs(id),
    role TEXT NOT NULL,
    at REAL NOT NULL,
    differences_json TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL REFERENCES runs(id),
    prompt_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    has_error INTEGER NOT NULL,
    result_json TEXT NOT NULL,
    PRIMARY KEY (run_id, prompt_id)
);
"""


@dataclass(frozen=True)
class RunRecord:
    """One row of ``runs`` plus its targets (role -> (url, identity))."""

    id: str
    status: RunStatus
    pair: str
    created_at: float
    updated_at: float
    finished_at: float | None
    prompts_total: int
    prompts_ok: int  # prompts with an error-free result
    corpus_source: str
    corpus_sha256: str
    corpus_jsonl: bytes
    policy_source: str
    policy_sha256: str
    policy_text: str
    out_dir: str | None
    verdict: dict[str, Any] | None
    error: str | None
    targets: dict[str, tuple[str, dict[str, Any] | None]]
    # Identity changes a resume accepted by explicit override: role, at, differences, before.
    identity_changes: tuple[dict[str, Any], ...] = ()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A SQLite database of runs. One instance per thread (sqlite3 connections are not shared)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def check_writable(self) -> None:
        """Raise sqlite3.Error now, not after a replay, when the database cannot take writes."""
        self._db.execute("BEGIN IMMEDIATE")
        self._db.execute("ROLLBACK")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def create_run(
        self,
        *,
        pair: str,
        targets: dict[str, str],
        prompts_total: int,
        corpus_source: str,
        corpus_sha256: str,
        corpus_jsonl: bytes,
        policy_source: str,
        policy_sha256: str,
        policy_text: str,
        out_dir: str | None,
        images: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT INTO runs (id, created_at, updated_at, status, pair, prompts_total,"
                " corpus_source, corpus_sha256, corpus_jsonl, policy_source, policy_sha256,"
                " policy_text, out_dir, owner_host, owner_pid)"
                " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    now,
                    now,
                    pair,
                    prompts_total,
                    corpus_source,
                    corpus_sha256,
                    corpus_jsonl,
                    policy_source,
                    policy_sha256,
                    policy_text,
                    out_dir,
                    socket.gethostname(),
                    os.getpid(),
                ),
            )
            db.executemany(
                "INSERT INTO targets (run_id, role, url, identity_json) VALUES (?, ?, ?, ?)",
                [
                    (
                        run_id,
                        role,
                        url,
                        json.dumps({"image": images[role]}) if role in (images or {}) else None,
                    )
                    for role, url in targets.items()
                ],
            )
        return run_id

    def claim_for_resume(self, run_id: str) -> RunRecord:
        """Take over a run that is not passed/failed: it becomes ``running`` under this process."""
        record = self.get_run(run_id)
        if record.status == "running":
            raise ValueError(f"run {run_id} is still running (owner process alive)")
        if record.status in ("passed", "failed"):
            raise ValueError(f"run {run_id} already finished as {record.status}; nothing to resume")
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET status='running', error=NULL, verdict_json=NULL,"
                " finished_at=NULL, updated_at=?, owner_host=?, owner_pid=? WHERE id=?",
                (time.time(), socket.gethostname(), os.getpid(), run_id),
            )
        return self.get_run(run_id)

    def set_identity(self, run_id: str, role: str, identity: dict[str, Any]) -> None:
        """Merge ``identity`` into what is recorded for the target (e.g. its image label)."""
        with self._tx() as db:
            row = db.execute(
                "SELECT identity_json FROM targets WHERE run_id=? AND role=?", (run_id, role)
            ).fetchone()
            merged = {**(json.loads(row[0]) if row and row[0] else {}), **identity}
            db.execute(
                "UPDATE targets SET identity_json=? WHERE run_id=? AND role=?",
                (json.dumps(merged, sort_keys=True), run_id, role),
            )

    def accept_identity_change(
        self, run_id: str, role: str, differences: list[str], identity: dict[str, Any]
    ) -> None:
        """Record that a resume went on with a target whose identity changed, then adopt it."""
        with self._tx() as db:
            row = db.execute(
                "SELECT identity_json FROM targets WHERE run_id=? AND role=?", (run_id, role)
            ).fetchone()
            before = row[0] if row else None
            db.execute(
                "INSERT INTO identity_changes (run_id, role, at, differences_json, before_json,"
                " after_json) VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, role, time.time(), json.dumps(differences), before,
                 json.dumps(identity, sort_keys=True)),
            )  # fmt: skip
            db.execute(
                "UPDATE targets SET identity_json=? WHERE run_id=? AND role=?",
                (json.dumps(identity, sort_keys=True), run_id, role),
            )

    def save_result(self, run_id: str, ordinal: int, result: PromptResult) -> None:
        """Commit one prompt's result (replacing an earlier errored one on resume)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO results (run_id, prompt_id, ordinal, has_error,"
                " result_json) VALUES (?, ?, ?, ?, ?)",
                (
                    run_id,
                    result.entry.id,
                    ordinal,
                    int(result.has_error),
                    json.dumps(result.to_json()),
                ),
            )
            db.execute("UPDATE runs SET updated_at=? WHERE id=?", (time.time(), run_id))

    def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        verdict: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        if status not in FINAL_STATUSES:
            raise ValueError(f"not a final status: {status}")
        now = time.time()
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET status=?, verdict_json=?, error=?, finished_at=?, updated_at=?"
                " WHERE id=?",
                (status, None if verdict is None else json.dumps(verdict), error, now, now, run_id),
            )

    def results(self, run_id: str, *, include_errors: bool = True) -> list[PromptResult]:
        rows = self._db.execute(
            "SELECT result_json FROM results WHERE run_id=?"
            + ("" if include_errors else " AND has_error=0")
            + " ORDER BY ordinal",
            (run_id,),
        ).fetchall()
        return [PromptResult.from_json(json.loads(row["result_json"])) for row in rows]

    def completed_prompt_ids(self, run_id: str) -> set[str]:
        """Prompts that need no replay on resume: those with an error-free result."""
        rows = self._db.execute(
            "SELECT prompt_id FROM results WHERE run_id=? AND has_error=0", (run_id,)
        ).fetchall()
        return {row["prompt_id"] for row in rows}

    def heartbeat(self, run_id: str) -> None:
        """Called every HEARTBEAT_S by the process executing the run."""
        self._db.execute(
            "UPDATE runs SET updated_at=? WHERE id=? AND status='running'", (time.time(), run_id)
        )

    def _reconcile(self) -> None:
        """Mark runs whose owner has gone as interrupted (dead pid here, or no heartbeat)."""
        host, now = socket.gethostname(), time.time()
        rows = self._db.execute(
            "SELECT id, owner_host, owner_pid, updated_at FROM runs WHERE status='running'"
        ).fetchall()
        for row in rows:
            if row["owner_host"] == host and row["owner_pid"] == os.getpid():
                continue
            if row["owner_host"] == host and not _pid_alive(row["owner_pid"]):
                why = f"owner process {row['owner_pid']} exited before the run finished"
            elif now - row["updated_at"] > STALE_AFTER_S:
                why = (
                    f"no heartbeat from {row['owner_host']}:{row['owner_pid']} for "
                    f"{now - row['updated_at']:.0f}s"
                )
            else:
                continue
            self.finish_run(row["id"], "interrupted", error=why)

    def mark_orphans_interrupted(self, reason: str) -> int:
        """At service start: every run this host left ``running`` was cut short."""
        rows = self._db.execute(
            "SELECT id FROM runs WHERE status='running' AND owner_host=?", (socket.gethostname(),)
        ).fetchall()
        for row in rows:
            self.finish_run(row["id"], "interrupted", error=reason)
        return len(rows)

    def get_run(self, run_id: str) -> RunRecord:
        self._reconcile()
        row = self._db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        return self._record(row)

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        self._reconcile()
        rows = self._db.execute(
            "SELECT * FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)
        ).fetchall()
        return [self._record(row) for row in rows]

    def _record(self, row: sqlite3.Row) -> RunRecord:
        targets = {
            t["role"]: (
                t["url"],
                None if t["identity_json"] is None else json.loads(t["identity_json"]),
            )
            for t in self._db.execute(
                "SELECT role, url, identity_json FROM targets WHERE run_id=?", (row["id"],)
            )
        }
        done = self._db.execute(
            "SELECT COUNT(*) FROM results WHERE run_id=? AND has_error=0", (row["id"],)
        ).fetchone()[0]
        changes = tuple(
            {
                "role": c["role"],
                "at": c["at"],
                "differences": json.loads(c["differences_json"]),
                "before": None if c["before_json"] is None else json.loads(c["before_json"]),
            }
            for c in self._db.execute(
                "SELECT role, at, differences_json, before_json FROM identity_changes"
                " WHERE run_id=? ORDER BY at",
                (row["id"],),
            )
        )
        return RunRecord(
            id=row["id"],
            status=row["status"],
            pair=row["pair"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            finished_at=row["finished_at"],
            prompts_total=row["prompts_total"],
            prompts_ok=done,
            corpus_source=row["corpus_source"],
            corpus_sha256=row["corpus_sha256"],
            corpus_jsonl=bytes(row["corpus_jsonl"]),
            policy_source=row["policy_source"],
            policy_sha256=row["policy_sha256"],
            policy_text=row["policy_text"],
            out_dir=row["out_dir"],
            verdict=None if row["verdict_json"] is None else json.loads(row["verdict_json"]),
            error=row["error"],
            targets=targets,
            identity_changes=changes,
        )
