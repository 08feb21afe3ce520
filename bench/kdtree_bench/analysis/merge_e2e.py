#!/usr/bin/env python3
"""Fold the ``speed.json`` files of ``bench/kdtree_bench/e2e/sglang_e2e.py`` runs into the committed record.

The committed record (``bench/results/sglang_e2e_h200.json``) keeps one row per measured
configuration and shape, and each row says which run measured it (``run``) and where its server
log is (``log``: ``RUN/speed.tar.xz:speed/server_NAME.log``, the archive ``bench/sglang_gpu.sh``
brings back). A new run's rows replace the rows that measured the same thing; every other row
stays as it was, with its own run and log, and so do the record's other keys.

The same thing is the same ``ROW_KEY``: model preset, speculative family and draft shape
(DFlash's draft window and the draft model's attention backend too, where one was set), KV dtype, configuration (off, on, ...), batch,
prompt length, new tokens, decode-graph batch sizes, tensor parallelism, and any further SGLang
arguments the run gave every server (``--server-arg``, e.g. another draft attention backend).
Rows written before those fields existed were EAGLE tree runs with a bf16 KV cache at TP 1, and
are keyed as such (``LEGACY``).

The configurations of one shape (the key less ``configuration``) are read against each other (on
against off), so they come from one run, measured together with alternating order. A run that
measures only some of a shape's configurations would leave its rows beside another run's: the
merge refuses that and names the shape, unless ``--drop-stale`` says to drop the older runs' rows
of that shape (a diagnostic run, such as two of the modes again, is better left unmerged).

A run cut before it wrote its ``speed.json`` (a device command's time limit) is merged from its
log instead, ``RUN=path/speed.log``: the records it printed as it measured them (``[e2e] {...}``
lines) and its servers' start times; its ``runs`` entry says ``from_log``.

A run measured by an older method, or on a grid a newer run replaces, leaves the record with
``--retire RUN``: its rows, failed records and ``runs`` entry go, and ``retired`` names it (the
run's archive can then leave the tree; git history keeps it).

Usage:
    python -m kdtree_bench.analysis.merge_e2e RECORD [RUN=SPEED_JSON|SPEED_LOG ...] [--retire RUN ...]
                              [--drop-stale] [--log-archive FMT]
e.g. ``python -m kdtree_bench.analysis.merge_e2e bench/results/sglang_e2e_h200.json run9=/tmp/out/speed.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kdtree_bench.cli import name_and_path
from kdtree_bench.e2e.sglang_e2e import records_in_log
from kdtree_bench.e2e.sglang_servers import READY_LINE

ROW_KEY = (
    "model",
    "spec",
    "speculation",
    "draft_window",
    "draft_attention",
    "budget",
    "kv_dtype",
    "configuration",
    "batch",
    "prompt_len",
    "new_tokens",
    "graph_max_bs",
    "tp",
    "extra_args",
)
SHAPE_KEY = tuple(k for k in ROW_KEY if k != "configuration")
"""The rows of one shape: its configurations are compared with each other."""
LEGACY = {"spec": "eagle", "speculation": "tree", "kv_dtype": "bfloat16", "tp": 1}
"""What a row without these fields measured: every run before they were recorded."""
DROPPED = ("server", "output_ids_head")
"""Per-run detail a committed row leaves in the run's own speed.json."""
LOG_ARCHIVE = "{run}/speed.tar.xz:speed/{log}"


class MergeError(ValueError):
    """A speed.json or record that cannot be merged (one line)."""


def row_key(row: dict[str, Any], fields: tuple[str, ...] = ROW_KEY) -> tuple:
    return tuple(row.get(k, LEGACY.get(k)) for k in fields)


def describe_shape(row: dict[str, Any]) -> str:
    """A shape as a person names it: ``rank dflash fp8_e4m3 8x1024`` and what else sets it apart."""
    fields = dict(zip(SHAPE_KEY, row_key(row, SHAPE_KEY), strict=True))
    words = [str(fields[k]) for k in ("model", "spec", "kv_dtype")]
    words.append(f"{fields['batch']}x{fields['prompt_len']}")
    if fields["draft_window"] is not None:
        words.append(f"draft window {fields['draft_window']}")
    if fields["budget"] is not None:
        words.append(f"budget {fields['budget']}")
    if fields["extra_args"]:
        words.append(f"({fields['extra_args']})")
    return " ".join(words)


