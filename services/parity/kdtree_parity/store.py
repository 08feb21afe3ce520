"""SQLite persistence of runs: targets, corpus, policy, per-prompt results, status and verdict.

A run is ``running`` until it ends as ``passed``, ``failed``, ``error`` (could not decide) or
``interrupted`` (Ctrl-C, SIGTERM, a crash of the process that owned it). Every per-prompt result
is committed as soon as it is known, so nothing is lost on failure and ``resume`` replays only
the prompts that have no result (or an errored one).

Ownership holds across processes and hosts sharing one database file: a running run carries its
owner (a per-process id, host, pid) and a lease (``lease_expires_at``) that the owner renews
while it works. A run reads as ``interrupted`` only when its lease expired, or sooner when its
owner is a process in this pid namespace that no longer exists. Every write of a run's progress
checks that the writer still owns it (``LeaseLost`` otherwise), so an owner that lost its lease
can never mix its results into a run someone else resumed. Runs of a service pair are exclusive:
at most one runs per pair, decided inside one ``BEGIN IMMEDIATE`` transaction (``PairBusy``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import secrets
import socket
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar

from kdtree_parity.results import PromptResult
from kdtree_parity.targets import Targets

RunStatus = Literal["running", "passed", "failed", "error", "interrupted"]
FINAL_STATUSES = ("passed", "failed", "error", "interrupted")
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's lock
LEASE_S = 60.0  # default lease of a running run; the owner renews it every LEASE_S / 6
LEGACY_STALE_S = 120.0  # rows written before leases existed: stale this long after updated_at
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
    owner_pid INTEGER NOT NULL,
    owner_id TEXT,
    owner_ns TEXT,
    lease_expires_at REAL,
    exclusive INTEGER NOT NULL DEFAULT 0
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
# Columns added after the first release: ALTER TABLE adds them to older databases.
_ADDED_COLUMNS = {
    "owner_id": "TEXT",
    "owner_ns": "TEXT",
    "lease_expires_at": "REAL",
    "exclusive": "INTEGER NOT NULL DEFAULT 0",
}


class StoreError(RuntimeError):
    """The database cannot be used as asked (missing, not a run database, unreadable)."""


class LeaseLost(RuntimeError):
    """This process no longer owns the run (its lease expired and the run was taken over)."""


class PairBusy(RuntimeError):
    """A pair already has a live run; ``run_id`` names it."""

    def __init__(self, pair: str, run_id: str) -> None:
        super().__init__(f"pair {pair!r} already has a run in progress: {run_id}")
        self.pair = pair
        self.run_id = run_id


@dataclass(frozen=True)
class Owner:
    """Who executes a run: ``id`` is unique per process; ``namespace`` says where ``pid`` means
    this process (boot id and pid namespace), so a pid is only checked where it is meaningful."""

    id: str
    host: str
    pid: int
    namespace: str


@cache
def _owner_for(pid: int) -> Owner:
    host = socket.gethostname()
    return Owner(f"{host}:{pid}:{secrets.token_hex(6)}", host, pid, _pid_namespace())


def this_owner() -> Owner:
    """This process as a run owner (a new id after fork: the pid is part of the key)."""
    return _owner_for(os.getpid())


def _pid_namespace() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return f"host:{socket.gethostname()}"


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
    # By record key (``targets.RECORD_KEY``: the A/A twin is "aa", the baseline's URL when the
    # run has no replica): (url, identity).
    targets: dict[str, tuple[str, dict[str, Any] | None]]
    # Identity changes a resume accepted by explicit override: role, at, differences, before.
    identity_changes: tuple[dict[str, Any], ...] = ()

    def target_urls(self) -> dict[str, str]:
        """URL by record key, as the service's JSON and log events show them."""
        return {key: url for key, (url, _) in self.targets.items()}

    def as_targets(self) -> Targets:
        """The run's targets by role, with the image labels recorded for them."""
        return Targets.from_record(self.targets)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """A SQLite database of runs, used by one thread at a time (its connection is not shared by
    threads at once; ``AsyncStore`` serves it to async code from a thread of its own).

    ``read_only`` opens an existing database without writing anything (``list``, ``report``):
    a missing file is refused, and runs whose owner is gone read as interrupted without being
    rewritten. ``lease_s`` is how long the runs this process owns stay claimed without renewal.
    """

    def __init__(
        self, path: str | Path, *, read_only: bool = False, lease_s: float = LEASE_S
    ) -> None:
        if not lease_s > 0:
            raise ValueError(f"the lease must be a positive number of seconds, got {lease_s}")
        self.path = Path(path)
        self.read_only = read_only
        self.lease_s = lease_s
        self.owner = this_owner()
        if read_only:
            self._db = _connect_read_only(self.path)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
        self._db.row_factory = sqlite3.Row
        try:
            if read_only:
                tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master")}
                if "runs" not in tables:
                    raise StoreError(f"{self.path} is not a kdtree-parity run database")
            else:
                _enable_wal(self._db)
                self._db.execute("PRAGMA foreign_keys=ON")
                self._db.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
                self._migrate()
        except BaseException:
            self._db.close()
            raise

    @property
    def heartbeat_s(self) -> float:
        """How often an owner renews its lease: six chances before it expires."""
        return self.lease_s / 6

    def _migrate(self) -> None:
        with self._tx() as db:
            have = {r[1] for r in db.execute("PRAGMA table_info(runs)")}
            for name, kind in _ADDED_COLUMNS.items():
                if name not in have:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {name} {kind}")

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

    def _claim_values(self, now: float) -> tuple[str, int, str, str, float]:
        o = self.owner
        return o.host, o.pid, o.id, o.namespace, now + self.lease_s

    def _busy_run(self, db: sqlite3.Connection, pair: str, now: float) -> str | None:
        """The live run of ``pair`` (inside a transaction), expiring the dead ones first."""
        for row in db.execute(
            "SELECT * FROM runs WHERE pair=? AND status='running' AND exclusive=1", (pair,)
        ).fetchall():
            why = _dead_reason(row, now)
            if why is None:
                return row["id"]
            _expire(db, row, why, now)
        return None

    def _assert_owner(self, db: sqlite3.Connection, run_id: str) -> None:
        row = db.execute("SELECT status, owner_id FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        if row["status"] != "running" or row["owner_id"] != self.owner.id:
            raise LeaseLost(
                f"run {run_id} is no longer owned by this process ({self.owner.id}): it is "
                f"{row['status']} under {row['owner_id']}"
            )

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
        exclusive: bool = False,
    ) -> str:
        """Record a new ``running`` run owned by this process. ``exclusive``: refuse (PairBusy)
        while ``pair`` has another live exclusive run, decided in the same transaction."""
        run_id = run_id or new_run_id()
        now = time.time()
        with self._tx() as db:
            if exclusive and (busy := self._busy_run(db, pair, now)):
                raise PairBusy(pair, busy)
            db.execute(
                "INSERT INTO runs (id, created_at, updated_at, status, pair, prompts_total,"
                " corpus_source, corpus_sha256, corpus_jsonl, policy_source, policy_sha256,"
                " policy_text, out_dir, owner_host, owner_pid, owner_id, owner_ns,"
                " lease_expires_at, exclusive)"
                " VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    *self._claim_values(now),
                    int(exclusive),
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
        """Take over a run that is not passed/failed and whose owner is gone: it becomes
        ``running`` under this process. Checked and claimed in one transaction, so two resumes
        (or a resume and a live owner) never both get it."""
        now = time.time()
        with self._tx() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                raise KeyError(run_id)
            if row["status"] == "running":
                why = _dead_reason(row, now)
                if why is None:
                    raise ValueError(
                        f"run {run_id} is still running (owner {row['owner_host']}:"
                        f"{row['owner_pid']}, its lease holds for another "
                        f"{_lease_end(row) - now:.0f}s)"
                    )
                _expire(db, row, why, now)
            elif row["status"] in ("passed", "failed"):
                raise ValueError(
                    f"run {run_id} already finished as {row['status']}; nothing to resume"
                )
            if row["exclusive"] and (busy := self._busy_run(db, row["pair"], now)):
                raise ValueError(f"pair {row['pair']!r} has another run in progress: {busy}")
            db.execute(
                "UPDATE runs SET status='running', error=NULL, verdict_json=NULL,"
                " finished_at=NULL, updated_at=?, owner_host=?, owner_pid=?, owner_id=?,"
                " owner_ns=?, lease_expires_at=? WHERE id=?",
                (now, *self._claim_values(now), run_id),
            )
        return self.get_run(run_id)

    def set_identity(self, run_id: str, role: str, identity: dict[str, Any]) -> None:
        """Merge ``identity`` into what is recorded for the target (e.g. its image label)."""
        with self._tx() as db:
            self._assert_owner(db, run_id)
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
            self._assert_owner(db, run_id)
            row = db.execute(
                "SELECT identity_json FROM targets WHERE run_id=? AND role=?", (run_id, role)
            ).fetchone()
            before = row[0] if row else None
            db.execute(
                "INSERT INTO identity_changes (run_id, role, at, differences_json, before_json,"
                " after_json) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    role,
                    time.time(),
                    json.dumps(differences),
                    before,
                    json.dumps(identity, sort_keys=True),
                ),
            )
            db.execute(
                "UPDATE targets SET identity_json=? WHERE run_id=? AND role=?",
                (json.dumps(identity, sort_keys=True), run_id, role),
            )

    def save_result(self, run_id: str, ordinal: int, result: PromptResult) -> None:
        """Commit one prompt's result (replacing an earlier errored one on resume); LeaseLost
        when this process no longer owns the run."""
        with self._tx() as db:
            self._assert_owner(db, run_id)
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
            now = time.time()
            db.execute(
                "UPDATE runs SET updated_at=?, lease_expires_at=? WHERE id=?",
                (now, now + self.lease_s, run_id),
            )

    def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        verdict: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """End a run this process owns (LeaseLost otherwise)."""
        if status not in FINAL_STATUSES:
            raise ValueError(f"not a final status: {status}")
        now = time.time()
        with self._tx() as db:
            self._assert_owner(db, run_id)
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
        """Renew this process's lease on ``run_id`` (every ``heartbeat_s``); LeaseLost when the
        run is no longer ours."""
        now = time.time()
        with self._tx() as db:
            self._assert_owner(db, run_id)
            db.execute(
                "UPDATE runs SET updated_at=?, lease_expires_at=? WHERE id=?",
                (now, now + self.lease_s, run_id),
            )

    def _reconcile(self) -> None:
        """Mark runs whose owner has gone as interrupted (lease expired, or a dead pid here).
        A read-only store leaves the rows alone; ``_record`` shows them interrupted anyway."""
        if self.read_only:
            return
        now = time.time()
        dead = [
            row["id"]
            for row in self._db.execute("SELECT * FROM runs WHERE status='running'").fetchall()
            if _dead_reason(row, now) is not None
        ]
        if not dead:
            return
        with self._tx() as db:
            for run_id in dead:  # re-read inside the transaction: it may have been renewed
                row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
                if row["status"] == "running" and (why := _dead_reason(row, now)):
                    _expire(db, row, why, now)

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
        status, error = row["status"], row["error"]
        if status == "running" and (why := _dead_reason(row, time.time())):
            status, error = "interrupted", why  # a read-only store cannot record it
        return RunRecord(
            id=row["id"],
            status=status,
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
            error=error,
            targets=targets,
            identity_changes=changes,
        )


