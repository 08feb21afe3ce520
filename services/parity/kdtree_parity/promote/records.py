"""Promotion records: what was promoted, refused or rolled back, and the directory that keeps them.

A record is one JSON file, ``promotions/NNNN-<action>-<digest12>.json``, schema
``kdtree.promotion/v1`` (docs/operations.md, "Records"). The records are the history: the stable
digest is the top of a stack that ``promote`` pushes and ``rollback`` pops (``refused`` leaves it
alone). A record appears whole under its name or not at all, and is never rewritten.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from kdtree_parity.promote.errors import PromotionError

RECORD_SCHEMA = "kdtree.promotion/v1"
STABLE_TAG = "stable"
_RECORD_NAME = re.compile(r"^(\d{4,})-(promote|rollback|refused)-[0-9a-f]{12}\.json$")


class _RecordPart(BaseModel):
    # A record is written once and read back as it was: an unknown or missing key is an error.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ImageSide(_RecordPart):
    """An image reference and the image id it named when the gate ran."""

    ref: str
    digest: str


class PromotedCandidate(ImageSide):
    repo_digests: list[str] = Field(
        description="the registry's image@sha256 names after a push (empty without one)"
    )


class SourceState(_RecordPart):
    revision: str
    dirty: bool = Field(description="the image was built with uncommitted changes")


class GateSummary(_RecordPart):
    """What the gate said, and which report, corpus and policy it said it from."""

    run_id: str
    verdict: Literal["pass", "fail", "error"]
    exit_code: int
    reasons: list[str]
    report: str = Field(description="path of the report.json the verdict was read from")
    report_sha256: str
    corpus_sha256: str
    # The report's policy section as it was then, not re-validated against today's policy rules:
    # an old record must stay readable when those rules change.
    policy: dict[str, Any]


class _Record(_RecordPart):
    record_schema: Literal["kdtree.promotion/v1"] = Field(RECORD_SCHEMA, alias="schema")
    sequence: int | None = Field(None, description="assigned by RecordStore.write")
    time: str = Field(description="UTC, YYYY-MM-DDTHH:MM:SSZ")
    digest: str = Field(description="the image id the action is about")

    def to_json(self) -> str:
        """The record's file text (an unassigned sequence is left out)."""
        data = self.model_dump(
            mode="json", by_alias=True, exclude={"sequence"} if self.sequence is None else None
        )
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


class _GatedRecord(_Record):
    image: str
    candidate: ImageSide
    baseline: ImageSide
    source: SourceState
    gate: GateSummary


class PromoteRecord(_GatedRecord):
    """The gate passed and ``stable`` moved to ``digest``."""

    action: Literal["promote"] = "promote"
    tag: str = STABLE_TAG
    previous_digest: str | None
    pushed: bool
    candidate: PromotedCandidate


class RefusedRecord(_GatedRecord):
    """The gate said fail or error; ``stable`` stayed where it was."""

    action: Literal["refused"] = "refused"
    stable_digest: str | None


class RollbackRecord(_Record):
    """``stable`` was pointed back at ``digest``, the digest stable before ``from_digest``."""

    action: Literal["rollback"] = "rollback"
    image: str
    tag: str = STABLE_TAG
    from_digest: str
    pushed: bool
    repo_digests: list[str]
    reason: str


PromotionRecord = Annotated[
    PromoteRecord | RefusedRecord | RollbackRecord, Field(discriminator="action")
]
_PROMOTION_RECORD: TypeAdapter[PromotionRecord] = TypeAdapter(PromotionRecord)


def record_from_json(text: str) -> PromotionRecord:
    """A record from its file text; raises ValueError (json's or pydantic's) when it is not one."""
    return _PROMOTION_RECORD.validate_python(json.loads(text))


@dataclass(frozen=True)
class RecordStore:
    """The promotions/ directory: numbered, append-only JSON records."""

    directory: Path

    def records(self) -> list[PromotionRecord]:
        """All records in sequence order; a malformed one is an error, never silently skipped."""
        if not self.directory.is_dir():
            return []
        found: list[tuple[int, PromotionRecord]] = []
        for path in self.directory.iterdir():
            match = _RECORD_NAME.match(path.name)
            if not match:
                continue
            try:
                record = record_from_json(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise PromotionError(f"promotion record {path} is unreadable: {exc}") from exc
            except ValidationError as exc:
                raise PromotionError(
                    f"promotion record {path} is not a {RECORD_SCHEMA} record: {exc}"
                ) from exc
            found.append((int(match.group(1)), record))
        found.sort(key=lambda item: item[0])
        sequences = [seq for seq, _ in found]
        if len(set(sequences)) != len(sequences):
            raise PromotionError(
                f"two promotion records share a sequence number in {self.directory}"
            )
        return [record for _, record in found]

    def stable_history(self) -> list[str]:
        """Digests that were stable, oldest first; the last one is stable now (a refused
        candidate never was)."""
        stack: list[str] = []
        for record in self.records():
            if isinstance(record, PromoteRecord):
                stack.append(record.digest)
            elif isinstance(record, RollbackRecord):
                if not stack or stack[-1] != record.from_digest:
                    raise PromotionError(
                        f"rollback record {record.sequence} does not follow the history"
                    )
                stack.pop()
        return stack

    def write(self, record: PromotionRecord) -> Path:
        """Add ``record`` under the next sequence number; an existing file is never replaced.

        The text goes to a hidden temporary file first, is flushed to disk, and is then linked
        under its final name, which fails if that name exists: a reader sees the whole record or
        none, even when the write is interrupted or the disk fills up.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        existing = [self._sequence(p.name) for p in self.directory.iterdir()]
        sequence = max([s for s in existing if s is not None], default=0) + 1
        record = record.model_copy(update={"sequence": sequence})
        name = f"{sequence:04d}-{record.action}-{record.digest.removeprefix('sha256:')[:12]}"
        path = self.directory / f"{name}.json"
        descriptor, temporary = tempfile.mkstemp(prefix=f".{name}.", dir=self.directory)
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                os.fchmod(handle.fileno(), 0o644)  # mkstemp's 0600 would hide it from others
                handle.write(record.to_json())
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, path)  # exclusive: never overwrite
        except FileExistsError as exc:
            raise PromotionError(f"{path} already exists; records are never overwritten") from exc
        finally:
            os.unlink(temporary)
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return path

    @staticmethod
    def _sequence(name: str) -> int | None:
        match = _RECORD_NAME.match(name)
        return int(match.group(1)) if match else None