def mixed_shapes(rows: list[dict[str, Any]], runs: set[str]) -> dict[tuple, list[dict]]:
    """The shapes that ``runs`` measured whose rows come from more than one run."""
    by_shape: dict[tuple, list[dict]] = {}
    for row in rows:
        by_shape.setdefault(row_key(row, SHAPE_KEY), []).append(row)
    return {
        shape: shape_rows
        for shape, shape_rows in by_shape.items()
        if len({r.get("run") for r in shape_rows}) > 1
        and any(r.get("run") in runs for r in shape_rows)
    }


def mixed_error(mixed: dict[tuple, list[dict]], hint: str) -> MergeError:
    shapes = []
    for shape_rows in mixed.values():
        by_run: dict[str, list[str]] = {}
        for row in shape_rows:
            by_run.setdefault(str(row.get("run")), []).append(str(row["configuration"]))
        runs = "; ".join(f"{run}: {', '.join(c)}" for run, c in by_run.items())
        shapes.append(f"{describe_shape(shape_rows[0])} ({runs})")
    return MergeError(
        f"a shape's configurations would come from different runs: {' | '.join(shapes)}; {hint}"
    )


def committed_row(record: dict[str, Any], run: str, log_archive: str = LOG_ARCHIVE) -> dict:
    """A speed.json record in the committed row format, tagged with its run."""
    missing = [
        k for k in ("model", "spec", "kv_dtype", "configuration", "batch") if k not in record
    ]
    if missing:
        raise MergeError(f"{run}: a record lacks {missing}; was it written by sglang_e2e.py?")
    server = record.get("server", {})
    row = {k: v for k, v in record.items() if k not in DROPPED}
    row.update(
        speculation=server.get("speculation", LEGACY["speculation"]),
        graph_max_bs=server.get("graph_max_bs"),
        tp=server.get("tp", LEGACY["tp"]),
        run=run,
        log=log_archive.format(run=run, log=record.get("log", "")),
    )
    if "budget" in server:
        row["budget"] = server["budget"]
        row["draft"] = server.get("draft")
    if "block_size" in server:
        row["block_size"] = server["block_size"]
        row["draft"] = server.get("draft")
        if server.get("draft_window") is not None:
            row["draft_window"] = server["draft_window"]
    if server.get("draft_attention") is not None:
        row["draft_attention"] = server["draft_attention"]
    if server.get("extra_args"):
        row["extra_args"] = server["extra_args"]
    return row


def merge(
    committed: dict[str, Any],
    runs: list[tuple[str, dict[str, Any]]],
    log_archive: str = LOG_ARCHIVE,
    drop_stale: bool = False,
) -> dict[str, Any]:
    """The committed record with each run's rows in place of those they measured again.

    Rows keep their order; rows of a new key go at the end in the runs' order. Failed records
    (``error``) replace nothing and are kept under ``failed_records``. ``models`` and ``runs``
    say which model and which method (repeats, warm-up, new tokens) each run used. A shape the
    runs measured ends with rows of one run, or the merge is refused (``MergeError``);
    ``drop_stale`` drops the older runs' rows of such a shape instead.
    """
    if not isinstance(committed.get("records"), list):
        raise MergeError("the committed record has no 'records' list")
    rows = list(committed["records"])
    index = {row_key(row): i for i, row in enumerate(rows)}
    failed = list(committed.get("failed_records", []))
    models = dict(committed.get("models", {}))
    run_info = dict(committed.get("runs", {}))
    for run, speed in runs:
        if run in run_info or any(r.get("run") == run for r in rows):
            raise MergeError(f"run {run!r} is already in the record; name the new run otherwise")
        records = speed.get("records")
        if not isinstance(records, list) or not records:
            raise MergeError(f"{run}: no records in its speed.json (or log)")
        run_info[run] = {
            k: speed.get(k) for k in ("new_tokens", "repeats", "warmup_tokens", "ready_after_s")
        }
        if speed.get("from_log"):
            run_info[run]["from_log"] = True
        model = speed.get("model") or {}
        if model.get("preset"):
            models[model.get("name", model["preset"])] = {**model, **speed.get("model_config", {})}
        if speed.get("draft"):
            run_info[run]["draft"] = speed["draft"]
        for record in records:
            row = committed_row(record, run, log_archive)
            if "error" in record:
                failed.append(row)
                continue
            key = row_key(row)
            if key in index:
                rows[index[key]] = row
            else:
                index[key] = len(rows)
                rows.append(row)
    new_runs = {run for run, _ in runs}
    mixed = mixed_shapes(rows, new_runs)
    if mixed and not drop_stale:
        raise mixed_error(
            mixed,
            "merge every configuration of those shapes from one run, or pass --drop-stale to "
            "drop the older runs' rows of them",
        )
    if mixed:
        rows = [
            r for r in rows if not (row_key(r, SHAPE_KEY) in mixed and r.get("run") not in new_runs)
        ]
        mixed = mixed_shapes(rows, new_runs)
        if mixed:
            raise mixed_error(mixed, "the new runs split those shapes between them: merge one")
    merged = {**committed, "records": rows, "models": models, "runs": run_info}
    if failed:
        merged["failed_records"] = failed
    return merged