def _row_get(row: sqlite3.Row, key: str) -> Any:
    return row[key] if key in row.keys() else None  # noqa: SIM118 (sqlite3.Row has no __contains__ by key)


def _lease_end(row: sqlite3.Row) -> float:
    end = _row_get(row, "lease_expires_at")
    return row["updated_at"] + LEGACY_STALE_S if end is None else end


def _dead_reason(row: sqlite3.Row, now: float) -> str | None:
    """Why a ``running`` row's owner is gone, or None while its lease holds."""
    if _row_get(row, "owner_ns") == this_owner().namespace and not _pid_alive(row["owner_pid"]):
        return f"owner process {row['owner_pid']} exited before the run finished"
    if now > _lease_end(row):
        return (
            f"the lease of {row['owner_host']}:{row['owner_pid']} expired "
            f"{now - _lease_end(row):.0f}s ago (no heartbeat)"
        )
    return None


def _expire(db: sqlite3.Connection, row: sqlite3.Row, why: str, now: float) -> None:
    """Inside a transaction: the dead owner's run becomes interrupted (if nothing changed)."""
    db.execute(
        "UPDATE runs SET status='interrupted', error=?, finished_at=?, updated_at=?"
        " WHERE id=? AND status='running' AND owner_id IS ?",
        (why, now, now, row["id"], _row_get(row, "owner_id")),
    )


