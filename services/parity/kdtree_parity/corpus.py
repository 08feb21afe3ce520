"""The replay corpus: a JSONL file of prompts, validated line by line.

One JSON object per line::

    {"id": "code-001", "text": "def fib(n):", "max_new_tokens": 32, "tags": ["code"]}
    {"id": "ids-001", "input_ids": [256, 72, 105]}
    {"id": "chat-001", "messages": [{"role": "user", "content": "Name three primes."}]}

``id`` (unique, non-empty string) and exactly one of ``text`` (non-empty string), ``input_ids``
(non-empty list of non-negative ints) or ``messages`` (OpenAI chat format: a non-empty list of
``{"role": ..., "content": ...}`` whose content is a string or a list of ``{"type": "text",
"text": ...}`` parts; replayed through ``/v1/chat/completions``, so the server applies its own
chat template) are required; the three kinds may mix in one corpus; ``max_new_tokens`` (positive int) and
``tags`` (list of strings) are optional. Blank lines are skipped. Strings must be valid Unicode
(a JSON escape of a lone surrogate such as ``"\ud800"`` cannot be sent as UTF-8), and a line
nested deeper than Python's JSON parser can follow is refused. Every problem in the file is
reported at once, each with its line number, so a broken corpus is fixed in one pass.

The shipped corpora live in ``kdtree_parity/corpora`` (package data): ``default`` (>= 200 prompts:
code, math, prose, several languages, a few long ones) and ``short`` (sized for the CPU reference
engine). ``long`` is not a file: it is generated when loaded (``long_corpus.py``, a fixed seed):
the default corpus plus retrieval prompts in context-length buckets up to 200k. A corpus
argument is either a path or one of those names.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

# Generous but finite: a corpus entry asking for more is almost certainly a typo.
MAX_NEW_TOKENS_LIMIT = 32768
ALLOWED_KEYS = frozenset({"id", "text", "input_ids", "messages", "max_new_tokens", "tags"})
PROMPT_KEYS = ("text", "input_ids", "messages")
# Roles of OpenAI's chat format that SGLang 0.5.23's ChatCompletionRequest accepts.
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# A generous bound on what a chat template adds around one message (role markers, separators).
CHAT_TEMPLATE_TOKENS = 64
BUILTIN_CORPORA = ("default", "short", "long")
GENERATED_CORPORA = frozenset({"long"})


class CorpusError(ValueError):
    """A corpus that cannot be used; ``problems`` holds (line number, message) pairs."""

    def __init__(self, source: str, problems: list[tuple[int, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  {source}:{line}: {message}" for line, message in problems)
        super().__init__(f"corpus {source} has {len(problems)} problem(s):\n{lines}")


@dataclass(frozen=True)
class CorpusEntry:
    """One prompt to replay against every target."""

    id: str
    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    max_new_tokens: int | None = None
    tags: tuple[str, ...] = ()
    line: int = 0
    # OpenAI chat messages, each a dict as the corpus gives it (a tuple: the entry stays frozen).
    messages: tuple[dict[str, Any], ...] | None = None

    @property
    def is_chat(self) -> bool:
        """Replayed through /v1/chat/completions (the server applies its chat template)."""
        return self.messages is not None

    @property
    def max_prompt_tokens(self) -> int:
        """An upper bound of the prompt's length in tokens, before any target sees it: the ids
        themselves, else the UTF-8 bytes (no byte-level tokenizer makes more tokens than bytes)
        plus a BOS; a chat message is allowed CHAT_TEMPLATE_TOKENS more for the template."""
        if self.input_ids is not None:
            return len(self.input_ids)
        if self.text is not None:
            return len(self.text.encode("utf-8")) + 1
        return 1 + sum(
            len(_message_text(m).encode("utf-8")) + CHAT_TEMPLATE_TOKENS
            for m in self.messages or ()
        )

    def to_json(self) -> dict[str, Any]:
        """The entry as it appears in the corpus (without the line number)."""
        out: dict[str, Any] = {"id": self.id}
        if self.text is not None:
            out["text"] = self.text
        if self.input_ids is not None:
            out["input_ids"] = list(self.input_ids)
        if self.messages is not None:
            out["messages"] = [dict(m) for m in self.messages]
        if self.max_new_tokens is not None:
            out["max_new_tokens"] = self.max_new_tokens
        if self.tags:
            out["tags"] = list(self.tags)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], line: int = 0) -> CorpusEntry:
        """Inverse of to_json for entries that were validated before they were stored."""
        return cls(
            id=data["id"],
            text=data.get("text"),
            input_ids=tuple(data["input_ids"]) if "input_ids" in data else None,
            max_new_tokens=data.get("max_new_tokens"),
            tags=tuple(data.get("tags", ())),
            line=line,
            messages=tuple(data["messages"]) if "messages" in data else None,
        )

    @property
    def prompt_preview(self) -> str:
        """A short human-readable form of the prompt for reports."""
        if self.text is not None:
            return self.text
        if self.messages is not None:
            return "\n".join(f"{m['role']}: {_message_text(m)}" for m in self.messages)
        return "input_ids: " + " ".join(str(t) for t in (self.input_ids or ()))


def _message_text(message: dict[str, Any]) -> str:
    """A chat message's text: its string content, or its text parts joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or ())