def retire(committed: dict[str, Any], runs: list[str]) -> dict[str, Any]:
    """The committed record without the rows, failed records and run entries of ``runs``."""
    known = {row.get("run") for row in committed.get("records", [])}
    known |= set(committed.get("runs", {}))
    unknown = sorted(set(runs) - known)
    if unknown:
        raise MergeError(f"cannot retire {unknown}: no row or run entry of the record has it")
    gone = set(runs)
    retired = {
        **committed,
        "records": [r for r in committed["records"] if r.get("run") not in gone],
        "runs": {k: v for k, v in committed.get("runs", {}).items() if k not in gone},
        "retired": sorted(set(committed.get("retired", [])) | gone),
    }
    failed = [r for r in committed.get("failed_records", []) if r.get("run") not in gone]
    if failed:
        retired["failed_records"] = failed
    else:
        retired.pop("failed_records", None)
    return retired


def speed_from_log(text: str) -> dict[str, Any]:
    """What a run's log holds of its speed.json: the records and the servers' start times."""
    records = records_in_log(text)
    first = records[0] if records else {}
    return {
        "new_tokens": first.get("new_tokens"),
        "repeats": first.get("repeats"),
        "records": records,
        "ready_after_s": {name: float(s) for name, s in READY_LINE.findall(text)},
        "from_log": True,
    }


def read_run(path: Path) -> dict[str, Any]:
    """A run's speed.json, or its log (``*.log``) for a run cut before it wrote one."""
    text = path.read_text()
    return speed_from_log(text) if path.suffix == ".log" else json.loads(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="the committed record, rewritten in place")
    parser.add_argument(
        "runs",
        type=name_and_path("RUN=SPEED_JSON or RUN=SPEED_LOG"),
        nargs="*",
        help="RUN=path/to/speed.json (or a cut run's speed.log)",
    )
    parser.add_argument(
        "--retire", action="append", default=[], metavar="RUN", help="drop RUN's rows (repeatable)"
    )
    parser.add_argument(
        "--drop-stale",
        action="store_true",
        help="drop older runs' rows of a shape the new runs measured only in part",
    )
    parser.add_argument(
        "--log-archive", default=LOG_ARCHIVE, help=f"where a row's log is (default {LOG_ARCHIVE})"
    )
    args = parser.parse_args(argv)
    try:
        committed = json.loads(args.record.read_text())
        if not args.runs and not args.retire:
            raise MergeError("nothing to do: name a RUN=SPEED_JSON or a --retire RUN")
        runs = [(run, read_run(path)) for run, path in args.runs]
        if args.retire:
            committed = retire(committed, args.retire)
        merged = merge(committed, runs, args.log_archive, args.drop_stale) if runs else committed
    except (OSError, json.JSONDecodeError, MergeError) as error:
        print(f"merge_e2e: {error}", file=sys.stderr)
        return 2
    args.record.write_text(json.dumps(merged, indent=1) + "\n")
    new_runs = dict(args.runs)
    replaced = sum(1 for r in merged["records"] if r.get("run") in new_runs)
    # Rows whose key is gone: those --drop-stale dropped (a replaced row keeps its key).
    merged_keys = {row_key(r) for r in merged["records"]}
    dropped = [
        f"{r.get('run')} {r['configuration']} {describe_shape(r)}"
        for r in committed["records"]
        if row_key(r) not in merged_keys
    ]
    print(
        f"merge_e2e: {args.record}: {len(merged['records'])} rows, {replaced} from the new runs"
        + (f", retired {', '.join(args.retire)}" if args.retire else "")
        + (f", dropped stale rows: {'; '.join(dropped)}" if dropped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
