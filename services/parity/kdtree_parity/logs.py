"""The parity service's log: JSON lines on stderr, one object per line.

Every line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``; uvicorn's own
lines (startup, access) come out the same way. Run events are logged on ``kdtree_parity.service``
with ``message`` = the event and its fields beside it:

- ``run_started``: ``run_id``, ``pair``, ``prompts``, ``corpus``, ``corpus_sha256``, ``policy``,
  ``targets`` (role -> URL);
- ``run_progress``: ``run_id``, ``done``, ``total``, ``classes`` (prompts so far by
  candidate-vs-baseline class), ``request_errors``; at most every ``PROGRESS_EVERY_S`` seconds,
  and once all prompts are done;
- ``run_finished``: ``run_id``, ``status`` (passed, failed, error, interrupted), ``verdict``
  (pass, fail, error or null), ``reasons`` (the rules that did not pass: ``rule``, ``outcome``,
  ``message``), ``error``, ``report`` (the report.json path, or null) and ``duration_s``.
"""

from __future__ import annotations

import logging
from typing import Any

EVENTS = logging.getLogger("kdtree_parity.service")
PROGRESS_EVERY_S = 5.0


def event(name: str, **fields: Any) -> None:
    """Log run event ``name`` with ``fields`` (JSON-serialisable values)."""
    EVENTS.info(name, extra=fields)


def log_config(level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` (uvicorn's ``log_config``) writing JSON lines to stderr."""
    # Only the service's own process needs the formatter (its module loads lazily, so a GPU
    # machine's payload without it can still run the gate from the command line).
    from pythonjsonlogger.core import RESERVED_ATTRS

    handler = {"handlers": ["stderr"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": "{levelname}{name}{message}",
                "style": "{",
                "timestamp": "time",
                "rename_fields": {"levelname": "level", "name": "logger"},
                # A LogRecord's own attributes, and uvicorn's coloured copy of its message,
                # are not fields of the line.
                "reserved_attrs": [*RESERVED_ATTRS, "taskName", "color_message"],
            }
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "json",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {"uvicorn": handler, "uvicorn.access": handler, "kdtree_parity": handler},
    }