def _message_problem(index: int, message: Any) -> str | None:
    """Why ``message`` is not an OpenAI chat message the gate can replay, or None."""
    where = f"'messages'[{index}]"
    if not isinstance(message, dict):
        return f"{where} must be an object with 'role' and 'content'"
    if message.get("role") not in CHAT_ROLES:
        return f"{where}.role must be one of {', '.join(sorted(CHAT_ROLES))}"
    content = message.get("content")
    if isinstance(content, str):
        return None
    parts_ok = (
        isinstance(content, list)
        and content
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    )
    if not parts_ok:
        return f"{where}.content must be a string or a list of {{'type': 'text', 'text': ...}}"
    return None


@dataclass(frozen=True)
class Corpus:
    """A validated corpus and the sha256 of its exact bytes (reports are bound to it)."""

    source: str
    sha256: str
    entries: tuple[CorpusEntry, ...] = field(default_factory=tuple)
    raw: bytes = b""  # the exact bytes hashed: stored with a run so resume replays the same

    def __len__(self) -> int:
        return len(self.entries)


def _not_unicode(key: str, value: Any) -> str | None:
    """A problem when a string of the entry cannot be encoded (a lone surrogate from JSON)."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (
                    f"{key!r} is not valid Unicode: lone surrogate "
                    f"{text[exc.start]!r} at character {exc.start}"
                )
    return None


def _validate_entry(obj: Any, line: int) -> tuple[CorpusEntry | None, list[str]]:
    problems: list[str] = []
    if not isinstance(obj, dict):
        return None, [f"expected a JSON object, got {type(obj).__name__}"]
    problems += [p for key in sorted(obj) if (p := _not_unicode(key, obj[key]))]
    if problems:
        return None, problems
    unknown = sorted(set(obj) - ALLOWED_KEYS)
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ALLOWED_KEYS))}"
        )
    entry_id = obj.get("id")
    if not isinstance(entry_id, str) or not entry_id.strip():
        problems.append("'id' must be a non-empty string")
    has_text, has_ids, has_messages = (key in obj for key in PROMPT_KEYS)
    if has_text + has_ids + has_messages != 1:
        problems.append("exactly one of 'text', 'input_ids' or 'messages' is required")
    messages = obj.get("messages")
    if has_messages:
        if not isinstance(messages, list) or not messages:
            problems.append("'messages' must be a non-empty list of chat messages")
        else:
            problems += [p for i, m in enumerate(messages) if (p := _message_problem(i, m))]
    text = obj.get("text")
    if has_text and (not isinstance(text, str) or not text):
        problems.append("'text' must be a non-empty string")
    input_ids = obj.get("input_ids")
    if has_ids and (
        not isinstance(input_ids, list)
        or not input_ids
        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in input_ids)
    ):
        problems.append("'input_ids' must be a non-empty list of non-negative integers")
    max_new = obj.get("max_new_tokens")
    if "max_new_tokens" in obj and (
        not isinstance(max_new, int)
        or isinstance(max_new, bool)
        or not 1 <= max_new <= MAX_NEW_TOKENS_LIMIT
    ):
        problems.append(f"'max_new_tokens' must be an integer in 1..{MAX_NEW_TOKENS_LIMIT}")
    tags = obj.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        problems.append("'tags' must be a list of non-empty strings")
    if problems:
        return None, problems
    return (
        CorpusEntry(
            id=entry_id,
            text=text if has_text else None,
            input_ids=tuple(input_ids) if has_ids else None,
            max_new_tokens=max_new,
            tags=tuple(tags),
            line=line,
            messages=tuple(messages) if has_messages else None,
        ),
        [],
    )


class DuplicateKey(ValueError):
    """A JSON object of a corpus line names a key twice (json keeps the last, silently)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"duplicate key {key!r} in one JSON object")
        out[key] = value
    return out