P = ParamSpec("P")
T = TypeVar("T")


class AsyncStore:
    """A ``Store`` for async code: every call runs on one thread of its own.

    SQLite calls block (a write may wait ``BUSY_TIMEOUT_S`` on another process's lock), so they
    stay off the event loop; and one thread uses the connection in turn, so calls from several
    tasks (a run's prompts, its heartbeat, the service's endpoints) never overlap.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parity-store")

    @property
    def heartbeat_s(self) -> float:
        return self.store.heartbeat_s

    async def call(
        self, work: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``work(store, *args, **kwargs)`` on the store's thread."""
        job = functools.partial(work, self.store, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, job)

    def shutdown(self) -> None:
        """Wait for the calls in flight and end the thread; the store stays open."""
        self._executor.shutdown()

    def close(self) -> None:
        """Shut down, then close the store."""
        self.shutdown()
        self.store.close()


def _enable_wal(db: sqlite3.Connection) -> None:
    """Switch the database to WAL, waiting out other processes doing the same.

    WAL is a property of the file, so only its first opener changes it, and the change needs
    the exclusive lock. When several processes create one database at once, SQLite answers all
    but one "database is locked" without calling the busy handler (it would otherwise deadlock
    them), so the wait is here.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """Open an existing database without creating or writing anything. In a read-only
    directory a WAL database whose -wal file is gone (nobody has it open for writing) cannot
    create its -shm file; it is then opened as immutable."""
    if not path.is_file():
        raise StoreError(f"no run database at {path}")
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    db = sqlite3.connect(uri + "?mode=ro", uri=True, timeout=30)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        db.close()
        if Path(f"{path}-wal").exists():
            raise
    db = sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True)
    db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return db