def parse_corpus(data: bytes, source: str = "<corpus>") -> Corpus:
    """Validate JSONL bytes; raises CorpusError listing every problem with its line number."""
    problems: list[tuple[int, str]] = []
    try:
        content = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CorpusError(source, [(line, f"not valid UTF-8: {exc.reason}")]) from None
    entries: list[CorpusEntry] = []
    first_line_of: dict[str, int] = {}
    # JSON Lines end at "\n" (or "\r\n") only: str.splitlines would also split inside a prompt
    # at U+2028, U+0085 and other separators, which JSON strings may hold unescaped.
    for number, raw in enumerate(content.split("\n"), start=1):
        raw = raw.removesuffix("\r")
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:
            problems.append((number, f"invalid JSON: {exc.msg} (column {exc.colno})"))
            continue
        except DuplicateKey as exc:
            problems.append((number, str(exc)))
            continue
        except RecursionError:
            problems.append((number, "invalid JSON: nested too deeply"))
            continue
        entry, entry_problems = _validate_entry(obj, number)
        problems.extend((number, p) for p in entry_problems)
        if entry is None:
            continue
        if entry.id in first_line_of:
            problems.append(
                (number, f"duplicate id {entry.id!r} (first on line {first_line_of[entry.id]})")
            )
            continue
        first_line_of[entry.id] = number
        entries.append(entry)
    if not entries and not problems:
        problems.append((1, "the corpus has no entries"))
    if problems:
        raise CorpusError(source, problems)
    return Corpus(
        source=source, sha256=hashlib.sha256(data).hexdigest(), entries=tuple(entries), raw=data
    )


def builtin_corpus_path(name: str) -> Path:
    """Filesystem path of a shipped corpus file (``default`` or ``short``)."""
    if name not in BUILTIN_CORPORA or name in GENERATED_CORPORA:
        raise CorpusError(name, [(0, f"unknown built-in corpus; choose {BUILTIN_CORPORA}")])
    return Path(str(resources.files("kdtree_parity") / "corpora" / f"{name}.jsonl"))


def load_corpus(spec: str | Path) -> Corpus:
    """Load a corpus from a path, or a shipped one by name (a path wins if it exists)."""
    path = Path(spec)
    if not path.exists() and str(spec) in GENERATED_CORPORA:
        from kdtree_parity.long_corpus import long_corpus_jsonl  # it reads the shipped ones

        return parse_corpus(long_corpus_jsonl(), source=str(spec))
    if not path.exists() and str(spec) in BUILTIN_CORPORA:
        path = builtin_corpus_path(str(spec))
    if not path.is_file():
        raise CorpusError(str(spec), [(0, "no such file (and not a built-in corpus name)")])
    return parse_corpus(path.read_bytes(), source=str(path))
